//! Evenly spaced parameter values for one-parameter sweeps, on a linear or logarithmic scale.

use crate::{Error, Result};

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
}
