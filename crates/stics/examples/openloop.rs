//! An open-loop workload in the shape of seed 004's EMC-tel trace (§4.2): small requests arriving
//! at a fixed mean rate whatever the device's speed (Poisson arrivals), mostly writes, over a
//! fixed data set, from a fixed seed. Prints the response-time distribution and writes a
//! histogram PNG; for scripts/bench-gateway.sh.
//!
//! `cargo run --release -p stics --example openloop -- iscsi://127.0.0.1:3260/IQN/0 --png lat.png`

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use clap::Parser;
use stics_block::BlockDev;
use stics_initiator::{IscsiUrl, Lun, LunOptions};
use stics_report::plot::{self, Figure, Series};

/// Runs the open-loop trace against a LUN and reports response times.
#[derive(Parser)]
struct Args {
    /// Device URL: iscsi://[user[%secret]@]host[:port]/IQN/LUN.
    url: String,
    /// Mean requests per second (seed 004: 333).
    #[arg(long, default_value_t = 333.0)]
    rate: f64,
    /// Blocks of 512 bytes per request (seed 004: 4).
    #[arg(long, default_value_t = 4)]
    blocks: u32,
    /// Percent of requests that write (seed 004: 89).
    #[arg(long, default_value_t = 89)]
    write_pct: u32,
    /// Data set in decimal MB: requests fall uniformly in the first this many MB (seed 004: 900).
    #[arg(long, default_value_t = 900)]
    span_mb: u64,
    /// Requests to send.
    #[arg(long, default_value_t = 20_000)]
    requests: u64,
    /// Seed of the arrival times, addresses and directions.
    #[arg(long, default_value_t = 4)]
    seed: u64,
    /// Write a response-time histogram here (PNG).
    #[arg(long)]
    png: Option<std::path::PathBuf>,
    /// Title of the histogram.
    #[arg(long, default_value = "open-loop response times")]
    title: String,
}

/// xorshift64*: small, seedable, and the same sequence on every machine.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// Uniform in (0, 1].
    fn unit(&mut self) -> f64 {
        ((self.next() >> 11) as f64 + 1.0) / (1u64 << 53) as f64
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> anyhow::Result<()> {
    let a = Args::parse();
    anyhow::ensure!(a.rate > 0.0 && a.requests > 0 && a.blocks > 0, "rate, requests and blocks must be positive");
    let url = IscsiUrl::parse(&a.url)?;
    let lun = Arc::new(Lun::open(&url, &LunOptions::default()).await?);
    let g = lun.geometry();
    let req_bytes = u64::from(a.blocks) * 512;
    anyhow::ensure!(
        req_bytes % u64::from(g.block_size) == 0,
        "requests of {req_bytes} bytes are not whole {}-byte blocks",
        g.block_size
    );
    let per_req = req_bytes / u64::from(g.block_size);
    let slots = (a.span_mb * 1_000_000 / req_bytes).min(g.num_blocks / per_req);
    anyhow::ensure!(slots > 0, "LUN smaller than one request");
    let payload = Bytes::from((0..req_bytes).map(|i| (i % 251) as u8 + 1).collect::<Vec<_>>());

    let mut rng = Rng(a.seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
    let start = Instant::now() + Duration::from_millis(100);
    let mut at = 0.0f64;
    let mut set = tokio::task::JoinSet::new();
    let mut lat: Vec<(bool, Duration)> = Vec::with_capacity(a.requests as usize);
    for _ in 0..a.requests {
        at += -rng.unit().ln() / a.rate;
        let lba = (rng.next() % slots) * per_req;
        let write = rng.next() % 100 < u64::from(a.write_pct);
        let due = start + Duration::from_secs_f64(at);
        tokio::time::sleep_until(due.into()).await;
        let (lun, payload) = (Arc::clone(&lun), payload.clone());
        set.spawn(async move {
            // From when it was due: a client that falls behind counts against the device.
            let r = if write {
                lun.write(lba, payload, false).await
            } else {
                lun.read(lba, per_req as u32).await.map(|_| ())
            };
            r.map(|()| (write, due.elapsed()))
        });
        // Collect as we go so that the set stays small.
        while let Some(done) = set.try_join_next() {
            lat.push(done??);
        }
    }
    while let Some(done) = set.join_next().await {
        lat.push(done??);
    }
    let secs = start.elapsed().as_secs_f64();
    let mut ms: Vec<f64> = lat.iter().map(|(_, d)| d.as_secs_f64() * 1e3).collect();
    ms.sort_by(f64::total_cmp);
    let pct = |p: f64| ms[((ms.len() as f64 * p) as usize).min(ms.len() - 1)];
    let mean = ms.iter().sum::<f64>() / ms.len() as f64;
    let writes = lat.iter().filter(|(w, _)| *w).count();
    let over50 = ms.iter().filter(|&&m| m > 50.0).count();
    println!(
        "{:>8} {:>7} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>7}",
        "requests", "writes%", "mean_ms", "p50_ms", "p90_ms", "p99_ms", "p999_ms", "max_ms", ">50ms"
    );
    println!(
        "{:>8} {:>7.1} {:>9.3} {:>9.3} {:>9.3} {:>9.3} {:>9.3} {:>9.3} {:>7}",
        ms.len(),
        100.0 * writes as f64 / ms.len() as f64,
        mean,
        pct(0.5),
        pct(0.9),
        pct(0.99),
        pct(0.999),
        ms[ms.len() - 1],
        over50
    );
    println!("offered {:.1} req/s, ran {secs:.1} s", a.rate);
    if let Some(path) = &a.png {
        let fig = Figure {
            title: a.title.clone(),
            x_label: "response time (ms)".into(),
            y_label: "requests".into(),
            log_x: false,
            log_y: true,
            series: vec![Series::bars(format!("{} requests, mean {mean:.2} ms", ms.len()), plot::histogram(&ms, 60))],
        };
        plot::draw(&fig, path)?;
        println!("histogram: {}", path.display());
    }
    Ok(())
}
