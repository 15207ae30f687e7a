//! What the test kit and the benchmarks both start and stop: child processes ended by PID
//! ([`Guard`]), free loopback ports and waiting for a listener ([`port`]), a throwaway Ceph
//! cluster from `scripts/ceph-cluster.sh` ([`ceph`]), an nfs-ganesha server ([`ganesha`]), and
//! the loop device a file backs ([`loop_of`]).
//!
//! A library's manners: failures are returned, never panics; the test kit turns them into failed
//! tests, the benchmarks into errors of a run.

pub mod ceph;
pub mod child;
pub mod ganesha;
pub mod port;

use std::path::Path;
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

/// The loop device (`/dev/loopN`) backed by the file `file`, if any.
pub fn loop_of(file: &Path) -> Option<String> {
    let file = std::fs::canonicalize(file).unwrap_or_else(|_| file.to_owned());
    let file = file.to_string_lossy();
    std::fs::read_dir("/sys/block").ok()?.filter_map(std::result::Result::ok).find_map(|e| {
        let name = e.file_name().to_string_lossy().into_owned();
        let backing = std::fs::read_to_string(e.path().join("loop/backing_file")).ok()?;
        let backing = backing.trim_end();
        (name.starts_with("loop") && backing.strip_suffix(" (deleted)").unwrap_or(backing) == file)
            .then(|| format!("/dev/{name}"))
    })
}
