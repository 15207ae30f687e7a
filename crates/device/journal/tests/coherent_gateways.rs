//! Three gateways' token drivers (`stics_coherence::driver`) over one SG's journal, in one
//! process (`stics_testkit::coherence`): random reads and writes over four shared segments,
//! segments shipped as fenced groups on revoke; no conflicting operations, no stale read, every
//! group under its token, every operation completed. Then again with answers lost on the way
//! back and exchanges and groups sent twice.

use std::sync::Arc;
use std::time::Duration;

use stics_block::{BlockDev, MemDev};
use stics_coherence::driver::DriverConfig;
use stics_journal::{JournalConfig, JournalDev};
use stics_testkit::coherence::{share, SEG_BLOCKS};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_gateways_share_four_segments_through_an_sg() {
    let medium = Arc::new(MemDev::new(512, 4 * SEG_BLOCKS));
    let sg =
        JournalDev::open(Arc::new(MemDev::new(512, 2048 * 16)), medium, JournalConfig::default()).await.expect("opens");
    let sg: Arc<dyn BlockDev> = Arc::new(sg);
    let cfg = DriverConfig {
        poll_wait: Duration::from_millis(50),
        retry: Duration::from_millis(20),
        ..DriverConfig::default()
    };
    let run = share(vec![Arc::clone(&sg), Arc::clone(&sg), Arc::clone(&sg)], 4, 300, cfg).await;
    assert!(run.groups > 0, "segments changed hands: {run:?}");
    assert!(run.filled > 0, "shared grants came with their blocks: {run:?}");
}

/// An SG whose answers are lost now and then: an exchange lost on the way or after the SG took it
/// (the driver sends it again), a poll answer lost after the SG produced it (the driver asks from
/// the same number again), a group's answer lost after it landed (sent again, taken once). With
/// `losses` false it loses nothing, and `restart` puts a new SG in the old one's place.
struct Lossy {
    sg: std::sync::Mutex<Arc<JournalDev>>,
    rng: std::sync::Mutex<rand::rngs::StdRng>,
    losses: bool,
    /// Exchanges that said the gateway starts afresh.
    fresh: std::sync::atomic::AtomicU64,
}

impl Lossy {
    fn new(sg: &Arc<JournalDev>, seed: u64, losses: bool) -> Lossy {
        use rand::SeedableRng;
        let rng = std::sync::Mutex::new(rand::rngs::StdRng::seed_from_u64(seed));
        Lossy { sg: std::sync::Mutex::new(Arc::clone(sg)), rng, losses, fresh: std::sync::atomic::AtomicU64::default() }
    }

    fn sg(&self) -> Arc<JournalDev> {
        Arc::clone(&self.sg.lock().unwrap())
    }

    fn restart(&self, sg: Arc<JournalDev>) {
        *self.sg.lock().unwrap() = sg;
    }

    fn roll(&self) -> f64 {
        use rand::Rng;
        if !self.losses {
            return 1.0;
        }
        self.rng.lock().unwrap().gen::<f64>()
    }
}

fn lost() -> stics_block::BlockError {
    stics_block::BlockError::Unreachable("the answer was lost".into())
}

#[async_trait::async_trait]
impl BlockDev for Lossy {
    fn geometry(&self) -> stics_block::Geometry {
        self.sg().geometry()
    }
    fn volatile_cache(&self) -> bool {
        self.sg().volatile_cache()
    }
    async fn read(&self, lba: u64, blocks: u32) -> Result<bytes::Bytes, stics_block::BlockError> {
        self.sg().read(lba, blocks).await
    }
    async fn write(&self, lba: u64, data: bytes::Bytes, fua: bool) -> Result<(), stics_block::BlockError> {
        self.sg().write(lba, data, fua).await
    }
    async fn flush(&self) -> Result<(), stics_block::BlockError> {
        self.sg().flush().await
    }
    fn group_sink(&self) -> Option<&dyn stics_block::GroupSink> {
        Some(self)
    }
}

#[async_trait::async_trait]
impl stics_block::GroupSink for Lossy {
    fn max_group(&self) -> u32 {
        self.sg().max_group()
    }
    async fn commit(&self, group: bytes::Bytes) -> Result<(), stics_block::BlockError> {
        self.sg().commit(group).await?;
        if self.roll() < 0.1 {
            return Err(lost());
        }
        Ok(())
    }
    async fn link_status(&self, fence: u64) -> Result<bytes::Bytes, stics_block::BlockError> {
        self.sg().link_status(fence).await
    }
    async fn tokens(&self, exchange: bytes::Bytes, new_connection: bool) -> Result<(), stics_block::BlockError> {
        let r = self.roll();
        if r < 0.1 {
            return Err(lost());
        }
        self.sg().tokens(exchange, new_connection).await?;
        if new_connection {
            self.fresh.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        }
        if r < 0.25 {
            return Err(lost());
        }
        Ok(())
    }
    async fn token_poll(
        &self,
        gateway: u64,
        from: u32,
        wait: Duration,
        max: usize,
    ) -> Result<bytes::Bytes, stics_block::BlockError> {
        let answer = self.sg().token_poll(gateway, from, wait, max).await?;
        if self.roll() < 0.2 {
            return Err(lost());
        }
        Ok(answer)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lost_answers_and_exchanges_sent_twice_lose_nothing() {
    let medium = Arc::new(MemDev::new(512, 4 * SEG_BLOCKS));
    let sg =
        JournalDev::open(Arc::new(MemDev::new(512, 2048 * 16)), medium, JournalConfig::default()).await.expect("opens");
    let sg = Arc::new(sg);
    let devs: Vec<Arc<dyn BlockDev>> =
        (0..3u64).map(|seed| Arc::new(Lossy::new(&sg, seed, true)) as Arc<dyn BlockDev>).collect();
    let cfg = DriverConfig {
        poll_wait: Duration::from_millis(50),
        retry: Duration::from_millis(5),
        ..DriverConfig::default()
    };
    let run = share(devs, 4, 200, cfg).await;
    assert!(run.groups > 0, "segments changed hands: {run:?}");
    assert!(run.filled > 0, "shared grants came with their blocks: {run:?}");
}

/// What a gateway with nothing cached does when a token goes: nothing.
struct Nothing;

#[async_trait::async_trait]
impl stics_coherence::driver::Holder for Nothing {
    async fn surrender(&self, _: u64, _: u64, _: Option<stics_coherence::Kind>) -> Result<(), stics_block::BlockError> {
        Ok(())
    }
    async fn broken(&self, _: u64, _: u64) -> Result<(), stics_block::BlockError> {
        Ok(())
    }
}

async fn fresh_sg() -> Arc<JournalDev> {
    let medium = Arc::new(MemDev::new(512, 4 * SEG_BLOCKS));
    Arc::new(
        JournalDev::open(Arc::new(MemDev::new(512, 2048 * 16)), medium, JournalConfig::default()).await.expect("opens"),
    )
}

/// The SG restarts under a gateway that keeps taking tokens: the gateway sees that messages were
/// lost, starts afresh once (its fresh exchange makes no gap of its own, which would have it
/// start afresh again and again, dropping what was queued each time), and its operations go on
/// completing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gateway_goes_on_after_its_sg_restarts() {
    use stics_coherence::Kind;
    let sg = Lossy::new(&fresh_sg().await, 0, false);
    let sg = Arc::new(sg);
    let cfg = DriverConfig {
        poll_wait: Duration::from_millis(50),
        retry: Duration::from_millis(5),
        ..DriverConfig::default()
    };
    let driver = stics_coherence::driver::Driver::start(
        Arc::clone(&sg) as Arc<dyn BlockDev>,
        [9, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1],
        Arc::new(Nothing),
        cfg,
    );
    for round in 0..40u64 {
        if round == 20 {
            sg.restart(fresh_sg().await);
        }
        // A new segment each time, so that every operation needs a grant from the SG.
        let seg = round % 4 + 4 * (round / 20);
        let op = tokio::time::timeout(Duration::from_secs(20), driver.begin(&[(seg, Kind::Exclusive)]))
            .await
            .unwrap_or_else(|_| panic!("operation {round} on segment {seg} never ran"));
        assert!(op.valid());
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let fresh = sg.fresh.load(std::sync::atomic::Ordering::SeqCst);
    assert_eq!(fresh, 2, "fresh starts: at the beginning and once after the restart");
    let st = sg.sg().token_status();
    assert_eq!(st.gateways, 1, "the restarted SG knows the gateway: {st:?}");
}
