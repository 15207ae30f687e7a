//! A throwaway Ceph cluster for the RBD tests (`scripts/ceph-cluster.sh`: one monitor, one
//! manager, one or three memstore OSDs on 127.0.0.1 in a directory of its own), stopped on drop.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::net::free_port;

/// `scripts/ceph-cluster.sh`, which starts, stops and injures the throwaway clusters.
pub fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/ceph-cluster.sh")
}

/// A running cluster with a pool `rbd`; stopped, and its directory removed, when dropped.
pub struct Ceph {
    dir: tempfile::TempDir,
    conf: PathBuf,
    script: PathBuf,
}

impl Ceph {
    /// Starts a cluster of `osds` (1 or 3) OSDs, the pool's size matching. A cluster that does
    /// not start fails the test with the script's message: RBD tests never pass without one.
    pub fn start(osds: u32) -> Ceph {
        let script = script();
        let dir = tempfile::Builder::new().prefix("stics-ceph").tempdir().unwrap();
        let cluster = dir.path().join("cluster");
        let out = Command::new("bash")
            .arg(&script)
            .args(["start"])
            .arg(&cluster)
            .args(["--osds", &osds.to_string(), "--port", &free_port().to_string()])
            .output()
            .unwrap_or_else(|e| panic!("cannot run {}: {e}", script.display()));
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "the Ceph cluster did not start ({}); the RBD tests need ceph-mon, ceph-mgr, ceph-osd and \
             ceph-common (scripts/deps.sh installs them):\n{stdout}{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        let conf = PathBuf::from(stdout.lines().last().unwrap_or_default().trim());
        assert!(conf.is_file(), "the cluster script printed no config file: {stdout}");
        Ceph { dir, conf, script }
    }

    /// One single-OSD cluster for every test of this test binary that asks, started by the
    /// first. It lives in a static, which is never dropped, so a watcher process stops it once
    /// this process has exited, however it exits.
    pub fn shared() -> &'static Ceph {
        static SHARED: std::sync::OnceLock<Ceph> = std::sync::OnceLock::new();
        SHARED.get_or_init(|| {
            let c = Ceph::start(1);
            let watcher = format!(
                "while kill -0 {} 2>/dev/null; do sleep 1; done; bash '{}' stop '{}'; rm -rf '{}'",
                std::process::id(),
                c.script.display(),
                c.conf.parent().unwrap_or(Path::new(".")).display(),
                c.dir.path().display()
            );
            #[expect(clippy::zombie_processes, reason = "the watcher outlives this process by design")]
            let _watcher = Command::new("setsid")
                .args(["bash", "-c", &watcher])
                .stdin(std::process::Stdio::null())
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null())
                .spawn()
                .expect("start the watcher that stops the shared Ceph cluster");
            c
        })
    }

    /// The cluster's config file (for `CEPH_CONF`, `rbd -c`, `conf=` of an `rbd:` spec).
    pub fn conf(&self) -> &Path {
        &self.conf
    }

    /// The directory the cluster lives in, for the test's own files beside it.
    pub fn dir(&self) -> &Path {
        self.dir.path()
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
        let st = Command::new("bash")
            .arg(&self.script)
            .arg("kill-osd")
            .arg(self.conf.parent().unwrap_or(Path::new(".")))
            .arg(n.to_string())
            .status()
            .unwrap();
        assert!(st.success(), "cannot kill osd.{n}");
    }
}

impl Drop for Ceph {
    fn drop(&mut self) {
        let _ = Command::new("bash")
            .arg(&self.script)
            .arg("stop")
            .arg(self.conf.parent().unwrap_or(Path::new(".")))
            .status();
    }
}
