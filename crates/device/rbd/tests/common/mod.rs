//! What the RBD test binaries share: their Ceph cluster (the test kit's), and images and devices
//! in it.
#![allow(dead_code, reason = "each test binary uses part of it")]

use std::sync::OnceLock;

use stics_rbd::{RbdDev, RbdOptions};
use stics_testkit::ceph::Ceph;

/// This binary's cluster: the test kit's one-OSD cluster shared by its tests, started on first
/// use, or the one `STICS_RBD_TEST_CONF` names.
pub fn cluster() -> Cluster {
    static EXISTING: OnceLock<Option<Ceph>> = OnceLock::new();
    let existing = EXISTING.get_or_init(|| std::env::var_os("STICS_RBD_TEST_CONF").map(|c| Ceph::existing(c.into())));
    Cluster(existing.as_ref().unwrap_or_else(|| Ceph::shared()))
}

/// The cluster, with the images and devices the tests make in it.
pub struct Cluster(&'static Ceph);

impl std::ops::Deref for Cluster {
    type Target = Ceph;

    fn deref(&self) -> &Ceph {
        self.0
    }
}

impl Cluster {
    /// Creates `rbd/NAME` (NAME unique per test process) and returns NAME.
    pub fn image(&self, tag: &str, size: &str, extra: &[&str]) -> String {
        let name = format!("{tag}-{}", std::process::id());
        let spec = format!("rbd/{name}");
        let mut args = vec!["create", "--size", size, spec.as_str()];
        args.extend_from_slice(extra);
        self.rbd(&args);
        name
    }

    pub fn opts(&self, block_size: u32) -> RbdOptions {
        RbdOptions { conf: Some(self.conf().to_owned()), block_size, ..RbdOptions::default() }
    }

    pub async fn open(&self, image: &str, block_size: u32) -> RbdDev {
        RbdDev::open("rbd", image, None, &self.opts(block_size)).await.unwrap_or_else(|e| panic!("open {image}: {e}"))
    }
}
