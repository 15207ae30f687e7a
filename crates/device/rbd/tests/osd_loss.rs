//! I/O through the loss of an OSD: three OSDs and a pool of size 3 in a cluster of this binary's
//! own. SIGKILLing one OSD makes the requests on its placement groups wait until the monitors
//! mark it down and the groups re-peer; none may fail (the device sets no OSD op timeout).
#![cfg(feature = "rbd")]

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{patterns, Cluster};
use stics_block::BlockDev;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_osd_delays_io_but_fails_none() {
    let c = Cluster::start(3);
    let name = c.image("osdloss", "64M", &[]);
    let dev = Arc::new(c.open(&name, 4096).await);
    let lanes = 8u64;
    let per_lane = dev.geometry().num_blocks / lanes;
    let stop = Arc::new(AtomicBool::new(false));
    let start = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for lane in 0..lanes {
        let (dev, stop) = (Arc::clone(&dev), Arc::clone(&stop));
        // Each lane writes then reads back its own blocks, spread over every object.
        tasks.spawn(async move {
            let (mut ops, mut slowest, mut last_done) = (0u64, Duration::ZERO, Duration::ZERO);
            while !stop.load(Ordering::Relaxed) {
                let lba = lane + lanes * ((ops * 37) % per_lane);
                let data = patterns(lba, 1, 4096, ops as u8);
                let t = Instant::now();
                dev.write(lba, data.clone(), false).await.map_err(|e| format!("write at {lba}: {e}"))?;
                let got = dev.read(lba, 1).await.map_err(|e| format!("read at {lba}: {e}"))?;
                if got != data {
                    return Err(format!("block {lba} read back wrong"));
                }
                slowest = slowest.max(t.elapsed());
                last_done = start.elapsed();
                ops += 1;
            }
            Ok::<_, String>((ops, slowest, last_done))
        });
    }
    tokio::time::sleep(Duration::from_secs(3)).await;
    c.kill_osd(1);
    let killed = start.elapsed();
    // Past the monitors' down detection (osd heartbeat grace 6 s in the script) and re-peering.
    tokio::time::sleep(Duration::from_secs(30)).await;
    stop.store(true, Ordering::Relaxed);
    let (mut ops, mut slowest) = (0, Duration::ZERO);
    while let Some(r) = tasks.join_next().await {
        let (n, slow, last_done) = r.unwrap().unwrap_or_else(|e| panic!("I/O failed after osd.1 was killed: {e}"));
        assert!(last_done > killed + Duration::from_secs(20), "a lane made no progress after the loss");
        ops += n;
        slowest = slowest.max(slow);
    }
    eprintln!(
        "{ops} write+read pairs, none failed; the slowest took {:.1} s (osd.1 killed at {:.1} s)",
        slowest.as_secs_f64(),
        killed.as_secs_f64()
    );
    dev.flush().await.unwrap();
}
