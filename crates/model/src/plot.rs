//! PNG figures of one-parameter sweeps (the curves of seed 003 Figs. 3–9). This is the only module of the
//! crate that touches files: it reads a TrueType font and writes the image.
//!
//! Text needs a font; the first of `$STICS_PLOT_FONT` and the usual DejaVu/Liberation paths that exists is
//! used (Debian: `fonts-dejavu-core`).

use std::path::Path;
use std::sync::OnceLock;

use plotters::prelude::*;

use crate::{Error, Result};

/// Where a sans-serif TrueType font is looked for after `$STICS_PLOT_FONT`.
pub const FONT_PATHS: &[&str] = &[
    "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/TTF/DejaVuSans.ttf",
    "/usr/share/fonts/truetype/liberation/LiberationSans-Regular.ttf",
];

/// One curve.
#[derive(Debug, Clone, PartialEq)]
pub struct Series {
    /// Legend text.
    pub label: String,
    /// `(x, y)` in the units of the axis labels.
    pub points: Vec<(f64, f64)>,
}

/// A figure: axes and curves.
#[derive(Debug, Clone, PartialEq)]
pub struct Figure {
    /// Caption.
    pub title: String,
    /// X axis label, with unit.
    pub x_label: String,
    /// Y axis label, with unit.
    pub y_label: String,
    /// Logarithmic x axis.
    pub log_x: bool,
    /// Logarithmic y axis.
    pub log_y: bool,
    /// Curves.
    pub series: Vec<Series>,
}

/// Registers a font once per process; later calls return the first outcome.
fn font() -> Result<()> {
    static FONT: OnceLock<std::result::Result<(), String>> = OnceLock::new();
    FONT.get_or_init(|| {
        let candidates = std::env::var("STICS_PLOT_FONT").into_iter().chain(FONT_PATHS.iter().map(|p| p.to_string()));
        for path in candidates {
            if let Ok(bytes) = std::fs::read(&path) {
                // The font must outlive every chart, and it is registered once per process.
                let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
                return plotters::style::register_font("sans-serif", FontStyle::Normal, bytes)
                    .map_err(|_| format!("{path} is not a usable TrueType font"));
            }
        }
        Err(format!(
            "no font found for the labels: install fonts-dejavu-core or set STICS_PLOT_FONT to a .ttf file (looked in {})",
            FONT_PATHS.join(", ")
        ))
    })
    .clone()
    .map_err(Error::Plot)
}

/// A tick label: the value itself on a linear axis, `10^v` on a logarithmic one, four significant digits.
fn tick(v: f64, log: bool) -> String {
    if log && (v - v.round()).abs() > 1e-6 {
        // Only whole decades are labelled; the grid still marks the steps between them.
        return String::new();
    }
    let v = if log { 10f64.powf(v.round()) } else { v };
    let s = format!("{:.4}", v);
    if v != 0.0 && (v.abs() >= 1e5 || v.abs() < 1e-3) {
        if log {
            format!("{v:e}")
        } else {
            format!("{v:.1e}")
        }
    } else {
        let g = format!("{}", (v * 1e4).round() / 1e4);
        if g.len() < s.len() {
            g
        } else {
            s
        }
    }
}

/// Draws `fig` into the PNG file at `path`.
pub fn draw(fig: &Figure, path: &Path) -> Result<()> {
    font()?;
    let tx = |v: f64, log: bool| if log { v.log10() } else { v };
    let curves: Vec<(String, Vec<(f64, f64)>)> = fig
        .series
        .iter()
        .map(|s| {
            let pts = s
                .points
                .iter()
                .map(|&(x, y)| (tx(x, fig.log_x), tx(y, fig.log_y)))
                .filter(|(x, y)| x.is_finite() && y.is_finite())
                .collect();
            (s.label.clone(), pts)
        })
        .collect();
    let all = || curves.iter().flat_map(|c| c.1.iter().copied());
    let range = |f: &dyn Fn((f64, f64)) -> f64| {
        let (lo, hi) = all().map(f).fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), v| (a.min(v), b.max(v)));
        if !lo.is_finite() {
            return Err(Error::Plot("no finite points to draw".into()));
        }
        let pad = if hi > lo { (hi - lo) * 0.04 } else { lo.abs().max(1.0) * 0.1 };
        Ok((lo - pad, hi + pad))
    };
    let (x0, x1) = range(&|p| p.0)?;
    let (y0, y1) = range(&|p| p.1)?;
    let e = |e: &dyn std::fmt::Display| Error::Plot(format!("{}: {e}", path.display()));
    let root = BitMapBackend::new(path, (1000, 680)).into_drawing_area();
    root.fill(&WHITE).map_err(|x| e(&x))?;
    let mut chart = ChartBuilder::on(&root)
        .caption(&fig.title, ("sans-serif", 22))
        .margin(18)
        .x_label_area_size(48)
        .y_label_area_size(80)
        .build_cartesian_2d(x0..x1, y0..y1)
        .map_err(|x| e(&x))?;
    let (lx, ly) = (fig.log_x, fig.log_y);
    // Rising curves leave the upper left corner empty, falling ones the upper right.
    let rising = curves.iter().filter_map(|c| Some(c.1.last()?.1 - c.1.first()?.1)).sum::<f64>() > 0.0;
    let corner = if rising { SeriesLabelPosition::UpperLeft } else { SeriesLabelPosition::UpperRight };
    chart
        .configure_mesh()
        .x_desc(fig.x_label.as_str())
        .y_desc(fig.y_label.as_str())
        .x_label_formatter(&|v| tick(*v, lx))
        .y_label_formatter(&|v| tick(*v, ly))
        .label_style(("sans-serif", 14))
        .axis_desc_style(("sans-serif", 16))
        .draw()
        .map_err(|x| e(&x))?;
    for (i, (label, pts)) in curves.into_iter().enumerate() {
        let color = Palette99::pick(i).to_rgba();
        chart
            .draw_series(LineSeries::new(pts, color.stroke_width(2)))
            .map_err(|x| e(&x))?
            .label(label)
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 24, y)], color.stroke_width(2)));
    }
    chart
        .configure_series_labels()
        .label_font(("sans-serif", 13))
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .position(corner)
        .draw()
        .map_err(|x| e(&x))?;
    root.present().map_err(|x| e(&x))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ticks_are_short() {
        assert_eq!(tick(0.0, true), "1");
        assert_eq!(tick(-1.0, true), "0.1");
        assert_eq!(tick(-0.5, true), "");
        assert_eq!(tick(2.5, false), "2.5");
        assert_eq!(tick(1e6, false), "1.0e6");
        assert_eq!(tick(5.0, true), "1e5");
    }
}
