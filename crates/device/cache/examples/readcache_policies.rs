//! Hit ratios of the read cache's two policies (LRU, seed 004's choice, and S3-FIFO) on
//! block-read streams a gateway sees: a skewed (Zipf) working set, a hot set interrupted by long
//! sequential scans (a backup, a `find`), and a loop larger than the cache. Each miss is a WAN
//! round trip, so the hit ratio is what the policy is worth.
//!
//! `cargo run --release -p stics-cache --example readcache_policies`

use bytes::Bytes;
use rand::{rngs::StdRng, Rng, SeedableRng};
use stics_cache::readcache::{Policy, ReadCache};

const BLOCKS: u64 = 1 << 20;
const READS: usize = 4_000_000;

/// A Zipf sampler over `n` ranks (rank 0 most popular), scattered over the device.
struct Zipf {
    cdf: Vec<f64>,
}

impl Zipf {
    fn new(n: usize, s: f64) -> Zipf {
        let mut cdf = Vec::with_capacity(n);
        let mut sum = 0.0;
        for k in 1..=n {
            sum += 1.0 / (k as f64).powf(s);
            cdf.push(sum);
        }
        for c in &mut cdf {
            *c /= sum;
        }
        Zipf { cdf }
    }

    fn sample(&self, rng: &mut StdRng) -> u64 {
        let u: f64 = rng.gen();
        let rank = self.cdf.partition_point(|&c| c < u) as u64;
        // Popular blocks are not neighbours on the device.
        rank.wrapping_mul(0x9E37_79B9_7F4A_7C15) % BLOCKS
    }
}

fn stream(kind: &str) -> Vec<u64> {
    let mut rng = StdRng::seed_from_u64(4);
    match kind {
        "zipf" => {
            let z = Zipf::new(BLOCKS as usize, 0.9);
            (0..READS).map(|_| z.sample(&mut rng)).collect()
        }
        "hot+scans" => {
            // 90 % of reads on a hot set of 40,000 blocks; every 200,000 reads a sequential scan
            // of 300,000 blocks elsewhere.
            let mut out = Vec::with_capacity(READS);
            let mut scan_at = BLOCKS / 2;
            while out.len() < READS {
                for _ in 0..200_000 {
                    out.push(rng.gen_range(0..40_000u64) * 7 % BLOCKS);
                }
                for b in 0..300_000 {
                    out.push((scan_at + b) % BLOCKS);
                }
                scan_at = (scan_at + 300_000) % BLOCKS;
            }
            out.truncate(READS);
            out
        }
        _ => (0..READS).map(|i| (i as u64) % 80_000).collect(),
    }
}

fn hit_ratio(policy: Policy, blocks: usize, reads: &[u64]) -> f64 {
    let mut c = ReadCache::new(policy, blocks);
    let block = Bytes::from_static(&[0u8; 16]);
    for &lba in reads {
        if c.get(lba).is_none() {
            c.insert(lba, block.clone());
        }
    }
    let (hits, misses) = c.hits_and_misses();
    hits as f64 / (hits + misses).max(1) as f64
}

fn main() {
    println!("{:<10} {:>12} {:>10} {:>10} {:>12}", "stream", "cache", "LRU", "S3-FIFO", "S3-FIFO/LRU");
    for kind in ["zipf", "hot+scans", "loop"] {
        let reads = stream(kind);
        for blocks in [16_384usize, 65_536] {
            let lru = hit_ratio(Policy::Lru, blocks, &reads);
            let s3 = hit_ratio(Policy::S3Fifo, blocks, &reads);
            let label = if kind == "loop" { "loop 80k" } else { kind };
            println!(
                "{label:<10} {:>12} {:>9.1}% {:>9.1}% {:>12.2}",
                format!("{blocks} blocks"),
                lru * 100.0,
                s3 * 100.0,
                if lru > 0.0 { s3 / lru } else { f64::INFINITY }
            );
        }
    }
}
