//! One Ginza application of a benchmark or of the demo: its runtime on an OS
//! thread of this process (`ginza_runtime::run` blocks until the main
//! uthread returns), its result delivered on a channel so that it can be
//! awaited with a deadline or joined.

use std::path::Path;
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

use anyhow::{anyhow, Context as _};
use ginza_iokernel::InProcess;
use ginza_net::{Ipv4Addr, MacAddr};
use ginza_runtime::net::NetConfig;
use ginza_runtime::{Class, Config as RtConfig, IokernelConfig, RuntimeError};

/// How long [`App::start_configured`] waits for the registration.
const REGISTER_TIMEOUT: Duration = Duration::from_secs(10);

/// What became of an application's thread.
enum Outcome<T> {
    Returned(Result<T, RuntimeError>),
    /// The thread ended without sending a result: it panicked.
    Lost,
    /// [`App::take`] or [`App::join`] handed the result out.
    Taken,
}

/// A Ginza runtime running `main` on its own thread.
pub(crate) struct App<T> {
    name: String,
    rx: Receiver<Result<T, RuntimeError>>,
    outcome: Option<Outcome<T>>,
}

impl<T: Send + 'static> App<T> {
    /// Starts it with `config` and returns at once.
    pub(crate) fn spawn(
        name: &str,
        config: RtConfig,
        main: impl FnOnce() -> T + Send + 'static,
    ) -> anyhow::Result<App<T>> {
        let (tx, rx) = mpsc::channel();
        std::thread::Builder::new()
            .name(format!("app-{name}"))
            .spawn(move || {
                let _ = tx.send(ginza_runtime::run(config, main));
            })
            .with_context(|| format!("starting the thread of {name}"))?;
        Ok(App {
            name: name.to_string(),
            rx,
            outcome: None,
        })
    }

    /// Starts it on `iokerneld` at `(mac, ip)` and waits until it has
    /// registered.
    pub(crate) fn start(
        iokerneld: &InProcess,
        name: &str,
        (mac, ip): (MacAddr, Ipv4Addr),
        main: impl FnOnce() -> T + Send + 'static,
    ) -> anyhow::Result<App<T>> {
        App::start_tuned(iokerneld, name, (mac, ip), |_| {}, main)
    }

    /// As [`App::start`], with `tune` adjusting its configuration first.
    pub(crate) fn start_tuned(
        iokerneld: &InProcess,
        name: &str,
        (mac, ip): (MacAddr, Ipv4Addr),
        tune: impl FnOnce(&mut RtConfig),
        main: impl FnOnce() -> T + Send + 'static,
    ) -> anyhow::Result<App<T>> {
        let mut config = runtime_config(iokerneld, name, Class::LatencyCritical);
        if let Some(io) = config.iokernel.as_mut() {
            io.net = Some(NetConfig::new(mac, ip));
        }
        tune(&mut config);
        App::start_configured(iokerneld, name, config, main)
    }

    /// Starts it with `config` (from [`runtime_config`]) and waits until it
    /// has registered.
    pub(crate) fn start_configured(
        iokerneld: &InProcess,
        name: &str,
        config: RtConfig,
        main: impl FnOnce() -> T + Send + 'static,
    ) -> anyhow::Result<App<T>> {
        let mut app = App::spawn(name, config, main)?;
        let t0 = Instant::now();
        while !iokerneld
            .stats()
            .is_ok_and(|s| s.apps.iter().any(|a| a.name == name))
        {
            if app.is_finished() {
                app.join()?;
                anyhow::bail!("{name} returned before it registered");
            }
            anyhow::ensure!(
                t0.elapsed() < REGISTER_TIMEOUT,
                "{name} did not register with iokerneld within 10 s"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
        Ok(app)
    }

    /// Waits until `deadline` for `main` to return; `true` if it has.
    pub(crate) fn wait_until(&mut self, deadline: Instant) -> bool {
        if self.outcome.is_some() {
            return true;
        }
        let left = deadline.saturating_duration_since(Instant::now());
        match self.rx.recv_timeout(left) {
            Ok(r) => self.outcome = Some(Outcome::Returned(r)),
            Err(RecvTimeoutError::Timeout) => return false,
            Err(RecvTimeoutError::Disconnected) => self.outcome = Some(Outcome::Lost),
        }
        true
    }

    /// Whether `main` has returned, without waiting.
    pub(crate) fn is_finished(&mut self) -> bool {
        self.wait_until(Instant::now())
    }

    /// `Some` if the application has returned: its error, or `Ok` with
    /// the value dropped.
    pub(crate) fn returned(&mut self) -> Option<anyhow::Result<()>> {
        self.is_finished().then(|| self.take().map(drop))
    }

    /// What `main` returned, if it has (without waiting).
    pub(crate) fn take(&mut self) -> anyhow::Result<T> {
        match self.outcome.replace(Outcome::Taken) {
            Some(Outcome::Returned(r)) => r.with_context(|| format!("application {}", self.name)),
            Some(Outcome::Lost) => Err(RuntimeError::Start(format!(
                "the thread of {} ended without a result",
                self.name
            )))
            .with_context(|| format!("application {}", self.name)),
            Some(Outcome::Taken) => Err(anyhow!("{} was joined already", self.name)),
            None => {
                self.outcome = None;
                Err(anyhow!("application {} has not finished", self.name))
            }
        }
    }

    /// As [`join`](Self::join), but an application that has not returned
    /// `within` is an error, not a wait for good (its thread is left
    /// behind, to end with the process).
    pub(crate) fn join_within(&mut self, within: Duration) -> anyhow::Result<T> {
        if !self.wait_until(Instant::now() + within) {
            anyhow::bail!(
                "{} did not return within {within:?} of being asked to stop",
                self.name
            );
        }
        self.join()
    }

    /// Waits for `main` to return; what it returned.
    pub(crate) fn join(&mut self) -> anyhow::Result<T> {
        if self.outcome.is_none() {
            self.outcome = Some(match self.rx.recv() {
                Ok(r) => Outcome::Returned(r),
                Err(_) => Outcome::Lost,
            });
        }
        match self.outcome.replace(Outcome::Taken) {
            Some(Outcome::Returned(r)) => {
                r.with_context(|| format!("the runtime of {}", self.name))
            }
            Some(Outcome::Lost) => Err(anyhow!("the thread of {} panicked", self.name)),
            Some(Outcome::Taken) | None => Err(anyhow!("{} was joined already", self.name)),
        }
    }
}

/// Application `name` registering at iokerneld's `socket`, with `kthreads`
/// kthreads.
pub(crate) fn app_config(socket: &Path, name: &str, class: Class, kthreads: usize) -> RtConfig {
    let mut io = IokernelConfig::new(name, class);
    io.socket = Some(socket.to_path_buf());
    RtConfig {
        iokernel: Some(io),
        ..RtConfig::with_kthreads(kthreads)
    }
}

/// Application `name` on `iokerneld`: one kthread to start with, more cores
/// as iokerneld grants them.
pub(crate) fn runtime_config(iokerneld: &InProcess, name: &str, class: Class) -> RtConfig {
    app_config(iokerneld.socket(), name, class, 1)
}
