//! Three gateways' token drivers (`stics_coherence::driver`) over one SG's journal, in one
//! process: each runs random reads and writes over four shared segments, caching what it reads
//! and holding what it writes dirty until a revoke makes it ship the segment as a fenced group.
//! No two gateways ever run conflicting operations at once, every read sees the newest write,
//! every group lands under its token, and every operation completes.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use rand::{Rng, SeedableRng};
use stics_block::{BlockDev, BlockError, GroupSink, MemDev};
use stics_coherence::driver::{Driver, DriverConfig, Holder};
use stics_coherence::Kind;
use stics_journal::{JournalConfig, JournalDev};
use stics_link::group::{encode_fenced, Extent, ExtentKind, Fences, GroupHead};

const SEGS: u64 = 4;
/// Blocks of 512 bytes in a 64 KiB segment.
const SEG_BLOCKS: u64 = 128;

/// What every gateway agrees on: the newest value written to each segment, and who runs what.
#[derive(Default)]
struct World {
    truth: Mutex<BTreeMap<u64, u64>>,
    running: Mutex<BTreeMap<u64, (usize, usize)>>,
    next: AtomicU64,
}

struct Gateway {
    source: [u8; 16],
    sg: Arc<JournalDev>,
    cache: Mutex<BTreeMap<u64, (u64, bool)>>,
    seq: AtomicU64,
    shipped: AtomicU64,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap()
}

#[async_trait]
impl Holder for Gateway {
    async fn surrender(&self, seg: u64, gen: u64, keep: Option<Kind>) -> Result<(), BlockError> {
        let dirty = lock(&self.cache).get(&seg).copied().filter(|(_, d)| *d);
        if let Some((v, _)) = dirty {
            let seq = self.seq.fetch_add(1, Ordering::SeqCst) + 1;
            let head = GroupHead { source: self.source, seq, first_epoch: seq, last_epoch: seq, block_size: 512 };
            let extents = [Extent { lba: seg * SEG_BLOCKS, blocks: 1, kind: ExtentKind::Data }];
            let mut data = vec![0u8; 512];
            data[..8].copy_from_slice(&v.to_be_bytes());
            let fences = Fences { segment_bytes: 64 << 10, gens: vec![(seg, gen)] };
            let group = encode_fenced(&head, &extents, &data, 1, Some(&fences)).expect("encodes");
            self.sg.commit(Bytes::from(group)).await?;
            self.shipped.fetch_add(1, Ordering::SeqCst);
            lock(&self.cache).insert(seg, (v, false));
        }
        if keep.is_none() {
            lock(&self.cache).remove(&seg);
        }
        Ok(())
    }

    fn broken(&self, seg: u64, gen: u64) {
        panic!("no token is broken here (segment {seg}, generation {gen})");
    }
}

async fn run(gw: Arc<Gateway>, driver: Arc<Driver>, world: Arc<World>, seed: u64, ops: usize) {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let me = seed as usize;
    for _ in 0..ops {
        let mut need: BTreeMap<u64, Kind> = BTreeMap::new();
        for _ in 0..rng.gen_range(1..=2) {
            let kind = if rng.gen_bool(0.4) { Kind::Exclusive } else { Kind::Shared };
            let k = need.entry(rng.gen_range(0..SEGS)).or_insert(kind);
            *k = (*k).max(kind);
        }
        let list: Vec<(u64, Kind)> = need.iter().map(|(&s, &k)| (s, k)).collect();
        let op = driver.begin(&list).await;
        assert!(op.valid());
        {
            let mut running = lock(&world.running);
            for (&seg, &kind) in &need {
                let (w, r) = running.entry(seg).or_default();
                assert!(
                    *w == 0 && (kind == Kind::Shared || *r == 0),
                    "gateway {me}: segment {seg} is in use elsewhere"
                );
                if kind == Kind::Exclusive {
                    *w += 1;
                } else {
                    *r += 1;
                }
            }
        }
        for (&seg, &kind) in &need {
            if kind == Kind::Exclusive {
                let v = world.next.fetch_add(1, Ordering::SeqCst) + 1;
                lock(&gw.cache).insert(seg, (v, true));
                lock(&world.truth).insert(seg, v);
            } else {
                let cached = lock(&gw.cache).get(&seg).map(|c| c.0);
                let v = match cached {
                    Some(v) => v,
                    None => {
                        let b = gw.sg.read(seg * SEG_BLOCKS, 1).await.expect("reads");
                        let v = u64::from_be_bytes(b[..8].try_into().unwrap());
                        lock(&gw.cache).insert(seg, (v, false));
                        v
                    }
                };
                let want = lock(&world.truth).get(&seg).copied().unwrap_or(0);
                assert_eq!(v, want, "gateway {me} read segment {seg}: a stale value");
            }
        }
        tokio::task::yield_now().await;
        {
            let mut running = lock(&world.running);
            for (&seg, &kind) in &need {
                let (w, r) = running.entry(seg).or_default();
                if kind == Kind::Exclusive {
                    *w -= 1;
                } else {
                    *r -= 1;
                }
            }
        }
        drop(op);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_gateways_share_four_segments_through_an_sg() {
    let medium = Arc::new(MemDev::new(512, SEGS * SEG_BLOCKS));
    let sg = Arc::new(
        JournalDev::open(Arc::new(MemDev::new(512, 2048 * 16)), medium, JournalConfig::default()).await.expect("opens"),
    );
    let world = Arc::new(World::default());
    let cfg = DriverConfig {
        poll_wait: Duration::from_millis(50),
        retry: Duration::from_millis(20),
        ..DriverConfig::default()
    };
    let mut runs = Vec::new();
    let mut gws = Vec::new();
    for n in 0..3u8 {
        let mut source = [0u8; 16];
        source[0] = n + 1;
        source[15] = 0x77;
        let gw = Arc::new(Gateway {
            source,
            sg: Arc::clone(&sg),
            cache: Mutex::new(BTreeMap::new()),
            seq: AtomicU64::new(0),
            shipped: AtomicU64::new(0),
        });
        let dev: Arc<dyn BlockDev> = Arc::clone(&sg) as Arc<dyn BlockDev>;
        let driver = Arc::new(Driver::start(dev, source, Arc::clone(&gw) as Arc<dyn Holder>, cfg));
        runs.push(tokio::spawn(run(Arc::clone(&gw), Arc::clone(&driver), Arc::clone(&world), u64::from(n), 300)));
        gws.push((gw, driver));
    }
    for r in runs {
        tokio::time::timeout(Duration::from_secs(120), r).await.expect("every operation completes").expect("no panic");
    }
    // Every write is on the SG or dirty in the cache of the one gateway that holds its segment.
    let truth = lock(&world.truth).clone();
    for (&seg, &v) in &truth {
        let on_sg = u64::from_be_bytes(sg.read(seg * SEG_BLOCKS, 1).await.unwrap()[..8].try_into().unwrap());
        let dirty: Vec<u64> =
            gws.iter().filter_map(|(g, _)| lock(&g.cache).get(&seg).filter(|c| c.1).map(|c| c.0)).collect();
        assert!(on_sg == v || dirty == [v], "segment {seg}: the SG has {on_sg}, dirty copies {dirty:?}, newest {v}");
    }
    let shipped: u64 = gws.iter().map(|(g, _)| g.shipped.load(Ordering::SeqCst)).sum();
    let st = sg.token_status();
    assert!(shipped > 0 && st.revokes > 0 && st.grants > 0, "segments changed hands: {st:?}, {shipped} groups");
    assert_eq!(st.breaks, 0);
}
