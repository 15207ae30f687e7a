//! The SG's lock server as a driver: [`stics_coherence::Server`] behind a lock, gateways named
//! by their sources, a numbered queue of messages for each that LINK POLL reads (waiting a little
//! when it is empty) and acknowledges (each poll names the first message it still wants, so an
//! answer lost with a connection is read again), and a tick that lets the server break what its
//! policy allows.
//!
//! Every change to the table is a [`Step`]: what the server said, held back until the journal
//! has made the change durable (a tokens record: the whole table, or what changed), so that a
//! restarted SG ([`Tokens::restore`], from a [`TokenTable`] replayed from the journal) never
//! forgets a grant a gateway heard of, nor hands out a generation twice. The message queues are
//! not kept: a restarted SG's numbers start elsewhere, so every gateway sees a gap and starts
//! afresh.
//!
//! A conditional release (`ReleaseAfter`) waits here, in front of the server, until the journal
//! has committed its gateway's groups through the epoch it names; it is taken only from the
//! process that said `Hello` last (a newer one's hello drops an older one's), and a restarted SG
//! has none: the plain release every gateway sends once its surrender is done follows anyway.
//!
//! A `Want` waits here too, by gateway, operation and segment, until a poll answer carries the
//! shared grant it names ([`Tokens::poll`] says which blocks the answer's caller reads and
//! sends with it) or the operation is done.

use std::collections::{BTreeMap, VecDeque};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use stics_block::BlockError;
use stics_coherence::server::{Blocked, Counts, Entry, Out};
use stics_coherence::{Gw, Msg, Policy, Server};
use stics_link::token;
use tokio::sync::Notify;

use crate::format::TokenRecord;

/// Most messages one exchange may carry.
pub const MAX_EXCHANGE: usize = 4096;

/// Most gateways one LUN's table knows.
pub const MAX_GATEWAYS: usize = 256;

/// Most messages queued for one gateway (about 200 KiB): one that does not poll loses them all
/// and learns so from the numbers (it starts again as after a lost connection), rather than
/// grow the SG's memory.
const MAX_QUEUED: usize = 4096;

/// One gateway's messages not yet acknowledged, numbered from `base`; `handed` is one past the
/// last one a poll was answered with.
#[derive(Debug)]
struct Queue {
    base: u32,
    msgs: VecDeque<Msg>,
    handed: u32,
}

impl Queue {
    /// A queue numbered from a random point: after an SG restart, a gateway's numbers from
    /// before are not taken for this queue's (which would acknowledge messages it never read);
    /// it sees a gap instead, and starts afresh.
    fn start() -> Queue {
        let base = rand::random();
        Queue { base, msgs: VecDeque::new(), handed: base }
    }

    /// One past the newest message.
    fn end(&self) -> u32 {
        self.base.wrapping_add(self.msgs.len() as u32)
    }
}

/// Most conditional releases waiting for their epochs: past it, one is dropped, and the plain
/// release that follows it does its work.
const MAX_PENDING: usize = 1 << 16;

/// Most blocks readers wait for with their grants: past it, a `Want` is dropped, and its
/// reader reads after the grant instead.
const MAX_WANTS: usize = 1 << 16;

/// Most of those one gateway may hold, so that one gateway's flood of reads never takes the
/// others' place.
const MAX_WANTS_PER_GATEWAY: usize = 1 << 12;

/// Blocks that go with a shared grant in a poll answer: `blocks` of segment `seg` from its block
/// `first` (`gen` is the grant's).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Wanted {
    pub seg: u64,
    pub gen: u64,
    pub first: u32,
    pub blocks: u32,
}

/// A poll answer before it is encoded: its first message's number, the messages, and the blocks
/// that go with its shared grants.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Polled {
    pub first: u32,
    pub msgs: Vec<Msg>,
    pub wanted: Vec<Wanted>,
}

/// A conditional release waiting for the journal to commit its gateway's epochs through
/// `after`.
#[derive(Debug, Clone, Copy)]
struct Pending {
    gen: u64,
    keep: Option<stics_coherence::Kind>,
    after: u64,
    nonce: u64,
}

/// Most segments the table holds (about 100 MiB): requests past it are refused, so that no set
/// of gateways grows the SG's memory without bound.
pub const MAX_SEGMENTS: usize = 1 << 20;

/// Bytes a held segment may take in a whole copy of the table (one shared holder beside the
/// entry): the table is bounded so that a copy fits a sixteenth of the journal's ring.
pub const SNAPSHOT_BYTES_PER_SEGMENT: u64 = 36;

#[derive(Debug)]
struct State {
    server: Server,
    /// Gateways by source, and by the fold of their source that LINK POLL names them by.
    ids: BTreeMap<[u8; 16], Gw>,
    by_fold: BTreeMap<u64, Gw>,
    queued: BTreeMap<Gw, Queue>,
    /// Gateways named since the last step.
    new_ids: Vec<([u8; 16], Gw)>,
    /// What steps said whose changes did not become durable: sent after the next whole copy.
    held: Vec<Out>,
    /// A change did not become durable: the next record is the whole table.
    must_copy: bool,
    /// [`Tokens::copy_len`] as of the last step: every record placed asks for it, and only a
    /// step changes the table.
    copy_len: Option<u64>,
    /// Each gateway's process, as its last `Hello` named it.
    nonces: BTreeMap<Gw, u64>,
    /// Conditional releases by gateway and segment.
    pending: BTreeMap<(Gw, u64), Pending>,
    /// Conditional releases handed on to the server.
    early: u64,
    /// What readers want with their shared grants, by gateway, operation and segment: the first
    /// block in the segment and how many.
    wants: BTreeMap<(Gw, u64, u64), (u32, u32)>,
    /// Blocks sent with grants.
    grant_blocks: u64,
    /// When each revoke not yet answered went out, by holder and segment, and the revokes
    /// answered so far with the time they took in all: what a transfer costs as the SG sees it.
    revoked_at: BTreeMap<(Gw, u64), Instant>,
    answered: u64,
    answer_secs: f64,
    /// Where a revoke's time goes before the holder has it: revokes queued once the table's
    /// record was durable (and the seconds that took), and revokes handed to a poll of their
    /// holder (and the seconds they waited for one), by holder and segment while queued.
    revoke_queued_at: BTreeMap<(Gw, u64), (Instant, bool)>,
    revokes_queued: u64,
    revoke_durable_secs: f64,
    revokes_polled: u64,
    revoke_poll_secs: f64,
}

/// A LUN's lock server.
#[derive(Debug)]
pub struct Tokens {
    state: Mutex<State>,
    news: Notify,
    segment_bytes: u32,
    max_segments: usize,
}

/// A change to the table: what the server said, to send once `record` is durable.
#[derive(Debug)]
#[must_use = "what the server said goes out only through Tokens::deliver or Tokens::failed"]
pub struct Step {
    pub outs: Vec<Out>,
    /// What changed, as a tokens record that is not a whole copy.
    pub record: TokenRecord,
}

/// The table as the journal's tokens records left it: the last whole copy with every change
/// after it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TokenTable {
    pub segment_bytes: u32,
    pub next_gen: u64,
    pub gateways: BTreeMap<[u8; 16], Gw>,
    pub entries: BTreeMap<u64, Entry>,
    pub untold: Vec<(Gw, u64, u64)>,
}

impl TokenTable {
    /// Takes the next tokens record in the journal's order.
    pub fn apply(&mut self, r: TokenRecord) {
        if r.snapshot {
            *self = TokenTable::default();
        }
        self.segment_bytes = r.segment_bytes;
        self.next_gen = self.next_gen.max(r.next_gen);
        self.gateways.extend(r.gateways);
        if let Some(u) = r.untold {
            self.untold = u;
        }
        for (seg, e) in r.segs {
            match e {
                Some(e) => self.entries.insert(seg, e),
                None => self.entries.remove(&seg),
            };
        }
    }

    /// True when no gateway holds or is owed anything.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty() && self.untold.is_empty()
    }
}

/// What `/status` shows of the tokens.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct TokenStatus {
    pub gateways: usize,
    pub held_shared: usize,
    pub held_exclusive: usize,
    pub grants: u64,
    pub revokes: u64,
    pub releases: u64,
    pub breaks: u64,
    /// Conditional releases taken (each a round trip sooner than its plain one), and those
    /// waiting for their epochs now.
    pub early_releases: u64,
    pub pending_releases: usize,
    /// Blocks sent with shared grants (each saving its reader a round trip), and the readers'
    /// wants waiting for their grants now.
    pub grant_data_blocks: u64,
    pub wants: usize,
    /// Revokes a release answered, and the seconds from revoke to release they took in all.
    pub revokes_answered: u64,
    pub revoke_answer_secs: f64,
    /// Of that time, before the holder had the revoke: revokes queued once the table's record
    /// of them was durable, with the seconds that took in all, and revokes a poll of their
    /// holder carried, with the seconds they waited for one in all.
    pub revokes_queued: u64,
    pub revoke_durable_secs: f64,
    pub revokes_polled: u64,
    pub revoke_poll_secs: f64,
    /// Segments someone waits for, with the holders in the way (by source) and the waiters.
    pub blocked: Vec<BlockedSegment>,
}

/// One segment someone waits for.
#[derive(Debug, Clone, serde::Serialize)]
pub struct BlockedSegment {
    pub segment: u64,
    /// Holders asked to give it up: source (hex), kind, seconds since the SG heard from them.
    pub holders: Vec<(String, String, f64)>,
    /// Waiters, first in line first: source (hex), kind, seconds waited.
    pub waiters: Vec<(String, String, f64)>,
}

impl State {
    /// A release from `gw` answers the revoke of its segment, if one is out.
    fn answer(&mut self, gw: Gw, m: &Msg) {
        if let Msg::Release { seg, .. } = *m {
            if let Some(at) = self.revoked_at.remove(&(gw, seg)) {
                self.answered += 1;
                self.answer_secs += at.elapsed().as_secs_f64();
            }
            self.revoke_queued_at.remove(&(gw, seg));
        }
    }

    /// `msgs` go to `gw` in a poll answer: the revokes among them that no poll carried before
    /// end their wait for one.
    fn polled(&mut self, gw: Gw, msgs: &[Msg]) {
        for m in msgs {
            if let Msg::Revoke { seg, .. } = *m {
                // Counted once: an answer lost and asked for again is the network's cost.
                if let Some((at, polled @ false)) = self.revoke_queued_at.get_mut(&(gw, seg)) {
                    *polled = true;
                    self.revokes_polled += 1;
                    self.revoke_poll_secs += at.elapsed().as_secs_f64();
                }
            }
        }
    }

    /// Each gateway's source in hex, as `/status` names them.
    fn names(&self) -> BTreeMap<Gw, String> {
        self.ids.iter().map(|(s, &g)| (g, hex(s))).collect()
    }

    /// The gateway `source` is, or one no token names.
    fn gw(&self, source: &[u8; 16]) -> Gw {
        self.ids.get(source).copied().unwrap_or(Gw::MAX)
    }
}

fn lock(m: &Mutex<State>) -> std::sync::MutexGuard<'_, State> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn hex(source: &[u8; 16]) -> String {
    use std::fmt::Write;
    source.iter().fold(String::with_capacity(32), |mut s, b| {
        let _ = write!(s, "{b:02x}");
        s
    })
}

impl Tokens {
    /// An empty table under `policy`, for segments of `segment_bytes`.
    pub fn new(policy: Policy, segment_bytes: u32) -> Tokens {
        Tokens {
            state: Mutex::new(State {
                server: Server::new(policy),
                ids: BTreeMap::new(),
                by_fold: BTreeMap::new(),
                queued: BTreeMap::new(),
                new_ids: Vec::new(),
                held: Vec::new(),
                must_copy: false,
                copy_len: None,
                nonces: BTreeMap::new(),
                pending: BTreeMap::new(),
                early: 0,
                wants: BTreeMap::new(),
                grant_blocks: 0,
                revoked_at: BTreeMap::new(),
                answered: 0,
                answer_secs: 0.0,
                revoke_queued_at: BTreeMap::new(),
                revokes_queued: 0,
                revoke_durable_secs: 0.0,
                revokes_polled: 0,
                revoke_poll_secs: 0.0,
            }),
            news: Notify::new(),
            segment_bytes,
            max_segments: MAX_SEGMENTS,
        }
    }

    /// The table the journal kept, under `policy`: every holder keeps its token and a lease
    /// from `now` in which to come back. Refused when it holds tokens on segments of another
    /// size than `segment_bytes`.
    pub fn restore(policy: Policy, segment_bytes: u32, table: TokenTable, now: Instant) -> Result<Tokens, String> {
        if !table.is_empty() && table.segment_bytes != segment_bytes {
            return Err(format!(
                "the journal's tokens cover segments of {} bytes, not {segment_bytes}: start it with segment={}, or let every gateway give its tokens back first",
                table.segment_bytes, table.segment_bytes
            ));
        }
        let entries: Vec<Entry> = table.entries.into_values().collect();
        let t = Tokens::new(policy, segment_bytes);
        {
            let mut st = lock(&t.state);
            st.server = Server::restore(policy, &entries, &table.untold, table.next_gen, now);
            for (source, gw) in table.gateways {
                st.by_fold.insert(stics_link::fence_of(&source), gw);
                st.ids.insert(source, gw);
            }
        }
        Ok(t)
    }

    /// Keeps the table to `n` segments (a whole copy must fit the journal).
    pub fn with_max_segments(mut self, n: usize) -> Tokens {
        self.max_segments = n.min(MAX_SEGMENTS);
        self
    }

    /// Runs `f` on the table and takes what it changed as a step.
    fn step<R>(&self, f: impl FnOnce(&mut State) -> (Vec<Out>, R)) -> (Step, R) {
        let mut st = lock(&self.state);
        let (outs, r) = f(&mut st);
        let now = Instant::now();
        for o in &outs {
            if let Msg::Revoke { seg, .. } = o.msg {
                // Bounded by the table: one per holder of a held segment.
                st.revoked_at.entry((o.to, seg)).or_insert(now);
            }
        }
        st.copy_len = None;
        let changes = st.server.take_changes();
        let record = TokenRecord {
            snapshot: false,
            segment_bytes: self.segment_bytes,
            next_gen: changes.next_gen,
            gateways: std::mem::take(&mut st.new_ids),
            untold: changes.untold,
            segs: changes.segs,
        };
        (Step { outs, record }, r)
    }

    /// The whole table now, as a tokens record.
    pub fn copy(&self) -> TokenRecord {
        let mut st = lock(&self.state);
        // What changed is in the copy.
        let next_gen = st.server.take_changes().next_gen;
        st.new_ids.clear();
        TokenRecord {
            snapshot: true,
            segment_bytes: self.segment_bytes,
            next_gen,
            gateways: st.ids.iter().map(|(s, &g)| (*s, g)).collect(),
            untold: Some(st.server.untold()),
            segs: st.server.entries().into_iter().map(|e| (e.seg, Some(e))).collect(),
        }
    }

    /// Bytes a whole copy of the table would take now.
    pub fn copy_len(&self) -> u64 {
        let mut st = lock(&self.state);
        if let Some(n) = st.copy_len {
            return n;
        }
        let (sr, _) = st.server.held();
        let segs = st.server.len() as u64;
        // Every held segment's entry, every shared holder's, every gateway's, every broken token's.
        let n = 40 + segs * 24 + sr as u64 * 12 + st.ids.len() as u64 * 20 + st.server.untold().len() as u64 * 20;
        st.copy_len = Some(n);
        n
    }

    /// Whether the next record must be a whole copy: a change did not become durable.
    pub fn must_copy(&self) -> bool {
        lock(&self.state).must_copy
    }

    /// A step's record (or a whole copy in its place) is durable: what it said goes out, after
    /// what earlier steps whose records failed said.
    pub fn deliver(&self, outs: Vec<Out>, copied: bool) {
        let mut st = lock(&self.state);
        if copied {
            st.must_copy = false;
            let mut held = std::mem::take(&mut st.held);
            held.extend(outs);
            self.send(st, held);
        } else {
            self.send(st, outs);
        }
    }

    /// A step's record did not become durable: what it said waits for the next whole copy.
    pub fn failed(&self, outs: Vec<Out>) {
        let mut st = lock(&self.state);
        st.must_copy = true;
        st.held.extend(outs);
    }

    /// Queues `outs` for their gateways and wakes the polls that wait, after letting go of the
    /// table.
    fn send(&self, mut st: std::sync::MutexGuard<'_, State>, outs: Vec<Out>) {
        let any = !outs.is_empty();
        if any {
            tracing::trace!(?outs, "token messages queued");
        }
        let now = Instant::now();
        for o in outs {
            if let Msg::Revoke { seg, .. } = o.msg {
                let key = (o.to, seg);
                if let (Some(&at), false) = (st.revoked_at.get(&key), st.revoke_queued_at.contains_key(&key)) {
                    st.revokes_queued += 1;
                    st.revoke_durable_secs += now.saturating_duration_since(at).as_secs_f64();
                    st.revoke_queued_at.insert(key, (now, false));
                }
            }
            let q = st.queued.entry(o.to).or_insert_with(Queue::start);
            if q.msgs.len() >= MAX_QUEUED {
                // A gap in the numbers tells the gateway that it lost messages.
                q.base = q.base.wrapping_add(q.msgs.len() as u32 + 1);
                q.msgs.clear();
            }
            q.msgs.push_back(o.msg);
        }
        drop(st);
        if any {
            self.news.notify_waiters();
        }
    }

    /// Takes a gateway's exchange (LINK TOKENS); `committed` is the newest epoch of each
    /// source the journal holds in a committed group.
    pub fn exchange(
        &self,
        body: &[u8],
        new_connection: bool,
        now: Instant,
        committed: impl Fn(&[u8; 16]) -> u64,
    ) -> Result<Step, BlockError> {
        let (source, msgs) = token::decode_exchange(body, MAX_EXCHANGE)
            .map_err(|e| BlockError::Rejected(format!("token exchange: {e}")))?;
        if msgs.iter().any(|m| !m.from_gateway()) {
            return Err(BlockError::Rejected("token exchange: a message only the SG sends".into()));
        }
        let epoch = committed(&source);
        tracing::trace!(?msgs, "token exchange taken");
        // A refused exchange changes nothing.
        let (step, taken) = self.step(|st| match self.take_exchange(st, source, &msgs, new_connection, now, epoch) {
            Ok(outs) => (outs, Ok(())),
            Err(e) => (Vec::new(), Err(e)),
        });
        taken.map(|()| step)
    }

    /// The journal committed `source`'s groups through `epoch`: the conditional releases that
    /// waited for it take effect, as a step (none when nothing waited).
    pub fn committed(&self, source: &[u8; 16], epoch: u64, now: Instant) -> Option<Step> {
        // Every caller holds the journal's turn: nothing changes the pending releases between
        // taking them here and handing them on in the step.
        let (gw, releases) = {
            let mut st = lock(&self.state);
            let gw = *st.ids.get(source)?;
            let due: Vec<u64> = st
                .pending
                .range((gw, 0)..=(gw, u64::MAX))
                .filter(|(_, p)| p.after <= epoch)
                .map(|(&(_, s), _)| s)
                .collect();
            let nonce = st.nonces.get(&gw).copied();
            let releases: Vec<Msg> = due
                .into_iter()
                .filter_map(|seg| st.pending.remove(&(gw, seg)).map(|p| (seg, p)))
                .filter(|(_, p)| Some(p.nonce) == nonce)
                .map(|(seg, p)| Msg::Release { seg, gen: p.gen, keep: p.keep })
                .collect();
            (gw, releases)
        };
        if releases.is_empty() {
            return None;
        }
        tracing::trace!(gw, epoch, ?releases, "conditional releases take effect");
        Some(
            self.step(|st| {
                st.early += releases.len() as u64;
                for m in &releases {
                    st.answer(gw, m);
                }
                (st.server.handle(gw, &releases, now), ())
            })
            .0,
        )
    }

    fn take_exchange(
        &self,
        st: &mut State,
        source: [u8; 16],
        msgs: &[Msg],
        new_connection: bool,
        now: Instant,
        committed: u64,
    ) -> Result<Vec<Out>, BlockError> {
        if st.server.len() >= self.max_segments && msgs.iter().any(|m| matches!(m, Msg::Request { .. })) {
            return Err(BlockError::Busy(format!("the lock server's table holds {} segments", self.max_segments)));
        }
        let gw = match st.ids.get(&source) {
            Some(&gw) => gw,
            None if st.ids.len() >= MAX_GATEWAYS => {
                return Err(BlockError::Rejected(format!("more than {MAX_GATEWAYS} gateways share this LUN")))
            }
            None => {
                // LINK POLL names a gateway by its fold: two that fold alike could read each
                // other's grants, so the second is refused (for random UUIDs, one in 2^64).
                let fold = stics_link::fence_of(&source);
                if st.by_fold.contains_key(&fold) {
                    return Err(BlockError::Rejected(format!("source {} folds like another gateway's", hex(&source))));
                }
                let gw = st.ids.len() as Gw;
                st.ids.insert(source, gw);
                st.by_fold.insert(fold, gw);
                st.new_ids.push((source, gw));
                gw
            }
        };
        let mut outs = Vec::new();
        if new_connection {
            // The gateway starts afresh (restarted, or it saw a gap): what is queued for it may
            // be an earlier process's (whose operation numbers its own would be taken for), so
            // it goes, and the SG says again what the gateway holds and what is asked of it. The
            // numbers go on past what went, so that a gateway that read it all reads on without
            // a gap of the SG's making.
            if let Some(q) = st.queued.get_mut(&gw) {
                q.base = q.base.wrapping_add(q.msgs.len() as u32);
                q.msgs.clear();
            }
            st.wants.retain(|&(g, _, _), _| g != gw);
            outs.extend(st.server.reconnected(gw, now));
        }
        let mut plain = Vec::with_capacity(msgs.len());
        for &m in msgs {
            match m {
                Msg::Hello { nonce } => {
                    if st.nonces.get(&gw).is_none_or(|&known| nonce > known) {
                        // A new process: what an earlier one left waiting would fence its writes.
                        st.nonces.insert(gw, nonce);
                        st.pending.retain(|&(g, _), p| g != gw || p.nonce == nonce);
                    }
                }
                // From a process that is gone, or before any hello: dropped; the plain release
                // that follows a finished surrender does its work.
                Msg::ReleaseAfter { nonce, .. } if st.nonces.get(&gw) != Some(&nonce) => {}
                Msg::ReleaseAfter { seg, gen, keep, after, .. } if after <= committed => {
                    st.early += 1;
                    plain.push(Msg::Release { seg, gen, keep });
                }
                Msg::ReleaseAfter { seg, gen, keep, after, nonce } => {
                    if st.pending.len() < MAX_PENDING || st.pending.contains_key(&(gw, seg)) {
                        st.pending.insert((gw, seg), Pending { gen, keep, after, nonce });
                    }
                }
                Msg::Want { op, seg, first, blocks } => {
                    let key = (gw, op, seg);
                    let mine =
                        || st.wants.range((gw, 0, 0)..=(gw, u64::MAX, u64::MAX)).take(MAX_WANTS_PER_GATEWAY).count();
                    if st.wants.contains_key(&key) || (st.wants.len() < MAX_WANTS && mine() < MAX_WANTS_PER_GATEWAY) {
                        st.wants.insert(key, (first, blocks));
                    }
                }
                Msg::Done { op } => {
                    let ended: Vec<_> = st.wants.range((gw, op, 0)..=(gw, op, u64::MAX)).map(|(&k, _)| k).collect();
                    for k in ended {
                        st.wants.remove(&k);
                    }
                    plain.push(m);
                }
                m => plain.push(m),
            }
        }
        for m in &plain {
            st.answer(gw, m);
        }
        outs.extend(st.server.handle(gw, &plain, now));
        Ok(outs)
    }

    /// The messages for a gateway from number `from` on (LINK POLL), every earlier one
    /// acknowledged, for a poll answer of at most `max` bytes, with the blocks its shared grants'
    /// readers want (the caller reads them, and sends what fits in the answer beside it). A grant
    /// answered again (its answer was lost) is wanted again: no other gateway can have written the
    /// segment before the gateway that reads the grant gives it up.
    ///
    /// A gateway keeps a second poll waiting here while it reads the first's answer, so that
    /// news never waits for a poll to arrive: a poll answers news no other poll of its gateway
    /// was answered with (of two waiting, one answers and the other goes on waiting), and at
    /// the end of its wait whatever is unread (an answer lost with its connection is read
    /// again then). A poll that set out before the other's answer was read names numbers the
    /// other's successor acknowledged since: that is no gap. The gateway drops what it reads
    /// twice.
    pub async fn poll(&self, fold: u64, from: u32, wait: Duration, max: usize) -> Polled {
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            let news = self.news.notified();
            tokio::pin!(news);
            news.as_mut().enable();
            {
                let mut guard = lock(&self.state);
                let st = &mut *guard;
                let gw = st.by_fold.get(&fold).copied();
                if let Some(q) = gw.and_then(|gw| st.queued.get_mut(&gw)) {
                    let acked = from.wrapping_sub(q.base) as usize;
                    let behind = from != q.base && q.base.wrapping_sub(from) as usize <= MAX_QUEUED;
                    // Numbers it was never sent mean that what it asks for is gone: the answer
                    // says from where on there are messages.
                    let gap = !behind && acked > q.msgs.len();
                    if !gap && !behind {
                        let read: Vec<Msg> = q.msgs.drain(..acked).collect();
                        q.base = from;
                        // A grant the gateway read is never answered again: what it wanted goes.
                        if let Some(gw) = gw {
                            for m in read {
                                if let Msg::Grant { op, seg, .. } = m {
                                    st.wants.remove(&(gw, op, seg));
                                }
                            }
                        }
                    }
                    // After a restart of the numbers (a gap), `handed` may lie anywhere.
                    if q.handed.wrapping_sub(q.base) as usize > q.msgs.len() {
                        q.handed = q.base;
                    }
                    // What another poll was answered with is not said again before the wait
                    // is over (that answer may be lost with its connection, and then it is).
                    let timed_out = tokio::time::Instant::now() >= deadline;
                    let answer_now = q.handed != q.end() || (timed_out && !q.msgs.is_empty());
                    if gap || answer_now {
                        let n = token::fitting(q.msgs.len(), max);
                        let msgs: Vec<Msg> = q.msgs.iter().take(n).copied().collect();
                        let first = q.base;
                        let sent_to = q.base.wrapping_add(n as u32);
                        if sent_to.wrapping_sub(q.base) > q.handed.wrapping_sub(q.base) {
                            q.handed = sent_to;
                        }
                        let mut wanted = Vec::new();
                        if let Some(gw) = gw {
                            st.polled(gw, &msgs);
                            for m in &msgs {
                                if let Msg::Grant { op, seg, kind: stics_coherence::Kind::Shared, gen, .. } = *m {
                                    if let Some(&(first, blocks)) = st.wants.get(&(gw, op, seg)) {
                                        wanted.push(Wanted { seg, gen, first, blocks });
                                    }
                                }
                            }
                        }
                        return Polled { first, msgs, wanted };
                    }
                }
            }
            if tokio::time::Instant::now() >= deadline {
                return Polled { first: from, msgs: Vec::new(), wanted: Vec::new() };
            }
            // At the deadline, one more look: what is unread goes out then.
            let _ = tokio::time::timeout_at(deadline, news).await;
        }
    }

    /// `blocks` blocks went with grants in a poll answer.
    pub fn sent_with_grants(&self, blocks: u64) {
        lock(&self.state).grant_blocks += blocks;
    }

    /// Lets the server break what its policy allows (called about once a second).
    pub fn tick(&self, now: Instant) -> Step {
        self.step(|st| {
            let (outs, broke) = st.server.tick(now);
            for b in &broke {
                tracing::warn!(gateway = b.gw, segment = b.seg, kind = ?b.kind, "a silent holder's token was broken");
            }
            (outs, ())
        })
        .0
    }

    /// An operator takes `seg`'s tokens from the holders asked to give them up: what they did not
    /// ship is refused from now on, and the first in line is served. Returns what was broken:
    /// (source in hex, kind, generation).
    pub fn break_segment(&self, seg: u64) -> (Step, Vec<(String, String, u64)>) {
        self.step(|st| {
            let (outs, broke) = st.server.break_segment(seg);
            let names = st.names();
            let said = broke
                .iter()
                .map(|b| {
                    tracing::warn!(gateway = b.gw, segment = b.seg, "an operator broke a token");
                    (names.get(&b.gw).cloned().unwrap_or_default(), format!("{:?}", b.kind).to_lowercase(), b.gen)
                })
                .collect();
            (outs, said)
        })
    }

    /// Counters and what waits for whom.
    pub fn status(&self, now: Instant) -> TokenStatus {
        let st = lock(&self.state);
        let (sr, ew) = st.server.held();
        let Counts { grants, revokes, releases, breaks } = st.server.counts();
        let names = st.names();
        let name = |g: Gw| names.get(&g).cloned().unwrap_or_default();
        let show = |v: &[(Gw, stics_coherence::Kind, Duration)]| {
            v.iter().map(|&(g, k, d)| (name(g), format!("{k:?}").to_lowercase(), d.as_secs_f64())).collect()
        };
        let blocked = st
            .server
            .blocked(now)
            .iter()
            .map(|b: &Blocked| BlockedSegment { segment: b.seg, holders: show(&b.holders), waiters: show(&b.waiters) })
            .collect();
        TokenStatus {
            gateways: st.ids.len(),
            held_shared: sr,
            held_exclusive: ew,
            grants,
            revokes,
            releases,
            breaks,
            early_releases: st.early,
            grant_data_blocks: st.grant_blocks,
            wants: st.wants.len(),
            pending_releases: st.pending.len(),
            revokes_answered: st.answered,
            revoke_answer_secs: st.answer_secs,
            revokes_queued: st.revokes_queued,
            revoke_durable_secs: st.revoke_durable_secs,
            revokes_polled: st.revokes_polled,
            revoke_poll_secs: st.revoke_poll_secs,
            blocked,
        }
    }

    /// Whether gateway `source`'s write to `seg` under generation `gen` may land.
    pub fn fence(&self, source: &[u8; 16], seg: u64, gen: u64) -> Result<(), stics_coherence::Fenced> {
        let st = lock(&self.state);
        st.server.fence(st.gw(source), seg, gen)
    }

    /// Whether a plain write (not a group: no generations, no source) to blocks
    /// `lba..lba + blocks` of `block_size` bytes may land: only where no gateway holds a token.
    pub fn admit_plain(&self, lba: u64, blocks: u64, block_size: u32) -> Result<(), BlockError> {
        let st = lock(&self.state);
        if st.server.is_empty() || blocks == 0 {
            return Ok(());
        }
        let per = u64::from((self.segment_bytes / block_size.max(1)).max(1));
        match st.server.first_held(lba / per..=(lba + blocks - 1) / per) {
            Some(seg) => Err(BlockError::Rejected(format!(
                "a plain write to segment {seg}, which a gateway holds a token on: gateways share this LUN, write through one of them"
            ))),
            None => Ok(()),
        }
    }

    /// Whether a group from `source` may land: every generation it carries is its segment's
    /// exclusive token now; a group without generations (a gateway that shares nothing) only
    /// where nobody holds a token. `touched` lists the segments it writes.
    pub fn admit(
        &self,
        source: &[u8; 16],
        fences: Option<&stics_link::group::Fences>,
        touched: impl FnOnce(u32) -> Vec<u64>,
    ) -> Result<(), BlockError> {
        let st = lock(&self.state);
        match fences {
            Some(f) if f.segment_bytes != self.segment_bytes => Err(BlockError::Rejected(format!(
                "a group fenced in segments of {} bytes; this SG's are {} bytes",
                f.segment_bytes, self.segment_bytes
            ))),
            Some(f) => {
                let gw = st.gw(source);
                for &(seg, gen) in &f.gens {
                    st.server.fence(gw, seg, gen).map_err(|e| BlockError::Rejected(format!("fenced: {e}")))?;
                }
                Ok(())
            }
            None if st.server.is_empty() => Ok(()),
            None => {
                for seg in touched(self.segment_bytes) {
                    let (ew, sr) = st.server.holders(seg);
                    if ew.is_some() || !sr.is_empty() {
                        return Err(BlockError::Rejected(format!(
                            "a group without token generations writes segment {seg}, which a gateway holds a token on"
                        )));
                    }
                }
                Ok(())
            }
        }
    }
}

#[cfg(test)]
#[expect(clippy::unwrap_used, reason = "tests")]
mod tests {
    use super::*;
    use std::sync::Arc;
    use stics_coherence::Kind;

    /// A source whose halves differ, as a UUID's do.
    fn src(n: u8) -> [u8; 16] {
        let mut s = [0; 16];
        s[0] = n;
        s
    }

    fn ex(t: &Tokens, source: u8, msgs: &[Msg]) {
        exch(t, &token::encode_exchange(&src(source), msgs), false).unwrap();
    }

    /// An exchange whose changes became durable at once.
    fn exch(t: &Tokens, body: &[u8], new_connection: bool) -> Result<(), BlockError> {
        let step = t.exchange(body, new_connection, Instant::now(), |_| 0)?;
        t.deliver(step.outs, false);
        Ok(())
    }

    thread_local! {
        /// The number of the next message each test gateway wants: what it has read so far.
        static FROM: std::cell::RefCell<BTreeMap<u8, u32>> = const { std::cell::RefCell::new(BTreeMap::new()) };
    }

    /// Polls for gateway `source`, acknowledging what it read before, as a gateway does; its
    /// first poll takes the numbers as they come.
    async fn poll(t: &Tokens, source: u8) -> Vec<Msg> {
        let from = FROM.with(|f| f.borrow().get(&source).copied());
        let (first, msgs) = poll_from(t, source, from.unwrap_or(0)).await;
        if let Some(from) = from {
            assert_eq!(first, from, "no gap");
        }
        FROM.with(|f| f.borrow_mut().insert(source, first.wrapping_add(msgs.len() as u32)));
        msgs
    }

    /// The number gateway `source` reads on from.
    fn from(source: u8) -> u32 {
        FROM.with(|f| f.borrow().get(&source).copied().unwrap_or(0))
    }

    async fn poll_from(t: &Tokens, source: u8, from: u32) -> (u32, Vec<Msg>) {
        let p = t.poll(stics_link::fence_of(&src(source)), from, Duration::from_millis(50), 1 << 16).await;
        (p.first, p.msgs)
    }

    /// An exchange at a journal that committed `epoch` of every source.
    fn ex_at(t: &Tokens, source: u8, msgs: &[Msg], epoch: u64, fresh: bool) {
        let step = t.exchange(&token::encode_exchange(&src(source), msgs), fresh, Instant::now(), |_| epoch).unwrap();
        t.deliver(step.outs, false);
    }

    /// The journal committed `source`'s groups through `epoch`: what that let through.
    fn commit(t: &Tokens, source: u8, epoch: u64) {
        if let Some(step) = t.committed(&src(source), epoch, Instant::now()) {
            t.deliver(step.outs, false);
        }
    }

    /// A poll of gateway `source` naming `from` that may wait `ms`, in a task of its own.
    fn poll_task(t: &Arc<Tokens>, source: u8, from: u32, ms: u64) -> tokio::task::JoinHandle<(u32, Vec<Msg>)> {
        let t = Arc::clone(t);
        tokio::spawn(async move {
            let p = t.poll(stics_link::fence_of(&src(source)), from, Duration::from_millis(ms), 1 << 16).await;
            (p.first, p.msgs)
        })
    }

    #[tokio::test]
    async fn of_two_polls_waiting_one_answers_news_and_the_other_waits_on() {
        let t = Arc::new(Tokens::new(Policy::default(), 64 << 10));
        ex(&t, 1, &[Msg::Request { op: 1, seg: 4, kind: Kind::Exclusive }]);
        assert!(matches!(poll(&t, 1).await[..], [Msg::Grant { seg: 4, .. }]));
        let base = from(1);
        // Both of gateway 1's polls wait; gateway 2's request revokes segment 4.
        let (mut a, mut b) = (poll_task(&t, 1, base, 5_000), poll_task(&t, 1, base, 5_000));
        tokio::time::sleep(Duration::from_millis(50)).await;
        ex(&t, 2, &[Msg::Request { op: 1, seg: 4, kind: Kind::Exclusive }]);
        let ((first, msgs), other) = tokio::select! {
            r = &mut a => (r.unwrap(), b),
            r = &mut b => (r.unwrap(), a),
        };
        assert_eq!(first, base);
        assert!(matches!(msgs[..], [Msg::Revoke { seg: 4, .. }]), "{msgs:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(!other.is_finished(), "the other poll stays waiting for the next news");
        // The gateway reads the revoke and polls again, acknowledging it: news for the standby
        // poll, which set out naming the revoke's number, is no gap.
        let next = base.wrapping_add(1);
        let third = poll_task(&t, 1, next, 5_000);
        tokio::time::sleep(Duration::from_millis(50)).await;
        ex(&t, 1, &[Msg::Request { op: 2, seg: 5, kind: Kind::Exclusive }]);
        let (first, msgs) = tokio::time::timeout(Duration::from_secs(2), other).await.unwrap().unwrap();
        assert_eq!(first, next, "answered from what the later poll acknowledged");
        assert!(matches!(msgs[..], [Msg::Grant { seg: 5, .. }]), "{msgs:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(!third.is_finished(), "the grant went to one poll only");
        third.abort();
    }

    #[tokio::test]
    async fn what_another_poll_had_is_said_again_at_the_end_of_a_wait_and_at_once_to_one_that_cannot_wait() {
        let t = Arc::new(Tokens::new(Policy::default(), 64 << 10));
        ex(&t, 1, &[Msg::Request { op: 1, seg: 4, kind: Kind::Exclusive }]);
        // The grant went to a poll whose answer was lost: the next poll reads it again, once
        // its wait is over (the other answer may still be on its way)...
        let (first, msgs) = poll_from(&t, 1, 0).await;
        assert!(matches!(msgs[..], [Msg::Grant { seg: 4, .. }]));
        let again = poll_task(&t, 1, first, 300);
        tokio::time::sleep(Duration::from_millis(150)).await;
        assert!(!again.is_finished(), "not said again at once");
        assert_eq!(again.await.unwrap(), (first, msgs.clone()));
        // ... and at once to a poll that may not wait (a gateway without a lease).
        let p = t.poll(stics_link::fence_of(&src(1)), first, Duration::ZERO, 1 << 16).await;
        assert_eq!((p.first, p.msgs), (first, msgs));
    }

    #[tokio::test]
    async fn what_a_reader_wants_goes_with_its_shared_grant_until_it_read_it() {
        let t = Tokens::new(Policy::default(), 64 << 10);
        let fold = stics_link::fence_of(&src(1));
        let wanted = |first, blocks, gen| vec![Wanted { seg: 4, gen, first, blocks }];
        ex(
            &t,
            1,
            &[Msg::Want { op: 1, seg: 4, first: 3, blocks: 2 }, Msg::Request { op: 1, seg: 4, kind: Kind::Shared }],
        );
        let p = t.poll(fold, 0, Duration::ZERO, 1 << 16).await;
        let [Msg::Grant { gen, kind: Kind::Shared, .. }] = p.msgs[..] else { panic!("{p:?}") };
        assert_eq!(p.wanted, wanted(3, 2, gen));
        // The answer was lost: the grant goes again, and so does what it was wanted with.
        let again = t.poll(fold, p.first, Duration::ZERO, 1 << 16).await;
        assert_eq!((again.msgs.clone(), again.wanted.clone()), (p.msgs.clone(), p.wanted.clone()));
        assert_eq!(t.status(Instant::now()).wants, 1);
        // Read and acknowledged: nothing more is wanted.
        let next = t.poll(fold, p.first.wrapping_add(1), Duration::ZERO, 1 << 16).await;
        assert!(next.msgs.is_empty() && next.wanted.is_empty());
        assert_eq!(t.status(Instant::now()).wants, 0);
        // An exclusive grant, or one nobody wanted anything with, carries nothing; an operation
        // that is done wants nothing more; nor does a gateway that starts afresh.
        ex(
            &t,
            2,
            &[Msg::Want { op: 1, seg: 5, first: 0, blocks: 1 }, Msg::Request { op: 1, seg: 5, kind: Kind::Exclusive }],
        );
        ex(&t, 2, &[Msg::Want { op: 2, seg: 6, first: 0, blocks: 1 }, Msg::Done { op: 2 }]);
        let p = t.poll(stics_link::fence_of(&src(2)), 0, Duration::ZERO, 1 << 16).await;
        assert!(matches!(p.msgs[..], [Msg::Grant { kind: Kind::Exclusive, .. }]) && p.wanted.is_empty(), "{p:?}");
        assert_eq!(t.status(Instant::now()).wants, 1);
        exch(&t, &token::encode_exchange(&src(2), &[]), true).unwrap();
        assert_eq!(t.status(Instant::now()).wants, 0);
    }

    #[tokio::test]
    async fn one_gateway_s_wants_are_capped_and_leave_room_for_the_others() {
        let t = Tokens::new(Policy::default(), 64 << 10);
        let flood: Vec<Msg> =
            (0..MAX_WANTS_PER_GATEWAY as u64 + 100).map(|op| Msg::Want { op, seg: op, first: 0, blocks: 1 }).collect();
        for chunk in flood.chunks(512) {
            ex(&t, 1, chunk);
        }
        assert_eq!(t.status(Instant::now()).wants, MAX_WANTS_PER_GATEWAY);
        // A want already kept is replaced, not refused; another gateway's is kept.
        ex(&t, 1, &[Msg::Want { op: 0, seg: 0, first: 5, blocks: 2 }]);
        ex(&t, 2, &[Msg::Want { op: 1, seg: 9, first: 0, blocks: 1 }]);
        assert_eq!(t.status(Instant::now()).wants, MAX_WANTS_PER_GATEWAY + 1);
    }

    #[tokio::test]
    async fn a_conditional_release_waits_for_its_epochs_and_only_the_newest_process_s_counts() {
        let t = Tokens::new(Policy::default(), 64 << 10);
        // Gateway 1 holds segment 4 exclusively; gateway 2 asks for it; 1 is revoked.
        ex_at(&t, 1, &[Msg::Hello { nonce: 100 }, Msg::Request { op: 1, seg: 4, kind: Kind::Exclusive }], 0, true);
        let Msg::Grant { gen, .. } = poll(&t, 1).await[0] else { panic!() };
        ex(&t, 2, &[Msg::Request { op: 1, seg: 4, kind: Kind::Exclusive }]);
        assert!(matches!(poll(&t, 2).await[..], [Msg::Queued { .. }]));
        assert!(matches!(poll(&t, 1).await[..], [Msg::Revoke { seg: 4, .. }]));
        // The revoke was queued once its record was durable and a poll of 1 took it; a poll
        // that reads it again (its answer lost) does not count it again.
        let st = t.status(Instant::now());
        assert_eq!((st.revokes_queued, st.revokes_polled), (1, 1));
        assert!(matches!(poll_from(&t, 1, from(1).wrapping_sub(1)).await.1[..], [Msg::Revoke { seg: 4, .. }]));
        assert_eq!(t.status(Instant::now()).revokes_polled, 1);
        // 1 gives it up after epoch 7, which the journal has not committed: nothing moves.
        ex_at(&t, 1, &[Msg::ReleaseAfter { seg: 4, gen, keep: None, after: 7, nonce: 100 }], 5, false);
        commit(&t, 1, 6);
        assert!(poll(&t, 2).await.is_empty(), "no grant before epoch 7 is committed");
        assert!(t.fence(&src(1), 4, gen).is_ok(), "1 still holds it: its group lands");
        // Another source's commit is not 1's.
        commit(&t, 2, 9);
        assert!(poll(&t, 2).await.is_empty());
        assert_eq!(t.status(Instant::now()).revokes_answered, 0);
        commit(&t, 1, 7);
        assert!(matches!(poll(&t, 2).await[..], [Msg::Grant { seg: 4, kind: Kind::Exclusive, .. }]));
        let st = t.status(Instant::now());
        assert_eq!((st.early_releases, st.revokes_answered, st.pending_releases), (1, 1, 0));
        assert!(t.fence(&src(1), 4, gen).is_err(), "released: 1's writes under it are fenced now");
        // The plain release that follows the finished surrender changes nothing.
        ex(&t, 1, &[Msg::Release { seg: 4, gen, keep: None }]);
        assert!(poll(&t, 2).await.is_empty());
        assert_eq!(t.status(Instant::now()).held_exclusive, 1);

        // Segment 5: a release whose epochs are committed already takes effect at once.
        ex_at(&t, 1, &[Msg::Request { op: 2, seg: 5, kind: Kind::Exclusive }], 0, false);
        let Msg::Grant { gen: g5, .. } = poll(&t, 1).await[0] else { panic!() };
        ex(&t, 2, &[Msg::Request { op: 2, seg: 5, kind: Kind::Exclusive }]);
        let _ = (poll(&t, 2).await, poll(&t, 1).await);
        ex_at(&t, 1, &[Msg::ReleaseAfter { seg: 5, gen: g5, keep: None, after: 7, nonce: 100 }], 7, false);
        assert!(matches!(poll(&t, 2).await[..], [Msg::Grant { seg: 5, .. }]));

        // Segment 6: gateway 1 restarts (a newer hello) while its release waits: the old
        // process's release is dropped, and so is one it sends late, after its successor's hello.
        ex_at(&t, 1, &[Msg::Request { op: 3, seg: 6, kind: Kind::Exclusive }], 0, false);
        let Msg::Grant { gen: g6, .. } = poll(&t, 1).await[0] else { panic!() };
        ex(&t, 2, &[Msg::Request { op: 3, seg: 6, kind: Kind::Exclusive }]);
        let _ = (poll(&t, 2).await, poll(&t, 1).await);
        ex_at(&t, 1, &[Msg::ReleaseAfter { seg: 6, gen: g6, keep: None, after: 9, nonce: 100 }], 7, false);
        ex_at(&t, 1, &[Msg::Hello { nonce: 200 }], 7, true);
        ex_at(&t, 1, &[Msg::ReleaseAfter { seg: 6, gen: g6, keep: None, after: 8, nonce: 100 }], 7, false);
        commit(&t, 1, 9);
        let _ = poll_from(&t, 1, from(1)).await;
        assert!(!poll(&t, 2).await.iter().any(|m| matches!(m, Msg::Grant { seg: 6, .. })), "no grant of 6");
        assert!(t.fence(&src(1), 6, g6).is_ok(), "the restarted gateway still holds 6");
        // An older hello does not bring the old process back.
        ex_at(
            &t,
            1,
            &[Msg::Hello { nonce: 150 }, Msg::ReleaseAfter { seg: 6, gen: g6, keep: None, after: 1, nonce: 150 }],
            9,
            false,
        );
        assert!(t.fence(&src(1), 6, g6).is_ok());
        // The new process's own release counts.
        ex_at(&t, 1, &[Msg::ReleaseAfter { seg: 6, gen: g6, keep: None, after: 9, nonce: 200 }], 9, false);
        assert!(t.fence(&src(1), 6, g6).is_err());
    }

    #[tokio::test]
    async fn a_conditional_release_from_a_gateway_that_never_said_hello_is_dropped() {
        let t = Tokens::new(Policy::default(), 64 << 10);
        ex(&t, 1, &[Msg::Request { op: 1, seg: 4, kind: Kind::Exclusive }]);
        let Msg::Grant { gen, .. } = poll(&t, 1).await[0] else { panic!() };
        ex_at(&t, 1, &[Msg::ReleaseAfter { seg: 4, gen, keep: None, after: 1, nonce: 0 }], 9, false);
        assert!(t.fence(&src(1), 4, gen).is_ok());
        assert!(t.committed(&src(1), 9, Instant::now()).is_none(), "nothing waits");
    }

    #[tokio::test]
    async fn two_gateways_trade_a_segment_through_exchanges_and_polls() {
        let t = Tokens::new(Policy::default(), 64 << 10);
        let empty = t.copy_len();
        ex(&t, 1, &[Msg::Request { op: 1, seg: 4, kind: Kind::Exclusive }]);
        assert_eq!(t.copy_len(), empty + 24 + 20, "a segment and a gateway more, seen after the step");
        let got = poll(&t, 1).await;
        let Msg::Grant { gen, .. } = got[0] else { panic!("{got:?}") };
        ex(&t, 2, &[Msg::Request { op: 1, seg: 4, kind: Kind::Exclusive }]);
        assert!(matches!(poll(&t, 2).await[..], [Msg::Queued { .. }]));
        let p = poll(&t, 1).await;
        assert!(matches!(p[..], [Msg::Revoke { seg: 4, .. }]), "{p:?}");
        assert!(poll(&t, 1).await.is_empty(), "an empty poll answers after its wait");
        assert!(t.fence(&src(1), 4, gen).is_ok() && t.fence(&src(2), 4, gen).is_err());
        // A poll that waits is answered as soon as there is something for it.
        let waiting = poll(&t, 2);
        ex(&t, 1, &[Msg::Release { seg: 4, gen, keep: None }]);
        assert!(matches!(waiting.await[..], [Msg::Grant { seg: 4, kind: Kind::Exclusive, .. }]));
        let s = t.status(Instant::now());
        assert_eq!((s.gateways, s.held_exclusive, s.grants, s.revokes), (2, 1, 2, 1));
    }

    #[tokio::test]
    async fn bad_exchanges_are_refused_and_the_table_serves_on() {
        let t = Tokens::new(Policy::default(), 64 << 10);
        assert!(exch(&t, b"short", false).is_err());
        let sg_only = token::encode_exchange(&src(1), &[Msg::Queued { op: 1, ticket: 1 }]);
        assert!(exch(&t, &sg_only, false).is_err());
        // Two sources that fold alike ([1; 16] and [2; 16] both fold to 1): the second is refused.
        exch(&t, &token::encode_exchange(&[1; 16], &[]), false).unwrap();
        assert!(exch(&t, &token::encode_exchange(&[2; 16], &[]), false).is_err());
        ex(&t, 1, &[Msg::Request { op: 1, seg: 0, kind: Kind::Shared }]);
        assert_eq!(poll(&t, 1).await.len(), 1);
        assert!(poll(&t, 9).await.is_empty(), "an unknown gateway has nothing");
    }

    #[tokio::test]
    async fn a_gateway_that_never_polls_keeps_a_bounded_queue() {
        let t = Tokens::new(Policy::default(), 64 << 10);
        ex(&t, 1, &[Msg::Request { op: 99_999, seg: 99_999, kind: Kind::Shared }]);
        poll(&t, 1).await;
        let start = from(1);
        for round in 0..3u64 {
            let reqs: Vec<Msg> = (0..MAX_EXCHANGE as u64)
                .map(|i| Msg::Request { op: round * 10_000 + i, seg: round * 10_000 + i, kind: Kind::Shared })
                .collect();
            ex(&t, 1, &reqs);
        }
        let queued = lock(&t.state).queued.values().map(|q| q.msgs.len()).sum::<usize>();
        assert!(queued <= MAX_QUEUED, "{queued}");
        let (first, _) = poll_from(&t, 1, start).await;
        assert_ne!(first, start, "a gap tells the gateway it lost messages");
        let too_many: Vec<Msg> = (0..=MAX_EXCHANGE as u64).map(|op| Msg::Done { op }).collect();
        assert!(exch(&t, &token::encode_exchange(&src(1), &too_many), false).is_err());
    }

    #[tokio::test]
    async fn a_lost_answer_is_read_again_and_a_fresh_start_hears_its_revokes_again() {
        let t = Tokens::new(Policy::default(), 64 << 10);
        ex(&t, 1, &[Msg::Request { op: 1, seg: 2, kind: Kind::Exclusive }]);
        poll(&t, 1).await;
        let n = from(1);
        ex(&t, 2, &[Msg::Request { op: 1, seg: 2, kind: Kind::Shared }]);
        assert!(matches!(poll(&t, 1).await[..], [Msg::Revoke { .. }]));
        // That answer was lost with the connection: asked again from the same number, it comes
        // again; asked from past it, it is acknowledged and gone.
        let (first, again) = poll_from(&t, 1, n).await;
        assert!(first == n && matches!(again[..], [Msg::Revoke { .. }]), "{again:?}");
        assert_eq!(poll_from(&t, 1, n.wrapping_add(1)).await, (n.wrapping_add(1), vec![]));
        // A gateway that starts afresh hears what it holds and the revoke it has not answered
        // again, in that order, numbered on from where it read: no gap of its own making.
        exch(&t, &token::encode_exchange(&src(1), &[]), true).unwrap();
        let (first, msgs) = poll_from(&t, 1, n.wrapping_add(1)).await;
        assert!(
            first == n.wrapping_add(1)
                && matches!(msgs[..], [Msg::Grant { seg: 2, kind: Kind::Exclusive, .. }, Msg::Revoke { seg: 2, .. }]),
            "{first} {msgs:?}"
        );
        // Numbers never sent: the answer says from where on there are messages.
        assert_eq!(poll_from(&t, 1, n.wrapping_add(99)).await.0, n.wrapping_add(1));
        // A restarted gateway's fresh exchange drops what was queued for the process before it
        // (its operation numbers were that process's), and numbers on past it.
        ex(&t, 3, &[Msg::Request { op: 1, seg: 2, kind: Kind::Exclusive }]);
        exch(&t, &token::encode_exchange(&src(1), &[]), true).unwrap();
        let (first, msgs) = poll_from(&t, 1, n.wrapping_add(1)).await;
        assert_ne!(first, n.wrapping_add(1), "what was queued before went");
        assert!(matches!(msgs[..], [Msg::Grant { op: 0, seg: 2, .. }, Msg::Revoke { seg: 2, .. }]), "{msgs:?}");
    }

    #[tokio::test]
    async fn after_a_restart_the_gap_is_seen_once_and_the_fresh_exchange_makes_none() {
        let t = Tokens::new(Policy::default(), 64 << 10);
        ex(&t, 1, &[Msg::Request { op: 1, seg: 2, kind: Kind::Exclusive }]);
        assert_eq!(poll(&t, 1).await.len(), 1);
        // The SG restarts: its queues start again, and the gateway's number is not among them.
        let t = Tokens::new(Policy::default(), 64 << 10);
        ex(&t, 1, &[Msg::Request { op: 2, seg: 3, kind: Kind::Exclusive }]);
        let n = from(1);
        let (first, msgs) = poll_from(&t, 1, n).await;
        assert_ne!(first, n, "the gateway learns that messages were lost");
        // It starts afresh (asks again for what it waits for, flagged new) and reads on from
        // where the answer left it: no second gap, and the new grant comes.
        exch(&t, &token::encode_exchange(&src(1), &[Msg::Request { op: 2, seg: 3, kind: Kind::Exclusive }]), true)
            .unwrap();
        let from = first.wrapping_add(msgs.len() as u32);
        let (again, more) = poll_from(&t, 1, from).await;
        assert_eq!(again, from, "the fresh exchange made no gap of its own");
        assert!(msgs.iter().chain(&more).any(|m| matches!(m, Msg::Grant { seg: 3, .. })), "{msgs:?} {more:?}");
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(256))]

        /// Whatever the gateways do, the journal's records (each step's changes, or now and then
        /// the whole table in their place), encoded, decoded and folded in order, give back the
        /// table the server holds: what a restarted SG restores is what it had.
        #[test]
        fn the_records_fold_back_into_the_table(
            ops in proptest::collection::vec((0u8..3, 0u8..4, 0u64..6, proptest::bool::ANY), 1..120)
        ) {
            let t = Tokens::new(Policy::default(), 64 << 10);
            let mut table = TokenTable::default();
            let now = Instant::now();
            for (i, (g, what, seg, copy)) in ops.into_iter().enumerate() {
                let gw = Gw::from(g);
                let held = lock(&t.state).server.entries().into_iter().find(|e| e.seg == seg);
                let gen_of = |e: &Entry| e.ew.filter(|h| h.0 == gw).or_else(|| e.sr.iter().copied().find(|h| h.0 == gw)).map(|h| h.1);
                let msg = match what {
                    0 => Msg::Request { op: i as u64, seg, kind: stics_coherence::Kind::Shared },
                    1 => Msg::Request { op: i as u64, seg, kind: stics_coherence::Kind::Exclusive },
                    2 => match held.as_ref().and_then(gen_of) {
                        Some(gen) => Msg::Release { seg, gen, keep: None },
                        None => Msg::Done { op: i as u64 },
                    },
                    _ => Msg::Done { op: (i as u64).saturating_sub(1) },
                };
                let step = t.exchange(&token::encode_exchange(&src(g + 1), &[msg]), i % 7 == 0, now, |_| 0).unwrap();
                let record = if copy { t.copy() } else { step.record };
                table.apply(TokenRecord::decode(&record.encode()).unwrap());
                t.deliver(step.outs, copy);
                let whole = t.copy();
                let mut want = TokenTable::default();
                want.apply(whole);
                proptest::prop_assert_eq!(&table, &want);
            }
        }
    }
}
