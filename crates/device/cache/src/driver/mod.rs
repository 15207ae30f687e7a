//! `Cache`, the block device that wraps a remote device with the write log: the thin tokio
//! driver around [`crate::core::Core`]. Host requests go through the core under a short lock;
//! [`log_writer`] writes log records (group commit) and the checkpoint, [`destager`] carries out
//! destage with many remote commands in flight, [`status`] gathers what an operator scrapes.
//!
//! One writer per remote: opening claims the remote ([`BlockDev::claim`], a persistent
//! reservation on a remote LUN) under a key derived from the log's UUID, in every mode, and
//! refuses to start when another key holds it. Closing keeps the claim: the log may still hold
//! data the remote lacks, and the next open of the same log takes the claim back. A cache of a
//! LUN that gateways share ([`Cache::open_shared`]) claims nothing: tokens from the SG say who may
//! cache and write what, and every group it ships carries the generation of the token each of
//! its segments was written under ([`Fencer`]), which the SG checks.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use bytes::{Bytes, BytesMut};
use stics_block::{BlockDev, BlockError, Claim, Geometry};
use tokio::sync::{oneshot, Notify};
use tokio::task::JoinSet;

use crate::config::{Config, ConfigError, Layout, Mode};
use crate::core::{self, Admit, Change, Core, Piece, State, Submitted, Ticket};
use crate::format::{RemoteBinding, Superblock, LOG_BLOCK, RING_START};
use crate::scan::{self, LogRead, ScanError};

mod destager;
mod log_writer;
pub mod status;

pub use status::{GroupStatus, HealthStatus, Status};

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
    Config(#[from] ConfigError),
    /// The log device's size does not match the log written on it.
    #[error("the log was formatted for {formatted} bytes but the device has {device}")]
    LogSize { formatted: u64, device: u64 },
    /// A shared LUN cannot be cached this way.
    #[error("shared LUN: {0}")]
    Shared(String),
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

pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Byte-granular reads of the log device.
pub(crate) struct LogDev(pub(crate) Arc<dyn BlockDev>);

impl LogDev {
    pub(crate) async fn read(&self, off: u64, len: usize) -> Result<Bytes, BlockError> {
        stics_block::range::read_at(self.0.as_ref(), off, len).await
    }

    /// Writes whole log blocks (offsets and lengths are multiples of [`LOG_BLOCK`]).
    pub(crate) async fn write(&self, off: u64, data: Bytes) -> Result<(), BlockError> {
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

/// Under which token a cache of a shared LUN writes each segment: what its groups carry for the
/// SG's fence.
pub trait Fencer: Send + Sync + 'static {
    /// The SG's segment, in bytes.
    fn segment_bytes(&self) -> u32;
    /// The generation of the exclusive token this gateway holds on `seg`, if it holds one.
    fn exclusive(&self, seg: u64) -> Option<u64>;
    /// True once the gateway knows which tokens it holds (a restarted one learns it from the
    /// SG first): a dirty segment without an exclusive token is then one whose token was lost.
    fn known(&self) -> bool;
    /// The gateway holds dirty writes to `seg` and no exclusive token on it any more: they can
    /// never land, and go to quarantine.
    fn lost(&self, seg: u64);
}

/// Destage hurries while a drain or a settle waits, however it ends.
struct Hurry<'a>(&'a Inner);

impl Hurry<'_> {
    fn on(inner: &Inner) -> Hurry<'_> {
        lock(&inner.core).hurry(true);
        Hurry(inner)
    }
}

impl Drop for Hurry<'_> {
    fn drop(&mut self) {
        lock(&self.0.core).hurry(false);
    }
}

/// How often a request waiting for its acknowledgement looks whether it should end instead.
const STALL_CHECK: Duration = Duration::from_secs(1);

pub(crate) struct Inner {
    core: Mutex<Core>,
    log: LogDev,
    remote: Arc<dyn BlockDev>,
    cfg: Config,
    geometry: Geometry,
    /// Superblock fields that do not change, and the generation last written.
    superblock: Mutex<Superblock>,
    /// One checkpoint write at a time.
    checkpointing: tokio::sync::Mutex<()>,
    waiters: Mutex<HashMap<Ticket, oneshot::Sender<()>>>,
    /// New writes for the log writer.
    logger: Notify,
    /// Durable records or a new checkpoint for the destager.
    destager: Notify,
    /// RAM or log space became free.
    space: Notify,
    /// Destage freed log space (a new checkpoint): throttled writes go in together.
    freed: Notify,
    counters: Mutex<status::Counters>,
    /// The log writer ends once nothing is left in RAM.
    stopping: AtomicBool,
    /// Destage ends.
    halted: AtomicBool,
    /// Read-ahead in flight: block range and who waits for it.
    prefetching: Mutex<Vec<(u64, u64, Arc<Notify>)>>,
    /// The groups being shipped, encoded (oldest first): each sent again as the same bytes.
    group_bytes: Mutex<Vec<(u64, Bytes)>>,
    /// The tokens a shared LUN's groups are fenced under.
    fencer: Option<Arc<dyn Fencer>>,
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
        cfg: Config,
    ) -> Result<Cache, CacheError> {
        Cache::open_with(log, remote, remote_id, cfg, None).await
    }

    /// Opens a cache of a LUN that other gateways share through tokens from its SG: it claims
    /// nothing, ships only groups, each fenced under `fencer`'s tokens, and reads nothing ahead
    /// (read-ahead would cache blocks of segments it holds no token on). Write-through mode,
    /// whose writes would reach the SG unfenced, is refused.
    pub async fn open_shared(
        log: Arc<dyn BlockDev>,
        remote: Arc<dyn BlockDev>,
        remote_id: &[u8],
        cfg: Config,
        fencer: Arc<dyn Fencer>,
    ) -> Result<Cache, CacheError> {
        if cfg.mode == Mode::WriteThrough {
            return Err(CacheError::Shared(
                "write-through mode writes to the SG unfenced: a shared LUN is cached in log or immediate mode".into(),
            ));
        }
        if remote.group_sink().is_none_or(|g| g.max_group() == 0) {
            return Err(CacheError::Shared("the remote is no stics SG: only an SG hands out tokens".into()));
        }
        let cfg = Config { read_ahead_bytes: 0, ..cfg };
        Cache::open_with(log, remote, remote_id, cfg, Some(fencer)).await
    }

    async fn open_with(
        log: Arc<dyn BlockDev>,
        remote: Arc<dyn BlockDev>,
        remote_id: &[u8],
        cfg: Config,
        fencer: Option<Arc<dyn Fencer>>,
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
                log_writer::format(&log, device_bytes, wanted.clone()).await?
            }
            Err(e) => return Err(CacheError::Superblock(e)),
        };
        if sb.remote != wanted {
            return Err(CacheError::WrongRemote { found: sb.remote, wanted });
        }
        if sb.log_bytes > log.0.geometry().bytes() {
            return Err(CacheError::LogSize { formatted: sb.log_bytes, device: device_bytes });
        }
        let max_group = remote.group_sink().map(stics_block::GroupSink::max_group).filter(|n| *n > 0);
        let mut cfg = cfg;
        if let Some(g) = max_group {
            // Epochs small enough that a group holds two: one too large goes as plain writes.
            cfg.epoch_max_bytes = cfg.epoch_max_bytes.min(u64::from(g) / 2).max(1 << 16);
            tracing::info!(max_group = g, "the remote is a stics SG: destage ships groups of epochs");
        }
        let layout = Layout {
            block_size: geometry.block_size,
            num_blocks: geometry.num_blocks,
            ring_start: RING_START,
            ring_end: sb.log_bytes,
            ordered_remote: cfg.ordered_destage && remote.ordered_queue().is_some(),
            max_group,
            groups_in_flight: remote.group_sink().map_or(1, stics_block::GroupSink::groups_in_flight),
        };
        cfg.validate(&layout)?;
        // Once the settings are known to work and before recovery destages anything: nobody else
        // may write behind this log's back.
        let key = claim_key(&sb.log_uuid);
        let claim = if fencer.is_some() { Ok(Claim::Unsupported) } else { remote.claim(key).await };
        match claim {
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
        let core = Core::recover(
            cfg.clone(),
            layout,
            sb.log_uuid,
            sb.checkpoint,
            &records,
            scanned.tail_offset,
            scanned.next_seq,
        );
        let mut core = core;
        if fencer.is_some() {
            core.groups_only();
        }
        drop(records);
        drop(scanned);
        if live > 0 {
            tracing::info!(
                records = live,
                dirty_blocks = core.dirty_blocks(),
                index_extents = core.index_extents(),
                "recovered the write log; destage resumes"
            );
        }
        let inner = Arc::new(Inner {
            core: Mutex::new(core),
            log,
            remote,
            cfg,
            geometry,
            superblock: Mutex::new(sb),
            checkpointing: tokio::sync::Mutex::new(()),
            waiters: Mutex::new(HashMap::new()),
            logger: Notify::new(),
            destager: Notify::new(),
            space: Notify::new(),
            freed: Notify::new(),
            counters: Mutex::new(status::Counters::default()),
            stopping: AtomicBool::new(false),
            halted: AtomicBool::new(false),
            prefetching: Mutex::new(Vec::new()),
            group_bytes: Mutex::new(Vec::new()),
            fencer,
        });
        let mut tasks = JoinSet::new();
        tasks.spawn(log_writer::log_writer(Arc::clone(&inner)));
        tasks.spawn(destager::destager(Arc::clone(&inner)));
        Ok(Cache { inner, tasks: Mutex::new(Some(tasks)) })
    }

    /// What the cache holds and has done.
    pub fn status(&self) -> Status {
        let c = lock(&self.inner.core);
        lock(&self.inner.counters).status(&c, Instant::now())
    }

    /// Waits until every dirty block is on the remote and synchronised (for maintenance: the
    /// remote alone is then the whole truth). Ends with the cause when the remote (or the log)
    /// keeps failing for the full timeout while it waits.
    pub async fn drain(&self) -> Result<(), BlockError> {
        let _hurry = Hurry::on(&self.inner);
        let started = Instant::now();
        loop {
            let notified = self.inner.space.notified();
            let clean = {
                let c = lock(&self.inner.core);
                let now = Instant::now();
                if now.saturating_duration_since(started) >= self.inner.cfg.full_timeout {
                    if let Some(e) = c.stalled(true, now) {
                        return Err(e);
                    }
                }
                c.is_clean()
            };
            // When clean: destage wrote a checkpoint after its last epoch; a head that moved
            // since (pins let go of) is written here, so that the empty log is final on disk.
            // Write-through writes went to the remote directly: its cache is flushed too.
            if clean && !log_writer::persist_checkpoint(&self.inner).await {
                if self.inner.cfg.mode == Mode::WriteThrough {
                    self.on_remote(None, self.inner.remote.flush(), |_| {}).await?;
                }
                return Ok(());
            }
            self.inner.destager.notify_one();
            let _ = tokio::time::timeout(Duration::from_millis(100), notified).await;
        }
    }

    /// Waits until every write made before the call is on the remote, or superseded by a later
    /// one (what a gateway does before it gives a segment's token up: the current epoch is closed,
    /// and destage hurries until no older epoch is left). Ends with the cause when the remote
    /// keeps failing for the full timeout.
    pub async fn settle(&self) -> Result<(), BlockError> {
        let through = lock(&self.inner.core).mark();
        self.settle_through(through).await
    }

    /// Waits until every write to blocks `lba..lba + blocks` made before the call is on the
    /// remote, with every older epoch (what a gateway does before it gives a segment's token
    /// up); at once when none of them is dirty.
    pub async fn settle_range(&self, lba: u64, blocks: u64) -> Result<(), BlockError> {
        let through = lock(&self.inner.core).dirty_through(lba, lba.saturating_add(blocks));
        match through {
            Some(through) => self.settle_through(through).await,
            None => Ok(()),
        }
    }

    /// The newest epoch holding a write to blocks `lba..lba + blocks` that the remote does not
    /// hold yet (closing it if it is the open one, so that destage may take it), or `None`:
    /// once the remote has every epoch up to it, it has those writes. What a shared gateway's
    /// early release names.
    pub fn dirty_through(&self, lba: u64, blocks: u64) -> Option<u64> {
        lock(&self.inner.core).dirty_through(lba, lba.saturating_add(blocks))
    }

    async fn settle_through(&self, through: u64) -> Result<(), BlockError> {
        let _hurry = Hurry::on(&self.inner);
        let started = Instant::now();
        loop {
            let notified = self.inner.space.notified();
            {
                let c = lock(&self.inner.core);
                if c.settled(through) {
                    return Ok(());
                }
                let now = Instant::now();
                if now.saturating_duration_since(started) >= self.inner.cfg.full_timeout {
                    if let Some(e) = c.stalled(true, now) {
                        return Err(e);
                    }
                }
            }
            self.inner.logger.notify_one();
            self.inner.destager.notify_one();
            let _ = tokio::time::timeout(Duration::from_millis(100), notified).await;
        }
    }

    /// What blocks `lba..lba + blocks` hold that the remote does not yet: runs of (first block,
    /// its data, `None` for zeros), in LBA order.
    pub async fn dirty_data(&self, lba: u64, blocks: u64) -> Result<Vec<(u64, Option<Bytes>, u64)>, BlockError> {
        let (runs, pinned) = lock(&self.inner.core).dirty_runs(lba, lba.saturating_add(blocks));
        let bs = u64::from(self.inner.geometry.block_size);
        let mut out = Vec::with_capacity(runs.len());
        let mut failed = None;
        for (at, n, loc) in runs {
            let data = match loc {
                core::Loc::Ram(b) => Some(b),
                core::Loc::Log(off) => match self.inner.log.read(off, (n * bs) as usize).await {
                    Ok(b) => Some(b),
                    Err(e) => {
                        failed = Some(e);
                        break;
                    }
                },
                core::Loc::Zero => None,
            };
            out.push((at, data, n));
        }
        lock(&self.inner.core).unpin(&pinned);
        match failed {
            Some(e) => Err(e),
            None => Ok(out),
        }
    }

    /// Drops what blocks `lba..lba + blocks` hold dirty: it never reaches the remote, and they
    /// read as the remote has them; returns once the drop is durable in the log (a restart
    /// does not bring them back). For a shared LUN's writes under a token the SG broke, once
    /// they are kept elsewhere.
    pub async fn drop_dirty(&self, lba: u64, blocks: u64) -> Result<(), BlockError> {
        self.submit(false, |c| c.forget(lba, blocks)).await.map(|_| ())
    }

    /// Waits until no group planned before the call is out or waits to go again: whatever the
    /// groups planned so far carry has landed or never will. What a shared gateway waits for
    /// before it acknowledges a broken token, since a group planned under it could otherwise
    /// be encoded again under a newer token of the segment. Fails once the cache is closed:
    /// groups cut off on their way may still land.
    pub async fn groups_ended(&self) -> Result<(), BlockError> {
        let mark = lock(&self.inner.core).groups_planned();
        loop {
            let notified = self.inner.space.notified();
            if lock(&self.inner.core).groups_ended(mark) {
                return Ok(());
            }
            if self.inner.halted.load(Ordering::Acquire) {
                return Err(BlockError::Unsupported("the cache is closed"));
            }
            self.inner.destager.notify_one();
            let _ = tokio::time::timeout(Duration::from_millis(100), notified).await;
        }
    }

    /// The log's identity: the source its groups carry, and a gateway's name at the SG.
    pub fn log_uuid(&self) -> [u8; 16] {
        lock(&self.inner.core).log_uuid
    }

    /// Takes `data`, the remote's blocks from `lba` on as it holds them now, into the read cache
    /// (a shared token came with them), but for blocks dirty here.
    pub fn fill(&self, lba: u64, data: &[u8]) {
        lock(&self.inner.core).fill(lba, data);
    }

    /// Forgets clean copies of blocks `lba..lba + blocks` (the read cache's, and remote data of
    /// reads still under way): another gateway may write them now.
    pub fn forget(&self, lba: u64, blocks: u64) {
        lock(&self.inner.core).invalidate(lba, lba.saturating_add(blocks));
    }

    /// Stops the cache. Acknowledged writes still in RAM (`immediate` mode) are written to the
    /// log first, with destage running meanwhile (a full log empties only through it), however
    /// long that takes; then the log writer and destage stop. What is dirty stays in the log
    /// and is destaged at the next open.
    pub async fn close(&self) {
        let mut told = Instant::now();
        loop {
            let notified = self.inner.space.notified();
            let left = lock(&self.inner.core).acknowledged_in_ram();
            if left == 0 {
                break;
            }
            if told.elapsed() >= Duration::from_secs(5) {
                tracing::warn!("stopping: {left} bytes of acknowledged writes still to reach the log");
                told = Instant::now();
            }
            self.inner.logger.notify_one();
            self.inner.destager.notify_one();
            let _ = tokio::time::timeout(Duration::from_millis(100), notified).await;
        }
        self.inner.stopping.store(true, Ordering::Release);
        self.inner.logger.notify_one();
        let tasks = lock(&self.tasks).take();
        if let Some(mut t) = tasks {
            // The writer finishes the record it is writing (and, in `log` mode, what waits: it
            // was never acknowledged, but costs nothing to keep); destage may be cut anywhere.
            let writer_done = async {
                while let Some(r) = t.join_next().await {
                    if r.is_ok() {
                        break;
                    }
                }
            };
            let _ = tokio::time::timeout(Duration::from_secs(5), writer_done).await;
            self.inner.halted.store(true, Ordering::Release);
            self.inner.destager.notify_one();
            t.abort_all();
            while t.join_next().await.is_some() {}
        }
    }

    /// Bytes of acknowledged writes still in RAM (what [`Cache::close`] waits for).
    pub fn acknowledged_in_ram(&self) -> u64 {
        lock(&self.inner.core).acknowledged_in_ram()
    }

    /// Runs a host request through the core and waits for its acknowledgement. The waiter is
    /// registered under the core's lock, so the log writer cannot acknowledge it unseen. A
    /// request that waits for a device that keeps failing ends with the cause after the full
    /// timeout. [`Submitted::Remote`] is handed back for the caller to carry out.
    async fn submit(
        &self,
        for_remote: bool,
        f: impl FnOnce(&mut Core) -> Result<Submitted, core::CoreError>,
    ) -> Result<Submitted, BlockError> {
        let (s, rx) = {
            let mut c = lock(&self.inner.core);
            let s = f(&mut c).map_err(from_core)?;
            let rx = match s {
                Submitted::Wait(t) => {
                    let (tx, rx) = oneshot::channel();
                    lock(&self.inner.waiters).insert(t, tx);
                    Some((t, rx))
                }
                Submitted::Done | Submitted::Remote => None,
            };
            (s, rx)
        };
        self.inner.logger.notify_one();
        let Some((ticket, mut rx)) = rx else { return Ok(s) };
        if for_remote {
            self.inner.destager.notify_one();
        }
        loop {
            match tokio::time::timeout(STALL_CHECK, &mut rx).await {
                Ok(_) => return Ok(s),
                Err(_) => {
                    let stalled = lock(&self.inner.core).stalled(for_remote, Instant::now());
                    if let Some(e) = stalled {
                        lock(&self.inner.waiters).remove(&ticket);
                        lock(&self.inner.counters).refused_writes += 1;
                        return Err(e);
                    }
                }
            }
        }
    }

    /// Holds a host write back while RAM, the log or the index is full, slows it while the log
    /// fills, and refuses it once something is full and the remote (or the log) has been
    /// failing for longer than the full timeout (see [`Core::admit`]).
    async fn admit(&self, bytes: u64) -> Result<(), BlockError> {
        let mut held = false;
        loop {
            let freed = self.inner.freed.notified();
            let space = self.inner.space.notified();
            let admit = lock(&self.inner.core).admit(bytes, Instant::now());
            if !held && !matches!(admit, Admit::Now) {
                held = true;
                lock(&self.inner.counters).throttled_writes += 1;
            }
            match admit {
                Admit::Now => return Ok(()),
                Admit::At(t) => {
                    let _ = tokio::time::timeout_at(t.into(), freed).await;
                    return Ok(());
                }
                Admit::Full => {
                    let _ = tokio::time::timeout(Duration::from_millis(50), async {
                        tokio::select! {
                            () = freed => {}
                            () = space => {}
                        }
                    })
                    .await;
                }
                Admit::Refuse(e) => {
                    lock(&self.inner.counters).refused_writes += 1;
                    return Err(e);
                }
            }
        }
    }

    /// Reads ahead in the background; a read of those blocks waits for it instead of asking
    /// the remote a second time.
    fn prefetch(&self, lba: u64, blocks: u32, generation: u64) {
        let done = Arc::new(Notify::new());
        lock(&self.inner.prefetching).push((lba, lba + u64::from(blocks), Arc::clone(&done)));
        let inner = Arc::clone(&self.inner);
        tokio::spawn(async move {
            let fetched = match inner.remote.read(lba, blocks).await {
                Ok(data) => vec![(lba, data)],
                Err(_) => Vec::new(),
            };
            lock(&inner.core).finish_read(generation, &fetched);
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

    /// Runs a write-through request on the remote, then lets the core know it changed those
    /// blocks (whatever the outcome: a failed write may have landed in part).
    async fn direct<F>(&self, lba: u64, blocks: u64, run: F) -> Result<(), BlockError>
    where
        F: std::future::Future<Output = Result<(), BlockError>>,
    {
        self.on_remote(Some(lba), run, |c| c.direct_done(lba, blocks)).await
    }

    /// Runs a request on the remote for the host (write-through), and tells the core how it
    /// went: `done` first, then the answer or the failure, which health reports. A remote that
    /// leaves the request unanswered for longer than the answer timeout counts unreachable
    /// meanwhile, whatever the request: a flush in flight when the link is cut waits as long as
    /// a write does.
    async fn on_remote<F>(&self, lba: Option<u64>, run: F, done: impl FnOnce(&mut Core)) -> Result<(), BlockError>
    where
        F: std::future::Future<Output = Result<(), BlockError>>,
    {
        let timeout = self.inner.cfg.answer_timeout;
        let r = answered(&self.inner, run, |c| c.remote_silent(timeout, Instant::now())).await;
        {
            let mut c = lock(&self.inner.core);
            done(&mut c);
            match &r {
                Ok(()) => c.remote_answered(Instant::now()),
                Err(e) => c.remote_failed(e, lba, Instant::now()),
            }
        }
        report(&self.inner);
        r.map_err(host_facing)
    }
}

/// Acknowledges the requests waiting for `tickets`.
pub(crate) fn complete(inner: &Inner, tickets: Vec<Ticket>) {
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

/// Logs the core's state changes, one line each, and a reminder of a failure in force once a
/// minute.
pub(crate) fn report(inner: &Inner) {
    let (changes, reminder) = {
        let mut c = lock(&inner.core);
        (c.take_changes(), c.reminder(Instant::now()))
    };
    for change in changes {
        match change {
            Change::Failing(state, f) => {
                let lba = f.lba.map(|l| format!(" at block {l}")).unwrap_or_default();
                let what = if state == State::Stalled {
                    "stalled: destage waits for a repair"
                } else {
                    "degraded: retrying with backoff"
                };
                tracing::warn!(kind = f.kind.name(), "{what}: {}{lba}", f.error);
            }
            Change::Recovered(after) => tracing::info!("healthy again after {:.1} s", after.as_secs_f64()),
            Change::GroupsOff { why } => {
                tracing::error!("the SG refuses groups; destage goes on with plain writes and flushes: {why}");
            }
        }
    }
    if let Some(f) = reminder {
        let secs = Instant::now().saturating_duration_since(f.since).as_secs();
        tracing::warn!(kind = f.kind.name(), "still failing after {secs} s: {}", f.error);
    }
}

/// A remote's error as the host sees it when a write-through request carried it there: the
/// remote's reservation is the gateway's affair, so a conflict (another writer holds the remote)
/// is the write protection it amounts to.
fn host_facing(e: BlockError) -> BlockError {
    match e {
        BlockError::Reserved { .. } => core::ErrorKind::Reserved.host_error(&e.to_string()),
        other => other,
    }
}

#[expect(clippy::needless_pass_by_value, reason = "used as a map_err function")]
fn from_core(e: core::CoreError) -> BlockError {
    match e {
        core::CoreError::OutOfRange { lba, blocks, num_blocks } => BlockError::OutOfRange { lba, blocks, num_blocks },
        core::CoreError::Misaligned { len, block_size } => BlockError::Misaligned { len, block_size },
    }
}

/// Reads a host read's pieces; returns the bytes and what came from the remote (for the read
/// cache).
async fn resolve(inner: &Inner, pieces: Vec<Piece>) -> Result<(Bytes, Vec<(u64, Bytes)>), BlockError> {
    let bs = inner.geometry.block_size as usize;
    if let [Piece::Ram(b)] = pieces.as_slice() {
        lock(&inner.counters).read_blocks_cache += (b.len() / bs) as u64;
        return Ok((b.clone(), Vec::new()));
    }
    let mut fetched = Vec::new();
    let mut out = BytesMut::new();
    let (mut cache_blocks, mut remote_blocks) = (0u64, 0u64);
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
                let data = remote_read(inner, lba, blocks).await?;
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

/// Waits for `run`, a request on the remote; once it has gone unanswered for the answer
/// timeout, `silent` tells the core so (and the change is logged) before waiting on.
async fn answered<T>(
    inner: &Inner,
    run: impl std::future::Future<Output = Result<T, BlockError>>,
    silent: impl FnOnce(&mut Core),
) -> Result<T, BlockError> {
    let mut run = std::pin::pin!(run);
    match tokio::time::timeout(inner.cfg.answer_timeout, &mut run).await {
        Ok(r) => r,
        Err(_) => {
            silent(&mut lock(&inner.core));
            report(inner);
            run.await
        }
    }
}

/// A host read's blocks from the remote. A remote that leaves it unanswered past the answer
/// timeout counts unreachable meanwhile (see [`Core::read_failed`]); its answer may end that.
async fn remote_read(inner: &Inner, lba: u64, blocks: u32) -> Result<Bytes, BlockError> {
    let silent = BlockError::Unreachable(format!(
        "a read of block {lba} unanswered for {:.0} s",
        inner.cfg.answer_timeout.as_secs_f64()
    ));
    let r = answered(inner, inner.remote.read(lba, blocks), |c| c.read_failed(&silent, Instant::now())).await;
    match &r {
        Ok(_) => lock(&inner.core).read_answered(Instant::now()),
        Err(e) => lock(&inner.core).read_failed(e, Instant::now()),
    }
    report(inner);
    r
}

#[async_trait]
impl BlockDev for Cache {
    fn geometry(&self) -> Geometry {
        self.inner.geometry
    }

    fn volatile_cache(&self) -> bool {
        match self.inner.cfg.mode {
            Mode::Immediate => true,
            Mode::Log => false,
            Mode::WriteThrough => self.inner.remote.volatile_cache(),
        }
    }

    fn supports_discard(&self) -> bool {
        true
    }

    /// In write-through mode writes rest on the remote's volatile cache, as its flushes do:
    /// its resets are the cache's. In the other modes acknowledged (or flushed) writes are in
    /// the log, whatever the remote loses.
    fn resets(&self) -> u64 {
        match self.inner.cfg.mode {
            Mode::WriteThrough => self.inner.remote.resets(),
            Mode::Log | Mode::Immediate => 0,
        }
    }

    async fn read(&self, lba: u64, blocks: u32) -> Result<Bytes, BlockError> {
        self.wait_for_prefetch(lba, u64::from(blocks)).await;
        let plan = lock(&self.inner.core).read(lba, u64::from(blocks)).map_err(from_core)?;
        if let Some((from, n)) = plan.prefetch {
            self.prefetch(from, n, plan.generation);
        }
        let r = resolve(&self.inner, plan.pieces.clone()).await;
        let mut c = lock(&self.inner.core);
        c.unpin(&plan.pinned);
        if plan.has_remote() {
            let fetched = r.as_ref().map(|(_, f)| f.as_slice()).unwrap_or_default();
            c.finish_read(plan.generation, fetched);
        }
        r.map(|(data, _)| data)
    }

    async fn write(&self, lba: u64, data: Bytes, fua: bool) -> Result<(), BlockError> {
        let len = data.len() as u64;
        self.admit(len).await?;
        let direct = data.clone();
        let write_through = self.inner.cfg.mode == Mode::WriteThrough;
        let s = self.submit(write_through, |c| c.write(lba, data, fua)).await?;
        if s == Submitted::Remote {
            let blocks = len / u64::from(self.inner.geometry.block_size);
            let started = Instant::now();
            self.direct(lba, blocks, self.inner.remote.write(lba, direct, fua)).await?;
            let mut n = lock(&self.inner.counters);
            n.host_write_bytes += len;
            n.remote_write(len, started.elapsed());
            return Ok(());
        }
        lock(&self.inner.counters).host_write(len);
        Ok(())
    }

    async fn flush(&self) -> Result<(), BlockError> {
        match self.submit(false, |c| Ok(c.flush())).await? {
            Submitted::Remote => self.on_remote(None, self.inner.remote.flush(), |_| {}).await,
            Submitted::Done | Submitted::Wait(_) => Ok(()),
        }
    }

    async fn write_zeros(&self, lba: u64, blocks: u64) -> Result<(), BlockError> {
        self.admit(0).await?;
        let write_through = self.inner.cfg.mode == Mode::WriteThrough;
        match self.submit(write_through, |c| c.zero(lba, blocks, false)).await? {
            Submitted::Remote => self.direct(lba, blocks, self.inner.remote.write_zeros(lba, blocks)).await,
            Submitted::Done | Submitted::Wait(_) => Ok(()),
        }
    }

    async fn discard(&self, lba: u64, blocks: u64) -> Result<(), BlockError> {
        self.admit(0).await?;
        let write_through = self.inner.cfg.mode == Mode::WriteThrough;
        match self.submit(write_through, |c| c.zero(lba, blocks, true)).await? {
            Submitted::Remote => {
                let remote = &self.inner.remote;
                if remote.supports_discard() {
                    self.direct(lba, blocks, remote.discard(lba, blocks)).await
                } else {
                    self.direct(lba, blocks, remote.write_zeros(lba, blocks)).await
                }
            }
            Submitted::Done | Submitted::Wait(_) => Ok(()),
        }
    }
}

impl std::fmt::Debug for Cache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cache")
            .field("mode", &self.inner.cfg.mode)
            .field("geometry", &self.inner.geometry)
            .finish_non_exhaustive()
    }
}

impl Drop for Cache {
    fn drop(&mut self) {
        self.inner.stopping.store(true, Ordering::Release);
        self.inner.halted.store(true, Ordering::Release);
        if let Some(mut t) = lock(&self.tasks).take() {
            t.abort_all();
        }
    }
}

#[cfg(test)]
mod tests;
