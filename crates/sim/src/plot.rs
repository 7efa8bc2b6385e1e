//! CSV and PNG output. The font is embedded (DejaVu Sans, see
//! `assets/DejaVuSans-LICENSE.txt`) so plotting needs no system font library.

use std::io::Write;
use std::path::Path;
use std::sync::Once;

use anyhow::Context;
use plotters::coord::combinators::IntoLogRange;
use plotters::prelude::*;

static FONT: Once = Once::new();

/// Registers the embedded DejaVu Sans as plotters' "sans-serif" (once per
/// process): no system font libraries needed.
pub fn register_font() {
    FONT.call_once(|| {
        let bytes: &'static [u8] = include_bytes!("../assets/DejaVuSans.ttf");
        // The embedded file is a valid TTF; failing here is a build defect.
        plotters::style::register_font("sans-serif", FontStyle::Normal, bytes)
            .unwrap_or_else(|_| panic!("embedded DejaVuSans.ttf rejected"));
    });
}

/// One line of a chart.
#[derive(Clone, Debug)]
pub struct Series {
    pub name: String,
    pub points: Vec<(f64, f64)>,
}

/// A chart: title, axis labels, lines.
pub struct Chart<'a> {
    pub title: &'a str,
    pub x_label: &'a str,
    pub y_label: &'a str,
    pub series: &'a [Series],
    pub log_y: bool,
    /// Clip y at this value (e.g. latencies that explode past saturation).
    pub y_max: Option<f64>,
    /// Put the legend in the lower right (when lines climb to the upper left).
    pub legend_lower_right: bool,
}

const COLORS: [RGBColor; 8] = [
    RGBColor(0x1f, 0x77, 0xb4),
    RGBColor(0xd6, 0x27, 0x28),
    RGBColor(0x2c, 0xa0, 0x2c),
    RGBColor(0xff, 0x7f, 0x0e),
    RGBColor(0x94, 0x67, 0xbd),
    RGBColor(0x8c, 0x56, 0x4b),
    RGBColor(0xe3, 0x77, 0xc2),
    RGBColor(0x7f, 0x7f, 0x7f),
];

// A macro, not a function: the linear and log charts have different
// coordinate types and the drawing code is the same.
macro_rules! draw_lines {
    ($cc:expr, $chart:expr, $clip:expr) => {{
        let pos = if $chart.legend_lower_right {
            SeriesLabelPosition::LowerRight
        } else {
            SeriesLabelPosition::UpperLeft
        };
        let mut cc = $cc;
        for (i, s) in $chart.series.iter().enumerate() {
            let color = COLORS[i % COLORS.len()];
            let data: Vec<(f64, f64)> = s
                .points
                .iter()
                .filter(|p| p.1.is_finite() && (p.1 > 0.0 || !$chart.log_y))
                .map(|&(x, y)| (x, $clip(y)))
                .collect();
            cc.draw_series(LineSeries::new(data.clone(), color.stroke_width(2)))?
                .label(s.name.clone())
                .legend(move |(x, y)| {
                    PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
                });
            cc.draw_series(data.into_iter().map(|p| Circle::new(p, 3, color.filled())))?;
        }
        cc.configure_series_labels()
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK)
            .position(pos)
            .label_font(("sans-serif", 15))
            .draw()?;
    }};
}

/// Draws `chart` into a PNG at `path`.
pub fn line_chart(path: &Path, chart: &Chart) -> anyhow::Result<()> {
    register_font();
    let pts = || {
        chart
            .series
            .iter()
            .flat_map(|s| s.points.iter())
            .filter(|p| p.1.is_finite())
    };
    let (mut x0, mut x1) = (f64::INFINITY, f64::NEG_INFINITY);
    let (mut y0, mut y1) = (f64::INFINITY, f64::NEG_INFINITY);
    for &(x, y) in pts() {
        x0 = x0.min(x);
        x1 = x1.max(x);
        y0 = y0.min(y);
        y1 = y1.max(y);
    }
    if !x0.is_finite() {
        (x0, x1, y0, y1) = (0.0, 1.0, 0.1, 1.0);
    }
    if let Some(m) = chart.y_max {
        y1 = y1.min(m);
    }
    if x1 <= x0 {
        x1 = x0 + 1.0;
    }
    let clip = |y: f64| chart.y_max.map_or(y, |m| y.min(m));
    let root = BitMapBackend::new(path, (900, 560)).into_drawing_area();
    root.fill(&WHITE)?;
    let mut builder = ChartBuilder::on(&root);
    builder
        .caption(chart.title, ("sans-serif", 22))
        .margin(12)
        .x_label_area_size(45)
        .y_label_area_size(70);
    if chart.log_y {
        let y0 = y0.max(1e-3);
        let y1 = (y1 * 1.3).max(y0 * 10.0);
        let mut cc = builder.build_cartesian_2d(x0..x1, (y0 * 0.8..y1).log_scale())?;
        cc.configure_mesh()
            .x_desc(chart.x_label)
            .y_desc(chart.y_label)
            .label_style(("sans-serif", 15))
            .axis_desc_style(("sans-serif", 17))
            .y_label_formatter(&|v| format!("{v}"))
            .draw()?;
        draw_lines!(cc, chart, clip);
    } else {
        let pad = (y1 - y0).abs().max(1e-9) * 0.08;
        let mut cc = builder.build_cartesian_2d(x0..x1, (y0 - pad).min(0.0)..y1 + pad)?;
        cc.configure_mesh()
            .x_desc(chart.x_label)
            .y_desc(chart.y_label)
            .label_style(("sans-serif", 15))
            .axis_desc_style(("sans-serif", 17))
            .draw()?;
        draw_lines!(cc, chart, clip);
    }
    root.present()
        .with_context(|| format!("writing {}", path.display()))?;
    Ok(())
}

/// Writes rows under a header as CSV.
pub fn write_csv(path: &Path, header: &[&str], rows: &[Vec<String>]) -> anyhow::Result<()> {
    let mut f = std::io::BufWriter::new(
        std::fs::File::create(path).with_context(|| format!("creating {}", path.display()))?,
    );
    writeln!(f, "{}", header.join(","))?;
    for r in rows {
        writeln!(f, "{}", r.join(","))?;
    }
    f.flush()?;
    Ok(())
}
