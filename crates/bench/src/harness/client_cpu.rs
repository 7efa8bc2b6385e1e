//! Where a round-trip client runs beside servers that hold every CPU
//! (`ginza bench forward --rtt-client-cpu`, `ginza bench tcp --client-cpu`).

/// Where a round-trip client runs. On two CPUs
/// Ginza's server side holds both (iokerneld spins on one, the server's
/// kthread runs on the other), so the client must share one of them;
/// which one decides whether the reply's wake-up of the client crosses
/// CPUs, and on this VM that is most of a round trip (docs/results.md,
/// "Dataplane").
#[derive(Clone, Copy, PartialEq, Eq, Debug, clap::ValueEnum)]
pub(crate) enum ClientCpu {
    /// A CPU no server side uses, the same for every server, where there
    /// is a third CPU; else `beside-sender`.
    Auto,
    /// Like with like on two CPUs: the client shares the CPU of the
    /// thread that polls for the requests and puts the replies on the
    /// link — iokerneld's for Ginza, the server thread's for Linux and
    /// for Ginza on the direct path (its kthread sends its own replies).
    BesideSender,
    /// The earlier placement (docs/results.md, "Dataplane"): the server kthread's CPU for
    /// Ginza, the other one (which the kernel's servers leave free) for
    /// Linux.
    Split,
    /// The server's CPU (Ginza's kthread, the busy-polling Linux thread)
    /// for every server.
    Server,
    /// iokerneld's CPU for every server.
    Iokernel,
}

impl ClientCpu {
    /// The client's CPU against Ginza's servers and against the kernel's,
    /// of the CPUs `cpus` this process may use.
    pub(crate) fn of(self, cpus: &[usize], iok_cpu: usize, app_cpu: usize) -> (usize, usize) {
        match self {
            ClientCpu::Auto => match cpus.get(2) {
                Some(&third) => (third, third),
                None => (iok_cpu, app_cpu),
            },
            ClientCpu::BesideSender => (iok_cpu, app_cpu),
            ClientCpu::Split => (app_cpu, iok_cpu),
            ClientCpu::Server => (app_cpu, app_cpu),
            ClientCpu::Iokernel => (iok_cpu, iok_cpu),
        }
    }
}
