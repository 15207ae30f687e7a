//! Random-read IOPS through the library at several queue depths (for scripts/bench-initiator.sh).
//!
//! `cargo run --release -p stics-initiator --example qd -- iscsi://127.0.0.1:3260/IQN/1 --depths 1,32`

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Parser;
use stics_block::BlockDev;
use stics_initiator::{IscsiUrl, Lun, LunOptions};

/// Measures random-read IOPS of a remote LUN at each queue depth.
#[derive(Parser)]
struct Args {
    /// Device URL: iscsi://[user[%secret]@]host[:port]/IQN/LUN.
    url: String,
    /// Queue depths to measure, comma-separated.
    #[arg(long, default_value = "1,32", value_delimiter = ',')]
    depths: Vec<usize>,
    /// Request size in bytes.
    #[arg(long, default_value_t = 4096)]
    bs: u32,
    /// Seconds per depth.
    #[arg(long, default_value_t = 5.0)]
    seconds: f64,
    /// Sessions to spread commands over.
    #[arg(long, default_value_t = 1)]
    sessions: usize,
    /// Only use the first this many MiB of the LUN.
    #[arg(long, default_value_t = 64)]
    span_mib: u64,
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> anyhow::Result<()> {
    let a = Args::parse();
    let url = IscsiUrl::parse(&a.url)?;
    let opts = LunOptions { sessions: a.sessions, ..LunOptions::default() };
    let lun = Arc::new(Lun::open(&url, &opts).await?);
    let g = lun.geometry();
    let per_io = u64::from((a.bs / g.block_size).max(1));
    let span = ((a.span_mib << 20) / u64::from(g.block_size)).min(g.num_blocks) / per_io;
    anyhow::ensure!(span > 0, "LUN smaller than one request");
    println!("{:>6} {:>12} {:>12} {:>10}", "depth", "IOPS", "MB/s", "avg_us");
    let mut results = Vec::new();
    for &depth in &a.depths {
        let done = Arc::new(AtomicU64::new(0));
        let end = Instant::now() + Duration::from_secs_f64(a.seconds);
        let start = Instant::now();
        let mut set = tokio::task::JoinSet::new();
        for w in 0..depth.max(1) {
            let (lun, done) = (lun.clone(), done.clone());
            set.spawn(async move {
                let mut x = 0x9e37_79b9_7f4a_7c15u64 ^ (w as u64 + 1);
                while Instant::now() < end {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    let lba = (x % span) * per_io;
                    lun.read(lba, per_io as u32).await?;
                    done.fetch_add(1, Relaxed);
                }
                Ok::<(), stics_block::BlockError>(())
            });
        }
        while let Some(r) = set.join_next().await {
            r??;
        }
        let secs = start.elapsed().as_secs_f64();
        let n = done.load(Relaxed) as f64;
        let iops = n / secs;
        println!(
            "{:>6} {:>12.0} {:>12.1} {:>10.1}",
            depth,
            iops,
            iops * f64::from(a.bs) / 1e6,
            depth as f64 / iops * 1e6
        );
        results.push((depth, iops));
    }
    if let (Some(first), Some(last)) = (results.first(), results.last()) {
        if results.len() > 1 {
            println!("ratio QD{}/QD{}: {:.2}", last.0, first.0, last.1 / first.1);
        }
    }
    let c = lun.counters();
    println!("max in flight {}, commands {}, round trips {}", c.max_in_flight, c.commands, c.round_trips);
    lun.close().await;
    Ok(())
}
