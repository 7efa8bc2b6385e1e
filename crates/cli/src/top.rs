//! `ginza top`: a live view of iokerneld's stats (`client::stats`).
//!
//! iokerneld reports totals since registration (grants, preemptions,
//! congestion events, ...); rates are the difference between two reports
//! divided by the time between them. That time is taken from iokerneld's
//! own `uptime_ns`, not from this process's clock: it is the time between
//! the two moments the counters were read, so a slow socket round trip does
//! not skew the rates.

use std::collections::HashMap;
use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context;
use ginza_proto::messages::{
    AppStats, Class, DataplaneStats, DispatchStats, FaultStats, NetStats, StatsReport,
};
use ginza_proto::{client, default_socket_path, parse_duration, ClientError};
use ginza_sys::cpulist;
use serde::Serialize;

/// Window of the two samples of `--once` (and of the first live screen).
pub const ONCE_WINDOW: Duration = Duration::from_millis(200);
/// Shortest `--interval`: below it `top` would mostly measure itself.
const MIN_INTERVAL: Duration = Duration::from_millis(10);
/// Longest `--interval` (a typo guard: `1000s` is surely not meant).
const MAX_INTERVAL: Duration = Duration::from_secs(3600);
/// Removals shown under the table (iokerneld keeps 16).
const SHOWN_REMOVALS: usize = 5;

#[derive(clap::Args, Debug)]
pub struct TopArgs {
    /// iokerneld's control socket [default: the per-user one,
    /// $XDG_RUNTIME_DIR/ginza/iokerneld.sock, else
    /// /tmp/ginza-<uid>/iokerneld.sock, if it exists; else the service's,
    /// /run/ginza/iokerneld.sock].
    #[arg(long)]
    pub socket: Option<PathBuf>,
    /// Time between two screens (e.g. 500ms, 2s).
    #[arg(long, default_value = "1s", value_parser = parse_interval)]
    pub interval: Duration,
    /// Print one table (rates over a 200 ms window) and exit.
    #[arg(long)]
    pub once: bool,
    /// Print each sample as one JSON line instead of a table (every
    /// application, in iokerneld's order: `--sort` and `--limit` shape
    /// the table only).
    #[arg(long)]
    pub json: bool,
    /// Order of the table's rows: by cores held, then activity (default);
    /// by activity (grants, preemptions, congestion, steals, packets per
    /// second); by name; by app id.
    #[arg(long, value_enum, default_value_t = SortKey::Cores)]
    pub sort: SortKey,
    /// Rows of the table at most (0: all) [default: what fits the
    /// terminal; all when the output is not a terminal]; a last line counts
    /// the applications left out.
    #[arg(long)]
    pub limit: Option<usize>,
}

/// How the table orders its rows.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum SortKey {
    Cores,
    Activity,
    Name,
    Id,
}

impl SortKey {
    fn name(self) -> &'static str {
        match self {
            SortKey::Cores => "cores",
            SortKey::Activity => "activity",
            SortKey::Name => "name",
            SortKey::Id => "id",
        }
    }
}

/// How the table is shaped: its order, and how many rows it shows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct View {
    pub sort: SortKey,
    /// `None`: every application.
    pub limit: Option<usize>,
}

impl Default for View {
    fn default() -> View {
        View {
            sort: SortKey::Cores,
            limit: None,
        }
    }
}

/// Widest name column; longer names end in `~` (iokerneld allows longer
/// ones, and one long name would push every column off the screen).
const NAME_WIDTH: usize = 24;

fn parse_interval(s: &str) -> Result<Duration, String> {
    let d = parse_duration(s)?;
    if !(MIN_INTERVAL..=MAX_INTERVAL).contains(&d) {
        return Err(format!(
            "{s:?} is out of range {MIN_INTERVAL:?}..={MAX_INTERVAL:?}"
        ));
    }
    Ok(d)
}

/// Rates of one application between two reports. `None`: the application
/// was not in the earlier report (it registered in between), so there is
/// no earlier total to subtract.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct AppRates {
    pub app_id: u64,
    pub grants_per_s: Option<f64>,
    pub preemptions_per_s: Option<f64>,
    pub congestion_per_s: Option<f64>,
    /// Steals of its kthreads per second (work one took from another).
    pub steals_per_s: Option<f64>,
    /// Packets iokerneld put on its ingress rings / took from its egress
    /// rings, and dropped either way, per second (applications with an
    /// address).
    pub rx_per_s: Option<f64>,
    pub tx_per_s: Option<f64>,
    pub drops_per_s: Option<f64>,
    /// Flows its steering policy moved between kthreads, and flows evicted
    /// from its flow table, per second.
    pub flows_moved_per_s: Option<f64>,
    pub evictions_per_s: Option<f64>,
}

/// One line of `--json`: iokerneld's totals as it sent them, and what
/// `top` derived from the previous report.
#[derive(Debug, Serialize)]
pub struct Sample<'a> {
    /// iokerneld time between the two reports the rates come from.
    pub window_ns: Option<u64>,
    /// iokerneld's loop CPU time over the window, % of one core.
    pub loop_cpu_pct: Option<f64>,
    /// Per application, in the order of `stats.apps`.
    pub rates: Vec<AppRates>,
    pub stats: &'a StatsReport,
}

/// iokerneld time between two reports; `None` when it did not advance
/// (same report, or iokerneld restarted in between: its uptime went back).
pub fn window(prev: &StatsReport, now: &StatsReport) -> Option<Duration> {
    match now.uptime_ns.checked_sub(prev.uptime_ns) {
        Some(d) if d > 0 => Some(Duration::from_nanos(d)),
        _ => None,
    }
}

/// Events per second between two totals. A total that went down (a reset)
/// counts as no events rather than a huge wrapped difference.
pub fn rate(prev: u64, now: u64, window: Duration) -> f64 {
    let secs = window.as_secs_f64();
    if secs <= 0.0 {
        return 0.0;
    }
    now.saturating_sub(prev) as f64 / secs
}

/// iokerneld's loop CPU use over the window, in % of one core.
pub fn loop_cpu_pct(prev: &StatsReport, now: &StatsReport) -> Option<f64> {
    let w = window(prev, now)?;
    Some(100.0 * rate(prev.loop_cpu_ns, now.loop_cpu_ns, w) / 1e9)
}

/// Rates of every application of `now`, matched with `prev` by app id (a
/// name can be reused by a new registration; an id cannot).
pub fn app_rates(prev: Option<&StatsReport>, now: &StatsReport) -> Vec<AppRates> {
    let w = prev.and_then(|p| window(p, now));
    let before: HashMap<u64, &AppStats> = prev
        .map(|p| p.apps.iter().map(|a| (a.app_id, a)).collect())
        .unwrap_or_default();
    now.apps
        .iter()
        .map(|a| match (w, before.get(&a.app_id)) {
            (Some(w), Some(b)) => {
                let net =
                    |f: fn(&NetStats) -> u64| a.net.zip(b.net).map(|(n, p)| rate(f(&p), f(&n), w));
                AppRates {
                    app_id: a.app_id,
                    grants_per_s: Some(rate(b.grants, a.grants, w)),
                    preemptions_per_s: Some(rate(b.preemptions, a.preemptions, w)),
                    congestion_per_s: Some(rate(b.congestion_events, a.congestion_events, w)),
                    steals_per_s: Some(rate(b.steals, a.steals, w)),
                    rx_per_s: net(|n| n.rx),
                    tx_per_s: net(|n| n.tx),
                    drops_per_s: net(|n| n.drop_ingress + n.drop_egress),
                    flows_moved_per_s: net(|n| n.mv),
                    evictions_per_s: net(|n| n.ev),
                }
            }
            _ => AppRates {
                app_id: a.app_id,
                ..AppRates::default()
            },
        })
        .collect()
}

/// The sample `--json` prints.
pub fn sample<'a>(prev: Option<&StatsReport>, now: &'a StatsReport) -> Sample<'a> {
    Sample {
        window_ns: prev
            .and_then(|p| window(p, now))
            .map(|w| u64::try_from(w.as_nanos()).unwrap_or(u64::MAX)),
        loop_cpu_pct: prev.and_then(|p| loop_cpu_pct(p, now)),
        rates: app_rates(prev, now),
        stats: now,
    }
}

/// `3d04h`, `1h02m`, `5m07s`, `12.3s`.
pub fn fmt_uptime(ns: u64) -> String {
    let s = ns / 1_000_000_000;
    let (d, h, m) = (s / 86_400, s / 3_600 % 24, s / 60 % 60);
    if d > 0 {
        format!("{d}d{h:02}h")
    } else if h > 0 {
        format!("{h}h{m:02}m")
    } else if m > 0 {
        format!("{m}m{:02}s", s % 60)
    } else {
        format!("{:.1}s", ns as f64 / 1e9)
    }
}

/// A rate for the table: `-` when unknown, no decimals once it is large.
pub fn fmt_rate(r: Option<f64>) -> String {
    match r {
        None => "-".into(),
        Some(r) if r >= 100.0 => format!("{r:.0}"),
        Some(r) => format!("{r:.1}"),
    }
}

/// The steering column: the policy's name and its table's size, `-` for an
/// application without an address.
fn steering_cell(net: Option<&NetStats>) -> String {
    let Some(n) = net else { return "-".into() };
    let name = n.steering_name();
    match n.tb {
        0 => name.into(),
        b if b < 1 << 20 => format!("{name}:{}K", b.div_ceil(1 << 10)),
        b => format!("{name}:{}M", b.div_ceil(1 << 20)),
    }
}

fn class_name(c: Class) -> &'static str {
    match c {
        Class::LatencyCritical => "latency-critical",
        Class::Batch => "batch",
    }
}

/// Events per second of an application, all kinds together: what
/// `--sort activity` orders by (unknown rates count as none).
pub fn activity(r: &AppRates) -> f64 {
    [
        r.grants_per_s,
        r.preemptions_per_s,
        r.congestion_per_s,
        r.steals_per_s,
        r.rx_per_s,
        r.tx_per_s,
    ]
    .iter()
    .map(|v| v.unwrap_or(0.0))
    .sum()
}

/// The order of the table's rows: indices into `apps` (and `rates`).
/// Ties fall back to the app id, so the order is stable between screens.
pub fn row_order(apps: &[AppStats], rates: &[AppRates], sort: SortKey) -> Vec<usize> {
    let mut order: Vec<usize> = (0..apps.len()).collect();
    let by_activity = |a: usize, b: usize| activity(&rates[b]).total_cmp(&activity(&rates[a]));
    order.sort_by(|&a, &b| {
        let first = match sort {
            SortKey::Cores => apps[b]
                .cores_now
                .cmp(&apps[a].cores_now)
                .then_with(|| by_activity(a, b)),
            SortKey::Activity => by_activity(a, b),
            SortKey::Name => apps[a].name.cmp(&apps[b].name),
            SortKey::Id => std::cmp::Ordering::Equal,
        };
        first.then(apps[a].app_id.cmp(&apps[b].app_id))
    });
    order
}

/// A name for the table: printable, at most [`NAME_WIDTH`] characters.
fn short_name(name: &str) -> String {
    let name = printable(name);
    if name.chars().count() <= NAME_WIDTH {
        return name;
    }
    let mut cut: String = name.chars().take(NAME_WIDTH - 1).collect();
    cut.push('~');
    cut
}

/// Text from iokerneld (names, removal reasons) without control
/// characters, so that a stray escape sequence cannot garble the terminal.
fn printable(s: &str) -> String {
    s.chars()
        .map(|c| if c.is_control() { '?' } else { c })
        .collect()
}

/// The screen for one report (`prev`: the report before, for rates),
/// its table shaped by `view`.
pub fn render(prev: Option<&StatsReport>, now: &StatsReport, view: &View) -> String {
    use std::fmt::Write as _;
    let mut out = String::new();
    let cpu = prev
        .and_then(|p| loop_cpu_pct(p, now))
        .map_or_else(|| "-".into(), |p| format!("{p:.1}%"));
    let window = prev
        .and_then(|p| window(p, now))
        .map_or_else(|| "-".into(), |w| format!("{w:.1?}"));
    // `write!` to a String cannot fail.
    let _ = writeln!(
        out,
        "iokerneld  policy {}  managed cores {} ({})  uptime {}  loop cpu {cpu}\n\
         passes {}  apps {}  registrations refused {}  apps disconnected {}  window {window}",
        printable(&now.policy),
        cpulist::format(&now.managed_cores),
        now.managed_cores.len(),
        fmt_uptime(now.uptime_ns),
        now.passes,
        now.apps.len(),
        now.registrations_refused,
        now.apps_disconnected,
    );
    out.push('\n');
    let rates = app_rates(prev, now);
    let names: Vec<String> = now.apps.iter().map(|a| short_name(&a.name)).collect();
    let order = row_order(&now.apps, &rates, view.sort);
    let shown = view.limit.map_or(order.len(), |l| l.min(order.len()));
    let nw = order[..shown]
        .iter()
        .map(|&i| names[i].chars().count())
        .max()
        .unwrap_or(0)
        .max(4);
    let _ = writeln!(
        out,
        "{:<nw$}  {:>8}  {:<16}  {:>5}  {:>8}  {:>9}  {:>9}  {:>10}  {:>10}  {:>7}  {:>9}  {:>8}  {:>8}  {:>8}  {:<18}  {:>8}  {:>8}",
        "NAME",
        "PID",
        "CLASS",
        "CORES",
        "GUAR/MAX",
        "GRANTS/S",
        "PREEMPT/S",
        "PARKED/KT",
        "CONGEST/S",
        "OVERDUE",
        "STEALS/S",
        "RX/S",
        "TX/S",
        "DROP/S",
        "STEERING:TABLE",
        "MOVED/S",
        "EVICT/S",
    );
    for &i in &order[..shown] {
        let (a, r, name) = (&now.apps[i], &rates[i], &names[i]);
        let _ = writeln!(
            out,
            "{:<nw$}  {:>8}  {:<16}  {:>5}  {:>8}  {:>9}  {:>9}  {:>10}  {:>10}  {:>7}  {:>9}  {:>8}  {:>8}  {:>8}  {:<18}  {:>8}  {:>8}",
            name,
            a.pid,
            class_name(a.class),
            a.cores_now,
            format!("{}/{}", a.guaranteed, a.max_cores),
            fmt_rate(r.grants_per_s),
            fmt_rate(r.preemptions_per_s),
            format!("{}/{}", a.parked_kthreads, a.kthreads),
            fmt_rate(r.congestion_per_s),
            a.preempt_overdue,
            fmt_rate(r.steals_per_s),
            fmt_rate(r.rx_per_s),
            fmt_rate(r.tx_per_s),
            fmt_rate(r.drops_per_s),
            steering_cell(a.net.as_ref()),
            fmt_rate(r.flows_moved_per_s),
            fmt_rate(r.evictions_per_s),
        );
    }
    if now.apps.is_empty() {
        out.push_str("(no application registered)\n");
    }
    if shown < order.len() {
        let _ = writeln!(
            out,
            "... {} more applications not shown (sorted by {}; --limit 0 shows all, --json lists all)",
            order.len() - shown,
            view.sort.name()
        );
    }
    render_dispatch(&mut out, now, &names);
    render_steering(&mut out, &now.dataplane);
    render_faults(&mut out, &now.dataplane.faults);
    if !now.recent_removals.is_empty() {
        out.push_str("\nlast removals (newest last):\n");
        let skip = now.recent_removals.len().saturating_sub(SHOWN_REMOVALS);
        for r in &now.recent_removals[skip..] {
            let _ = writeln!(
                out,
                "  {} (app {}): {}",
                printable(&r.name),
                r.app_id,
                printable(&r.reason)
            );
        }
    }
    out
}

/// The steering section: per policy in use, iokerneld's ns per decision,
/// flows moved (remapped) and seen moving per change of the active set,
/// steals and table memory (totals over
/// the applications using it), then the generator's replies out of order
/// within their flow. Nothing when no application has a network.
fn render_steering(out: &mut String, dp: &DataplaneStats) {
    use std::fmt::Write as _;
    if dp.steering.is_empty() && dp.generator_replies == 0 {
        return;
    }
    let _ = writeln!(
        out,
        "
steering (totals)
{:<14}  {:>4}  {:>9}  {:>10}  {:>8}  {:>8}  {:>10}  {:>10}  {:>8}",
        "POLICY",
        "APPS",
        "NS/DECIS",
        "CHANGES",
        "MOVED/CH",
        "SEEN/CH",
        "STEALS",
        "DECISIONS",
        "TABLE"
    );
    for st in &dp.steering {
        let _ = writeln!(
            out,
            "{:<14}  {:>4}  {:>9}  {:>10}  {:>8}  {:>8}  {:>10}  {:>10}  {:>8}",
            st.steering_name(),
            st.apps,
            st.ns_per_decision()
                .map_or("-".into(), |v| format!("{v:.1}")),
            st.ch,
            st.moved_per_change()
                .map_or("-".into(), |v| format!("{v:.2}")),
            st.seen_moving_per_change()
                .map_or("-".into(), |v| format!("{v:.2}")),
            st.sl,
            st.sd,
            fmt_bytes(st.tb),
        );
    }
    if dp.generator_replies > 0 {
        let _ = writeln!(
            out,
            "generator: {} replies, {} out of order within their flow ({:.3} %)",
            dp.generator_replies,
            dp.generator_reordered,
            100.0 * dp.generator_reordered as f64 / dp.generator_replies as f64
        );
    }
}

/// The dispatch section (docs/colocate.md): per application whose
/// requests iokerneld dispatches, its totals since it registered; nothing
/// when there is none, so the usual screen stays as it was.
fn render_dispatch(out: &mut String, now: &StatsReport, names: &[String]) {
    use std::fmt::Write as _;
    let rows: Vec<(&String, &DispatchStats)> = names
        .iter()
        .zip(&now.apps)
        .filter_map(|(n, a)| a.dispatch.as_ref().map(|d| (n, d)))
        .collect();
    if rows.is_empty() {
        return;
    }
    let nw = rows.iter().map(|(n, _)| n.len()).max().unwrap_or(0).max(4);
    let _ = writeln!(
        out,
        "\ndispatch by iokerneld (totals)\n{:<nw$}  {:>10}  {:>10}  {:>10}  {:>10}  {:>8}  {:>10}  {:>9}  {:>8}  {:>8}  {:>8}  {:>6}",
        "NAME", "ARRIVED", "RUNS", "COMPLETED", "PREEMPTED", "REVOKED", "ASKED", "BACKSTOP", "REFUSED", "TAKENBK", "QUEUED", "LIES",
    );
    for (name, d) in rows {
        let _ = writeln!(
            out,
            "{:<nw$}  {:>10}  {:>10}  {:>10}  {:>10}  {:>8}  {:>10}  {:>9}  {:>8}  {:>8}  {:>8}  {:>6}",
            name, d.ar, d.ru, d.co, d.pe, d.rv, d.ak, d.bs, d.rf, d.tb, d.qu, d.li,
        );
    }
}

/// Bytes as `512`, `4K`, `3M`.
fn fmt_bytes(bytes: u64) -> String {
    match bytes {
        0 => "0".into(),
        b if b >= 1 << 20 && b % (1 << 20) == 0 => format!("{}M", b >> 20),
        b if b >= 1 << 10 => format!("{}K", b >> 10),
        b => b.to_string(),
    }
}

/// The fault-injection section (iokerneld's `--faults`): one line per
/// rule, totals since the rules were set; nothing when there is no rule,
/// so the usual screen stays as it was.
fn render_faults(out: &mut String, faults: &[FaultStats]) {
    use std::fmt::Write as _;
    if faults.is_empty() {
        return;
    }
    let ports: Vec<String> = faults.iter().map(|f| printable(&f.port)).collect();
    let pw = ports.iter().map(String::len).max().unwrap_or(0).max(4);
    let _ = writeln!(
        out,
        "\nfault injection (totals)\n{:<4}  {:<pw$}  {:>10}  {:>10}  {:>6}  {:>10}  {:>10}  {:>10}  {:>10}  {:>10}",
        "RULE", "PORT", "FRAMES", "DROPPED", "LOST%", "DUPLICATED", "REORDERED", "DELAYED", "CORRUPTED", "OVERFLOW",
    );
    for (i, (f, port)) in faults.iter().zip(&ports).enumerate() {
        let lost = match f.frames {
            0 => "-".to_string(),
            n => format!("{:.2}", 100.0 * f.lost() as f64 / n as f64),
        };
        let _ = writeln!(
            out,
            "{:<4}  {:<pw$}  {:>10}  {:>10}  {:>6}  {:>10}  {:>10}  {:>10}  {:>10}  {:>10}",
            i + 1,
            port,
            f.frames,
            f.dropped,
            lost,
            f.duplicated,
            f.reordered,
            f.delayed,
            f.corrupted,
            f.held_overflow,
        );
    }
}

/// One stats report, with an error that names the socket and says what to
/// do when nothing listens there.
fn fetch(socket: &Path) -> anyhow::Result<StatsReport> {
    client::stats(socket).map_err(|e| match e {
        ClientError::Connect { path, source } => anyhow::anyhow!(
            "cannot reach iokerneld at {}: {source} (is it running? start it with \
             `ginza iokernel --cores ...`, or pass --socket)",
            path.display()
        ),
        other => anyhow::Error::new(other).context(format!(
            "asking iokerneld at {} for stats",
            socket.display()
        )),
    })
}

/// The view `--sort` and `--limit` ask for; without `--limit`, on a
/// terminal of `rows` rows, as many application rows as fit beside the
/// rest of the screen (at least one).
pub fn view_for(
    args_sort: SortKey,
    args_limit: Option<usize>,
    rows: Option<usize>,
    prev: Option<&StatsReport>,
    now: &StatsReport,
) -> View {
    let limit = match (args_limit, rows) {
        (Some(0), _) => None,
        (Some(l), _) => Some(l),
        (None, None) => None,
        (None, Some(rows)) => {
            let all = View {
                sort: args_sort,
                limit: None,
            };
            // The screen with every row, less what does not fit, less the
            // line that counts the hidden ones (and one for the cursor).
            let lines = render(prev, now, &all).lines().count();
            (lines + 1 > rows).then(|| now.apps.len().saturating_sub(lines + 2 - rows).max(1))
        }
    };
    View {
        sort: args_sort,
        limit,
    }
}

/// Prints one screen or JSON line; `redraw`: clear the terminal first.
fn show(
    args: &TopArgs,
    prev: Option<&StatsReport>,
    now: &StatsReport,
    redraw: bool,
) -> anyhow::Result<()> {
    let rows = if std::io::stdout().is_terminal() {
        ginza_sys::terminal::size(std::io::stdout()).map(|(rows, _)| rows)
    } else {
        None
    };
    let view = view_for(args.sort, args.limit, rows, prev, now);
    let text = if args.json {
        let mut line = serde_json::to_string(&sample(prev, now)).context("encoding a sample")?;
        line.push('\n');
        line
    } else if redraw {
        // Home, clear screen: redraw in place without a curses dependency.
        format!("\x1b[H\x1b[2J{}", render(prev, now, &view))
    } else {
        render(prev, now, &view)
    };
    let mut out = std::io::stdout().lock();
    out.write_all(text.as_bytes())
        .and_then(|()| out.flush())
        .context("writing to stdout")
}

pub fn run(args: TopArgs) -> anyhow::Result<()> {
    let socket = args.socket.clone().unwrap_or_else(default_socket_path);
    let mut prev = fetch(&socket)?;
    // The first screen already has rates: a short window instead of
    // making the user wait a whole interval.
    std::thread::sleep(ONCE_WINDOW.min(args.interval));
    let mut now = fetch(&socket)?;
    if args.once {
        return show(&args, Some(&prev), &now, false);
    }
    // Clear and redraw only on a terminal; piped output gets one table
    // after the other, separated by a blank line.
    let tty = !args.json && std::io::stdout().is_terminal();
    loop {
        show(&args, Some(&prev), &now, tty)?;
        if !tty && !args.json {
            println!();
        }
        std::thread::sleep(args.interval);
        prev = std::mem::replace(&mut now, fetch(&socket)?);
    }
}

#[cfg(test)]
mod tests {
    use ginza_proto::messages::Removal;

    use super::*;
    use ginza_proto::messages::SteeringStats;

    fn app(app_id: u64, name: &str, grants: u64, preemptions: u64, congestion: u64) -> AppStats {
        AppStats {
            app_id,
            name: name.into(),
            pid: 42,
            class: Class::Batch,
            cores_now: 1,
            guaranteed: 0,
            max_cores: 2,
            kthreads: 2,
            parked_kthreads: 1,
            grants,
            preemptions,
            congestion_events: congestion,
            ring_full: 0,
            preempt_overdue: 3,
            steals: grants * 2,
            net: None,
            dispatch: None,
        }
    }

    /// Built through serde rather than a struct literal: fields iokerneld
    /// adds later (with `#[serde(default)]`) do not break these tests.
    fn report(uptime_ms: u64, loop_cpu_ms: u64, apps: Vec<AppStats>) -> StatsReport {
        serde_json::from_value(serde_json::json!({
            "policy": "shenango",
            "managed_cores": [0, 1],
            "interval_ns": 5_000,
            "uptime_ns": uptime_ms * 1_000_000,
            "loop_cpu_ns": loop_cpu_ms * 1_000_000,
            "passes": 7,
            "registrations_refused": 0,
            "apps_disconnected": 0,
            "apps": apps,
            "recent_removals": [],
        }))
        .unwrap()
    }

    #[test]
    fn rates_are_differences_over_iokerneld_time() {
        assert_eq!(rate(10, 30, Duration::from_millis(500)), 40.0);
        assert_eq!(
            rate(30, 10, Duration::from_secs(1)),
            0.0,
            "reset: no events"
        );
        assert_eq!(rate(0, 10, Duration::ZERO), 0.0);

        let with_net = |mut x: AppStats, rx, tx, drops| {
            x.net = Some(NetStats {
                rx,
                tx,
                drop_ingress: drops,
                drop_egress: 1,
                to_parked: 0,
                st: 1,
                mv: drops * 2,
                ev: drops * 3,
                tb: 196_608,
            });
            x
        };
        let a = report(
            1_000,
            100,
            vec![
                with_net(app(1, "a", 10, 2, 100), 0, 0, 0),
                app(2, "b", 0, 0, 0),
            ],
        );
        let b = report(
            1_500,
            350,
            vec![
                with_net(app(1, "a", 60, 7, 100), 500, 250, 5),
                app(3, "c", 5, 5, 5),
            ],
        );
        assert_eq!(window(&a, &b), Some(Duration::from_millis(500)));
        assert_eq!(window(&b, &a), None, "uptime went back: restarted");
        assert_eq!(window(&a, &a), None);
        assert_eq!(loop_cpu_pct(&a, &b), Some(50.0));

        let r = app_rates(Some(&a), &b);
        assert_eq!(
            r,
            vec![
                AppRates {
                    app_id: 1,
                    grants_per_s: Some(100.0),
                    preemptions_per_s: Some(10.0),
                    congestion_per_s: Some(0.0),
                    steals_per_s: Some(200.0),
                    rx_per_s: Some(1000.0),
                    tx_per_s: Some(500.0),
                    drops_per_s: Some(10.0),
                    flows_moved_per_s: Some(20.0),
                    evictions_per_s: Some(30.0),
                },
                // New since `a`: no earlier total, no rate.
                AppRates {
                    app_id: 3,
                    ..AppRates::default()
                },
            ]
        );
        // No earlier report, or a restart: no rates at all.
        assert!(app_rates(None, &b).iter().all(|r| r.grants_per_s.is_none()));
        assert!(app_rates(Some(&b), &a)
            .iter()
            .all(|r| r.grants_per_s.is_none()));
    }

    #[test]
    fn formatting() {
        assert_eq!(fmt_uptime(12_345_000_000), "12.3s");
        assert_eq!(fmt_uptime(307 * 1_000_000_000), "5m07s");
        assert_eq!(fmt_uptime(3_720 * 1_000_000_000), "1h02m");
        assert_eq!(
            fmt_uptime((3 * 86_400 + 4 * 3_600) * 1_000_000_000),
            "3d04h"
        );
        assert_eq!(fmt_rate(None), "-");
        assert_eq!(fmt_rate(Some(2.25)), "2.2");
        assert_eq!(fmt_rate(Some(1234.6)), "1235");
        assert_eq!(printable("a\x1b[2Jb"), "a?[2Jb");
        assert!(parse_interval("1ms").is_err());
        assert_eq!(parse_interval("500ms"), Ok(Duration::from_millis(500)));
    }

    #[test]
    fn the_screen_shows_every_column() {
        let a = report(1_000, 100, vec![app(1, "memcached", 10, 2, 100)]);
        let mut b = report(2_000, 150, vec![app(1, "memcached", 30, 4, 150)]);
        b.recent_removals = (0..7)
            .map(|i| Removal {
                app_id: 10 + i,
                name: format!("gone{i}"),
                reason: "hung up".into(),
            })
            .collect();
        let s = render(Some(&a), &b, &View::default());
        assert!(s.contains("policy shenango"), "{s}");
        assert!(s.contains("managed cores 0-1 (2)"), "{s}");
        assert!(s.contains("uptime 2.0s"), "{s}");
        assert!(s.contains("loop cpu 5.0%"), "{s}");
        let row = s.lines().find(|l| l.starts_with("memcached")).unwrap();
        let cols: Vec<&str> = row.split_whitespace().collect();
        assert_eq!(
            cols,
            [
                "memcached",
                "42",
                "batch",
                "1",
                "0/2",
                "20.0",
                "2.0",
                "1/2",
                "50.0",
                "3",
                "40.0",
                "-",
                "-",
                "-",
                "-",
                "-",
                "-"
            ]
        );
        let net = NetStats {
            st: 2,
            tb: 4096,
            ..NetStats::default()
        };
        assert_eq!(steering_cell(Some(&net)), "indirection:4K");
        let net = NetStats {
            st: 1,
            tb: 3 << 20,
            ..NetStats::default()
        };
        assert_eq!(steering_cell(Some(&net)), "flow-affinity:3M");
        assert_eq!(steering_cell(Some(&NetStats::default())), "rss-mod");
        // Only the last few removals, newest last.
        assert!(!s.contains("gone1 "), "{s}");
        assert!(s.contains("gone2 (app 12): hung up"), "{s}");
        assert!(s.trim_end().ends_with("gone6 (app 16): hung up"), "{s}");

        assert!(!s.contains("dispatch by iokerneld"), "{s}");
        let mut c = b.clone();
        c.apps[0].dispatch = Some(DispatchStats {
            ar: 100,
            ru: 120,
            co: 97,
            pe: 20,
            bs: 4,
            rf: 1,
            qu: 3,
            ..DispatchStats::default()
        });
        let s = render(Some(&a), &c, &View::default());
        let row = s
            .lines()
            .skip_while(|l| !l.starts_with("dispatch by iokerneld"))
            .find(|l| l.starts_with("memcached"))
            .expect("a dispatch row");
        assert_eq!(
            row.split_whitespace().collect::<Vec<_>>(),
            [
                "memcached",
                "100",
                "120",
                "97",
                "20",
                "0",
                "0",
                "4",
                "1",
                "0",
                "3",
                "0"
            ]
        );

        let empty = render(None, &report(1, 0, vec![]), &View::default());
        assert!(empty.contains("(no application registered)"), "{empty}");
        assert!(empty.contains("loop cpu -"), "{empty}");

        let line = serde_json::to_string(&sample(Some(&a), &b)).unwrap();
        let v: serde_json::Value = serde_json::from_str(&line).unwrap();
        assert_eq!(v["window_ns"], 1_000_000_000u64);
        assert_eq!(v["rates"][0]["grants_per_s"], 20.0);
        assert_eq!(v["stats"]["apps"][0]["name"], "memcached");
    }

    #[test]
    fn steering_lines_show_per_policy_measurements() {
        let a = report(1_000, 100, vec![app(1, "echo", 0, 0, 0)]);
        assert!(!render(None, &a, &View::default()).contains("steering (totals)"));
        let mut b = a.clone();
        b.dataplane.steering = vec![
            SteeringStats {
                st: 0,
                apps: 1,
                ch: 4,
                mv: 10,
                ms: 6,
                sd: 200,
                sn: 3_000,
                tb: 8192,
                sl: 42,
            },
            SteeringStats {
                st: 2,
                apps: 2,
                ..SteeringStats::default()
            },
        ];
        b.dataplane.generator_replies = 1000;
        b.dataplane.generator_reordered = 5;
        let s = render(None, &b, &View::default());
        let row = |start: &str| -> Vec<String> {
            s.lines()
                .find(|l| l.starts_with(start))
                .unwrap_or_else(|| panic!("no {start} row: {s}"))
                .split_whitespace()
                .map(String::from)
                .collect()
        };
        assert_eq!(
            row("rss-mod"),
            ["rss-mod", "1", "15.0", "4", "2.50", "1.50", "42", "200", "8K"]
        );
        assert_eq!(
            row("indirection"),
            ["indirection", "2", "-", "0", "-", "-", "0", "0", "0"]
        );
        assert!(
            s.contains("1000 replies, 5 out of order within their flow (0.500 %)"),
            "{s}"
        );
        let v = serde_json::to_value(sample(None, &b)).unwrap();
        assert_eq!(v["stats"]["dataplane"]["st"][0]["sn"], 3000);
        assert_eq!(v["stats"]["dataplane"]["go"], 5);
    }

    #[test]
    fn fault_counters_show_only_when_rules_are_set() {
        let a = report(1_000, 100, vec![app(1, "echo", 0, 0, 0)]);
        let plain = render(None, &a, &View::default());
        assert!(!plain.contains("fault"), "{plain}");
        let mut b = report(2_000, 150, vec![app(1, "echo", 0, 0, 0)]);
        b.dataplane.faults = vec![
            FaultStats {
                port: "trunk".into(),
                frames: 2_000,
                dropped: 95,
                duplicated: 1,
                reordered: 40,
                delayed: 0,
                corrupted: 2,
                held_overflow: 5,
            },
            FaultStats {
                port: "app:echo\x1b".into(),
                ..FaultStats::default()
            },
        ];
        let s = render(Some(&a), &b, &View::default());
        assert!(s.contains("fault injection (totals)"), "{s}");
        let row = |start: &str| -> Vec<String> {
            s.lines()
                .find(|l| l.starts_with(start))
                .unwrap_or_else(|| panic!("no {start} row: {s}"))
                .split_whitespace()
                .map(String::from)
                .collect()
        };
        assert_eq!(
            row("1 "),
            ["1", "trunk", "2000", "95", "5.00", "1", "40", "0", "2", "5"]
        );
        assert_eq!(
            row("2 "),
            ["2", "app:echo?", "0", "0", "-", "0", "0", "0", "0", "0"]
        );
        // And in --json, under the stats as iokerneld sent them.
        let v = serde_json::to_value(sample(Some(&a), &b)).unwrap();
        assert_eq!(v["stats"]["dataplane"]["faults"][0]["dr"], 95);
    }

    #[test]
    fn a_hundred_applications_sort_and_truncate_with_a_count() {
        // App i holds i % 3 cores and made 10 * i grants in the window.
        let apps = |grants: fn(u64) -> u64| {
            (1..=100)
                .map(|i| {
                    let mut a = app(i, &format!("app-{i:03}"), grants(i), 0, 0);
                    a.cores_now = (i % 3) as u32;
                    a.steals = 0;
                    a
                })
                .collect::<Vec<_>>()
        };
        let a = report(1_000, 0, apps(|_| 0));
        let b = report(2_000, 0, apps(|i| 10 * i));
        let rows = |s: &str| -> Vec<String> {
            s.lines()
                .filter(|l| l.starts_with("app-"))
                .map(|l| l.split_whitespace().next().unwrap().to_string())
                .collect()
        };
        let all = render(Some(&a), &b, &View::default());
        let names = rows(&all);
        assert_eq!(names.len(), 100, "{all}");
        // Two cores first (i % 3 == 2), the busiest of them first: 98, 95, ...
        assert_eq!(names[..3], ["app-098", "app-095", "app-092"]);
        assert_eq!(names[99], "app-003", "no core, least active last");
        assert!(!all.contains("more applications"), "{all}");

        let view = View {
            sort: SortKey::Activity,
            limit: Some(10),
        };
        let s = render(Some(&a), &b, &view);
        assert_eq!(
            rows(&s),
            (91..=100)
                .rev()
                .map(|i| format!("app-{i:03}"))
                .collect::<Vec<_>>()
        );
        assert!(
            s.contains("... 90 more applications not shown (sorted by activity; --limit 0 shows all, --json lists all)"),
            "{s}"
        );
        let by_name = render(
            Some(&a),
            &b,
            &View {
                sort: SortKey::Name,
                limit: Some(2),
            },
        );
        assert_eq!(rows(&by_name), ["app-001", "app-002"]);

        // A 40-row terminal: the screen fills it and no more.
        let fit = view_for(SortKey::Cores, None, Some(40), Some(&a), &b);
        let screen = render(Some(&a), &b, &fit);
        assert_eq!(screen.lines().count(), 39, "{screen}");
        assert!(screen.contains("more applications not shown"), "{screen}");
        assert_eq!(
            view_for(SortKey::Cores, Some(0), Some(40), Some(&a), &b).limit,
            None
        );
        assert_eq!(
            view_for(SortKey::Cores, None, None, Some(&a), &b).limit,
            None
        );
        assert_eq!(
            view_for(SortKey::Cores, Some(7), None, Some(&a), &b).limit,
            Some(7)
        );

        // --json: every application, whatever the table shows.
        let v: serde_json::Value =
            serde_json::from_str(&serde_json::to_string(&sample(Some(&a), &b)).unwrap()).unwrap();
        assert_eq!(v["stats"]["apps"].as_array().unwrap().len(), 100);
        assert_eq!(v["rates"].as_array().unwrap().len(), 100);
    }

    #[test]
    fn long_names_are_cut() {
        assert_eq!(short_name("short"), "short");
        let long = "x".repeat(40);
        let cut = short_name(&long);
        assert_eq!(cut.chars().count(), NAME_WIDTH);
        assert!(cut.ends_with('~'));
    }
}
