//! A gateway's cache of a LUN that several gateways share (seed 004 §3.4): the STICS cache
//! ([`stics_cache::Cache::open_shared`]) under tokens from the SG ([`stics_coherence::driver`]).
//! Every host command runs as an operation that holds the tokens of the segments it touches,
//! shared to read and exclusive to write; once a gateway holds them, a command costs what it
//! costs a single gateway. A token is given up only after every write made under it is on the SG
//! ([`stics_cache::Cache::settle_range`]) and, unless it is kept shared, the segment's clean copies
//! are forgotten; every group the cache ships carries the generation of the exclusive token each
//! of its segments was written under, which the SG checks.
//!
//! Writes made under a token the SG broke (an operator's break, or `break-after`) can never land:
//! they go to a [`quarantine`] file beside the log, and leave the log's dirty index for good (a
//! logged drop), while commands on their segment wait; a restarted gateway that finds dirty
//! writes on a segment it no longer holds does the same.
//!
//! **Architecture Invariant:** no host command reads or writes a block while its gateway's lease
//! on the block's segment has run out, and no clean copy of a segment outlives the token it was
//! read under.

#![forbid(unsafe_code)]

pub mod quarantine;

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use stics_block::{BlockDev, BlockError, Geometry};
use stics_cache::{Cache, CacheError, Config, Fencer};
use stics_coherence::driver::{Driver, DriverConfig, Holder};
use stics_coherence::Kind;

/// Most segments one operation takes tokens on: a zeroing or discard over more (mkfs discards
/// the whole LUN) goes as several operations, one after the other, so that no command asks the SG
/// for more tokens than its table holds.
const MAX_OP_SEGMENTS: u64 = 1024;

/// Why a shared cache cannot open.
#[derive(Debug, thiserror::Error)]
pub enum SharedError {
    #[error(transparent)]
    Cache(#[from] CacheError),
    /// The remote's link status is unreadable, or it hands out no tokens.
    #[error("the SG's link status: {0}")]
    Status(String),
    #[error(transparent)]
    Granularity(#[from] stics_coherence::CoherenceError),
}

/// What the cache and the token driver reach each other through (each holds it weakly, so that
/// dropping the [`SharedCache`] ends both).
struct Link {
    cache: OnceLock<Arc<Cache>>,
    driver: OnceLock<Driver>,
    segment_bytes: u32,
    seg_blocks: u64,
    block_size: u32,
    /// Where writes under broken tokens go.
    quarantine_dir: PathBuf,
    /// Segments whose writes are being put in quarantine: commands on them wait.
    quarantining: Mutex<BTreeSet<u64>>,
    cleared: tokio::sync::Notify,
    /// The quarantine files written since the gateway started.
    quarantined: Mutex<Vec<Quarantined>>,
}

/// Writes under a broken token, kept in a file.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Quarantined {
    pub segment: u64,
    pub generation: u64,
    pub blocks: u64,
    pub file: PathBuf,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl Link {
    fn blocks_of(&self, seg: u64) -> (u64, u64) {
        (seg.saturating_mul(self.seg_blocks), self.seg_blocks)
    }

    /// Puts `seg`'s dirty writes (made under generation `gen`, 0 when not known) in quarantine,
    /// in the background, until it succeeds; commands on `seg` wait meanwhile.
    fn quarantine(self: &Arc<Self>, seg: u64, gen: u64) {
        if !lock(&self.quarantining).insert(seg) {
            return;
        }
        let link = Arc::clone(self);
        tokio::spawn(async move {
            while let Err(e) = link.quarantine_once(seg, gen).await {
                tracing::error!(
                    segment = seg,
                    "putting writes under a broken token in quarantine failed, retrying: {e}"
                );
                tokio::time::sleep(std::time::Duration::from_secs(1)).await;
            }
            lock(&link.quarantining).remove(&seg);
            link.cleared.notify_waiters();
        });
    }

    /// Waits until no quarantine of any of `segs` is under way.
    async fn quarantine_done(&self, segs: impl Iterator<Item = u64> + Clone) {
        loop {
            let cleared = self.cleared.notified();
            tokio::pin!(cleared);
            cleared.as_mut().enable();
            if !segs.clone().any(|s| lock(&self.quarantining).contains(&s)) {
                return;
            }
            cleared.await;
        }
    }

    async fn quarantine_once(&self, seg: u64, gen: u64) -> Result<(), String> {
        let Some(cache) = self.cache.get() else { return Ok(()) };
        let (lba, blocks) = self.blocks_of(seg);
        let runs = cache.dirty_data(lba, blocks).await.map_err(|e| e.to_string())?;
        if !runs.is_empty() {
            let q = quarantine::Quarantine {
                block_size: self.block_size,
                segment: seg,
                generation: gen,
                runs: runs.into_iter().map(|(at, data, n)| (at, data.map(|d| d.to_vec()), n)).collect(),
            };
            let dir = self.quarantine_dir.clone();
            let blocks = q.blocks();
            let file = tokio::task::spawn_blocking(move || q.write_to(&dir))
                .await
                .map_err(|e| e.to_string())?
                .map_err(|e| e.to_string())?;
            tracing::error!(
                segment = seg,
                generation = gen,
                blocks,
                file = %file.display(),
                "writes made under a token the SG broke can never land: they are kept in quarantine"
            );
            lock(&self.quarantined).push(Quarantined { segment: seg, generation: gen, blocks, file });
        }
        // Durable in the log: a restart does not bring them back. The drop forgets the blocks'
        // clean copies too.
        cache.drop_dirty(lba, blocks).await.map_err(|e| e.to_string())?;
        Ok(())
    }
}

struct Fence(Weak<Link>);

impl Fencer for Fence {
    fn segment_bytes(&self) -> u32 {
        self.0.upgrade().map_or(0, |l| l.segment_bytes)
    }

    fn exclusive(&self, seg: u64) -> Option<u64> {
        let link = self.0.upgrade()?;
        // Writes under a broken token are being put in quarantine: none of the segment's ships
        // until they are out of the log, whatever token it holds now (the SG takes this
        // gateway's writes there again once it has heard that the gateway knows of the break).
        if lock(&link.quarantining).contains(&seg) {
            return None;
        }
        match link.driver.get()?.holds(seg)? {
            (Kind::Exclusive, gen) => Some(gen),
            (Kind::Shared, _) => None,
        }
    }

    fn known(&self) -> bool {
        self.0.upgrade().and_then(|l| l.driver.get().map(Driver::knows_tokens)).unwrap_or(false)
    }

    fn lost(&self, seg: u64) {
        if let Some(link) = self.0.upgrade() {
            link.quarantine(seg, 0);
        }
    }
}

struct Keeper(Weak<Link>);

#[async_trait]
impl Holder for Keeper {
    async fn surrender(&self, seg: u64, _gen: u64, keep: Option<Kind>) -> Result<(), BlockError> {
        let Some(link) = self.0.upgrade() else { return Ok(()) };
        let Some(cache) = link.cache.get() else { return Ok(()) };
        let (lba, blocks) = link.blocks_of(seg);
        // Every write made under the token reaches the SG under it before it goes (nothing to
        // do for a shared one: no write is made under it). Whether it is exclusive is not asked
        // of the driver, which may not be in place yet when its first answer asks for one.
        cache.settle_range(lba, blocks).await?;
        if keep != Some(Kind::Shared) {
            cache.forget(lba, blocks);
        }
        Ok(())
    }

    fn fill(&self, seg: u64, first: u32, data: Bytes) {
        let Some(link) = self.0.upgrade() else { return };
        let Some(cache) = link.cache.get() else { return };
        let (lba, blocks) = link.blocks_of(seg);
        let bs = u64::from(link.block_size);
        // Only whole blocks inside the segment: anything else is no answer to what was asked.
        let n = data.len() as u64 / bs;
        if !(data.len() as u64).is_multiple_of(bs) || u64::from(first) + n > blocks {
            tracing::warn!(segment = seg, first, bytes = data.len(), "data with a grant that fits no segment: ignored");
            return;
        }
        cache.fill(lba + u64::from(first), &data);
    }

    fn release_after(&self, seg: u64) -> Option<u64> {
        let link = self.0.upgrade()?;
        let (lba, blocks) = link.blocks_of(seg);
        link.cache.get()?.dirty_through(lba, blocks)
    }

    async fn broken(&self, seg: u64, gen: u64) -> Result<(), BlockError> {
        let Some(link) = self.0.upgrade() else { return Err(BlockError::Unsupported("the shared cache is closed")) };
        tracing::error!(
            segment = seg,
            generation = gen,
            "the SG broke this gateway's token: writes made under it and not yet shipped will be refused"
        );
        if let Some(cache) = link.cache.get() {
            let (lba, blocks) = link.blocks_of(seg);
            cache.forget(lba, blocks);
        }
        link.quarantine(seg, gen);
        link.quarantine_done(std::iter::once(seg)).await;
        // A group planned before the writes left the log may carry them still, and one that has
        // to be encoded again would carry them under the token the segment has then: the SG
        // refuses this gateway's writes to the segment only until it hears of the break.
        match link.cache.get() {
            Some(cache) => cache.groups_ended().await,
            None => Ok(()),
        }
    }
}

/// A cache of a shared LUN: a block device whose commands run under tokens.
pub struct SharedCache {
    link: Arc<Link>,
    geometry: Geometry,
}

impl std::fmt::Debug for SharedCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SharedCache").field("segment_bytes", &self.link.segment_bytes).finish_non_exhaustive()
    }
}

impl SharedCache {
    /// Opens the cache on `log` for `remote`, a LUN of a stics SG that hands out tokens (its
    /// LINK STATUS names the segment), and starts the token driver under the log's identity;
    /// writes under tokens the SG breaks go to files in `quarantine_dir`.
    pub async fn open(
        log: Arc<dyn BlockDev>,
        remote: Arc<dyn BlockDev>,
        remote_id: &[u8],
        cfg: Config,
        tokens: DriverConfig,
        quarantine_dir: PathBuf,
    ) -> Result<SharedCache, SharedError> {
        let sink = remote.group_sink().ok_or_else(|| SharedError::Status("the remote is no stics SG".into()))?;
        let status = sink.link_status(0).await.map_err(|e| SharedError::Status(e.to_string()))?;
        let status = stics_link::status::Status::decode(&status).map_err(|e| SharedError::Status(e.to_string()))?;
        if status.segment_bytes == 0 {
            return Err(SharedError::Status("the SG hands out no tokens (it is older than this gateway)".into()));
        }
        // Past its lease the SG may give a silent gateway's shared tokens to others: a longer
        // lease here would serve reads from tokens that are gone.
        let mut tokens = tokens;
        let sg_lease = Duration::from_millis(status.lease_ms);
        if !sg_lease.is_zero() && sg_lease < tokens.lease {
            tracing::info!(
                "the SG's lease is {:.1} s, shorter than the {:.1} s configured: using the SG's",
                sg_lease.as_secs_f64(),
                tokens.lease.as_secs_f64()
            );
            tokens.lease = sg_lease;
        }
        tokens.early_release = status.features & stics_link::status::FEATURE_RELEASE_AFTER != 0;
        tokens.grant_data &= status.features & stics_link::status::FEATURE_GRANT_DATA != 0;
        let geometry = remote.geometry();
        let seg_blocks = stics_coherence::seg_blocks(status.segment_bytes, geometry.block_size)?;
        let link = Arc::new(Link {
            cache: OnceLock::new(),
            driver: OnceLock::new(),
            segment_bytes: status.segment_bytes,
            seg_blocks,
            block_size: geometry.block_size,
            quarantine_dir,
            quarantining: Mutex::new(BTreeSet::new()),
            cleared: tokio::sync::Notify::new(),
            quarantined: Mutex::new(Vec::new()),
        });
        let fence = Arc::new(Fence(Arc::downgrade(&link)));
        let cache = Cache::open_shared(log, Arc::clone(&remote), remote_id, cfg, fence).await?;
        let source = cache.log_uuid();
        let _ = link.cache.set(Arc::new(cache));
        let driver = Driver::start(remote, source, Arc::new(Keeper(Arc::downgrade(&link))), tokens);
        let _ = link.driver.set(driver);
        Ok(SharedCache { link, geometry })
    }

    fn open_cache(&self) -> Result<&Cache, BlockError> {
        self.link.cache.get().map(AsRef::as_ref).ok_or(BlockError::Unsupported("the shared cache is not open"))
    }

    /// Runs `run` on the cache holding `kind` on every segment of `lba..lba + blocks`; a read
    /// asks for its blocks with the shared tokens it waits for.
    async fn under<T, F>(&self, lba: u64, blocks: u64, kind: Kind, run: F) -> Result<T, BlockError>
    where
        F: std::future::Future<Output = Result<T, BlockError>>,
    {
        self.geometry.check_range(lba, blocks)?;
        let driver = self.link.driver.get().ok_or(BlockError::Unsupported("the shared cache is not open"))?;
        let need: Vec<(u64, Kind)> =
            stics_coherence::segments(lba, blocks, self.link.seg_blocks).map(|s| (s, kind)).collect();
        self.link.quarantine_done(need.iter().map(|&(s, _)| s)).await;
        let reads: Vec<(u64, u32, u32)> = if kind == Kind::Shared {
            let end = lba + blocks;
            need.iter()
                .filter_map(|&(s, _)| {
                    let (start, seg_blocks) = self.link.blocks_of(s);
                    let (from, to) = (lba.max(start), end.min(start + seg_blocks));
                    Some((s, u32::try_from(from - start).ok()?, u32::try_from(to - from).ok()?))
                })
                .collect()
        } else {
            Vec::new()
        };
        let op = driver.begin_reading(&need, &reads).await;
        if !op.valid() {
            return Err(BlockError::Busy(
                "this gateway's tokens lapsed (the SG has not answered within the lease): try again".into(),
            ));
        }
        let r = run.await;
        drop(op);
        r
    }

    /// `lba..lba + blocks` cut at segment boundaries into runs of at most [`MAX_OP_SEGMENTS`].
    fn pieces(&self, lba: u64, blocks: u64) -> Result<Vec<(u64, u64)>, BlockError> {
        self.geometry.check_range(lba, blocks)?;
        let span = MAX_OP_SEGMENTS * self.link.seg_blocks;
        let mut out = Vec::new();
        let (mut at, end) = (lba, lba + blocks);
        while at < end {
            let next = ((at / span + 1) * span).min(end);
            out.push((at, next - at));
            at = next;
        }
        Ok(out)
    }

    /// The quarantine files written since the gateway started.
    pub fn quarantined(&self) -> Vec<Quarantined> {
        lock(&self.link.quarantined).clone()
    }

    /// Tokens held and what they cost.
    pub fn token_stats(&self) -> stics_coherence::driver::TokenStats {
        self.link.driver.get().map(Driver::stats).unwrap_or_default()
    }

    /// Tokens held, by kind (shared, exclusive).
    pub fn tokens_held(&self) -> (usize, usize) {
        self.link.driver.get().map_or((0, 0), Driver::held)
    }

    /// The cache under the tokens.
    pub fn inner(&self) -> Option<&Cache> {
        self.link.cache.get().map(AsRef::as_ref)
    }

    /// The cache under the tokens, shared (for status, drain and metrics).
    pub fn cache(&self) -> Option<Arc<Cache>> {
        self.link.cache.get().cloned()
    }

    /// Stops the cache (see [`Cache::close`]); its tokens stay with the SG until the gateway
    /// comes back or they are broken.
    pub async fn close(&self) {
        if let Some(c) = self.link.cache.get() {
            c.close().await;
        }
    }
}

#[async_trait]
impl BlockDev for SharedCache {
    fn geometry(&self) -> Geometry {
        self.geometry
    }

    fn volatile_cache(&self) -> bool {
        self.link.cache.get().is_some_and(|c| c.volatile_cache())
    }

    fn supports_discard(&self) -> bool {
        true
    }

    async fn read(&self, lba: u64, blocks: u32) -> Result<Bytes, BlockError> {
        let cache = self.open_cache()?;
        self.under(lba, u64::from(blocks), Kind::Shared, cache.read(lba, blocks)).await
    }

    async fn write(&self, lba: u64, data: Bytes, fua: bool) -> Result<(), BlockError> {
        let cache = self.open_cache()?;
        let blocks = stics_block::blocks_in(&data, self.geometry.block_size)?;
        self.under(lba, blocks, Kind::Exclusive, cache.write(lba, data, fua)).await
    }

    async fn flush(&self) -> Result<(), BlockError> {
        // Makes this gateway's own writes durable in its log: no token is needed.
        self.open_cache()?.flush().await
    }

    async fn write_zeros(&self, lba: u64, blocks: u64) -> Result<(), BlockError> {
        let cache = self.open_cache()?;
        for (lba, blocks) in self.pieces(lba, blocks)? {
            self.under(lba, blocks, Kind::Exclusive, cache.write_zeros(lba, blocks)).await?;
        }
        Ok(())
    }

    async fn discard(&self, lba: u64, blocks: u64) -> Result<(), BlockError> {
        let cache = self.open_cache()?;
        for (lba, blocks) in self.pieces(lba, blocks)? {
            self.under(lba, blocks, Kind::Exclusive, cache.discard(lba, blocks)).await?;
        }
        Ok(())
    }
}
