//! A gateway's side of the tokens (seed 004 §3.4's LS table at a private cache), pure: which
//! tokens it holds, which operations wait for which, when an operation may run, and when and how
//! to give a token up.
//!
//! An operation names the segments it touches and the token each needs, and runs once it holds
//! them all; it then pins them, so a revoke waits for it to end. Until then it holds nothing
//! firmly (the paper's first phase): a revoke for an older operation is obeyed at once and the
//! segment asked for again, while one for a younger operation waits, so the oldest operation
//! anywhere always gets all it needs. An operation on tokens already held, none of them revoked,
//! runs at once, with no message at all: the single-owner fast path.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use stics_link::token::{Kind, Msg};

/// What the driver does for the client.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// Send this to the SG.
    Send(Msg),
    /// Operation `op` holds all its tokens, pinned until [`Client::end`].
    Ready(u64),
    /// Give up the token on `seg` granted under `gen`: ship its dirty blocks to the SG under
    /// `gen` if it is exclusive, drop its cached blocks unless `keep` is shared, then call
    /// [`Client::surrendered`].
    Surrender { seg: u64, gen: u64, keep: Option<Kind> },
    /// The SG took the token on `seg` granted under `gen` away: writes made under it that did
    /// not reach the SG are refused there and belong in quarantine; cached blocks are stale.
    /// Once they are out of the way, call [`Client::quarantined`].
    Broken { seg: u64, gen: u64 },
}

#[derive(Debug, Clone, Copy)]
struct Held {
    kind: Kind,
    gen: u64,
    pins: u32,
    /// A revoke not yet obeyed: what to keep, for whose ticket.
    revoke: Option<(Option<Kind>, u64)>,
    /// A surrender under way, and what it keeps: a stronger revoke that comes meanwhile waits
    /// for it to end, since the driver is already doing what the first one asked.
    surrendering: Option<Keeping>,
    /// The newest operation that named it: the least recently used tokens go first when the
    /// gateway holds more than it wants.
    used: u64,
    /// A newer token of the segment granted while this one is being given up (an operation asked
    /// for it while the revoke waited, and the SG took the release beside the surrender's group):
    /// it is held once the surrender ends.
    next: Option<Next>,
    /// The SG broke this token while it was being given up and a newer one waits in `next`:
    /// the entry stays only until the surrender ends.
    broken: bool,
}

/// A token granted while the one before it is still being given up, with any revoke of it that
/// came meanwhile.
#[derive(Debug, Clone, Copy)]
struct Next {
    kind: Kind,
    gen: u64,
    revoke: Option<(Option<Kind>, u64)>,
}

/// A revoke that comes on top of one not yet obeyed: the token goes whole if either says so, and
/// for the older ticket.
fn merge_revoke(had: Option<(Option<Kind>, u64)>, keep: Option<Kind>, ticket: u64) -> (Option<Kind>, u64) {
    match had {
        Some((k, t)) => (if keep.is_none() { None } else { k }, t.min(ticket)),
        None => (keep, ticket),
    }
}

/// What a surrender under way leaves held.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Keeping(Option<Kind>);

#[derive(Debug, Clone)]
struct Op {
    need: BTreeMap<u64, Kind>,
    ticket: Option<u64>,
    ready: bool,
    asked: bool,
}

/// One gateway's token table.
#[derive(Debug)]
pub struct Client {
    lease: Duration,
    lease_until: Option<Instant>,
    held: BTreeMap<u64, Held>,
    /// The newest generation released on each segment, and when: a grant of it or of an older
    /// one that arrives later (sent again, or sent before the SG took the release) is void,
    /// since every token the SG grants after a release is of a newer generation. Forgotten once
    /// an exchange begun after the release is answered: nothing older can still be on its way.
    released: BTreeMap<u64, (u64, Instant)>,
    ops: BTreeMap<u64, Op>,
    next_op: u64,
    /// Until its first exchange is answered and its answer read, a new table (a restarted
    /// gateway) does not know what it holds: the SG grants it again what it holds, after revokes
    /// queued for the gateway before it restarted. Those revokes wait here until then, so that
    /// a token whose writes are still in the log is shipped under it, not given up unshipped.
    learning: bool,
    deferred: Vec<Msg>,
    /// Broken tokens whose holder is putting their writes out of the way: acknowledged (by their
    /// release) only then, since until the SG hears it, it refuses every write of this gateway
    /// to the segment, and a group planned before the break could still carry them.
    breaking: BTreeSet<(u64, u64)>,
}

impl Client {
    /// An empty table whose tokens are good for `lease` after the SG last answered.
    pub fn new(lease: Duration) -> Client {
        Client {
            lease,
            lease_until: None,
            held: BTreeMap::new(),
            released: BTreeMap::new(),
            ops: BTreeMap::new(),
            next_op: 1,
            learning: true,
            deferred: Vec::new(),
            breaking: BTreeSet::new(),
        }
    }

    /// The SG answered an exchange this client began at `sent`, and every message of the answer
    /// was taken (one may say a token was broken): its tokens are good until `sent + lease`.
    pub fn heard(&mut self, sent: Instant, now: Instant) -> Vec<Action> {
        let until = sent + self.lease;
        self.lease_until = Some(self.lease_until.map_or(until, |u| u.max(until)));
        self.released.retain(|_, (_, at)| *at >= sent);
        let mut acts = Vec::new();
        if std::mem::take(&mut self.learning) {
            for m in std::mem::take(&mut self.deferred) {
                acts.extend(self.on_msg(m, now));
            }
        }
        self.check_all(now, &mut acts);
        acts
    }

    /// True while the tokens may be used: the SG answered within the lease. Past it, the SG may
    /// have given shared tokens to others, so nothing is served from them.
    pub fn lease_valid(&self, now: Instant) -> bool {
        self.lease_until.is_some_and(|u| now < u)
    }

    /// True until the first answered exchange was read: the table may not know yet what the
    /// gateway holds.
    pub fn learning(&self) -> bool {
        self.learning
    }

    /// The token held on `seg`, with its generation.
    pub fn holds(&self, seg: u64) -> Option<(Kind, u64)> {
        self.held.get(&seg).and_then(Self::token)
    }

    /// The token on `seg` operations may run under: held, and not being given up.
    pub fn serving(&self, seg: u64) -> Option<(Kind, u64)> {
        self.held.get(&seg).filter(|h| h.surrendering.is_none()).and_then(Self::token)
    }

    /// The token an entry stands for: a broken one's successor, if any.
    fn token(h: &Held) -> Option<(Kind, u64)> {
        if h.broken {
            h.next.map(|n| (n.kind, n.gen))
        } else {
            Some((h.kind, h.gen))
        }
    }

    /// Tokens held, by kind (shared, exclusive).
    pub fn counts(&self) -> (usize, usize) {
        self.held.values().filter_map(Self::token).fold((0, 0), |(sr, ew), (kind, _)| match kind {
            Kind::Shared => (sr + 1, ew),
            Kind::Exclusive => (sr, ew + 1),
        })
    }

    fn usable(&self, seg: u64, kind: Kind) -> bool {
        self.held.get(&seg).is_some_and(|h| h.kind.covers(kind) && h.surrendering.is_none())
    }

    /// Begins an operation that needs `kind` on each of `need`'s segments (the stronger where one
    /// is named twice). Returns its number and what to do; [`Action::Ready`] among them at once
    /// when every token is held already and none is being given up.
    pub fn begin(&mut self, need: &[(u64, Kind)], now: Instant) -> (u64, Vec<Action>) {
        let op = self.next_op;
        self.next_op += 1;
        let mut want: BTreeMap<u64, Kind> = BTreeMap::new();
        for &(seg, kind) in need {
            let k = want.entry(seg).or_insert(kind);
            *k = (*k).max(kind);
        }
        let fast = self.lease_valid(now)
            && want
                .iter()
                .all(|(&seg, &k)| self.usable(seg, k) && self.held.get(&seg).is_some_and(|h| h.revoke.is_none()));
        let mut acts = Vec::new();
        for seg in want.keys() {
            if let Some(h) = self.held.get_mut(seg) {
                h.used = op;
            }
        }
        let mut o = Op { need: want, ticket: None, ready: false, asked: false };
        if fast {
            o.ready = true;
            for seg in o.need.keys() {
                if let Some(h) = self.held.get_mut(seg) {
                    h.pins += 1;
                }
            }
            acts.push(Action::Ready(op));
        } else {
            for (&seg, &kind) in &o.need {
                // A token being given up is asked for again once it is gone (`surrendered`):
                // asked for now, the SG could grant it again before it takes the release. One
                // revoked and not given up yet is asked for at once (the SG puts the request
                // behind the one it revoked for), and a grant of it that comes before the
                // surrender ends waits for it (`Held::next`).
                let (revoked, surrendering) =
                    self.held.get(&seg).map_or((false, false), |h| (h.revoke.is_some(), h.surrendering.is_some()));
                if !surrendering && (!self.usable(seg, kind) || revoked) {
                    acts.push(Action::Send(Msg::Request { op, seg, kind }));
                    o.asked = true;
                }
            }
        }
        self.ops.insert(op, o);
        if !fast {
            self.check_ready(op, now, &mut acts);
        }
        (op, acts)
    }

    /// True while operation `op` may go on: it runs, the lease holds and the SG has not broken
    /// any of its tokens. The driver asks before each step; an operation that may not fails,
    /// and the host retries it.
    pub fn valid(&self, op: u64, now: Instant) -> bool {
        self.lease_valid(now)
            && self.ops.get(&op).is_some_and(|o| {
                o.ready && o.need.iter().all(|(&seg, &kind)| self.held.get(&seg).is_some_and(|h| h.kind.covers(kind)))
            })
    }

    /// Ends operation `op`: its tokens are unpinned, and revokes that waited for it are obeyed.
    pub fn end(&mut self, op: u64) -> Vec<Action> {
        let Some(o) = self.ops.remove(&op) else { return Vec::new() };
        let mut acts = Vec::new();
        if !o.ready && o.asked {
            acts.push(Action::Send(Msg::Done { op }));
        }
        for seg in o.need.keys() {
            if o.ready {
                if let Some(h) = self.held.get_mut(seg) {
                    h.pins = h.pins.saturating_sub(1);
                }
            }
            self.try_comply(*seg, &mut acts);
        }
        acts
    }

    /// Takes a message from the SG.
    pub fn on_msg(&mut self, msg: Msg, now: Instant) -> Vec<Action> {
        let mut acts = Vec::new();
        match msg {
            Msg::Queued { op, ticket } => {
                if let Some(o) = self.ops.get_mut(&op) {
                    o.ticket = Some(ticket);
                }
            }
            Msg::Grant { seg, gen, .. } if self.released.get(&seg).is_some_and(|(r, _)| gen <= *r) => {
                self.ask_again(seg, &mut acts);
            }
            Msg::Grant { op, seg, kind, gen, ticket } => {
                let h = self.held.entry(seg).or_insert(Held {
                    kind,
                    gen,
                    pins: 0,
                    revoke: None,
                    surrendering: None,
                    used: 0,
                    next: None,
                    broken: false,
                });
                if gen > h.gen && h.surrendering == Some(Keeping(None)) {
                    // The SG took the release (a conditional one, beside the surrender's group)
                    // and granted a request made since: the old token's writes are still being
                    // shipped under its generation, so the new one waits for that to end.
                    let n = h.next.get_or_insert(Next { kind, gen, revoke: None });
                    if n.gen == gen {
                        n.kind = n.kind.max(kind);
                    } else if gen > n.gen {
                        *n = Next { kind, gen, revoke: None };
                    }
                } else if h.gen == gen {
                    h.kind = h.kind.max(kind);
                } else {
                    // A new token replaces the one held, whatever that was: the SG's table holds
                    // this grant alone, and a revoke asked about the old one.
                    h.revoke = None;
                    h.kind = kind;
                    h.gen = gen;
                }
                if let Some(o) = self.ops.get_mut(&op) {
                    o.ticket = Some(ticket);
                }
                self.check_all(now, &mut acts);
                self.try_comply(seg, &mut acts);
            }
            Msg::Revoke { seg, .. } if self.learning && !self.held.contains_key(&seg) => self.deferred.push(msg),
            Msg::Revoke { seg, gen, keep, ticket } => match self.held.get_mut(&seg) {
                // Grants come before the revokes that follow them: a token not held was given
                // up already, or its grant was lost with a connection, and the SG may have it.
                None => self.release(seg, gen, None, now, &mut acts),
                // A revoke of the token granted while the one before is still being given up:
                // obeyed once that one is gone and this one held.
                Some(Held { next: Some(n), .. }) if gen >= n.gen => {
                    n.gen = gen;
                    n.revoke = Some(merge_revoke(n.revoke, keep, ticket));
                }
                // A revoke of an earlier token of this segment, answered already.
                Some(h) if gen < h.gen => {}
                // Holding no more than it would keep: its release was lost or is on its way;
                // saying it again costs nothing.
                Some(h) if keep.is_some_and(|k| k.covers(h.kind)) && h.gen == gen => {
                    self.release(seg, gen, keep, now, &mut acts);
                }
                Some(h) => {
                    // A later generation than the one held: the SG granted one whose grant was
                    // lost; what is held goes, and the release names the SG's generation.
                    h.gen = gen;
                    h.revoke = Some(merge_revoke(h.revoke, keep, ticket));
                    self.try_comply(seg, &mut acts);
                }
            },
            Msg::Broken { seg, gen } => {
                // What is held under that generation or an earlier one (the SG's newer grant of
                // it was lost) is gone.
                // A token granted while the broken one is still being given up is newer: it is
                // held once the surrender ends (the SG says `Broken` again until it hears the
                // release, so this comes after that grant too).
                if let Some(h) = self.held.get_mut(&seg).filter(|h| h.gen <= gen) {
                    if h.next.is_some_and(|n| n.gen > gen) {
                        h.broken = true;
                    } else {
                        self.held.remove(&seg);
                    }
                }
                // The SG says it again in every answer until the release acknowledges it, which
                // waits for the holder (`quarantined`). A grant of it that is still on its way
                // is void meanwhile.
                if self.breaking.insert((seg, gen)) {
                    self.note_released(seg, gen, now);
                    acts.push(Action::Broken { seg, gen });
                }
                self.ask_again(seg, &mut acts);
            }
            // The SG never sends these.
            Msg::Request { .. }
            | Msg::Release { .. }
            | Msg::Done { .. }
            | Msg::ReleaseAfter { .. }
            | Msg::Hello { .. }
            | Msg::Want { .. } => {}
        }
        acts
    }

    /// The writes made under the broken token `gen` on `seg` are out of the way: in quarantine,
    /// and no group planned before could still carry them. The release tells the SG that this
    /// gateway knows of the break, and its writes to the segment land again.
    pub fn quarantined(&mut self, seg: u64, gen: u64, now: Instant) -> Vec<Action> {
        let mut acts = Vec::new();
        if self.breaking.remove(&(seg, gen)) {
            self.release(seg, gen, None, now, &mut acts);
        }
        acts
    }

    /// The driver shipped `seg`'s dirty blocks and dropped what the revoke said to drop: the
    /// release goes to the SG, and operations still waiting for the segment ask for it again.
    pub fn surrendered(&mut self, seg: u64, now: Instant) -> Vec<Action> {
        let mut acts = Vec::new();
        let Some(h) = self.held.get_mut(&seg) else { return acts };
        let Some(Keeping(keep)) = h.surrendering else { return acts };
        let gen = h.gen;
        match keep {
            Some(kind) => {
                h.kind = kind;
                h.surrendering = None;
                // A revoke that came during the surrender and asks for more is obeyed next.
                h.revoke = h.revoke.filter(|(k, _)| k.is_none_or(|k| !k.covers(kind)));
            }
            None => match h.next.take() {
                Some(n) => {
                    *h = Held {
                        kind: n.kind,
                        gen: n.gen,
                        pins: 0,
                        revoke: n.revoke,
                        surrendering: None,
                        used: h.used,
                        next: None,
                        broken: false,
                    };
                }
                None => {
                    self.held.remove(&seg);
                }
            },
        }
        self.release(seg, gen, keep, now, &mut acts);
        self.try_comply(seg, &mut acts);
        self.ask_again(seg, &mut acts);
        self.check_all(now, &mut acts);
        acts
    }

    /// Gives tokens up of the gateway's own accord while it holds more than `max`, the least
    /// recently used first, as a revoke would have them given up (an exclusive one's writes
    /// shipped first); only tokens no operation pins, waits for or names, and nobody revoked.
    pub fn trim(&mut self, max: usize) -> Vec<Action> {
        let mut acts = Vec::new();
        // Called at the end of every operation: within the bound, nothing is looked at.
        if self.held.len() <= max {
            return acts;
        }
        let giving = self.held.values().filter(|h| h.surrendering.is_some()).count();
        let excess = self.held.len().saturating_sub(max).saturating_sub(giving);
        if excess == 0 {
            return acts;
        }
        let named: std::collections::BTreeSet<u64> = self.ops.values().flat_map(|o| o.need.keys().copied()).collect();
        let mut idle: Vec<(u64, u64)> = self
            .held
            .iter()
            .filter(|(seg, h)| h.pins == 0 && h.surrendering.is_none() && h.revoke.is_none() && !named.contains(seg))
            .map(|(&seg, h)| (h.used, seg))
            .collect();
        idle.sort_unstable();
        for (_, seg) in idle.into_iter().take(excess) {
            if let Some(h) = self.held.get_mut(&seg) {
                h.surrendering = Some(Keeping(None));
                acts.push(Action::Surrender { seg, gen: h.gen, keep: None });
            }
        }
        acts
    }

    /// The connection to the SG was lost and is back (the SG may have restarted and forgotten
    /// who waits): every waiting operation asks again for what it lacks.
    pub fn reconnected(&mut self) -> Vec<Action> {
        let mut acts = Vec::new();
        // A restarted SG numbers tickets afresh and has forgotten its revokes: the old ones
        // would misorder operations. The requests below bring new tickets, and the SG revokes
        // again what someone still waits for.
        for o in self.ops.values_mut() {
            o.ticket = None;
        }
        for h in self.held.values_mut() {
            if h.surrendering.is_none() {
                h.revoke = None;
            }
            if let Some(n) = &mut h.next {
                n.revoke = None;
            }
        }
        for (&op, o) in &self.ops {
            if o.ready {
                continue;
            }
            for (&seg, &kind) in &o.need {
                let surrendering = self.held.get(&seg).is_some_and(|h| h.surrendering.is_some());
                if !surrendering && !self.usable(seg, kind) {
                    acts.push(Action::Send(Msg::Request { op, seg, kind }));
                }
            }
        }
        acts
    }

    fn release(&mut self, seg: u64, gen: u64, keep: Option<Kind>, now: Instant, acts: &mut Vec<Action>) {
        self.note_released(seg, gen, now);
        acts.push(Action::Send(Msg::Release { seg, gen, keep }));
    }

    /// From `now` on, a grant of `gen` or older on `seg` that arrives is void.
    fn note_released(&mut self, seg: u64, gen: u64, now: Instant) {
        let r = self.released.entry(seg).or_insert((gen, now));
        *r = (r.0.max(gen), now);
    }

    fn ask_again(&mut self, seg: u64, acts: &mut Vec<Action>) {
        let again: Vec<(u64, Kind)> = self
            .ops
            .iter()
            .filter_map(|(&op, o)| Some((op, *o.need.get(&seg)?)).filter(|&(_, k)| !o.ready && !self.usable(seg, k)))
            .collect();
        for (op, kind) in again {
            if let Some(o) = self.ops.get_mut(&op) {
                o.asked = true;
            }
            acts.push(Action::Send(Msg::Request { op, seg, kind }));
        }
    }

    fn check_all(&mut self, now: Instant, acts: &mut Vec<Action>) {
        let waiting: Vec<u64> = self.ops.iter().filter(|(_, o)| !o.ready).map(|(&op, _)| op).collect();
        for op in waiting {
            self.check_ready(op, now, acts);
        }
    }

    /// Runs `op` if the lease holds, it holds all it needs and no revoke for an older operation
    /// stands in its way.
    fn check_ready(&mut self, op: u64, now: Instant, acts: &mut Vec<Action>) {
        let Some(o) = self.ops.get(&op) else { return };
        if o.ready || !self.lease_valid(now) {
            return;
        }
        let ok = o.need.iter().all(|(&seg, &kind)| {
            self.usable(seg, kind)
                && self.held.get(&seg).is_some_and(|h| match h.revoke {
                    None => true,
                    Some((_, for_ticket)) => o.ticket.is_some_and(|t| t < for_ticket),
                })
        });
        if !ok {
            return;
        }
        let (asked, segs): (bool, Vec<u64>) = (o.asked, o.need.keys().copied().collect());
        for seg in &segs {
            if let Some(h) = self.held.get_mut(seg) {
                h.pins += 1;
            }
        }
        if let Some(o) = self.ops.get_mut(&op) {
            o.ready = true;
        }
        acts.push(Action::Ready(op));
        if asked {
            acts.push(Action::Send(Msg::Done { op }));
        }
    }

    /// Obeys `seg`'s revoke unless an operation pins the token or an older one waits for it.
    fn try_comply(&mut self, seg: u64, acts: &mut Vec<Action>) {
        let Some(h) = self.held.get(&seg) else { return };
        let Some((keep, for_ticket)) = h.revoke else { return };
        if h.surrendering.is_some() || h.pins > 0 {
            return;
        }
        let older_waits = self
            .ops
            .values()
            .any(|o| !o.ready && o.need.contains_key(&seg) && o.ticket.is_some_and(|t| t < for_ticket));
        if older_waits {
            return;
        }
        let gen = h.gen;
        if let Some(h) = self.held.get_mut(&seg) {
            h.surrendering = Some(Keeping(keep));
        }
        acts.push(Action::Surrender { seg, gen, keep });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn grant(op: u64, seg: u64, kind: Kind, gen: u64, ticket: u64) -> Msg {
        Msg::Grant { op, seg, kind, gen, ticket }
    }

    #[test]
    fn an_operation_on_held_tokens_runs_at_once_without_a_message() {
        let t = Instant::now();
        let mut c = Client::new(Duration::from_secs(30));
        c.heard(t, t);
        let (op, acts) = c.begin(&[(1, Kind::Exclusive), (2, Kind::Shared)], t);
        assert_eq!(
            acts,
            [
                Action::Send(Msg::Request { op, seg: 1, kind: Kind::Exclusive }),
                Action::Send(Msg::Request { op, seg: 2, kind: Kind::Shared })
            ]
        );
        assert!(c.on_msg(grant(op, 1, Kind::Exclusive, 5, 1), t).is_empty());
        assert_eq!(c.on_msg(grant(op, 2, Kind::Shared, 0, 1), t), [Action::Ready(op), Action::Send(Msg::Done { op })]);
        assert!(c.end(op).is_empty());
        let (op2, acts) = c.begin(&[(1, Kind::Shared), (1, Kind::Exclusive), (2, Kind::Shared)], t);
        assert_eq!(acts, [Action::Ready(op2)], "the fast path");
        assert_eq!(c.counts(), (1, 1));
        // Past the lease nothing runs from the table: the SG may have moved shared tokens on.
        let late = t + Duration::from_secs(31);
        let (op3, acts) = c.begin(&[(1, Kind::Exclusive)], late);
        assert!(acts.is_empty(), "it waits for the lease, which any answer of the SG renews");
        assert_eq!(c.heard(late, late), [Action::Ready(op3)]);
    }

    #[test]
    fn a_revoke_waits_for_the_operation_that_pins_the_token_then_ships_and_releases() {
        let t = Instant::now();
        let mut c = Client::new(Duration::from_secs(30));
        c.heard(t, t);
        let (op, _) = c.begin(&[(4, Kind::Exclusive)], t);
        c.on_msg(grant(op, 4, Kind::Exclusive, 9, 1), t);
        assert!(c.on_msg(Msg::Revoke { seg: 4, gen: 9, keep: Some(Kind::Shared), ticket: 2 }, t).is_empty());
        // A new operation may not pin a token being revoked: it waits its turn at the SG.
        let (op2, acts) = c.begin(&[(4, Kind::Shared)], t);
        assert_eq!(acts, [Action::Send(Msg::Request { op: op2, seg: 4, kind: Kind::Shared })]);
        c.on_msg(Msg::Queued { op: op2, ticket: 3 }, t);
        assert_eq!(c.end(op), [Action::Surrender { seg: 4, gen: 9, keep: Some(Kind::Shared) }]);
        assert_eq!(
            c.surrendered(4, t),
            [
                Action::Send(Msg::Release { seg: 4, gen: 9, keep: Some(Kind::Shared) }),
                Action::Ready(op2),
                Action::Send(Msg::Done { op: op2 })
            ]
        );
        assert_eq!(c.holds(4), Some((Kind::Shared, 9)));
    }

    #[test]
    fn a_waiting_operation_keeps_tokens_from_younger_ones_and_yields_to_older_ones() {
        let t = Instant::now();
        let mut c = Client::new(Duration::from_secs(30));
        c.heard(t, t);
        let (op, _) = c.begin(&[(1, Kind::Exclusive), (2, Kind::Exclusive)], t);
        c.on_msg(grant(op, 1, Kind::Exclusive, 7, 5), t);
        c.on_msg(Msg::Queued { op, ticket: 5 }, t);
        assert!(c.on_msg(Msg::Revoke { seg: 1, gen: 7, keep: None, ticket: 8 }, t).is_empty(), "younger: kept");
        let acts = c.on_msg(Msg::Revoke { seg: 1, gen: 7, keep: None, ticket: 3 }, t);
        assert_eq!(acts, [Action::Surrender { seg: 1, gen: 7, keep: None }], "older: obeyed at once");
        assert_eq!(
            c.surrendered(1, t),
            [
                Action::Send(Msg::Release { seg: 1, gen: 7, keep: None }),
                Action::Send(Msg::Request { op, seg: 1, kind: Kind::Exclusive })
            ]
        );
        assert_eq!(c.holds(1), None);
    }

    #[test]
    fn stale_revokes_are_ignored_and_a_broken_token_is_reported_and_asked_for_again() {
        let t = Instant::now();
        let mut c = Client::new(Duration::from_secs(30));
        c.heard(t, t);
        let (op, _) = c.begin(&[(3, Kind::Exclusive)], t);
        c.on_msg(grant(op, 3, Kind::Exclusive, 2, 1), t);
        assert!(c.on_msg(Msg::Revoke { seg: 3, gen: 1, keep: None, ticket: 0 }, t).is_empty());
        assert_eq!(
            c.on_msg(Msg::Revoke { seg: 9, gen: 4, keep: None, ticket: 0 }, t),
            [Action::Send(Msg::Release { seg: 9, gen: 4, keep: None })],
            "not held: released at once, since the SG may think it is"
        );
        c.end(op);
        let (op2, _) = c.begin(&[(3, Kind::Exclusive)], t);
        let acts = c.on_msg(Msg::Broken { seg: 3, gen: 2 }, t);
        assert_eq!(acts[0], Action::Broken { seg: 3, gen: 2 });
        assert_eq!(c.holds(3), None);
        assert!(c.end(op2).is_empty(), "it was running: nothing to tell the SG");
        // Acknowledged only once the writes under it are out of the way: a group planned before
        // could still carry them under a newer token, and the SG refuses them only until then.
        assert!(!acts.iter().any(|a| matches!(a, Action::Send(Msg::Release { .. }))), "{acts:?}");
        assert!(c.on_msg(Msg::Broken { seg: 3, gen: 2 }, t).is_empty(), "said again: still under way");
        assert_eq!(c.quarantined(3, 2, t), [Action::Send(Msg::Release { seg: 3, gen: 2, keep: None })]);
        assert!(c.quarantined(3, 2, t).is_empty());
        // Said again (the release was lost): the holder looks again, and it is acknowledged again.
        assert_eq!(c.on_msg(Msg::Broken { seg: 3, gen: 2 }, t), [Action::Broken { seg: 3, gen: 2 }]);
    }

    #[test]
    fn past_its_bound_a_gateway_gives_up_its_least_recently_used_idle_tokens() {
        let t = Instant::now();
        let mut c = Client::new(Duration::from_secs(30));
        c.heard(t, t);
        for seg in 0..4 {
            let (op, _) = c.begin(&[(seg, Kind::Exclusive)], t);
            c.on_msg(grant(op, seg, Kind::Exclusive, 10 + seg, op), t);
            c.end(op);
        }
        // Segment 0 used again: 1 is now the least recently used.
        let (op, _) = c.begin(&[(0, Kind::Exclusive)], t);
        c.end(op);
        // An operation that names segment 2 keeps it.
        let (pinned, _) = c.begin(&[(2, Kind::Shared)], t);
        let acts = c.trim(2);
        assert_eq!(
            acts,
            [Action::Surrender { seg: 1, gen: 11, keep: None }, Action::Surrender { seg: 3, gen: 13, keep: None }]
        );
        assert!(c.trim(2).is_empty(), "what is being given up counts as gone");
        let acts = c.surrendered(1, t);
        assert!(acts.contains(&Action::Send(Msg::Release { seg: 1, gen: 11, keep: None })), "{acts:?}");
        assert!(c.holds(1).is_none());
        c.end(pinned);
        // A token given up of the gateway's own accord is asked for again only once it is gone:
        // the SG, which revoked nothing, would grant it again before it took the release.
        let (waits, acts) = c.begin(&[(3, Kind::Exclusive)], t);
        assert!(acts.is_empty(), "{acts:?}");
        let acts = c.surrendered(3, t);
        assert!(acts.contains(&Action::Send(Msg::Request { op: waits, seg: 3, kind: Kind::Exclusive })), "{acts:?}");
    }

    #[test]
    fn a_grant_that_comes_while_the_token_before_it_is_still_being_given_up_waits_for_it() {
        let t = Instant::now();
        let mut c = Client::new(Duration::from_secs(30));
        c.heard(t, t);
        let (op, _) = c.begin(&[(4, Kind::Exclusive)], t);
        c.on_msg(grant(op, 4, Kind::Exclusive, 9, 1), t);
        // Another gateway's operation (ticket 2) wants the segment while `op` runs.
        assert!(c.on_msg(Msg::Revoke { seg: 4, gen: 9, keep: None, ticket: 2 }, t).is_empty());
        // A write that comes now asks at once: the SG puts it behind ticket 2.
        let (op2, acts) = c.begin(&[(4, Kind::Exclusive)], t);
        assert_eq!(acts, [Action::Send(Msg::Request { op: op2, seg: 4, kind: Kind::Exclusive })]);
        c.on_msg(Msg::Queued { op: op2, ticket: 3 }, t);
        assert_eq!(c.end(op), [Action::Surrender { seg: 4, gen: 9, keep: None }]);
        // The SG took the early release, served ticket 2 and grants op2 a new token, and the other
        // gateway wants it back (ticket 5), all before this gateway's surrender has its answer:
        // the old token is still being shipped under generation 9, so the new one waits.
        assert!(c.on_msg(grant(op2, 4, Kind::Exclusive, 11, 3), t).is_empty());
        assert!(c.on_msg(Msg::Revoke { seg: 4, gen: 11, keep: None, ticket: 5 }, t).is_empty());
        assert_eq!(c.holds(4), Some((Kind::Exclusive, 9)));
        assert!(!c.valid(op2, t));
        // The surrender ends: generation 9 is released, and generation 11 runs op2 (older than
        // the revoke's ticket) before it is given up in turn.
        assert_eq!(
            c.surrendered(4, t),
            [
                Action::Send(Msg::Release { seg: 4, gen: 9, keep: None }),
                Action::Ready(op2),
                Action::Send(Msg::Done { op: op2 })
            ]
        );
        assert_eq!(c.holds(4), Some((Kind::Exclusive, 11)));
        assert!(c.valid(op2, t));
        assert_eq!(c.end(op2), [Action::Surrender { seg: 4, gen: 11, keep: None }]);
        assert_eq!(c.surrendered(4, t), [Action::Send(Msg::Release { seg: 4, gen: 11, keep: None })]);
        assert_eq!(c.holds(4), None);
    }
}
