use super::*;
use crate::readcache::Policy;
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use stics_block::{MemDev, OrderedQueue, Queued};
use stics_testkit::faults::{FaultDev, Op, Rule};
use stics_testkit::pattern::stamp_run;

fn opts(mode: Mode) -> Config {
    Config {
        mode,
        ram_bytes: 1 << 20,
        max_record_bytes: 256 << 10,
        destage_io_bytes: 64 << 10,
        destage_inflight: 4,
        epoch_max_writes: 64,
        epoch_max_bytes: 1 << 20,
        retry_delay: Duration::from_millis(10),
        retry_max: Duration::from_millis(100),
        read_cache_bytes: 1 << 20,
        read_cache_policy: Policy::S3Fifo,
        read_ahead_bytes: 64 << 10,
        ..Config::default()
    }
}

#[tokio::test]
async fn writes_read_back_and_drain_to_the_remote() {
    for mode in [Mode::Log, Mode::Immediate, Mode::WriteThrough] {
        let log: Arc<dyn BlockDev> = Arc::new(MemDev::new(512, 32 << 11));
        let remote = Arc::new(MemDev::new(512, 4096));
        let cache = Cache::open(log, remote.clone(), b"mem-remote", opts(mode)).await.expect("opens");
        for i in 0..20u64 {
            cache.write(i * 7, stamp_run(i * 7, 3, i, 512), false).await.expect("write");
        }
        cache.write(7, stamp_run(7, 1, 99, 512), true).await.expect("fua write");
        cache.flush().await.expect("flush");
        assert_eq!(cache.read(7, 1).await.expect("read"), stamp_run(7, 1, 99, 512));
        assert_eq!(cache.read(14, 3).await.expect("read"), stamp_run(14, 3, 2, 512));
        cache.drain().await.expect("drained");
        assert_eq!(remote.read(7, 1).await.expect("remote read"), stamp_run(7, 1, 99, 512), "{mode:?}");
        assert_eq!(remote.read(133, 3).await.expect("remote read"), stamp_run(133, 3, 19, 512), "{mode:?}");
        cache.close().await;
    }
}

#[tokio::test]
async fn blocks_filled_in_are_read_from_the_read_cache_but_never_over_a_dirty_block() {
    let log: Arc<dyn BlockDev> = Arc::new(MemDev::new(512, 32 << 11));
    // Its writes fail: what is written stays dirty.
    let remote = Arc::new(FaultDev::new(512, 4096, 1));
    remote.add_rule(Rule::fail(Op::Write));
    let cache = Cache::open(log, remote.clone(), b"mem-remote", opts(Mode::Log)).await.expect("opens");
    // The remote holds zeros: what is read is what was filled in.
    cache.fill(100, &stamp_run(100, 4, 5, 512));
    assert_eq!(cache.read(100, 4).await.expect("read"), stamp_run(100, 4, 5, 512));
    // A dirty block is newer than anything filled over it; its neighbours are filled.
    cache.write(201, stamp_run(201, 1, 9, 512), false).await.expect("write");
    cache.fill(200, &stamp_run(200, 3, 6, 512));
    let got = cache.read(200, 3).await.expect("read");
    let want = [stamp_run(200, 1, 6, 512), stamp_run(201, 1, 9, 512), stamp_run(202, 1, 6, 512)].concat();
    assert_eq!(got, want);
    // Forgotten, the filled blocks are read from the remote again.
    cache.forget(100, 4);
    assert_eq!(cache.read(100, 4).await.expect("read"), remote.read(100, 4).await.expect("remote"));
    // Blocks past the LUN are not taken.
    cache.fill(4094, &stamp_run(4094, 4, 7, 512));
    assert_eq!(cache.read(4094, 2).await.expect("read"), stamp_run(4094, 2, 7, 512));
    cache.close().await;
}

#[tokio::test]
async fn a_second_log_is_refused_while_the_first_holds_the_remote_in_every_mode() {
    for mode in [Mode::Log, Mode::Immediate, Mode::WriteThrough] {
        let remote = Arc::new(FaultDev::new(512, 4096, 1));
        remote.set_claims(true);
        remote.set_volatile_cache(false);
        let log_a: Arc<dyn BlockDev> = Arc::new(MemDev::new(512, 32 << 11));
        let a = Cache::open(Arc::clone(&log_a), remote.clone(), b"lun", opts(mode)).await.expect("opens");
        let key_a = remote.holder().expect("the first open claims the remote");
        assert_eq!(key_a, claim_key(&lock(&a.inner.superblock).log_uuid));
        let log_b: Arc<dyn BlockDev> = Arc::new(MemDev::new(512, 32 << 11));
        let err = Cache::open(log_b, remote.clone(), b"lun", opts(mode)).await.err();
        assert!(matches!(err, Some(CacheError::Claimed { holder }) if holder == key_a), "{mode:?}: {err:?}");
        let text = err.map(|e| e.to_string()).unwrap_or_default();
        assert!(
            text.starts_with(&format!("another writer holds the remote LUN: reservation key {key_a:#018x}; stop it")),
            "{text}"
        );
        // The same log, opened again after a close, takes its claim back.
        a.close().await;
        drop(a);
        let again = Cache::open(log_a, remote.clone(), b"lun", opts(mode)).await.expect("the same log reopens");
        again.close().await;
    }
}

#[test]
fn claim_keys_are_never_zero_and_differ_per_log() {
    assert_eq!(claim_key(&[0; 16]), 1);
    assert_eq!(claim_key(&[7; 16]), 1, "equal halves fold to zero");
    let mut u = [0u8; 16];
    u[0] = 0xab;
    u[15] = 0x01;
    assert_eq!(claim_key(&u), 0xab00_0000_0000_0001);
}

#[tokio::test]
async fn status_counts_host_and_remote_bytes_and_lag_clears_once_destaged() {
    for mode in [Mode::Log, Mode::Immediate, Mode::WriteThrough] {
        let log: Arc<dyn BlockDev> = Arc::new(MemDev::new(512, 32 << 11));
        let remote = Arc::new(MemDev::new(512, 4096));
        let cache = Cache::open(log, remote.clone(), b"mem-remote", opts(mode)).await.expect("opens");
        // The same four blocks ten times: the host writes 40 blocks. In `immediate` mode they
        // share one epoch and destage sends fewer; in `log` mode each acknowledged write cuts
        // an epoch, and each epoch must reach the remote.
        for i in 0..10u8 {
            cache.write(0, stamp_run(0, 4, u64::from(i), 512), false).await.expect("write");
        }
        cache.flush().await.expect("flush");
        let s = cache.status();
        assert_eq!(s.host_write_bytes, 40 * 512, "{mode:?}");
        if mode != Mode::WriteThrough {
            assert!(s.dirty_bytes == 0 || s.destage_lag_secs >= 0.0);
        }
        cache.drain().await.expect("drained");
        let s = cache.status();
        assert_eq!(s.dirty_bytes, 0);
        assert!(s.destage_lag_secs.abs() < f64::EPSILON, "clean means no lag: {s:?}");
        match mode {
            Mode::Immediate => assert!(s.remote_write_bytes < 40 * 512, "{s:?}"),
            Mode::Log | Mode::WriteThrough => assert_eq!(s.remote_write_bytes, 40 * 512, "{mode:?}"),
        }
        if mode != Mode::WriteThrough {
            assert!(s.remote_sync_secs > 0.0, "a destaged epoch was synchronised: {s:?}");
        }
        assert!(s.remote_write_secs > 0.0, "{mode:?}: {s:?}");
        cache.close().await;
    }
}

#[tokio::test]
async fn a_log_is_refused_for_another_remote() {
    let log: Arc<dyn BlockDev> = Arc::new(MemDev::new(512, 32 << 11));
    let remote = Arc::new(MemDev::new(512, 4096));
    let cache = Cache::open(Arc::clone(&log), remote.clone(), b"lun-a", opts(Mode::Log)).await.expect("opens");
    cache.close().await;
    drop(cache);
    let err = Cache::open(Arc::clone(&log), remote.clone(), b"lun-b", opts(Mode::Log)).await.err();
    assert!(matches!(err, Some(CacheError::WrongRemote { .. })), "{err:?}");
    let other = Arc::new(MemDev::new(512, 8192));
    let err = Cache::open(log, other, b"lun-a", opts(Mode::Log)).await.err();
    assert!(err.is_some_and(|e| e.to_string().contains("belongs to another LUN")));
}

#[tokio::test]
async fn what_is_in_the_log_survives_a_close_and_reaches_the_remote_after_reopening() {
    let log: Arc<dyn BlockDev> = Arc::new(MemDev::new(512, 32 << 11));
    let remote = Arc::new(MemDev::new(512, 4096));
    let cache = Cache::open(Arc::clone(&log), remote.clone(), b"r", opts(Mode::Log)).await.expect("opens");
    cache.write(100, stamp_run(100, 4, 5, 512), false).await.expect("write");
    cache.close().await;
    drop(cache);
    let cache = Cache::open(Arc::clone(&log), remote.clone(), b"r", opts(Mode::Log)).await.expect("reopens");
    assert_eq!(cache.read(100, 4).await.expect("read"), stamp_run(100, 4, 5, 512));
    cache.drain().await.expect("drained");
    assert_eq!(remote.read(100, 4).await.expect("remote"), stamp_run(100, 4, 5, 512));
    assert_eq!(cache.status().dirty_blocks, 0);
}

#[tokio::test]
async fn recovery_reads_back_the_remote_and_resumes_after_the_epochs_it_holds() {
    let log: Arc<dyn BlockDev> = Arc::new(MemDev::new(512, 32 << 11));
    // A remote whose writes all fail.
    let down = Arc::new(FaultDev::new(512, 4096, 1));
    down.add_rule(Rule::fail(Op::Write));
    let cache = Cache::open(Arc::clone(&log), down, b"r", opts(Mode::Log)).await.expect("opens");
    // In `log` mode each acknowledged write closes its epoch: eleven epochs, none destaged.
    let writes: Vec<(u64, Bytes)> = (0..10u64).map(|i| (i * 3, stamp_run(i * 3, 1, i + 1, 512))).collect();
    for (lba, data) in &writes {
        cache.write(*lba, data.clone(), false).await.expect("write");
    }
    cache.write(0, stamp_run(0, 1, 77, 512), false).await.expect("write");
    cache.close().await;
    drop(cache);
    // The remote already holds the first four epochs, as if destage had sent them before the
    // crash and the checkpoint had not caught up.
    let remote = Arc::new(MemDev::new(512, 4096));
    for (lba, data) in &writes[..4] {
        remote.write(*lba, data.clone(), false).await.expect("remote write");
    }
    let cache = Cache::open(Arc::clone(&log), remote.clone(), b"r", opts(Mode::Log)).await.expect("reopens");
    cache.drain().await.expect("drained");
    for (lba, data) in &writes[1..] {
        assert_eq!(&remote.read(*lba, 1).await.expect("remote"), data);
    }
    assert_eq!(remote.read(0, 1).await.expect("remote"), stamp_run(0, 1, 77, 512));
    // Epoch 4 goes again (its flush makes 1–3 durable there), then epochs 5–11.
    assert_eq!(cache.status().blocks_destaged, 8);
}

#[tokio::test]
async fn a_log_too_small_is_refused_with_the_size_it_needs() {
    let log: Arc<dyn BlockDev> = Arc::new(MemDev::new(512, 2048));
    let remote = Arc::new(MemDev::new(512, 4096));
    let err = Cache::open(log, remote, b"r", opts(Mode::Log)).await.expect_err("refused");
    assert!(err.to_string().contains("needs at least"), "{err}");
}

/// A round trip of the far remote below.
const RTT: Duration = Duration::from_millis(16);

/// An ordered remote a round trip away that counts the flushes it has queued at once.
struct Far {
    dev: Arc<MemDev>,
    barriers: Arc<AtomicUsize>,
    most: AtomicUsize,
}

#[async_trait]
impl BlockDev for Far {
    fn geometry(&self) -> Geometry {
        self.dev.geometry()
    }
    fn volatile_cache(&self) -> bool {
        true
    }
    async fn read(&self, lba: u64, blocks: u32) -> Result<Bytes, BlockError> {
        tokio::time::sleep(RTT).await;
        self.dev.read(lba, blocks).await
    }
    async fn write(&self, lba: u64, data: Bytes, fua: bool) -> Result<(), BlockError> {
        tokio::time::sleep(RTT).await;
        self.dev.write(lba, data, fua).await
    }
    async fn flush(&self) -> Result<(), BlockError> {
        tokio::time::sleep(RTT).await;
        Ok(())
    }
    fn ordered_queue(&self) -> Option<&dyn OrderedQueue> {
        Some(self)
    }
}

#[async_trait]
impl OrderedQueue for Far {
    async fn prepare(&self) -> Result<(), BlockError> {
        Ok(())
    }
    fn queue_write(&self, lba: u64, data: Bytes) -> Queued {
        // Queued now, so it lands before anything queued later (all take one round trip).
        let dev = Arc::clone(&self.dev);
        Box::pin(async move {
            tokio::time::sleep(RTT).await;
            dev.write(lba, data, false).await
        })
    }
    fn queue_zeros(&self, lba: u64, blocks: u64, _discard: bool) -> Queued {
        let dev = Arc::clone(&self.dev);
        Box::pin(async move {
            tokio::time::sleep(RTT).await;
            dev.write_zeros(lba, blocks).await
        })
    }
    fn queue_barrier(&self) -> Queued {
        let now = self.barriers.fetch_add(1, SeqCst) + 1;
        self.most.fetch_max(now, SeqCst);
        let barriers = Arc::clone(&self.barriers);
        Box::pin(async move {
            tokio::time::sleep(RTT).await;
            barriers.fetch_sub(1, SeqCst);
            Ok(())
        })
    }
}

#[tokio::test(start_paused = true)]
async fn single_write_epochs_are_pipelined_many_at_once() {
    let log: Arc<dyn BlockDev> = Arc::new(MemDev::new(512, 1024 << 11));
    let remote = Arc::new(Far {
        dev: Arc::new(MemDev::new(512, 1 << 16)),
        barriers: Arc::new(AtomicUsize::new(0)),
        most: AtomicUsize::new(0),
    });
    let cache = Cache::open(log, remote.clone(), b"far", Config::default()).await.expect("opens");
    // In `log` mode, one write at a time: each acknowledgement ends its epoch.
    for i in 0..300u64 {
        cache.write(i * 8, stamp_run(i * 8, 8, i, 512), true).await.expect("write");
    }
    cache.drain().await.expect("drained");
    let s = cache.status();
    assert!(s.destaged_epoch >= 300, "{s:?}");
    let most = remote.most.load(SeqCst);
    assert!(most > 16, "only {most} epochs were in flight at once");
    for i in (0..300u64).step_by(37) {
        assert_eq!(remote.dev.read(i * 8, 8).await.expect("remote"), stamp_run(i * 8, 8, i, 512));
    }
}

#[tokio::test]
async fn dropped_blocks_never_reach_the_remote_and_stay_dropped_after_a_restart() {
    let log: Arc<dyn BlockDev> = Arc::new(MemDev::new(512, 32 << 11));
    let remote = FaultDev::new(512, 4096, 5);
    // The remote takes nothing for now: everything stays dirty in the log.
    remote.add_rule(Rule::fail(Op::Write));
    let cache = Cache::open(Arc::clone(&log), Arc::new(remote.clone()), b"fault", opts(Mode::Log)).await.unwrap();
    cache.write(0, stamp_run(0, 8, 1, 512), false).await.unwrap();
    cache.write(100, stamp_run(100, 4, 2, 512), false).await.unwrap();
    cache.write(4, stamp_run(4, 2, 3, 512), false).await.unwrap();
    let dirty = cache.dirty_data(0, 8).await.unwrap();
    let blocks: u64 = dirty.iter().map(|(_, _, n)| n).sum();
    assert_eq!(blocks, 8, "{dirty:?}");
    assert_eq!(dirty.iter().find(|(at, _, _)| *at == 4).and_then(|(_, d, _)| d.clone()), Some(stamp_run(4, 2, 3, 512)));
    cache.drop_dirty(0, 8).await.unwrap();
    assert_eq!(cache.read(0, 8).await.unwrap(), Bytes::from(vec![0u8; 8 * 512]), "they read as the remote has them");
    assert_eq!(cache.read(100, 4).await.unwrap(), stamp_run(100, 4, 2, 512));
    assert!(cache.dirty_data(0, 8).await.unwrap().is_empty());
    // The process dies; the log is replayed at the next open, the drop with it.
    drop(cache);
    remote.clear_rules();
    let cache = Cache::open(log, Arc::new(remote.clone()), b"fault", opts(Mode::Log)).await.unwrap();
    assert_eq!(cache.read(0, 8).await.unwrap(), Bytes::from(vec![0u8; 8 * 512]));
    cache.drain().await.unwrap();
    assert_eq!(remote.read(0, 8).await.unwrap(), Bytes::from(vec![0u8; 8 * 512]), "never shipped");
    assert_eq!(remote.read(100, 4).await.unwrap(), stamp_run(100, 4, 2, 512));
    cache.close().await;
}

/// A remote that takes one write at a time at `rate` bytes per second (a disk, a thin link),
/// with no command order to pipeline on.
struct Slow {
    dev: MemDev,
    rate: f64,
    busy: tokio::sync::Mutex<()>,
}

#[async_trait]
impl BlockDev for Slow {
    fn geometry(&self) -> Geometry {
        self.dev.geometry()
    }
    fn volatile_cache(&self) -> bool {
        true
    }
    async fn read(&self, lba: u64, blocks: u32) -> Result<Bytes, BlockError> {
        self.dev.read(lba, blocks).await
    }
    async fn write(&self, lba: u64, data: Bytes, fua: bool) -> Result<(), BlockError> {
        let _one = self.busy.lock().await;
        tokio::time::sleep(Duration::from_secs_f64(data.len() as f64 / self.rate)).await;
        self.dev.write(lba, data, fua).await
    }
    async fn flush(&self) -> Result<(), BlockError> {
        Ok(())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_lag_bounds_how_far_a_slow_plain_remote_falls_behind() {
    // The host writes about eight times faster than the remote takes writes; with no bound the
    // remote would be most of the run behind at its end.
    let max_lag = Duration::from_secs(2);
    let log: Arc<dyn BlockDev> = Arc::new(MemDev::new(512, 128 << 11));
    let remote = Arc::new(Slow {
        dev: MemDev::new(512, 32 << 11),
        rate: 1.0 * 1024.0 * 1024.0,
        busy: tokio::sync::Mutex::new(()),
    });
    let cfg = Config { max_lag: Some(max_lag), ..opts(Mode::Immediate) };
    let cache = Arc::new(Cache::open(log, remote.clone(), b"slow", cfg).await.expect("opens"));
    let run = Duration::from_secs(10);
    let writer = {
        let cache = Arc::clone(&cache);
        tokio::spawn(async move {
            let start = tokio::time::Instant::now();
            let mut i = 0u64;
            while start.elapsed() < run {
                let lba = (i * 7919 % 1024) * 64;
                cache.write(lba, stamp_run(lba, 64, i, 512), false).await.expect("write");
                if i % 8 == 7 {
                    cache.flush().await.expect("flush");
                }
                i += 1;
                tokio::time::sleep(Duration::from_millis(4)).await;
            }
            i
        })
    };
    let mut worst = 0.0f64;
    while !writer.is_finished() {
        worst = worst.max(cache.status().destage_lag_secs);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let written = writer.await.expect("writer");
    let bound = max_lag.as_secs_f64();
    assert!(worst < 1.5 * bound, "the remote fell {worst:.2} s behind under a bound of {bound} s");
    assert!(written > 200, "the host wrote only {written} times");
    cache.drain().await.expect("drained");
    let last = written - 1;
    let lba = (last * 7919 % 1024) * 64;
    assert_eq!(remote.dev.read(lba, 64).await.expect("remote"), stamp_run(lba, 64, last, 512));
}
