//! What the test kit and the benchmarks both start and stop: child processes ended by PID
//! ([`Guard`]), free loopback ports and waiting for a listener ([`port`]), and a throwaway Ceph
//! cluster from `scripts/ceph-cluster.sh` ([`ceph`]), and an nfs-ganesha server ([`ganesha`]).
//!
//! A library's manners: failures are returned, never panics; the test kit turns them into failed
//! tests, the benchmarks into errors of a run.

pub mod ceph;
pub mod child;
pub mod ganesha;
pub mod port;

use std::time::{Duration, Instant};

pub use child::Guard;
pub use port::{accepts, free_port, wait_port};

/// Checks `ready` every 20 ms until it holds (true) or `limit` has passed (false).
pub fn wait_for(limit: Duration, mut ready: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + limit;
    loop {
        if ready() {
            return true;
        }
        if Instant::now() > deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}
