//! Gateways sharing segments through an SG's lock server, for tests: each runs its own token
//! driver (`stics_coherence::driver`) and random reads and writes over a few segments, caching
//! what it reads (or what came with its shared grant) and holding what it writes dirty until a
//! revoke makes it ship the segment to the SG as a fenced group. Checked as they go: no two gateways run conflicting operations at once,
//! every read sees the newest write, every group lands under its token; and at the end every
//! operation completed and every write is on the SG or dirty at the one gateway that holds it.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use rand::{Rng, SeedableRng};
use stics_block::{BlockDev, BlockError};
use stics_coherence::driver::{Driver, DriverConfig, Holder};
use stics_coherence::Kind;
use stics_link::group::{encode_fenced, Extent, ExtentKind, Fences, GroupHead};
use stics_link::status::Status;

/// Blocks of 512 bytes in the SG's default 64 KiB segment.
pub const SEG_BLOCKS: u64 = 128;

/// What every gateway agrees on: the newest value written to each segment, and who runs what.
#[derive(Default)]
struct World {
    truth: Mutex<BTreeMap<u64, u64>>,
    running: Mutex<BTreeMap<u64, (usize, usize)>>,
    next: AtomicU64,
}

struct Gateway {
    source: [u8; 16],
    sg: Arc<dyn BlockDev>,
    cache: Mutex<BTreeMap<u64, (u64, bool)>>,
    /// The next group's number. The SG takes a source's groups strictly in sequence, and the
    /// driver surrenders several segments at once, so one group ships at a time and a failed
    /// one's number is learnt again from the SG's status.
    seq: tokio::sync::Mutex<u64>,
    shipped: AtomicU64,
    /// Grants that came with the block their operation wanted.
    filled: AtomicU64,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn value(block: &[u8]) -> u64 {
    let mut b = [0u8; 8];
    b.copy_from_slice(block.get(..8).unwrap_or(&[0; 8]));
    u64::from_be_bytes(b)
}

#[async_trait]
impl Holder for Gateway {
    async fn surrender(&self, seg: u64, gen: u64, keep: Option<Kind>) -> Result<(), BlockError> {
        let dirty = lock(&self.cache).get(&seg).copied().filter(|(_, d)| *d);
        if let Some((v, _)) = dirty {
            let mut next = self.seq.lock().await;
            let seq = *next;
            let head = GroupHead { source: self.source, seq, first_epoch: seq, last_epoch: seq, block_size: 512 };
            let extents = [Extent { lba: seg * SEG_BLOCKS, blocks: 1, kind: ExtentKind::Data }];
            let mut data = vec![0u8; 512];
            data.get_mut(..8).unwrap_or_default().copy_from_slice(&v.to_be_bytes());
            let fences = Fences { segment_bytes: 64 << 10, gens: vec![(seg, gen)] };
            let group = encode_fenced(&head, &extents, &data, 1, Some(&fences))
                .map_err(|e| BlockError::Rejected(format!("encoding: {e}")))?;
            let sink = self.sg.group_sink().ok_or(BlockError::Unsupported("no SG"))?;
            if let Err(e) = sink.commit(Bytes::from(group)).await {
                // Its answer may have been lost after it landed: the SG says which came last.
                let status = sink.link_status(0).await?;
                let st = Status::decode(&status).map_err(|e| BlockError::Rejected(format!("status: {e}")))?;
                *next = st.of(&self.source).map_or(0, |me| me.committed_seq) + 1;
                return Err(e);
            }
            *next += 1;
            drop(next);
            self.shipped.fetch_add(1, Ordering::SeqCst);
            lock(&self.cache).insert(seg, (v, false));
        }
        if keep.is_none() {
            lock(&self.cache).remove(&seg);
        }
        Ok(())
    }

    async fn broken(&self, seg: u64, gen: u64) -> Result<(), BlockError> {
        panic!("no token is broken here (segment {seg}, generation {gen})");
    }

    fn fill(&self, seg: u64, first: u32, data: Bytes) {
        assert_eq!((first, data.len()), (0, 512), "segment {seg}: the block asked for");
        let mut cache = lock(&self.cache);
        assert!(!cache.contains_key(&seg), "segment {seg}: filled over a copy of its own");
        cache.insert(seg, (value(&data), false));
        self.filled.fetch_add(1, Ordering::SeqCst);
    }
}

async fn run(gw: Arc<Gateway>, driver: Arc<Driver>, world: Arc<World>, me: usize, segs: u64, ops: usize) {
    let mut rng = rand::rngs::StdRng::seed_from_u64(me as u64);
    for _ in 0..ops {
        let mut need: BTreeMap<u64, Kind> = BTreeMap::new();
        for _ in 0..rng.gen_range(1..=2) {
            let kind = if rng.gen_bool(0.4) { Kind::Exclusive } else { Kind::Shared };
            let k = need.entry(rng.gen_range(0..segs)).or_insert(kind);
            *k = (*k).max(kind);
        }
        let list: Vec<(u64, Kind)> = need.iter().map(|(&s, &k)| (s, k)).collect();
        // A read wants its segment's first block with its grant.
        let reads: Vec<(u64, u32, u32)> =
            need.iter().filter(|(_, &k)| k == Kind::Shared).map(|(&s, _)| (s, 0, 1)).collect();
        let op = driver.begin_reading(&list, &reads).await;
        assert!(op.valid(), "gateway {me}: an operation began that may not run");
        {
            let mut running = lock(&world.running);
            for (&seg, &kind) in &need {
                let (w, r) = running.entry(seg).or_default();
                assert!(
                    *w == 0 && (kind == Kind::Shared || *r == 0),
                    "gateway {me}: segment {seg} is in use elsewhere"
                );
                match kind {
                    Kind::Exclusive => *w += 1,
                    Kind::Shared => *r += 1,
                }
            }
        }
        for (&seg, &kind) in &need {
            if kind == Kind::Exclusive {
                let v = world.next.fetch_add(1, Ordering::SeqCst) + 1;
                lock(&gw.cache).insert(seg, (v, true));
                lock(&world.truth).insert(seg, v);
                continue;
            }
            let cached = lock(&gw.cache).get(&seg).map(|c| c.0);
            let v = match cached {
                Some(v) => v,
                None => {
                    let v = value(&gw.sg.read(seg * SEG_BLOCKS, 1).await.expect("the SG reads"));
                    lock(&gw.cache).insert(seg, (v, false));
                    v
                }
            };
            let want = lock(&world.truth).get(&seg).copied().unwrap_or(0);
            assert_eq!(v, want, "gateway {me} read segment {seg}: a stale value");
        }
        tokio::task::yield_now().await;
        {
            let mut running = lock(&world.running);
            for (&seg, &kind) in &need {
                let (w, r) = running.entry(seg).or_default();
                match kind {
                    Kind::Exclusive => *w -= 1,
                    Kind::Shared => *r -= 1,
                }
            }
        }
        drop(op);
    }
}

/// What a run did.
#[derive(Debug, Clone, Copy)]
pub struct Shared {
    /// Operations run, fenced groups shipped on revokes, and shared grants that came with the
    /// block their operation wanted.
    pub ops: usize,
    pub groups: u64,
    pub filled: u64,
}

/// Runs one gateway per device in `sgs` (each its own way to the same SG LUN), `ops` random
/// operations each over `segs` segments, and checks what the module says.
pub async fn share(sgs: Vec<Arc<dyn BlockDev>>, segs: u64, ops: usize, cfg: DriverConfig) -> Shared {
    let world = Arc::new(World::default());
    let mut runs = Vec::new();
    let mut gws = Vec::new();
    for (n, sg) in sgs.into_iter().enumerate() {
        let mut source = [0u8; 16];
        source[0] = n as u8 + 1;
        source[15] = 0x77;
        let gw = Arc::new(Gateway {
            source,
            sg: Arc::clone(&sg),
            cache: Mutex::new(BTreeMap::new()),
            seq: tokio::sync::Mutex::new(1),
            shipped: AtomicU64::new(0),
            filled: AtomicU64::new(0),
        });
        let driver = Arc::new(Driver::start(sg, source, Arc::clone(&gw) as Arc<dyn Holder>, cfg));
        runs.push(tokio::spawn(run(Arc::clone(&gw), Arc::clone(&driver), Arc::clone(&world), n, segs, ops)));
        gws.push((gw, driver));
    }
    let n = runs.len();
    for r in runs {
        let done = tokio::time::timeout(Duration::from_secs(300), r).await;
        done.expect("every operation completes").expect("no gateway panicked");
    }
    let truth = lock(&world.truth).clone();
    for (&seg, &v) in &truth {
        let on_sg = value(&gws[0].0.sg.read(seg * SEG_BLOCKS, 1).await.expect("the SG reads"));
        let dirty: Vec<u64> =
            gws.iter().filter_map(|(g, _)| lock(&g.cache).get(&seg).filter(|c| c.1).map(|c| c.0)).collect();
        assert!(on_sg == v || dirty == [v], "segment {seg}: the SG has {on_sg}, dirty copies {dirty:?}, newest {v}");
    }
    Shared {
        ops: n * ops,
        groups: gws.iter().map(|(g, _)| g.shipped.load(Ordering::SeqCst)).sum(),
        filled: gws.iter().map(|(g, _)| g.filled.load(Ordering::SeqCst)).sum(),
    }
}
