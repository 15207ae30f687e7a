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
    noise(worker << 48 ^ unit << 20 ^ version, 4096)
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

/// The one-writer claim (a persistent reservation) against the LUN at `url`: a writer claims it;
/// a plain initiator still reads but its writes are refused; another key is refused with the
/// holder's key; the same key from a new connection (a restarted writer, another ISID) takes it
/// over; several sessions under one key all write; after `restart` (the target forgets its
/// reservations) the writer's reinstated sessions claim the LUN again before their next write.
pub async fn one_writer_claim(url: &str, restart: impl FnOnce()) {
    use stics_block::{BlockError, Claim};
    const K1: u64 = 0x5717_c5ca_c4e0_0001;
    const K2: u64 = 0x5717_c5ca_c4e0_0002;
    let url = IscsiUrl::parse(url).unwrap();
    let open = |sessions: usize| {
        let mut o = fault_options();
        o.sessions = sessions;
        let url = url.clone();
        async move { Lun::open(&url, &o).await.unwrap() }
    };
    let block = |v: u8| Bytes::from(vec![v; 4096]);
    let refused = |r: Result<(), BlockError>, who: &str| {
        assert!(matches!(r, Err(BlockError::Reserved { holder: None })), "{who}: {r:?}");
    };
    let a = open(1).await;
    assert_eq!(a.claim(K1).await.unwrap(), Claim::Held);
    assert_eq!(a.claim(K1).await.unwrap(), Claim::Held, "claiming again is a no-op");
    a.write(0, block(1), false).await.unwrap();

    let stray = open(1).await;
    assert_eq!(stray.read(0, 8).await.unwrap(), block(1), "others still read");
    refused(stray.write(8, block(2), false).await, "a plain initiator");

    let b = open(1).await;
    let e = b.claim(K2).await.unwrap_err();
    assert!(matches!(e, BlockError::Reserved { holder: Some(K1) }), "another key: {e:?}");
    assert!(e.to_string().contains(&format!("{K1:#018x}")), "{e}");
    refused(b.write(8, block(2), false).await, "the refused writer");

    // The writer restarted: a new connection (ISID) under the same key takes the LUN back, and
    // the old connection may no longer write.
    let a2 = open(2).await;
    assert_eq!(a2.claim(K1).await.unwrap(), Claim::TakenOver);
    for i in 0..4u64 {
        a2.write(16 + 8 * i, block(3), false).await.unwrap();
    }
    refused(a.write(0, block(4), false).await, "the writer's old connection");
    refused(stray.write(8, block(2), false).await, "a plain initiator after the take-over");

    restart();
    // The first writes reinstate the sessions (the target lost every registration); the next
    // ones find the logins changed and claim again.
    for i in 0..6u64 {
        a2.write(64 + 8 * i, block(5), false).await.unwrap();
    }
    assert!(a2.sessions().iter().all(|s| s.logins() > 1), "every session was reinstated");
    refused(stray.write(8, block(2), false).await, "a plain initiator after the target restarted");
    assert_eq!(stray.read(64, 8).await.unwrap(), block(5));
    for l in [a, a2, b, stray] {
        l.close().await;
    }
}
