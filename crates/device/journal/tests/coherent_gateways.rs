//! Three gateways' token drivers (`stics_coherence::driver`) over one SG's journal, in one
//! process (`stics_testkit::coherence`): random reads and writes over four shared segments,
//! segments shipped as fenced groups on revoke; no conflicting operations, no stale read, every
//! group under its token, every operation completed.

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
