//! `Cache`, the block device that wraps a remote device with the write log: the thin tokio
//! driver around [`crate::core::Core`]. Host requests go through the core under a short lock;
//! one task writes log records (group commit: every write waiting in RAM, one log write and one
//! flush), another destages epochs to the remote with many writes in flight.
//!
//! One writer per remote: opening claims the remote ([`BlockDev::claim`], a persistent
//! reservation on a remote LUN) under a key derived from the log's UUID, in every mode, and
//! refuses to start when another key holds it. Closing keeps the claim: the log may still hold
//! data the remote lacks, and the next open of the same log takes the claim back.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use bytes::{Bytes, BytesMut};
use stics_block::{BlockDev, BlockError, Claim, Geometry, OrderedQueue};
use tokio::sync::{oneshot, Notify};
use tokio::task::JoinSet;

use crate::core::{self, Config, Core, DestageIo, Piece, Submitted, Ticket};
use crate::format::{Checkpoint, RemoteBinding, Superblock, LOG_BLOCK, RING_START};
use crate::readcache::Policy;
use crate::scan::{self, LogRead, ScanError};

/// When a host write completes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AckMode {
    /// When the remote completes it: no write caching (plain iSCSI, the baseline).
    WriteThrough,
    /// When it is on stable local storage (WCE=0).
    Log,
    /// When it is in RAM (WCE=1); FUA and flushes wait for stable local storage.
    Immediate,
}

impl std::str::FromStr for AckMode {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "write-through" => Ok(AckMode::WriteThrough),
            "log" => Ok(AckMode::Log),
            "immediate" => Ok(AckMode::Immediate),
            _ => Err(format!("unknown mode {s:?}: use write-through, log or immediate")),
        }
    }
}

/// How a cache runs.
#[derive(Debug, Clone)]
pub struct CacheOptions {
    /// Acknowledgement rule.
    pub mode: AckMode,
    /// Bytes of host writes held in RAM while they wait for the log.
    pub ram_bytes: u64,
    /// Largest log record.
    pub max_record_bytes: u64,
    /// Largest remote write destage issues.
    pub destage_io_bytes: u64,
    /// Remote writes destage keeps in flight.
    pub destage_inflight: usize,
    /// Pipeline epochs when the remote keeps command order (see [`Config::ordered_remote`]).
    pub ordered_destage: bool,
    /// Epoch limits (see [`Config`]).
    pub epoch_max_writes: u64,
    /// Epoch limits (see [`Config`]).
    pub epoch_max_bytes: u64,
    /// Log fill (0–1) above which host writes are slowed, in proportion to how far beyond.
    pub throttle_from: f64,
    /// Log fill (0–1) from which destage keeps its whole pipeline in flight; below it, two
    /// epochs (see [`Config::deep_from`]).
    pub deep_destage_from: f64,
    /// Pause between attempts when the remote fails a destage write or flush.
    pub retry_delay: Duration,
    /// Bytes of clean blocks kept in RAM for reads.
    pub read_cache_bytes: u64,
    /// How the read cache evicts.
    pub read_cache_policy: Policy,
    /// Largest read-ahead window for sequential readers (0: none).
    pub read_ahead_bytes: u64,
}

impl Default for CacheOptions {
    fn default() -> Self {
        CacheOptions {
            mode: AckMode::Log,
            ram_bytes: 64 << 20,
            max_record_bytes: 4 << 20,
            destage_io_bytes: 1 << 20,
            // A long path needs many writes in flight: at 16 ms round trip, 64 4 KiB writes
            // are 16 MB/s.
            destage_inflight: 64,
            ordered_destage: true,
            epoch_max_writes: 4096,
            epoch_max_bytes: 64 << 20,
            throttle_from: 0.75,
            deep_destage_from: 0.25,
            retry_delay: Duration::from_millis(200),
            read_cache_bytes: 256 << 20,
            read_cache_policy: Policy::default(),
            read_ahead_bytes: 1 << 20,
        }
    }
}

/// Why a cache could not open.
#[derive(Debug, thiserror::Error)]
pub enum CacheError {
    /// The log device failed.
    #[error("log device: {0}")]
    Log(#[source] BlockError),
    /// The remote device failed.
    #[error("remote device: {0}")]
    Remote(#[source] BlockError),
    /// The log belongs to another remote LUN.
    #[error(
        "this log belongs to another LUN ({}, {} blocks of {} bytes), not the remote given ({}, {} blocks of {} bytes); \
         destage it there first or give a fresh log",
        show_id(&found.device_id), found.num_blocks, found.block_size,
        show_id(&wanted.device_id), wanted.num_blocks, wanted.block_size
    )]
    WrongRemote { found: RemoteBinding, wanted: RemoteBinding },
    /// The superblock is unreadable (both copies).
    #[error("the log's superblock is unreadable: {0}")]
    Superblock(#[source] crate::format::FormatError),
    /// Recovery found damage it cannot repair.
    #[error("recovery: {0}")]
    Scan(#[from] ScanError),
    /// The log is too small for these settings.
    #[error("{0}")]
    Config(#[from] core::ConfigError),
    /// The log device's size does not match the log written on it.
    #[error("the log was formatted for {formatted} bytes but the device has {device}")]
    LogSize { formatted: u64, device: u64 },
    /// Another writer (another cache, or any initiator) holds the remote.
    #[error(
        "another writer holds the remote LUN: reservation key {holder:#018x}; stop it, or, if it is gone for good, \
         preempt or clear its reservation on the remote (a restart on that writer's own log takes it back)"
    )]
    Claimed { holder: u64 },
}

/// The key a log claims its remote under: its UUID folded to 64 bits, never zero (zero means
/// "no key" to persistent reservations).
pub fn claim_key(log_uuid: &[u8; 16]) -> u64 {
    let (a, b) = log_uuid.split_at(8);
    let fold =
        u64::from_be_bytes(a.try_into().unwrap_or_default()) ^ u64::from_be_bytes(b.try_into().unwrap_or_default());
    fold.max(1)
}

fn show_id(id: &[u8]) -> String {
    use std::fmt::Write;
    if !id.is_empty() && id.iter().all(u8::is_ascii_graphic) {
        return String::from_utf8_lossy(id).into_owned();
    }
    id.iter().fold(String::new(), |mut s, b| {
        let _ = write!(s, "{b:02x}");
        s
    })
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Byte-granular reads of the log device.
struct LogDev(Arc<dyn BlockDev>);

impl LogDev {
    async fn read(&self, off: u64, len: usize) -> Result<Bytes, BlockError> {
        stics_block::range::read_at(self.0.as_ref(), off, len).await
    }

    /// Writes whole log blocks (offsets and lengths are multiples of [`LOG_BLOCK`]).
    async fn write(&self, off: u64, data: Bytes) -> Result<(), BlockError> {
        let bs = u64::from(self.0.geometry().block_size);
        self.0.write(off / bs, data, false).await
    }
}

#[async_trait]
impl LogRead for &LogDev {
    async fn read_at(&mut self, offset: u64, len: usize) -> std::io::Result<Vec<u8>> {
        let end = self.0.geometry().bytes();
        let len = len.min(end.saturating_sub(offset) as usize);
        self.read(offset, len).await.map(|b| b.to_vec()).map_err(std::io::Error::other)
    }
}

/// Counters an operator scrapes (see [`Cache::status`]).
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct Status {
    /// Acknowledgement mode.
    pub mode: String,
    /// Blocks held dirty (not yet on the remote).
    pub dirty_blocks: u64,
    /// Bytes held dirty.
    pub dirty_bytes: u64,
    /// Fraction of the log in use.
    pub log_fill: f64,
    /// Bytes of the log's ring.
    pub log_bytes: u64,
    /// Host write bytes in RAM waiting for the log.
    pub ram_bytes: u64,
    /// The open epoch.
    pub epoch: u64,
    /// The newest epoch fully on the remote.
    pub destaged_epoch: u64,
    /// Host write blocks absorbed by later writes before reaching the remote.
    pub blocks_absorbed: u64,
    /// Blocks destaged to the remote.
    pub blocks_destaged: u64,
    /// Log records written.
    pub records: u64,
    /// Host reads (blocks) served from RAM or the log.
    pub read_blocks_cache: u64,
    /// Host reads (blocks) that went to the remote.
    pub read_blocks_remote: u64,
    /// Read cache lookups that found their block.
    pub read_cache_hits: u64,
    /// Read cache lookups that did not.
    pub read_cache_misses: u64,
    /// Remote destage writes or flushes that failed and were retried.
    pub destage_retries: u64,
    /// Host writes slowed because the log was filling.
    pub throttled_writes: u64,
    /// Bytes the host wrote (zeroing and discards not counted).
    pub host_write_bytes: u64,
    /// Bytes written to the remote (destage, or every write in `write-through` mode).
    pub remote_write_bytes: u64,
    /// Destage throughput over the last few seconds, bytes per second.
    pub destage_bytes_per_sec: f64,
    /// Age of the oldest write not yet on the remote, seconds (0 when clean).
    pub destage_lag_secs: f64,
    /// Moving average of a remote write's service time, seconds (one round trip plus the
    /// remote's work and transfer).
    pub remote_write_secs: f64,
    /// Moving average of a remote SYNCHRONIZE CACHE's service time, seconds: the remote's round
    /// trip when its media is fast.
    pub remote_sync_secs: f64,
}

/// Weight of the newest sample in the service-time moving averages.
const EWMA: f64 = 0.2;
/// Throttled writes that destage frees no space for wake on multiples of this.
const ADMISSION_TICK: Duration = Duration::from_millis(2);
/// Shortest interval over which the destage rate is measured.
const RATE_WINDOW: Duration = Duration::from_secs(2);

#[derive(Default)]
struct Counters {
    read_blocks_cache: u64,
    read_blocks_remote: u64,
    destage_retries: u64,
    throttled_writes: u64,
    host_write_bytes: u64,
    remote_write_bytes: u64,
    remote_write_secs: f64,
    remote_sync_secs: f64,
    /// When each epoch still on its way to the remote took its first write.
    epoch_started: BTreeMap<u64, Instant>,
    /// The last rate sample: when, bytes written to the remote by then, and the rate it gave.
    rate_sample: Option<(Instant, u64)>,
    rate: f64,
}

impl Counters {
    /// Drops the start times of epochs now fully on the remote.
    fn forget_epochs_up_to(&mut self, destaged: u64) {
        self.epoch_started = self.epoch_started.split_off(&destaged.saturating_add(1));
    }

    fn remote_write(&mut self, bytes: u64, took: Duration) {
        self.remote_write_bytes += bytes;
        self.remote_write_secs = ewma(self.remote_write_secs, took);
    }
}

fn ewma(avg: f64, sample: Duration) -> f64 {
    if avg == 0.0 {
        sample.as_secs_f64()
    } else {
        avg * (1.0 - EWMA) + sample.as_secs_f64() * EWMA
    }
}

struct Inner {
    core: Mutex<Core>,
    log: LogDev,
    remote: Arc<dyn BlockDev>,
    opts: CacheOptions,
    geometry: Geometry,
    /// Superblock fields that do not change, and the generation last written.
    superblock: Mutex<Superblock>,
    waiters: Mutex<HashMap<Ticket, oneshot::Sender<()>>>,
    /// New writes for the log writer.
    logger: Notify,
    /// Durable records or a new checkpoint for the destager.
    destager: Notify,
    /// RAM or log space became free.
    space: Notify,
    /// Destage freed log space (a new checkpoint): throttled writes go in together.
    freed: Notify,
    /// The grid throttled writes wake on when destage frees nothing in time.
    opened: Instant,
    counters: Mutex<Counters>,
    stopping: std::sync::atomic::AtomicBool,
    /// Read-ahead in flight: block range and who waits for it.
    prefetching: Mutex<Vec<(u64, u64, Arc<Notify>)>>,
}

/// The STICS cache as a block device over a remote one.
pub struct Cache {
    inner: Arc<Inner>,
    tasks: Mutex<Option<JoinSet<()>>>,
}

impl Cache {
    /// Opens (or formats, when it holds no log) the log on `log` for `remote`, recovers what it
    /// holds and starts the log writer and destage. `remote_id` identifies the remote LUN (VPD
    /// page 83h); a log is only ever opened for the LUN it was made for.
    pub async fn open(
        log: Arc<dyn BlockDev>,
        remote: Arc<dyn BlockDev>,
        remote_id: &[u8],
        opts: CacheOptions,
    ) -> Result<Cache, CacheError> {
        let geometry = remote.geometry();
        let wanted = RemoteBinding {
            device_id: remote_id.iter().copied().take(crate::format::MAX_DEVICE_ID).collect(),
            num_blocks: geometry.num_blocks,
            block_size: geometry.block_size,
        };
        let log = LogDev(log);
        let device_bytes = log.0.geometry().bytes() / LOG_BLOCK * LOG_BLOCK;
        let head = log.read(0, 2 * LOG_BLOCK as usize).await.map_err(CacheError::Log)?;
        let (a, b) = head.split_at(LOG_BLOCK as usize);
        let sb = match Superblock::choose(a, b) {
            Ok(sb) => sb,
            Err(crate::format::FormatError::Magic) if head.iter().all(|x| *x == 0) => {
                format(&log, device_bytes, wanted.clone()).await?
            }
            Err(e) => return Err(CacheError::Superblock(e)),
        };
        if sb.remote != wanted {
            return Err(CacheError::WrongRemote { found: sb.remote, wanted });
        }
        if sb.log_bytes > log.0.geometry().bytes() {
            return Err(CacheError::LogSize { formatted: sb.log_bytes, device: device_bytes });
        }
        let cfg = Config {
            block_size: geometry.block_size,
            num_blocks: geometry.num_blocks,
            mode: match opts.mode {
                AckMode::Immediate => core::Mode::Immediate,
                AckMode::Log | AckMode::WriteThrough => core::Mode::Log,
            },
            ram_bytes: opts.ram_bytes,
            ring_start: RING_START,
            ring_end: sb.log_bytes,
            max_record_bytes: opts.max_record_bytes,
            destage_io_bytes: opts.destage_io_bytes,
            destage_inflight: opts.destage_inflight,
            ordered_remote: opts.ordered_destage && remote.ordered_queue().is_some(),
            pipeline_epochs: core::PIPELINE_EPOCHS,
            pipeline_bytes: core::PIPELINE_BYTES,
            deep_from: opts.deep_destage_from,
            epoch_max_writes: opts.epoch_max_writes,
            epoch_max_bytes: opts.epoch_max_bytes,
            read_cache_blocks: (opts.read_cache_bytes / u64::from(geometry.block_size)) as usize,
            read_cache_policy: opts.read_cache_policy,
            read_ahead_blocks: opts.read_ahead_bytes / u64::from(geometry.block_size),
        };
        cfg.validate()?;
        // Once the settings are known to work and before recovery destages anything: nobody else
        // may write behind this log's back.
        let key = claim_key(&sb.log_uuid);
        match remote.claim(key).await {
            Ok(Claim::Held) => tracing::info!(key = format_args!("{key:#018x}"), "claimed the remote"),
            Ok(Claim::TakenOver) => {
                tracing::info!(
                    key = format_args!("{key:#018x}"),
                    "took the remote back from an earlier run of this log"
                );
            }
            Ok(Claim::Unsupported) => {}
            Err(BlockError::Reserved { holder }) => return Err(CacheError::Claimed { holder: holder.unwrap_or(0) }),
            Err(e) => return Err(CacheError::Remote(e)),
        }
        let scanned = scan::scan(&mut &log, &sb).await?;
        if let Some(t) = &scanned.torn_tail {
            tracing::info!(seq = t.seq, offset = t.offset, "dropped a torn record that was never acknowledged");
        }
        let records: Vec<(u64, _)> = scanned.records.iter().map(|r| (r.offset, r.header.clone())).collect();
        let live = records.len();
        let core = Core::recover(cfg, sb.log_uuid, sb.checkpoint, &records, scanned.tail_offset, scanned.next_seq);
        if live > 0 {
            tracing::info!(
                records = live,
                dirty_blocks = core.dirty_blocks(),
                "recovered the write log; destage resumes"
            );
        }
        let inner = Arc::new(Inner {
            core: Mutex::new(core),
            log,
            remote,
            opts,
            geometry,
            superblock: Mutex::new(sb),
            waiters: Mutex::new(HashMap::new()),
            logger: Notify::new(),
            destager: Notify::new(),
            space: Notify::new(),
            freed: Notify::new(),
            opened: Instant::now(),
            counters: Mutex::new(Counters::default()),
            stopping: std::sync::atomic::AtomicBool::new(false),
            prefetching: Mutex::new(Vec::new()),
        });
        let mut tasks = JoinSet::new();
        tasks.spawn(log_writer(Arc::clone(&inner)));
        tasks.spawn(destager(Arc::clone(&inner)));
        Ok(Cache { inner, tasks: Mutex::new(Some(tasks)) })
    }

    /// What the cache holds and has done.
    pub fn status(&self) -> Status {
        let c = lock(&self.inner.core);
        let mut n = lock(&self.inner.counters);
        let s = c.stats();
        let (epoch, destaged_epoch) = c.epochs();
        let cfg = c.config();
        let now = Instant::now();
        n.forget_epochs_up_to(destaged_epoch);
        let lag = match n.epoch_started.values().next() {
            Some(t) if c.dirty_blocks() > 0 => now.saturating_duration_since(*t).as_secs_f64(),
            _ => 0.0,
        };
        match n.rate_sample {
            Some((at, bytes)) if now.saturating_duration_since(at) >= RATE_WINDOW => {
                n.rate = (n.remote_write_bytes - bytes) as f64 / now.saturating_duration_since(at).as_secs_f64();
                n.rate_sample = Some((now, n.remote_write_bytes));
            }
            Some(_) => {}
            None => n.rate_sample = Some((now, n.remote_write_bytes)),
        }
        Status {
            mode: format!("{:?}", self.inner.opts.mode).to_lowercase(),
            dirty_blocks: c.dirty_blocks() as u64,
            dirty_bytes: c.dirty_blocks() as u64 * u64::from(cfg.block_size),
            log_fill: c.log_fill(),
            log_bytes: cfg.ring_end - cfg.ring_start,
            ram_bytes: c.ram_used(),
            epoch,
            destaged_epoch,
            blocks_absorbed: s.blocks_absorbed,
            blocks_destaged: s.blocks_destaged,
            records: s.records,
            read_blocks_cache: n.read_blocks_cache,
            read_blocks_remote: n.read_blocks_remote,
            read_cache_hits: c.read_cache_hits().0,
            read_cache_misses: c.read_cache_hits().1,
            destage_retries: n.destage_retries,
            throttled_writes: n.throttled_writes,
            host_write_bytes: n.host_write_bytes,
            remote_write_bytes: n.remote_write_bytes,
            destage_bytes_per_sec: n.rate,
            destage_lag_secs: lag,
            remote_write_secs: n.remote_write_secs,
            remote_sync_secs: n.remote_sync_secs,
        }
    }

    /// Waits until every dirty block is on the remote and synchronised (for maintenance: the
    /// remote alone is then the whole truth).
    pub async fn drain(&self) {
        /// Destage hurries while a drain waits, however it ends.
        struct Hurry<'a>(&'a Inner);
        impl Drop for Hurry<'_> {
            fn drop(&mut self) {
                lock(&self.0.core).hurry(false);
            }
        }
        lock(&self.inner.core).hurry(true);
        let _hurry = Hurry(&self.inner);
        loop {
            let notified = self.inner.space.notified();
            // When clean: destage wrote a checkpoint after its last epoch; a head that moved
            // since (pins let go of) is written here, so that the empty log is final on disk.
            let clean = {
                let mut c = lock(&self.inner.core);
                c.is_clean().then(|| c.take_checkpoint())
            };
            match clean {
                Some(None) => return,
                Some(Some(cp)) => {
                    write_checkpoint(&self.inner, cp).await;
                    continue;
                }
                None => {}
            }
            self.inner.destager.notify_one();
            let _ = tokio::time::timeout(Duration::from_millis(100), notified).await;
        }
    }

    /// Stops the log writer and destage after the record in flight: what is dirty stays in the
    /// log and is destaged at the next open.
    pub async fn close(&self) {
        self.inner.stopping.store(true, std::sync::atomic::Ordering::Release);
        self.inner.logger.notify_one();
        self.inner.destager.notify_one();
        let tasks = lock(&self.tasks).take();
        if let Some(mut t) = tasks {
            // Give the writer a moment to finish its record; destage may be cut anywhere.
            let _ =
                tokio::time::timeout(Duration::from_secs(5), async { while t.join_next().await.is_some() {} }).await;
            t.abort_all();
        }
    }

    /// Runs a host request through the core and waits for its acknowledgement. The waiter is
    /// registered under the core's lock, so the log writer cannot acknowledge it unseen.
    async fn submit(&self, f: impl FnOnce(&mut Core) -> Result<Submitted, core::CoreError>) -> Result<(), BlockError> {
        let rx = {
            let mut c = lock(&self.inner.core);
            match f(&mut c).map_err(from_core)? {
                Submitted::Done => None,
                Submitted::Wait(t) => {
                    let (tx, rx) = oneshot::channel();
                    lock(&self.inner.waiters).insert(t, tx);
                    Some(rx)
                }
            }
        };
        self.inner.logger.notify_one();
        if let Some(rx) = rx {
            let _ = rx.await;
        }
        Ok(())
    }

    /// Holds a host write back while RAM is full, and slows it while the log fills.
    ///
    /// Slowed writes are let in together: when destage frees log space, or at the same tick of
    /// a shared clock. Let in one by one, each would be acknowledged alone, and in `log` mode
    /// each would then make an epoch of its own, which destage sends with a flush of its own:
    /// the remote's flushes, not the path, would set the pace.
    async fn admit(&self, bytes: u64) {
        loop {
            let freed = self.inner.freed.notified();
            let notified = self.inner.space.notified();
            let (room, fill) = {
                let c = lock(&self.inner.core);
                (c.ram_has_room(bytes), c.log_fill())
            };
            let from = self.inner.opts.throttle_from;
            if room && fill < from {
                return;
            }
            if !room {
                let _ = tokio::time::timeout(Duration::from_millis(50), notified).await;
                continue;
            }
            lock(&self.inner.counters).throttled_writes += 1;
            if fill >= 0.98 {
                let _ = tokio::time::timeout(Duration::from_millis(50), freed).await;
                continue;
            }
            // A smooth curve: no delay at `from`, growing as the log fills, so that writes follow
            // the destage rate instead of stopping at a cliff.
            let over = ((fill - from) / (1.0 - from).max(1e-3)).clamp(0.0, 1.0);
            let delay = Duration::from_micros((over * over * 20_000.0) as u64);
            let tick = ADMISSION_TICK.as_nanos();
            let since = (Instant::now() + delay).saturating_duration_since(self.inner.opened).as_nanos();
            let at = self.inner.opened + Duration::from_nanos((since.div_ceil(tick) * tick) as u64);
            let _ = tokio::time::timeout_at(at.into(), freed).await;
            return;
        }
    }

    /// Reads ahead in the background; a read of those blocks waits for it instead of asking
    /// the remote a second time.
    fn prefetch(&self, lba: u64, blocks: u32, generation: u64) {
        let done = Arc::new(Notify::new());
        lock(&self.inner.prefetching).push((lba, lba + u64::from(blocks), Arc::clone(&done)));
        let inner = Arc::clone(&self.inner);
        tokio::spawn(async move {
            if let Ok(data) = inner.remote.read(lba, blocks).await {
                lock(&inner.core).fill(lba, &data, generation);
            }
            lock(&inner.prefetching).retain(|(s, _, _)| *s != lba);
            done.notify_waiters();
        });
    }

    async fn wait_for_prefetch(&self, lba: u64, blocks: u64) {
        let pending = lock(&self.inner.prefetching)
            .iter()
            .find(|(s, e, _)| *s < lba + blocks && lba < *e)
            .map(|(_, _, n)| Arc::clone(n));
        if let Some(n) = pending {
            let notified = n.notified();
            // Registered after the lookup: the prefetch may have ended in between.
            let still = lock(&self.inner.prefetching).iter().any(|(s, e, _)| *s < lba + blocks && lba < *e);
            if still {
                let _ = tokio::time::timeout(Duration::from_secs(5), notified).await;
            }
        }
    }
}

fn complete(inner: &Inner, tickets: Vec<Ticket>) {
    if tickets.is_empty() {
        return;
    }
    let mut w = lock(&inner.waiters);
    for t in tickets {
        if let Some(tx) = w.remove(&t) {
            let _ = tx.send(());
        }
    }
}

#[expect(clippy::needless_pass_by_value, reason = "used as a map_err function")]
fn from_core(e: core::CoreError) -> BlockError {
    match e {
        core::CoreError::OutOfRange { lba, blocks, num_blocks } => BlockError::OutOfRange { lba, blocks, num_blocks },
        core::CoreError::Misaligned { len, block_size } => BlockError::Misaligned { len, block_size },
    }
}

/// Reads a plan's pieces; returns the bytes and what came from the remote (for the read cache).
async fn resolve(inner: &Inner, pieces: Vec<Piece>) -> Result<(Bytes, Vec<(u64, Bytes)>), BlockError> {
    let bs = inner.geometry.block_size as usize;
    if let [Piece::Ram(b)] = pieces.as_slice() {
        return Ok((b.clone(), Vec::new()));
    }
    let mut fetched = Vec::new();
    let mut out = BytesMut::new();
    let mut cache_blocks = 0u64;
    let mut remote_blocks = 0u64;
    for p in pieces {
        match p {
            Piece::Ram(b) => {
                cache_blocks += (b.len() / bs) as u64;
                out.extend_from_slice(&b);
            }
            Piece::Log { offset, blocks } => {
                cache_blocks += u64::from(blocks);
                out.extend_from_slice(&inner.log.read(offset, blocks as usize * bs).await?);
            }
            Piece::Zero { blocks } => {
                cache_blocks += u64::from(blocks);
                out.resize(out.len() + blocks as usize * bs, 0);
            }
            Piece::Remote { lba, blocks } => {
                remote_blocks += u64::from(blocks);
                let data = inner.remote.read(lba, blocks).await?;
                out.extend_from_slice(&data);
                fetched.push((lba, data));
            }
        }
    }
    let mut n = lock(&inner.counters);
    n.read_blocks_cache += cache_blocks;
    n.read_blocks_remote += remote_blocks;
    Ok((out.freeze(), fetched))
}

async fn format(log: &LogDev, device_bytes: u64, remote: RemoteBinding) -> Result<Superblock, CacheError> {
    let log_uuid: [u8; 16] = rand::random();
    let mut sb = Superblock {
        log_uuid,
        generation: 1,
        log_bytes: device_bytes,
        remote,
        checkpoint: Checkpoint { head_offset: RING_START, head_seq: 1, destaged_epoch: 0 },
    };
    if device_bytes < RING_START + LOG_BLOCK {
        return Err(CacheError::Config(core::ConfigError::LogTooSmall { ring: 0, need: RING_START + LOG_BLOCK }));
    }
    // Both copies, so that no copy of an earlier log can win.
    for _ in 0..2 {
        sb.generation += 1;
        log.write(sb.copy_offset(), Bytes::from(sb.encode())).await.map_err(CacheError::Log)?;
    }
    log.0.flush().await.map_err(CacheError::Log)?;
    tracing::info!(bytes = device_bytes, "formatted a new write log");
    Ok(sb)
}

/// Group commit: everything waiting in RAM goes to the log in one write and one flush.
async fn log_writer(inner: Arc<Inner>) {
    loop {
        let notified = inner.logger.notified();
        let record = lock(&inner.core).next_record();
        let Some(r) = record else {
            if inner.stopping.load(std::sync::atomic::Ordering::Acquire) {
                return;
            }
            let _ = tokio::time::timeout(Duration::from_millis(100), notified).await;
            continue;
        };
        let res = async {
            inner.log.write(r.offset, Bytes::from(r.bytes)).await?;
            inner.log.0.flush().await
        }
        .await;
        match res {
            Ok(()) => {
                let done = lock(&inner.core).record_durable(r.seq);
                complete(&inner, done);
                inner.destager.notify_one();
                inner.space.notify_waiters();
            }
            Err(e) => {
                tracing::error!("log write failed, retrying: {e}");
                lock(&inner.core).record_failed(r.seq);
                tokio::time::sleep(inner.opts.retry_delay).await;
            }
        }
    }
}

/// What a destage task reports.
enum Ended {
    /// A write or zeroing.
    Io(u64, Result<(), BlockError>),
    /// The flush after an epoch, and when it was sent.
    Sync(u64, Result<(), BlockError>, Instant),
    /// A read-back of the remote: which versions it holds.
    Probe(Result<Vec<bool>, BlockError>),
}

/// Reads back the blocks of a [`Probe`] from the remote (many reads in flight: recovery should
/// not pay a round trip per block) and says for each version whether the remote holds it.
async fn run_probe(inner: Arc<Inner>, probe: core::Probe) -> Result<Vec<bool>, BlockError> {
    let bs = inner.geometry.block_size as usize;
    let per_read = (inner.opts.destage_io_bytes / bs as u64).clamp(1, u64::from(u32::MAX)) as u32;
    let mut held: HashMap<u64, Bytes> = HashMap::new();
    let mut reads: JoinSet<Result<(u64, Bytes), BlockError>> = JoinSet::new();
    let mut runs = probe.runs(per_read).into_iter();
    loop {
        while reads.len() < inner.opts.destage_inflight.max(1) {
            let Some((lba, n)) = runs.next() else { break };
            let inner = Arc::clone(&inner);
            reads.spawn(async move { Ok((lba, inner.remote.read(lba, n).await?)) });
        }
        let Some(joined) = reads.join_next().await else { break };
        let (lba, data) = joined.map_err(|e| BlockError::Io { lba: 0, source: std::io::Error::other(e) })??;
        for i in 0..data.len() / bs {
            held.insert(lba + i as u64, data.slice(i * bs..(i + 1) * bs));
        }
    }
    // Discards went out as UNMAP when the remote takes them: it may then read back anything.
    let unmapped_anything = inner.remote.supports_discard();
    let mut out = Vec::with_capacity(probe.versions.len());
    for v in probe.versions {
        let Some(there) = held.get(&v.lba) else {
            out.push(false);
            continue;
        };
        let same = match v.source {
            _ if v.discard && unmapped_anything => true,
            Piece::Log { offset, .. } => inner.log.read(offset, bs).await?.as_ref() == there.as_ref(),
            _ => there.iter().all(|x| *x == 0),
        };
        out.push(same);
    }
    Ok(out)
}

/// Destage: epochs in order, many remote writes in flight, a flush of the remote at the end of
/// each, a durable checkpoint after it. On an ordered remote the flush is a barrier queued right
/// behind the epoch's writes, and the next epoch's writes right behind it.
async fn destager(inner: Arc<Inner>) {
    let mut running: JoinSet<Ended> = JoinSet::new();
    let ordered = lock(&inner.core).config().ordered_remote;
    loop {
        if inner.stopping.load(std::sync::atomic::Ordering::Acquire) {
            running.abort_all();
            return;
        }
        let notified = inner.destager.notified();
        if let (true, Some(q)) = (ordered, inner.remote.ordered_queue()) {
            // Cheap unless the session was reinstated: then the claim is made again first.
            if let Err(e) = q.prepare().await {
                tracing::warn!("remote not ready for destage, retrying: {e}");
                tokio::time::sleep(inner.opts.retry_delay).await;
                continue;
            }
        }
        let ios = lock(&inner.core).next_destage();
        let mut progressed = !ios.is_empty();
        match inner.remote.ordered_queue() {
            Some(q) if ordered => queue_in_order(&inner, q, ios, &mut running).await,
            _ => {
                for io in ios {
                    spawn_destage(&inner, io, &mut running);
                }
            }
        }
        // Collect what finished; wait for the first if nothing else can happen.
        let mut failed = false;
        while let Some(joined) = if progressed { running.try_join_next() } else { running.join_next().await } {
            progressed = true;
            let Ok(ended) = joined else { continue };
            failed |= destage_ended(&inner, ended).await;
        }
        if failed {
            // Whatever failed is handed out again: not at once.
            tokio::time::sleep(inner.opts.retry_delay).await;
        } else if !progressed {
            let _ = tokio::time::timeout(Duration::from_millis(100), notified).await;
        }
    }
}

/// Runs destage operations each in its own task (a remote that does not keep order: the core
/// hands out a flush only once the epoch's writes completed).
fn spawn_destage(inner: &Arc<Inner>, io: DestageIo, running: &mut JoinSet<Ended>) {
    let inner = Arc::clone(inner);
    match io {
        DestageIo::Write { id, lba, sources, .. } => {
            running.spawn(async move {
                let r = async {
                    let (data, _) = resolve(&inner, sources).await?;
                    let (len, started) = (data.len() as u64, Instant::now());
                    inner.remote.write(lba, data, false).await?;
                    lock(&inner.counters).remote_write(len, started.elapsed());
                    Ok(())
                }
                .await;
                Ended::Io(id, r)
            });
        }
        DestageIo::Zero { id, lba, blocks, discard } => {
            running.spawn(async move {
                let remote = &inner.remote;
                let r = if discard && remote.supports_discard() {
                    remote.discard(lba, u64::from(blocks)).await
                } else {
                    remote.write_zeros(lba, u64::from(blocks)).await
                };
                Ended::Io(id, r)
            });
        }
        DestageIo::Sync { epoch, .. } => {
            running.spawn(async move {
                let started = Instant::now();
                Ended::Sync(epoch, inner.remote.flush().await, started)
            });
        }
        DestageIo::Probe(probe) => {
            running.spawn(async move { Ended::Probe(run_probe(inner, probe).await) });
        }
    }
}

/// Queues destage operations on an ordered remote, in the order the core gave them. If the data
/// of one cannot be read from the log, it and everything after it fail unsent: nothing may
/// overtake it.
async fn queue_in_order(inner: &Arc<Inner>, q: &dyn OrderedQueue, ios: Vec<DestageIo>, running: &mut JoinSet<Ended>) {
    let mut ios = ios.into_iter();
    while let Some(io) = ios.next() {
        let queued = match io {
            DestageIo::Write { id, lba, sources, .. } => match resolve(inner, sources).await {
                Ok((data, _)) => {
                    let len = data.len() as u64;
                    let (fut, started) = (q.queue_write(lba, data), Instant::now());
                    let inner = Arc::clone(inner);
                    running.spawn(async move {
                        let r = fut.await;
                        if r.is_ok() {
                            lock(&inner.counters).remote_write(len, started.elapsed());
                        }
                        Ended::Io(id, r)
                    });
                    true
                }
                Err(e) => {
                    tracing::error!("destage could not read the log: {e}");
                    lock(&inner.core).destage_failed(id);
                    false
                }
            },
            DestageIo::Zero { id, lba, blocks, discard } => {
                let fut = q.queue_zeros(lba, u64::from(blocks), discard && inner.remote.supports_discard());
                running.spawn(async move { Ended::Io(id, fut.await) });
                true
            }
            DestageIo::Sync { epoch, .. } => {
                let (fut, started) = (q.queue_barrier(), Instant::now());
                running.spawn(async move { Ended::Sync(epoch, fut.await, started) });
                true
            }
            DestageIo::Probe(probe) => {
                // Nothing else is in flight while a probe is.
                spawn_destage(inner, DestageIo::Probe(probe), running);
                true
            }
        };
        if !queued {
            let mut c = lock(&inner.core);
            for io in ios.by_ref() {
                match io {
                    DestageIo::Write { id, .. } | DestageIo::Zero { id, .. } => c.destage_failed(id),
                    DestageIo::Sync { epoch, .. } => c.sync_failed(epoch),
                    DestageIo::Probe(_) => c.probe_failed(),
                }
            }
        }
    }
}

/// Books a finished destage operation; after a flush, makes the new checkpoint durable.
/// True when it failed.
async fn destage_ended(inner: &Arc<Inner>, ended: Ended) -> bool {
    match ended {
        Ended::Io(id, Ok(())) => checkpoint_after(inner, |c| c.destage_done(id)).await,
        Ended::Io(id, Err(e)) => {
            tracing::warn!("destage write failed, retrying: {e}");
            lock(&inner.counters).destage_retries += 1;
            lock(&inner.core).destage_failed(id);
            return true;
        }
        Ended::Sync(epoch, Ok(()), started) => {
            {
                let mut n = lock(&inner.counters);
                n.remote_sync_secs = ewma(n.remote_sync_secs, started.elapsed());
            }
            checkpoint_after(inner, |c| c.synced(epoch)).await;
        }
        Ended::Probe(Ok(matches)) => {
            lock(&inner.core).probed(&matches);
            tracing::info!("read back what the remote holds of the epochs in flight; destage resumes");
        }
        Ended::Probe(Err(e)) => {
            tracing::warn!("reading back the remote failed, retrying: {e}");
            lock(&inner.counters).destage_retries += 1;
            lock(&inner.core).probe_failed();
            return true;
        }
        Ended::Sync(epoch, Err(e), _) => {
            tracing::warn!(epoch, "remote flush failed, retrying: {e}");
            lock(&inner.counters).destage_retries += 1;
            lock(&inner.core).sync_failed(epoch);
            return true;
        }
    }
    false
}

/// Books a destage answer with `retire`; when epochs left the dirty index, makes the new
/// checkpoint durable and wakes the writers waiting for the log space it frees.
async fn checkpoint_after(inner: &Arc<Inner>, retire: impl FnOnce(&mut Core) -> bool) {
    let cp = {
        let mut c = lock(&inner.core);
        if retire(&mut c) {
            c.take_checkpoint()
        } else {
            None
        }
    };
    if let Some(cp) = cp {
        write_checkpoint(inner, cp).await;
        inner.space.notify_waiters();
        inner.freed.notify_waiters();
    }
}

async fn write_checkpoint(inner: &Arc<Inner>, cp: Checkpoint) {
    loop {
        let bytes = {
            let mut sb = lock(&inner.superblock);
            sb.generation += 1;
            sb.checkpoint = cp;
            (sb.copy_offset(), sb.encode())
        };
        let r = async {
            inner.log.write(bytes.0, Bytes::from(bytes.1)).await?;
            inner.log.0.flush().await
        }
        .await;
        match r {
            Ok(()) => {
                lock(&inner.core).checkpoint_durable(cp);
                return;
            }
            Err(e) => {
                tracing::error!("checkpoint write failed, retrying: {e}");
                tokio::time::sleep(inner.opts.retry_delay).await;
            }
        }
    }
}

#[async_trait]
impl BlockDev for Cache {
    fn geometry(&self) -> Geometry {
        self.inner.geometry
    }

    fn volatile_cache(&self) -> bool {
        match self.inner.opts.mode {
            AckMode::Immediate => true,
            AckMode::Log => false,
            AckMode::WriteThrough => self.inner.remote.volatile_cache(),
        }
    }

    fn supports_discard(&self) -> bool {
        true
    }

    async fn read(&self, lba: u64, blocks: u32) -> Result<Bytes, BlockError> {
        self.wait_for_prefetch(lba, u64::from(blocks)).await;
        let plan = lock(&self.inner.core).read(lba, u64::from(blocks)).map_err(from_core)?;
        if let Some((from, n)) = plan.prefetch {
            self.prefetch(from, n, plan.generation);
        }
        let r = resolve(&self.inner, plan.pieces).await;
        let mut c = lock(&self.inner.core);
        c.unpin(&plan.pinned);
        let (data, fetched) = r?;
        for (at, d) in &fetched {
            c.fill(*at, d, plan.generation);
        }
        Ok(data)
    }

    async fn write(&self, lba: u64, data: Bytes, fua: bool) -> Result<(), BlockError> {
        if self.inner.opts.mode == AckMode::WriteThrough {
            return self.write_through(lba, data, fua).await;
        }
        let (arrived, len) = (Instant::now(), data.len() as u64);
        self.admit(len).await;
        let mut epochs = (0, 0);
        self.submit(|c| {
            let r = c.write(lba, data, fua);
            epochs = c.epochs();
            r
        })
        .await?;
        let mut n = lock(&self.inner.counters);
        n.host_write_bytes += len;
        // Kept here too, not only when scraped: a gateway nobody scrapes must not collect them.
        n.forget_epochs_up_to(epochs.1);
        n.epoch_started.entry(epochs.0).or_insert(arrived);
        Ok(())
    }

    async fn flush(&self) -> Result<(), BlockError> {
        if self.inner.opts.mode == AckMode::WriteThrough {
            return self.inner.remote.flush().await;
        }
        self.submit(|c| Ok(c.flush())).await
    }

    async fn write_zeros(&self, lba: u64, blocks: u64) -> Result<(), BlockError> {
        if self.inner.opts.mode == AckMode::WriteThrough {
            return self.inner.remote.write_zeros(lba, blocks).await;
        }
        self.submit(|c| c.zero(lba, blocks, false)).await
    }

    async fn discard(&self, lba: u64, blocks: u64) -> Result<(), BlockError> {
        if self.inner.opts.mode == AckMode::WriteThrough {
            return if self.inner.remote.supports_discard() {
                self.inner.remote.discard(lba, blocks).await
            } else {
                self.inner.remote.write_zeros(lba, blocks).await
            };
        }
        self.submit(|c| c.zero(lba, blocks, true)).await
    }
}

impl Cache {
    async fn write_through(&self, lba: u64, data: Bytes, fua: bool) -> Result<(), BlockError> {
        let (len, started) = (data.len() as u64, Instant::now());
        self.inner.remote.write(lba, data, fua).await?;
        let mut n = lock(&self.inner.counters);
        n.host_write_bytes += len;
        n.remote_write(len, started.elapsed());
        Ok(())
    }
}

impl std::fmt::Debug for Cache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cache")
            .field("mode", &self.inner.opts.mode)
            .field("geometry", &self.inner.geometry)
            .finish_non_exhaustive()
    }
}

impl Drop for Cache {
    fn drop(&mut self) {
        self.inner.stopping.store(true, std::sync::atomic::Ordering::Release);
        if let Some(mut t) = lock(&self.tasks).take() {
            t.abort_all();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
    use stics_block::{MemDev, Queued};

    fn opts(mode: AckMode) -> CacheOptions {
        CacheOptions {
            mode,
            ram_bytes: 1 << 20,
            max_record_bytes: 256 << 10,
            destage_io_bytes: 64 << 10,
            destage_inflight: 4,
            ordered_destage: true,
            epoch_max_writes: 64,
            epoch_max_bytes: 1 << 20,
            throttle_from: 0.75,
            deep_destage_from: 0.25,
            retry_delay: Duration::from_millis(10),
            read_cache_bytes: 1 << 20,
            read_cache_policy: Policy::S3Fifo,
            read_ahead_bytes: 64 << 10,
        }
    }

    fn pattern(lba: u64, n: u32, v: u8) -> Bytes {
        let mut b = vec![v; n as usize * 512];
        for i in 0..n as usize {
            b[i * 512..i * 512 + 8].copy_from_slice(&(lba + i as u64).to_le_bytes());
        }
        Bytes::from(b)
    }

    #[tokio::test]
    async fn writes_read_back_and_drain_to_the_remote() {
        for mode in [AckMode::Log, AckMode::Immediate, AckMode::WriteThrough] {
            let log: Arc<dyn BlockDev> = Arc::new(MemDev::new(512, 32 << 11));
            let remote = Arc::new(MemDev::new(512, 4096));
            let cache = Cache::open(log, remote.clone(), b"mem-remote", opts(mode)).await.expect("opens");
            for i in 0..20u64 {
                cache.write(i * 7, pattern(i * 7, 3, i as u8), false).await.expect("write");
            }
            cache.write(7, pattern(7, 1, 99), true).await.expect("fua write");
            cache.flush().await.expect("flush");
            assert_eq!(cache.read(7, 1).await.expect("read"), pattern(7, 1, 99));
            assert_eq!(cache.read(14, 3).await.expect("read"), pattern(14, 3, 2));
            cache.drain().await;
            assert_eq!(remote.read(7, 1).await.expect("remote read"), pattern(7, 1, 99), "{mode:?}");
            assert_eq!(remote.read(133, 3).await.expect("remote read"), pattern(133, 3, 19), "{mode:?}");
            cache.close().await;
        }
    }

    /// A remote that keeps one holder's key, as a reserved LUN does.
    struct Claimable {
        dev: MemDev,
        holder: Mutex<Option<u64>>,
    }

    #[async_trait]
    impl BlockDev for Claimable {
        fn geometry(&self) -> Geometry {
            self.dev.geometry()
        }
        fn volatile_cache(&self) -> bool {
            false
        }
        async fn claim(&self, key: u64) -> Result<Claim, BlockError> {
            let mut h = lock(&self.holder);
            match *h {
                Some(k) if k != key => Err(BlockError::Reserved { holder: Some(k) }),
                Some(_) => Ok(Claim::TakenOver),
                None => {
                    *h = Some(key);
                    Ok(Claim::Held)
                }
            }
        }
        async fn read(&self, lba: u64, blocks: u32) -> Result<Bytes, BlockError> {
            self.dev.read(lba, blocks).await
        }
        async fn write(&self, lba: u64, data: Bytes, fua: bool) -> Result<(), BlockError> {
            self.dev.write(lba, data, fua).await
        }
        async fn flush(&self) -> Result<(), BlockError> {
            Ok(())
        }
    }

    #[tokio::test]
    async fn a_second_log_is_refused_while_the_first_holds_the_remote_in_every_mode() {
        for mode in [AckMode::Log, AckMode::Immediate, AckMode::WriteThrough] {
            let remote = Arc::new(Claimable { dev: MemDev::new(512, 4096), holder: Mutex::new(None) });
            let log_a: Arc<dyn BlockDev> = Arc::new(MemDev::new(512, 32 << 11));
            let a = Cache::open(Arc::clone(&log_a), remote.clone(), b"lun", opts(mode)).await.expect("opens");
            let key_a = lock(&remote.holder).expect("the first open claims the remote");
            assert_eq!(key_a, claim_key(&lock(&a.inner.superblock).log_uuid));
            let log_b: Arc<dyn BlockDev> = Arc::new(MemDev::new(512, 32 << 11));
            let err = Cache::open(log_b, remote.clone(), b"lun", opts(mode)).await.err();
            assert!(matches!(err, Some(CacheError::Claimed { holder }) if holder == key_a), "{mode:?}: {err:?}");
            let text = err.map(|e| e.to_string()).unwrap_or_default();
            assert!(
                text.starts_with(&format!(
                    "another writer holds the remote LUN: reservation key {key_a:#018x}; stop it"
                )),
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
        for mode in [AckMode::Log, AckMode::Immediate, AckMode::WriteThrough] {
            let log: Arc<dyn BlockDev> = Arc::new(MemDev::new(512, 32 << 11));
            let remote = Arc::new(MemDev::new(512, 4096));
            let cache = Cache::open(log, remote.clone(), b"mem-remote", opts(mode)).await.expect("opens");
            // The same four blocks ten times: the host writes 40 blocks. In `immediate` mode they
            // share one epoch and destage sends fewer; in `log` mode each acknowledged write cuts
            // an epoch, and each epoch must reach the remote.
            for i in 0..10u8 {
                cache.write(0, pattern(0, 4, i), false).await.expect("write");
            }
            cache.flush().await.expect("flush");
            let s = cache.status();
            assert_eq!(s.host_write_bytes, 40 * 512, "{mode:?}");
            if mode != AckMode::WriteThrough {
                assert!(s.dirty_bytes == 0 || s.destage_lag_secs >= 0.0);
            }
            cache.drain().await;
            let s = cache.status();
            assert_eq!(s.dirty_bytes, 0);
            assert!(s.destage_lag_secs.abs() < f64::EPSILON, "clean means no lag: {s:?}");
            match mode {
                AckMode::Immediate => assert!(s.remote_write_bytes < 40 * 512, "{s:?}"),
                AckMode::Log | AckMode::WriteThrough => assert_eq!(s.remote_write_bytes, 40 * 512, "{mode:?}"),
            }
            if mode != AckMode::WriteThrough {
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
        let cache = Cache::open(Arc::clone(&log), remote.clone(), b"lun-a", opts(AckMode::Log)).await.expect("opens");
        cache.close().await;
        drop(cache);
        let err = Cache::open(Arc::clone(&log), remote.clone(), b"lun-b", opts(AckMode::Log)).await.err();
        assert!(matches!(err, Some(CacheError::WrongRemote { .. })), "{err:?}");
        let other = Arc::new(MemDev::new(512, 8192));
        let err = Cache::open(log, other, b"lun-a", opts(AckMode::Log)).await.err();
        assert!(err.is_some_and(|e| e.to_string().contains("belongs to another LUN")));
    }

    #[tokio::test]
    async fn what_is_in_the_log_survives_a_close_and_reaches_the_remote_after_reopening() {
        let log: Arc<dyn BlockDev> = Arc::new(MemDev::new(512, 32 << 11));
        let remote = Arc::new(MemDev::new(512, 4096));
        let cache = Cache::open(Arc::clone(&log), remote.clone(), b"r", opts(AckMode::Log)).await.expect("opens");
        cache.write(100, pattern(100, 4, 5), false).await.expect("write");
        cache.close().await;
        drop(cache);
        let cache = Cache::open(Arc::clone(&log), remote.clone(), b"r", opts(AckMode::Log)).await.expect("reopens");
        assert_eq!(cache.read(100, 4).await.expect("read"), pattern(100, 4, 5));
        cache.drain().await;
        assert_eq!(remote.read(100, 4).await.expect("remote"), pattern(100, 4, 5));
        assert_eq!(cache.status().dirty_blocks, 0);
    }

    /// A remote whose writes all fail.
    struct Down(MemDev);

    #[async_trait]
    impl BlockDev for Down {
        fn geometry(&self) -> Geometry {
            self.0.geometry()
        }
        fn volatile_cache(&self) -> bool {
            false
        }
        async fn read(&self, lba: u64, blocks: u32) -> Result<Bytes, BlockError> {
            self.0.read(lba, blocks).await
        }
        async fn write(&self, lba: u64, _data: Bytes, _fua: bool) -> Result<(), BlockError> {
            Err(BlockError::Io { lba, source: std::io::Error::other("remote down") })
        }
        async fn flush(&self) -> Result<(), BlockError> {
            Ok(())
        }
    }

    #[tokio::test]
    async fn recovery_reads_back_the_remote_and_resumes_after_the_epochs_it_holds() {
        let log: Arc<dyn BlockDev> = Arc::new(MemDev::new(512, 32 << 11));
        let down = Arc::new(Down(MemDev::new(512, 4096)));
        let cache = Cache::open(Arc::clone(&log), down, b"r", opts(AckMode::Log)).await.expect("opens");
        // In `log` mode each acknowledged write closes its epoch: eleven epochs, none destaged.
        let writes: Vec<(u64, Bytes)> = (0..10u64).map(|i| (i * 3, pattern(i * 3, 1, i as u8 + 1))).collect();
        for (lba, data) in &writes {
            cache.write(*lba, data.clone(), false).await.expect("write");
        }
        cache.write(0, pattern(0, 1, 77), false).await.expect("write");
        cache.close().await;
        drop(cache);
        // The remote already holds the first four epochs, as if destage had sent them before the
        // crash and the checkpoint had not caught up.
        let remote = Arc::new(MemDev::new(512, 4096));
        for (lba, data) in &writes[..4] {
            remote.write(*lba, data.clone(), false).await.expect("remote write");
        }
        let cache = Cache::open(Arc::clone(&log), remote.clone(), b"r", opts(AckMode::Log)).await.expect("reopens");
        cache.drain().await;
        for (lba, data) in &writes[1..] {
            assert_eq!(&remote.read(*lba, 1).await.expect("remote"), data);
        }
        assert_eq!(remote.read(0, 1).await.expect("remote"), pattern(0, 1, 77));
        // Epoch 4 goes again (its flush makes 1–3 durable there), then epochs 5–11.
        assert_eq!(cache.status().blocks_destaged, 8);
    }

    #[tokio::test]
    async fn a_log_too_small_is_refused_with_the_size_it_needs() {
        let log: Arc<dyn BlockDev> = Arc::new(MemDev::new(512, 2048));
        let remote = Arc::new(MemDev::new(512, 4096));
        let err = Cache::open(log, remote, b"r", opts(AckMode::Log)).await.expect_err("refused");
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
        let cache = Cache::open(log, remote.clone(), b"far", CacheOptions::default()).await.expect("opens");
        // In `log` mode, one write at a time: each acknowledgement ends its epoch.
        for i in 0..300u64 {
            cache.write(i * 8, pattern(i * 8, 8, i as u8), true).await.expect("write");
        }
        cache.drain().await;
        let s = cache.status();
        assert!(s.destaged_epoch >= 300, "{s:?}");
        let most = remote.most.load(SeqCst);
        assert!(most > 16, "only {most} epochs were in flight at once");
        for i in (0..300u64).step_by(37) {
            assert_eq!(remote.dev.read(i * 8, 8).await.expect("remote"), pattern(i * 8, 8, i as u8));
        }
    }
}
