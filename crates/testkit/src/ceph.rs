//! A Ceph cluster for the RBD tests: a throwaway one ([`stics_procs::ceph`]: one monitor, one
//! manager, one or three memstore OSDs on 127.0.0.1 in a directory of its own, stopped on drop)
//! or one someone else runs; with the tools and specs the tests use on it.

use std::path::{Path, PathBuf};
use std::process::Command;

pub use stics_procs::ceph::script;
use stics_procs::ceph::Setup;

/// A cluster with a pool `rbd`: started by this process (stopped, and its directory removed,
/// when dropped) or a running one named by its config file.
pub struct Ceph {
    own: Option<stics_procs::ceph::Ceph>,
    conf: PathBuf,
}

impl Ceph {
    /// Starts a cluster of `osds` (1 or 3) OSDs, the pool's size matching, in a fresh directory
    /// under the temporary folder. A cluster that does not start fails the test with the
    /// script's message: RBD tests never pass without one.
    pub fn start(osds: u32) -> Ceph {
        let dir = tempfile::Builder::new().prefix("stics-ceph").tempdir().unwrap();
        // The cluster's stop removes the directory; a cluster that does not start leaves it here.
        let dir = dir.keep();
        let failed = |what: String| -> ! {
            let _ = std::fs::remove_dir_all(&dir);
            panic!("{what}")
        };
        let setup = Setup::new(script(), dir.clone())
            .unwrap_or_else(|e| failed(format!("no free port for the Ceph monitor: {e}")));
        let own = setup.osds(osds).start().unwrap_or_else(|e| failed(e.to_string()));
        Ceph { conf: own.conf().to_owned(), own: Some(own) }
    }

    /// A cluster someone else runs, by its config file (its pool `rbd` holds the tests' images).
    pub fn existing(conf: PathBuf) -> Ceph {
        Ceph { own: None, conf }
    }

    /// One single-OSD cluster for every test of this test binary that asks, started by the
    /// first. It lives in a static, which is never dropped, so a watcher process stops it once
    /// this process has exited, however it exits.
    pub fn shared() -> &'static Ceph {
        static SHARED: std::sync::OnceLock<Ceph> = std::sync::OnceLock::new();
        SHARED.get_or_init(|| {
            let c = Ceph::start(1);
            if let Some(own) = &c.own {
                own.stop_after_exit().expect("start the watcher that stops the shared Ceph cluster");
            }
            c
        })
    }

    /// The cluster's config file (for `CEPH_CONF`, `rbd -c`, `conf=` of an `rbd:` spec).
    pub fn conf(&self) -> &Path {
        &self.conf
    }

    /// The directory the cluster lives in, for the test's own files beside it (removed with it).
    pub fn dir(&self) -> &Path {
        self.own().dir()
    }

    fn own(&self) -> &stics_procs::ceph::Ceph {
        self.own.as_ref().expect("only a cluster this process started has a directory and OSDs to kill")
    }

    /// Runs the `rbd` tool against the cluster and returns its stdout; fails the test if it fails.
    pub fn rbd(&self, args: &[&str]) -> String {
        crate::proc::run_ok(Command::new("rbd").arg("-c").arg(&self.conf).args(args))
    }

    /// Runs the `ceph` tool against the cluster and returns its stdout; fails the test if it fails.
    pub fn ceph(&self, args: &[&str]) -> String {
        crate::proc::run_ok(Command::new("ceph").arg("-c").arg(&self.conf).args(args))
    }

    /// Creates image `rbd/NAME` of `size` (an `rbd create --size` value such as `64M`).
    pub fn create_image(&self, name: &str, size: &str) {
        self.rbd(&["create", "--size", size, &format!("rbd/{name}")]);
    }

    /// The spec of image `rbd/NAME` in this cluster, with `extra` query pairs (`block=4096`).
    pub fn spec(&self, name: &str, extra: &str) -> String {
        let sep = if extra.is_empty() { "" } else { "&" };
        format!("rbd:rbd/{name}?conf={}{sep}{extra}", self.conf.display())
    }

    /// SIGKILLs `osd.N`: a storage node lost without warning.
    pub fn kill_osd(&self, n: u32) {
        self.own().kill_osd(n).unwrap_or_else(|e| panic!("{e}"));
    }
}
