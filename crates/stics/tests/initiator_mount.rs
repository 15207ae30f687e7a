//! `stics mount` of a tgt LUN: ext4 on the FUSE file through a loop device, mounted `-o sync`,
//! runs PostMark and stays consistent (`e2fsck -fn`); the export stops on SIGTERM and on an
//! unmount from outside.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use stics_testkit::peers::Tgt;
use stics_testkit::proc::{one_at_a_time, run_ok, spawn_stics, wait_mounted, Guard};

/// A tgt LUN of `size_mib` MiB exported by `stics mount` at `dir/lun`; fields drop in order,
/// so the export goes before tgt, and the lock on the other tests goes last.
struct Setup {
    m: Mount,
    file: PathBuf,
    tgt: Tgt,
    dir: tempfile::TempDir,
    _serial: std::sync::MutexGuard<'static, ()>,
}

impl Setup {
    fn start(size_mib: u64) -> Setup {
        let lock = one_at_a_time();
        let tgt = Tgt::start(size_mib);
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("lun");
        let m = Mount::start(&tgt.url(), &file);
        Setup { m, file, tgt, dir, _serial: lock }
    }
}

/// Writes `data` at byte offset `off` of `path` and waits until it is durable.
fn write_synced(path: &Path, off: u64, data: &[u8]) {
    use std::os::unix::fs::FileExt;
    let f = std::fs::OpenOptions::new().write(true).open(path).unwrap();
    f.write_all_at(data, off).unwrap();
    f.sync_all().unwrap();
}

/// A running `stics mount`, unmounted and killed on drop if the test did not stop it.
struct Mount {
    proc: Guard,
    file: PathBuf,
    fs_dir: Option<PathBuf>,
    /// Where its stderr goes: a file, not a pipe, so that a chatty export never blocks on it.
    log: tempfile::NamedTempFile,
}

impl Mount {
    fn start(url: &str, file: &Path) -> Mount {
        std::fs::File::create(file).unwrap();
        let log = tempfile::NamedTempFile::new().unwrap();
        let args = ["mount", "--stats", url, file.to_str().unwrap()];
        let proc = spawn_stics(Path::new(env!("CARGO_BIN_EXE_stics")), &args, &[], Some(log.path()));
        let m = Mount { proc, file: file.to_owned(), fs_dir: None, log };
        assert!(wait_mounted(file, true, Duration::from_secs(10)), "stics mount did not mount {}", file.display());
        m
    }

    fn signal(&self, sig: i32) {
        assert!(self.proc.signal(sig), "kill -{sig} {} failed", self.proc.pid());
    }

    /// Waits for the process to exit; returns its success and stderr.
    fn wait(&mut self, limit: Duration) -> (bool, String) {
        if let Some(st) = self.proc.wait_exit(limit) {
            (st.success(), std::fs::read_to_string(self.log.path()).unwrap())
        } else {
            self.proc.kill();
            let err = std::fs::read_to_string(self.log.path()).unwrap_or_default();
            panic!("stics mount did not stop within {limit:?}; it said:\n{err}");
        }
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        if let Some(d) = &self.fs_dir {
            let _ = Command::new("umount").arg("-l").arg(d).status();
        }
        if self.proc.pid() != 0 {
            let _ = Command::new("umount").arg("-l").arg(&self.file).status();
            self.proc.kill();
        }
    }
}

#[test]
fn ext4_on_stics_mount_of_tgt_runs_postmark_with_sync_and_fscks_clean() {
    let mut s = Setup::start(256);
    let fs_dir = s.dir.path().join("fs");
    std::fs::create_dir(&fs_dir).unwrap();
    assert_eq!(std::fs::metadata(&s.file).unwrap().len(), 256 << 20);
    run_ok(Command::new("mkfs.ext4").args(["-F", "-q"]).arg(&s.file));
    run_ok(Command::new("mount").args(["-o", "loop,sync"]).arg(&s.file).arg(&fs_dir));
    s.m.fs_dir = Some(fs_dir.clone());
    let cfg = s.dir.path().join("postmark.cfg");
    std::fs::write(
        &cfg,
        format!("set location {}\nset number 300\nset transactions 3000\nrun\nquit\n", fs_dir.display()),
    )
    .unwrap();
    let out = run_ok(Command::new("postmark").arg(&cfg));
    assert!(out.contains("Time:"), "{out}");
    // Write everything back while mounted, so that unmounting has nothing left to write.
    run_ok(Command::new("sync").arg("-f").arg(&fs_dir));
    run_ok(Command::new("umount").arg(&fs_dir));
    stics_bench::exp::fs::released(&s.file, Duration::from_secs(60)).unwrap();
    s.m.fs_dir = None;
    let fsck = Command::new("e2fsck").args(["-fn"]).arg(&s.file).output().unwrap();
    s.m.signal(libc::SIGTERM);
    let (ok, err) = s.m.wait(Duration::from_secs(10));
    assert!(
        fsck.status.success(),
        "e2fsck found problems: {}\nstics mount said:\n{err}",
        String::from_utf8_lossy(&fsck.stdout)
    );
    assert!(ok, "stics mount failed: {err}");
    assert!(err.contains("fuse flushes"), "{err}");
    let flushes: u64 = err
        .lines()
        .find(|l| l.starts_with("fuse flushes"))
        .and_then(|l| l.split_whitespace().last())
        .unwrap()
        .parse()
        .unwrap();
    assert!(flushes > 0, "fsync reached the device as SYNCHRONIZE CACHE: {err}");
    assert!(wait_mounted(&s.file, false, Duration::from_secs(2)));
}

#[test]
fn unmount_from_outside_stops_stics_mount_cleanly() {
    let mut s = Setup::start(16);
    run_ok(Command::new("fusermount3").arg("-u").arg(&s.file));
    let (ok, err) = s.m.wait(Duration::from_secs(10));
    assert!(ok, "{err}");
    assert!(err.contains("commands"), "counters printed: {err}");
}

#[test]
fn sigint_unmounts_and_leaves_the_written_data_on_the_target() {
    let mut s = Setup::start(16);
    let data: Vec<u8> = (0..100_000u32).map(|i| (i % 251) as u8).collect();
    write_synced(&s.file, 12_345, &data);
    s.m.signal(libc::SIGINT);
    let (ok, err) = s.m.wait(Duration::from_secs(10));
    assert!(ok, "{err}");
    assert!(err.contains("read-mod-writes"), "{err}");
    // The bytes landed in tgt's backing file at the same unaligned offset.
    let img = std::fs::read(&s.tgt.file).unwrap();
    assert_eq!(&img[12_345..12_345 + data.len()], &data[..]);
}

#[test]
fn fallocate_punches_and_zeroes_ranges_on_the_target() {
    let mut s = Setup::start(16);
    write_synced(&s.file, 0, &vec![0x5au8; 4 << 20]);
    let fallocate = |args: &[&str]| Command::new("fallocate").args(args).arg(&s.file).output().unwrap();
    // Unaligned at both ends, and more than one 1 MiB zero buffer in between.
    let out = fallocate(&["--punch-hole", "--offset", "1000", "--length", "1500000"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let out = fallocate(&["--zero-range", "--keep-size", "--offset", "3000000", "--length", "4096"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    // Plain allocation of a device's own range has nothing to do; growing it is refused.
    assert!(fallocate(&["--offset", "0", "--length", "65536"]).status.success());
    assert!(!fallocate(&["--offset", "0", "--length", &(32u64 << 20).to_string()]).status.success());
    let out = fallocate(&["--collapse-range", "--offset", "0", "--length", "65536"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("not supported"), "{}", String::from_utf8_lossy(&out.stderr));
    std::fs::File::open(&s.file).unwrap().sync_all().unwrap();
    s.m.signal(libc::SIGTERM);
    let (ok, err) = s.m.wait(Duration::from_secs(10));
    assert!(ok, "{err}");
    assert!(err.lines().any(|l| l.starts_with("fuse zeroings") && l.ends_with(" 2")), "{err}");
    let img = std::fs::read(&s.tgt.file).unwrap();
    let zero = |r: std::ops::Range<usize>| img[r].iter().all(|&b| b == 0);
    let kept = |r: std::ops::Range<usize>| img[r].iter().all(|&b| b == 0x5a);
    assert!(kept(0..1000) && zero(1000..1_501_000) && kept(1_501_000..3_000_000));
    assert!(zero(3_000_000..3_004_096) && kept(3_004_096..4 << 20));
}

#[test]
fn sigterm_while_a_loop_device_holds_the_file_serves_until_it_lets_go() {
    let mut s = Setup::start(16);
    let out = Command::new("losetup").args(["-f", "--show"]).arg(&s.file).output().unwrap();
    assert!(out.status.success(), "losetup: {}", String::from_utf8_lossy(&out.stderr));
    let dev = String::from_utf8(out.stdout).unwrap().trim().to_owned();
    // Detached on drop whatever happens below.
    struct Loop(String);
    impl Drop for Loop {
        fn drop(&mut self) {
            let _ = Command::new("losetup").args(["-d", &self.0]).status();
        }
    }
    let lo = Loop(dev.clone());
    s.m.signal(libc::SIGTERM);
    std::thread::sleep(Duration::from_millis(500));
    // The file is busy, so the export detached lazily and still serves the loop device.
    let data: Vec<u8> = (0..1u32 << 20).map(|i| (i % 253) as u8).collect();
    write_synced(Path::new(&dev), 3 << 20, &data);
    drop(lo);
    let (ok, err) = s.m.wait(Duration::from_secs(10));
    assert!(ok, "{err}");
    assert!(err.contains("detached lazily"), "{err}");
    let img = std::fs::read(&s.tgt.file).unwrap();
    assert_eq!(&img[3 << 20..4 << 20], &data[..]);
}
