//! Parameters that take one or more values, the grid of their combinations (one result row each),
//! and one-parameter sweeps (`NAME=FROM..TO` over evenly spaced values, linear or logarithmic).

use std::borrow::Cow;

use crate::{BoxError, Error, Result};

/// A parser for the ends of a sweep, in the parameter's base unit.
type Parse = Box<dyn Fn(&str) -> std::result::Result<f64, BoxError>>;

/// One parameter: its name, its values, how a value is shown in a legend and, for a parameter
/// that can be swept, how the ends of a sweep are read.
pub struct Axis {
    name: Cow<'static, str>,
    values: Vec<f64>,
    parse: Option<Parse>,
    show: Box<dyn Fn(f64) -> String>,
}

impl Axis {
    /// A parameter with these values, not sweepable; `show` writes a value for a legend.
    pub fn new(name: impl Into<Cow<'static, str>>, values: Vec<f64>, show: impl Fn(f64) -> String + 'static) -> Axis {
        Axis { name: name.into(), values, parse: None, show: Box::new(show) }
    }

    /// Makes the parameter sweepable, reading the ends of a sweep with `parse`.
    pub fn sweepable<E: Into<BoxError>>(
        mut self,
        parse: impl Fn(&str) -> std::result::Result<f64, E> + 'static,
    ) -> Axis {
        self.parse = Some(Box::new(move |s| parse(s).map_err(Into::into)));
        self
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn values(&self) -> &[f64] {
        &self.values
    }
}

/// The parameters of a run and which one, if any, is swept.
pub struct Grid {
    axes: Vec<Axis>,
    swept: Option<usize>,
}

impl Grid {
    pub fn new(axes: Vec<Axis>) -> Grid {
        Grid { axes, swept: None }
    }

    /// Replaces the values of the parameter named by `spec` (`NAME=FROM..TO`, as `--sweep` takes
    /// it) with `points` values from FROM to TO, logarithmically spaced if `log`.
    pub fn sweep(&mut self, spec: &str, points: usize, log: bool) -> Result<()> {
        let syntax = || Error::SweepSyntax(spec.to_string());
        let (name, range) = spec.split_once('=').ok_or_else(syntax)?;
        let (from, to) = range.split_once("..").ok_or_else(syntax)?;
        let Some(i) = self.axes.iter().position(|a| a.name == name.trim() && a.parse.is_some()) else {
            let choices: Vec<&str> = self.axes.iter().filter(|a| a.parse.is_some()).map(Axis::name).collect();
            return Err(Error::NotSweepable { spec: spec.into(), name: name.into(), choices: choices.join(", ") });
        };
        let axis = &mut self.axes[i];
        let parse = axis.parse.as_ref().ok_or_else(syntax)?;
        let from = parse(from).map_err(|source| Error::SweepEnd { end: "start", source })?;
        let to = parse(to).map_err(|source| Error::SweepEnd { end: "end", source })?;
        axis.values = self::points(from, to, points, log)?;
        self.swept = Some(i);
        Ok(())
    }

    /// The swept parameter's name.
    pub fn swept(&self) -> Option<&str> {
        self.swept.map(|i| self.axes[i].name())
    }

    /// Every combination of values, the swept parameter varying fastest, then the last one.
    pub fn points(&self) -> Result<Vec<Point>> {
        if let Some(a) = self.axes.iter().find(|a| a.values.is_empty()) {
            return Err(Error::NoValue(a.name.to_string()));
        }
        // An odometer over the axes, the swept one as its last wheel.
        let mut order: Vec<usize> = (0..self.axes.len()).filter(|&i| Some(i) != self.swept).collect();
        order.extend(self.swept);
        let mut idx = vec![0usize; self.axes.len()];
        let mut points = Vec::new();
        loop {
            let values = self.axes.iter().zip(&idx).map(|(a, &i)| (a.name.to_string(), a.values[i])).collect();
            let tags = self
                .axes
                .iter()
                .enumerate()
                .zip(&idx)
                .filter(|((n, a), _)| a.values.len() > 1 && Some(*n) != self.swept)
                .map(|((_, a), &i)| (a.name.to_string(), (a.show)(a.values[i])))
                .collect();
            points.push(Point { values, tags });
            let mut carry = true;
            for &k in order.iter().rev() {
                idx[k] += 1;
                if idx[k] < self.axes[k].values.len() {
                    carry = false;
                    break;
                }
                idx[k] = 0;
            }
            if carry {
                break;
            }
        }
        Ok(points)
    }
}

/// One combination of parameter values.
#[derive(Debug, Clone, PartialEq)]
pub struct Point {
    values: Vec<(String, f64)>,
    tags: Vec<(String, String)>,
}

impl Point {
    /// The value of parameter `name`; NaN if there is none.
    pub fn get(&self, name: &str) -> f64 {
        self.values.iter().find(|v| v.0 == name).map_or(f64::NAN, |v| v.1)
    }

    /// The multi-valued parameters other than the swept one, shown (`loss`, `1e-3`): what tells
    /// this point's curve from the others.
    pub fn tags(&self) -> &[(String, String)] {
        &self.tags
    }
}

/// `points` values from `from` to `to` inclusive; on a log scale both ends must be above zero.
pub fn points(from: f64, to: f64, points: usize, log: bool) -> Result<Vec<f64>> {
    if !(from.is_finite() && to.is_finite()) {
        return Err(Error::Param {
            name: "sweep range",
            expected: "finite ends",
            value: if from.is_finite() { to } else { from },
        });
    }
    if points == 0 || points > 100_000 {
        return Err(Error::Param { name: "sweep points", expected: "between 1 and 100 000", value: points as f64 });
    }
    if log && (from <= 0.0 || to <= 0.0) {
        return Err(Error::Param {
            name: "log sweep start",
            expected: "above zero (use a linear sweep from 0)",
            value: from.min(to),
        });
    }
    if points == 1 {
        return Ok(vec![from]);
    }
    let n = (points - 1) as f64;
    Ok((0..points)
        .map(|i| {
            let f = i as f64 / n;
            if log {
                (from.ln() + f * (to.ln() - from.ln())).exp()
            } else {
                from + f * (to - from)
            }
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn linear_and_log_sweeps_hit_both_ends() {
        assert_eq!(points(0.0, 1.0, 3, false).unwrap(), vec![0.0, 0.5, 1.0]);
        let l = points(1e-4, 1e-1, 4, true).unwrap();
        for (a, b) in l.iter().zip([1e-4, 1e-3, 1e-2, 1e-1]) {
            assert!((a / b - 1.0).abs() < 1e-12);
        }
        assert!(points(0.0, 1.0, 3, true).is_err());
        assert!(points(0.0, 1.0, 0, false).is_err());
        assert_eq!(points(2.0, 5.0, 1, true).unwrap(), vec![2.0]);
    }

    fn number(s: &str) -> std::result::Result<f64, std::num::ParseFloatError> {
        s.parse()
    }

    fn grid() -> Grid {
        Grid::new(vec![
            Axis::new("a", vec![1.0, 2.0], |v| format!("{v}")).sweepable(number),
            Axis::new("b", vec![10.0], |v| format!("{v}")).sweepable(number),
            Axis::new("mode", vec![0.0, 1.0], |v| if v == 0.0 { "x".into() } else { "y".into() }),
        ])
    }

    #[test]
    fn the_last_axis_varies_fastest_and_multi_valued_axes_tag_points() {
        let p = grid().points().unwrap();
        let ab: Vec<(f64, f64)> = p.iter().map(|p| (p.get("a"), p.get("mode"))).collect();
        assert_eq!(ab, [(1.0, 0.0), (1.0, 1.0), (2.0, 0.0), (2.0, 1.0)]);
        assert_eq!(p[1].tags(), [("a".to_string(), "1".to_string()), ("mode".to_string(), "y".to_string())]);
        assert!(p[0].get("nothing").is_nan());
    }

    #[test]
    fn a_swept_axis_varies_fastest_and_tags_nothing() {
        let mut g = grid();
        g.sweep("b=1..3", 3, false).unwrap();
        assert_eq!(g.swept(), Some("b"));
        let p = g.points().unwrap();
        assert_eq!(p.len(), 12);
        let b: Vec<f64> = p[..3].iter().map(|p| p.get("b")).collect();
        assert_eq!(b, [1.0, 2.0, 3.0]);
        assert!(p[0].tags().iter().all(|t| t.0 != "b"));
    }

    #[test]
    fn bad_sweeps_say_what_is_wrong() {
        let msg = |spec: &str| grid().sweep(spec, 3, false).unwrap_err().to_string();
        assert_eq!(msg("b=1"), "--sweep \"b=1\": expected NAME=FROM..TO");
        assert_eq!(msg("mode=0..1"), "--sweep \"mode=0..1\": cannot sweep \"mode\" here; choose one of a, b");
        assert_eq!(msg("a=x..1"), "sweep start");
        assert_eq!(
            grid().sweep("a=0..1", 3, true).unwrap_err().to_string(),
            "log sweep start must be above zero (use a linear sweep from 0), got 0"
        );
        let empty = Grid::new(vec![Axis::new("size", vec![], |v| format!("{v}"))]);
        assert_eq!(empty.points().unwrap_err().to_string(), "no value for size");
    }
}
