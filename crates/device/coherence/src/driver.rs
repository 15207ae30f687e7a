//! A gateway's token driver: the [`Client`] core behind a lock, over any device that takes the
//! link's token commands ([`GroupSink::tokens`], [`GroupSink::token_poll`]). One task sends the
//! gateway's messages as soon as there are some (and an empty exchange every quarter lease, which
//! keeps the SG hearing from it); two more poll for the SG's, numbered and acknowledged, so that
//! one poll waits at the SG while the other's answer is read and the next one is on its way. What a
//! token's holder must do when it gives one up (ship the segment's dirty blocks, drop its cached
//! ones) or loses one is the [`Holder`]'s, and so is taking the blocks a shared grant brings
//! (an operation that will read names them when it asks, [`Driver::begin_reading`]).

use std::collections::{BTreeSet, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use bytes::Bytes;
use stics_block::{BlockDev, BlockError};
use stics_link::token::{self, Kind, Msg};
use tokio::sync::Notify;
use tokio::task::JoinHandle;

use crate::client::{Action, Client};

/// What a gateway does with its data when a token goes.
#[async_trait]
pub trait Holder: Send + Sync + 'static {
    /// Give up the token on `seg` granted under `gen`: ship the segment's dirty blocks to the SG
    /// under `gen` (when it was exclusive), then drop its cached blocks unless `keep` is shared.
    /// An error is tried again: the token is released only once this succeeded.
    async fn surrender(&self, seg: u64, gen: u64, keep: Option<Kind>) -> Result<(), BlockError>;

    /// The SG took the token on `seg` granted under `gen` away: what was written under it and
    /// not shipped is refused by the SG and belongs in quarantine; cached blocks are stale.
    /// Returns once no write under it can reach the SG any more (nor ride under a newer token):
    /// the break is then acknowledged, after which the SG takes this gateway's writes to the
    /// segment again. An error (the holder is closing) leaves it unacknowledged.
    async fn broken(&self, seg: u64, gen: u64) -> Result<(), BlockError>;

    /// The newest epoch of the gateway's log that holds a write to `seg` not yet on the SG, if
    /// any: once the SG has committed the gateway's groups through it, the segment's writes are
    /// there, and a release may take effect before the surrender's own answer comes back.
    fn release_after(&self, _seg: u64) -> Option<u64> {
        None
    }

    /// A shared token on `seg`, on which the gateway held nothing, was granted with `data`: the
    /// segment's blocks from its block `first` on, as the SG held them. They are current until
    /// the token goes (called before any operation runs under it).
    fn fill(&self, _seg: u64, _first: u32, _data: Bytes) {}
}

/// Timings of the driver.
#[derive(Debug, Clone, Copy)]
pub struct DriverConfig {
    /// How long tokens stay good after an answered exchange (the SG's lease).
    pub lease: Duration,
    /// How long a poll may wait for news at the SG.
    pub poll_wait: Duration,
    /// Pause after a failed exchange or poll.
    pub retry: Duration,
    /// Most tokens the gateway keeps: past it, the least recently used idle ones are given up
    /// (an exclusive one's writes shipped first), so that what a gateway holds, and the SG's
    /// table, follow its working set rather than everything it ever touched.
    pub max_tokens: usize,
    /// The SG takes conditional releases (`Msg::ReleaseAfter`): a surrender's release goes out
    /// beside the group that ships the segment's writes, a round trip sooner.
    pub early_release: bool,
    /// Ask for the blocks a reader wants with its shared grant (`Msg::Want`), where the SG
    /// sends them ([`stics_link::status::FEATURE_GRANT_DATA`]).
    pub grant_data: bool,
}

impl Default for DriverConfig {
    fn default() -> DriverConfig {
        DriverConfig {
            lease: Duration::from_secs(30),
            poll_wait: Duration::from_secs(1),
            retry: Duration::from_millis(200),
            // 4 GiB of 64 KiB segments.
            max_tokens: 1 << 16,
            early_release: false,
            grant_data: true,
        }
    }
}

/// Largest poll answer read: every message the SG queues for one gateway fits.
const POLL_BYTES: usize = 256 << 10;

struct Shared {
    core: Mutex<Client>,
    outbox: Mutex<VecDeque<Msg>>,
    /// Operations that may run.
    ready: Mutex<BTreeSet<u64>>,
    ready_news: Notify,
    send_news: Notify,
    /// The latest answered exchange: when it was sent and when its answer came.
    exchanged: Mutex<Option<(Instant, Instant)>>,
    /// The next exchange tells the SG that this gateway starts afresh.
    fresh: AtomicBool,
    /// Where the polls stand in the SG's numbers; taken before `core`.
    polls: Mutex<PollPos>,
    /// A poll answer was read: the second poller may set out.
    poll_news: Notify,
    holder: Arc<dyn Holder>,
    dev: Arc<dyn BlockDev>,
    source: [u8; 16],
    /// This process, for the SG (`Msg::Hello`): larger for each start.
    nonce: u64,
    cfg: DriverConfig,
    counts: Counts,
}

/// What a gateway's tokens cost it, for metrics.
#[derive(Debug, Default)]
struct Counts {
    waits: AtomicU64,
    wait_micros: AtomicU64,
    surrenders: AtomicU64,
    broken: AtomicU64,
    filled: AtomicU64,
}

/// A gateway's tokens and what they cost it.
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize)]
pub struct TokenStats {
    pub held_shared: usize,
    pub held_exclusive: usize,
    /// Operations that waited for a token, and how long they waited in all.
    pub waits: u64,
    pub wait_secs: f64,
    /// Tokens given up: another gateway asked for them, or the gateway held more than its bound.
    pub surrenders: u64,
    /// Tokens the SG took away from this gateway.
    pub broken: u64,
    /// Grants that came with the blocks their operation wanted (a round trip saved each).
    pub grants_with_data: u64,
    /// How long an answer of the SG keeps the tokens good (the configured lease, or the SG's
    /// when that is shorter).
    pub lease_secs: f64,
}

/// Where a gateway's polls stand in the SG's numbers of its messages.
#[derive(Debug, Default, Clone, Copy)]
struct PollPos {
    /// The number of the next message wanted; unknown until the first message comes, since the
    /// SG numbers each gateway's messages from a point of its own.
    next: Option<u32>,
    /// Gaps seen so far: a poll that set out before the latest names numbers of before it.
    gaps: u64,
}

/// What a poll answer beginning at `first` with `len` messages brings, for a gateway that wants
/// `pos.next` now and sent the poll naming `sent` when it had seen `gaps` gaps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fit {
    /// Messages were lost: start afresh, from this answer.
    Gap,
    /// Read the answer's messages from this index on (past its end: nothing new).
    From(usize),
}

fn fit(pos: PollPos, sent: Option<u32>, gaps: u64, first: u32, len: usize) -> Fit {
    let Some(next) = pos.next else { return Fit::From(0) };
    let stale = gaps != pos.gaps;
    match sent {
        // The two polls overlap: an answer to the one that set out first begins somewhere
        // between what that one named and what has been read since.
        Some(sent) if !stale => {
            if first.wrapping_sub(sent) > next.wrapping_sub(sent) {
                Fit::Gap
            } else {
                Fit::From(next.wrapping_sub(first) as usize)
            }
        }
        _ if first == next => Fit::From(0),
        // Set out before the latest gap, in numbers that no longer count: the next poll says.
        _ if stale => Fit::From(len),
        _ => Fit::Gap,
    }
}

impl PollPos {
    /// Takes in an answer to a poll that named `sent` after `gaps` gaps: whether it shows a gap
    /// (then the gateway starts afresh from it, even an empty one) and how many of its messages
    /// were read before.
    fn take(&mut self, sent: Option<u32>, gaps: u64, first: u32, len: usize) -> (bool, usize) {
        let (gap, skip) = match fit(*self, sent, gaps, first, len) {
            Fit::Gap => {
                self.gaps += 1;
                (true, 0)
            }
            Fit::From(k) => (false, k),
        };
        if gap || skip < len {
            self.next = Some(first.wrapping_add(len as u32));
        }
        (gap, skip)
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl Shared {
    /// Carries out what the core decided.
    fn dispatch(self: &Arc<Self>, acts: Vec<Action>) {
        for a in acts {
            match a {
                Action::Send(m) => {
                    lock(&self.outbox).push_back(m);
                    // A `Done` only lets the SG forget an operation's ticket: it goes with the
                    // next exchange or heartbeat, so that an exchange of its own never delays the
                    // next operation's request by a round trip.
                    if !matches!(m, Msg::Done { .. }) {
                        self.send_news.notify_one();
                    }
                }
                Action::Ready(op) => {
                    lock(&self.ready).insert(op);
                    self.ready_news.notify_waiters();
                }
                Action::Surrender { seg, gen, keep } => {
                    // The segment's writes are on their way to the SG (the surrender hurries
                    // them); the SG lets this release take effect once it has them. The plain
                    // release after the surrender still goes: it is all an SG that dropped this
                    // one (it restarted) gets.
                    let after = if self.cfg.early_release { self.holder.release_after(seg) } else { None };
                    tracing::trace!(seg, gen, ?keep, ?after, "giving a token up");
                    if let Some(after) = after {
                        lock(&self.outbox).push_back(Msg::ReleaseAfter { seg, gen, keep, after, nonce: self.nonce });
                        self.send_news.notify_one();
                    }
                    let me = Arc::clone(self);
                    tokio::spawn(async move {
                        while let Err(e) = me.holder.surrender(seg, gen, keep).await {
                            tracing::warn!(seg, gen, "giving a token up failed, trying again: {e}");
                            tokio::time::sleep(me.cfg.retry).await;
                        }
                        me.counts.surrenders.fetch_add(1, Ordering::Relaxed);
                        tracing::trace!(seg, gen, "token given up: its writes are on the SG");
                        let acts = lock(&me.core).surrendered(seg, Instant::now());
                        me.dispatch(acts);
                    });
                }
                Action::Broken { seg, gen } => {
                    self.counts.broken.fetch_add(1, Ordering::Relaxed);
                    let me = Arc::clone(self);
                    tokio::spawn(async move {
                        if let Err(e) = me.holder.broken(seg, gen).await {
                            tracing::warn!(seg, gen, "a broken token stays unacknowledged: {e}");
                            return;
                        }
                        let acts = lock(&me.core).quarantined(seg, gen, Instant::now());
                        me.dispatch(acts);
                    });
                }
            }
        }
    }

    fn sink(&self) -> Result<&dyn stics_block::GroupSink, BlockError> {
        self.dev.group_sink().ok_or(BlockError::Unsupported("the remote takes no link commands"))
    }

    /// Sends what is queued, or nothing, as one exchange.
    async fn exchange(self: &Arc<Self>) -> Result<(), BlockError> {
        let sink = self.sink()?;
        // Taken, not read: a gap the poller sees while this exchange is under way asks for
        // another fresh start.
        let fresh = self.fresh.swap(false, Ordering::SeqCst);
        let mut msgs: Vec<Msg> = Vec::new();
        if fresh && self.cfg.early_release {
            msgs.push(Msg::Hello { nonce: self.nonce });
        }
        msgs.extend(lock(&self.outbox).drain(..));
        let sent = Instant::now();
        tracing::trace!(?msgs, "token exchange sent");
        let body = Bytes::from(token::encode_exchange(&self.source, &msgs));
        match sink.tokens(body, fresh).await {
            Ok(()) => {
                tracing::trace!(ms = sent.elapsed().as_secs_f64() * 1e3, "token exchange answered");
                *lock(&self.exchanged) = Some((sent, Instant::now()));
                Ok(())
            }
            Err(e) => {
                if fresh {
                    self.fresh.store(true, Ordering::SeqCst);
                }
                // Every message is idempotent at the SG: they go again (the hello with the next
                // fresh exchange).
                let mut out = lock(&self.outbox);
                for m in msgs.into_iter().rev().filter(|m| !matches!(m, Msg::Hello { .. })) {
                    out.push_front(m);
                }
                Err(e)
            }
        }
    }

    async fn sender(self: Arc<Self>) {
        let beat = self.cfg.lease / 4;
        loop {
            let _ = tokio::time::timeout(beat, self.send_news.notified()).await;
            while let Err(e) = self.exchange().await {
                tracing::debug!("token exchange failed: {e}");
                tokio::time::sleep(self.cfg.retry).await;
            }
        }
    }

    /// Polls for the SG's messages. The `standby` poller sets out only once the first message
    /// has come and while the lease holds, so that the two never spin together.
    async fn poller(self: Arc<Self>, standby: bool) {
        let fold = stics_link::fence_of(&self.source);
        loop {
            let started = Instant::now();
            let valid = lock(&self.core).lease_valid(started);
            let pos = *lock(&self.polls);
            if standby && (pos.next.is_none() || !valid) {
                let _ = tokio::time::timeout(self.cfg.poll_wait, self.poll_news.notified()).await;
                continue;
            }
            // Without a lease nothing may run: a poll that waits for news would hold it back by
            // as long as it waits, so it asks for what is there and comes back at once.
            let wait = if valid { self.cfg.poll_wait } else { Duration::ZERO };
            let answer = match self.sink() {
                Ok(s) => s.token_poll(fold, pos.next.unwrap_or(0), wait, POLL_BYTES).await,
                Err(e) => Err(e),
            };
            let (first, msgs, mut data) = match answer.and_then(|b| {
                token::decode_answer_data(&b, POLL_BYTES).map_err(|e| BlockError::Rejected(format!("poll answer: {e}")))
            }) {
                Ok(a) => a,
                Err(e) => {
                    tracing::debug!("token poll failed: {e}");
                    tokio::time::sleep(self.cfg.retry).await;
                    continue;
                }
            };
            let now = Instant::now();
            let mut acts = Vec::new();
            let idle = wait.is_zero() && msgs.is_empty();
            let len = msgs.len();
            let gap = {
                let mut polls = lock(&self.polls);
                let asked = polls.next;
                let (gap, skip) = polls.take(pos.next, pos.gaps, first, len);
                let mut core = lock(&self.core);
                if gap {
                    // Messages were lost (the SG restarted, or gave up on us): start afresh.
                    tracing::info!(asked, got = first, "token messages lost; asking again for what waits");
                    self.fresh.store(true, Ordering::SeqCst);
                    acts.extend(core.reconnected());
                }
                if skip < len {
                    tracing::trace!(msgs = ?&msgs[skip..], "token messages from the SG");
                }
                for m in msgs.into_iter().skip(skip) {
                    // Blocks that came with a shared grant are taken only when it is the token the
                    // gateway now holds on a segment it held nothing of: then no clean or dirty
                    // copy of its own is newer, and no operation runs under it before they are in.
                    let with = match m {
                        Msg::Grant { seg, gen, kind: Kind::Shared, .. } if core.holds(seg).is_none() => {
                            data.iter().position(|d| d.seg == seg && d.gen == gen)
                        }
                        _ => None,
                    };
                    acts.extend(core.on_msg(m, now));
                    if let (Some(i), Msg::Grant { seg, gen, .. }) = (with, m) {
                        if core.holds(seg) == Some((Kind::Shared, gen)) {
                            if let Some(d) = data.get_mut(i) {
                                self.holder.fill(seg, d.first, Bytes::from(std::mem::take(&mut d.data)));
                                self.counts.filled.fetch_add(1, Ordering::Relaxed);
                            }
                        }
                    }
                }
                // Everything queued for us when the poll began has been taken: an exchange
                // answered before then renews the lease from when it was sent.
                if let Some((sent, done)) = *lock(&self.exchanged) {
                    if done <= started {
                        acts.extend(core.heard(sent, now));
                    }
                }
                gap
            };
            self.poll_news.notify_one();
            self.dispatch(acts);
            if gap {
                self.send_news.notify_one();
            }
            if idle && !lock(&self.core).lease_valid(Instant::now()) {
                // No exchange answered yet: a little pause, not a spin.
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }
    }
}

/// A number larger for each start of a gateway: the wall clock in nanoseconds. A clock set back
/// between two starts makes the SG drop the later process's conditional releases, which costs
/// a round trip each, never data.
fn start_nonce() -> u64 {
    let ns = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
    u64::try_from(ns).unwrap_or(u64::MAX).max(1)
}

/// A gateway's token driver.
pub struct Driver {
    shared: Arc<Shared>,
    tasks: Vec<JoinHandle<()>>,
}

impl std::fmt::Debug for Driver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Driver").field("source", &self.shared.source).finish_non_exhaustive()
    }
}

/// An operation that holds its tokens until dropped.
#[derive(Debug)]
pub struct Op<'a> {
    driver: &'a Driver,
    op: u64,
}

impl Op<'_> {
    /// True while the operation may go on: the lease holds and no token of it was broken.
    pub fn valid(&self) -> bool {
        lock(&self.driver.shared.core).valid(self.op, Instant::now())
    }
}

impl Drop for Op<'_> {
    fn drop(&mut self) {
        let s = &self.driver.shared;
        lock(&s.ready).remove(&self.op);
        let acts = {
            let mut core = lock(&s.core);
            let mut acts = core.end(self.op);
            acts.extend(core.trim(s.cfg.max_tokens));
            acts
        };
        s.dispatch(acts);
    }
}

impl Driver {
    /// Starts the driver for the gateway `source` over `dev` (a remote LUN of an SG).
    pub fn start(dev: Arc<dyn BlockDev>, source: [u8; 16], holder: Arc<dyn Holder>, cfg: DriverConfig) -> Driver {
        let shared = Arc::new(Shared {
            core: Mutex::new(Client::new(cfg.lease)),
            outbox: Mutex::new(VecDeque::new()),
            ready: Mutex::new(BTreeSet::new()),
            ready_news: Notify::new(),
            send_news: Notify::new(),
            exchanged: Mutex::new(None),
            fresh: AtomicBool::new(true),
            polls: Mutex::new(PollPos::default()),
            poll_news: Notify::new(),
            holder,
            dev,
            source,
            nonce: start_nonce(),
            cfg,
            counts: Counts::default(),
        });
        shared.send_news.notify_one();
        let tasks = vec![
            tokio::spawn(Arc::clone(&shared).sender()),
            tokio::spawn(Arc::clone(&shared).poller(false)),
            tokio::spawn(Arc::clone(&shared).poller(true)),
        ];
        Driver { shared, tasks }
    }

    /// Takes `kind` on each of `need`'s segments and waits until the operation may run; the
    /// tokens stay pinned until the returned [`Op`] is dropped (dropping it early, while it
    /// waits, gives its place up).
    pub async fn begin(&self, need: &[(u64, Kind)]) -> Op<'_> {
        self.begin_reading(need, &[]).await
    }

    /// [`Driver::begin`] for an operation that will read `reads` (segment, first block in it,
    /// blocks): an SG that sends data with its grants sends those with the shared tokens it
    /// grants the operation, and the [`Holder`] takes them before the operation runs.
    pub async fn begin_reading(&self, need: &[(u64, Kind)], reads: &[(u64, u32, u32)]) -> Op<'_> {
        let s = &self.shared;
        let started = Instant::now();
        let (op, mut acts) = lock(&s.core).begin(need, started);
        if s.cfg.grant_data && !reads.is_empty() {
            // Each want goes just before its request, in the same exchange or an earlier one.
            let mut with = Vec::with_capacity(acts.len() + reads.len());
            for a in acts {
                if let Action::Send(Msg::Request { op, seg, kind: Kind::Shared }) = a {
                    if let Some(&(_, first, blocks)) = reads.iter().find(|r| r.0 == seg) {
                        with.push(Action::Send(Msg::Want { op, seg, first, blocks }));
                    }
                }
                with.push(a);
            }
            acts = with;
        }
        let guard = Op { driver: self, op };
        s.dispatch(acts);
        let mut waited = false;
        loop {
            let news = s.ready_news.notified();
            tokio::pin!(news);
            news.as_mut().enable();
            if lock(&s.ready).contains(&op) {
                if waited {
                    s.counts.waits.fetch_add(1, Ordering::Relaxed);
                    let micros = u64::try_from(started.elapsed().as_micros()).unwrap_or(u64::MAX);
                    s.counts.wait_micros.fetch_add(micros, Ordering::Relaxed);
                }
                return guard;
            }
            waited = true;
            news.await;
        }
    }

    /// Tokens held and what they cost.
    pub fn stats(&self) -> TokenStats {
        let c = &self.shared.counts;
        let (held_shared, held_exclusive) = self.held();
        TokenStats {
            held_shared,
            held_exclusive,
            waits: c.waits.load(Ordering::Relaxed),
            wait_secs: c.wait_micros.load(Ordering::Relaxed) as f64 / 1e6,
            surrenders: c.surrenders.load(Ordering::Relaxed),
            broken: c.broken.load(Ordering::Relaxed),
            grants_with_data: c.filled.load(Ordering::Relaxed),
            lease_secs: self.shared.cfg.lease.as_secs_f64(),
        }
    }

    /// True once the gateway knows which tokens it holds (a new one learns it with its first
    /// answered exchange).
    pub fn knows_tokens(&self) -> bool {
        !lock(&self.shared.core).learning()
    }

    /// Tokens held, by kind (shared, exclusive).
    pub fn held(&self) -> (usize, usize) {
        lock(&self.shared.core).counts()
    }

    /// The token held on `seg`, with its generation.
    pub fn holds(&self, seg: u64) -> Option<(Kind, u64)> {
        lock(&self.shared.core).holds(seg)
    }
}

impl Drop for Driver {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(next: u32, gaps: u64) -> PollPos {
        PollPos { next: Some(next), gaps }
    }

    #[test]
    fn a_poll_answer_is_read_from_what_is_new_and_a_gap_only_when_numbers_are_missing() {
        // The first answer takes the numbers as they come.
        assert_eq!(fit(PollPos::default(), None, 0, 7, 2), Fit::From(0));
        // One poll: its answer begins where it asked.
        assert_eq!(fit(at(10, 0), Some(10), 0, 10, 3), Fit::From(0));
        assert_eq!(fit(at(10, 0), Some(10), 0, 12, 3), Fit::Gap);
        assert_eq!(fit(at(10, 0), Some(10), 0, 9, 3), Fit::Gap);
        // The standby poll set out naming 10; 10..14 were read since: its answer from 12 holds
        // two known messages, from 14 none, from 10 four; past 14 numbers are missing.
        assert_eq!(fit(at(14, 0), Some(10), 0, 12, 3), Fit::From(2));
        assert_eq!(fit(at(14, 0), Some(10), 0, 10, 4), Fit::From(4));
        assert_eq!(fit(at(14, 0), Some(10), 0, 14, 1), Fit::From(0));
        assert_eq!(fit(at(14, 0), Some(10), 0, 15, 1), Fit::Gap);
        assert_eq!(fit(at(14, 0), Some(10), 0, 9, 6), Fit::Gap);
        // Across the wrap of the numbers.
        assert_eq!(fit(at(2, 0), Some(u32::MAX - 1), 0, u32::MAX, 4), Fit::From(3));
        // A poll that set out before a gap: only an answer where the new numbers stand counts.
        assert_eq!(fit(at(500, 1), Some(10), 0, 500, 1), Fit::From(0));
        assert_eq!(fit(at(500, 1), Some(10), 0, 10, 1), Fit::From(1));
        assert_eq!(fit(at(500, 1), Some(10), 0, 12, 0), Fit::From(0));
    }

    #[test]
    fn a_gap_moves_the_polls_on_even_when_its_answer_is_empty() {
        let mut pos = at(10, 0);
        // An empty answer from elsewhere in the numbers: start afresh from there.
        assert_eq!(pos.take(Some(10), 0, 900, 0), (true, 0));
        assert_eq!((pos.next, pos.gaps), (Some(900), 1));
        // The standby poll's answer, from before the gap, in the old numbers: nothing.
        assert_eq!(pos.take(Some(10), 0, 10, 2), (false, 2));
        assert_eq!(pos.next, Some(900));
        // Overlapping answers read each message once.
        assert_eq!(pos.take(Some(900), 1, 900, 3), (false, 0));
        assert_eq!(pos.take(Some(900), 1, 901, 4), (false, 2));
        assert_eq!((pos.next, pos.gaps), (Some(905), 1));
        // The first answer takes the numbers as they come, and an empty one leaves them unknown.
        let mut new = PollPos::default();
        assert_eq!(new.take(None, 0, 77, 0), (false, 0));
        assert_eq!(new.next, None);
        assert_eq!(new.take(None, 0, 77, 1), (false, 0));
        assert_eq!(new.next, Some(78));
    }
}
