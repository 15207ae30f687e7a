//! The context of one `stics bench` run: where the `stics` binary is, scratch space, the commands
//! run (kept for the report), child processes ended by PID, progress bars, and the clean-up of an
//! interrupted run.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use indicatif::{MultiProgress, ProgressBar, ProgressDrawTarget, ProgressStyle};
use stics_procs::Guard;

use crate::{Error, Result};

/// How a run was asked for.
#[derive(Debug, Clone, Default)]
pub struct Options {
    /// The `stics` binary that serves, caches and emulates (the running one, normally).
    pub stics: PathBuf,
    /// CI-sized runs: fewer requests, fewer points, one repetition unless told.
    pub quick: bool,
    /// Repetitions of each measurement (medians and spread are reported).
    pub reps: usize,
    /// Keep scratch files (LUN images, logs of the processes) here instead of a temporary folder.
    pub keep: Option<PathBuf>,
    /// Draw progress bars (on a terminal).
    pub progress: bool,
    /// Bound the host's memory (the workload, the file system it mounts and their page cache)
    /// to this many bytes with a memory cgroup, as the papers' hosts had little of it.
    pub host_memory: Option<u64>,
    /// Put the remote's medium on this disk model (`disk(file:…, model=NAME)`), as the papers'
    /// targets stored on disks; `None` keeps the page-cached file.
    pub remote_disk: Option<stics_disk::Preset>,
    /// Put every gateway's log behind this disk model (seed 004's log disk).
    pub log_disk: Option<stics_disk::Preset>,
    /// Every gateway's read cache policy (`stics gateway --policy`); `None` keeps its default.
    pub read_cache_policy: Option<String>,
    /// Mount the benchmarks' ext4 with its default options instead of `-o sync`.
    pub ext4_default: bool,
    /// Put the loop device under the host's ext4 on direct I/O (see [`crate::exp::fs::mount_ext4`]).
    pub loop_direct_io: bool,
}

/// The run's context, shared by the experiments.
#[derive(Debug)]
pub struct Bench {
    opts: Options,
    work: PathBuf,
    _tmp: Option<tempfile::TempDir>,
    commands: Mutex<Vec<String>>,
    bars: MultiProgress,
    /// The memory cgroup of the host's commands, when [`Options::host_memory`] is set.
    memcg: Option<MemCgroup>,
}

/// Where memory cgroups (v1) live.
const MEMCG_ROOT: &str = "/sys/fs/cgroup/memory";

/// A memory cgroup this run made; removed when dropped (it is empty by then: every command
/// put in it has ended).
#[derive(Debug)]
struct MemCgroup {
    dir: PathBuf,
}

impl MemCgroup {
    fn new(limit: u64) -> Result<MemCgroup> {
        let root = Path::new(MEMCG_ROOT);
        if !root.join("memory.limit_in_bytes").exists() {
            return Err(Error::Invalid(format!(
                "--host-memory needs the v1 memory cgroup controller mounted at {MEMCG_ROOT} (and root)"
            )));
        }
        let dir = root.join(format!("stics-bench-{}", std::process::id()));
        std::fs::create_dir_all(&dir)
            .map_err(|e| Error::Invalid(format!("cannot make the memory cgroup {}: {e}", dir.display())))?;
        let cg = MemCgroup { dir };
        // An interrupted run removes it too, once its commands are stopped.
        remember(cg.undo());
        std::fs::write(cg.dir.join("memory.limit_in_bytes"), limit.to_string())
            .map_err(|e| Error::Invalid(format!("cannot bound {} to {limit} bytes: {e}", cg.dir.display())))?;
        Ok(cg)
    }

    /// `cmd`, run from a shell that first moves itself into this cgroup.
    fn wrap(&self, cmd: &Command) -> Command {
        let mut c = Command::new("sh");
        c.arg("-c")
            .arg(format!("echo $$ > {}/cgroup.procs && exec \"$@\"", self.dir.display()))
            .arg("sh")
            .arg(cmd.get_program())
            .args(cmd.get_args());
        if let Some(d) = cmd.get_current_dir() {
            c.current_dir(d);
        }
        c
    }
}

impl MemCgroup {
    fn undo(&self) -> Undo {
        Undo::Command { program: "rmdir".into(), args: vec![self.dir.display().to_string()] }
    }
}

impl Drop for MemCgroup {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir(&self.dir);
        forget(&self.undo());
    }
}

impl Bench {
    pub fn new(opts: Options) -> Result<Bench> {
        let (work, tmp) = match &opts.keep {
            Some(dir) => {
                std::fs::create_dir_all(dir)?;
                (dir.clone(), None)
            }
            None => {
                let t = tempfile::Builder::new().prefix("stics-bench.").tempdir()?;
                live().scratch.push(t.path().to_owned());
                (t.path().to_owned(), Some(t))
            }
        };
        let bars = MultiProgress::new();
        if !opts.progress {
            bars.set_draw_target(ProgressDrawTarget::hidden());
        }
        let memcg = opts.host_memory.map(MemCgroup::new).transpose()?;
        Ok(Bench { opts, work, _tmp: tmp, commands: Mutex::new(Vec::new()), bars, memcg })
    }

    /// The host's memory bound, if any (see [`Options::host_memory`]).
    pub fn host_memory(&self) -> Option<u64> {
        self.opts.host_memory
    }

    /// The device spec of a remote LUN whose medium is the file `path`: the file itself, or the
    /// file behind the disk model asked for.
    pub fn remote_medium(&self, path: &Path) -> String {
        match self.opts.remote_disk {
            Some(model) => format!("disk(file:{}, model={model})", path.display()),
            None => format!("file:{}", path.display()),
        }
    }

    /// The options the benchmarks' ext4 is mounted with (on a loop device over the export).
    pub fn ext4_options(&self) -> &'static str {
        if self.opts.ext4_default {
            "loop"
        } else {
            "loop,sync"
        }
    }

    /// Whether the loop device under the host's ext4 is put on direct I/O.
    pub fn loop_direct_io(&self) -> bool {
        self.opts.loop_direct_io
    }

    /// How captions name that mount.
    pub fn ext4_text(&self) -> &'static str {
        if self.opts.ext4_default {
            "ext4 with its default mount"
        } else {
            "ext4 -o sync"
        }
    }

    /// The disk model under gateways' logs, if any.
    pub fn log_disk(&self) -> Option<stics_disk::Preset> {
        self.opts.log_disk
    }

    /// The read cache policy every gateway is started with, if not its default.
    pub fn read_cache_policy(&self) -> Option<&str> {
        self.opts.read_cache_policy.as_deref()
    }

    /// The disk model under remote LUNs, if any.
    pub fn remote_disk(&self) -> Option<stics_disk::Preset> {
        self.opts.remote_disk
    }

    /// `cmd` as the host runs it: in the memory cgroup that bounds the host, when there is one.
    pub fn host(&self, cmd: Command) -> Command {
        match &self.memcg {
            Some(cg) => cg.wrap(&cmd),
            None => cmd,
        }
    }

    pub fn quick(&self) -> bool {
        self.opts.quick
    }

    /// Repetitions asked for (at least one).
    pub fn reps(&self) -> usize {
        self.opts.reps.max(1)
    }

    pub fn stics(&self) -> &Path {
        &self.opts.stics
    }

    /// A `Command` for the `stics` binary.
    pub fn stics_cmd(&self) -> Command {
        Command::new(&self.opts.stics)
    }

    /// Scratch space for this run (removed at the end unless kept).
    pub fn work(&self) -> &Path {
        &self.work
    }

    /// Fails with the Debian package to install when one of `tools` is not on the PATH.
    pub fn need(&self, tools: &[&str]) -> Result<()> {
        for t in tools {
            if which(t).is_none() {
                return Err(Error::Missing { tool: (*t).to_owned(), package: package_of(t).to_owned() });
            }
        }
        Ok(())
    }

    /// The commands run so far, one shell-quoted line each.
    pub fn commands(&self) -> Vec<String> {
        self.commands.lock().map(|c| c.clone()).unwrap_or_default()
    }

    /// Notes `cmd` in the list of commands run.
    pub fn record(&self, cmd: &Command) {
        let line = std::iter::once(cmd.get_program())
            .chain(cmd.get_args())
            .map(|a| shell_quote(&a.to_string_lossy()))
            .collect::<Vec<_>>()
            .join(" ");
        if let Ok(mut c) = self.commands.lock() {
            c.push(line);
        }
    }

    /// Runs `cmd` to its end and returns what it printed, with the CPU time it used; a non-zero
    /// exit is an error carrying the end of its stderr.
    pub fn run(&self, cmd: &mut Command) -> Result<Output> {
        self.record(cmd);
        let cpu0 = children_cpu();
        let t0 = Instant::now();
        let child = {
            let _live = live();
            cmd.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn()
        };
        let out = child.and_then(Child::wait_with_output).map_err(|e| spawn_error(cmd, &e))?;
        let secs = t0.elapsed().as_secs_f64();
        let cpu = children_cpu() - cpu0;
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        if !out.status.success() {
            return Err(Error::Command {
                command: program(cmd),
                status: out.status.to_string(),
                stderr: tail(&stderr),
            });
        }
        Ok(Output { stdout, stderr, secs, cpu_secs: cpu })
    }

    /// Starts `cmd` in the background with its output in `NAME.log` in the scratch folder; the
    /// process is killed when the returned guard drops.
    pub fn spawn(&self, name: &str, cmd: &mut Command) -> Result<Proc> {
        self.record(cmd);
        let log = self.work.join(format!("{name}.log"));
        let f = std::fs::File::create(&log)?;
        let child = {
            let _live = live();
            cmd.stdin(Stdio::null()).stdout(f.try_clone()?).stderr(f).spawn().map_err(|e| spawn_error(cmd, &e))?
        };
        Ok(Proc { guard: Guard::new(child), name: name.to_owned(), log })
    }

    /// A progress bar of `len` steps for `what`, drawn only on a terminal.
    pub fn bar(&self, len: u64, what: &str) -> ProgressBar {
        let bar = self.bars.add(ProgressBar::new(len));
        bar.set_style(
            ProgressStyle::with_template("{spinner} {msg:32} [{bar:30}] {pos}/{len} {elapsed}")
                .unwrap_or_else(|_| ProgressStyle::default_bar())
                .progress_chars("=> "),
        );
        bar.set_message(what.to_owned());
        bar
    }

    /// Prints a line above the progress bars (on stderr).
    pub fn say(&self, line: &str) {
        if self.opts.progress {
            let _ = self.bars.println(line);
        } else {
            eprintln!("{line}");
        }
    }
}

/// What a finished command printed, how long it ran and the CPU it used (user + system).
#[derive(Debug, Clone)]
pub struct Output {
    pub stdout: String,
    pub stderr: String,
    pub secs: f64,
    pub cpu_secs: f64,
}

/// A background process with its name and log, killed (SIGKILL, by PID) and reaped when dropped;
/// its [`Guard`]'s methods (`pid`, `signal`, `stop`, `kill`, `cpu_secs`) are its own.
#[derive(Debug)]
pub struct Proc {
    guard: Guard,
    name: String,
    log: PathBuf,
}

impl Proc {
    pub fn log(&self) -> &Path {
        &self.log
    }

    /// Fails with the end of its log if it has exited.
    pub fn check(&mut self) -> Result<()> {
        if let Some(st) = self.guard.exited() {
            let log = std::fs::read_to_string(&self.log).unwrap_or_default();
            return Err(Error::Command { command: self.name.clone(), status: st.to_string(), stderr: tail(&log) });
        }
        Ok(())
    }

    /// Waits until `ready` holds (checked every 20 ms), failing if the process exits first or
    /// `limit` passes.
    pub fn wait_until(&mut self, limit: Duration, mut ready: impl FnMut() -> bool) -> Result<()> {
        let mut exited = Ok(());
        let done = stics_procs::wait_for(limit, || {
            ready() || {
                exited = self.check();
                exited.is_err()
            }
        });
        exited?;
        if done {
            return Ok(());
        }
        Err(Error::NotReady { what: self.name.clone(), secs: limit.as_secs(), log: self.log.display().to_string() })
    }
}

impl std::ops::Deref for Proc {
    type Target = Guard;

    fn deref(&self) -> &Guard {
        &self.guard
    }
}

impl std::ops::DerefMut for Proc {
    fn deref_mut(&mut self) -> &mut Guard {
        &mut self.guard
    }
}

/// What an interrupted run has to undo that dropping its guards would have undone: mounts, WAN
/// instances and clean-up commands (processes need no list: every child of this process is one
/// the run started; daemons that left it, such as a throwaway Ceph cluster's, have their command).
#[derive(Debug, Default)]
struct Live {
    /// Mount points, unmounted (lazily) last first.
    mounts: Vec<PathBuf>,
    /// `stics wan` instances: the binary and the name.
    wans: Vec<(PathBuf, String)>,
    /// Network namespaces of the run's own.
    netns: Vec<String>,
    /// Scratch folders to remove.
    scratch: Vec<PathBuf>,
    /// Clean-up commands (program and arguments), run last first once the children are stopped.
    commands: Vec<(PathBuf, Vec<String>)>,
}

static LIVE: Mutex<Live> = Mutex::new(Live {
    mounts: Vec::new(),
    wans: Vec::new(),
    netns: Vec::new(),
    scratch: Vec::new(),
    commands: Vec::new(),
});

/// The registry, held while a child is started so that the clean-up never misses one: once it has
/// begun it keeps the lock until the process exits, and a run that tries to start more waits.
fn live() -> MutexGuard<'static, Live> {
    LIVE.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Notes a mount point (or a WAN instance, a namespace, a clean-up command) an interrupted run
/// must undo; [`forget`] it again once its guard has undone it.
pub fn remember(what: Undo) {
    let mut l = live();
    match what {
        Undo::Mount(p) => l.mounts.push(p),
        Undo::Wan { stics, name } => l.wans.push((stics, name)),
        Undo::Netns(n) => l.netns.push(n),
        Undo::Command { program, args } => l.commands.push((program, args)),
    }
}

/// Drops an entry [`remember`] made.
pub fn forget(what: &Undo) {
    let mut l = live();
    match what {
        Undo::Mount(p) => l.mounts.retain(|m| m != p),
        Undo::Wan { name, .. } => l.wans.retain(|(_, n)| n != name),
        Undo::Netns(name) => l.netns.retain(|n| n != name),
        Undo::Command { program, args } => {
            if let Some(i) = l.commands.iter().rposition(|(p, a)| p == program && a == args) {
                l.commands.remove(i);
            }
        }
    }
}

/// Something that outlives this process unless undone.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Undo {
    /// A mount point.
    Mount(PathBuf),
    /// A `stics wan` instance (its namespaces and emulator), taken down with `stics wan down`.
    Wan { stics: PathBuf, name: String },
    /// A network namespace, deleted with `ip netns del`.
    Netns(String),
    /// A command that undoes something the run set up outside its children (stops a throwaway
    /// Ceph cluster's daemons, removes an image from a cluster that stays): run after the
    /// children are stopped, last remembered first, before the scratch space is removed.
    Command { program: PathBuf, args: Vec<String> },
}

/// The write end of the pipe the signal handler wakes the clean-up thread through.
static SIGNAL_PIPE: AtomicI32 = AtomicI32::new(-1);

extern "C" fn on_signal(signal: libc::c_int) {
    let fd = SIGNAL_PIPE.load(Ordering::Relaxed);
    let byte = signal as u8;
    // SAFETY: write(2) is async-signal-safe; the buffer is a local byte.
    let _ = unsafe { libc::write(fd, (&raw const byte).cast(), 1) };
}

/// Makes SIGINT, SIGTERM and SIGHUP end the run cleanly: children are stopped (SIGTERM, then
/// SIGKILL after 5 s), file systems unmounted, WAN instances taken down and scratch space removed,
/// then the process exits with 128 + the signal. Called once by the binary; tests do not install it.
pub fn clean_up_on_interrupt() -> Result<()> {
    let mut fds = [0 as libc::c_int; 2];
    // SAFETY: pipe2 fills the two-element array we pass.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(std::io::Error::last_os_error().into());
    }
    SIGNAL_PIPE.store(fds[1], Ordering::Relaxed);
    let read_fd = fds[0];
    std::thread::Builder::new().name("interrupt".into()).spawn(move || {
        let mut byte = 0u8;
        // SAFETY: read(2) into a local byte from the pipe this thread owns.
        while unsafe { libc::read(read_fd, (&raw mut byte).cast(), 1) } != 1 {}
        clean_up(i32::from(byte));
    })?;
    for signal in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
        // SAFETY: a zeroed sigaction with only the handler and SA_RESTART set is valid; on_signal
        // only performs the async-signal-safe write(2).
        unsafe {
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = on_signal as extern "C" fn(libc::c_int) as libc::sighandler_t;
            sa.sa_flags = libc::SA_RESTART;
            libc::sigemptyset(&raw mut sa.sa_mask);
            if libc::sigaction(signal, &raw const sa, std::ptr::null_mut()) != 0 {
                return Err(std::io::Error::last_os_error().into());
            }
        }
    }
    Ok(())
}

fn clean_up(signal: i32) -> ! {
    let l = live();
    eprintln!("stics bench: interrupted (signal {signal}); stopping its processes and cleaning up");
    for m in l.mounts.iter().rev() {
        let _ = Command::new("umount").arg("-l").arg(m).stdin(Stdio::null()).output();
    }
    stop_children(Duration::from_secs(5));
    for (stics, name) in l.wans.iter().rev() {
        let _ = Command::new(stics).args(["wan", "--name", name, "down"]).stdin(Stdio::null()).output();
    }
    for n in &l.netns {
        let _ = Command::new("ip").args(["netns", "del", n]).stdin(Stdio::null()).output();
    }
    for (program, args) in l.commands.iter().rev() {
        let _ = Command::new(program).args(args).stdin(Stdio::null()).output();
    }
    for d in &l.scratch {
        let _ = std::fs::remove_dir_all(d);
    }
    std::process::exit(128 + signal);
}

/// The PIDs of this process's children that have not exited (zombies are left out).
fn children() -> Vec<i32> {
    let me = std::process::id().to_string();
    let Ok(dir) = std::fs::read_dir("/proc") else { return Vec::new() };
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
                let rest = stat.rfind(')').map_or("", |i| &stat[i + 1..]);
                let mut f = rest.split_whitespace();
                let state = f.next();
                f.next() == Some(me.as_str()) && state != Some("Z")
            })
        })
        .collect()
}

/// SIGTERM to every child, SIGKILL to those still running after `grace`. A PID whose parent is
/// this process is one this run started, so nothing else is signalled (a guard of the run may reap
/// a child between the scan and the signal, but its PID cannot come round again that fast).
fn stop_children(grace: Duration) {
    let kill = |sig| {
        for pid in children() {
            // SAFETY: kill(2) on a child of ours that has not been reaped.
            unsafe { libc::kill(pid, sig) };
        }
    };
    kill(libc::SIGTERM);
    let deadline = Instant::now() + grace;
    while !children().is_empty() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    kill(libc::SIGKILL);
}

/// The full path of `tool` on the PATH.
pub fn which(tool: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path).map(|d| d.join(tool)).find(|p| p.is_file())
}

/// The Debian package that installs `tool`.
pub fn package_of(tool: &str) -> &str {
    match tool {
        t if t.starts_with("iscsi-") => "libiscsi-bin",
        "tgtd" | "tgtadm" => "tgt",
        "qemu-img" | "qemu-io" => "qemu-utils qemu-block-extra",
        "qemu-storage-daemon" => "qemu-system-common qemu-block-extra",
        "mkfs.ext4" | "e2fsck" => "e2fsprogs",
        "nsenter" | "losetup" | "mount" => "util-linux",
        "ip" => "iproute2",
        "rbd" | "ceph" => "ceph-common",
        t => t,
    }
}

fn shell_quote(s: &str) -> String {
    if !s.is_empty() && s.chars().all(|c| c.is_ascii_alphanumeric() || "-_./:=@,%+".contains(c)) {
        s.to_owned()
    } else {
        format!("'{}'", s.replace('\'', r"'\''"))
    }
}

fn program(cmd: &Command) -> String {
    std::iter::once(cmd.get_program())
        .chain(cmd.get_args())
        .map(|a| a.to_string_lossy().into_owned())
        .collect::<Vec<_>>()
        .join(" ")
}

fn spawn_error(cmd: &Command, e: &std::io::Error) -> Error {
    let tool = cmd.get_program().to_string_lossy().into_owned();
    if e.kind() == std::io::ErrorKind::NotFound {
        let package = package_of(&tool).to_owned();
        return Error::Missing { tool, package };
    }
    Error::Command { command: program(cmd), status: "not started".into(), stderr: e.to_string() }
}

/// The last lines of a log, for an error message.
pub fn tail(text: &str) -> String {
    let lines: Vec<&str> = text.trim_end().lines().collect();
    lines[lines.len().saturating_sub(6)..].join("\n")
}

/// CPU seconds (user + system) of the children this process has reaped.
fn children_cpu() -> f64 {
    // SAFETY: getrusage fills the zeroed struct we pass; RUSAGE_CHILDREN reads no other memory.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    if unsafe { libc::getrusage(libc::RUSAGE_CHILDREN, &raw mut ru) } != 0 {
        return f64::NAN;
    }
    let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    tv(ru.ru_utime) + tv(ru.ru_stime)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commands_are_recorded_quoted_and_failures_carry_stderr() {
        let b = Bench::new(Options { stics: "stics".into(), quick: true, reps: 1, ..Options::default() }).unwrap();
        let out = b.run(Command::new("sh").args(["-c", "echo hi"])).unwrap();
        assert_eq!(out.stdout, "hi\n");
        let e = b.run(Command::new("sh").args(["-c", "echo broken >&2; exit 3"])).unwrap_err().to_string();
        assert!(e.contains("broken") && e.contains('3'), "{e}");
        assert_eq!(b.commands()[0], "sh -c 'echo hi'");
        let e = b.run(&mut Command::new("no-such-tool-here")).unwrap_err();
        assert!(matches!(e, Error::Missing { .. }), "{e}");
    }

    #[test]
    fn host_commands_run_in_a_memory_cgroup_bounded_as_asked_and_removed_after() {
        let o =
            Options { stics: "stics".into(), quick: true, reps: 1, host_memory: Some(64 << 20), ..Options::default() };
        let b = Bench::new(o).unwrap();
        let dir = b.memcg.as_ref().unwrap().dir.clone();
        let limit = std::fs::read_to_string(dir.join("memory.limit_in_bytes")).unwrap();
        assert_eq!(limit.trim(), (64u64 << 20).to_string());
        let mut cat = Command::new("cat");
        cat.arg("/proc/self/cgroup");
        let out = b.run(&mut b.host(cat)).unwrap();
        let name = dir.file_name().unwrap().to_str().unwrap();
        assert!(out.stdout.lines().any(|l| l.contains(":memory:") && l.ends_with(name)), "{}", out.stdout);
        drop(b);
        assert!(!dir.exists(), "the cgroup is removed with the run");
    }

    #[test]
    fn a_remote_disk_puts_the_model_under_the_file() {
        let mut o = Options { stics: "stics".into(), quick: true, reps: 1, ..Options::default() };
        let plain = Bench::new(o.clone()).unwrap();
        assert_eq!(plain.remote_medium(Path::new("/x/lun.img")), "file:/x/lun.img");
        o.remote_disk = Some("O7N3200".parse().unwrap());
        let disk = Bench::new(o).unwrap();
        assert_eq!(disk.remote_medium(Path::new("/x/lun.img")), "disk(file:/x/lun.img, model=o7n3200)");
    }

    #[test]
    fn a_spawned_process_is_watched_and_killed_on_drop() {
        let b = Bench::new(Options { stics: "stics".into(), quick: true, reps: 1, ..Options::default() }).unwrap();
        let mut p = b.spawn("sleeper", Command::new("sleep").arg("30")).unwrap();
        let pid = p.pid();
        assert!(p.check().is_ok());
        assert!(p.cpu_secs().is_some());
        drop(p);
        assert!(std::fs::read_to_string(format!("/proc/{pid}/stat")).map_or(true, |s| s.contains(") Z")));
        let mut p = b.spawn("quitter", Command::new("sh").args(["-c", "echo bye; exit 1"])).unwrap();
        let e = p.wait_until(Duration::from_secs(5), || false).unwrap_err().to_string();
        assert!(e.contains("bye"), "{e}");
    }
}
