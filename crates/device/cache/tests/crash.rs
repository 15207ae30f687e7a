//! The cache device over fault-injecting devices, crashed at random moments of a verified
//! workload: the log loses what it had not flushed (keeping a random part of it, as a disk that
//! wrote some of its cache) or tears a write at a random byte, the remote loses what destage had
//! not synchronised. After every crash the cache is reopened on what survived, and:
//!
//! - the host sees the state after some prefix of its writes that includes every write it was
//!   told is durable, with no torn or foreign block;
//! - the remote alone was, at the crash, the host's view at a flush boundary (in `log` mode also
//!   every acknowledgement is one) plus a subset of the next epoch's writes;
//! - draining after recovery brings the remote to exactly what the host sees.

use std::sync::Arc;
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use stics_block::BlockDev;
use stics_cache::{Cache, Config, Mode};
use stics_testkit::faults::{CrashMode, FaultDev};
use stics_testkit::pattern::{check, stamp_run, Bad};

const BS: usize = 512;
const BLOCKS: u64 = 256;

fn opts(mode: Mode) -> Config {
    Config {
        mode,
        ram_bytes: 64 << 10,
        max_record_bytes: 32 << 10,
        destage_io_bytes: 8 << 10,
        destage_inflight: 4,
        epoch_max_writes: 16,
        epoch_max_bytes: 32 << 10,
        retry_delay: Duration::from_millis(5),
        retry_max: Duration::from_millis(50),
        read_cache_bytes: 32 << 10,
        read_ahead_bytes: 16 << 10,
        ..Config::default()
    }
}

#[derive(Clone, Copy)]
struct Write {
    version: u64,
    lba: u64,
    blocks: u64,
}

struct History {
    writes: Vec<Write>,
    boundaries: Vec<usize>,
    durable_upto: usize,
}

impl History {
    fn state_after(&self, n: usize) -> Vec<u64> {
        let mut v = vec![0; BLOCKS as usize];
        for w in &self.writes[..n] {
            for b in w.lba..w.lba + w.blocks {
                v[b as usize] = w.version;
            }
        }
        v
    }
}

/// The version each block holds (0: never written), or why a block is bad.
fn versions(bytes: &[u8]) -> Result<Vec<u64>, String> {
    (0..BLOCKS)
        .map(|b| {
            let chunk = &bytes[b as usize * BS..(b as usize + 1) * BS];
            match check(chunk) {
                Ok((lba, v)) if lba == b => Ok(v),
                Ok((lba, _)) => Err(format!("block {b} holds block {lba}'s data")),
                Err(Bad::Blank) => Ok(0),
                Err(e) => Err(format!("block {b}: {e}")),
            }
        })
        .collect()
}

fn remote_consistent(h: &History, remote: &[u64]) -> bool {
    h.boundaries.iter().enumerate().any(|(i, &f)| {
        let next = h.boundaries.get(i + 1).copied().unwrap_or(h.writes.len());
        let base = h.state_after(f);
        (0..BLOCKS as usize).all(|b| {
            remote[b] == base[b]
                || h.writes[f..next]
                    .iter()
                    .any(|w| (w.lba..w.lba + w.blocks).contains(&(b as u64)) && remote[b] == w.version)
        })
    })
}

async fn one_run(mode: Mode, seed: u64) -> Result<(), String> {
    let mut rng = StdRng::seed_from_u64(seed);
    let log = FaultDev::new(512, 4096, seed);
    log.set_volatile_cache(true);
    log.set_crash_mode(if seed.is_multiple_of(2) { CrashMode::DropAll } else { CrashMode::KeepRandom });
    let remote = FaultDev::new(512, BLOCKS, seed ^ 0xabcd);
    remote.set_volatile_cache(true);
    remote.set_crash_mode(CrashMode::KeepRandom);
    let mut h = History { writes: Vec::new(), boundaries: vec![0], durable_upto: 0 };
    let mut next_version = 1;
    let (mut log, mut remote) = (log, remote);
    for life in 0..3 {
        let cache = Cache::open(Arc::new(log.clone()), Arc::new(remote.clone()), b"remote", opts(mode))
            .await
            .map_err(|e| format!("life {life}: open: {e}"))?;
        if life > 0 {
            // Recovery shows a prefix of the history that keeps every durable write.
            let shown = versions(&cache.read(0, BLOCKS as u32).await.map_err(|e| e.to_string())?)?;
            let k = (h.durable_upto..=h.writes.len()).rev().find(|&k| h.state_after(k) == shown).ok_or_else(|| {
                format!("life {life}: recovery shows {shown:?}, no prefix keeping {} durable writes", h.durable_upto)
            })?;
            h.writes.truncate(k);
            h.boundaries.retain(|&b| b <= k);
            h.boundaries.push(k);
            h.durable_upto = k;
        }
        // The workload runs in its own task; the crash comes at a random moment of it.
        let shared = Arc::new(std::sync::Mutex::new(std::mem::replace(
            &mut h,
            History { writes: Vec::new(), boundaries: Vec::new(), durable_upto: 0 },
        )));
        let cache = Arc::new(cache);
        let work = tokio::spawn(workload(mode, Arc::clone(&cache), Arc::clone(&shared), rng.gen(), next_version, life));
        tokio::time::sleep(Duration::from_micros(rng.gen_range(0..20_000))).await;
        // The crash: sometimes right after an acknowledgement, before anything else ran;
        // sometimes in the middle of a log write; sometimes after the background caught up.
        let when = rng.gen_range(0..3);
        if when == 2 {
            tokio::time::sleep(Duration::from_millis(rng.gen_range(0..5))).await;
        }
        if when == 1 {
            // The next log write tears and takes the device down; then the crash.
            log.tear_write(0, rng.gen_range(0..8192));
            tokio::time::sleep(Duration::from_micros(rng.gen_range(0..5_000))).await;
        }
        log.crash();
        remote.crash();
        work.abort();
        let result = work.await;
        if let Ok(Err(e)) = result {
            return Err(e);
        }
        drop(cache);
        h = std::mem::replace(
            &mut *shared.lock().map_err(|_| "poisoned")?,
            History { writes: Vec::new(), boundaries: Vec::new(), durable_upto: 0 },
        );
        // Every issued write is in the history before it is sent, so this is past all of them.
        next_version = h.writes.iter().map(|w| w.version).max().unwrap_or(0) + 1;
        let remote_now = versions(&remote.read_durable(0, BLOCKS))?;
        if !remote_consistent(&h, &remote_now) {
            return Err(format!("life {life}: the remote alone {remote_now:?} is at no flush boundary"));
        }
        log = log.reopen();
        remote = remote.reopen();
    }
    // Final life: drain, and the remote is what the host sees.
    let cache = Cache::open(Arc::new(log.clone()), Arc::new(remote.clone()), b"remote", opts(mode))
        .await
        .map_err(|e| format!("last open: {e}"))?;
    let shown = versions(&cache.read(0, BLOCKS as u32).await.map_err(|e| e.to_string())?)?;
    if !(h.durable_upto..=h.writes.len()).any(|k| h.state_after(k) == shown) {
        return Err(format!("last recovery shows {shown:?}, no prefix keeping {} durable writes", h.durable_upto));
    }
    tokio::time::timeout(Duration::from_secs(30), cache.drain())
        .await
        .map_err(|_| "drain did not finish")?
        .map_err(|e| format!("drain failed: {e}"))?;
    cache.close().await;
    let remote_now = versions(&remote.read_durable(0, BLOCKS))?;
    let remote_volatile = versions(&remote.read_volatile(0, BLOCKS))?;
    if remote_volatile != shown || remote_now != shown {
        return Err("after draining, the remote's durable image differs from what the host sees".into());
    }
    Ok(())
}

/// One life's host requests, one at a time, recorded in `shared` as they are issued and
/// acknowledged (until the crash aborts it).
async fn workload(
    mode: Mode,
    cache: Arc<Cache>,
    shared: Arc<std::sync::Mutex<History>>,
    seed: u64,
    first_version: u64,
    life: usize,
) -> Result<(), String> {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut next_version = first_version;
    let mut acked_since_boundary = false;
    let hist = || shared.lock().map_err(|_| "poisoned".to_string());
    loop {
        match rng.gen_range(0..100) {
            0..=74 => {
                let blocks = rng.gen_range(1..9u64);
                let lba = rng.gen_range(0..BLOCKS - blocks);
                let fua = rng.gen_bool(0.1);
                let version = next_version;
                next_version += 1;
                {
                    let mut h = hist()?;
                    if mode == Mode::Log && acked_since_boundary {
                        let n = h.writes.len();
                        h.boundaries.push(n);
                    }
                    h.writes.push(Write { version, lba, blocks });
                }
                let data = stamp_run(lba, blocks, version, BS);
                if cache.write(lba, data, fua).await.is_err() {
                    return Ok(()); // the devices went down: the crash is under way
                }
                acked_since_boundary = true;
                let mut h = hist()?;
                if mode == Mode::Log || fua {
                    h.durable_upto = h.writes.len();
                }
                if fua {
                    let n = h.writes.len();
                    h.boundaries.push(n);
                    acked_since_boundary = false;
                }
            }
            75..=84 => {
                {
                    let mut h = hist()?;
                    let n = h.writes.len();
                    h.boundaries.push(n);
                }
                if cache.flush().await.is_err() {
                    return Ok(());
                }
                let mut h = hist()?;
                h.durable_upto = h.writes.len();
                acked_since_boundary = false;
            }
            85..=94 => {
                let blocks = rng.gen_range(1..32u64);
                let lba = rng.gen_range(0..BLOCKS - blocks);
                let want = {
                    let h = hist()?;
                    h.state_after(h.writes.len())
                };
                let Ok(part) = cache.read(lba, blocks as u32).await else {
                    return Ok(());
                };
                let mut full = vec![0u8; BLOCKS as usize * BS];
                full[lba as usize * BS..(lba + blocks) as usize * BS].copy_from_slice(&part);
                let got = versions(&full)?;
                for b in lba..lba + blocks {
                    if got[b as usize] != want[b as usize] {
                        return Err(format!(
                            "life {life}: block {b} reads {} not {}",
                            got[b as usize], want[b as usize]
                        ));
                    }
                }
            }
            _ => tokio::time::sleep(Duration::from_micros(rng.gen_range(0..500))).await,
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn log_mode_survives_crashes_at_random_moments() {
    for seed in 0..40 {
        if let Err(e) = one_run(Mode::Log, seed).await {
            panic!("seed {seed}: {e}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn immediate_mode_survives_crashes_at_random_moments() {
    for seed in 100..140 {
        if let Err(e) = one_run(Mode::Immediate, seed).await {
            panic!("seed {seed}: {e}");
        }
    }
}
