//! Repetitions summarised: median and spread, the way every table of `stics bench` reports them.

/// The median and range of repeated measurements of one quantity.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Stat {
    pub median: f64,
    pub min: f64,
    pub max: f64,
    pub n: usize,
}

impl Stat {
    /// Summarises `samples` (NaN ones ignored); all NaN when there is none.
    pub fn of(samples: &[f64]) -> Stat {
        let mut v: Vec<f64> = samples.iter().copied().filter(|x| !x.is_nan()).collect();
        if v.is_empty() {
            return Stat { median: f64::NAN, min: f64::NAN, max: f64::NAN, n: 0 };
        }
        v.sort_by(f64::total_cmp);
        let n = v.len();
        let median = if n % 2 == 1 { v[n / 2] } else { f64::midpoint(v[n / 2 - 1], v[n / 2]) };
        Stat { median, min: v[0], max: v[n - 1], n }
    }

    /// (max − min) / median: 0.05 reads "the repetitions lay within 5 % of each other".
    pub fn spread(&self) -> f64 {
        if self.median == 0.0 {
            return 0.0;
        }
        (self.max - self.min) / self.median.abs()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_and_spread_of_odd_even_and_empty_samples() {
        let s = Stat::of(&[3.0, 1.0, 2.0]);
        assert_eq!((s.median, s.min, s.max, s.n), (2.0, 1.0, 3.0, 3));
        assert!((s.spread() - 1.0).abs() < 1e-12);
        assert_eq!(Stat::of(&[4.0, 1.0, 2.0, 3.0]).median, 2.5);
        assert_eq!(Stat::of(&[f64::NAN, 5.0]).median, 5.0);
        assert!(Stat::of(&[]).median.is_nan());
    }
}
