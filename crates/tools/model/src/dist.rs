//! Empirical request-size distributions: reading them, their moments, eq. (6) and sampling.

use crate::{units::parse_size, Error, Iscsi, Result};

/// The seed-003 style distribution shipped with the crate (mean 6 KiB).
pub const SEED003_TEXT: &str = include_str!("../data/seed003-request-sizes.txt");

/// A discrete distribution of request sizes in bytes.
#[derive(Debug, Clone, PartialEq)]
pub struct SizeDist {
    /// `(size, probability)`, sorted by size, probabilities summing to one.
    points: Vec<(f64, f64)>,
    /// Cumulative probabilities, for sampling; the last entry is one.
    cdf: Vec<f64>,
}

impl SizeDist {
    /// Builds a distribution from `(size, weight)` pairs; weights are normalised.
    pub fn new(pairs: impl IntoIterator<Item = (f64, f64)>) -> Result<SizeDist> {
        let mut points: Vec<(f64, f64)> = Vec::new();
        for (size, weight) in pairs {
            if !(size.is_finite() && size >= 0.0) {
                return Err(Error::Dist { line: 0, reason: format!("size {size} is not a finite size") });
            }
            if !(weight.is_finite() && weight >= 0.0) {
                return Err(Error::Dist { line: 0, reason: format!("weight {weight} is not a non-negative number") });
            }
            points.push((size, weight));
        }
        let total: f64 = points.iter().map(|p| p.1).sum();
        if !(total > 0.0 && total.is_finite()) {
            return Err(Error::Dist { line: 0, reason: "the weights add up to zero: no sizes to draw".into() });
        }
        points.sort_by(|a, b| a.0.total_cmp(&b.0));
        let mut acc = 0.0;
        let mut cdf = Vec::with_capacity(points.len());
        for p in &mut points {
            p.1 /= total;
            acc += p.1;
            cdf.push(acc);
        }
        if let Some(last) = cdf.last_mut() {
            *last = 1.0;
        }
        Ok(SizeDist { points, cdf })
    }

    /// Every request has the same size.
    pub fn fixed(size: f64) -> Result<SizeDist> {
        SizeDist::new([(size, 1.0)])
    }

    /// Reads `size weight` lines (`4KiB 0.45`, `4096,45`); `#` starts a comment.
    pub fn parse(text: &str) -> Result<SizeDist> {
        let mut pairs = Vec::new();
        for (i, raw) in text.lines().enumerate() {
            let line = raw.split('#').next().unwrap_or("").trim();
            if line.is_empty() {
                continue;
            }
            let fields: Vec<&str> =
                line.split(|c: char| c == ',' || c.is_whitespace()).filter(|f| !f.is_empty()).collect();
            let [size, weight] = fields.as_slice() else {
                return Err(Error::Dist {
                    line: i + 1,
                    reason: format!("expected \"size weight\", e.g. \"4KiB 0.45\", got {line:?}"),
                });
            };
            let size = parse_size(size).map_err(|e| Error::Dist { line: i + 1, reason: e.to_string() })?;
            let weight: f64 = weight.parse().ok().filter(|w: &f64| w.is_finite() && *w >= 0.0).ok_or_else(|| {
                Error::Dist { line: i + 1, reason: format!("weight {weight:?} is not a non-negative number") }
            })?;
            pairs.push((size, weight));
        }
        if pairs.is_empty() {
            return Err(Error::Dist { line: 0, reason: "no \"size weight\" lines".into() });
        }
        SizeDist::new(pairs)
    }

    /// The distribution shipped in `data/seed003-request-sizes.txt`: the empirical request sizes of seed 003's
    /// traffic model, mean 6 KiB.
    pub fn seed003() -> SizeDist {
        // The shipped text is checked by a unit test, so this cannot fail at run time.
        SizeDist::parse(SEED003_TEXT).unwrap_or_else(|_| SizeDist { points: vec![(6144.0, 1.0)], cdf: vec![1.0] })
    }

    /// `(size, probability)` pairs in increasing size.
    pub fn points(&self) -> &[(f64, f64)] {
        &self.points
    }

    /// `E[f(S)]`.
    pub fn expect(&self, f: impl Fn(f64) -> f64) -> f64 {
        self.points.iter().map(|&(s, p)| p * f(s)).sum()
    }

    /// `S̄`.
    pub fn mean(&self) -> f64 {
        self.expect(|s| s)
    }

    /// `P(a < S ≤ b)`.
    pub fn prob_between(&self, a: f64, b: f64) -> f64 {
        self.points.iter().filter(|&&(s, _)| a < s && s <= b).map(|p| p.1).sum()
    }

    /// The largest size.
    pub fn max(&self) -> f64 {
        self.points.last().map_or(0.0, |p| p.0)
    }

    /// Eq. (6): `N̄ = 1 + Σ_{i≥1} i·P(x_{i−1} < S ≤ x_i)` with `x_i = b_init + i·b_max`.
    pub fn mean_rounds(&self, iscsi: &Iscsi) -> f64 {
        let x = |i: u64| iscsi.first_burst + i as f64 * iscsi.max_burst;
        let mut n = 1.0;
        let mut i = 1;
        while x(i - 1) < self.max() {
            n += i as f64 * self.prob_between(x(i - 1), x(i));
            i += 1;
        }
        n
    }

    /// The size at cumulative probability `u ∈ [0, 1)` (inverse transform sampling).
    pub fn quantile(&self, u: f64) -> f64 {
        let i = self.cdf.partition_point(|&c| c <= u).min(self.points.len().saturating_sub(1));
        self.points.get(i).map_or(0.0, |p| p.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shipped_distribution_parses_and_has_mean_6kib() {
        let d = SizeDist::parse(SEED003_TEXT).unwrap();
        assert_eq!(d, SizeDist::seed003());
        assert!((d.mean() - 6144.0).abs() < 1e-9, "mean {}", d.mean());
        assert!(d.prob_between(65536.0, f64::INFINITY) > 0.0, "a few requests need a second round");
    }

    #[test]
    fn eq6_equals_the_mean_of_eq2() {
        let iscsi = Iscsi::default();
        for d in [
            SizeDist::seed003(),
            SizeDist::new([(1.0, 1.0), (65536.0, 1.0), (65537.0, 2.0), (400000.0, 0.5), (2e6, 0.25)]).unwrap(),
        ] {
            let by_eq2 = d.expect(|s| iscsi.rounds(s));
            assert!((d.mean_rounds(&iscsi) - by_eq2).abs() < 1e-12);
        }
    }

    #[test]
    fn parse_reports_the_bad_line() {
        let err = SizeDist::parse("# c\n4KiB 1\n8KiB x\n").unwrap_err();
        assert_eq!(err, Error::Dist { line: 3, reason: "weight \"x\" is not a non-negative number".into() });
        assert!(matches!(SizeDist::parse("4KiB\n"), Err(Error::Dist { line: 1, .. })));
        assert!(matches!(SizeDist::parse("banana 1\n"), Err(Error::Dist { line: 1, .. })));
        assert!(SizeDist::parse("# nothing\n").is_err());
        assert!(SizeDist::parse("4KiB 0\n").is_err());
        assert!(SizeDist::parse("4096,3\n8192,1\n").is_ok());
    }

    #[test]
    fn quantile_inverts_the_cdf() {
        let d = SizeDist::new([(1.0, 1.0), (2.0, 2.0), (3.0, 1.0)]).unwrap();
        assert_eq!(d.quantile(0.0), 1.0);
        assert_eq!(d.quantile(0.2499), 1.0);
        assert_eq!(d.quantile(0.25), 2.0);
        assert_eq!(d.quantile(0.7499), 2.0);
        assert_eq!(d.quantile(0.75), 3.0);
        assert_eq!(d.quantile(0.999999), 3.0);
        assert_eq!(d.quantile(1.0), 3.0);
    }
}
