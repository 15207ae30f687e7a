//! Child processes for tests: a guard that kills by PID when dropped ([`stics_procs::Guard`]),
//! spawning the `stics` binary with its stderr in a file, and waiting for ports, mounts and
//! commands.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

pub use stics_procs::{wait_port, Guard};

/// Serialises the heavy tests of one test binary (each binary is its own process, so each has
/// its own lock): FUSE exports, loop devices and ext4 side by side overload a 2-core machine.
pub fn one_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    LOCK.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
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
    let p = path.to_str().unwrap().to_owned();
    stics_procs::wait_for(limit, || {
        let mounts = std::fs::read_to_string("/proc/mounts").unwrap_or_default();
        mounts.lines().any(|l| l.split(' ').nth(1) == Some(p.as_str())) == on
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stderr_goes_to_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("err");
        let mut g = spawn(Command::new("sh").args(["-c", "echo oops >&2"]), Some(&log));
        assert!(g.wait_exit(Duration::from_secs(5)).unwrap().success());
        assert_eq!(std::fs::read_to_string(&log).unwrap(), "oops\n");
    }
}
