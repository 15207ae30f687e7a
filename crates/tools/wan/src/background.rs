//! Background load: packet sizes drawn from an Internet mix and Poisson-paced send times whose
//! bytes add up to a chosen share of the link rate.
//!
//! The mix follows the traffic profile of seed 000 (50 % of packets under 44 B, 75 % under 576 B,
//! 99 % under 1500 B): TCP acknowledgements dominate the count, 576-byte and mid-size packets the
//! middle, and a small tail of full-size packets.

use crate::rng::Rng;

/// One piece of the mix: sizes `lo..=hi` (IP bytes), uniform, with weight `share`.
#[derive(Debug, Clone, Copy)]
struct Band {
    lo: u32,
    hi: u32,
    share: f64,
}

const MIX: [Band; 6] = [
    Band { lo: 40, hi: 40, share: 0.45 },
    Band { lo: 28, hi: 43, share: 0.06 },
    Band { lo: 44, hi: 575, share: 0.25 },
    Band { lo: 576, hi: 576, share: 0.08 },
    Band { lo: 577, hi: 1499, share: 0.15 },
    Band { lo: 1500, hi: 1500, share: 0.01 },
];

/// Ethernet header added to each background packet on the wire.
pub const ETH_HEADER: u32 = 14;

/// Draws IP packet sizes from the mix.
#[derive(Debug, Clone, Copy, Default)]
pub struct SizeMix;

impl SizeMix {
    pub fn sample(&self, rng: &mut Rng) -> u32 {
        let mut u = rng.f64();
        for b in MIX {
            if u < b.share {
                return rng.range_u32(b.lo, b.hi);
            }
            u -= b.share;
        }
        // Rounding can leave a sliver above the last band.
        1500
    }

    /// The mean IP packet size of the mix.
    pub fn mean(&self) -> f64 {
        MIX.iter().map(|b| b.share * f64::from(b.lo + b.hi) / 2.0).sum()
    }
}

/// Send times for background frames: exponential gaps sized so the frames' bits arrive at
/// `load_bps` on average. When the sender falls behind it forgets the debt beyond `max_lag_ns`
/// instead of bursting to catch up.
#[derive(Debug, Clone)]
pub struct Pacer {
    next_ns: u64,
    load_bps: f64,
    max_lag_ns: u64,
    pending: Option<u32>,
}

impl Pacer {
    pub fn new(start_ns: u64, load_bps: f64) -> Pacer {
        Pacer { next_ns: start_ns, load_bps, max_lag_ns: 10_000_000, pending: None }
    }

    pub fn set_load(&mut self, load_bps: f64) {
        self.load_bps = load_bps;
    }

    /// The next frame (its IP size) if it is due at `now_ns`; call until `None`.
    pub fn next_due(&mut self, now_ns: u64, mix: &SizeMix, rng: &mut Rng) -> Option<u32> {
        if self.load_bps <= 0.0 {
            return None;
        }
        if now_ns > self.next_ns + self.max_lag_ns {
            self.next_ns = now_ns - self.max_lag_ns;
        }
        let size = *self.pending.get_or_insert_with(|| mix.sample(rng));
        if self.next_ns > now_ns {
            return None;
        }
        self.pending = None;
        let bits = f64::from(size + ETH_HEADER) * 8.0;
        self.next_ns += (rng.exp1() * bits / self.load_bps * 1e9) as u64;
        Some(size)
    }

    /// When the next frame is due.
    pub fn next_ns(&self) -> u64 {
        self.next_ns
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn share_below(sizes: &[u32], limit: u32) -> f64 {
        sizes.iter().filter(|&&s| s < limit).count() as f64 / sizes.len() as f64
    }

    #[test]
    fn size_mix_matches_seed_000_percentiles() {
        let mut rng = Rng::new(11, 0);
        let sizes: Vec<u32> = (0..200_000).map(|_| SizeMix.sample(&mut rng)).collect();
        let (p44, p576, p1500) = (share_below(&sizes, 44), share_below(&sizes, 576), share_below(&sizes, 1500));
        assert!((0.50..0.53).contains(&p44), "under 44 B: {p44}");
        assert!((0.75..0.78).contains(&p576), "under 576 B: {p576}");
        assert!((0.985..0.995).contains(&p1500), "under 1500 B: {p1500}");
        assert!(sizes.iter().all(|&s| (28..=1500).contains(&s)));
    }

    #[test]
    fn mix_mean_matches_samples() {
        let mut rng = Rng::new(12, 0);
        let n = 200_000;
        let mean = (0..n).map(|_| f64::from(SizeMix.sample(&mut rng))).sum::<f64>() / f64::from(n);
        assert!((mean - SizeMix.mean()).abs() < 3.0, "{mean} vs {}", SizeMix.mean());
    }

    #[test]
    fn pacer_delivers_the_load_on_average() {
        let mut rng = Rng::new(13, 0);
        let load = 30e6;
        let mut p = Pacer::new(0, load);
        let mut bits = 0.0;
        let step = 100_000; // 100 us ticks over 10 s
        let mut now = 0;
        while now < 10_000_000_000 {
            while let Some(s) = p.next_due(now, &SizeMix, &mut rng) {
                bits += f64::from(s + ETH_HEADER) * 8.0;
            }
            now += step;
        }
        let rate = bits / 10.0;
        assert!((rate / load - 1.0).abs() < 0.03, "rate {rate}");
    }

    #[test]
    fn pacer_forgets_debt_beyond_max_lag() {
        let mut rng = Rng::new(14, 0);
        let mut p = Pacer::new(0, 1e6);
        let mut n = 0;
        // One second late at 1 Mbit/s would owe ~400 frames; only about 10 ms worth come out.
        while p.next_due(1_000_000_000, &SizeMix, &mut rng).is_some() {
            n += 1;
        }
        assert!(n < 30, "burst of {n}");
    }

    #[test]
    fn zero_load_sends_nothing() {
        let mut rng = Rng::new(15, 0);
        let mut p = Pacer::new(0, 0.0);
        assert_eq!(p.next_due(1_000_000_000, &SizeMix, &mut rng), None);
    }
}
