//! What the gateway's process tests share: starting `stics gateway` in front of a remote, its
//! HTTP status, a client on a runtime of its own, the SIGKILL campaign against a ledger, and
//! `stics mount` exports with ext4 on them.

#![allow(dead_code, reason = "each test file uses its own part")]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use stics_initiator::{IscsiUrl, Lun, LunOptions};
use stics_testkit::ledger::{Durable, Failure, Ledger, Pace};
use stics_testkit::net::free_port;
use stics_testkit::proc::{run_ok, spawn, spawn_stics, wait_mounted, wait_port, Guard};

pub const BIN: &str = env!("CARGO_BIN_EXE_stics");
pub const GATEWAY_IQN: &str = "iqn.2024-01.org.stics.test:gateway";

/// Runs libiscsi's whole suite (`iscsi-test-cu -d --test=ALL`) against each `(what, url)`, the
/// runs side by side (the suite waits on round trips far more than it computes), and checks
/// that every test of each run ran and that none failed.
pub fn iscsi_test_cu_all(runs: &[(&str, String)]) {
    let results: Vec<_> = std::thread::scope(|s| {
        let runs: Vec<_> = runs
            .iter()
            .map(|(what, url)| {
                s.spawn(move || {
                    let out =
                        Command::new("iscsi-test-cu").args(["-d", "--test=ALL", url]).output().expect("iscsi-test-cu");
                    (what, stics_bench::cu::count(&String::from_utf8_lossy(&[out.stdout, out.stderr].concat())))
                })
            })
            .collect();
        runs.into_iter().map(|r| r.join().expect("a run of the suite panicked")).collect()
    });
    for (what, counts) in results {
        assert_eq!(counts.tests, 230, "{what}: every test ran: {counts:?}");
        assert_eq!(counts.failed, Vec::<String>::new(), "{what}: no failures: {counts:?}");
    }
}

/// A gateway process on a free port, in front of `remote`, with its log at `log`.
pub fn gateway(remote: &str, log: &Path, mode: &str, stderr: &Path) -> (Guard, u16) {
    gateway_with(remote, log, mode, stderr, &[])
}

/// [`gateway`] with `extra` arguments (`--metrics`, ...).
pub fn gateway_with(remote: &str, log: &Path, mode: &str, stderr: &Path, extra: &[&str]) -> (Guard, u16) {
    let port = free_port();
    let mut cmd = Command::new(BIN);
    cmd.args(["gateway", "--listen", &format!("127.0.0.1:{port}"), "--iqn", GATEWAY_IQN, "--remote", remote])
        .args(["--log", &format!("{}:256MiB", log.display()), "--mode", mode, "--ram", "8MiB"])
        .args(extra);
    let mut g = spawn(&mut cmd, Some(stderr));
    assert!(
        g.wait_port(port, Duration::from_secs(20)),
        "the gateway did not listen: {}",
        std::fs::read_to_string(stderr).unwrap_or_default()
    );
    (g, port)
}

/// A gateway with its status endpoint: (process, iSCSI port, metrics port).
pub fn gateway_with_metrics(remote: &str, log: &Path, mode: &str, stderr: &Path) -> (Guard, u16, u16) {
    gateway_with_metrics_and(remote, log, mode, stderr, &[])
}

/// [`gateway_with_metrics`] with `extra` arguments (`--max-lag`, ...).
pub fn gateway_with_metrics_and(
    remote: &str,
    log: &Path,
    mode: &str,
    stderr: &Path,
    extra: &[&str],
) -> (Guard, u16, u16) {
    let metrics = free_port();
    let m = format!("127.0.0.1:{metrics}");
    let args: Vec<&str> = extra.iter().copied().chain(["--metrics", m.as_str()]).collect();
    let (g, port) = gateway_with(remote, log, mode, stderr, &args);
    assert!(wait_port(metrics, Duration::from_secs(20)), "no metrics endpoint; see {}", stderr.display());
    (g, port, metrics)
}

/// A gateway that must refuse to start (in front of `remote`, with its log at `log`): fails
/// unless it exits unsuccessfully within 20 s; what it said on stderr.
pub fn refused_gateway(remote: &str, log: &Path, stderr: &Path) -> String {
    refused_gateway_with(remote, log, stderr, &[])
}

/// [`refused_gateway`] with `extra` arguments.
pub fn refused_gateway_with(remote: &str, log: &Path, stderr: &Path, extra: &[&str]) -> String {
    let mut cmd = Command::new(BIN);
    cmd.args(["gateway", "--listen", &format!("127.0.0.1:{}", free_port()), "--iqn", GATEWAY_IQN]).args([
        "--remote",
        remote,
        "--log",
        &format!("{}:256MiB", log.display()),
        "--ram",
        "8MiB",
    ]);
    cmd.args(extra);
    let mut g = spawn(&mut cmd, Some(stderr));
    let exited = g.wait_exit(Duration::from_secs(20));
    let said = std::fs::read_to_string(stderr).unwrap_or_default();
    assert!(exited.is_some_and(|s| !s.success()), "the gateway was not refused ({exited:?}): {said}");
    said
}

/// One HTTP/1.0 request (`"GET /status"`) to the gateway's metrics port; the body of its 200
/// answer.
pub fn http(port: u16, request: &str) -> String {
    let answer = http_answer(port, request);
    assert!(answer.starts_with("HTTP/1.0 200"), "{request}: {answer}");
    answer.split_once("\r\n\r\n").map(|(_, body)| body.to_owned()).unwrap_or_default()
}

/// The whole HTTP answer to `request`, whatever its status.
pub fn http_answer(port: u16, request: &str) -> String {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).expect("metrics endpoint");
    s.set_read_timeout(Some(Duration::from_secs(300))).unwrap();
    s.write_all(format!("{request} HTTP/1.0\r\n\r\n").as_bytes()).unwrap();
    let mut answer = String::new();
    s.read_to_string(&mut answer).unwrap_or_else(|e| panic!("{request}: {e}"));
    answer
}

/// The gateway's `stics_cache::Status` as JSON.
pub fn status(port: u16) -> serde_json::Value {
    serde_json::from_str(&http(port, "GET /status")).expect("status JSON")
}

/// Polls /status until no byte is dirty; how long that took. Fails after `limit`.
pub fn wait_clean(port: u16, limit: Duration) -> Duration {
    let started = Instant::now();
    loop {
        let s = status(port);
        if s["dirty_bytes"] == 0 {
            return started.elapsed();
        }
        assert!(started.elapsed() < limit, "still dirty after {limit:?}: {s}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// [`wait_clean`] for a gateway whose metrics listen on loopback inside the namespace `ns`.
pub fn wait_clean_in(ns: &str, port: u16, limit: Duration) -> Duration {
    stics_testkit::netns::run_in(ns, move || wait_clean(port, limit))
}

pub fn url(port: u16) -> String {
    format!("iscsi://127.0.0.1:{port}/{GATEWAY_IQN}/0")
}

/// The gateway's LUN through the initiator, with the runtime its sessions run on.
pub fn open(port: u16) -> (tokio::runtime::Runtime, Lun) {
    open_url(&url(port))
}

/// Any LUN through the initiator, with a runtime of two workers for its sessions.
pub fn open_url(u: &str) -> (tokio::runtime::Runtime, Lun) {
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let u = IscsiUrl::parse(u).unwrap();
    let lun = rt.block_on(Lun::open(&u, &LunOptions::default())).unwrap_or_else(|e| panic!("open {u:?}: {e}"));
    (rt, lun)
}

/// [`sigkill_rounds`] with gateways in front of `remote`, their log and stderr in `dir`.
pub fn sigkill_rounds_on(remote: &str, dir: &Path, mode: &str, seed: u64, rounds: u32) {
    const BLOCKS: u64 = 512;
    let log = dir.join("log");
    let mut rng = StdRng::seed_from_u64(seed);
    let mut ledger = Ledger::new(BLOCKS, 512, Durable::of_mode(mode, false));
    let started = Instant::now();
    for round in 0..rounds {
        let stderr = dir.join("gw.log");
        let (mut gw, port) = gateway(remote, &log, mode, &stderr);
        let (rt, lun) = open(port);
        rt.block_on(ledger.verify(&lun, &format!("{mode} seed {seed} round {round}")));
        let kill_after = Duration::from_millis(rng.gen_range(20..300));
        let t = Instant::now();
        rt.block_on(ledger.run(&lun, &mut rng, Pace::FAST, || t.elapsed() >= kill_after));
        gw.kill();
        drop(lun);
        drop(rt);
    }
    let (_gw, port) = gateway(remote, &log, mode, &dir.join("last.log"));
    let (rt, lun) = open(port);
    rt.block_on(ledger.verify(&lun, &format!("{mode} seed {seed} after the last round")));
    eprintln!(
        "{mode}: {rounds} SIGKILLs in {:?}, {} writes acknowledged, {} flushes acknowledged",
        started.elapsed(),
        ledger.acked().load(Ordering::Relaxed),
        ledger.flushes()
    );
}

/// A client writing through the gateway at `port` on a thread of its own until `stop` is set:
/// the ledger and the error that stopped it, if one did.
pub fn writer(
    port: u16,
    mut ledger: Ledger,
    seed: u64,
    pace: Pace,
    stop: Arc<AtomicBool>,
) -> std::thread::JoinHandle<(Ledger, Option<Failure>)> {
    std::thread::spawn(move || {
        let (rt, lun) = open(port);
        let mut rng = StdRng::seed_from_u64(seed);
        let err = rt.block_on(ledger.run(&lun, &mut rng, pace, || stop.load(Ordering::Relaxed)));
        (ledger, err)
    })
}

pub fn sleep_ms(rng: &mut StdRng, range: std::ops::Range<u64>) {
    std::thread::sleep(Duration::from_millis(rng.gen_range(range)));
}

/// `stics mount` of a LUN at `dir/NAME`, with ext4 on it loop-mounted at `dir/NAME.fs` when asked;
/// on drop both are unmounted (lazily: the LUN may be gone) and the export killed.
pub struct Export {
    proc: Guard,
    pub file: PathBuf,
    pub fs: PathBuf,
    fs_mounted: bool,
    /// Its stderr.
    log: PathBuf,
}

impl Export {
    pub fn start(lun: &str, dir: &Path, name: &str) -> Export {
        let file = dir.join(name);
        let fs = dir.join(format!("{name}.fs"));
        std::fs::File::create(&file).unwrap();
        std::fs::create_dir(&fs).unwrap();
        let args = ["mount", lun, file.to_str().unwrap()];
        let log = dir.join(format!("{name}.log"));
        let proc = spawn_stics(Path::new(BIN), &args, &[("RUST_LOG", "info")], Some(&log));
        assert!(wait_mounted(&file, true, Duration::from_secs(20)), "stics mount did not mount {lun}");
        Export { proc, file, fs, fs_mounted: false, log }
    }

    pub fn mkfs(&self) {
        // Inode tables and journal written now, not by a background thread while the test runs.
        let lazy = "lazy_itable_init=0,lazy_journal_init=0";
        run_ok(Command::new("mkfs.ext4").args(["-F", "-q", "-E", lazy]).arg(&self.file));
    }

    /// Loop-mounts the ext4 on the LUN with `options` besides `loop`.
    pub fn mount_fs(&mut self, options: &str) {
        let options = format!("loop{options}");
        run_ok(Command::new("mount").args(["-o", &options]).arg(&self.file).arg(&self.fs));
        self.fs_mounted = true;
    }

    /// Writes everything back while mounted, then unmounts.
    pub fn umount_fs(&mut self) {
        run_ok(Command::new("sync").arg("-f").arg(&self.fs));
        run_ok(Command::new("umount").arg(&self.fs));
        self.fs_mounted = false;
        // The loop device lets go of the export's file only when the file system is gone, and
        // its last opener (udev's probe, say) has closed it; until then stopping the export would
        // only detach it lazily, and e2fsck would read a file system still in use.
        if let Err(e) = stics_bench::exp::fs::released(&self.file, Duration::from_secs(30)) {
            panic!("{e}");
        }
    }

    /// `e2fsck -fn` of the unmounted file system must find nothing.
    pub fn fsck_clean(&self, what: &str) {
        let out = Command::new("e2fsck").arg("-fn").arg(&self.file).output().unwrap();
        assert!(
            out.status.success(),
            "{what}: e2fsck -fn exits {}: {}{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// SIGTERM: the export stops and unmounts.
    pub fn stop(&mut self) {
        assert!(self.proc.signal(libc::SIGTERM));
        if self.proc.wait_exit(Duration::from_secs(20)).is_none() {
            let loops = Command::new("losetup").arg("-a").output().map(|o| o.stdout).unwrap_or_default();
            panic!(
                "stics mount did not stop within 20 s of SIGTERM; it said:\n{}\nloop devices:\n{}",
                std::fs::read_to_string(&self.log).unwrap_or_default(),
                String::from_utf8_lossy(&loops)
            );
        }
        assert!(wait_mounted(&self.file, false, Duration::from_secs(5)));
    }
}

impl Drop for Export {
    fn drop(&mut self) {
        // The export goes first: unmounting ext4 writes to the LUN, and with the LUN gone each of
        // those writes would wait out the export's recovery timeout.
        let export = self.proc.pid() != 0;
        self.proc.kill();
        if self.fs_mounted {
            let _ = Command::new("umount").arg("-l").arg(&self.fs).status();
        }
        if export {
            let _ = Command::new("umount").arg("-l").arg(&self.file).status();
        }
    }
}

/// The contents of file `i` of the disaster test.
pub fn file_data(i: u64) -> bytes::Bytes {
    stics_testkit::pattern::noise(i, 1000 + (i as usize * 7919) % 60_000)
}

/// Where file `i` of the disaster test lives under the file system at `fs`.
fn file_path(fs: &Path, i: u64) -> PathBuf {
    fs.join(format!("d{}/f{i}", i % 10))
}

/// Files `files` of the disaster test, written under `fs` (the first batch also makes their
/// directories).
pub fn write_files(fs: &Path, files: std::ops::Range<u64>) {
    if files.start == 0 {
        for d in 0..10 {
            std::fs::create_dir(fs.join(format!("d{d}"))).unwrap();
        }
    }
    for i in files {
        std::fs::write(file_path(fs, i), file_data(i)).unwrap();
    }
}

/// The disaster test's start: ext4 made on the gateway's LUN at `port` (exported as `dir/gw`)
/// and mounted, the first batch of files written, synced and destaged, which the survivor must
/// hold whole.
pub fn first_batch_destaged(port: u16, metrics: u16, dir: &Path) -> Export {
    let mut e = Export::start(&url(port), dir, "gw");
    e.mkfs();
    e.mount_fs("");
    write_files(&e.fs, 0..300);
    run_ok(Command::new("sync").arg("-f").arg(&e.fs));
    wait_clean(metrics, Duration::from_secs(120));
    e
}

/// The disaster test's survivor: the ext4 on `lun`, mounted (as `dir/NAME`) from what `what`
/// left, must hold the destaged batch whole ([`files_left`]) and fsck clean.
pub fn survivor_files(lun: &str, dir: &Path, name: &str, what: &str) -> FilesLeft {
    let mut r = Export::start(lun, dir, name);
    r.mount_fs("");
    let left = files_left(&r.fs);
    eprintln!("{what}: {left}");
    r.umount_fs();
    r.fsck_clean(what);
    r.stop();
    left
}

/// How the disaster test's 610 files came through.
#[derive(Debug, Clone, Copy, Default)]
pub struct FilesLeft {
    /// Holding what was written to them.
    pub whole: u32,
    /// Empty, or not there at all.
    pub empty: u32,
    /// Of some length, with zeros in some of its blocks (or all) and its data in the others.
    pub unconverted: u32,
}

impl std::fmt::Display for FilesLeft {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} whole, {} empty or missing, {} with zeros not yet converted",
            self.whole, self.empty, self.unconverted
        )
    }
}

/// The smallest block ext4 allocates: the unit in which a file's data is there or not.
const FS_BLOCK: usize = 1024;

/// The disaster test's 610 files as the file system at `fs` holds them after the disaster. The
/// first 300, destaged before it, are all whole; each of the others holds what was written to
/// it, or nothing, or block by block either its data or zeros, and never anything else.
///
/// ext4 orders data before the metadata that makes it reachable, but with `dioread_nolock` (its
/// default since Linux 5.6) it allocates a file's delayed blocks as unwritten extents in one
/// transaction and marks them written in a later one, once their data is on the device. A crash
/// between the two leaves the file at its size with those blocks reading as zeros.
fn files_left(fs: &Path) -> FilesLeft {
    let mut left = FilesLeft::default();
    for i in 0..610 {
        match std::fs::read(file_path(fs, i)) {
            Ok(d) if d == file_data(i) => left.whole += 1,
            Ok(d) if i < 300 => panic!("file {i} of the destaged batch is not whole: {} bytes", d.len()),
            Ok(d) if d.is_empty() => left.empty += 1,
            Ok(d) => {
                let want = file_data(i);
                assert!(
                    d.len() <= want.len(),
                    "file {i} holds {} bytes, longer than the {} written",
                    d.len(),
                    want.len()
                );
                for (n, got) in d.chunks(FS_BLOCK).enumerate() {
                    let at = n * FS_BLOCK;
                    assert!(
                        got == &want[at..at + got.len()] || got.iter().all(|&b| b == 0),
                        "file {i} ({} of {} bytes) holds something else at byte {at}: neither its data nor zeros",
                        d.len(),
                        want.len()
                    );
                }
                left.unconverted += 1;
            }
            Err(e) if i >= 300 && e.kind() == std::io::ErrorKind::NotFound => left.empty += 1,
            Err(e) => panic!("file {i} of the destaged batch: {e}"),
        }
    }
    left
}

/// Polls a gateway's `/status` until `ready` holds of it; fails after `limit`.
pub fn wait_status(metrics: u16, limit: Duration, what: &str, ready: impl Fn(&serde_json::Value) -> bool) {
    let started = Instant::now();
    loop {
        let s = status(metrics);
        if ready(&s) {
            return;
        }
        assert!(started.elapsed() < limit, "{what}: not after {limit:?}: {s}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// `stics gateway --config FILE` on a free port (the file's `listen` overridden), plus `extra`
/// arguments: the process and its iSCSI port. Each cached LUN's new log is written out before
/// the gateway listens, hence the longer wait.
pub fn gateway_config(config: &Path, stderr: &Path, extra: &[&str]) -> (Guard, u16) {
    let port = free_port();
    let mut cmd = Command::new(BIN);
    cmd.args(["gateway", "--listen", &format!("127.0.0.1:{port}"), "--config"]).arg(config).args(extra);
    let mut g = spawn(&mut cmd, Some(stderr));
    assert!(
        g.wait_port(port, Duration::from_secs(60)),
        "the gateway did not listen: {}",
        std::fs::read_to_string(stderr).unwrap_or_default()
    );
    (g, port)
}

/// The body of `GET /metrics` at `port`, checked by `promtool check metrics` (Debian's
/// prometheus package): fails on any problem it reports.
pub fn scrape_checked(port: u16) -> String {
    use std::io::Write;
    let text = http(port, "GET /metrics");
    let mut child = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("promtool (Debian package prometheus)");
    child.stdin.take().expect("promtool's stdin").write_all(text.as_bytes()).expect("feed promtool");
    let out = child.wait_with_output().expect("promtool");
    let said = String::from_utf8_lossy(&[out.stdout, out.stderr].concat()).into_owned();
    assert!(out.status.success() && said.trim().is_empty(), "promtool check metrics: {said}\n{text}");
    text
}
