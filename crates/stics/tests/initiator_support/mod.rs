//! Shared pieces of the initiator's process-level tests: a tgtd peer on a random loopback port
//! with a file LUN, a loopback TCP proxy that can cut connections, and a process guard.

#![allow(dead_code)]

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use stics_block::BlockDev;
use stics_initiator::{IscsiUrl, Lun, LunOptions, RecoveryPolicy};

pub const IQN: &str = "iqn.2024-01.org.stics.test:disk";

/// A free loopback TCP port.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// Kills a child with SIGKILL when dropped (tests also clean up on failure).
pub struct Guard(pub Option<Child>);

impl Guard {
    pub fn pid(&self) -> u32 {
        self.0.as_ref().map(|c| c.id()).unwrap_or(0)
    }

    pub fn kill(&mut self) {
        if let Some(mut c) = self.0.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        self.kill();
    }
}

/// CHAP accounts and target parameters to set up on the tgt target.
#[derive(Clone, Default)]
pub struct TgtChap {
    pub incoming: Option<(String, String)>,
    pub outgoing: Option<(String, String)>,
    /// `tgtadm --op update --mode target --name N --value V` pairs (e.g. HeaderDigest=CRC32C).
    pub params: Vec<(String, String)>,
}

/// A tgtd with one target and one file-backed LUN (LUN 1).
pub struct Tgt {
    pub port: u16,
    pub control: u16,
    pub dir: tempfile::TempDir,
    pub file: PathBuf,
    chap: TgtChap,
    proc: Guard,
}

fn tgtadm(control: u16, args: &[&str]) -> std::io::Result<std::process::Output> {
    Command::new("tgtadm").arg("-C").arg(control.to_string()).args(["--lld", "iscsi"]).args(args).output()
}

impl Tgt {
    pub fn start(size_mib: u64) -> Tgt {
        Tgt::start_with(size_mib, TgtChap::default())
    }

    pub fn start_with(size_mib: u64, chap: TgtChap) -> Tgt {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("lun.img");
        std::fs::File::create(&file).unwrap().set_len(size_mib << 20).unwrap();
        let port = free_port();
        // A control socket index of our own, so that parallel tests never talk to each other's tgtd.
        let control = 10000 + (port % 20000);
        let mut t = Tgt { port, control, dir, file, chap, proc: Guard(None) };
        t.spawn();
        t
    }

    fn spawn(&mut self) {
        let child = Command::new("tgtd")
            .args(["-f", "-C", &self.control.to_string(), "--iscsi", &format!("portal=127.0.0.1:{}", self.port)])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("tgtd (Debian package tgt) must be installed");
        self.proc = Guard(Some(child));
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let out = tgtadm(self.control, &["--op", "new", "--mode", "target", "--tid", "1", "-T", IQN]).unwrap();
            if out.status.success() {
                break;
            }
            assert!(Instant::now() < deadline, "tgtd did not come up: {}", String::from_utf8_lossy(&out.stderr));
            std::thread::sleep(Duration::from_millis(50));
        }
        let file = self.file.to_str().unwrap().to_owned();
        let run = |args: &[&str]| {
            let out = tgtadm(self.control, args).unwrap();
            assert!(out.status.success(), "tgtadm {args:?}: {}", String::from_utf8_lossy(&out.stderr));
        };
        run(&["--op", "new", "--mode", "logicalunit", "--tid", "1", "--lun", "1", "-b", &file]);
        run(&["--op", "bind", "--mode", "target", "--tid", "1", "-I", "ALL"]);
        for (n, v) in &self.chap.params {
            run(&["--op", "update", "--mode", "target", "--tid", "1", "--name", n, "--value", v]);
        }
        if let Some((u, p)) = &self.chap.incoming {
            run(&["--op", "new", "--mode", "account", "--user", u, "--password", p]);
            run(&["--op", "bind", "--mode", "account", "--tid", "1", "--user", u]);
        }
        if let Some((u, p)) = &self.chap.outgoing {
            run(&["--op", "new", "--mode", "account", "--user", u, "--password", p]);
            run(&["--op", "bind", "--mode", "account", "--tid", "1", "--user", u, "--outgoing"]);
        }
        // The portal listens once the target exists; wait until it accepts.
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect(("127.0.0.1", self.port)).is_err() {
            assert!(Instant::now() < deadline, "tgtd portal never opened");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn pid(&self) -> u32 {
        self.proc.pid()
    }

    /// SIGKILL (tgtd ignores SIGTERM while targets exist).
    pub fn kill(&mut self) {
        self.proc.kill();
        let _ = std::fs::remove_file(format!("/var/run/tgtd/socket.{}", self.control));
        let _ = std::fs::remove_file(format!("/var/run/tgtd/socket.{}.lock", self.control));
    }

    /// Starts tgtd again on the same port and file.
    pub fn restart(&mut self) {
        self.kill();
        self.spawn();
    }

    pub fn url(&self) -> String {
        format!("iscsi://127.0.0.1:{}/{IQN}/1", self.port)
    }

    pub fn url_via(&self, port: u16) -> String {
        format!("iscsi://127.0.0.1:{port}/{IQN}/1")
    }
}

impl Drop for Tgt {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A loopback TCP proxy whose connections can be cut (closed) or frozen (kept open, silent).
pub struct Proxy {
    pub port: u16,
    cut: Arc<Mutex<Vec<std::net::TcpStream>>>,
    frozen: Arc<AtomicBool>,
    stop: Arc<AtomicBool>,
}

impl Proxy {
    pub fn start(upstream: u16) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        listener.set_nonblocking(true).unwrap();
        let cut: Arc<Mutex<Vec<std::net::TcpStream>>> = Arc::default();
        let frozen = Arc::new(AtomicBool::new(false));
        let stop = Arc::new(AtomicBool::new(false));
        let (c2, f2, s2) = (cut.clone(), frozen.clone(), stop.clone());
        std::thread::spawn(move || {
            while !s2.load(Ordering::Relaxed) {
                match listener.accept() {
                    Ok((down, _)) => {
                        down.set_nonblocking(false).unwrap();
                        let Ok(up) = std::net::TcpStream::connect(("127.0.0.1", upstream)) else { continue };
                        let _ = down.set_nodelay(true);
                        let _ = up.set_nodelay(true);
                        c2.lock().unwrap().push(down.try_clone().unwrap());
                        c2.lock().unwrap().push(up.try_clone().unwrap());
                        pump(down.try_clone().unwrap(), up.try_clone().unwrap(), f2.clone());
                        pump(up, down, f2.clone());
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(5)),
                }
            }
        });
        Proxy { port, cut, frozen, stop }
    }

    /// Closes every connection open through the proxy now (new ones are still accepted).
    pub fn cut(&self) {
        for s in self.cut.lock().unwrap().drain(..) {
            let _ = s.shutdown(std::net::Shutdown::Both);
        }
    }

    /// Stops forwarding without closing anything (a silent, dead link), or resumes.
    pub fn freeze(&self, on: bool) {
        self.frozen.store(on, Ordering::Relaxed);
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        self.cut();
    }
}

fn pump(mut from: std::net::TcpStream, mut to: std::net::TcpStream, frozen: Arc<AtomicBool>) {
    use std::io::{Read, Write};
    std::thread::spawn(move || {
        let mut buf = vec![0u8; 1 << 16];
        loop {
            let n = match from.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            };
            // A frozen link swallows traffic, like a cable pulled without a reset.
            if frozen.load(Ordering::Relaxed) {
                continue;
            }
            if to.write_all(&buf[..n]).is_err() {
                break;
            }
        }
        let _ = to.shutdown(std::net::Shutdown::Both);
        let _ = from.shutdown(std::net::Shutdown::Both);
    });
}

/// Runs a command and returns its output, failing the test with its stderr when it fails.
pub fn run_ok(cmd: &mut Command) -> String {
    let out = cmd.output().unwrap();
    assert!(
        out.status.success(),
        "{cmd:?} failed: {}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Waits until `path` is a FUSE mount (listed in /proc/mounts).
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

/// 4 KiB units each worker owns.
const UNITS: u64 = 256;
const WORKERS: u64 = 8;
const UNIT_BLOCKS: u32 = 8;

pub fn content(worker: u64, unit: u64, version: u64) -> Bytes {
    let mut x = (worker << 48 ^ unit << 20 ^ version).wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    let v: Vec<u8> = (0..4096)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect();
    Bytes::from(v)
}

pub fn fault_options() -> LunOptions {
    let mut o = LunOptions::default();
    o.config.timers.recovery = RecoveryPolicy {
        timeout: Duration::from_secs(30),
        min_backoff: Duration::from_millis(20),
        max_backoff: Duration::from_millis(250),
    };
    o.config.timers.nop_interval = Duration::from_millis(500);
    o.config.timers.nop_timeout = Duration::from_millis(1000);
    o.config.login_timeout = Duration::from_secs(2);
    o
}

/// Each worker writes runs of 1-4 units at random places in its own region until `until`,
/// remembering the last version of every unit; returns those versions.
pub async fn workload(lun: Arc<Lun>, worker: u64, until: Instant) -> Vec<u64> {
    let mut versions = vec![0u64; UNITS as usize];
    let mut x = worker.wrapping_mul(0x2545_f491_4f6c_dd1d) | 1;
    let mut n = 0u64;
    while Instant::now() < until || n < 20 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let run = 1 + x % 4;
        let start = (x >> 8) % (UNITS - run + 1);
        let mut buf = Vec::with_capacity((run * 4096) as usize);
        for u in start..start + run {
            versions[u as usize] += 1;
            buf.extend_from_slice(&content(worker, u, versions[u as usize]));
        }
        let lba = (worker * UNITS + start) * u64::from(UNIT_BLOCKS);
        lun.write(lba, Bytes::from(buf), false).await.expect("callers see slower I/O, never an error");
        n += 1;
    }
    versions
}

pub async fn verify(lun: &Lun, all: &[Vec<u64>]) {
    for (w, versions) in all.iter().enumerate() {
        let w = w as u64;
        let region = lun.read(w * UNITS * u64::from(UNIT_BLOCKS), (UNITS as u32) * UNIT_BLOCKS).await.unwrap();
        for (u, &v) in versions.iter().enumerate() {
            let got = region.slice(u * 4096..(u + 1) * 4096);
            let want = if v == 0 { Bytes::from(vec![0u8; 4096]) } else { content(w, u as u64, v) };
            assert!(got == want, "worker {w} unit {u}: expected version {v}");
        }
    }
}

/// Runs the workload for `secs` while `fault` runs on this thread, then verifies every unit.
pub fn run_with_fault(url: &str, secs: u64, fault: impl FnOnce()) -> stics_initiator::Snapshot {
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let url = IscsiUrl::parse(url).unwrap();
    let lun = Arc::new(rt.block_on(Lun::open(&url, &fault_options())).unwrap());
    let until = Instant::now() + Duration::from_secs(secs);
    let handles: Vec<_> = (0..WORKERS).map(|w| rt.spawn(workload(lun.clone(), w, until))).collect();
    fault();
    let all: Vec<Vec<u64>> = rt.block_on(async {
        let mut v = Vec::new();
        for h in handles {
            v.push(h.await.unwrap());
        }
        v
    });
    rt.block_on(verify(&lun, &all));
    let c = lun.counters();
    eprintln!("{c}");
    rt.block_on(lun.close());
    c
}

/// `stics target` serving one file LUN (LUN 0) on a random loopback port.
pub struct SticsTarget {
    pub port: u16,
    pub dir: tempfile::TempDir,
    pub file: PathBuf,
    extra: Vec<String>,
    proc: Guard,
}

impl SticsTarget {
    pub fn start(size_mib: u64, extra: &[&str]) -> SticsTarget {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("lun.img");
        std::fs::File::create(&file).unwrap().set_len(size_mib << 20).unwrap();
        let mut t = SticsTarget {
            port: free_port(),
            dir,
            file,
            extra: extra.iter().map(|s| s.to_string()).collect(),
            proc: Guard(None),
        };
        t.spawn();
        t
    }

    fn spawn(&mut self) {
        let child = Command::new(env!("CARGO_BIN_EXE_stics"))
            .args(["target", "--listen", &format!("127.0.0.1:{}", self.port), "--iqn", IQN])
            .arg("--lun")
            .arg(format!("file:{}", self.file.display()))
            .args(&self.extra)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        self.proc = Guard(Some(child));
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect(("127.0.0.1", self.port)).is_err() {
            assert!(Instant::now() < deadline, "stics target never listened");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn kill(&mut self) {
        self.proc.kill();
    }

    pub fn restart(&mut self) {
        self.kill();
        self.spawn();
    }

    pub fn url(&self) -> String {
        format!("iscsi://127.0.0.1:{}/{IQN}/0", self.port)
    }
}

/// Writes a pattern over the first 6 MiB of the LUN at `url`, zeroes 9000 blocks from block 1000
/// with [`BlockDev::write_zeros`], and checks what reads back; returns the commands the zeroing
/// took.
pub async fn zeroing_reads_back_zeros(url: &str) -> u64 {
    let lun = Lun::open(&stics_initiator::IscsiUrl::parse(url).unwrap(), &LunOptions::default()).await.unwrap();
    assert_eq!(lun.geometry().block_size, 512);
    lun.write(0, Bytes::from(vec![0xc3u8; 6 << 20]), false).await.unwrap();
    let before = lun.counters().commands;
    lun.write_zeros(1000, 9000).await.unwrap();
    let used = lun.counters().commands - before;
    lun.flush().await.unwrap();
    let b = lun.read(0, 12288).await.unwrap();
    assert!(b[..1000 * 512].iter().all(|&x| x == 0xc3));
    assert!(b[1000 * 512..10_000 * 512].iter().all(|&x| x == 0));
    assert!(b[10_000 * 512..].iter().all(|&x| x == 0xc3));
    assert!(lun.write_zeros(lun.geometry().num_blocks - 1, 2).await.is_err());
    lun.close().await;
    used
}
