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
}

/// An SG whose answers are lost now and then: an exchange lost on the way or after the SG took it
/// (the driver sends it again), a poll answer lost after the SG produced it (the driver asks from
/// the same number again), a group's answer lost after it landed (sent again, taken once).
struct Lossy {
    sg: Arc<JournalDev>,
    rng: std::sync::Mutex<rand::rngs::StdRng>,
}

impl Lossy {
    fn roll(&self) -> f64 {
        use rand::Rng;
        self.rng.lock().unwrap().gen::<f64>()
    }
}

fn lost() -> stics_block::BlockError {
    stics_block::BlockError::Unreachable("the answer was lost".into())
}

#[async_trait::async_trait]
impl BlockDev for Lossy {
    fn geometry(&self) -> stics_block::Geometry {
        self.sg.geometry()
    }
    fn volatile_cache(&self) -> bool {
        self.sg.volatile_cache()
    }
    async fn read(&self, lba: u64, blocks: u32) -> Result<bytes::Bytes, stics_block::BlockError> {
        self.sg.read(lba, blocks).await
    }
    async fn write(&self, lba: u64, data: bytes::Bytes, fua: bool) -> Result<(), stics_block::BlockError> {
        self.sg.write(lba, data, fua).await
    }
    async fn flush(&self) -> Result<(), stics_block::BlockError> {
        self.sg.flush().await
    }
    fn group_sink(&self) -> Option<&dyn stics_block::GroupSink> {
        Some(self)
    }
}

#[async_trait::async_trait]
impl stics_block::GroupSink for Lossy {
    fn max_group(&self) -> u32 {
        self.sg.max_group()
    }
    async fn commit(&self, group: bytes::Bytes) -> Result<(), stics_block::BlockError> {
        self.sg.commit(group).await?;
        if self.roll() < 0.1 {
            return Err(lost());
        }
        Ok(())
    }
    async fn link_status(&self, fence: u64) -> Result<bytes::Bytes, stics_block::BlockError> {
        self.sg.link_status(fence).await
    }
    async fn tokens(&self, exchange: bytes::Bytes, new_connection: bool) -> Result<(), stics_block::BlockError> {
        let r = self.roll();
        if r < 0.1 {
            return Err(lost());
        }
        self.sg.tokens(exchange, new_connection).await?;
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
        let answer = self.sg.token_poll(gateway, from, wait, max).await?;
        if self.roll() < 0.2 {
            return Err(lost());
        }
        Ok(answer)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lost_answers_and_exchanges_sent_twice_lose_nothing() {
    use rand::SeedableRng;
    let medium = Arc::new(MemDev::new(512, 4 * SEG_BLOCKS));
    let sg =
        JournalDev::open(Arc::new(MemDev::new(512, 2048 * 16)), medium, JournalConfig::default()).await.expect("opens");
    let sg = Arc::new(sg);
    let devs: Vec<Arc<dyn BlockDev>> = (0..3u64)
        .map(|seed| {
            let rng = std::sync::Mutex::new(rand::rngs::StdRng::seed_from_u64(seed));
            Arc::new(Lossy { sg: Arc::clone(&sg), rng }) as Arc<dyn BlockDev>
        })
        .collect();
    let cfg = DriverConfig {
        poll_wait: Duration::from_millis(50),
        retry: Duration::from_millis(5),
        ..DriverConfig::default()
    };
    let run = share(devs, 4, 200, cfg).await;
    assert!(run.groups > 0, "segments changed hands: {run:?}");
}
