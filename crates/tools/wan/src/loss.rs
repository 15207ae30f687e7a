//! Loss models that decide, packet by packet, whether the link loses a packet.

use crate::params::LossSpec;
use crate::rng::Rng;

/// A loss model with its state (the Gilbert–Elliott model remembers whether it is in a burst).
#[derive(Debug, Clone)]
pub struct LossModel {
    spec: LossSpec,
    in_bad: bool,
}

impl LossModel {
    pub fn new(spec: LossSpec) -> LossModel {
        LossModel { spec, in_bad: false }
    }

    pub fn spec(&self) -> &LossSpec {
        &self.spec
    }

    /// Changes the parameters; a Gilbert model keeps its current state.
    pub fn set_spec(&mut self, spec: LossSpec) {
        self.spec = spec;
    }

    /// Decides the fate of the next packet: true if it is lost.
    pub fn lose(&mut self, rng: &mut Rng) -> bool {
        match self.spec {
            LossSpec::Bernoulli { p } => p > 0.0 && rng.chance(p),
            LossSpec::Gilbert { p, r, bad, good } => {
                // The state moves first, then the packet meets the state it lands in, as netem does.
                self.in_bad = if self.in_bad { !rng.chance(r) } else { rng.chance(p) };
                let loss = if self.in_bad { bad } else { good };
                loss > 0.0 && rng.chance(loss)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(spec: LossSpec, n: usize, seed: u64) -> Vec<bool> {
        let mut m = LossModel::new(spec);
        let mut rng = Rng::new(seed, 0);
        (0..n).map(|_| m.lose(&mut rng)).collect()
    }

    fn mean_burst(fates: &[bool]) -> f64 {
        let (mut bursts, mut lost, mut prev) = (0usize, 0usize, false);
        for &f in fates {
            if f {
                lost += 1;
                if !prev {
                    bursts += 1;
                }
            }
            prev = f;
        }
        lost as f64 / bursts.max(1) as f64
    }

    #[test]
    fn bernoulli_loss_rate_is_within_four_sigma() {
        let n = 1_000_000;
        let p = 0.01;
        let lost = run(LossSpec::Bernoulli { p }, n, 3).iter().filter(|&&l| l).count() as f64;
        let sigma = (n as f64 * p * (1.0 - p)).sqrt();
        assert!((lost - n as f64 * p).abs() < 4.0 * sigma, "lost {lost}");
    }

    #[test]
    fn zero_loss_loses_nothing() {
        assert!(!run(LossSpec::Bernoulli { p: 0.0 }, 10_000, 1).into_iter().any(|l| l));
    }

    #[test]
    fn same_seed_same_fates() {
        let spec = LossSpec::Bernoulli { p: 0.1 };
        assert_eq!(run(spec, 10_000, 9), run(spec, 10_000, 9));
        assert_ne!(run(spec, 10_000, 9), run(spec, 10_000, 10));
    }

    #[test]
    fn gilbert_matches_its_mean_and_burst_length() {
        let spec = LossSpec::gilbert_from_mean(0.01, 4.0, 1.0).unwrap();
        let fates = run(spec, 2_000_000, 5);
        let rate = fates.iter().filter(|&&l| l).count() as f64 / fates.len() as f64;
        assert!((rate - 0.01).abs() < 0.001, "rate {rate}");
        let burst = mean_burst(&fates);
        assert!((burst - 4.0).abs() < 0.3, "burst {burst}");
    }

    #[test]
    fn bernoulli_bursts_are_short() {
        let fates = run(LossSpec::Bernoulli { p: 0.01 }, 1_000_000, 5);
        assert!(mean_burst(&fates) < 1.05);
    }
}
