//! IOPS and latency through the library at several queue depths, random or sequential, reads or
//! writes (for scripts/bench-initiator.sh).
//!
//! `cargo run --release -p stics-initiator --example qd -- iscsi://127.0.0.1:3260/IQN/1 --depths 1,32`

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use clap::{Parser, ValueEnum};
use stics_block::BlockDev;
use stics_initiator::{IscsiUrl, Lun, LunOptions};

/// Where each request goes.
#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Pattern {
    /// Uniformly over the span.
    Random,
    /// Each of the `depth` workers walks its own slice of the span from the start and stops at
    /// its end, so nothing is read twice.
    Seq,
}

/// Measures IOPS and latency of a remote LUN at each queue depth.
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
    /// Seconds per depth (a sequential run also ends at the end of the span).
    #[arg(long, default_value_t = 5.0)]
    seconds: f64,
    /// Sessions to spread commands over.
    #[arg(long, default_value_t = 1)]
    sessions: usize,
    /// Only use the first this many MiB of the LUN.
    #[arg(long, default_value_t = 64)]
    span_mib: u64,
    /// Access pattern.
    #[arg(long, value_enum, default_value_t = Pattern::Random)]
    pattern: Pattern,
    /// Write (without FUA) instead of reading.
    #[arg(long)]
    write: bool,
    /// Also print, per depth, each second's operations and 99th-percentile latency as CSV.
    #[arg(long)]
    per_second: bool,
    /// Stop each depth after this many MiB have been transferred (0: only the time limit).
    #[arg(long, default_value_t = 0)]
    limit_mib: u64,
}

/// One finished request: the second of the run it finished in and its latency in microseconds.
type Sample = (u32, u32);

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
    // Not zeros, so that nothing on the way can take a shortcut for them.
    let payload = Bytes::from((0..per_io * u64::from(g.block_size)).map(|i| (i % 251) as u8 + 1).collect::<Vec<_>>());
    println!("{:>6} {:>12} {:>12} {:>10} {:>10}", "depth", "IOPS", "MB/s", "avg_us", "p99_us");
    let mut results = Vec::new();
    let mut seconds_csv = Vec::new();
    let limit_ops = (a.limit_mib << 20) / (per_io * u64::from(g.block_size));
    for &depth in &a.depths {
        let depth = depth.max(1);
        let done = Arc::new(AtomicU64::new(0));
        let issued = Arc::new(AtomicU64::new(0));
        let end = Instant::now() + Duration::from_secs_f64(a.seconds);
        let start = Instant::now();
        let mut set = tokio::task::JoinSet::new();
        for w in 0..depth {
            let (lun, done, issued, payload) = (lun.clone(), done.clone(), issued.clone(), payload.clone());
            let (pattern, write) = (a.pattern, a.write);
            let slice = (w as u64 * span / depth as u64)..((w as u64 + 1) * span / depth as u64);
            set.spawn(async move {
                let mut x = 0x9e37_79b9_7f4a_7c15u64 ^ (w as u64 + 1);
                let mut next = slice.start;
                let mut samples: Vec<Sample> = Vec::new();
                while Instant::now() < end && (limit_ops == 0 || issued.fetch_add(1, Relaxed) < limit_ops) {
                    let lba = match pattern {
                        Pattern::Random => {
                            x ^= x << 13;
                            x ^= x >> 7;
                            x ^= x << 17;
                            (x % span) * per_io
                        }
                        Pattern::Seq if next < slice.end => {
                            next += 1;
                            (next - 1) * per_io
                        }
                        Pattern::Seq => break,
                    };
                    let t = Instant::now();
                    if write {
                        lun.write(lba, payload.clone(), false).await?;
                    } else {
                        lun.read(lba, per_io as u32).await?;
                    }
                    let now = Instant::now();
                    let us = u32::try_from(now.duration_since(t).as_micros()).unwrap_or(u32::MAX);
                    let sec = u32::try_from(now.duration_since(start).as_secs()).unwrap_or(u32::MAX);
                    samples.push((sec, us));
                    done.fetch_add(1, Relaxed);
                }
                Ok::<_, stics_block::BlockError>(samples)
            });
        }
        let mut samples = Vec::new();
        while let Some(r) = set.join_next().await {
            samples.extend(r??);
        }
        let secs = start.elapsed().as_secs_f64();
        let n = done.load(Relaxed) as f64;
        let iops = n / secs;
        let mean = samples.iter().map(|s| f64::from(s.1)).sum::<f64>() / n.max(1.0);
        let mut lat: Vec<u32> = samples.iter().map(|s| s.1).collect();
        println!(
            "{:>6} {:>12.0} {:>12.1} {:>10.1} {:>10}",
            depth,
            iops,
            iops * f64::from(a.bs) / 1e6,
            mean,
            p99(&mut lat)
        );
        if a.per_second {
            samples.sort_unstable();
            for chunk in samples.chunk_by(|x, y| x.0 == y.0) {
                let mut lat: Vec<u32> = chunk.iter().map(|s| s.1).collect();
                seconds_csv.push(format!("{depth},{},{},{}", chunk[0].0, chunk.len(), p99(&mut lat)));
            }
        }
        results.push((depth, iops));
    }
    if let (Some(first), Some(last)) = (results.first(), results.last()) {
        if results.len() > 1 {
            println!("ratio QD{}/QD{}: {:.2}", last.0, first.0, last.1 / first.1);
        }
    }
    if a.per_second {
        println!("depth,second,ops,p99_us");
        println!("{}", seconds_csv.join("\n"));
    }
    let c = lun.counters();
    println!("max in flight {}, commands {}, round trips {}", c.max_in_flight, c.commands, c.round_trips);
    lun.close().await;
    Ok(())
}

/// The 99th-percentile of `lat` (reordered), 0 when empty.
fn p99(lat: &mut [u32]) -> u32 {
    if lat.is_empty() {
        return 0;
    }
    let i = (lat.len() * 99).div_ceil(100).saturating_sub(1);
    *lat.select_nth_unstable(i).1
}
