//! The cache device in front of a remote that fails in the ways production remotes do, and over a
//! log that fails: power loss of the remote's volatile cache, a discard that never reached it, a
//! lasting error then its repair, a log whose flushes fail, a shutdown with a full log, and
//! write-through mode over a read cache. Each test is named for what it shows.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use stics_block::{BlockDev, BlockError, MemDev};
use stics_cache::core::State;
use stics_cache::{Cache, Config, Mode};
use stics_testkit::faults::{ErrorKind, FaultDev, Op, Rule};
use stics_testkit::pattern::{check_at, stamp_run};

const BS: usize = 512;

fn cfg(mode: Mode) -> Config {
    Config {
        mode,
        ram_bytes: 256 << 10,
        max_record_bytes: 64 << 10,
        destage_io_bytes: 16 << 10,
        destage_inflight: 4,
        epoch_max_writes: 32,
        epoch_max_bytes: 128 << 10,
        retry_delay: Duration::from_millis(5),
        retry_max: Duration::from_millis(50),
        read_cache_bytes: 64 << 10,
        read_ahead_bytes: 16 << 10,
        ..Config::default()
    }
}

fn log_dev(mib: u64) -> Arc<dyn BlockDev> {
    Arc::new(MemDev::new(512, mib << 11))
}

/// Reads `blocks` blocks through `dev` and checks each holds exactly version `want[i]` of its
/// own LBA (0: zeros).
async fn expect(dev: &dyn BlockDev, want: &[u64], what: &str) {
    let n = want.len() as u32;
    let image = dev.read(0, n).await.unwrap_or_else(|e| panic!("{what}: read: {e}"));
    for (b, &v) in want.iter().enumerate() {
        let got = check_at(&image[b * BS..(b + 1) * BS], b as u64, v..=v);
        assert!(got.is_ok(), "{what}: block {b}: {:?} where version {v} was written", got.err());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_remote_that_loses_its_volatile_cache_gets_every_unsynchronised_epoch_again() {
    // A SYNCHRONIZE CACHE answered GOOD after the remote's power failed proves nothing for
    // writes made before: the cache watches the remote's reset count and sends such epochs
    // again whole, so that after a drain the remote's medium holds exactly the host's view.
    const BLOCKS: u64 = 512;
    let mut resent = 0;
    for seed in 0..6u64 {
        for mode in [Mode::Log, Mode::Immediate] {
            // Its power can fail: its volatile cache is lost, it comes back at once over what its
            // medium kept, and its reset count moves.
            let remote = Arc::new(FaultDev::new(512, BLOCKS, seed));
            let cache = Cache::open(log_dev(32), remote.clone(), b"r", cfg(mode)).await.expect("opens");
            let mut rng = StdRng::seed_from_u64(seed);
            let mut want = vec![0u64; BLOCKS as usize];
            for v in 1..=400u64 {
                let n = rng.gen_range(1..=8);
                let lba = rng.gen_range(0..=BLOCKS - n);
                cache.write(lba, stamp_run(lba, n, v, BS), false).await.expect("write");
                want[lba as usize..(lba + n) as usize].fill(v);
                if rng.gen_range(0..8) == 0 {
                    cache.flush().await.expect("flush");
                }
                if rng.gen_range(0..40) == 0 {
                    remote.power_cycle();
                }
                if rng.gen_range(0..20) == 0 {
                    tokio::time::sleep(Duration::from_millis(rng.gen_range(0..5))).await;
                }
            }
            cache.flush().await.expect("flush");
            tokio::time::timeout(Duration::from_secs(60), cache.drain()).await.expect("drains").expect("drained");
            let s = cache.status();
            expect(&cache, &want, &format!("seed {seed} {mode}: through the cache")).await;
            let medium = remote.read_durable(0, BLOCKS);
            let durable = MemDev::new(512, BLOCKS);
            durable.write(0, Bytes::from(medium), false).await.expect("copy");
            expect(&durable, &want, &format!("seed {seed} {mode}: the remote's medium after the drain")).await;
            resent += s.epochs_resent;
            cache.close().await;
        }
    }
    assert!(resent > 0, "some power losses found epochs on their way");
}

/// A remote without a volatile cache that takes discards, holding `data`.
async fn remote_with(blocks: u64, data: &[(u64, Bytes)]) -> Arc<FaultDev> {
    let dev = FaultDev::new(512, blocks, 1);
    dev.set_volatile_cache(false);
    for (lba, d) in data {
        dev.write(*lba, d.clone(), true).await.expect("prepare");
    }
    Arc::new(dev)
}

/// A remote whose link is down for writes, flushes and discards (reads still answer).
fn refusing(blocks: u64) -> Arc<FaultDev> {
    let dev = FaultDev::new(512, blocks, 7);
    for op in [Op::Write, Op::Flush, Op::Discard, Op::WriteZeros] {
        dev.add_rule(Rule::error(op, ErrorKind::Unreachable));
    }
    Arc::new(dev)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_discard_that_never_reached_the_remote_is_sent_again_after_a_crash() {
    // Recovery reads back what the remote holds of the epochs destage may have sent. A discard
    // used to count as held whatever the remote read back, so a remote that held the later
    // epochs but not the discard kept its old data where the host was promised zeros.
    const BLOCKS: u64 = 256;
    let log = log_dev(32);
    let down = refusing(BLOCKS);
    let cache = Cache::open(Arc::clone(&log), down, b"r", cfg(Mode::Log)).await.expect("opens");
    // In `log` mode each acknowledged write ends its epoch: a write, a discard, six writes.
    let first = stamp_run(0, 8, 1, BS);
    cache.write(0, first.clone(), false).await.expect("write");
    cache.discard(100, 16).await.expect("discard");
    let mut later = Vec::new();
    for i in 0..6u64 {
        let lba = 200 + i * 4;
        let data = stamp_run(lba, 4, 10 + i, BS);
        cache.write(lba, data.clone(), false).await.expect("write");
        later.push((lba, data));
    }
    cache.close().await;
    drop(cache);
    // The remote holds the first write and every later epoch, but its blocks 100..116 still
    // hold what was there before the discard.
    let mut held = vec![(0, first.clone()), (100, stamp_run(100, 16, 99, BS))];
    held.extend(later.iter().cloned());
    let remote = remote_with(BLOCKS, &held).await;
    let cache = Cache::open(log, remote.clone(), b"r", cfg(Mode::Log)).await.expect("reopens");
    cache.drain().await.expect("drained");
    let back = cache.read(100, 16).await.expect("read");
    assert!(back.iter().all(|&b| b == 0), "the discarded blocks read as zeros through the cache");
    let there = remote.read_durable(100, 16);
    assert!(there.iter().all(|&b| b == 0), "and on the remote");
    for (lba, data) in &later {
        assert_eq!(&remote.read_durable(*lba, 4)[..], &data[..]);
    }
    cache.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn closing_in_immediate_mode_writes_acknowledged_ram_to_a_full_log_before_it_ends() {
    // With WCE=1 an orderly stop is a disk's clean power-down: what it acknowledged from its
    // cache is kept. With the log full and the remote down, that waits for the remote.
    const BLOCKS: u64 = 8192;
    let log = log_dev(4);
    let remote = Arc::new(FaultDev::new(512, BLOCKS, 3));
    remote.set_volatile_cache(false);
    remote.add_rule(Rule::fail(Op::Write));
    // Records of 128 KiB writes: once the ring cannot place one more, the log is full with 3 %
    // of it free, before admission's own "full" (98 %) holds writes back, so RAM fills.
    const RUN: u64 = 256;
    let mut conf = cfg(Mode::Immediate);
    conf.ram_bytes = 1 << 20;
    conf.max_record_bytes = 256 << 10;
    conf.full_timeout = Duration::from_secs(600);
    let cache = Arc::new(Cache::open(Arc::clone(&log), remote.clone(), b"r", conf.clone()).await.expect("opens"));
    let acked = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let (cache, acked, stop) = (Arc::clone(&cache), Arc::clone(&acked), Arc::clone(&stop));
        tokio::spawn(async move {
            let mut v = 0u64;
            while !stop.load(Ordering::SeqCst) {
                v += 1;
                let lba = (v * RUN) % (BLOCKS - RUN);
                let w = cache.write(lba, stamp_run(lba, RUN, v, BS), false);
                if tokio::time::timeout(Duration::from_millis(500), w).await.is_err() {
                    break;
                }
                acked.store(v, Ordering::SeqCst);
            }
        })
    };
    writer.await.expect("writer");
    stop.store(true, Ordering::SeqCst);
    let n = acked.load(Ordering::SeqCst);
    assert!(cache.acknowledged_in_ram() > 0, "the log is full and RAM holds acknowledged writes");
    let closing = {
        let cache = Arc::clone(&cache);
        tokio::spawn(async move { cache.close().await })
    };
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(!closing.is_finished(), "close waits while acknowledged writes cannot reach the log");
    remote.clear_rules();
    tokio::time::timeout(Duration::from_secs(60), closing)
        .await
        .expect("close ends once the remote is back")
        .expect("close");
    assert_eq!(cache.acknowledged_in_ram(), 0);
    drop(cache);
    let cache = Cache::open(log, remote.clone(), b"r", conf).await.expect("reopens");
    let mut want = vec![0u64; BLOCKS as usize];
    for v in 1..=n {
        let lba = (v * RUN) % (BLOCKS - RUN);
        want[lba as usize..(lba + RUN) as usize].fill(v);
    }
    expect(&cache, &want, "every acknowledged write after the stop").await;
    cache.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_log_whose_flushes_fail_is_written_again_in_place_and_keeps_every_acknowledged_write() {
    // A record whose write or flush failed is written again, the same bytes at the same place:
    // written elsewhere (after the ring's end, under the same sequence number) the first copy
    // would stay on the medium, intact, and end recovery's scan before later records.
    const BLOCKS: u64 = 1024;
    for seed in 0..8u64 {
        let log = FaultDev::new(512, 4 << 11, 100 + seed);
        let remote = Arc::new(FaultDev::new(512, BLOCKS, seed));
        remote.set_volatile_cache(false);
        let mut rng = StdRng::seed_from_u64(seed);
        let mut conf = cfg(Mode::Log);
        conf.ram_bytes = 64 << 10;
        let cache = Cache::open(Arc::new(log.clone()), remote.clone(), b"r", conf.clone()).await.expect("opens");
        let mut want = vec![0u64; BLOCKS as usize];
        for v in 1..=300u64 {
            if rng.gen_range(0..25) == 0 {
                log.add_rule(Rule::fail(Op::Flush).times(rng.gen_range(1..4)));
            }
            let n = rng.gen_range(1..=32);
            let lba = rng.gen_range(0..=BLOCKS - n);
            cache.write(lba, stamp_run(lba, n, v, BS), false).await.expect("write");
            want[lba as usize..(lba + n) as usize].fill(v);
        }
        let s = cache.status();
        assert!(s.errors_by_kind.get("log").copied().unwrap_or(0) > 0, "seed {seed}: flushes failed: {s:?}");
        drop(cache);
        log.crash();
        let log = log.reopen();
        let cache = Cache::open(Arc::new(log), remote.clone(), b"r", conf).await.expect("reopens");
        expect(&cache, &want, &format!("seed {seed}: after the log's power failed")).await;
        cache.close().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lasting_remote_error_stalls_destage_ends_host_writes_after_the_full_timeout_and_heals_on_repair() {
    const BLOCKS: u64 = 16384;
    // A thin pool that is full: every write fails until it is repaired.
    let remote = Arc::new(FaultDev::new(512, BLOCKS, 9));
    remote.set_volatile_cache(false);
    remote.add_rule(Rule::error(Op::Write, ErrorKind::NoSpace));
    let mut conf = cfg(Mode::Log);
    conf.full_timeout = Duration::from_secs(1);
    conf.ram_bytes = 1 << 20;
    let cache = Cache::open(log_dev(4), remote.clone(), b"r", conf).await.expect("opens");
    let mut acked = Vec::new();
    let mut refused = None;
    for v in 1..=10_000u64 {
        let lba = (v * 8) % (BLOCKS - 8);
        let w = cache.write(lba, stamp_run(lba, 8, v, BS), false);
        match tokio::time::timeout(Duration::from_secs(20), w).await.expect("a write never hangs") {
            Ok(()) => acked.push((lba, v)),
            Err(e) => {
                refused = Some(e);
                break;
            }
        }
    }
    let e = refused.expect("once the log is full, writes end");
    assert!(matches!(e, BlockError::NoSpace(_)), "the cause is named: {e}");
    let s = cache.status();
    assert_eq!(s.health.state, State::Stalled, "{s:?}");
    assert_eq!(s.health.kind, Some("no_space"));
    assert!(s.health.error.as_deref().unwrap_or("").contains("injected Write failure"), "{s:?}");
    assert!(s.health.lba.is_some());
    assert!(s.refused_writes >= 1);
    let drained = cache.drain().await;
    assert!(matches!(drained, Err(BlockError::NoSpace(_))), "a drain says why it cannot finish: {drained:?}");
    remote.clear_rules();
    tokio::time::timeout(Duration::from_secs(60), cache.drain()).await.expect("drains").expect("after the repair");
    let s = cache.status();
    assert_eq!(s.health.state, State::Healthy, "{s:?}");
    assert!(s.errors_by_kind["no_space"] > 0);
    for (lba, v) in acked.iter().rev().take(200) {
        let got = remote.read(*lba, 8).await.expect("remote");
        assert!(check_at(&got[..BS], *lba, *v..=u64::MAX).is_ok(), "block {lba} holds version {v} or later");
    }
    cache.write(0, stamp_run(0, 8, 1 << 40, BS), false).await.expect("writes go in again");
    cache.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn write_through_reads_return_what_was_just_written() {
    // Write-through writes used to bypass the core: a block in the read cache stayed there,
    // stale, after it was written.
    let remote = Arc::new(MemDev::new(512, 4096));
    let cache = Cache::open(log_dev(32), remote.clone(), b"r", cfg(Mode::WriteThrough)).await.expect("opens");
    for i in 0..40u64 {
        let lba = i * 16;
        cache.read(lba, 8).await.expect("read, which caches");
        let new = stamp_run(lba, 8, i + 1, BS);
        cache.write(lba, new.clone(), false).await.expect("write");
        assert_eq!(cache.read(lba, 8).await.expect("read"), new, "block {lba} after its write");
        assert_eq!(remote.read(lba, 8).await.expect("remote"), new, "on the remote at once");
    }
    assert_eq!(cache.status().dirty_bytes, 0);
    cache.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn write_through_over_a_log_with_dirty_data_never_lets_destage_overwrite_a_newer_write() {
    let log = log_dev(32);
    let down = refusing(4096);
    let cache = Cache::open(Arc::clone(&log), down, b"r", cfg(Mode::Log)).await.expect("opens");
    let old = stamp_run(64, 8, 1, BS);
    cache.write(64, old, false).await.expect("write");
    cache.close().await;
    drop(cache);
    let remote = Arc::new(MemDev::new(512, 4096));
    let cache = Cache::open(log, remote.clone(), b"r", cfg(Mode::WriteThrough)).await.expect("reopens");
    let new = stamp_run(64, 8, 2, BS);
    cache.write(64, new.clone(), false).await.expect("write");
    assert_eq!(cache.read(64, 8).await.expect("read"), new);
    assert_eq!(remote.read(64, 8).await.expect("remote"), new, "acknowledged once on the remote");
    cache.drain().await.expect("drained");
    assert_eq!(remote.read(64, 8).await.expect("remote"), new, "destage did not put the older write back");
    cache.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn destage_reading_the_log_does_not_count_as_host_reads() {
    let cache =
        Cache::open(log_dev(32), Arc::new(MemDev::new(512, 4096)), b"r", cfg(Mode::Immediate)).await.expect("opens");
    for i in 0..50u64 {
        cache.write(i * 8, stamp_run(i * 8, 8, 1, BS), false).await.expect("write");
    }
    cache.drain().await.expect("drained");
    let s = cache.status();
    assert!(s.blocks_destaged > 0);
    assert_eq!((s.read_blocks_cache, s.read_blocks_remote, s.read_cache_hits), (0, 0, 0), "{s:?}");
    cache.close().await;
}

/// Waits up to 1.5 s for `cache` to report the remote unreachable while `pending`, a request
/// the remote delays longer than the answer timeout, is still unanswered.
async fn expect_unreachable_while<T>(cache: &Cache, pending: &tokio::task::JoinHandle<T>, what: &str) {
    let mut state = State::Healthy;
    for _ in 0..150 {
        state = cache.status().health.state;
        if state == State::Degraded || pending.is_finished() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let s = cache.status();
    assert_eq!(
        (state, s.health.kind),
        (State::Degraded, Some("unreachable")),
        "{what} unanswered past the answer timeout: {s:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn write_through_counts_the_remote_unreachable_while_a_write_or_a_flush_goes_unanswered() {
    // A write-through flush went to the remote without the answer timeout a write had: with the
    // link cut while the host's flush was in flight, health said "healthy" for as long as the
    // initiator kept trying to reconnect.
    for op in [Op::Write, Op::Flush] {
        let remote = Arc::new(FaultDev::new(512, 4096, 3));
        let mut conf = cfg(Mode::WriteThrough);
        conf.answer_timeout = Duration::from_millis(200);
        let cache = Arc::new(Cache::open(log_dev(32), remote.clone(), b"r", conf).await.expect("opens"));
        cache.write(8, stamp_run(8, 8, 1, BS), false).await.expect("write");
        remote.add_rule(Rule::delay(op, Duration::from_secs(2)));
        let c = Arc::clone(&cache);
        let hung = tokio::spawn(async move {
            match op {
                Op::Write => c.write(8, stamp_run(8, 8, 2, BS), false).await,
                _ => c.flush().await,
            }
        });
        expect_unreachable_while(&cache, &hung, &format!("{op:?}")).await;
        remote.clear_rules();
        hung.await.expect("joins").expect("the request succeeds once the remote answers");
        assert_eq!(cache.status().health.state, State::Healthy, "{op:?} answered");
        Arc::try_unwrap(cache).expect("one owner").close().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_read_the_remote_leaves_unanswered_counts_it_unreachable_but_never_hides_a_lasting_failure() {
    // With nothing to destage, a host whose reads hung on a cut link saw the cache "healthy".
    let remote = Arc::new(FaultDev::new(512, 4096, 5));
    let mut conf = cfg(Mode::WriteThrough);
    conf.answer_timeout = Duration::from_millis(200);
    let cache = Arc::new(Cache::open(log_dev(32), remote.clone(), b"r", conf.clone()).await.expect("opens"));
    remote.add_rule(Rule::delay(Op::Read, Duration::from_secs(2)));
    let c = Arc::clone(&cache);
    let read = tokio::spawn(async move { c.read(1024, 8).await });
    expect_unreachable_while(&cache, &read, "a read").await;
    remote.clear_rules();
    read.await.expect("joins").expect("the read succeeds once the remote answers");
    assert_eq!(cache.status().health.state, State::Healthy, "its answer shows the remote is back");
    Arc::try_unwrap(cache).expect("one owner").close().await;

    // A remote that refuses destage's writes stays reported so while a read waits on it.
    let remote = Arc::new(FaultDev::new(512, 4096, 6));
    remote.add_rule(Rule::error(Op::Write, ErrorKind::NoSpace));
    conf.mode = Mode::Log;
    let cache = Cache::open(log_dev(32), remote.clone(), b"r", conf).await.expect("opens");
    cache.write(0, stamp_run(0, 8, 1, BS), false).await.expect("the log takes it");
    let stalled = async {
        while cache.status().health.state != State::Stalled {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(10), stalled).await.expect("destage stalls on the full remote");
    remote.add_rule(Rule::delay(Op::Read, Duration::from_millis(600)));
    cache.read(2048, 8).await.expect("a slow read still succeeds");
    let s = cache.status();
    assert_eq!((s.health.state, s.health.kind), (State::Stalled, Some("no_space")), "{s:?}");
    remote.clear_rules();
    tokio::time::timeout(Duration::from_secs(30), cache.drain()).await.expect("drains").expect("after the repair");
    cache.close().await;
}
