//! The demo's figure: per service distribution, a row of two panels — p99
//! latency (log scale) and batch throughput against offered load, one line
//! per policy.
//!
//! `ginza_sim::plot::line_chart` draws one chart per file; two panels need
//! their own drawing area, so this draws with plotters directly, in the same
//! style (colors, sizes) and with the same embedded font file.

use std::path::Path;

use anyhow::Context as _;
use plotters::coord::combinators::IntoLogRange;
use plotters::prelude::*;

use super::report::Row;

/// Colors per policy, fixed so the same policy has the same color in every
/// run whatever `--policies` selects.
fn color(policy: &str) -> RGBColor {
    match policy {
        "shenango" => RGBColor(0x1f, 0x77, 0xb4),
        "slow" => RGBColor(0xd6, 0x27, 0x28),
        "static" => RGBColor(0x2c, 0xa0, 0x2c),
        _ => RGBColor(0x7f, 0x7f, 0x7f),
    }
}

/// One line: a policy's points, sorted by load.
struct Line<'a> {
    policy: &'a str,
    points: Vec<(f64, f64)>,
}

fn lines<'a>(rows: &'a [Row], policies: &[&'a str], y: impl Fn(&Row) -> f64) -> Vec<Line<'a>> {
    policies
        .iter()
        .filter(|&&policy| rows.iter().any(|r| r.policy == policy))
        .map(|&policy| {
            let mut points: Vec<(f64, f64)> = rows
                .iter()
                .filter(|r| r.policy == policy)
                .map(|r| (r.offered_load, y(r)))
                .filter(|p| p.1.is_finite())
                .collect();
            points.sort_by(|a, b| a.0.total_cmp(&b.0));
            Line { policy, points }
        })
        .collect()
}

/// Legend text: a policy that ran but measured nothing (a stuck point
/// has no latency) stays in the legend, saying so.
fn label(l: &Line) -> String {
    if l.points.is_empty() {
        format!("{} (no data: see the table)", l.policy)
    } else {
        l.policy.to_string()
    }
}

/// Decade bounds around `lo..hi` (log axes read best between powers of 10).
fn decades(lo: f64, hi: f64) -> (f64, f64) {
    let lo = 10f64.powf(lo.log10().floor());
    let hi = 10f64.powf(hi.log10().ceil());
    (lo, if hi > lo { hi } else { lo * 10.0 })
}

/// x range with a margin; a single point gets a unit-wide range.
fn x_range(rows: &[Row]) -> std::ops::Range<f64> {
    let (lo, hi) = rows
        .iter()
        .map(|r| r.offered_load)
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), x| {
            (a.min(x), b.max(x))
        });
    if !lo.is_finite() {
        return 0.0..1.0;
    }
    let pad = ((hi - lo) * 0.05).max(0.05);
    (lo - pad).max(0.0)..hi + pad
}

// A macro, not a function: the log and linear panels have different
// coordinate types and the same drawing code.
macro_rules! draw_lines {
    ($cc:expr, $lines:expr) => {{
        let cc = $cc;
        for l in $lines {
            let c = color(l.policy);
            cc.draw_series(LineSeries::new(l.points.clone(), c.stroke_width(2)))?
                .label(label(l))
                .legend(move |(x, y)| {
                    PathElement::new(vec![(x, y), (x + 20, y)], c.stroke_width(2))
                });
            cc.draw_series(l.points.iter().map(|&p| Circle::new(p, 3, c.filled())))?;
        }
        cc.configure_series_labels()
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK)
            .position(SeriesLabelPosition::UpperLeft)
            .label_font(("sans-serif", 15))
            .draw()?;
    }};
}

/// Height of one service distribution's row of panels.
const ROW_HEIGHT: u32 = 520;

/// Writes the PNG at `path`: one row of two panels per service.
pub(crate) fn write_png(
    path: &Path,
    rows: &[Row],
    services: &[&str],
    policies: &[&str],
    caption: &str,
) -> anyhow::Result<()> {
    ginza_sim::plot::register_font();
    let xs = x_range(rows);
    let bands = services.len().max(1) as u32;
    let root = BitMapBackend::new(path, (1400, 40 + ROW_HEIGHT * bands)).into_drawing_area();
    root.fill(&WHITE)?;
    let root = root.titled(caption, ("sans-serif", 20))?;
    for (area, service) in root.split_evenly((bands as usize, 1)).iter().zip(services) {
        let mine: Vec<Row> = rows
            .iter()
            .filter(|r| r.service == *service)
            .cloned()
            .collect();
        draw_service(area, &mine, service, policies, xs.clone())?;
    }
    root.present()
        .with_context(|| format!("writing {}", path.display()))?;
    Ok(())
}

/// One service distribution's two panels.
fn draw_service<DB: DrawingBackend>(
    area: &DrawingArea<DB, plotters::coord::Shift>,
    rows: &[Row],
    service: &str,
    policies: &[&str],
    xs: std::ops::Range<f64>,
) -> anyhow::Result<()>
where
    DB::ErrorType: 'static,
{
    let (left, right) = area.split_horizontally(700);

    // Left: p99 latency, log scale (it spans µs to ms across policies).
    let p99 = lines(rows, policies, |r| r.p99_us);
    let positive = p99
        .iter()
        .flat_map(|l| l.points.iter().map(|p| p.1))
        .filter(|&v| v > 0.0);
    let (lo, hi) = positive.fold((f64::INFINITY, 0.0f64), |(a, b), v| (a.min(v), b.max(v)));
    let (lo, hi) = if lo.is_finite() {
        decades(lo, hi)
    } else {
        (1.0, 1000.0)
    };
    let mut cc = ChartBuilder::on(&left)
        .caption(format!("{service}: LC p99 latency"), ("sans-serif", 18))
        .margin(12)
        .x_label_area_size(45)
        .y_label_area_size(70)
        .build_cartesian_2d(xs.clone(), (lo..hi).log_scale())?;
    cc.configure_mesh()
        .x_desc("offered load (fraction of the managed cores)")
        .y_desc("p99 latency (µs, log)")
        .label_style(("sans-serif", 15))
        .axis_desc_style(("sans-serif", 16))
        .y_labels(8)
        .y_label_formatter(&|v| format!("{v:.0}"))
        .draw()?;
    let p99: Vec<Line> = p99
        .into_iter()
        .map(|mut l| {
            l.points.retain(|p| p.1 > 0.0);
            l
        })
        .collect();
    draw_lines!(&mut cc, &p99);

    // Right: batch throughput, linear from zero.
    let batch = lines(rows, policies, |r| r.batch_mpaths_per_s);
    let top = batch
        .iter()
        .flat_map(|l| l.points.iter().map(|p| p.1))
        .fold(0.0f64, f64::max);
    let top = if top > 0.0 { top * 1.15 } else { 1.0 };
    let mut cc = ChartBuilder::on(&right)
        .caption(format!("{service}: batch throughput"), ("sans-serif", 18))
        .margin(12)
        .x_label_area_size(45)
        .y_label_area_size(70)
        .build_cartesian_2d(xs, 0.0..top)?;
    cc.configure_mesh()
        .x_desc("offered load (fraction of the managed cores)")
        .y_desc("Monte Carlo paths / s (millions)")
        .label_style(("sans-serif", 15))
        .axis_desc_style(("sans-serif", 16))
        .draw()?;
    draw_lines!(&mut cc, &batch);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(policy: &'static str, load: f64, p99: f64, batch: f64) -> Row {
        Row {
            service: "exponential",
            policy,
            offered_load: load,
            achieved_load: load,
            p50_us: p99 / 2.0,
            p99_us: p99,
            p999_us: p99 * 2.0,
            batch_mpaths_per_s: batch,
            batch_alone_mpaths_per_s: f64::NAN,
            batch_share_of_spare: f64::NAN,
            p50_vs_static: f64::NAN,
            lc_cores: 0.5,
            batch_cores: 0.5,
            reallocations_per_s: 10.0,
            overdue_preemptions: 0,
            lc_requests_sent: 10,
            lc_requests_answered: 10,
            foreign_cpu_pct: 0.0,
            steal_pct: 0.0,
            quiet: "yes",
            note: String::new(),
            phases: None,
            withdrawn_per_s: 0.0,
            local_wakes_per_s: 0.0,
            local_wakes_by_iokernel_per_s: 0.0,
        }
    }

    #[test]
    fn log_axis_spans_whole_decades() {
        assert_eq!(decades(150.0, 5800.0), (100.0, 10_000.0));
        assert_eq!(decades(100.0, 100.0), (100.0, 1000.0));
    }

    #[test]
    fn writes_a_png_even_with_zero_latencies_and_a_single_point() {
        let dir = std::env::temp_dir().join(format!("ginza-demo-png-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("demo.png");
        let rows = [
            row("shenango", 0.1, 40.0, 30.0),
            row("shenango", 0.9, 400.0, 3.0),
            row("static", 0.1, 0.0, 0.0),
            row("slow", 0.5, 2000.0, 10.0),
            row("slow", 0.7, f64::NAN, f64::NAN),
        ];
        let mut bimodal = row("shenango", 0.5, 80.0, 20.0);
        bimodal.service = "bimodal";
        let mut rows = rows.to_vec();
        rows.push(bimodal);
        write_png(
            &path,
            &rows,
            &["exponential", "bimodal"],
            &["shenango", "slow", "static"],
            "test",
        )
        .unwrap();
        let bytes = std::fs::read(&path).unwrap();
        assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n");
        // Nothing to draw at all still makes a figure.
        write_png(&path, &[], &["exponential"], &["shenango"], "empty").unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
