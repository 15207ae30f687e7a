//! The lock server's decisions (seed 004 §3.4's LS table at the storage), pure: who holds which
//! token on which segment, who waits for it and in what order, what to grant, revoke or break,
//! and whether a write made under a token is still good (the fence).
//!
//! The table has an entry only for a segment someone holds or waits for: 32 bytes while one
//! gateway holds it exclusively and nobody waits, about 100 with the B-tree's own (a million held
//! segments: `cargo run --release -p stics-coherence --example table_size`). Seed 004's table is dense, 9 bytes for every segment (36 MB per TB); this
//! one is bounded by what the gateways hold, not by the LUN's size.
//!
//! Waiters stand in line by ticket: an operation gets one when its first request arrives and
//! keeps it until it says `Done`, so the oldest operation is first in every line it stands in.
//! Only the first waiter of a line revokes, and a gateway gives up a token an operation of its own
//! still waits on only for an older one ([`crate::client`]): the oldest operation always
//! completes, so several gateways never deadlock or livelock.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use stics_link::token::{Kind, Msg};

use crate::{Fenced, Gw};

/// How the server treats gateways that stop answering.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Policy {
    /// How long a gateway may use its tokens after the server last heard from it. A shared
    /// token whose holder has been silent longer (and a bit more, for clocks that run at
    /// slightly different rates) is taken away when someone needs it: its holder stopped
    /// serving from it.
    pub lease: Duration,
    /// Take an exclusive token away from a holder silent this long (and past its lease);
    /// `None` (the default): wait for it, since it may hold acknowledged writes no one else has.
    pub break_after: Option<Duration>,
}

impl Default for Policy {
    fn default() -> Policy {
        // Seed 004's timeout for an unreachable lock owner.
        Policy { lease: Duration::from_secs(30), break_after: None }
    }
}

/// A message for a gateway.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Out {
    pub to: Gw,
    pub msg: Msg,
}

#[derive(Debug, Clone)]
struct Wait {
    gw: Gw,
    op: u64,
    kind: Kind,
    ticket: u64,
    since: Instant,
}

#[derive(Debug, Clone, Copy)]
struct Revoked {
    ticket: u64,
    keep: Option<Kind>,
}

/// One segment's entry of the LS table: 32 bytes while one gateway holds it exclusively and
/// nobody waits, the common case; the rest only while there is some.
#[derive(Debug, Clone, Default)]
struct Seg {
    /// The exclusive holder and the generation of its grant. Every grant has a generation no
    /// other grant had, so an answer names the one it means.
    ew: Option<(Gw, u64)>,
    more: Option<Box<More>>,
}

#[derive(Debug, Clone, Default)]
struct More {
    /// The shared holders and the generations of their grants.
    sr: BTreeMap<Gw, u64>,
    /// Waiters, oldest ticket first.
    line: Vec<Wait>,
    /// Revokes sent and not yet complied with, by holder.
    revoked: BTreeMap<Gw, Revoked>,
}

static NONE: More = More { sr: BTreeMap::new(), line: Vec::new(), revoked: BTreeMap::new() };

impl Seg {
    fn m(&self) -> &More {
        self.more.as_deref().unwrap_or(&NONE)
    }

    fn mm(&mut self) -> &mut More {
        self.more.get_or_insert_with(Box::default)
    }

    /// Drops what is empty.
    fn tidy(&mut self) {
        if self.more.as_ref().is_some_and(|m| m.sr.is_empty() && m.line.is_empty() && m.revoked.is_empty()) {
            self.more = None;
        }
    }

    fn idle(&self) -> bool {
        self.ew.is_none() && self.m().sr.is_empty() && self.m().line.is_empty()
    }

    fn holds(&self, gw: Gw) -> Option<(Kind, u64)> {
        match self.ew {
            Some((h, gen)) if h == gw => Some((Kind::Exclusive, gen)),
            _ => self.m().sr.get(&gw).map(|&gen| (Kind::Shared, gen)),
        }
    }

    fn compatible(&self, gw: Gw, kind: Kind) -> bool {
        let ew_ok = self.ew.is_none_or(|(h, _)| h == gw);
        match kind {
            Kind::Shared => ew_ok,
            Kind::Exclusive => ew_ok && self.m().sr.keys().all(|&h| h == gw),
        }
    }
}

/// What the journal keeps of one segment so that tokens survive a restart: its holders and the
/// generations of their grants (waiters are not kept: gateways ask again when they reconnect).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub seg: u64,
    pub ew: Option<(Gw, u64)>,
    pub sr: Vec<(Gw, u64)>,
}

/// What changed since the journal last took it ([`Server::take_changes`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Changes {
    /// Changed segments' entries (`None`: the segment is free).
    pub segs: Vec<(u64, Option<Entry>)>,
    /// Every broken token not yet acknowledged (gateway, segment, generation), when that list
    /// changed: a restarted SG must still tell their holders.
    pub untold: Option<Vec<(Gw, u64, u64)>>,
    /// The generation counter a restore continues from.
    pub next_gen: u64,
}

/// A segment someone waits for, and on whom: for `/status`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Blocked {
    pub seg: u64,
    /// Who holds what the first waiter needs, and how long since the server heard from them.
    pub holders: Vec<(Gw, Kind, Duration)>,
    /// Who waits, first in line first, and for how long.
    pub waiters: Vec<(Gw, Kind, Duration)>,
}

/// The message that tells a holder its token was taken away.
fn told(b: &Broke) -> Out {
    Out { to: b.gw, msg: Msg::Broken { seg: b.seg, gen: b.gen } }
}

/// A token taken away from a holder that did not answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Broke {
    pub gw: Gw,
    pub seg: u64,
    pub kind: Kind,
    pub gen: u64,
}

/// Counters for metrics.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counts {
    pub grants: u64,
    pub revokes: u64,
    pub releases: u64,
    pub breaks: u64,
}

/// The lock server of one shared LUN.
#[derive(Debug)]
pub struct Server {
    policy: Policy,
    segs: BTreeMap<u64, Seg>,
    /// Each operation's ticket, kept from its first request to its `Done`.
    tickets: BTreeMap<(Gw, u64), u64>,
    /// The segments each operation waits for.
    waiting: BTreeMap<(Gw, u64), BTreeSet<u64>>,
    next_ticket: u64,
    /// Every grant takes a new one, so an old one is never good again.
    next_gen: u64,
    heard: BTreeMap<Gw, Instant>,
    /// Broken tokens each gateway has not acknowledged.
    untold: BTreeMap<Gw, Vec<(u64, u64)>>,
    /// Segments whose holders changed since the journal last took them, and whether the broken
    /// tokens not yet acknowledged changed.
    changed: BTreeSet<u64>,
    untold_changed: bool,
    counts: Counts,
}

impl Server {
    /// An empty table.
    pub fn new(policy: Policy) -> Server {
        Server {
            policy,
            segs: BTreeMap::new(),
            tickets: BTreeMap::new(),
            waiting: BTreeMap::new(),
            next_ticket: 1,
            next_gen: 1,
            heard: BTreeMap::new(),
            untold: BTreeMap::new(),
            changed: BTreeSet::new(),
            untold_changed: false,
            counts: Counts::default(),
        }
    }

    /// The table as the journal kept it: every holder keeps its token and, from `now`, a lease
    /// in which to come back; holders of broken tokens are still told; generations go on from
    /// past `next_gen`.
    pub fn restore(
        policy: Policy,
        entries: &[Entry],
        untold: &[(Gw, u64, u64)],
        next_gen: u64,
        now: Instant,
    ) -> Server {
        let mut s = Server::new(policy);
        for &(gw, seg, gen) in untold {
            s.untold.entry(gw).or_default().push((seg, gen));
            s.next_gen = s.next_gen.max(gen + 1);
        }
        for e in entries {
            let mut seg = Seg { ew: e.ew, more: None };
            seg.mm().sr = e.sr.iter().copied().collect();
            seg.tidy();
            for &(gw, gen) in e.ew.iter().chain(e.sr.iter()) {
                s.heard.insert(gw, now);
                s.next_gen = s.next_gen.max(gen + 1);
            }
            s.segs.insert(e.seg, seg);
        }
        s.next_gen = s.next_gen.max(next_gen);
        s
    }

    /// Takes what changed since the last call; the driver makes it durable before it sends
    /// what the calls that changed it returned.
    pub fn take_changes(&mut self) -> Changes {
        let changed = std::mem::take(&mut self.changed);
        let segs = changed.into_iter().map(|seg| (seg, self.entry(seg))).collect();
        let untold = std::mem::take(&mut self.untold_changed).then(|| self.untold());
        Changes { segs, untold, next_gen: self.next_gen }
    }

    /// Every broken token not yet acknowledged: (gateway, segment, generation).
    pub fn untold(&self) -> Vec<(Gw, u64, u64)> {
        self.untold.iter().flat_map(|(&gw, v)| v.iter().map(move |&(seg, gen)| (gw, seg, gen))).collect()
    }

    fn entry(&self, seg: u64) -> Option<Entry> {
        let s = self.segs.get(&seg)?;
        (s.ew.is_some() || !s.m().sr.is_empty()).then(|| Entry {
            seg,
            ew: s.ew,
            sr: s.m().sr.iter().map(|(&g, &n)| (g, n)).collect(),
        })
    }

    /// Every held segment's entry, in segment order.
    pub fn entries(&self) -> Vec<Entry> {
        self.segs.keys().filter_map(|&seg| self.entry(seg)).collect()
    }

    /// Segments in the table (held or waited for).
    pub fn len(&self) -> usize {
        self.segs.len()
    }

    /// True when nobody holds or waits for anything.
    pub fn is_empty(&self) -> bool {
        self.segs.is_empty()
    }

    /// Grants, revokes, releases and breaks so far.
    pub fn counts(&self) -> Counts {
        self.counts
    }

    /// Who holds `seg`: the exclusive holder and its generation, and the shared holders.
    pub fn holders(&self, seg: u64) -> (Option<(Gw, u64)>, Vec<Gw>) {
        self.segs.get(&seg).map_or((None, Vec::new()), |s| (s.ew, s.m().sr.keys().copied().collect()))
    }

    /// The first segment of `segs` someone holds a token on.
    pub fn first_held(&self, segs: std::ops::RangeInclusive<u64>) -> Option<u64> {
        self.segs.range(segs).find(|(_, s)| s.ew.is_some() || !s.m().sr.is_empty()).map(|(&seg, _)| seg)
    }

    /// Tokens held, by kind.
    pub fn held(&self) -> (usize, usize) {
        self.segs.values().fold((0, 0), |(sr, ew), s| (sr + s.m().sr.len(), ew + usize::from(s.ew.is_some())))
    }

    /// Whether a write to `seg` made under generation `gen` by `gw` may land: only while `gw`
    /// still holds the exclusive token granted under `gen`, and has acknowledged every token of
    /// `seg` broken under it (a gateway ships its dirty blocks under the token it holds when it
    /// ships them, so until it knows of the break, blocks written under the broken token may ride
    /// under a newer one: a restarted gateway, or one whose `Broken` was lost, that asked for the
    /// segment again).
    pub fn fence(&self, gw: Gw, seg: u64, gen: u64) -> Result<(), Fenced> {
        let ew = self.segs.get(&seg).and_then(|s| s.ew);
        let told = !self.untold.get(&gw).is_some_and(|v| v.iter().any(|&(s, _)| s == seg));
        if told && ew == Some((gw, gen)) {
            Ok(())
        } else {
            Err(Fenced { seg, gen, holder: ew.map(|h| h.0), current: ew.map_or(0, |h| h.1) })
        }
    }

    /// Takes a batch of messages from `from`.
    pub fn handle(&mut self, from: Gw, msgs: &[Msg], now: Instant) -> Vec<Out> {
        self.heard.insert(from, now);
        // A broken token's release is its holder's acknowledgement that it knows.
        if let Some(untold) = self.untold.get_mut(&from) {
            let before = untold.len();
            untold.retain(|&(seg, gen)| !msgs.contains(&Msg::Release { seg, gen, keep: None }));
            self.untold_changed |= untold.len() != before;
            if untold.is_empty() {
                self.untold.remove(&from);
            }
        }
        // Every answer starts with what the gateway has not acknowledged: an answer may be lost.
        let mut out: Vec<Out> = self
            .untold
            .get(&from)
            .into_iter()
            .flatten()
            .map(|&(seg, gen)| Out { to: from, msg: Msg::Broken { seg, gen } })
            .collect();
        let mut queued = BTreeSet::new();
        for m in msgs {
            match *m {
                Msg::Request { op, seg, kind } => {
                    let ticket = self.ticket(from, op);
                    let s = self.segs.entry(seg).or_default();
                    if let Some((held, gen)) = s.holds(from) {
                        if held.covers(kind) && !s.m().revoked.contains_key(&from) {
                            out.push(Out { to: from, msg: Msg::Grant { op, seg, kind: held, gen, ticket } });
                            continue;
                        }
                    }
                    let line = &mut s.mm().line;
                    match line.iter_mut().find(|w| w.gw == from && w.op == op) {
                        Some(w) => w.kind = w.kind.max(kind),
                        None => {
                            let at = line.partition_point(|w| w.ticket <= ticket);
                            line.insert(at, Wait { gw: from, op, kind, ticket, since: now });
                        }
                    }
                    self.waiting.entry((from, op)).or_default().insert(seg);
                    let before = out.len();
                    self.serve(seg, &mut out);
                    let granted = out[before..].iter().any(
                        |o| matches!(o.msg, Msg::Grant { op: g, seg: s, .. } if o.to == from && g == op && s == seg),
                    );
                    if !granted && queued.insert(op) {
                        out.push(Out { to: from, msg: Msg::Queued { op, ticket } });
                    }
                }
                Msg::Release { seg, gen, keep } => {
                    self.release(from, seg, gen, keep);
                    self.serve(seg, &mut out);
                }
                Msg::Done { op } => {
                    self.tickets.remove(&(from, op));
                    for seg in self.waiting.remove(&(from, op)).unwrap_or_default() {
                        if let Some(s) = self.segs.get_mut(&seg) {
                            s.mm().line.retain(|w| !(w.gw == from && w.op == op));
                        }
                        self.serve(seg, &mut out);
                    }
                }
                // A gateway never sends these; a confused one is ignored rather than obeyed.
                Msg::Queued { .. } | Msg::Grant { .. } | Msg::Revoke { .. } | Msg::Broken { .. } => {}
                // What waits for the journal (a release after epochs it has not committed yet,
                // and who the sender is) is the SG's driver's: it hands the release on as a
                // `Release` when it may take effect. The blocks a reader wants with its grant are
                // the driver's too: the table has no part in them.
                Msg::ReleaseAfter { .. } | Msg::Hello { .. } | Msg::Want { .. } => {}
            }
        }
        out
    }

    /// `gw`'s connection was lost and is back, or it restarted: what was sent to it may be lost,
    /// so every token it holds is granted again (same generation: a restarted gateway learns what
    /// it holds, with the writes in its log made under it) and revokes that it has not answered
    /// are sent again, after them (it asks again for what it waits for).
    pub fn reconnected(&mut self, gw: Gw, now: Instant) -> Vec<Out> {
        self.heard.insert(gw, now);
        let mut out: Vec<Out> = self
            .segs
            .iter()
            .filter_map(|(&seg, s)| {
                let (kind, gen) = s.holds(gw)?;
                Some(Out { to: gw, msg: Msg::Grant { op: 0, seg, kind, gen, ticket: 0 } })
            })
            .collect();
        // Its operations ask again (a restarted gateway's are gone): their places in line go,
        // and what they held up is served.
        let ops: Vec<(Gw, u64)> = self.waiting.range((gw, 0)..=(gw, u64::MAX)).map(|(&k, _)| k).collect();
        let mut segs: BTreeSet<u64> = BTreeSet::new();
        for key in ops {
            self.tickets.remove(&key);
            for seg in self.waiting.remove(&key).unwrap_or_default() {
                if let Some(s) = self.segs.get_mut(&seg) {
                    s.mm().line.retain(|w| !(w.gw == key.0 && w.op == key.1));
                    s.tidy();
                }
                segs.insert(seg);
            }
        }
        self.tickets.retain(|&(g, _), _| g != gw);
        segs.extend(self.segs.iter_mut().filter_map(|(&seg, s)| s.more.as_mut()?.revoked.remove(&gw).map(|_| seg)));
        for seg in segs {
            self.serve(seg, &mut out);
        }
        out
    }

    fn ticket(&mut self, gw: Gw, op: u64) -> u64 {
        let next = &mut self.next_ticket;
        *self.tickets.entry((gw, op)).or_insert_with(|| {
            *next += 1;
            *next - 1
        })
    }

    fn release(&mut self, from: Gw, seg: u64, gen: u64, keep: Option<Kind>) {
        let Some(s) = self.segs.get_mut(&seg) else { return };
        // Anything else answers a token that is gone already (broken, or released twice).
        if s.ew == Some((from, gen)) {
            s.ew = None;
            if keep == Some(Kind::Shared) {
                s.mm().sr.insert(from, gen);
            }
        } else if s.m().sr.get(&from) == Some(&gen) && keep.is_none() {
            s.mm().sr.remove(&from);
        } else {
            return;
        }
        self.counts.releases += 1;
        self.changed.insert(seg);
        // A revoke is answered when what is left no longer stands in the way it asked about.
        if s.holds(from)
            .is_none_or(|(k, _)| s.m().revoked.get(&from).is_some_and(|r| r.keep.is_some_and(|keep| keep >= k)))
        {
            s.mm().revoked.remove(&from);
        }
    }

    /// Grants what the line's head can have, in order; revokes for the first who cannot.
    fn serve(&mut self, seg: u64, out: &mut Vec<Out>) {
        let Some(s) = self.segs.get_mut(&seg) else { return };
        while let Some(w) = s.m().line.first().cloned() {
            if !s.compatible(w.gw, w.kind) {
                let mut conflicts: Vec<(Gw, u64, Option<Kind>)> = Vec::new();
                if let Some((h, gen)) = s.ew {
                    conflicts.push((h, gen, (w.kind == Kind::Shared).then_some(Kind::Shared)));
                }
                if w.kind == Kind::Exclusive {
                    conflicts.extend(s.m().sr.iter().map(|(&h, &gen)| (h, gen, None)));
                }
                for (h, gen, keep) in conflicts.into_iter().filter(|c| c.0 != w.gw) {
                    let stronger = |r: &Revoked| w.ticket < r.ticket || (keep.is_none() && r.keep.is_some());
                    if s.m().revoked.get(&h).is_none_or(stronger) {
                        s.mm().revoked.insert(h, Revoked { ticket: w.ticket, keep });
                        self.counts.revokes += 1;
                        out.push(Out { to: h, msg: Msg::Revoke { seg, gen, keep, ticket: w.ticket } });
                    }
                }
                break;
            }
            s.mm().line.remove(0);
            if let Some(ops) = self.waiting.get_mut(&(w.gw, w.op)) {
                ops.remove(&seg);
            }
            // A holder that holds enough already is granted the token it has, generation and any
            // revoke unchanged: it may be shipping under that generation. Anything else is a new
            // token under a new generation.
            let (kind, gen, new) = match (w.kind, s.holds(w.gw)) {
                (_, Some((Kind::Exclusive, gen))) => (Kind::Exclusive, gen, false),
                (Kind::Shared, Some((Kind::Shared, gen))) => (Kind::Shared, gen, false),
                (kind, _) => {
                    let gen = self.next_gen;
                    self.next_gen += 1;
                    s.mm().sr.remove(&w.gw);
                    match kind {
                        Kind::Exclusive => s.ew = Some((w.gw, gen)),
                        Kind::Shared => {
                            s.mm().sr.insert(w.gw, gen);
                        }
                    }
                    (kind, gen, true)
                }
            };
            if new {
                s.mm().revoked.remove(&w.gw);
            }
            self.counts.grants += 1;
            self.changed.insert(seg);
            out.push(Out { to: w.gw, msg: Msg::Grant { op: w.op, seg, kind, gen, ticket: w.ticket } });
        }
        s.tidy();
        if s.idle() {
            self.segs.remove(&seg);
        }
    }

    /// Takes away, where the policy allows, tokens that someone waits for from holders that have
    /// been silent past their lease: shared ones always (their holders stopped serving from them),
    /// exclusive ones after `break_after`.
    pub fn tick(&mut self, now: Instant) -> (Vec<Out>, Vec<Broke>) {
        let margin = self.policy.lease + self.policy.lease / 8;
        let silent = |heard: &BTreeMap<Gw, Instant>, gw: Gw, after: Duration| {
            heard.get(&gw).is_none_or(|t| now.saturating_duration_since(*t) > after.max(margin))
        };
        let mut doomed = Vec::new();
        for (&seg, s) in &self.segs {
            for &h in s.m().revoked.keys() {
                match s.holds(h).map(|x| x.0) {
                    Some(Kind::Shared) if silent(&self.heard, h, margin) => doomed.push((seg, h)),
                    Some(Kind::Exclusive) => {
                        if let Some(after) = self.policy.break_after {
                            if silent(&self.heard, h, after) {
                                doomed.push((seg, h));
                            }
                        }
                    }
                    _ => {}
                }
            }
        }
        let mut out = Vec::new();
        let mut broke = Vec::new();
        for (seg, h) in doomed {
            if let Some(b) = self.take_away(seg, h) {
                out.push(told(&b));
                broke.push(b);
            }
            self.serve(seg, &mut out);
        }
        (out, broke)
    }

    /// An operator takes `seg`'s tokens away from every holder that has been asked to give them
    /// up: what they did not ship is refused from now on.
    pub fn break_segment(&mut self, seg: u64) -> (Vec<Out>, Vec<Broke>) {
        let holders: Vec<Gw> = self.segs.get(&seg).map(|s| s.m().revoked.keys().copied().collect()).unwrap_or_default();
        let broke: Vec<Broke> = holders.into_iter().filter_map(|h| self.take_away(seg, h)).collect();
        let mut out: Vec<Out> = broke.iter().map(told).collect();
        self.serve(seg, &mut out);
        (out, broke)
    }

    /// Takes `h`'s token on `seg` away. The holder is told at once (a silent one may be only
    /// slow, and a writer that hears of it soon puts its writes in quarantine soon), and again
    /// in every answer until it acknowledges it.
    fn take_away(&mut self, seg: u64, h: Gw) -> Option<Broke> {
        let s = self.segs.get_mut(&seg)?;
        let (kind, gen) = s.holds(h)?;
        match kind {
            Kind::Exclusive => s.ew = None,
            Kind::Shared => {
                s.mm().sr.remove(&h);
            }
        }
        s.mm().revoked.remove(&h);
        s.tidy();
        self.counts.breaks += 1;
        self.changed.insert(seg);
        self.untold.entry(h).or_default().push((seg, gen));
        self.untold_changed = true;
        Some(Broke { gw: h, seg, kind, gen })
    }

    /// Every segment someone waits for, with who stands in the way: what `/status` shows.
    pub fn blocked(&self, now: Instant) -> Vec<Blocked> {
        let ago = |gw: Gw| self.heard.get(&gw).map_or(Duration::MAX, |t| now.saturating_duration_since(*t));
        self.segs
            .iter()
            .filter(|(_, s)| !s.m().line.is_empty())
            .map(|(&seg, s)| Blocked {
                seg,
                holders: s.m().revoked.keys().filter_map(|&h| Some((h, s.holds(h)?.0, ago(h)))).collect(),
                waiters: s.m().line.iter().map(|w| (w.gw, w.kind, now.saturating_duration_since(w.since))).collect(),
            })
            .collect()
    }
}

#[cfg(test)]
#[expect(clippy::unwrap_used, reason = "tests")]
mod tests {
    use super::*;

    fn req(op: u64, seg: u64, kind: Kind) -> Msg {
        Msg::Request { op, seg, kind }
    }

    fn grants(out: &[Out]) -> Vec<(Gw, u64, Kind)> {
        out.iter()
            .filter_map(|o| match o.msg {
                Msg::Grant { seg, kind, .. } => Some((o.to, seg, kind)),
                _ => None,
            })
            .collect()
    }

    fn revokes(out: &[Out]) -> Vec<(Gw, u64, Option<Kind>, u64)> {
        out.iter()
            .filter_map(|o| match o.msg {
                Msg::Revoke { seg, keep, ticket, .. } => Some((o.to, seg, keep, ticket)),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn readers_share_a_writer_is_alone_and_the_writer_downgrades_for_a_reader() {
        let t = Instant::now();
        let mut s = Server::new(Policy::default());
        assert_eq!(grants(&s.handle(1, &[req(1, 7, Kind::Shared)], t)), [(1, 7, Kind::Shared)]);
        assert_eq!(grants(&s.handle(2, &[req(1, 7, Kind::Shared)], t)), [(2, 7, Kind::Shared)]);
        let out = s.handle(3, &[req(1, 7, Kind::Exclusive)], t);
        assert!(grants(&out).is_empty());
        assert_eq!(revokes(&out), [(1, 7, None, 3), (2, 7, None, 3)]);
        assert!(out.contains(&Out { to: 3, msg: Msg::Queued { op: 1, ticket: 3 } }));
        assert!(grants(&s.handle(2, &[Msg::Release { seg: 7, gen: 1, keep: None }], t)).is_empty(), "not its own");
        assert!(grants(&s.handle(1, &[Msg::Release { seg: 7, gen: 1, keep: None }], t)).is_empty());
        let out = s.handle(2, &[Msg::Release { seg: 7, gen: 2, keep: None }], t);
        assert_eq!(grants(&out), [(3, 7, Kind::Exclusive)]);
        let (ew, sr) = s.holders(7);
        let gen = ew.unwrap().1;
        assert_eq!((ew, sr), (Some((3, gen)), vec![]));
        assert!(s.fence(3, 7, gen).is_ok() && s.fence(1, 7, gen).is_err() && s.fence(3, 7, gen + 1).is_err());
        // A reader asks: the writer is asked to keep a shared copy, and both then read.
        let out = s.handle(1, &[req(2, 7, Kind::Shared)], t);
        assert_eq!(revokes(&out), [(3, 7, Some(Kind::Shared), 4)]);
        let out = s.handle(3, &[Msg::Release { seg: 7, gen, keep: Some(Kind::Shared) }], t);
        assert_eq!(grants(&out), [(1, 7, Kind::Shared)]);
        assert_eq!(s.holders(7), (None, vec![1, 3]));
        assert!(s.fence(3, 7, gen).is_err(), "a downgraded writer's writes are refused");
    }

    #[test]
    fn the_line_is_kept_in_ticket_order_and_an_older_waiter_revokes_again() {
        let t = Instant::now();
        let mut s = Server::new(Policy::default());
        s.handle(1, &[req(1, 0, Kind::Exclusive)], t); // ticket 1
        s.handle(2, &[req(1, 9, Kind::Shared)], t); // gateway 2's operation: ticket 2
        s.handle(3, &[req(1, 9, Kind::Shared)], t); // ticket 3
        let out = s.handle(3, &[req(1, 0, Kind::Exclusive)], t);
        assert_eq!(revokes(&out), [(1, 0, None, 3)]);
        // Gateway 2's older operation asks for the same segment: it goes first and revokes again.
        let out = s.handle(2, &[req(1, 0, Kind::Exclusive)], t);
        assert_eq!(revokes(&out), [(1, 0, None, 2)]);
        let gen = s.holders(0).0.unwrap().1;
        let out = s.handle(1, &[Msg::Release { seg: 0, gen, keep: None }], t);
        assert_eq!(grants(&out), [(2, 0, Kind::Exclusive)]);
        assert_eq!(revokes(&out), [(2, 0, None, 3)], "the next in line asks at once");
    }

    #[test]
    fn a_holder_that_asks_again_while_revoked_waits_its_turn() {
        let t = Instant::now();
        let mut s = Server::new(Policy::default());
        s.handle(1, &[req(1, 5, Kind::Exclusive)], t);
        s.handle(2, &[req(1, 5, Kind::Exclusive)], t);
        let out = s.handle(1, &[req(2, 5, Kind::Exclusive)], t);
        assert!(grants(&out).is_empty(), "a revoked holder does not jump the line");
        let gen = s.holders(5).0.unwrap().1;
        let out = s.handle(1, &[Msg::Release { seg: 5, gen, keep: None }], t);
        assert_eq!(grants(&out), [(2, 5, Kind::Exclusive)]);
        assert_eq!(revokes(&out), [(2, 5, None, 3)]);
    }

    #[test]
    fn done_leaves_the_line_and_stale_releases_change_nothing() {
        let t = Instant::now();
        let mut s = Server::new(Policy::default());
        s.handle(1, &[req(1, 5, Kind::Exclusive)], t);
        let gen = s.holders(5).0.unwrap().1;
        s.handle(2, &[req(1, 5, Kind::Shared)], t);
        s.handle(2, &[Msg::Done { op: 1 }], t);
        assert!(s.blocked(t).is_empty());
        s.handle(1, &[Msg::Release { seg: 5, gen: gen + 1, keep: None }], t);
        s.handle(2, &[Msg::Release { seg: 5, gen, keep: None }], t);
        assert_eq!(s.holders(5), (Some((1, gen)), vec![]));
        s.handle(1, &[Msg::Release { seg: 5, gen, keep: None }], t);
        assert!(s.is_empty(), "a free segment leaves the table");
    }

    #[test]
    fn a_silent_writer_blocks_its_segment_until_an_operator_breaks_it() {
        let t = Instant::now();
        let mut s = Server::new(Policy::default());
        s.handle(1, &[req(1, 3, Kind::Exclusive)], t);
        let gen = s.holders(3).0.unwrap().1;
        s.handle(2, &[req(1, 3, Kind::Exclusive)], t);
        let later = t + Duration::from_secs(3600);
        assert_eq!(s.tick(later), (vec![], vec![]), "by default the segment waits for its owner");
        let b = s.blocked(later);
        assert_eq!(b.len(), 1);
        assert_eq!(b[0].holders, [(1, Kind::Exclusive, Duration::from_secs(3600))]);
        assert_eq!(b[0].waiters, [(2, Kind::Exclusive, Duration::from_secs(3600))]);
        let (out, broke) = s.break_segment(3);
        assert_eq!(broke, [Broke { gw: 1, seg: 3, kind: Kind::Exclusive, gen }]);
        assert_eq!(grants(&out), [(2, 3, Kind::Exclusive)]);
        assert!(s.fence(1, 3, gen).is_err());
        // When the owner comes back, it is told before anything else, until it acknowledges.
        let out = s.handle(1, &[], later);
        assert_eq!(out, [Out { to: 1, msg: Msg::Broken { seg: 3, gen } }]);
        assert_eq!(s.handle(1, &[], later).len(), 1, "an answer may be lost: told again");
        assert!(s.handle(1, &[Msg::Release { seg: 3, gen, keep: None }], later).is_empty());
    }

    /// A gateway ships its dirty blocks under the token it holds when it ships them: one that
    /// comes back holding the segment again before it has heard of the break (a restart, or its
    /// `Broken` lost with the SG's restart) would land the broken token's writes over newer ones.
    #[test]
    fn a_gateway_that_has_not_acknowledged_a_break_lands_nothing_on_that_segment() {
        let t = Instant::now();
        let mut s = Server::new(Policy::default());
        s.handle(1, &[req(1, 3, Kind::Exclusive)], t);
        let gen = s.holders(3).0.unwrap().1;
        s.handle(2, &[req(1, 3, Kind::Exclusive)], t);
        let (out, _) = s.break_segment(3);
        assert_eq!(grants(&out), [(2, 3, Kind::Exclusive)]);
        // 2 writes and gives the segment up; 1 asks again (its answer, with `Broken` first, is
        // lost) and is granted a newer token.
        let gen2 = s.holders(3).0.unwrap().1;
        s.handle(2, &[Msg::Release { seg: 3, gen: gen2, keep: None }], t);
        s.handle(1, &[req(2, 3, Kind::Exclusive)], t);
        let (ew, _) = s.holders(3);
        let gen3 = ew.unwrap().1;
        assert_eq!(ew, Some((1, gen3)));
        assert!(gen3 > gen2 && gen2 > gen);
        assert!(s.fence(1, 3, gen3).is_err(), "what it ships may have been written under {gen}");
        // Once it acknowledges the break (its writes under it in quarantine), its token counts.
        s.handle(1, &[Msg::Release { seg: 3, gen, keep: None }], t);
        assert!(s.fence(1, 3, gen3).is_ok());
    }

    #[test]
    fn leases_break_silent_readers_always_and_silent_writers_only_when_asked() {
        let t = Instant::now();
        let policy = Policy { lease: Duration::from_secs(10), break_after: Some(Duration::from_secs(60)) };
        let mut s = Server::new(policy);
        s.handle(1, &[req(1, 1, Kind::Shared)], t);
        s.handle(1, &[req(2, 2, Kind::Exclusive)], t);
        s.handle(2, &[req(1, 1, Kind::Exclusive), req(1, 2, Kind::Exclusive)], t);
        assert!(s.tick(t + Duration::from_secs(11)).1.is_empty(), "within the lease and its margin");
        let (out, broke) = s.tick(t + Duration::from_secs(12));
        assert_eq!(broke.iter().map(|b| (b.seg, b.kind)).collect::<Vec<_>>(), [(1, Kind::Shared)]);
        assert_eq!(grants(&out), [(2, 1, Kind::Exclusive)]);
        let (out, broke) = s.tick(t + Duration::from_secs(61));
        assert_eq!(broke.iter().map(|b| (b.seg, b.kind)).collect::<Vec<_>>(), [(2, Kind::Exclusive)]);
        assert_eq!(grants(&out), [(2, 2, Kind::Exclusive)]);
    }

    #[test]
    fn the_table_survives_a_restart_and_generations_never_repeat() {
        let t = Instant::now();
        let mut s = Server::new(Policy::default());
        s.handle(1, &[req(1, 1, Kind::Exclusive), req(1, 2, Kind::Shared)], t);
        s.handle(2, &[req(1, 2, Kind::Shared)], t);
        let changes = s.take_changes();
        assert_eq!((changes.segs.len(), changes.untold), (2, None));
        assert!(s.take_changes().segs.is_empty());
        let entries = s.entries();
        let gen = s.holders(1).0.unwrap().1;
        let mut r = Server::restore(Policy::default(), &entries, &[(3, 9, 1)], changes.next_gen, t);
        assert_eq!(r.handle(3, &[], t), [Out { to: 3, msg: Msg::Broken { seg: 9, gen: 1 } }]);
        assert_eq!(r.entries(), entries);
        assert!(r.fence(1, 1, gen).is_ok());
        r.handle(2, &[req(2, 1, Kind::Exclusive)], t);
        r.handle(1, &[Msg::Release { seg: 1, gen, keep: None }], t);
        let new = r.holders(1).0.unwrap().1;
        assert!(new > gen && r.fence(1, 1, gen).is_err());
    }
}
