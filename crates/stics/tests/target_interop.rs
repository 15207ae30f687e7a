//! `stics target` with peers nobody here wrote: libiscsi's tools, qemu-img, and ext4 + PostMark
//! on a LUN exported as a file by qemu-storage-daemon's FUSE export.

use std::fs;
use std::io::Write;
use std::net::TcpListener;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::thread::sleep;
use std::time::{Duration, Instant};

const IQN: &str = "iqn.2024-01.org.stics.test:interop";

/// A `stics target` child, killed (by its PID) when dropped.
struct Target {
    child: Child,
    port: u16,
}

impl Target {
    fn start(luns: &[&str]) -> Target {
        let port = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_stics"));
        cmd.args(["target", "--listen", &format!("127.0.0.1:{port}"), "--iqn", IQN]);
        for l in luns {
            cmd.args(["--lun", l]);
        }
        let child = cmd.stdout(Stdio::null()).stderr(Stdio::null()).spawn().expect("start stics target");
        let t = Target { child, port };
        let deadline = Instant::now() + Duration::from_secs(20);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(Instant::now() < deadline, "stics target did not listen on {port}");
            sleep(Duration::from_millis(50));
        }
        t
    }

    fn url(&self, lun: u32) -> String {
        format!("iscsi://127.0.0.1:{}/{IQN}/{lun}", self.port)
    }
}

impl Drop for Target {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Runs a command and returns its stdout; panics with its output if it fails.
fn run(cmd: &mut Command) -> String {
    let out = cmd.output().unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?} failed: {}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn sha256(path: &Path) -> String {
    run(Command::new("sha256sum").arg(path)).split_whitespace().next().unwrap().to_owned()
}

#[test]
fn libiscsi_tools_report_luns_names_and_geometry() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("lun1.img");
    let t = Target::start(&["mem:64MiB", &format!("file:{}:32MiB", file.display())]);

    let ls = run(Command::new("iscsi-ls").args(["-s", &format!("iscsi://127.0.0.1:{}", t.port)]));
    assert!(ls.contains(&format!("Target:{IQN}")), "{ls}");
    assert!(ls.contains("Lun:0") && ls.contains("Lun:1"), "{ls}");

    let inq = run(Command::new("iscsi-inq").arg(t.url(0)));
    assert!(inq.contains("Vendor:STICS"), "{inq}");
    assert!(inq.contains("Peripheral Device Type:DIRECT_ACCESS"), "{inq}");

    let cap = run(Command::new("iscsi-readcapacity16").arg(t.url(1)));
    assert!(cap.contains("RETURNED LOGICAL BLOCK ADDRESS:65535"), "{cap}");
    assert!(cap.contains("LOGICAL BLOCK LENGTH IN BYTES:512"), "{cap}");
    assert!(cap.contains("Total size:33554432"), "{cap}");
    assert!(cap.contains("LBPME:1"), "thin provisioning is advertised on a file LUN: {cap}");
}

#[test]
fn qemu_img_convert_to_and_from_the_lun_keeps_every_byte() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("random.img");
    let back = dir.path().join("back.img");
    let mut data = vec![0u8; 64 << 20];
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    for chunk in data.chunks_mut(8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        chunk.copy_from_slice(&x.to_le_bytes());
    }
    fs::File::create(&src).unwrap().write_all(&data).unwrap();
    let lun = dir.path().join("lun.img");
    let t = Target::start(&[&format!("file:{}:64MiB", lun.display())]);

    run(Command::new("qemu-img").args(["convert", "-n", "-f", "raw", "-O", "raw"]).arg(&src).arg(t.url(0)));
    run(Command::new("qemu-img").args(["convert", "-f", "raw", "-O", "raw"]).arg(t.url(0)).arg(&back));
    assert_eq!(sha256(&src), sha256(&back), "image read back from the LUN differs");
    assert_eq!(sha256(&src), sha256(&lun), "backing file differs from what was written");
}

/// Unmounts, stops qemu-storage-daemon (by PID) and removes the mount point, even on failure.
struct FuseExport {
    qsd: Child,
    file: std::path::PathBuf,
    mnt: std::path::PathBuf,
}

impl Drop for FuseExport {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.mnt).stderr(Stdio::null()).status();
        let _ = Command::new("kill").arg("-TERM").arg(self.qsd.id().to_string()).status();
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.qsd.try_wait() {
                return;
            }
            sleep(Duration::from_millis(50));
        }
        let _ = self.qsd.kill();
        let _ = self.qsd.wait();
        let _ = Command::new("umount").arg("-l").arg(&self.file).stderr(Stdio::null()).status();
    }
}

fn is_fuse_mounted(file: &Path) -> bool {
    fs::read_to_string("/proc/self/mountinfo")
        .map(|m| m.lines().any(|l| l.split_whitespace().nth(4) == Some(file.to_str().unwrap())))
        .unwrap_or(false)
}

#[test]
fn ext4_over_a_fuse_export_runs_postmark_with_sync_mount_and_fscks_clean() {
    let dir = tempfile::tempdir().unwrap();
    let lun = dir.path().join("lun.img");
    let t = Target::start(&[&format!("file:{}:256MiB", lun.display())]);

    let file = dir.path().join("export");
    fs::File::create(&file).unwrap();
    let mnt = dir.path().join("mnt");
    fs::create_dir(&mnt).unwrap();
    let qsd = Command::new("qemu-storage-daemon")
        .arg("--blockdev")
        .arg(format!(
            "driver=iscsi,transport=tcp,portal=127.0.0.1:{},target={IQN},lun=0,node-name=lun0,cache.direct=on",
            t.port
        ))
        .arg("--export")
        .arg(format!("type=fuse,id=exp0,node-name=lun0,mountpoint={},writable=on", file.display()))
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("start qemu-storage-daemon");
    let export = FuseExport { qsd, file: file.clone(), mnt: mnt.clone() };
    let deadline = Instant::now() + Duration::from_secs(20);
    while !is_fuse_mounted(&file) {
        assert!(Instant::now() < deadline, "FUSE export did not appear on {}", file.display());
        sleep(Duration::from_millis(100));
    }

    run(Command::new("mkfs.ext4").args(["-q", "-F"]).arg(&file));
    run(Command::new("mount").args(["-o", "loop,sync"]).arg(&file).arg(&mnt));
    let cfg = dir.path().join("postmark.cfg");
    fs::write(
        &cfg,
        format!("set location {}\nset number 300\nset transactions 3000\nset seed 42\nrun\nquit\n", mnt.display()),
    )
    .unwrap();
    let pm = run(Command::new("postmark").arg(&cfg));
    assert!(pm.contains("transactions"), "PostMark did not report: {pm}");
    // Write everything back while mounted, so that unmounting has nothing left to write.
    run(Command::new("sync").arg("-f").arg(&mnt));
    run(Command::new("umount").arg(&mnt));
    let fsck = Command::new("e2fsck").args(["-fn"]).arg(&file).output().unwrap();
    assert!(
        fsck.status.success(),
        "e2fsck -fn found problems: {}{}",
        String::from_utf8_lossy(&fsck.stdout),
        String::from_utf8_lossy(&fsck.stderr)
    );
    drop(export);
}
