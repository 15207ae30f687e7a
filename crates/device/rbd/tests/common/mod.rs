//! What the RBD test binaries share: a throwaway Ceph cluster from `scripts/ceph-cluster.sh`,
//! the `rbd` tool against it, and block patterns a reader can check.
#![allow(dead_code, reason = "each test binary uses part of it")]

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use bytes::Bytes;
use stics_rbd::{RbdDev, RbdOptions};

/// A cluster with a pool `rbd`.
pub struct Cluster {
    pub conf: PathBuf,
    /// The cluster's directory, when this process started it.
    dir: Option<PathBuf>,
}

fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../scripts/ceph-cluster.sh")
}

impl Cluster {
    /// A cluster someone else runs (its config file).
    pub fn existing(conf: PathBuf) -> Cluster {
        Cluster { conf, dir: None }
    }

    /// Starts a cluster of `osds` OSDs in a directory of its own. Test binaries keep it in a
    /// static, which is never dropped, so a watcher process stops it (the script kills the
    /// daemons by PID and removes the directory) once this process has exited, however it
    /// exits. A cluster that does not start fails the test: these tests never pass without one.
    pub fn start(osds: u32) -> Cluster {
        let script = script();
        let dir = std::env::temp_dir().join(format!("stics-rbd-test-{}-{osds}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let watcher = format!(
            "while kill -0 {} 2>/dev/null; do sleep 1; done; exec bash '{}' stop '{}'",
            std::process::id(),
            script.display(),
            dir.display()
        );
        #[allow(clippy::zombie_processes, reason = "the watcher outlives this process: nothing here waits for it")]
        let _watcher = Command::new("bash")
            .args(["-c", &watcher])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start the cluster's watcher: {e}"));
        let out = Command::new("bash")
            .arg(&script)
            .arg("start")
            .arg(&dir)
            .args(["--osds", &osds.to_string(), "--port", &free_port().to_string()])
            .output()
            .unwrap_or_else(|e| panic!("the Ceph cluster did not start: cannot run {}: {e}", script.display()));
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "the Ceph cluster did not start: {} ({}): {}{} — install ceph-mon ceph-mgr ceph-osd ceph-common, see \
             scripts/deps.sh",
            script.display(),
            out.status,
            stdout,
            String::from_utf8_lossy(&out.stderr)
        );
        let conf = PathBuf::from(stdout.lines().last().unwrap_or_default().trim());
        assert!(conf.is_file(), "the Ceph cluster did not start: the script printed no config file: {stdout}");
        Cluster { conf, dir: Some(dir) }
    }

    /// SIGKILLs `osd.N`: a storage node lost without warning.
    pub fn kill_osd(&self, n: u32) {
        let dir = self.dir.as_ref().expect("only a cluster this process started can lose an OSD");
        let st = Command::new("bash").arg(script()).arg("kill-osd").arg(dir).arg(n.to_string()).status().unwrap();
        assert!(st.success(), "cannot kill osd.{n}");
    }

    pub fn rbd(&self, args: &[&str]) -> String {
        let out = Command::new("rbd").arg("-c").arg(&self.conf).args(args).output().expect("cannot run rbd");
        assert!(out.status.success(), "rbd {args:?} failed: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

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
        RbdOptions { conf: Some(self.conf.clone()), block_size, ..RbdOptions::default() }
    }

    pub async fn open(&self, image: &str, block_size: u32) -> RbdDev {
        RbdDev::open("rbd", image, None, &self.opts(block_size)).await.unwrap_or_else(|e| panic!("open {image}: {e}"))
    }
}

/// A port below the ephemeral range that nothing listens on now.
fn free_port() -> u16 {
    for i in 0..2000u32 {
        let port = 16384 + ((std::process::id().wrapping_mul(7919) + i * 131) % 16000) as u16;
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
    panic!("no free port for the Ceph monitor")
}

/// Block `lba`'s contents under `seed`: every byte depends on both.
pub fn pattern(lba: u64, bs: u32, seed: u8) -> Vec<u8> {
    (0..bs).map(|i| (lba as u8).wrapping_mul(31) ^ (i as u8).wrapping_add(seed) ^ ((lba >> 8) as u8)).collect()
}

/// `blocks` blocks of [`pattern`] from `lba`.
pub fn patterns(lba: u64, blocks: u64, bs: u32, seed: u8) -> Bytes {
    let mut v = Vec::with_capacity((blocks * u64::from(bs)) as usize);
    for b in lba..lba + blocks {
        v.extend(pattern(b, bs, seed));
    }
    Bytes::from(v)
}
