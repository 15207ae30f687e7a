//! Three gateways' shared caches (`SharedCache`: the STICS cache under tokens) over one SG's
//! journal, in one process: every read sees the newest write that completed before it began or
//! one concurrent with it, never a mix inside a block; a volume written through one gateway is
//! read whole through another with no drain; what a gateway cannot do safely is refused.

use std::sync::atomic::{AtomicU64, Ordering::SeqCst};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use rand::{Rng, SeedableRng};
use stics_block::{BlockDev, MemDev};
use stics_cache::{Config, Mode};
use stics_coherence::driver::DriverConfig;
use stics_journal::{JournalConfig, JournalDev};
use stics_shared::SharedCache;

const BS: u32 = 512;
/// 32 KiB segments: 64 blocks.
const SEG_BYTES: u32 = 32 << 10;
const SEG: u64 = 64;
const BLOCKS: u64 = 64 * SEG;

fn cache_cfg(mode: Mode) -> Config {
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
        ..Config::default()
    }
}

fn tokens() -> DriverConfig {
    DriverConfig { poll_wait: Duration::from_millis(50), retry: Duration::from_millis(20), ..DriverConfig::default() }
}

/// A quarantine directory of its own, made only when a write goes to quarantine (these tests
/// break no token: it never is).
fn quarantine_dir() -> std::path::PathBuf {
    static N: AtomicU64 = AtomicU64::new(0);
    std::env::temp_dir().join(format!("stics-quarantine-test-{}-{}", std::process::id(), N.fetch_add(1, SeqCst)))
}

async fn sg() -> Arc<JournalDev> {
    let medium = Arc::new(MemDev::new(BS, BLOCKS));
    let cfg = JournalConfig { segment_bytes: SEG_BYTES, ..JournalConfig::default() };
    Arc::new(JournalDev::open(Arc::new(MemDev::new(BS, 2048 * 32)), medium, cfg).await.expect("SG opens"))
}

async fn gateway(sg: &Arc<JournalDev>, mode: Mode) -> SharedCache {
    let log: Arc<dyn BlockDev> = Arc::new(MemDev::new(BS, 2048 * 8));
    open_on(log, Arc::clone(sg) as Arc<dyn BlockDev>, mode).await
}

/// A gateway on `log` that reaches the SG through `remote`.
async fn open_on(log: Arc<dyn BlockDev>, remote: Arc<dyn BlockDev>, mode: Mode) -> SharedCache {
    SharedCache::open(log, remote, b"sg-lun", cache_cfg(mode), tokens(), quarantine_dir()).await.expect("gateway opens")
}

/// A block that says `stamp` in every one of its words.
fn block(stamp: u64) -> Bytes {
    Bytes::from(stamp.to_le_bytes().repeat(BS as usize / 8))
}

/// The stamp a block says; fails on a block that mixes two.
#[track_caller]
fn stamp_of(b: &[u8]) -> u64 {
    let first = u64::from_le_bytes(b[..8].try_into().unwrap());
    assert!(b.chunks(8).all(|w| w == first.to_le_bytes()), "a block mixes writes: {:?}", &b[..24]);
    first
}

#[derive(Debug, Clone, Copy)]
struct Event {
    block: u64,
    stamp: u64,
    start: u64,
    end: u64,
    write: bool,
}

/// Per-block linearizability of single-block reads and writes: a read returns a write that
/// began before it ended and that no other write followed entirely before the read began (or the
/// zeros it started with, when no write completed before it began).
fn check(events: &[Event]) {
    let writes: Vec<&Event> = events.iter().filter(|e| e.write).collect();
    for r in events.iter().filter(|e| !e.write) {
        let on = writes.iter().filter(|w| w.block == r.block);
        if r.stamp == 0 {
            let done = on.clone().find(|w| w.end < r.start);
            assert!(done.is_none(), "read {r:?} saw zeros after write {done:?} completed");
            continue;
        }
        let w =
            on.clone().find(|w| w.stamp == r.stamp).unwrap_or_else(|| panic!("read {r:?} saw a stamp never written"));
        assert!(w.start < r.end, "read {r:?} saw write {w:?} that began after it");
        let newer = on.clone().find(|w2| w.end < w2.start && w2.end < r.start);
        assert!(newer.is_none(), "read {r:?} saw {w:?}, but {newer:?} followed it and completed first");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_caches_share_a_lun_and_every_read_sees_the_newest_write() {
    for mode in [Mode::Log, Mode::Immediate] {
        let sg = sg().await;
        let mut gws = Vec::new();
        for _ in 0..3 {
            gws.push(Arc::new(gateway(&sg, mode).await));
        }
        let clock = Arc::new(AtomicU64::new(1));
        let events = Arc::new(Mutex::new(Vec::new()));
        let mut tasks = tokio::task::JoinSet::new();
        for (g, gw) in gws.iter().enumerate() {
            for host in 0..2u64 {
                let (gw, clock, events) = (Arc::clone(gw), Arc::clone(&clock), Arc::clone(&events));
                tasks.spawn(async move {
                    let mut rng = rand::rngs::StdRng::seed_from_u64(g as u64 * 10 + host);
                    for i in 0..150u64 {
                        // Eight segments, the first two hot.
                        let block =
                            if rng.gen_bool(0.5) { rng.gen_range(0..2 * SEG) } else { rng.gen_range(0..8 * SEG) };
                        let start = clock.fetch_add(1, SeqCst);
                        if rng.gen_bool(0.4) {
                            let stamp = ((g as u64 + 1) << 40) | (host << 32) | (i + 1);
                            gw.write(block, block_of(stamp), false).await.expect("write");
                            let end = clock.fetch_add(1, SeqCst);
                            events.lock().unwrap().push(Event { block, stamp, start, end, write: true });
                        } else if rng.gen_bool(0.2) && block % SEG == SEG - 1 {
                            // Across a segment boundary: two tokens at once.
                            let got = gw.read(block, 2).await.expect("read");
                            let end = clock.fetch_add(1, SeqCst);
                            let mut ev = events.lock().unwrap();
                            for (k, b) in got.chunks(BS as usize).enumerate() {
                                ev.push(Event {
                                    block: block + k as u64,
                                    stamp: stamp_of(b),
                                    start,
                                    end,
                                    write: false,
                                });
                            }
                        } else {
                            let got = gw.read(block, 1).await.expect("read");
                            let end = clock.fetch_add(1, SeqCst);
                            events.lock().unwrap().push(Event {
                                block,
                                stamp: stamp_of(&got),
                                start,
                                end,
                                write: false,
                            });
                        }
                    }
                });
            }
        }
        let all = tokio::time::timeout(Duration::from_secs(120), async {
            while let Some(r) = tasks.join_next().await {
                r.expect("host task");
            }
        });
        all.await.expect("every operation completes");
        let events = events.lock().unwrap().clone();
        check(&events);
        // Every gateway settles: the SG alone then holds, for each block, a write no other
        // followed entirely.
        for gw in &gws {
            gw.inner().expect("open").settle().await.expect("settles");
        }
        for b in 0..8 * SEG {
            let got = stamp_of(&sg.read(b, 1).await.expect("SG read"));
            let on: Vec<&Event> = events.iter().filter(|e| e.write && e.block == b).collect();
            if on.is_empty() {
                assert_eq!(got, 0, "block {b}");
                continue;
            }
            let w = on.iter().find(|w| w.stamp == got).unwrap_or_else(|| panic!("block {b}: {got:#x} never written"));
            assert!(!on.iter().any(|w2| w.end < w2.start), "{mode:?} block {b}: {w:?} was followed by a later write");
        }
        let st = sg.token_status();
        assert!(st.grants > 10 && st.revokes > 0, "{mode:?}: segments changed hands: {st:?}");
        assert!(st.early_releases > 0, "{mode:?}: releases went beside their groups: {st:?}");
        for gw in &gws {
            gw.close().await;
        }
    }
}

fn block_of(stamp: u64) -> Bytes {
    block(stamp)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_volume_written_through_one_gateway_is_read_whole_through_another_with_no_drain() {
    let sg = sg().await;
    let (a, b) = (gateway(&sg, Mode::Log).await, gateway(&sg, Mode::Immediate).await);
    // A writes across twenty segments and stops; nothing is drained by hand.
    for blk in (0..20 * SEG).step_by(5) {
        a.write(blk, block(blk + 1), false).await.expect("A writes");
    }
    a.flush().await.expect("A flushes");
    for blk in (0..20 * SEG).step_by(5) {
        assert_eq!(stamp_of(&b.read(blk, 1).await.expect("B reads")), blk + 1, "block {blk}");
    }
    let (sr, ew) = b.tokens_held();
    assert!(sr >= 20 && ew == 0, "B reads under shared tokens: {sr} {ew}");
    // And back: B writes, A reads what B wrote, not its own older blocks.
    for blk in (0..20 * SEG).step_by(10) {
        b.write(blk, block(blk + 1000), false).await.expect("B writes");
    }
    for blk in (0..20 * SEG).step_by(5) {
        let want = if blk % 10 == 0 { blk + 1000 } else { blk + 1 };
        assert_eq!(stamp_of(&a.read(blk, 1).await.expect("A reads")), want, "block {blk}");
    }
    a.close().await;
    b.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_after_another_gateway_s_writes_gets_its_blocks_with_its_grant() {
    let sg = sg().await;
    let a = gateway(&sg, Mode::Log).await;
    let path = Arc::new(Path::to(&sg));
    let log: Arc<dyn BlockDev> = Arc::new(MemDev::new(BS, 2048 * 8));
    let b = open_on(log, Arc::clone(&path) as Arc<dyn BlockDev>, Mode::Log).await;
    for round in 1..=5u64 {
        // A writes blocks 3..7 of segment 2, then B reads 2..8: A gives its token up (its writes
        // reach the SG first) and B's shared grant brings the blocks, so B sends no READ.
        for blk in 2 * SEG + 3..2 * SEG + 7 {
            a.write(blk, block(round * 100 + blk), false).await.expect("A writes");
        }
        let before = path.reads.load(SeqCst);
        let got = b.read(2 * SEG + 2, 6).await.expect("B reads");
        let stamps: Vec<u64> = got.chunks(BS as usize).map(stamp_of).collect();
        let old = |blk: u64| if round == 1 { 0 } else { blk };
        let want: Vec<u64> = (2 * SEG + 2..2 * SEG + 8)
            .map(|blk| if (2 * SEG + 3..2 * SEG + 7).contains(&blk) { round * 100 + blk } else { old(blk) })
            .collect();
        assert_eq!(stamps, want, "round {round}");
        assert_eq!(path.reads.load(SeqCst), before, "round {round}: B's blocks came with its grant");
        // B writes the blocks around A's, which A reads with its grant in turn.
        b.write(2 * SEG + 2, block(2 * SEG + 2), false).await.expect("B writes");
        b.write(2 * SEG + 7, block(2 * SEG + 7), false).await.expect("B writes");
        let got = a.read(2 * SEG + 2, 6).await.expect("A reads");
        assert_eq!(
            got.chunks(BS as usize).map(stamp_of).collect::<Vec<_>>()[..],
            [
                2 * SEG + 2,
                round * 100 + 2 * SEG + 3,
                round * 100 + 2 * SEG + 4,
                round * 100 + 2 * SEG + 5,
                round * 100 + 2 * SEG + 6,
                2 * SEG + 7
            ]
        );
    }
    assert!(b.token_stats().grants_with_data >= 5, "{:?}", b.token_stats());
    assert!(sg.token_status().grant_data_blocks >= 5 * 6, "{:?}", sg.token_status());
    a.close().await;
    b.close().await;
}

#[tokio::test]
async fn what_a_shared_lun_cannot_take_is_refused() {
    let sg = sg().await;
    let a = gateway(&sg, Mode::Log).await;
    a.write(3, block(7), false).await.expect("A writes");
    // A plain write (any initiator's, not a gateway's) to a segment a gateway holds: refused.
    let e = sg.write(4, block(9), false).await.unwrap_err();
    assert!(e.to_string().contains("holds a token"), "{e}");
    sg.write(40 * SEG, block(9), false).await.expect("where no gateway holds a token");
    // Write-through would reach the SG unfenced; a plain remote hands out no tokens.
    let log: Arc<dyn BlockDev> = Arc::new(MemDev::new(BS, 2048 * 8));
    let remote: Arc<dyn BlockDev> = Arc::clone(&sg) as Arc<dyn BlockDev>;
    let e =
        SharedCache::open(log.clone(), remote, b"sg-lun", cache_cfg(Mode::WriteThrough), tokens(), quarantine_dir())
            .await
            .unwrap_err();
    assert!(e.to_string().contains("write-through"), "{e}");
    let plain: Arc<dyn BlockDev> = Arc::new(MemDev::new(BS, BLOCKS));
    let e = SharedCache::open(log, plain, b"mem", cache_cfg(Mode::Log), tokens(), quarantine_dir()).await.unwrap_err();
    assert!(e.to_string().contains("no stics SG"), "{e}");
    // A zeroing of the whole LUN goes as several operations and lands.
    a.write_zeros(0, BLOCKS).await.expect("zeroes");
    assert_eq!(stamp_of(&a.read(3, 1).await.expect("reads")), 0);
    a.close().await;
}

/// Waits until everything `c` wrote is on the SG, for at most 30 s.
async fn settles(c: &SharedCache) {
    let settle = tokio::time::timeout(Duration::from_secs(30), c.inner().expect("open").settle());
    settle.await.expect("settles in time").expect("settles");
}

/// The SG as one gateway's process reaches it: `commits` off, its groups fail (its writes stay
/// dirty in its log); `alive` off, nothing passes (the process is gone).
struct Path {
    sg: Arc<JournalDev>,
    commits: std::sync::atomic::AtomicBool,
    alive: std::sync::atomic::AtomicBool,
    /// READ commands that went to the SG.
    reads: AtomicU64,
}

impl Path {
    fn to(sg: &Arc<JournalDev>) -> Path {
        Path {
            sg: Arc::clone(sg),
            commits: std::sync::atomic::AtomicBool::new(true),
            alive: std::sync::atomic::AtomicBool::new(true),
            reads: AtomicU64::new(0),
        }
    }
}

impl Path {
    fn check(&self, commit: bool) -> Result<(), stics_block::BlockError> {
        let ok = self.alive.load(SeqCst) && (!commit || self.commits.load(SeqCst));
        ok.then_some(()).ok_or_else(|| stics_block::BlockError::Busy("cut".into()))
    }
}

#[async_trait::async_trait]
impl stics_block::GroupSink for Path {
    fn max_group(&self) -> u32 {
        self.sg.max_group()
    }
    async fn commit(&self, group: Bytes) -> Result<(), stics_block::BlockError> {
        self.check(true)?;
        self.sg.commit(group).await
    }
    async fn link_status(&self, fence: u64) -> Result<Bytes, stics_block::BlockError> {
        self.check(false)?;
        self.sg.link_status(fence).await
    }
    async fn tokens(&self, exchange: Bytes, new_connection: bool) -> Result<(), stics_block::BlockError> {
        self.check(false)?;
        self.sg.tokens(exchange, new_connection).await
    }
    async fn token_poll(
        &self,
        g: u64,
        from: u32,
        wait: Duration,
        max: usize,
    ) -> Result<Bytes, stics_block::BlockError> {
        self.check(false)?;
        self.sg.token_poll(g, from, wait, max).await
    }
}

#[async_trait::async_trait]
impl BlockDev for Path {
    fn geometry(&self) -> stics_block::Geometry {
        self.sg.geometry()
    }
    fn volatile_cache(&self) -> bool {
        false
    }
    fn group_sink(&self) -> Option<&dyn stics_block::GroupSink> {
        Some(self)
    }
    async fn read(&self, lba: u64, blocks: u32) -> Result<Bytes, stics_block::BlockError> {
        self.check(false)?;
        self.reads.fetch_add(1, SeqCst);
        self.sg.read(lba, blocks).await
    }
    async fn write(&self, lba: u64, data: Bytes, fua: bool) -> Result<(), stics_block::BlockError> {
        self.check(false)?;
        self.sg.write(lba, data, fua).await
    }
    async fn flush(&self) -> Result<(), stics_block::BlockError> {
        self.check(false)?;
        self.sg.flush().await
    }
}

/// Gateway B, opened on `sg`, reading block 1 in the background: it waits, since A holds the
/// segment and cannot ship it.
async fn b_waits_to_read_block_1(sg: &Arc<JournalDev>) -> (Arc<SharedCache>, tokio::task::JoinHandle<u64>) {
    let b = Arc::new(gateway(sg, Mode::Log).await);
    let reader = {
        let b = Arc::clone(&b);
        tokio::spawn(async move { stamp_of(&b.read(1, 1).await.expect("B reads")) })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!reader.is_finished(), "B waits for A's segment");
    (b, reader)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gateway_restarted_on_its_log_ships_what_it_held_before_anyone_reads_past_it() {
    let sg = sg().await;
    let path = Arc::new(Path { commits: std::sync::atomic::AtomicBool::new(false), ..Path::to(&sg) });
    let log: Arc<dyn BlockDev> = Arc::new(MemDev::new(BS, 2048 * 8));
    let a = open_on(Arc::clone(&log), path.clone(), Mode::Log).await;
    // A writes three segments; its groups cannot reach the SG: the writes are in its log only.
    for blk in [1, SEG + 1, 2 * SEG + 1] {
        a.write(blk, block(blk + 100), true).await.expect("A writes");
    }
    assert_eq!(a.tokens_held().1, 3);
    assert_eq!(sg.status().groups_committed, 0);
    // A's process dies.
    path.alive.store(false, SeqCst);
    drop(a);
    // B wants the first segment: the SG asks A, which does not answer; B waits (the default
    // policy never takes an exclusive token from a silent writer).
    let (b, reader) = b_waits_to_read_block_1(&sg).await;
    assert_eq!(sg.token_status().blocked.len(), 1);
    // A starts again on its log: the SG tells it what it holds, and it ships its writes under
    // those tokens before it gives the first segment up.
    let a = open_on(log, Arc::clone(&sg) as Arc<dyn BlockDev>, Mode::Log).await;
    let got = tokio::time::timeout(Duration::from_secs(20), reader).await.expect("B reads on").expect("reader");
    assert_eq!(got, 101, "B reads A's acknowledged write, not what the SG had before");
    for blk in [SEG + 1, 2 * SEG + 1] {
        assert_eq!(stamp_of(&b.read(blk, 1).await.expect("B reads")), blk + 100, "block {blk}");
    }
    assert!(a.quarantined().is_empty(), "nothing was voided: {:?}", a.quarantined());
    a.close().await;
    b.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broken_writer_s_writes_go_to_quarantine_and_never_over_newer_data() {
    let sg = sg().await;
    let path = Arc::new(Path { commits: std::sync::atomic::AtomicBool::new(false), ..Path::to(&sg) });
    let qdir = tempfile::tempdir().unwrap();
    let log: Arc<dyn BlockDev> = Arc::new(MemDev::new(BS, 2048 * 8));
    let open_a = |remote: Arc<dyn BlockDev>, log: Arc<dyn BlockDev>| {
        SharedCache::open(log, remote, b"sg-lun", cache_cfg(Mode::Log), tokens(), qdir.path().to_owned())
    };
    let a = open_a(path.clone(), Arc::clone(&log)).await.expect("A opens");
    // A writes two segments; its groups cannot reach the SG.
    a.write(1, block(11), true).await.expect("A writes");
    a.write(SEG + 1, block(12), true).await.expect("A writes");
    // B wants the first segment; A cannot ship it; an operator breaks A's token.
    let (b, reader) = b_waits_to_read_block_1(&sg).await;
    let broke = sg.break_segment(0).await.expect("break");
    assert_eq!(broke.len(), 1, "{broke:?}");
    assert_eq!(tokio::time::timeout(Duration::from_secs(10), reader).await.unwrap().unwrap(), 0, "what the SG has");
    b.write(1, block(21), false).await.expect("B writes");
    // A hears of the break: its writes to that segment go to quarantine, whole, and leave its log.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while a.quarantined().is_empty() {
        assert!(std::time::Instant::now() < deadline, "A put nothing in quarantine");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let q = &a.quarantined()[0];
    assert_eq!((q.segment, q.blocks), (0, 1), "{q:?}");
    let kept = stics_shared::quarantine::Quarantine::decode(&std::fs::read(&q.file).unwrap()).unwrap();
    assert_eq!(kept.runs, vec![(1, Some(block(11).to_vec()), 1)]);
    assert_eq!(stamp_of(&a.read(1, 1).await.expect("A reads")), 21, "A reads B's write, not its own voided one");
    // Its groups go again: what it wrote under the tokens it kept lands, the rest never does.
    path.commits.store(true, SeqCst);
    settles(&a).await;
    assert_eq!(stamp_of(&sg.read(SEG + 1, 1).await.unwrap()), 12);
    settles(&b).await;
    assert_eq!(stamp_of(&sg.read(1, 1).await.unwrap()), 21);
    // Nor after a restart of A on its log.
    path.alive.store(false, SeqCst);
    drop(a);
    let a = open_a(Arc::clone(&sg) as Arc<dyn BlockDev>, log).await.expect("A reopens");
    tokio::time::sleep(Duration::from_millis(500)).await;
    settles(&a).await;
    assert_eq!(stamp_of(&sg.read(1, 1).await.unwrap()), 21, "the voided write never lands");
    assert_eq!(stamp_of(&a.read(1, 1).await.unwrap()), 21);
    a.close().await;
    b.close().await;
}

/// A group planned under a token that is then broken, whose data is read (and the group encoded)
/// only after its writes went to quarantine and the gateway took the segment again: a break
/// acknowledged at once let the SG take the group under the new token, over newer data.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_planned_before_a_break_never_lands_under_a_token_granted_after_it() {
    use stics_testkit::faults::{FaultDev, Op, Rule};
    let sg = sg().await;
    let qdir = tempfile::tempdir().unwrap();
    let log = Arc::new(FaultDev::new(BS, 2048 * 8, 1));
    let remote: Arc<dyn BlockDev> = Arc::clone(&sg) as Arc<dyn BlockDev>;
    let a = SharedCache::open(log.clone(), remote, b"sg-lun", cache_cfg(Mode::Log), tokens(), qdir.path().to_owned())
        .await
        .expect("A opens");
    // The next read of A's log, where its first group's data comes from, takes 5 s.
    let reads = log.count(Op::Read);
    let read_ends = std::time::Instant::now() + Duration::from_secs(5);
    log.add_rule(Rule::delay(Op::Read, Duration::from_secs(5)).times(1));
    a.write(1, block(11), true).await.expect("A writes");
    while log.count(Op::Read) == reads {
        assert!(std::time::Instant::now() < read_ends, "A planned no group");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // B wants the segment; A's surrender waits for that group; an operator breaks A's token.
    let (b, reader) = b_waits_to_read_block_1(&sg).await;
    assert_eq!(sg.break_segment(0).await.expect("break").len(), 1);
    assert_eq!(tokio::time::timeout(Duration::from_secs(2), reader).await.unwrap().unwrap(), 0);
    b.write(1, block(21), false).await.expect("B writes");
    // A hears of the break, keeps its write in quarantine, and writes the segment again under a
    // new token, all while its old group still waits for its data.
    while a.quarantined().is_empty() {
        assert!(std::time::Instant::now() < read_ends, "A put nothing in quarantine");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    a.write(2, block(12), false).await.expect("A writes again");
    assert!(std::time::Instant::now() < read_ends, "the steps above took longer than the log's delay");
    settles(&a).await;
    settles(&b).await;
    assert_eq!(stamp_of(&sg.read(1, 1).await.unwrap()), 21, "the write under the broken token never lands");
    assert_eq!(stamp_of(&sg.read(2, 1).await.unwrap()), 12);
    assert_eq!(stamp_of(&a.read(1, 1).await.unwrap()), 21);
    a.close().await;
    b.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gateway_keeps_no_more_tokens_than_its_bound_and_ships_what_it_gives_up() {
    let sg = sg().await;
    let log: Arc<dyn BlockDev> = Arc::new(MemDev::new(BS, 2048 * 8));
    let remote: Arc<dyn BlockDev> = Arc::clone(&sg) as Arc<dyn BlockDev>;
    let bounded = DriverConfig { max_tokens: 4, ..tokens() };
    let a = SharedCache::open(log, remote, b"sg-lun", cache_cfg(Mode::Log), bounded, quarantine_dir()).await.unwrap();
    for seg in 0..20 {
        a.write(seg * SEG + 3, block(seg + 1), false).await.expect("A writes");
    }
    // What it gave up went to the SG first: surrenders settle.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while a.tokens_held().1 > 4 {
        assert!(std::time::Instant::now() < deadline, "A holds {:?}", a.tokens_held());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(a.token_stats().surrenders >= 16, "{:?}", a.token_stats());
    // A gateway forgets a token as it sends the release; the SG counts it until it takes it.
    while sg.token_status().held_exclusive > 4 {
        assert!(std::time::Instant::now() < deadline, "the SG counts {:?}", sg.token_status());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    for seg in 0..16 {
        assert_eq!(stamp_of(&sg.read(seg * SEG + 3, 1).await.unwrap()), seg + 1, "segment {seg} on the SG");
    }
    let b = gateway(&sg, Mode::Log).await;
    for seg in 0..20 {
        assert_eq!(stamp_of(&b.read(seg * SEG + 3, 1).await.unwrap()), seg + 1, "B reads segment {seg}");
    }
    a.close().await;
    b.close().await;
}
