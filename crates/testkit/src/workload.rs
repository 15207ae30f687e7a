//! A verified random-write workload through the initiator's `Lun`, run while a test injures the
//! target or the link; every unit is checked afterwards.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use stics_block::BlockDev;
use stics_initiator::{IscsiUrl, Lun, LunOptions, RecoveryPolicy};

use crate::pattern::noise;

/// 4 KiB units each worker owns.
const UNITS: u64 = 256;
const WORKERS: u64 = 8;
const UNIT_BLOCKS: u32 = 8;

/// The 4 KiB content of version `version` of a worker's unit.
pub fn content(worker: u64, unit: u64, version: u64) -> Bytes {
    Bytes::from(noise(worker << 48 ^ unit << 20 ^ version, 4096))
}

/// Short timers, so that faults are noticed and healed within a test's seconds.
pub fn fault_options() -> LunOptions {
    let mut o = LunOptions::default();
    o.config.timers.recovery = RecoveryPolicy {
        timeout: Duration::from_secs(30),
        min_backoff: Duration::from_millis(20),
        max_backoff: Duration::from_millis(250),
    };
    o.config.timers.nop_interval = Duration::from_millis(500);
    o.config.timers.nop_timeout = Duration::from_secs(1);
    o.config.login_timeout = Duration::from_secs(2);
    o
}

/// Each worker writes runs of 1-4 units at random places in its own region until `until`,
/// remembering the last version of every unit; returns those versions.
pub async fn workload(lun: Arc<Lun>, worker: u64, until: Instant) -> Vec<u64> {
    let mut versions = vec![0u64; UNITS as usize];
    let mut x = worker.wrapping_mul(0x2545_f491_4f6c_dd1d) | 1;
    let mut n = 0u64;
    while Instant::now() < until || n < 20 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let run = 1 + x % 4;
        let start = (x >> 8) % (UNITS - run + 1);
        let mut buf = Vec::with_capacity((run * 4096) as usize);
        for u in start..start + run {
            versions[u as usize] += 1;
            buf.extend_from_slice(&content(worker, u, versions[u as usize]));
        }
        let lba = (worker * UNITS + start) * u64::from(UNIT_BLOCKS);
        lun.write(lba, Bytes::from(buf), false).await.expect("callers see slower I/O, never an error");
        n += 1;
    }
    versions
}

/// Checks that every unit holds the last version its worker wrote (zeros if none).
pub async fn verify(lun: &Lun, all: &[Vec<u64>]) {
    for (w, versions) in all.iter().enumerate() {
        let w = w as u64;
        let region = lun.read(w * UNITS * u64::from(UNIT_BLOCKS), (UNITS as u32) * UNIT_BLOCKS).await.unwrap();
        for (u, &v) in versions.iter().enumerate() {
            let got = region.slice(u * 4096..(u + 1) * 4096);
            let want = if v == 0 { Bytes::from(vec![0u8; 4096]) } else { content(w, u as u64, v) };
            assert!(got == want, "worker {w} unit {u}: expected version {v}");
        }
    }
}

/// Runs the workload for `secs` while `fault` runs on this thread, then verifies every unit.
pub fn run_with_fault(url: &str, secs: u64, fault: impl FnOnce()) -> stics_initiator::Snapshot {
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let url = IscsiUrl::parse(url).unwrap();
    let lun = Arc::new(rt.block_on(Lun::open(&url, &fault_options())).unwrap());
    let until = Instant::now() + Duration::from_secs(secs);
    let handles: Vec<_> = (0..WORKERS).map(|w| rt.spawn(workload(lun.clone(), w, until))).collect();
    fault();
    let all: Vec<Vec<u64>> = rt.block_on(async {
        let mut v = Vec::new();
        for h in handles {
            v.push(h.await.unwrap());
        }
        v
    });
    rt.block_on(verify(&lun, &all));
    let c = lun.counters();
    eprintln!("{c}");
    rt.block_on(lun.close());
    c
}

/// Writes a pattern over the first 6 MiB of the LUN at `url`, zeroes 9000 blocks from block 1000
/// with [`BlockDev::write_zeros`], and checks what reads back; returns the commands the zeroing
/// took.
pub async fn zeroing_reads_back_zeros(url: &str) -> u64 {
    let lun = Lun::open(&IscsiUrl::parse(url).unwrap(), &LunOptions::default()).await.unwrap();
    assert_eq!(lun.geometry().block_size, 512);
    lun.write(0, Bytes::from(vec![0xc3u8; 6 << 20]), false).await.unwrap();
    let before = lun.counters().commands;
    lun.write_zeros(1000, 9000).await.unwrap();
    let used = lun.counters().commands - before;
    lun.flush().await.unwrap();
    let b = lun.read(0, 12288).await.unwrap();
    assert!(b[..1000 * 512].iter().all(|&x| x == 0xc3));
    assert!(b[1000 * 512..10_000 * 512].iter().all(|&x| x == 0));
    assert!(b[10_000 * 512..].iter().all(|&x| x == 0xc3));
    assert!(lun.write_zeros(lun.geometry().num_blocks - 1, 2).await.is_err());
    lun.close().await;
    used
}
