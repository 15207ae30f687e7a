//! Gateways and a lock server run against a model of the data, with every message delivered
//! in an order proptest chooses, connections lost, the server restarted from its journal, and
//! (second property) gateways cut off long enough for their tokens to be broken. Every read must
//! return the newest write that survives (per segment; operations under exclusive tokens are
//! serialised), no two gateways whose leases hold may believe they hold conflicting tokens,
//! every write that lands passes the fence, and once the steps stop, every operation completes:
//! no deadlock, no livelock.

use std::collections::{BTreeMap, VecDeque};
use std::time::{Duration, Instant};

use proptest::prelude::*;
use stics_coherence::server::{Entry, Out};
use stics_coherence::{Action, Client, Gw, Kind, Msg, Policy, Server};

const GWS: usize = 3;
const SEGS: u64 = 4;
const LEASE: Duration = Duration::from_secs(10);
const BREAKING: Policy = Policy { lease: LEASE, break_after: Some(Duration::from_secs(30)) };

#[derive(Debug, Clone)]
enum Step {
    Begin {
        g: usize,
        need: Vec<(u64, bool)>,
    },
    /// The gateway's driver sends everything it has queued, as one exchange.
    ToServer(usize),
    /// The gateway's driver polls: an exchange even with nothing to send.
    Poll(usize),
    ToGateway(usize),
    Surrender(usize),
    /// The gateway's oldest surrender ships its writes and sends its release beside them (the
    /// SG's conditional release, taking effect once the writes are in), before the surrender ends.
    Early(usize),
    Run(usize),
    Reset(usize),
    /// The gateway's process dies and starts again on its log: its dirty writes stay, and so do
    /// the messages the SG queued for it; everything else of it is gone.
    Crash(usize),
    /// The gateway gives up idle tokens of its own accord, down to one.
    Trim(usize),
    Restart,
    /// The gateway's link goes down (everything in flight is lost) or comes back.
    Cut(usize),
    Heal(usize),
    Wait(u64),
    Tick,
}

fn begin(g: usize) -> impl Strategy<Value = Step> {
    proptest::collection::vec((0..SEGS, any::<bool>()), 1..4).prop_map(move |need| Step::Begin { g, need })
}

fn step() -> impl Strategy<Value = Step> {
    let g = 0..GWS;
    prop_oneof![
        2 => g.clone().prop_flat_map(begin),
        6 => g.clone().prop_map(Step::ToServer),
        6 => g.clone().prop_map(Step::ToGateway),
        2 => g.clone().prop_map(Step::Surrender),
        3 => g.clone().prop_map(Step::Run),
        1 => g.clone().prop_map(Step::Reset),
        1 => g.clone().prop_map(Step::Crash),
        1 => g.prop_map(Step::Trim),
        1 => Just(Step::Restart),
    ]
}

fn breaking_step() -> impl Strategy<Value = Step> {
    let g = 0..GWS;
    prop_oneof![
        12 => step(),
        1 => g.clone().prop_map(Step::Cut),
        1 => g.clone().prop_map(Step::Heal),
        2 => g.prop_map(Step::Poll),
        2 => (1..25u64).prop_map(Step::Wait),
        2 => Just(Step::Tick),
    ]
}

/// The steps with breaks, and releases that take effect beside their writes before the
/// surrender ends (a strategy of its own, so that the seeds kept for the others keep their cases).
fn early_step() -> impl Strategy<Value = Step> {
    prop_oneof![
        8 => breaking_step(),
        1 => (0..GWS).prop_map(Step::Early),
    ]
}

/// What reaches a gateway from the SG, in order: messages, and the end of the answer to an
/// exchange the gateway began at a time (after which its lease runs from that time).
#[derive(Debug, Clone, Copy)]
enum In {
    Msg(Msg),
    Answered(Instant),
}

#[derive(Default)]
struct Gateway {
    inbox: VecDeque<In>,
    outbox: VecDeque<Msg>,
    cut: bool,
    /// Cached value of each segment, and whether it is dirty (written here, not yet at the SG).
    cache: BTreeMap<u64, (u64, bool)>,
    /// Values written here and not yet at the SG, by segment.
    unshipped: BTreeMap<u64, Vec<u64>>,
    surrenders: VecDeque<(u64, u64, Option<Kind>)>,
    ready: VecDeque<u64>,
    needs: BTreeMap<u64, Vec<(u64, Kind)>>,
    /// Values the fence refused or a break voided.
    quarantined: Vec<(u64, u64)>,
}

/// What the SG's journal holds of the token table.
struct Journal {
    segs: BTreeMap<u64, Entry>,
    untold: Vec<(Gw, u64, u64)>,
    next_gen: u64,
}

struct World {
    t: Instant,
    policy: Policy,
    server: Server,
    journal: Journal,
    clients: Vec<Client>,
    gws: Vec<Gateway>,
    store: BTreeMap<u64, u64>,
    /// Every value written to each segment, in order, and whether it was voided since.
    history: BTreeMap<u64, Vec<(u64, bool)>>,
    next_value: u64,
    began: usize,
    ended: usize,
}

impl World {
    fn new(policy: Policy) -> World {
        let t = Instant::now();
        let mut clients: Vec<Client> = (0..GWS).map(|_| Client::new(LEASE)).collect();
        for c in &mut clients {
            c.heard(t, t);
        }
        World {
            t,
            policy,
            server: Server::new(policy),
            journal: Journal { segs: BTreeMap::new(), untold: Vec::new(), next_gen: 1 },
            clients,
            gws: (0..GWS).map(|_| Gateway::default()).collect(),
            store: BTreeMap::new(),
            history: BTreeMap::new(),
            next_value: 1,
            began: 0,
            ended: 0,
        }
    }

    /// The newest value of `seg` that was not voided.
    fn truth(&self, seg: u64) -> u64 {
        self.history.get(&seg).and_then(|h| h.iter().rev().find(|(_, void)| !void)).map_or(0, |(v, _)| *v)
    }

    fn void(&mut self, g: usize, seg: u64) {
        for v in self.gws[g].unshipped.remove(&seg).unwrap_or_default() {
            self.gws[g].quarantined.push((seg, v));
            if let Some(e) = self.history.get_mut(&seg).and_then(|h| h.iter_mut().find(|(x, _)| *x == v)) {
                e.1 = true;
            }
        }
        self.gws[g].cache.remove(&seg);
    }

    /// What the driver does after the server decided: its table durable first, then the sends
    /// (lost on the way to a gateway that is cut off).
    fn sent(&mut self, outs: Vec<Out>) {
        let changes = self.server.take_changes();
        for (seg, e) in changes.segs {
            match e {
                Some(e) => self.journal.segs.insert(seg, e),
                None => self.journal.segs.remove(&seg),
            };
        }
        if let Some(untold) = changes.untold {
            self.journal.untold = untold;
        }
        self.journal.next_gen = changes.next_gen;
        for o in outs {
            let gw = &mut self.gws[o.to as usize];
            if !gw.cut {
                gw.inbox.push_back(In::Msg(o.msg));
            }
        }
    }

    fn act(&mut self, g: usize, acts: Vec<Action>) {
        for a in acts {
            match a {
                Action::Send(m) => self.gws[g].outbox.push_back(m),
                Action::Ready(op) => self.gws[g].ready.push_back(op),
                Action::Surrender { seg, gen, keep } => self.gws[g].surrenders.push_back((seg, gen, keep)),
                // Unshipped writes under a broken token are voided; the break voided them already
                // when it happened (`Tick`), this is the gateway finding out. Nothing of them is
                // on its way here, so the break is acknowledged at once.
                Action::Broken { seg, gen } => {
                    self.void(g, seg);
                    let acts = self.clients[g].quarantined(seg, gen, self.t);
                    self.act(g, acts);
                }
            }
        }
    }

    fn exchange(&mut self, g: usize, t: Instant) {
        let batch: Vec<Msg> = self.gws[g].outbox.drain(..).collect();
        if self.gws[g].cut {
            return;
        }
        let outs = self.server.handle(g as Gw, &batch, t);
        self.sent(outs);
        self.gws[g].inbox.push_back(In::Answered(t));
    }

    fn step(&mut self, s: &Step) {
        self.t += Duration::from_micros(1);
        let t = self.t;
        match s {
            Step::Begin { g, need } => {
                if self.gws[*g].needs.len() >= 2 {
                    return;
                }
                let need: Vec<(u64, Kind)> =
                    need.iter().map(|&(seg, w)| (seg, if w { Kind::Exclusive } else { Kind::Shared })).collect();
                let (op, acts) = self.clients[*g].begin(&need, t);
                self.gws[*g].needs.insert(op, need);
                self.began += 1;
                self.act(*g, acts);
            }
            Step::ToServer(g) => {
                if !self.gws[*g].outbox.is_empty() {
                    self.exchange(*g, t);
                }
            }
            Step::Poll(g) => self.exchange(*g, t),
            Step::ToGateway(g) => {
                let acts = match self.gws[*g].inbox.pop_front() {
                    Some(In::Msg(m)) => self.clients[*g].on_msg(m, t),
                    Some(In::Answered(sent)) => self.clients[*g].heard(sent, t),
                    None => return,
                };
                self.act(*g, acts);
            }
            Step::Surrender(g) => {
                let Some((seg, gen, keep)) = self.gws[*g].surrenders.pop_front() else { return };
                self.ship(*g, seg, gen);
                if keep.is_none() {
                    self.gws[*g].cache.remove(&seg);
                }
                let acts = self.clients[*g].surrendered(seg, t);
                self.act(*g, acts);
            }
            Step::Early(g) => {
                let Some(&(seg, gen, keep)) = self.gws[*g].surrenders.front() else { return };
                self.ship(*g, seg, gen);
                self.gws[*g].outbox.push_back(Msg::Release { seg, gen, keep });
            }
            Step::Run(g) => {
                let Some(op) = self.gws[*g].ready.pop_front() else { return };
                let mut need: BTreeMap<u64, Kind> = BTreeMap::new();
                for (seg, kind) in self.gws[*g].needs.remove(&op).unwrap_or_default() {
                    let k = need.entry(seg).or_insert(kind);
                    *k = (*k).max(kind);
                }
                // The driver serves nothing from its tokens past its lease or after a break:
                // the operation fails and the host retries it.
                let valid = self.clients[*g].valid(op, t);
                for (seg, kind) in need.into_iter().filter(|_| valid) {
                    let (held, _) = self.clients[*g].holds(seg).expect("a running operation holds its tokens");
                    assert!(held.covers(kind));
                    if kind == Kind::Exclusive {
                        let v = self.next_value;
                        self.next_value += 1;
                        self.gws[*g].cache.insert(seg, (v, true));
                        self.gws[*g].unshipped.entry(seg).or_default().push(v);
                        self.history.entry(seg).or_default().push((v, false));
                    } else {
                        let v = match self.gws[*g].cache.get(&seg) {
                            Some((v, _)) => *v,
                            None => {
                                let v = self.store.get(&seg).copied().unwrap_or(0);
                                self.gws[*g].cache.insert(seg, (v, false));
                                v
                            }
                        };
                        assert_eq!(v, self.truth(seg), "gateway {g} read segment {seg}: a stale value");
                    }
                }
                let acts = self.clients[*g].end(op);
                self.ended += 1;
                self.act(*g, acts);
            }
            Step::Reset(g) => {
                if self.gws[*g].cut {
                    return;
                }
                self.reconnect(*g, t);
            }
            Step::Crash(g) => {
                if self.gws[*g].cut {
                    return;
                }
                let gw = &mut self.gws[*g];
                // What was on its way to the old process is lost, and the new one's fresh
                // exchange drops what the SG still had queued for it.
                gw.outbox.clear();
                gw.inbox.clear();
                gw.cache.retain(|_, (_, dirty)| *dirty);
                gw.surrenders.clear();
                gw.ready.clear();
                // Its operations died with it (the host's commands fail).
                self.ended += gw.needs.len();
                gw.needs.clear();
                self.clients[*g] = Client::new(LEASE);
                // The new driver's first exchange says it starts afresh.
                let outs = self.server.reconnected(*g as Gw, t);
                self.sent(outs);
                self.exchange(*g, t);
            }
            Step::Trim(g) => {
                let acts = self.clients[*g].trim(1);
                self.act(*g, acts);
            }
            Step::Restart => {
                let j = &self.journal;
                let entries: Vec<Entry> = j.segs.values().cloned().collect();
                self.server = Server::restore(self.policy, &entries, &j.untold, j.next_gen, t);
                // Every gateway sees a gap in the restarted SG's numbers and starts afresh: the
                // SG says again what it holds, and it asks again for what it waits for.
                for g in 0..GWS {
                    self.gws[g].inbox.clear();
                    self.gws[g].outbox.clear();
                    if self.gws[g].cut {
                        continue;
                    }
                    let outs = self.server.reconnected(g as Gw, t);
                    self.sent(outs);
                    let acts = self.clients[g].reconnected();
                    self.act(g, acts);
                }
            }
            Step::Cut(g) => {
                self.gws[*g].cut = true;
                self.gws[*g].inbox.clear();
                self.gws[*g].outbox.clear();
            }
            Step::Heal(g) => {
                if self.gws[*g].cut {
                    self.gws[*g].cut = false;
                    self.reconnect(*g, t);
                }
            }
            Step::Wait(secs) => self.t += Duration::from_secs(*secs),
            Step::Tick => {
                let (outs, broke) = self.server.tick(t);
                for b in broke {
                    // The SG took the token: what its holder wrote under it and did not ship can
                    // never land, so it is not the newest write any more.
                    if b.kind == Kind::Exclusive {
                        let (g, seg) = (b.gw as usize, b.seg);
                        for v in self.gws[g].unshipped.get(&seg).cloned().unwrap_or_default() {
                            if let Some(e) =
                                self.history.get_mut(&seg).and_then(|h| h.iter_mut().find(|(x, _)| *x == v))
                            {
                                e.1 = true;
                            }
                        }
                    }
                }
                self.sent(outs);
            }
        }
    }

    /// A lost connection is back: in-flight messages are gone, both ends learn of it, and the
    /// driver's first exchange renews the lease and brings what the SG kept for it.
    fn reconnect(&mut self, g: usize, t: Instant) {
        self.gws[g].inbox.clear();
        self.gws[g].outbox.clear();
        let outs = self.server.reconnected(g as Gw, t);
        self.sent(outs);
        let acts = self.clients[g].reconnected();
        self.act(g, acts);
        self.exchange(g, t);
    }

    /// Ships a segment's dirty value to the SG under `gen`: the fence decides.
    fn ship(&mut self, g: usize, seg: u64, gen: u64) {
        let Some((v, true)) = self.gws[g].cache.get(&seg).copied() else { return };
        match self.server.fence(g as Gw, seg, gen) {
            Ok(()) => {
                self.store.insert(seg, v);
                self.gws[g].cache.insert(seg, (v, false));
                self.gws[g].unshipped.remove(&seg);
            }
            Err(_) => self.void(g, seg),
        }
    }

    /// No two gateways whose leases hold may use conflicting tokens (one being given up is not
    /// used: its release may have taken effect already, beside its writes).
    fn check(&self) {
        for seg in 0..SEGS {
            let kinds: Vec<Kind> = self
                .clients
                .iter()
                .filter(|c| c.lease_valid(self.t))
                .filter_map(|c| c.serving(seg).map(|h| h.0))
                .collect();
            let ew = kinds.iter().filter(|k| **k == Kind::Exclusive).count();
            assert!(ew <= 1 && (ew == 0 || kinds.len() == 1), "segment {seg}: held as {kinds:?}");
        }
    }

    fn run(&mut self, steps: &[Step]) {
        for s in steps {
            self.step(s);
            self.check();
        }
    }

    /// Heals every link, then delivers everything, polls, runs every ready operation, finishes
    /// every surrender and lets time pass, round robin, until every operation has ended.
    fn drain(&mut self) {
        for g in 0..GWS {
            self.step(&Step::Heal(g));
        }
        for round in 0.. {
            assert!(round < 10_000, "operations still waiting after 10,000 rounds: livelock");
            if self.began == self.ended && self.gws.iter().all(|g| g.inbox.is_empty() && g.outbox.is_empty()) {
                return;
            }
            for g in 0..GWS {
                for s in [Step::Poll(g), Step::ToGateway(g), Step::Surrender(g), Step::Run(g)] {
                    self.step(&s);
                    self.check();
                }
                while !self.gws[g].inbox.is_empty() {
                    self.step(&Step::ToGateway(g));
                    self.check();
                }
            }
            self.step(&Step::Tick);
        }
    }

    /// Gateway 0 takes every segment exclusively and reads it: what it finds is the newest
    /// surviving write, wherever it was.
    fn read_all(&mut self) {
        let every: Vec<(u64, Kind)> = (0..SEGS).map(|s| (s, Kind::Exclusive)).collect();
        let (op, acts) = self.clients[0].begin(&every, self.t);
        self.gws[0].needs.insert(op, (0..SEGS).map(|s| (s, Kind::Shared)).collect());
        self.began += 1;
        self.act(0, acts);
        self.drain();
    }
}

/// Runs `steps` under a policy that breaks silent writers, then everything to its end and a read
/// of every segment: the writes voided by breaks, and those their writers put in quarantine.
fn with_breaks(steps: &[Step]) -> (usize, usize) {
    let mut w = World::new(BREAKING);
    w.run(steps);
    w.drain();
    w.read_all();
    let voided: usize = w.history.values().map(|h| h.iter().filter(|(_, v)| *v).count()).sum();
    let quarantined: usize = w.gws.iter().map(|g| g.quarantined.len()).sum();
    (voided, quarantined)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 4096, ..ProptestConfig::default() })]

    #[test]
    fn reads_see_the_newest_write_and_every_operation_completes(steps in proptest::collection::vec(step(), 0..300)) {
        let mut w = World::new(Policy::default());
        w.run(&steps);
        w.drain();
        w.read_all();
        for g in &w.gws {
            prop_assert!(g.quarantined.is_empty(), "no token is broken under the default policy");
        }
    }

    #[test]
    fn with_breaks_only_voided_writes_are_lost_and_nothing_stale_lands(
        steps in proptest::collection::vec(breaking_step(), 0..300),
    ) {
        let (voided, quarantined) = with_breaks(&steps);
        prop_assert_eq!(voided, quarantined, "every voided write is quarantined by its writer, and only those");
    }

    /// As above, with releases that take effect once their writes are in, while the surrender
    /// is still under way: the SG may grant the segment again, to another gateway or to this one
    /// (an operation there asked for it while the revoke waited), before the old token is gone.
    #[test]
    fn with_early_releases_a_token_granted_again_before_the_old_one_is_gone_waits_for_it(
        steps in proptest::collection::vec(early_step(), 0..300),
    ) {
        let (voided, quarantined) = with_breaks(&steps);
        prop_assert_eq!(voided, quarantined, "every voided write is quarantined by its writer, and only those");
    }
}

/// Two gateways, each holding one of two segments and wanting both, in the worst order: the
/// paper's "release what cannot be had and retry" alone would trade the two back and forth
/// forever; tickets let the older operation finish.
#[test]
fn two_gateways_crossing_over_two_segments_both_finish() {
    let mut w = World::new(Policy::default());
    for (g, seg) in [(0, 0), (1, 1)] {
        w.run(&[Step::Begin { g, need: vec![(seg, true)] }, Step::ToServer(g), Step::ToGateway(g), Step::Run(g)]);
    }
    for g in [0, 1] {
        w.step(&Step::Begin { g, need: vec![(0, true), (1, true)] });
    }
    w.drain();
    assert_eq!(w.began, w.ended);
}

/// A writer cut off with dirty data while another gateway needs its segment: by default the
/// segment waits for it; with `break_after`, its token is broken once its lease is surely over,
/// the other gateway writes, and the cut-off writer's late write is fenced and quarantined,
/// never applied over the newer data.
#[test]
fn a_cut_off_writer_is_fenced_after_its_token_is_broken() {
    let mut w = World::new(BREAKING);
    w.run(&[Step::Begin { g: 0, need: vec![(2, true)] }, Step::ToServer(0), Step::ToGateway(0), Step::Run(0)]);
    let stale = w.truth(2);
    let old_gen = w.clients[0].holds(2).map(|h| h.1).expect("gateway 0 holds the token");
    w.run(&[Step::Cut(0), Step::Begin { g: 1, need: vec![(2, true)] }, Step::ToServer(1), Step::Wait(20), Step::Tick]);
    assert!(w.server.counts().breaks == 0, "within break_after the segment waits for its owner");
    let blocked = w.server.blocked(w.t);
    assert_eq!((blocked[0].seg, blocked[0].holders[0].0), (2, 0), "the SG names whom it waits for");
    w.run(&[Step::Wait(20), Step::Tick]);
    assert_eq!(w.server.counts().breaks, 1);
    w.step(&Step::Poll(1));
    while !w.gws[1].inbox.is_empty() {
        w.step(&Step::ToGateway(1));
    }
    w.step(&Step::Run(1));
    let newer = w.truth(2);
    assert_ne!(newer, stale);
    // Gateway 0 comes back with its write: its lease ran out, so nothing runs from its table,
    // and its shipping under the old generation is fenced.
    let (op, acts) = w.clients[0].begin(&[(2, Kind::Shared)], w.t);
    assert!(acts.iter().all(|a| !matches!(a, Action::Ready(_))));
    w.began += 1;
    w.gws[0].needs.insert(op, vec![(2, Kind::Shared)]);
    w.act(0, acts);
    w.ship(0, 2, old_gen);
    w.drain();
    assert_eq!(w.gws[0].quarantined, [(2, stale)]);
    assert_ne!(w.store.get(&2).copied(), Some(stale));
    assert_eq!(w.truth(2), newer);
}
