//! `stics target` with peers nobody here wrote: libiscsi's tools, qemu-img, and ext4 + PostMark
//! on a LUN exported as a file by qemu-storage-daemon's FUSE export.

use std::fs;
use std::io::Write;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use stics_testkit::peers::SticsTarget;
use stics_testkit::proc::{run_ok as run, wait_mounted, Guard};

const IQN: &str = "iqn.2024-01.org.stics.test:interop";

/// `stics target` serving `luns` as LUN 0, 1, ...
fn start(luns: &[&str]) -> SticsTarget {
    SticsTarget::with_luns(Path::new(env!("CARGO_BIN_EXE_stics")), IQN, luns)
}

fn sha256(path: &Path) -> String {
    run(Command::new("sha256sum").arg(path)).split_whitespace().next().unwrap().to_owned()
}

#[test]
fn libiscsi_tools_report_luns_names_and_geometry() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("lun1.img");
    let t = start(&["mem:64MiB", &format!("file:{}:32MiB", file.display())]);

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
    let data = stics_testkit::pattern::noise(1, 64 << 20);
    fs::File::create(&src).unwrap().write_all(&data).unwrap();
    let lun = dir.path().join("lun.img");
    let t = start(&[&format!("file:{}:64MiB", lun.display())]);

    run(Command::new("qemu-img").args(["convert", "-n", "-f", "raw", "-O", "raw"]).arg(&src).arg(t.url(0)));
    run(Command::new("qemu-img").args(["convert", "-f", "raw", "-O", "raw"]).arg(t.url(0)).arg(&back));
    assert_eq!(sha256(&src), sha256(&back), "image read back from the LUN differs");
    assert_eq!(sha256(&src), sha256(&lun), "backing file differs from what was written");
}

/// Unmounts, stops qemu-storage-daemon (by PID) and removes the mount point, even on failure.
struct FuseExport {
    qsd: Guard,
    file: std::path::PathBuf,
    mnt: std::path::PathBuf,
}

impl Drop for FuseExport {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.mnt).stderr(Stdio::null()).status();
        self.qsd.signal(libc::SIGTERM);
        if self.qsd.wait_exit(Duration::from_secs(10)).is_none() {
            self.qsd.kill();
            let _ = Command::new("umount").arg("-l").arg(&self.file).stderr(Stdio::null()).status();
        }
    }
}

#[test]
fn ext4_over_a_fuse_export_runs_postmark_with_sync_mount_and_fscks_clean() {
    let dir = tempfile::tempdir().unwrap();
    let lun = dir.path().join("lun.img");
    let t = start(&[&format!("file:{}:256MiB", lun.display())]);

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
    let qsd = Guard::new(qsd);
    let export = FuseExport { qsd, file: file.clone(), mnt: mnt.clone() };
    assert!(wait_mounted(&file, true, Duration::from_secs(20)), "FUSE export did not appear on {}", file.display());

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
    stics_bench::exp::fs::released(&file, Duration::from_secs(60)).unwrap();
    let fsck = Command::new("e2fsck").args(["-fn"]).arg(&file).output().unwrap();
    assert!(
        fsck.status.success(),
        "e2fsck -fn found problems: {}{}",
        String::from_utf8_lossy(&fsck.stdout),
        String::from_utf8_lossy(&fsck.stderr)
    );
    drop(export);
}
