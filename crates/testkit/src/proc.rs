//! Child processes for tests: a guard that kills by PID when dropped, spawning the `stics`
//! binary with its stderr in a file, and waiting for ports, mounts and commands.

use std::path::Path;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// Serialises the heavy tests of one test binary (each binary is its own process, so each has
/// its own lock): FUSE exports, loop devices and ext4 side by side overload a 2-core machine.
pub fn one_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    LOCK.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// A child process killed with SIGKILL (and reaped) when dropped, so that a failing test leaves
/// nothing running.
#[derive(Debug, Default)]
pub struct Guard(Option<Child>);

impl Guard {
    pub fn new(child: Child) -> Guard {
        Guard(Some(child))
    }

    /// The PID, or 0 once the child is gone.
    pub fn pid(&self) -> u32 {
        self.0.as_ref().map_or(0, std::process::Child::id)
    }

    /// SIGKILL, then waits for the child to exit.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.0.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Sends a signal by name or number (`"TERM"`, `"-INT"`, `"9"`) with kill(1); false if
    /// there is no child or kill failed.
    pub fn signal(&self, sig: &str) -> bool {
        let pid = self.pid();
        if pid == 0 {
            return false;
        }
        let sig = if sig.starts_with('-') { sig.to_owned() } else { format!("-{sig}") };
        let st = Command::new("kill").args([sig.as_str(), &pid.to_string()]).stderr(Stdio::null()).status();
        st.is_ok_and(|s| s.success())
    }

    /// True while the child runs.
    pub fn alive(&mut self) -> bool {
        matches!(self.0.as_mut().map(std::process::Child::try_wait), Some(Ok(None)))
    }

    /// Waits up to `limit` for the child to exit and returns its status (the guard then holds
    /// nothing); None if it still runs, and then the guard still holds it.
    pub fn wait_exit(&mut self, limit: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + limit;
        loop {
            let c = self.0.as_mut()?;
            if let Ok(Some(st)) = c.try_wait() {
                self.0 = None;
                return Some(st);
            }
            if Instant::now() > deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The resident set size in KiB, from /proc.
    pub fn rss_kib(&self) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid())).unwrap();
        let line = status.lines().find(|l| l.starts_with("VmRSS:")).unwrap();
        line.split_whitespace().nth(1).unwrap().parse().unwrap()
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Spawns `cmd` with stdout discarded and stderr into `stderr` (a file, not a pipe, so that a
/// chatty child never blocks on it), or discarded.
pub fn spawn(cmd: &mut Command, stderr: Option<&Path>) -> Guard {
    let err = match stderr {
        Some(p) => Stdio::from(std::fs::File::create(p).unwrap_or_else(|e| panic!("create {}: {e}", p.display()))),
        None => Stdio::null(),
    };
    let child = cmd.stdout(Stdio::null()).stderr(err).spawn().unwrap_or_else(|e| panic!("cannot start {cmd:?}: {e}"));
    Guard::new(child)
}

/// Spawns the `stics` binary at `bin` (tests pass `env!("CARGO_BIN_EXE_stics")`) with `args`,
/// extra environment and stderr into `stderr`.
pub fn spawn_stics<S: AsRef<std::ffi::OsStr>>(
    bin: &Path,
    args: &[S],
    env: &[(&str, &str)],
    stderr: Option<&Path>,
) -> Guard {
    spawn(Command::new(bin).args(args).envs(env.iter().copied()), stderr)
}

/// True once 127.0.0.1:`port` accepts a TCP connection, false if it did not within `limit`.
///
/// A connection to itself does not count: with nothing listening, a connect whose ephemeral
/// source port happens to be `port` opens simultaneously onto its own socket and succeeds.
pub fn wait_port(port: u16, limit: Duration) -> bool {
    let deadline = Instant::now() + limit;
    loop {
        if let Ok(s) = std::net::TcpStream::connect(("127.0.0.1", port)) {
            if s.local_addr().ok() != s.peer_addr().ok() {
                return true;
            }
        }
        if Instant::now() > deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Runs a command and returns its stdout, failing the test with its output when it fails.
pub fn run_ok(cmd: &mut Command) -> String {
    let out = cmd.output().unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?} failed: {}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Waits until `path` is (`on`) or is no longer (`!on`) a mount point listed in /proc/mounts;
/// false if that did not happen within `limit`.
pub fn wait_mounted(path: &Path, on: bool, limit: Duration) -> bool {
    let deadline = Instant::now() + limit;
    let p = path.to_str().unwrap().to_owned();
    loop {
        let mounts = std::fs::read_to_string("/proc/mounts").unwrap_or_default();
        if mounts.lines().any(|l| l.split(' ').nth(1) == Some(p.as_str())) == on {
            return true;
        }
        if Instant::now() > deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn guard_kills_on_drop_and_reports_exit() {
        let mut g = spawn(Command::new("sleep").arg("30"), None);
        let pid = g.pid();
        assert!(pid != 0 && g.alive());
        drop(g);
        // Killed and reaped: the PID is gone (reuse within these microseconds is not a concern).
        assert!(!Path::new(&format!("/proc/{pid}")).exists());
        g = spawn(Command::new("sleep").arg("30"), None);
        assert!(g.signal("TERM"));
        let st = g.wait_exit(Duration::from_secs(5)).expect("exited on SIGTERM");
        assert!(!st.success());
        assert_eq!(g.pid(), 0);
        assert!(!g.signal("TERM"), "nothing left to signal");
    }

    #[test]
    fn stderr_goes_to_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("err");
        let mut g = spawn(Command::new("sh").args(["-c", "echo oops >&2"]), Some(&log));
        assert!(g.wait_exit(Duration::from_secs(5)).unwrap().success());
        assert_eq!(std::fs::read_to_string(&log).unwrap(), "oops\n");
    }

    #[test]
    fn wait_port_sees_a_listener() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        assert!(wait_port(l.local_addr().unwrap().port(), Duration::from_secs(1)));
        let free = crate::net::free_port();
        assert!(!wait_port(free, Duration::from_millis(100)));
    }
}
