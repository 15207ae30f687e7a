//! A throwaway Ceph cluster from `scripts/ceph-cluster.sh`: one monitor, one manager and one or
//! three memstore OSDs on 127.0.0.1, with a pool `rbd`, everything in a directory of its own;
//! stopped, and its directory removed, when dropped.
//!
//! ```text
//!   Setup::new(script, dir)?.osds(3).start()?  ─►  Ceph { conf, dir }  ─► drop: stop
//!         └─ command(): what it runs, for a caller that records it
//! ```

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::port::free_port;

/// This repository's `scripts/ceph-cluster.sh` (found from where this crate was built).
pub fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../scripts/ceph-cluster.sh")
}

/// Why a cluster did not start, or an OSD could not be killed.
#[derive(Debug, thiserror::Error)]
pub enum CephError {
    /// bash could not run the script.
    #[error("cannot run {script}: {source}")]
    Run { script: String, source: std::io::Error },
    /// The script failed; its output ends with why (the daemons' logs before that).
    #[error(
        "the Ceph cluster did not start ({status}); it needs ceph-mon, ceph-mgr, ceph-osd and ceph-common \
         (scripts/deps.sh installs them):\n{output}"
    )]
    Start { status: String, output: String },
    /// The script succeeded without naming a config file on its last line.
    #[error("{script} start printed no config file: {stdout}")]
    NoConf { script: String, stdout: String },
    /// `kill-osd` failed.
    #[error("cannot kill osd.{n} of the cluster in {dir} ({status})")]
    KillOsd { n: u32, dir: String, status: String },
}

/// How to start a cluster: `bash SCRIPT start DIR --osds N --port PORT [--osd-bytes BYTES]`.
#[derive(Debug, Clone)]
pub struct Setup {
    script: PathBuf,
    dir: PathBuf,
    osds: u32,
    port: u16,
    osd_bytes: Option<u64>,
}

impl Setup {
    /// One OSD of the script's default size in `dir` (which must not hold a cluster), the
    /// monitor on a free loopback port.
    pub fn new(script: impl Into<PathBuf>, dir: impl Into<PathBuf>) -> std::io::Result<Setup> {
        Ok(Setup { script: script.into(), dir: dir.into(), osds: 1, port: free_port()?, osd_bytes: None })
    }

    /// `n` OSDs (1 or 3); the pool's size matches.
    pub fn osds(mut self, n: u32) -> Setup {
        self.osds = n;
        self
    }

    /// The memstore size of each OSD (RAM it may hold).
    pub fn osd_bytes(mut self, bytes: u64) -> Setup {
        self.osd_bytes = Some(bytes);
        self
    }

    /// The command [`Setup::start`] runs.
    pub fn command(&self) -> Command {
        let mut c = Command::new("bash");
        c.arg(&self.script).arg("start").arg(&self.dir);
        c.args(["--osds", &self.osds.to_string(), "--port", &self.port.to_string()]);
        if let Some(b) = self.osd_bytes {
            c.args(["--osd-bytes", &b.to_string()]);
        }
        c
    }

    /// Starts the cluster and returns once its pool is ready (about 10 s).
    pub fn start(self) -> Result<Ceph, CephError> {
        let script = self.script.display().to_string();
        let out = self
            .command()
            .stdin(Stdio::null())
            .output()
            .map_err(|source| CephError::Run { script: script.clone(), source })?;
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        if !out.status.success() {
            let output = format!("{stdout}{}", String::from_utf8_lossy(&out.stderr));
            return Err(CephError::Start { status: out.status.to_string(), output });
        }
        let conf = PathBuf::from(stdout.lines().last().unwrap_or_default().trim());
        if !conf.is_file() {
            return Err(CephError::NoConf { script, stdout });
        }
        Ok(Ceph { script: self.script, dir: self.dir, conf, running: true })
    }
}

/// A running cluster with a pool `rbd`; stopped, and its directory removed, when dropped.
#[derive(Debug)]
pub struct Ceph {
    script: PathBuf,
    dir: PathBuf,
    conf: PathBuf,
    running: bool,
}

impl Ceph {
    /// The cluster's config file (for `CEPH_CONF`, `rbd -c`, `conf=` of an `rbd:` spec).
    pub fn conf(&self) -> &Path {
        &self.conf
    }

    /// The directory the cluster lives in.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// `rbd -c CONF`, to add arguments to.
    pub fn rbd(&self) -> Command {
        let mut c = Command::new("rbd");
        c.arg("-c").arg(&self.conf);
        c
    }

    /// `ceph -c CONF`, to add arguments to.
    pub fn ceph(&self) -> Command {
        let mut c = Command::new("ceph");
        c.arg("-c").arg(&self.conf);
        c
    }

    /// SIGKILLs `osd.N`: a storage node lost without warning.
    pub fn kill_osd(&self, n: u32) -> Result<(), CephError> {
        let script = self.script.display().to_string();
        let st = Command::new("bash")
            .arg(&self.script)
            .arg("kill-osd")
            .arg(&self.dir)
            .arg(n.to_string())
            .stdin(Stdio::null())
            .status()
            .map_err(|source| CephError::Run { script, source })?;
        if !st.success() {
            return Err(CephError::KillOsd { n, dir: self.dir.display().to_string(), status: st.to_string() });
        }
        Ok(())
    }

    /// The command [`Ceph::stop`] runs first.
    pub fn stop_command(&self) -> Command {
        let mut c = Command::new("bash");
        c.arg(&self.script).arg("stop").arg(&self.dir);
        c
    }

    /// Stops the cluster: the script's `stop`, then whatever of its daemons outlived it (the
    /// script ends them by PID files, which a daemon removes as it begins to shut down, and a
    /// memstore OSD saves its objects before it exits), and the directory once more. Once only.
    pub fn stop(&mut self) {
        if !std::mem::replace(&mut self.running, false) {
            return;
        }
        let conf = self.conf.display().to_string();
        let daemons = daemons_of(&conf);
        if self.dir.join("ceph.conf").is_file() {
            let _ = self.stop_command().stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::null()).status();
        }
        let deadline = Instant::now() + Duration::from_secs(30);
        let left = |pids: &[i32]| pids.iter().copied().filter(|p| still(*p, &conf)).collect::<Vec<_>>();
        while !left(&daemons).is_empty() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(100));
        }
        for pid in left(&daemons) {
            // SAFETY: kill(2) on a daemon of this cluster: its command line names the cluster's
            // config file, checked just above.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }

    /// Has a watcher process stop the cluster once this process has exited, however it exits:
    /// for a cluster kept in a static, which is never dropped. The watcher runs in a session of
    /// its own, so that a signal to this process's group does not end it first.
    pub fn stop_after_exit(&self) -> std::io::Result<()> {
        let watcher = format!(
            "while kill -0 {} 2>/dev/null; do sleep 1; done; exec bash '{}' stop '{}'",
            std::process::id(),
            self.script.display(),
            self.dir.display()
        );
        // Never waited for: it outlives this process by design.
        let _watcher = Command::new("setsid")
            .args(["bash", "-c", &watcher])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()?;
        Ok(())
    }
}

impl Drop for Ceph {
    fn drop(&mut self) {
        self.stop();
    }
}

/// The PIDs of the Ceph daemons (`ceph-mon`, `ceph-mgr`, `ceph-osd`) started with config file
/// `conf`.
fn daemons_of(conf: &str) -> Vec<i32> {
    let Ok(dir) = std::fs::read_dir("/proc") else { return Vec::new() };
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok()).filter(|p| still(*p, conf)).collect()
}

/// True while `pid` is a Ceph daemon started with config file `conf` that has not exited.
fn still(pid: i32, conf: &str) -> bool {
    let Ok(cmdline) = std::fs::read(format!("/proc/{pid}/cmdline")) else { return false };
    let args: Vec<&[u8]> = cmdline.split(|c| *c == 0).collect();
    let daemon = args.first().is_some_and(|a| {
        let name = a.rsplit(|c| *c == b'/').next().unwrap_or(a);
        name.starts_with(b"ceph-")
    });
    let zombie = std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map_or(true, |s| s.rfind(')').is_some_and(|i| s[i + 1..].trim_start().starts_with('Z')));
    daemon && !zombie && args.contains(&conf.as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_start_command_names_the_directory_the_osds_and_a_free_port() {
        let s = Setup::new("/x/ceph-cluster.sh", "/tmp/c").unwrap().osds(3).osd_bytes(1 << 30);
        let c = s.command();
        let args: Vec<String> = c.get_args().map(|a| a.to_string_lossy().into_owned()).collect();
        assert_eq!(c.get_program(), "bash");
        assert_eq!(&args[..5], ["/x/ceph-cluster.sh", "start", "/tmp/c", "--osds", "3"]);
        assert_eq!(args[5], "--port");
        assert!(args[6].parse::<u16>().is_ok_and(|p| p >= 16384), "{args:?}");
        assert_eq!(&args[7..], ["--osd-bytes", "1073741824"]);
        assert!(script().is_file(), "{}", script().display());
    }

    #[test]
    fn a_script_that_fails_is_an_error_with_its_output() {
        let dir = tempfile::tempdir().unwrap();
        let fake = dir.path().join("fake.sh");
        std::fs::write(&fake, "echo starting; echo 'ceph-cluster: ceph-mon is missing' >&2; exit 1\n").unwrap();
        let e = Setup::new(&fake, dir.path().join("c")).unwrap().start().unwrap_err();
        let text = e.to_string();
        assert!(matches!(e, CephError::Start { .. }) && text.contains("ceph-mon is missing"), "{text}");
        std::fs::write(&fake, "echo /no/such/ceph.conf\n").unwrap();
        let e = Setup::new(&fake, dir.path().join("c")).unwrap().start().unwrap_err();
        assert!(matches!(e, CephError::NoConf { .. }), "{e}");
    }
}
