//! One named emulator instance on this machine: its runtime directory (PID files, control socket,
//! parameters, log), starting its daemon, and removing everything it made, also after a crash.

use std::fs;
use std::io::Read;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::params::{Cc, Params};
use crate::sys;
use crate::topo::{Role, Topology};
use crate::{Result, WanError};

/// Where instances keep their state unless told otherwise.
pub const DEFAULT_RUNTIME_DIR: &str = "/run/stics-wan";

/// A named instance and its runtime directory.
#[derive(Debug, Clone)]
pub struct Instance {
    pub topo: Topology,
    pub dir: PathBuf,
}

/// Runs one command, turning a non-zero exit into an error carrying its stderr.
pub fn run_cmd(args: &[String]) -> Result<String> {
    let (prog, rest) = args.split_first().ok_or_else(|| WanError::param("command", "", "empty"))?;
    let out = Command::new(prog)
        .args(rest)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| WanError::io(format!("run {prog}"), e))?;
    if !out.status.success() {
        return Err(WanError::Command {
            cmd: args.join(" "),
            detail: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        });
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Runs a plan in order, stopping at the first failure.
pub fn run_plan(plan: &[Vec<String>]) -> Result<()> {
    plan.iter().try_for_each(|c| run_cmd(c).map(|_| ()))
}

/// Lets namespaces other than the initial one choose `cc`: the kernel allows them only the
/// congestion controls listed in the (global) `tcp_allowed_congestion_control`. Must run in the
/// initial network namespace.
pub fn allow_congestion_control(cc: Cc) -> Result<()> {
    let path = "/proc/sys/net/ipv4/tcp_allowed_congestion_control";
    let now = fs::read_to_string(path).map_err(|e| WanError::io(format!("read {path}"), e))?;
    if now.split_whitespace().any(|c| c == cc.name()) {
        return Ok(());
    }
    let list = format!("{} {}", now.trim(), cc.name());
    fs::write(path, list).map_err(|e| WanError::io(format!("write {path}"), e))
}

fn read_pid(path: &Path) -> Option<i32> {
    fs::read_to_string(path).ok()?.trim().parse().ok()
}

impl Instance {
    pub fn new(name: &str, runtime_root: &Path) -> Result<Instance> {
        let topo = Topology::new(name)?;
        Ok(Instance { dir: runtime_root.join(name), topo })
    }

    pub fn name(&self) -> &str {
        &self.topo.name
    }

    pub fn sock_path(&self) -> PathBuf {
        self.dir.join("ctl.sock")
    }
    pub fn params_path(&self) -> PathBuf {
        self.dir.join("params.json")
    }
    pub fn log_path(&self) -> PathBuf {
        self.dir.join("daemon.log")
    }
    pub fn ready_path(&self) -> PathBuf {
        self.dir.join("ready")
    }
    pub fn token_path(&self) -> PathBuf {
        self.dir.join("token")
    }
    fn pid_path(&self) -> PathBuf {
        self.dir.join("daemon.pid")
    }
    fn reaper_pid_path(&self) -> PathBuf {
        self.dir.join("reaper.pid")
    }

    /// True when `pid` is a live process of ours for this instance (guards against reused PIDs).
    fn is_ours(&self, pid: i32) -> bool {
        if !sys::pid_alive(pid) {
            return false;
        }
        let Ok(cmdline) = fs::read(format!("/proc/{pid}/cmdline")) else { return false };
        let args: Vec<&[u8]> = cmdline.split(|&b| b == 0).collect();
        args.iter().any(|a| *a == b"wan") && args.iter().any(|a| *a == self.name().as_bytes())
    }

    /// The PID of the running daemon, if any.
    pub fn daemon_pid(&self) -> Option<i32> {
        read_pid(&self.pid_path()).filter(|&p| self.is_ours(p))
    }

    pub fn write_pid(&self, reaper: bool, pid: u32) -> Result<()> {
        let path = if reaper { self.reaper_pid_path() } else { self.pid_path() };
        fs::write(&path, pid.to_string()).map_err(|e| WanError::io(format!("write {}", path.display()), e))
    }

    pub fn read_params(&self) -> Result<Params> {
        let path = self.params_path();
        let text = fs::read_to_string(&path).map_err(|e| WanError::io(format!("read {}", path.display()), e))?;
        serde_json::from_str(&text).map_err(|e| WanError::Protocol(format!("{}: {e}", path.display())))
    }

    pub fn write_params(&self, p: &Params) -> Result<()> {
        let path = self.params_path();
        let text = serde_json::to_string_pretty(p).map_err(|e| WanError::Protocol(e.to_string()))?;
        let tmp = self.dir.join("params.json.tmp");
        fs::write(&tmp, text).map_err(|e| WanError::io(format!("write {}", tmp.display()), e))?;
        fs::rename(&tmp, &path).map_err(|e| WanError::io(format!("rename to {}", path.display()), e))
    }

    /// Cuts an end off (`cut`) or joins it again: its packets are dropped in the router, both
    /// ways, ahead of the emulator. Doing either twice is the same as doing it once.
    pub fn set_cut(&self, role: Role, cut: bool) -> Result<()> {
        if matches!(role, Role::Router) {
            return Err(WanError::param("end", "wan", "cut a host or the storage side"));
        }
        self.check_role(role)?;
        for rule in Topology::cut_rules(role) {
            let there = run_cmd(&self.topo.cut_cmd("-C", &rule)).is_ok();
            match (cut, there) {
                (true, false) => run_cmd(&self.topo.cut_cmd("-I", &rule)).map(drop)?,
                (false, true) => run_cmd(&self.topo.cut_cmd("-D", &rule)).map(drop)?,
                _ => {}
            }
        }
        Ok(())
    }

    /// Refuses a host this link does not have (a link that is not up has none to compare with:
    /// the caller says it is not up).
    pub fn check_role(&self, role: Role) -> Result<()> {
        if let (Role::Host(k), Ok(p)) = (role, self.read_params()) {
            let hosts = p.hosts;
            if k > hosts {
                return Err(WanError::param("end", &format!("host{k}"), format!("this link has {hosts} host(s)")));
            }
        }
        Ok(())
    }

    /// The ends that are cut off now.
    pub fn cut_ends(&self) -> Result<Vec<Role>> {
        let hosts = self.read_params()?.hosts;
        Ok(Topology::ends(hosts)
            .into_iter()
            .filter(|&r| run_cmd(&self.topo.cut_cmd("-C", &Topology::cut_rules(r)[0])).is_ok())
            .collect())
    }

    /// Namespaces of this instance that exist now.
    pub fn existing_namespaces(&self) -> Vec<String> {
        self.topo.all_ns().into_iter().filter(|ns| Path::new("/run/netns").join(ns).exists()).collect()
    }

    /// Removes the namespaces (and with them every link, address, rule and qdisc of the instance).
    pub fn remove_namespaces(&self) -> Result<()> {
        let mut first_err = None;
        for cmd in self.topo.teardown_plan() {
            let ns = cmd.last().cloned().unwrap_or_default();
            if Path::new("/run/netns").join(&ns).exists() {
                if let Err(e) = run_cmd(&cmd) {
                    first_err.get_or_insert(e);
                }
            }
        }
        first_err.map_or(Ok(()), Err)
    }

    /// Stops the daemon (if running), waits for its reaper, and removes everything left, stale
    /// state of a crashed daemon included. Safe to call any number of times.
    pub fn teardown(&self) -> Result<()> {
        if let Some(pid) = self.daemon_pid() {
            sys::kill(pid, libc::SIGTERM);
            if !wait_gone(pid, Duration::from_secs(10)) {
                sys::kill(pid, libc::SIGKILL);
                wait_gone(pid, Duration::from_secs(2));
            }
        }
        if let Some(pid) = read_pid(&self.reaper_pid_path()).filter(|&p| self.is_ours(p)) {
            if !wait_gone(pid, Duration::from_secs(10)) {
                sys::kill(pid, libc::SIGKILL);
                wait_gone(pid, Duration::from_secs(2));
            }
        }
        self.remove_namespaces()?;
        if self.dir.exists() {
            fs::remove_dir_all(&self.dir).map_err(|e| WanError::io(format!("remove {}", self.dir.display()), e))?;
        }
        Ok(())
    }

    /// Creates the runtime directory with the parameters and a fresh instance token.
    pub fn prepare(&self, params: &Params) -> Result<String> {
        fs::create_dir_all(&self.dir).map_err(|e| WanError::io(format!("create {}", self.dir.display()), e))?;
        let token = format!("{}-{}", std::process::id(), now_nanos());
        fs::write(self.token_path(), &token).map_err(|e| WanError::io("write token", e))?;
        self.write_params(params)?;
        Ok(token)
    }

    /// Starts the daemon `exe args...` detached (its own process group, output to the log) and
    /// waits until it reports ready or dies.
    pub fn spawn_daemon(&self, exe: &Path, args: &[String], timeout: Duration) -> Result<u32> {
        let log = fs::File::create(self.log_path()).map_err(|e| WanError::io("create daemon log", e))?;
        let log2 = log.try_clone().map_err(|e| WanError::io("dup daemon log", e))?;
        let mut child = Command::new(exe)
            .args(args)
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(log2)
            .process_group(0)
            .spawn()
            .map_err(|e| WanError::io(format!("start {}", exe.display()), e))?;
        let start = Instant::now();
        loop {
            if self.ready_path().exists() {
                return Ok(child.id());
            }
            if let Ok(Some(status)) = child.try_wait() {
                let mut log = String::new();
                if let Ok(mut f) = fs::File::open(self.log_path()) {
                    let _ = f.read_to_string(&mut log);
                }
                return Err(WanError::Start(format!("daemon exited ({status}): {}", log.trim())));
            }
            if start.elapsed() > timeout {
                sys::kill(child.id() as i32, libc::SIGKILL);
                let _ = child.wait();
                return Err(WanError::Start("daemon did not become ready in time".into()));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The reaper's work after its daemon is gone: if the runtime directory still holds this
    /// instance's token, the daemon died without cleaning up, so remove what it left.
    pub fn reap(&self, token: &str) -> Result<()> {
        match fs::read_to_string(self.token_path()) {
            Ok(t) if t.trim() == token => {}
            // Cleaned up by the daemon itself, or already replaced by a newer instance.
            _ => return Ok(()),
        }
        self.remove_namespaces()?;
        let _ = fs::remove_dir_all(&self.dir);
        Ok(())
    }
}

fn now_nanos() -> u128 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos())
}

/// Waits until `pid` no longer exists (reaping it if it is our child is not needed: teardown is
/// called from a different process than the one that started the daemon).
fn wait_gone(pid: i32, timeout: Duration) -> bool {
    let start = Instant::now();
    while sys::pid_alive(pid) && !is_zombie(pid) {
        if start.elapsed() > timeout {
            return false;
        }
        // A zombie child of ours still answers kill(0); reap it if so.
        // SAFETY: waitpid with WNOHANG on a specific pid has no memory effects beyond `status`.
        unsafe {
            let mut status = 0;
            libc::waitpid(pid, &raw mut status, libc::WNOHANG);
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    true
}

fn is_zombie(pid: i32) -> bool {
    // The state follows the command name in parentheses, which may itself contain spaces.
    fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| s.rsplit_once(')').map(|(_, rest)| rest.trim_start().starts_with('Z')))
        .unwrap_or(false)
}
