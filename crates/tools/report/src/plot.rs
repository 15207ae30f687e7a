//! PNG figures: line, scatter and histogram plots of [`Series`], and [`Chart`]s that draw columns of a
//! [`Table`] against each other (the curves of seed 003 Figs. 3–9). It reads a TrueType font and
//! writes the image.
//!
//! Text needs a font; the first of `$STICS_PLOT_FONT` and the usual DejaVu/Liberation paths that exists is
//! used (Debian: `fonts-dejavu-core`).

use std::path::Path;
use std::sync::OnceLock;

use plotters::prelude::*;

use std::borrow::Cow;

use crate::table::{Cell, Table};
use crate::{Error, Result};

/// Where a sans-serif TrueType font is looked for after `$STICS_PLOT_FONT`.
pub const FONT_PATHS: &[&str] = &[
    "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/TTF/DejaVuSans.ttf",
    "/usr/share/fonts/truetype/liberation/LiberationSans-Regular.ttf",
];

/// How a series is drawn.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Mark {
    /// Points joined by a line.
    #[default]
    Line,
    /// A dot at each point (a scatter plot).
    Points,
    /// A bar from the bottom of the plot up to each point (a histogram, see [`histogram`]).
    Bars,
}

/// One curve.
#[derive(Debug, Clone, PartialEq)]
pub struct Series {
    /// Legend text.
    pub label: String,
    /// `(x, y)` in the units of the axis labels.
    pub points: Vec<(f64, f64)>,
    pub mark: Mark,
}

impl Series {
    /// A line through `points`.
    pub fn line(label: impl Into<String>, points: Vec<(f64, f64)>) -> Series {
        Series { label: label.into(), points, mark: Mark::Line }
    }

    /// A dot at each of `points`.
    pub fn scatter(label: impl Into<String>, points: Vec<(f64, f64)>) -> Series {
        Series { label: label.into(), points, mark: Mark::Points }
    }

    /// Bars of the `(bin centre, count)` pairs of [`histogram`].
    pub fn bars(label: impl Into<String>, points: Vec<(f64, f64)>) -> Series {
        Series { label: label.into(), points, mark: Mark::Bars }
    }
}

/// Counts `samples` in `bins` equal bins between the smallest and largest finite sample, as
/// `(bin centre, count)` pairs; empty when there is no finite sample.
pub fn histogram(samples: &[f64], bins: usize) -> Vec<(f64, f64)> {
    let finite = || samples.iter().copied().filter(|v| v.is_finite());
    let (lo, hi) = finite().fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), v| (a.min(v), b.max(v)));
    if bins == 0 || !lo.is_finite() {
        return Vec::new();
    }
    let width = if hi > lo { (hi - lo) / bins as f64 } else { 1.0 };
    let mut counts = vec![0u64; bins];
    for v in finite() {
        // The largest sample closes the last bin instead of opening a new one.
        let i = (((v - lo) / width) as usize).min(bins - 1);
        counts[i] += 1;
    }
    counts.into_iter().enumerate().map(|(i, n)| (lo + (i as f64 + 0.5) * width, n as f64)).collect()
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
    /// Names of the x positions 1, 2, …, n, for data in categories: when there are any, the x axis
    /// shows them at those positions, and the bars of several series stand side by side there.
    pub categories: Vec<String>,
    /// Curves.
    pub series: Vec<Series>,
}

/// Registers a font once per process; later calls return the first outcome.
fn font() -> Result<()> {
    static FONT: OnceLock<std::result::Result<(), String>> = OnceLock::new();
    FONT.get_or_init(|| {
        let candidates = std::env::var("STICS_PLOT_FONT").into_iter().chain(FONT_PATHS.iter().map(ToString::to_string));
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

/// A tick label: the value itself on a linear axis, `10^v` on a logarithmic one, four significant
/// digits. With `decades`, a logarithmic axis labels only whole decades.
fn tick(v: f64, log: bool, decades: bool) -> String {
    if log && decades && (v - v.round()).abs() > 1e-6 {
        // The grid still marks the steps between the decades.
        return String::new();
    }
    let v = match (log, decades) {
        (true, true) => 10f64.powf(v.round()),
        (true, false) => {
            // Four significant digits, so that 10^3.612 reads 4096, not 4095.9.
            let v = 10f64.powf(v);
            let unit = 10f64.powf(v.log10().floor() - 3.0);
            (v / unit).round() * unit
        }
        (false, _) => v,
    };
    let s = format!("{v:.4}");
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

/// The name of category position `v` (from 1), or nothing between positions.
fn category(v: f64, names: &[String]) -> String {
    let k = v.round();
    if (v - k).abs() > 1e-6 || k < 1.0 {
        return String::new();
    }
    names.get(k as usize - 1).cloned().unwrap_or_default()
}

/// The width of one bar: nine tenths of the closest spacing of the x values.
fn bar_width(pts: &[(f64, f64)]) -> f64 {
    let mut xs: Vec<f64> = pts.iter().map(|p| p.0).collect();
    xs.sort_by(f64::total_cmp);
    let gap = xs.windows(2).map(|w| w[1] - w[0]).filter(|g| *g > 0.0).fold(f64::INFINITY, f64::min);
    if gap.is_finite() {
        gap * 0.9
    } else {
        1.0
    }
}

/// Draws `fig` into the PNG file at `path`.
pub fn draw(fig: &Figure, path: &Path) -> Result<()> {
    font()?;
    let tx = |v: f64, log: bool| if log { v.log10() } else { v };
    let curves: Vec<Series> = fig
        .series
        .iter()
        .map(|s| {
            let pts = s
                .points
                .iter()
                .map(|&(x, y)| (tx(x, fig.log_x), tx(y, fig.log_y)))
                .filter(|(x, y)| x.is_finite() && y.is_finite())
                .collect();
            Series { label: s.label.clone(), points: pts, mark: s.mark }
        })
        .collect();
    let all = || curves.iter().flat_map(|c| c.points.iter().copied());
    let range = |f: &dyn Fn((f64, f64)) -> f64| {
        let (lo, hi) = all().map(f).fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), v| (a.min(v), b.max(v)));
        if !lo.is_finite() {
            return Err(Error::Plot("no finite points to draw".into()));
        }
        let pad = if hi > lo { (hi - lo) * 0.04 } else { lo.abs().max(1.0) * 0.1 };
        Ok((lo - pad, hi + pad))
    };
    let cats = &fig.categories;
    let bars = curves.iter().filter(|c| c.mark == Mark::Bars).count();
    let (x0, x1) = if cats.is_empty() {
        let (x0, x1) = range(&|p| p.0)?;
        // Bars are centred on their x, so the outer ones need half a bar more room.
        let half_bar =
            curves.iter().filter(|c| c.mark == Mark::Bars).map(|c| bar_width(&c.points) / 2.0).fold(0.0, f64::max);
        (x0 - half_bar, x1 + half_bar)
    } else {
        (0.5, cats.len() as f64 + 0.5)
    };
    // In categories, the bars of all series share eight tenths of a position, one slot each.
    let slot = 0.8 / bars.max(1) as f64;
    let (y0, y1) = range(&|p| p.1)?;
    // Bars rise from zero, unless the axis is logarithmic and has no zero.
    let y0 = if bars > 0 && !fig.log_y { y0.min(0.0) } else { y0 };
    // Lines across categories leave no corner empty to count on: the legend (about 20 px a
    // series of the plot's 560) gets headroom of its own above the data.
    let lines = curves.iter().any(|c| c.mark == Mark::Line && c.points.len() > 1);
    let y1 = if cats.is_empty() || !lines {
        y1
    } else {
        let share = ((curves.len() as f64 * 20.0 + 16.0) / 560.0).min(0.6);
        y1 + (y1 - y0) * share / (1.0 - share)
    };
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
    let corner = if cats.is_empty() {
        // Rising curves leave the upper left corner empty, falling ones the upper right.
        let rising = curves.iter().filter_map(|c| Some(c.points.last()?.1 - c.points.first()?.1)).sum::<f64>() > 0.0;
        if rising {
            SeriesLabelPosition::UpperLeft
        } else {
            SeriesLabelPosition::UpperRight
        }
    } else {
        // Categories have no trend: the legend goes over the third whose tallest point is lowest.
        let third = |k: f64| {
            let n = cats.len() as f64;
            let inside = |x: f64| x > 0.5 + n * k / 3.0 && x <= 0.5 + n * (k + 1.0) / 3.0;
            all().filter(|p| inside(p.0)).map(|p| p.1).fold(f64::NEG_INFINITY, f64::max)
        };
        let (l, m, r) = (third(0.0), third(1.0), third(2.0));
        if m <= l && m <= r {
            SeriesLabelPosition::UpperMiddle
        } else if l <= r {
            SeriesLabelPosition::UpperLeft
        } else {
            SeriesLabelPosition::UpperRight
        }
    };
    // A logarithmic range that holds no whole decade labels its ticks instead, or it would show none.
    let (x_dec, y_dec) = (x0.ceil() <= x1, y0.ceil() <= y1);
    let x_tick = |v: &f64| if cats.is_empty() { tick(*v, lx, x_dec) } else { category(*v, cats) };
    // One label per category: a range of n positions with n + 1 labels asked for steps of 1.
    let x_labels = if cats.is_empty() { 10 } else { cats.len() + 1 };
    chart
        .configure_mesh()
        .x_desc(fig.x_label.as_str())
        .y_desc(fig.y_label.as_str())
        .x_labels(x_labels)
        .x_label_formatter(&x_tick)
        .y_label_formatter(&|v| tick(*v, ly, y_dec))
        .label_style(("sans-serif", 14))
        .axis_desc_style(("sans-serif", 16))
        .draw()
        .map_err(|x| e(&x))?;
    let mut bar_slot = 0;
    for (i, Series { label, points: pts, mark }) in curves.into_iter().enumerate() {
        let color = Palette99::pick(i).to_rgba();
        let drawn = match mark {
            // A line through one point draws nothing: that point gets a dot.
            Mark::Line if pts.len() == 1 => {
                chart.draw_series(pts.into_iter().map(|p| Circle::new(p, 4, color.filled())))
            }
            Mark::Line => chart.draw_series(LineSeries::new(pts, color.stroke_width(2))),
            Mark::Points => chart.draw_series(pts.into_iter().map(|p| Circle::new(p, 3, color.filled()))),
            Mark::Bars => {
                let (left, right) = if cats.is_empty() {
                    let half = bar_width(&pts) / 2.0;
                    (-half, half)
                } else {
                    let left = -0.4 + slot * bar_slot as f64;
                    (left, left + slot)
                };
                bar_slot += 1;
                let base = if fig.log_y { y0 } else { 0.0 };
                chart.draw_series(
                    pts.into_iter()
                        .map(|(x, y)| Rectangle::new([(x + left, base), (x + right, y)], color.mix(0.6).filled())),
                )
            }
        };
        let anno = drawn.map_err(|x| e(&x))?.label(label);
        match mark {
            Mark::Line => anno.legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 24, y)], color.stroke_width(2))),
            Mark::Points => anno.legend(move |(x, y)| Circle::new((x + 12, y), 3, color.filled())),
            Mark::Bars => {
                anno.legend(move |(x, y)| Rectangle::new([(x + 4, y - 5), (x + 20, y + 5)], color.mix(0.6).filled()))
            }
        };
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

/// A family of curves of a [`Chart`]: the y column, a legend prefix, tags left out of the legend,
/// and whether identical curves (a reference that does not depend on the left-out tags) are drawn
/// once.
#[derive(Debug, Clone, PartialEq)]
pub struct Curve {
    pub key: Cow<'static, str>,
    pub prefix: Cow<'static, str>,
    pub skip: Vec<Cow<'static, str>>,
    pub dedupe: bool,
    pub mark: Mark,
}

impl Curve {
    /// The column `key`, one line per combination of tags.
    pub fn new(key: impl Into<Cow<'static, str>>) -> Curve {
        Curve { key: key.into(), prefix: Cow::Borrowed(""), skip: Vec::new(), dedupe: false, mark: Mark::Line }
    }

    /// Puts `prefix` before the tags in the legend.
    pub fn prefix(mut self, prefix: impl Into<Cow<'static, str>>) -> Curve {
        self.prefix = prefix.into();
        self
    }

    /// Leaves these tags out of the legend, and draws a point once per x when they alone differ.
    pub fn skip(mut self, tags: &[&'static str]) -> Curve {
        self.skip = tags.iter().map(|t| Cow::Borrowed(*t)).collect();
        self.dedupe = true;
        self
    }

    /// Draws the curve as `mark`.
    pub fn mark(mut self, mark: Mark) -> Curve {
        self.mark = mark;
        self
    }
}

/// A figure drawn from a table: the column `x` against the curves' columns, one series per
/// combination of row tags.
#[derive(Debug, Clone, PartialEq)]
pub struct Chart {
    pub title: String,
    /// The x column's key.
    pub x: String,
    pub curves: Vec<Curve>,
    /// The y axis label; by default the first curve's column, `head [unit]`.
    pub y_label: Option<String>,
    /// The legend of a curve without tags or prefix.
    pub default_label: String,
    pub log_x: bool,
    pub log_y: bool,
}

impl Chart {
    /// A linear chart of `curves` against column `x`.
    pub fn new(title: impl Into<String>, x: impl Into<String>, curves: Vec<Curve>) -> Chart {
        Chart {
            title: title.into(),
            x: x.into(),
            curves,
            y_label: None,
            default_label: "data".into(),
            log_x: false,
            log_y: false,
        }
    }

    /// The figure of `table`: values in the columns' display units, text and missing cells left out.
    pub fn figure(&self, table: &Table) -> Result<Figure> {
        let cols = table.columns();
        let xi = table.column(&self.x)?;
        let xc = &cols[xi];
        let mut series: Vec<Series> = Vec::new();
        for curve in &self.curves {
            let yi = table.column(&curve.key)?;
            let yc = &cols[yi];
            for row in table.rows() {
                let (Some(Cell::Num(x)), Some(Cell::Num(y))) = (row.cells().get(xi), row.cells().get(yi)) else {
                    continue;
                };
                let tags: Vec<String> = row
                    .tags()
                    .iter()
                    .filter(|t| !curve.skip.iter().any(|s| *s == t.0))
                    .map(|(n, v)| format!("{n}={v}"))
                    .collect();
                let label = match (curve.prefix.is_empty(), tags.is_empty()) {
                    (true, true) => self.default_label.clone(),
                    (true, false) => tags.join(" "),
                    (false, true) => curve.prefix.to_string(),
                    (false, false) => format!("{} {}", curve.prefix, tags.join(" ")),
                };
                let pt = (x * xc.scale(), y * yc.scale());
                match series.iter_mut().find(|s| s.label == label) {
                    Some(s) if !curve.dedupe || !s.points.iter().any(|p| p.0 == pt.0) => s.points.push(pt),
                    Some(_) => {}
                    None => series.push(Series { label, points: vec![pt], mark: curve.mark }),
                }
            }
        }
        let first = self.curves.first().ok_or_else(|| Error::Plot("nothing to plot".into()))?;
        let yc = &cols[table.column(&first.key)?];
        Ok(Figure {
            title: self.title.clone(),
            x_label: format!("{} [{}]", xc.head(), xc.unit()),
            y_label: self.y_label.clone().unwrap_or_else(|| format!("{} [{}]", yc.head(), yc.unit())),
            log_x: self.log_x,
            log_y: self.log_y,
            categories: Vec::new(),
            series,
        })
    }

    /// Draws the chart of `table` into the PNG file at `path`.
    pub fn draw(&self, table: &Table, path: &Path) -> Result<()> {
        draw(&self.figure(table)?, path)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ticks_are_short() {
        assert_eq!(tick(0.0, true, true), "1");
        assert_eq!(tick(-1.0, true, true), "0.1");
        assert_eq!(tick(-0.5, true, true), "");
        assert_eq!(tick(2.5, false, true), "2.5");
        assert_eq!(tick(1e6, false, true), "1.0e6");
        assert_eq!(tick(5.0, true, true), "1e5");
        // Inside one decade every tick is labelled.
        assert_eq!(tick(4096f64.log10(), true, false), "4096");
        assert_eq!(tick(0.5, true, false), "3.162");
    }

    #[test]
    fn categories_are_named_at_whole_positions_only() {
        let names = vec!["a".to_string(), "b".to_string()];
        assert_eq!(category(1.0, &names), "a");
        assert_eq!(category(2.0, &names), "b");
        assert_eq!(category(1.5, &names), "");
        assert_eq!(category(0.0, &names), "");
        assert_eq!(category(3.0, &names), "");
    }
}
