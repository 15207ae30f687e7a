//! `JournalDev`, the tokio driver around [`crate::core::Core`]: commits groups (one at a time:
//! record written and the journal flushed before the answer), applies them to the medium in the
//! background (then flushes the medium and writes the checkpoint), serves reads from the newest
//! committed group or the medium, and holds plain writes back until no committed group still has
//! to write their blocks. It hosts the lock server of the gateways that share the LUN, whose every
//! change is a tokens record in the same ring, durable before what the change said is sent.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use bytes::{Bytes, BytesMut};
use stics_block::{BlockDev, BlockError, Geometry, GroupSink};
use stics_link::group::{self, ExtentKind};
use stics_link::status::{SourceState, Status};
use stics_link::token;
use tokio::sync::Notify;

use crate::core::{Core, Piece, Take};
use crate::format::{RecordHeader, RecordKind, Superblock, TokenRecord, BLOCK, RING_START};
use crate::tokens::{Step, TokenStatus, TokenTable, Tokens, Wanted, SNAPSHOT_BYTES_PER_SEGMENT};
use crate::{JournalError, Result};

/// How a journal runs.
#[derive(Debug, Clone)]
pub struct JournalConfig {
    /// The largest encoded group taken (announced to gateways in LINK STATUS).
    pub max_group: u32,
    /// Pause before applying a group again after the medium failed.
    pub retry_delay: Duration,
    /// How the lock server of the gateways that share the LUN treats silent ones.
    pub tokens: stics_coherence::Policy,
    /// The segment its tokens cover, announced in LINK STATUS (32 to 256 KiB).
    pub segment_bytes: u32,
}

impl Default for JournalConfig {
    fn default() -> Self {
        JournalConfig {
            max_group: 64 << 20,
            retry_delay: Duration::from_millis(200),
            tokens: stics_coherence::Policy::default(),
            segment_bytes: 64 << 10,
        }
    }
}

/// What the journal has done, for `/status` and `/metrics`.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct JournalStatus {
    /// Groups committed, and their bytes: encoded (as shipped) and raw (the data they carry).
    pub groups_committed: u64,
    pub group_bytes: u64,
    pub group_raw_bytes: u64,
    /// Groups sent again after a lost answer, taken without effect.
    pub groups_again: u64,
    /// Groups applied to the medium.
    pub groups_applied: u64,
    /// Groups committed and not on the medium yet.
    pub groups_unapplied: u64,
    /// Journal bytes in use, and its size.
    pub journal_used: u64,
    pub journal_bytes: u64,
    /// Age of the oldest group not on the medium yet, seconds.
    pub apply_lag_secs: f64,
    /// Times applying a group to the medium failed (it is tried again).
    pub apply_failures: u64,
    /// Blocks reads took from groups not on the medium yet (held in memory until applied), and
    /// from the medium: how much of what the SG serves skips its disk.
    pub blocks_read_journal: u64,
    pub blocks_read_medium: u64,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn dev_err(what: &'static str) -> impl FnOnce(BlockError) -> JournalError {
    move |source| JournalError::Device { what, source }
}

/// Longest a group that came before its predecessor waits for it to be taken (a gateway with
/// two groups out sends them on one connection, so the first is seldom far behind).
pub const AHEAD_WAIT: Duration = Duration::from_secs(10);

struct Inner {
    core: Mutex<Core>,
    medium: Arc<dyn BlockDev>,
    journal: Arc<dyn BlockDev>,
    cfg: JournalConfig,
    sb: Mutex<Superblock>,
    /// One record at a time: groups and token changes go to the ring in sequence.
    turn: tokio::sync::Mutex<()>,
    /// One checkpoint write at a time, so that an older one never lands over a newer.
    ckpt: tokio::sync::Mutex<()>,
    /// The lock server of the gateways that share the LUN.
    tokens: Tokens,
    /// The latest status read with each fence (a source's folded UUID), by the fence clock: a
    /// commit that arrived before it is refused.
    fences: Mutex<std::collections::HashMap<u64, u64>>,
    /// Counts status reads with a fence.
    fence_clock: std::sync::atomic::AtomicU64,
    /// Ring space came free, or a group reached the medium.
    progress: Notify,
    /// A group was committed.
    committed: Notify,
    /// A commit ended, taken or not: a group that came before its predecessor looks again.
    outcomes: Notify,
    /// Each source's newest group whose commit failed here, and when (until it is tried
    /// again): the group behind it, waiting for it since before then, fails at once.
    failed: Mutex<std::collections::HashMap<[u8; 16], (u64, Instant)>>,
    stats: Mutex<JournalStatus>,
    /// Blocks reads took from the medium and from groups not on it yet: counted on every read,
    /// so kept apart from `stats` and its lock.
    blocks_read_medium: AtomicU64,
    blocks_read_journal: AtomicU64,
    /// When each unapplied group was committed, oldest first.
    pending_since: Mutex<std::collections::VecDeque<Instant>>,
    stopping: AtomicBool,
}

/// The SG's device: a medium, a journal of committed groups over it.
pub struct JournalDev {
    inner: Arc<Inner>,
    task: Mutex<Option<tokio::task::JoinHandle<()>>>,
    /// The lock server's tick.
    ticker: tokio::task::JoinHandle<()>,
}

impl std::fmt::Debug for JournalDev {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JournalDev").field("geometry", &self.inner.medium.geometry()).finish_non_exhaustive()
    }
}

async fn read_at(dev: &dyn BlockDev, off: u64, len: usize) -> std::result::Result<Bytes, BlockError> {
    stics_block::range::read_at(dev, off, len).await
}

/// Writes whole journal blocks at byte offset `off`, then flushes the journal.
async fn write_durable(dev: &dyn BlockDev, off: u64, data: Bytes) -> std::result::Result<(), BlockError> {
    let bs = u64::from(dev.geometry().block_size);
    dev.write(off / bs, data, false).await?;
    dev.flush().await
}

impl JournalDev {
    /// Opens (or formats, when it holds nothing) the journal on `journal` for `medium`, replays
    /// what it holds and starts applying it.
    pub async fn open(journal: Arc<dyn BlockDev>, medium: Arc<dyn BlockDev>, cfg: JournalConfig) -> Result<JournalDev> {
        let g = medium.geometry();
        let device_bytes = journal.geometry().bytes() / BLOCK * BLOCK;
        let head = read_at(journal.as_ref(), 0, 2 * BLOCK as usize).await.map_err(dev_err("journal"))?;
        let (a, b) = head.split_at(BLOCK as usize);
        let sb = match Superblock::choose(a, b) {
            Ok(sb) => sb,
            Err(JournalError::Magic) if head.iter().all(|x| *x == 0) => {
                format(journal.as_ref(), device_bytes, g).await?
            }
            Err(e) => return Err(e),
        };
        if sb.medium_blocks != g.num_blocks || sb.block_size != g.block_size {
            return Err(JournalError::WrongMedium {
                found_blocks: sb.medium_blocks,
                found_bs: sb.block_size,
                blocks: g.num_blocks,
                bs: g.block_size,
            });
        }
        if sb.journal_bytes > device_bytes {
            return Err(JournalError::Format { field: "journal_bytes", why: "larger than the device".into() });
        }
        // Two of the largest groups fit the ring (with their record headers), so that one
        // waits for room only behind one being applied, never for ever.
        let mut cfg = cfg;
        let ring_half =
            (sb.journal_bytes.saturating_sub(RING_START) / 2).saturating_sub(BLOCK).min(u64::from(u32::MAX)) as u32;
        if cfg.max_group > ring_half {
            tracing::info!(
                max_group = ring_half,
                "groups are kept to half the journal: give the journal more room for larger ones"
            );
            cfg.max_group = ring_half;
        }
        // A group may expand to many times its encoding; the bound keeps a corrupt one from
        // asking for more memory than a group could ever need.
        let max_raw = u64::from(cfg.max_group).saturating_mul(64).max(1 << 30);
        let mut core = Core::new(
            sb.uuid,
            sb.journal_bytes,
            g.block_size,
            g.num_blocks,
            (sb.head_offset, sb.head_seq),
            &sb.sources,
            max_raw,
        );
        let (replayed, table) = scan(journal.as_ref(), &sb, &mut core).await?;
        if replayed > 0 {
            tracing::info!(records = replayed, "replayed the journal: its groups go to the medium again");
        }
        if !table.is_empty() {
            tracing::info!(
                segments = table.entries.len(),
                gateways = table.gateways.len(),
                "the lock server's table is back from the journal"
            );
        }
        let tokens = Tokens::restore(cfg.tokens, cfg.segment_bytes, table, Instant::now())
            .map_err(|why| JournalError::Format { field: "tokens", why })?;
        // A whole copy of the table fits a sixteenth of the ring.
        let ring = sb.journal_bytes - RING_START;
        let tokens = tokens.with_max_segments((ring / 16 / SNAPSHOT_BYTES_PER_SEGMENT) as usize);
        let inner = Arc::new(Inner {
            stats: Mutex::new(JournalStatus { journal_bytes: sb.journal_bytes - RING_START, ..Default::default() }),
            blocks_read_medium: AtomicU64::new(0),
            blocks_read_journal: AtomicU64::new(0),
            pending_since: Mutex::new(std::iter::repeat_n(Instant::now(), core.unapplied()).collect()),
            core: Mutex::new(core),
            medium,
            journal,
            cfg,
            sb: Mutex::new(sb),
            turn: tokio::sync::Mutex::new(()),
            ckpt: tokio::sync::Mutex::new(()),
            tokens,
            fences: Mutex::new(std::collections::HashMap::new()),
            fence_clock: std::sync::atomic::AtomicU64::new(0),
            progress: Notify::new(),
            committed: Notify::new(),
            outcomes: Notify::new(),
            failed: Mutex::new(std::collections::HashMap::new()),
            stopping: AtomicBool::new(false),
        });
        let ticker = tokio::spawn(tick(Arc::downgrade(&inner)));
        let task = tokio::spawn(applier(Arc::clone(&inner)));
        Ok(JournalDev { inner, task: Mutex::new(Some(task)), ticker })
    }

    /// What the journal has done.
    pub fn status(&self) -> JournalStatus {
        let c = lock(&self.inner.core);
        let mut s = lock(&self.inner.stats).clone();
        s.blocks_read_medium = self.inner.blocks_read_medium.load(Ordering::Relaxed);
        s.blocks_read_journal = self.inner.blocks_read_journal.load(Ordering::Relaxed);
        s.journal_used = c.fill().0;
        s.groups_unapplied = c.unapplied() as u64;
        s.apply_lag_secs = lock(&self.inner.pending_since).front().map_or(0.0, |t| t.elapsed().as_secs_f64());
        s
    }

    /// The lock server's counters and what waits for whom.
    pub fn token_status(&self) -> TokenStatus {
        self.inner.tokens.status(Instant::now())
    }

    /// An operator breaks `seg`'s tokens that someone waits for (see `Tokens::break_segment`).
    /// An error says the break is made but not yet durable (it is written again within a second).
    pub async fn break_segment(&self, seg: u64) -> std::result::Result<Vec<(String, String, u64)>, BlockError> {
        let _turn = self.inner.turn.lock().await;
        let (step, broke) = self.inner.tokens.break_segment(seg);
        persist(&self.inner, step).await?;
        Ok(broke)
    }

    /// Waits until every committed group is on the medium (the medium alone is then the truth).
    pub async fn settle(&self) {
        loop {
            let notified = self.inner.progress.notified();
            if lock(&self.inner.core).unapplied() == 0 {
                return;
            }
            let _ = tokio::time::timeout(Duration::from_millis(100), notified).await;
        }
    }

    /// Stops applying; what is committed stays in the journal for the next open.
    pub async fn close(&self) {
        self.inner.stopping.store(true, Ordering::Release);
        self.inner.committed.notify_one();
        let task = lock(&self.task).take();
        if let Some(t) = task {
            let _ = tokio::time::timeout(Duration::from_secs(5), t).await;
        }
    }

    /// Holds a plain write back until no committed group still has to write its blocks.
    async fn clear_of_groups(&self, lba: u64, blocks: u64) {
        loop {
            let notified = self.inner.progress.notified();
            if !lock(&self.inner.core).overlaps(lba, blocks) {
                return;
            }
            let _ = tokio::time::timeout(Duration::from_millis(50), notified).await;
        }
    }
}

/// Lets the lock server break what its policy allows, once a second, while the journal exists;
/// writes the table whole again when a change failed to become durable or its last copy holds
/// back the ring.
async fn tick(inner: std::sync::Weak<Inner>) {
    let mut every = tokio::time::interval(Duration::from_secs(1));
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        every.tick().await;
        let Some(inner) = inner.upgrade() else { return };
        let _turn = inner.turn.lock().await;
        let step = inner.tokens.tick(Instant::now());
        if let Err(e) = persist(&inner, step).await {
            tracing::warn!("writing the lock server's table to the journal failed, retrying: {e}");
        }
    }
}

/// Makes a step of the lock server durable (what changed, or the whole table when due), then
/// sends what it said; the caller holds the turn. On an error what it said waits for the next
/// whole copy, which the tick writes.
async fn persist(inner: &Inner, step: Step) -> std::result::Result<(), BlockError> {
    let Step { outs, record } = step;
    let copy = inner.tokens.must_copy() || {
        let c = lock(&inner.core);
        c.snapshot_due() || (!record.is_empty() && c.wants_snapshot(record.encoded_len() as u64))
    };
    if !copy && record.is_empty() {
        inner.tokens.deliver(outs, false);
        return Ok(());
    }
    let record = if copy { inner.tokens.copy() } else { record };
    match write_tokens(inner, &record).await {
        Ok(()) => {
            inner.tokens.deliver(outs, copy);
            Ok(())
        }
        Err(e) => {
            inner.tokens.failed(outs);
            Err(e)
        }
    }
}

/// Writes a tokens record; a whole copy lets the ring's head move on to it at once.
async fn write_tokens(inner: &Inner, record: &TokenRecord) -> std::result::Result<(), BlockError> {
    let (seq, at, len) = write_record(inner, RecordKind::Tokens, &record.encode(), record.snapshot).await?;
    lock(&inner.core).tokens_committed(seq, at, len, record.snapshot);
    if record.snapshot {
        checkpoint(inner).await;
        inner.progress.notify_waiters();
    }
    Ok(())
}

/// Places a record holding `body` in the ring (waiting for room behind the applier) and makes
/// it durable; the caller holds the turn. Returns its number, place and length.
///
/// Every record but a `copy` of the token table leaves room behind it for one: when the ring is
/// full and the table's last copy is what holds its head back, a new copy always fits, and lets
/// the head move on.
async fn write_record(
    inner: &Inner,
    kind: RecordKind,
    body: &[u8],
    copy: bool,
) -> std::result::Result<(u64, u64, u64), BlockError> {
    let len = BLOCK + (body.len() as u64).div_ceil(BLOCK) * BLOCK;
    if lock(&inner.core).too_large(len) {
        return Err(refused(format!("a record of {} bytes does not fit a journal of this size", body.len())));
    }
    let (at, seq, uuid) = loop {
        let notified = inner.progress.notified();
        let (placed, due) = {
            let c = lock(&inner.core);
            let keep =
                if copy || !c.has_snapshot() { 0 } else { BLOCK + inner.tokens.copy_len().div_ceil(BLOCK) * BLOCK };
            (c.place(len + keep).map(|at| (at, c.next_seq(), c.uuid())), !copy && c.snapshot_due())
        };
        if let Some(p) = placed {
            break p;
        }
        if due {
            let record = inner.tokens.copy();
            if let Err(e) = Box::pin(write_tokens(inner, &record)).await {
                // The copy took what changed: the next record is a whole copy again.
                inner.tokens.failed(Vec::new());
                return Err(e);
            }
            continue;
        }
        // The ring is full of groups not yet on the medium: wait for the applier.
        let _ = tokio::time::timeout(Duration::from_millis(100), notified).await;
    };
    let header =
        RecordHeader { uuid, seq, offset: at, group_len: body.len() as u64, group_crc: crc32c::crc32c(body), kind };
    write_durable(inner.journal.as_ref(), at, Bytes::from(header.encode_record(body))).await?;
    Ok((seq, at, len))
}

impl Drop for JournalDev {
    fn drop(&mut self) {
        self.ticker.abort();
        self.inner.stopping.store(true, Ordering::Release);
        if let Some(t) = lock(&self.task).take() {
            t.abort();
        }
    }
}

/// Writes a new journal's superblock, both copies.
async fn format(journal: &dyn BlockDev, device_bytes: u64, g: Geometry) -> Result<Superblock> {
    if device_bytes < RING_START + 2 * BLOCK {
        return Err(JournalError::Format { field: "journal_bytes", why: format!("{device_bytes} bytes is too small") });
    }
    let mut sb = Superblock {
        uuid: rand::random(),
        generation: 1,
        journal_bytes: device_bytes,
        medium_blocks: g.num_blocks,
        block_size: g.block_size,
        head_offset: RING_START,
        head_seq: 1,
        sources: Vec::new(),
    };
    for _ in 0..2 {
        sb.generation += 1;
        write_durable(journal, sb.copy_offset(), Bytes::from(sb.encode())).await.map_err(dev_err("journal"))?;
    }
    tracing::info!(bytes = device_bytes, "formatted a new journal");
    Ok(sb)
}

/// Follows the chain of records from the checkpoint and commits each again in the core;
/// returns how many, and the lock server's table as its records left it. A record that is
/// absent or damaged ends the chain: it was being written when the SG stopped and never
/// answered.
async fn scan(journal: &dyn BlockDev, sb: &Superblock, core: &mut Core) -> Result<(usize, TokenTable)> {
    let mut n = 0;
    let mut table = TokenTable::default();
    let mut at = sb.head_offset;
    loop {
        let seq = core.next_seq();
        let mut found = None;
        for place in [at, RING_START] {
            if place + BLOCK > sb.journal_bytes {
                continue;
            }
            let hb = read_at(journal, place, BLOCK as usize).await.map_err(dev_err("journal"))?;
            let Ok(h) = RecordHeader::decode(&hb) else { continue };
            if h.uuid != sb.uuid || h.seq != seq || h.offset != place || place + h.record_len() > sb.journal_bytes {
                continue;
            }
            let g = read_at(journal, place + BLOCK, h.group_len as usize).await.map_err(dev_err("journal"))?;
            if crc32c::crc32c(&g) != h.group_crc {
                continue;
            }
            found = Some((h, g));
            break;
        }
        let Some((h, g)) = found else { return Ok((n, table)) };
        match h.kind {
            RecordKind::Group => {
                let Ok(Take::New(checked)) = core.check(&g, true) else { return Ok((n, table)) };
                core.committed(seq, h.offset, h.record_len(), checked, &g);
            }
            RecordKind::Tokens => {
                let r = match TokenRecord::decode(&g) {
                    Ok(r) => r,
                    Err(e) => {
                        tracing::warn!(record = seq, "a tokens record whose checksum holds does not decode: {e}");
                        return Ok((n, table));
                    }
                };
                core.tokens_committed(seq, h.offset, h.record_len(), r.snapshot);
                table.apply(r);
            }
        }
        at = h.offset + h.record_len();
        n += 1;
    }
}

/// Applies committed groups to the medium in order, one at a time: every extent, a flush of the
/// medium, then the checkpoint that frees its record.
async fn applier(inner: Arc<Inner>) {
    loop {
        if inner.stopping.load(Ordering::Acquire) {
            return;
        }
        let notified = inner.committed.notified();
        let next = lock(&inner.core).next_apply();
        let Some(a) = next else {
            let _ = tokio::time::timeout(Duration::from_millis(200), notified).await;
            continue;
        };
        match apply(&inner, &a).await {
            Ok(()) => {
                lock(&inner.core).applied(a.seq);
                lock(&inner.pending_since).pop_front();
                lock(&inner.stats).groups_applied += 1;
                checkpoint(&inner).await;
                inner.progress.notify_waiters();
            }
            Err(e) => {
                tracing::warn!(group = a.seq, "applying a group to the medium failed, retrying: {e}");
                lock(&inner.core).apply_failed();
                lock(&inner.stats).apply_failures += 1;
                tokio::time::sleep(inner.cfg.retry_delay).await;
            }
        }
    }
}

/// Writes one group's extents to the medium and flushes it.
async fn apply(inner: &Inner, a: &crate::core::Apply) -> std::result::Result<(), BlockError> {
    let m = inner.medium.as_ref();
    let bs = u64::from(m.geometry().block_size);
    let per = ((1u64 << 20) / bs).max(1);
    for (e, raw) in &a.placed {
        let (lba, blocks) = (e.lba, u64::from(e.blocks));
        match (e.kind, raw) {
            (ExtentKind::Data, Some(raw)) => {
                let mut done = 0;
                while done < blocks {
                    let n = (blocks - done).min(per);
                    let bytes = group::read_raw(&a.data.chunks, &a.data.payload, raw + done * bs, (n * bs) as usize)
                        .map_err(|e| BlockError::Io { lba, source: std::io::Error::other(e.to_string()) })?;
                    m.write(lba + done, Bytes::from(bytes), false).await?;
                    done += n;
                }
            }
            (ExtentKind::Discard, _) if m.supports_discard() => m.discard(lba, blocks).await?,
            _ => m.write_zeros(lba, blocks).await?,
        }
    }
    m.flush().await
}

/// Writes the checkpoint (retrying the same bytes at the same place until it is durable), then
/// lets the core reuse the space of the records it leaves behind.
async fn checkpoint(inner: &Inner) {
    let _one = inner.ckpt.lock().await;
    let (offset, bytes, head_seq) = {
        let (head_offset, head_seq, sources) = lock(&inner.core).checkpoint();
        let mut sb = lock(&inner.sb);
        sb.generation += 1;
        sb.head_offset = head_offset;
        sb.head_seq = head_seq;
        sb.sources = sources;
        (sb.copy_offset(), Bytes::from(sb.encode()), head_seq)
    };
    loop {
        match write_durable(inner.journal.as_ref(), offset, bytes.clone()).await {
            Ok(()) => break,
            Err(e) => {
                tracing::warn!("writing the journal's checkpoint failed, retrying: {e}");
                tokio::time::sleep(inner.cfg.retry_delay).await;
            }
        }
    }
    lock(&inner.core).checkpoint_durable(head_seq);
}

impl JournalDev {
    /// A commit under the turn, after the group before it in its source's sequence was taken
    /// (it waits for that one, up to [`AHEAD_WAIT`], and fails with it).
    async fn commit_in_turn(
        &self,
        group: Bytes,
        head: Option<&group::GroupHead>,
        mark: u64,
    ) -> std::result::Result<(), BlockError> {
        let inner = &self.inner;
        if group.len() as u64 > u64::from(inner.cfg.max_group) {
            return Err(refused(format!(
                "a group of {} bytes; at most {} are taken",
                group.len(),
                inner.cfg.max_group
            )));
        }
        let fence = head.map_or(0, |h| stics_link::fence_of(&h.source));
        let (since, until) = (Instant::now(), tokio::time::Instant::now() + AHEAD_WAIT);
        let (_turn, checked) = loop {
            let news = inner.outcomes.notified();
            tokio::pin!(news);
            news.as_mut().enable();
            let turn = inner.turn.lock().await;
            if lock(&inner.fences).get(&fence).is_some_and(|&at| at > mark) {
                return Err(refused(
                    "the gateway read the status while this commit waited (it restarted): a group of its previous run does not land after that".into(),
                ));
            }
            let take = lock(&inner.core).check(&group, false);
            match take {
                Ok(Take::Again) => {
                    lock(&inner.stats).groups_again += 1;
                    return Ok(());
                }
                Ok(Take::New(c)) => break (turn, c),
                Err(e @ JournalError::Ahead { missing, .. }) => {
                    drop(turn);
                    let gone = head.is_some_and(|h| {
                        lock(&inner.failed).get(&h.source).is_some_and(|&(seq, at)| seq == missing && at >= since)
                    });
                    if gone || tokio::time::timeout_at(until, news).await.is_err() {
                        return Err(refused(format!("{e}: it failed or did not come")));
                    }
                }
                Err(e) => return Err(refused(e.to_string())),
            }
        };
        // The fence: a write lands only under the token it was made under.
        inner.tokens.admit(&checked.head.source, checked.fences.as_ref(), |b| checked.segments(b))?;
        let (seq, at, len) = write_record(inner, RecordKind::Group, &group, false).await?;
        let (raw, encoded) = (checked.raw_len, checked.encoded_len);
        let (source, last_epoch) = (checked.head.source, checked.head.last_epoch);
        lock(&inner.core).committed(seq, at, len, checked, &group);
        lock(&inner.pending_since).push_back(Instant::now());
        {
            let mut s = lock(&inner.stats);
            s.groups_committed += 1;
            s.group_bytes += encoded;
            s.group_raw_bytes += raw;
        }
        inner.committed.notify_one();
        tracing::trace!(seq, last_epoch, "group committed");
        // Releases that waited for these epochs take effect; the group is durable whatever
        // becomes of their record (what they said then waits for the next whole copy).
        if let Some(step) = inner.tokens.committed(&source, last_epoch, Instant::now()) {
            if let Err(e) = persist(inner, step).await {
                tracing::warn!("the token table's record after a group failed: {e}");
            }
        }
        Ok(())
    }
}

#[async_trait]
impl GroupSink for JournalDev {
    fn max_group(&self) -> u32 {
        self.inner.cfg.max_group
    }

    async fn commit(&self, group: Bytes) -> std::result::Result<(), BlockError> {
        self.commit_marked(group, self.fence_mark()).await
    }

    fn fence_mark(&self) -> u64 {
        self.inner.fence_clock.load(std::sync::atomic::Ordering::SeqCst)
    }

    fn groups_in_flight(&self) -> u32 {
        stics_link::status::GROUPS_IN_FLIGHT
    }

    async fn commit_marked(&self, group: Bytes, mark: u64) -> std::result::Result<(), BlockError> {
        let head = stics_link::group::peek(&group).ok();
        if let Some(h) = &head {
            let mut failed = lock(&self.inner.failed);
            if failed.get(&h.source).is_some_and(|(seq, _)| *seq == h.seq) {
                failed.remove(&h.source);
            }
        }
        let r = self.commit_in_turn(group, head.as_ref(), mark).await;
        if let (Err(_), Some(h)) = (&r, &head) {
            let mut failed = lock(&self.inner.failed);
            // Only a group that waits for its predecessor looks here, and none waits longer than
            // `AHEAD_WAIT`: older failures are forgotten, so sources that come and go leave
            // nothing behind.
            failed.retain(|_, (_, at)| at.elapsed() <= AHEAD_WAIT);
            failed.insert(h.source, (h.seq, Instant::now()));
        }
        self.inner.outcomes.notify_waiters();
        r
    }
    async fn tokens(&self, exchange: Bytes, new_connection: bool) -> std::result::Result<(), BlockError> {
        let _turn = self.inner.turn.lock().await;
        let step = self.inner.tokens.exchange(&exchange, new_connection, Instant::now(), |source| {
            lock(&self.inner.core).committed_epoch(source)
        })?;
        persist(&self.inner, step).await
    }

    async fn token_poll(
        &self,
        gateway: u64,
        from: u32,
        wait: Duration,
        max: usize,
    ) -> std::result::Result<Bytes, BlockError> {
        // Bounded so that a poll never outlasts an initiator's patience with one command.
        let polled = self.inner.tokens.poll(gateway, from, wait.min(Duration::from_secs(5)), max).await;
        let data = self.grant_data(&polled.wanted, max.saturating_sub(token::answer_len(polled.msgs.len()))).await;
        Ok(Bytes::from(token::encode_answer_data(polled.first, &polled.msgs, &data)))
    }

    async fn link_status(&self, fence: u64) -> std::result::Result<Bytes, BlockError> {
        if fence != 0 {
            let at = self.inner.fence_clock.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1;
            lock(&self.inner.fences).insert(fence, at);
        }
        // After any commit under way: a gateway reads the status to learn what it may retire.
        let _turn = self.inner.turn.lock().await;
        let c = lock(&self.inner.core);
        let (used, size) = c.fill();
        let sources = c
            .sources()
            .map(|(source, s)| SourceState {
                source: *source,
                committed_seq: s.committed_seq,
                committed_epoch: s.committed_epoch,
                applied_seq: s.applied_seq,
            })
            .collect();
        let st = Status {
            version: stics_link::LINK_VERSION,
            max_group: self.inner.cfg.max_group,
            journal_bytes: size,
            journal_used: used,
            segment_bytes: self.inner.cfg.segment_bytes,
            sources,
            lease_ms: u64::try_from(self.inner.cfg.tokens.lease.as_millis()).unwrap_or(u64::MAX).max(1),
            // Its LINK COMMIT waits for pieces still on their way: the stics target's staging
            // (stics-scsi) is what serves a journal; a commit waits for its predecessor here.
            features: stics_link::status::FEATURE_RELEASE_AFTER
                | stics_link::status::FEATURE_COMMIT_WAITS
                | stics_link::status::FEATURE_IN_ORDER
                | stics_link::status::FEATURE_GRANT_DATA,
        };
        Ok(Bytes::from(st.encode()))
    }
}

/// Most bytes of blocks one poll answer carries with its grants (a gateway asks for 256 KiB).
const MAX_GRANT_DATA: usize = 1 << 20;

impl JournalDev {
    /// The blocks readers want with their shared grants, as this SG holds them now, as many as
    /// fit in `room` bytes; the rest read after their grants. Read after the grant was decided:
    /// no gateway writes the segment while the reader's shared token stands, and none held it
    /// exclusive when it was granted.
    async fn grant_data(&self, wanted: &[Wanted], room: usize) -> Vec<token::GrantData> {
        let Ok(seg_blocks) = stics_coherence::seg_blocks(self.inner.cfg.segment_bytes, self.geometry().block_size)
        else {
            return Vec::new();
        };
        let bs = self.geometry().block_size as usize;
        // Whatever allocation a poll names, one answer's blocks stay within this bound.
        let mut room = room.min(MAX_GRANT_DATA).saturating_sub(token::DATA_HEADER_LEN);
        let mut out = Vec::new();
        for w in wanted {
            let len = w.blocks as usize * bs;
            if u64::from(w.first) + u64::from(w.blocks) > seg_blocks || token::DATA_ITEM_LEN + len > room {
                continue;
            }
            let lba = w.seg.saturating_mul(seg_blocks) + u64::from(w.first);
            match self.read(lba, w.blocks).await {
                Ok(data) => {
                    room -= token::DATA_ITEM_LEN + len;
                    out.push(token::GrantData { seg: w.seg, gen: w.gen, first: w.first, data: data.to_vec() });
                }
                // Its reader reads them after the grant, and meets the error there.
                Err(e) => tracing::debug!(segment = w.seg, "blocks wanted with a grant not read: {e}"),
            }
        }
        self.inner.tokens.sent_with_grants(out.iter().map(|d| (d.data.len() / bs) as u64).sum());
        out
    }
}

fn refused(why: String) -> BlockError {
    BlockError::Rejected(why)
}

#[async_trait]
impl BlockDev for JournalDev {
    fn geometry(&self) -> Geometry {
        self.inner.medium.geometry()
    }

    fn volatile_cache(&self) -> bool {
        self.inner.medium.volatile_cache()
    }

    fn device_id(&self) -> Option<String> {
        self.inner.medium.device_id()
    }

    fn supports_discard(&self) -> bool {
        self.inner.medium.supports_discard()
    }

    fn resets(&self) -> u64 {
        self.inner.medium.resets()
    }

    fn group_sink(&self) -> Option<&dyn GroupSink> {
        Some(self)
    }

    async fn read(&self, lba: u64, blocks: u32) -> std::result::Result<Bytes, BlockError> {
        self.geometry().check_range(lba, u64::from(blocks))?;
        let pieces = lock(&self.inner.core).read(lba, u64::from(blocks));
        let from_medium: u64 =
            pieces.iter().map(|p| if let Piece::Medium { blocks, .. } = p { u64::from(*blocks) } else { 0 }).sum();
        self.inner.blocks_read_medium.fetch_add(from_medium, Ordering::Relaxed);
        self.inner.blocks_read_journal.fetch_add(u64::from(blocks) - from_medium, Ordering::Relaxed);
        if let [Piece::Medium { lba, blocks }] = pieces.as_slice() {
            return self.inner.medium.read(*lba, *blocks).await;
        }
        let bs = self.geometry().block_size as usize;
        let mut out = BytesMut::with_capacity(blocks as usize * bs);
        for p in pieces {
            match p {
                Piece::Medium { lba, blocks } => out.extend_from_slice(&self.inner.medium.read(lba, blocks).await?),
                Piece::Zero { blocks } => out.resize(out.len() + blocks as usize * bs, 0),
                Piece::Group { data, raw, len } => {
                    let bytes = group::read_raw(&data.chunks, &data.payload, raw, len)
                        .map_err(|e| BlockError::Io { lba, source: std::io::Error::other(e.to_string()) })?;
                    out.extend_from_slice(&bytes);
                }
            }
        }
        Ok(out.freeze())
    }

    async fn write(&self, lba: u64, data: Bytes, fua: bool) -> std::result::Result<(), BlockError> {
        let blocks = stics_block::blocks_in(&data, self.geometry().block_size)?;
        self.geometry().check_range(lba, blocks)?;
        self.inner.tokens.admit_plain(lba, blocks, self.geometry().block_size)?;
        self.clear_of_groups(lba, blocks).await;
        self.inner.medium.write(lba, data, fua).await
    }

    async fn flush(&self) -> std::result::Result<(), BlockError> {
        self.inner.medium.flush().await
    }

    async fn write_zeros(&self, lba: u64, blocks: u64) -> std::result::Result<(), BlockError> {
        self.geometry().check_range(lba, blocks)?;
        self.inner.tokens.admit_plain(lba, blocks, self.geometry().block_size)?;
        self.clear_of_groups(lba, blocks).await;
        self.inner.medium.write_zeros(lba, blocks).await
    }

    async fn discard(&self, lba: u64, blocks: u64) -> std::result::Result<(), BlockError> {
        self.geometry().check_range(lba, blocks)?;
        self.inner.tokens.admit_plain(lba, blocks, self.geometry().block_size)?;
        self.clear_of_groups(lba, blocks).await;
        self.inner.medium.discard(lba, blocks).await
    }

    async fn provisioning(&self, lba: u64) -> std::result::Result<(stics_block::Provisioning, u64), BlockError> {
        // Blocks a committed group writes are mapped whatever the medium says.
        if lock(&self.inner.core).overlaps(lba, 1) {
            return Ok((stics_block::Provisioning::Mapped, 1));
        }
        self.inner.medium.provisioning(lba).await
    }
}

#[cfg(test)]
mod tests;
