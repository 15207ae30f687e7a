//! `stics gateway` as a process in front of a `stics target` process: libiscsi's conformance
//! suite and `qemu-img convert` through it; SIGKILL at random moments, a remote killed and
//! restarted, a cut WAN link and a lost log under verified writes; ext4 and PostMark on it; one
//! writer per remote LUN (a second gateway and stray initiators are kept out); in front of tgt,
//! a connection cut under destage; `--max-lag` over a remote slower than the host. With the
//! `rbd` feature, the SIGKILL test again with the remote over a Ceph RBD image behind an 8 ms WAN.

use std::path::Path;
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use rand::rngs::StdRng;
use rand::SeedableRng;
use stics_block::BlockDev;
use stics_initiator::{IscsiUrl, Lun, LunOptions};
use stics_testkit::ledger::{Durable, Ledger, Pace};
use stics_testkit::net::{free_port, Proxy};
use stics_testkit::pattern::{check_at, stamp_run};
use stics_testkit::peers::SticsTarget;
use stics_testkit::proc::{one_at_a_time, run_ok, spawn_stics, wait_mounted, wait_port};
use stics_testkit::IQN;

mod common;

use common::*;

#[test]
fn iscsi_test_cu_all_has_no_failures_through_the_gateway_in_each_mode() {
    // Each mode has its own remote and gateway, so that both runs go side by side.
    let (log_remote, immediate_remote) =
        (SticsTarget::with_file_lun(Path::new(BIN), 1024, &[]), SticsTarget::with_file_lun(Path::new(BIN), 1024, &[]));
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let (_log_gw, log_port) = gateway(&log_remote.url(0), &d.join("log-mode.log"), "log", &d.join("log-mode.err"));
    let (_immediate_gw, immediate_port) =
        gateway(&immediate_remote.url(0), &d.join("immediate.log"), "immediate", &d.join("immediate.err"));
    iscsi_test_cu_all(&[("log", url(log_port)), ("immediate", url(immediate_port))]);
}

#[test]
fn qemu_img_convert_in_and_out_through_the_gateway_keeps_every_byte() {
    let remote = SticsTarget::with_file_lun(Path::new(BIN), 64, &[]);
    let dir = tempfile::tempdir().unwrap();
    let (gw, port) = gateway(&remote.url(0), &dir.path().join("log"), "log", &dir.path().join("gw.log"));
    let input = dir.path().join("in.img");
    let data: Vec<u8> = (0..24u32 << 20).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8).collect();
    std::fs::write(&input, &data).unwrap();
    let ok = |args: &[&str]| {
        let out = Command::new("qemu-img").args(args).output().expect("qemu-img");
        assert!(out.status.success(), "qemu-img {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    };
    ok(&["convert", "-n", "-f", "raw", "-O", "raw", input.to_str().unwrap(), &url(port)]);
    let output = dir.path().join("out.img");
    ok(&["convert", "-f", "raw", "-O", "raw", &url(port), output.to_str().unwrap()]);
    let back = std::fs::read(&output).unwrap();
    assert_eq!(&back[..data.len()], &data[..], "what came out is what went in");
    // Killed and started again on the same log, it still serves what was written.
    drop(gw);
    let (_gw, port2) = gateway(&remote.url(0), &dir.path().join("log"), "log", &dir.path().join("gw2.log"));
    let (rt, lun) = open(port2);
    let first = rt.block_on(lun.read(0, 8)).unwrap();
    assert_eq!(&first[..], &data[..4096]);
}

/// SIGKILL of the gateway at `rounds` random moments of a random write workload, each restart
/// on the same log: every durable write is still there, nothing torn or misplaced.
fn sigkill_rounds(mode: &str, seed: u64, rounds: u32) {
    let remote = SticsTarget::with_file_lun(Path::new(BIN), 16, &[]);
    let dir = tempfile::tempdir().unwrap();
    sigkill_rounds_on(&remote.url(0), dir.path(), mode, seed, rounds);
}

#[test]
fn sigkill_at_random_moments_loses_no_acknowledged_write_in_log_mode() {
    sigkill_rounds("log", 7, 100);
}

#[test]
fn sigkill_at_random_moments_loses_no_flushed_write_in_immediate_mode() {
    sigkill_rounds("immediate", 11, 100);
}

#[test]
fn remote_killed_and_restarted_under_writes_then_drained_holds_every_acknowledged_write() {
    const BLOCKS: u64 = 4096;
    let seed = 23;
    let mut remote = SticsTarget::with_file_lun(Path::new(BIN), 16, &[]);
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("log");
    let started = Instant::now();
    let (mut gw, port, metrics) = gateway_with_metrics(&remote.url(0), &log, "log", &dir.path().join("gw.log"));
    let ledger = Ledger::new(BLOCKS, 512, Durable::OnAck);
    let acked = ledger.acked();
    let stop = Arc::new(AtomicBool::new(false));
    let pace = Pace { pause: Some(Duration::from_micros(300)), flush_one_in: 1, timeout: None };
    let w = writer(port, ledger, seed, pace, Arc::clone(&stop));
    let mut rng = StdRng::seed_from_u64(seed ^ 0x5eed);
    let mut while_down = 0;
    for _ in 0..6 {
        sleep_ms(&mut rng, 200..1500);
        remote.kill();
        let before = acked.load(Ordering::Relaxed);
        sleep_ms(&mut rng, 300..2500);
        while_down += acked.load(Ordering::Relaxed) - before;
        remote.restart();
    }
    sleep_ms(&mut rng, 300..1000);
    stop.store(true, Ordering::Relaxed);
    let (mut ledger, err) = w.join().unwrap();
    assert!(err.is_none(), "seed {seed}: a write through the gateway failed: {err:?}");
    assert!(while_down > 0, "seed {seed}: the log took writes while the remote was down");
    let t = Instant::now();
    let drained: serde_json::Value = serde_json::from_str(&http(metrics, "POST /drain")).unwrap();
    assert_eq!(drained["dirty_bytes"], 0, "after POST /drain: {drained}");
    let drain_took = t.elapsed();
    gw.kill();
    let (rt, lun) = open_url(&remote.url(0));
    let on_remote = rt.block_on(ledger.verify(&lun, &format!("seed {seed}: the remote alone after POST /drain")));
    drop(lun);
    drop(rt);
    let (_gw, port) = gateway(&remote.url(0), &log, "log", &dir.path().join("gw2.log"));
    let (rt, lun) = open(port);
    let through = rt.block_on(ledger.verify(&lun, &format!("seed {seed}: the gateway restarted on its log")));
    assert!(through == on_remote, "the drained log adds nothing to the remote");
    eprintln!(
        "remote down 6 times: {} writes acknowledged, {while_down} while it was down; drain took {drain_took:?}; \
         {:?} in all",
        acked.load(Ordering::Relaxed),
        started.elapsed()
    );
}

#[test]
fn wan_cut_for_30_s_keeps_writes_acknowledged_and_destage_resumes_by_itself() {
    const BLOCKS: u64 = 4096;
    const CUT: Duration = Duration::from_secs(30);
    let seed = 31;
    let remote = SticsTarget::with_file_lun(Path::new(BIN), 64, &[]);
    let proxy = Proxy::start(remote.port);
    let via = format!("iscsi://127.0.0.1:{}/{IQN}/0", proxy.port);
    let dir = tempfile::tempdir().unwrap();
    let started = Instant::now();
    let (mut gw, port, metrics) =
        gateway_with_metrics(&via, &dir.path().join("log"), "log", &dir.path().join("gw.log"));
    let ledger = Ledger::new(BLOCKS, 512, Durable::OnAck);
    let acked = ledger.acked();
    let stop = Arc::new(AtomicBool::new(false));
    let pace = Pace { pause: Some(Duration::from_millis(2)), flush_one_in: 1, timeout: None };
    let w = writer(port, ledger, seed, pace, Arc::clone(&stop));
    std::thread::sleep(Duration::from_secs(2));
    // The link goes silent and its connections drop; new ones reach nothing.
    proxy.freeze(true);
    proxy.cut();
    let cut = Instant::now();
    let before = acked.load(Ordering::Relaxed);
    // A read the cache cannot answer: never written, never read.
    let (rt, lun) = open(port);
    let far = BLOCKS * 8;
    let read = rt.spawn(async move {
        let r = lun.read(far, 8).await;
        (r, Instant::now())
    });
    std::thread::sleep(CUT.saturating_sub(cut.elapsed()));
    let during = acked.load(Ordering::Relaxed) - before;
    let dirty_during = status(metrics)["dirty_bytes"].as_u64().unwrap();
    let read_ended_while_cut = read.is_finished();
    proxy.freeze(false);
    let restored = Instant::now();
    std::thread::sleep(Duration::from_secs(2));
    stop.store(true, Ordering::Relaxed);
    let (mut ledger, err) = w.join().unwrap();
    assert!(err.is_none(), "seed {seed}: a write through the gateway failed: {err:?}");
    assert!(during > 100, "seed {seed}: only {during} writes acknowledged while the link was cut");
    assert!(dirty_during > 0, "what was written while cut is dirty");
    // The read waits for the link (the remote's initiator reconnects) rather than failing.
    assert!(!read_ended_while_cut, "a read the cache cannot answer ended while the link was cut");
    let (r, at) = rt
        .block_on(async { tokio::time::timeout(Duration::from_secs(120), read).await })
        .expect("a read of an uncached block still waits 120 s after the link came back")
        .unwrap();
    let data = r.unwrap_or_else(|e| panic!("the uncached read, once the link was back: {e}"));
    assert!(data.iter().all(|&b| b == 0), "a block never written reads as zeros");
    eprintln!(
        "uncached read while cut: answered {:?} after the cut, {:?} after the link came back",
        at - cut,
        at - restored
    );
    let clean_after = wait_clean(metrics, Duration::from_secs(120));
    gw.kill();
    let (rt2, lun) = open_url(&remote.url(0));
    rt2.block_on(ledger.verify(&lun, &format!("seed {seed}: the remote alone after the cut")));
    eprintln!(
        "cut {CUT:?}: {during} writes acknowledged while cut ({dirty_during} bytes dirty), {} in all; \
         clean {clean_after:?} after the link came back + 2 s; {:?} in all",
        acked.load(Ordering::Relaxed),
        started.elapsed()
    );
}

#[test]
fn log_thrown_away_after_sigkill_leaves_a_remote_ext4_that_replays_and_fscks_clean() {
    let _serial = one_at_a_time();
    let remote = SticsTarget::with_file_lun(Path::new(BIN), 256, &[]);
    log_thrown_away_after_sigkill(&remote, None);
}

/// The same on a remote that stores on a model of seed 004's disk, so that destage is far behind
/// the host when the gateway dies: the remote alone holds a file system in the middle of its
/// writeback, with files allocated whose data ext4 had not yet marked written.
#[test]
fn log_thrown_away_with_destage_far_behind_leaves_a_remote_ext4_that_replays_and_fscks_clean() {
    let _serial = one_at_a_time();
    let mut behind = 0;
    for share in [0.25, 0.5, 0.75] {
        let store = stics_testkit::peers::FileLun::new(256);
        let spec = format!("disk(file:{}, model=o7n3200)", store.file.display());
        let remote = SticsTarget::with_luns(Path::new(BIN), IQN, &[&spec]);
        if log_thrown_away_after_sigkill(&remote, Some(share)) > 0 {
            behind += 1;
        }
    }
    assert!(behind > 0, "destage had caught up with the host at every kill");
}

/// Files on ext4 through a gateway in front of `remote`: a first batch synced and destaged, a
/// second synced, a third only written; then the gateway is killed, its log thrown away, its
/// claim broken, and the ext4 on the remote alone replayed, read and checked. With
/// `destaged_share`, the gateway dies once that share of what was dirty after the second sync is
/// on the remote. Returns how many bytes were dirty when it died.
fn log_thrown_away_after_sigkill(remote: &SticsTarget, destaged_share: Option<f64>) -> u64 {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("log");
    let (mut gw, port, metrics) = gateway_with_metrics(&remote.url(0), &log, "log", &dir.path().join("gw.log"));
    let e = first_batch_destaged(port, metrics, dir.path());
    // A second batch synced but only partly destaged (synced in steps when destage is far
    // behind, so that the kill falls between the commits of several), and a few files not even
    // synced.
    let step = if destaged_share.is_some() { 50 } else { 300 };
    for first in (300..600).step_by(step) {
        write_files(&e.fs, first..first + step as u64);
        run_ok(Command::new("sync").arg("-f").arg(&e.fs));
    }
    if let Some(share) = destaged_share {
        let dirty = |s: &serde_json::Value| s["dirty_bytes"].as_u64().unwrap_or(0) as f64;
        let until = dirty(&status(metrics)) * (1.0 - share);
        wait_status(metrics, Duration::from_secs(120), "destage under way", |s| dirty(s) <= until);
    }
    write_files(&e.fs, 600..610);
    let at_kill = status(metrics);
    gw.kill();
    // The export and the file system on it lose their LUN; then the log is lost too.
    drop(e);
    std::fs::remove_file(&log).unwrap();
    // The dead gateway still holds its persistent reservation, and with its log gone nothing can
    // take it back: the operator breaks it, naming the key a new gateway's refusal reports.
    let refused = refused_gateway(&remote.url(0), &dir.path().join("log2"), &dir.path().join("gw2.log"));
    let holder = refused
        .split("reservation key ")
        .nth(1)
        .and_then(|rest| rest.split(|c: char| !c.is_ascii_alphanumeric()).next())
        .unwrap_or_else(|| panic!("a second gateway names the holder's key: {refused}"))
        .to_owned();
    // Another key is refused, the holder's is released.
    let other = Command::new(BIN).args(["release", &remote.url(0), "--holder", "0x1234"]).output().unwrap();
    assert!(!other.status.success(), "a key that holds nothing is not preempted");
    let out = Command::new(BIN).args(["release", &remote.url(0), "--holder", &holder]).output().unwrap();
    assert!(out.status.success(), "stics release: {}", String::from_utf8_lossy(&out.stderr));
    let what = "the remote alone, after a SIGKILL and without the log";
    let left = survivor_files(&remote.url(0), dir.path(), "remote", what);
    eprintln!(
        "at the kill {} bytes dirty (destaged epoch {} of {}); on the remote alone, of 610 files: {left}",
        at_kill["dirty_bytes"], at_kill["destaged_epoch"], at_kill["epoch"]
    );
    at_kill["dirty_bytes"].as_u64().unwrap_or(0)
}

#[test]
fn ext4_on_the_gateway_runs_postmark_and_fscks_clean() {
    let _serial = one_at_a_time();
    let remote = SticsTarget::with_file_lun(Path::new(BIN), 256, &[]);
    let dir = tempfile::tempdir().unwrap();
    let (_gw, port, metrics) =
        gateway_with_metrics(&remote.url(0), &dir.path().join("log"), "log", &dir.path().join("gw.log"));
    let mut e = Export::start(&url(port), dir.path(), "gw");
    e.mkfs();
    // Mounted -o sync, so that PostMark's operations reach the gateway as they happen.
    e.mount_fs(",sync");
    let cfg = dir.path().join("postmark.cfg");
    let script = format!("set location {}\nset number 500\nset transactions 2000\nrun\nquit\n", e.fs.display());
    std::fs::write(&cfg, script).unwrap();
    let out = run_ok(Command::new("postmark").arg(&cfg));
    assert!(out.contains("Time:"), "{out}");
    e.umount_fs();
    e.fsck_clean("ext4 after PostMark through the gateway");
    e.stop();
    let s = status(metrics);
    let time = out.lines().find(|l| l.contains("seconds total")).unwrap_or_default();
    eprintln!("PostMark: {time}; gateway: {} log records, {} blocks destaged", s["records"], s["blocks_destaged"]);
}

#[test]
fn stics_mount_with_a_cache_log_keeps_written_data_across_a_restart() {
    use std::io::{Read, Seek, SeekFrom, Write};
    let remote = SticsTarget::with_file_lun(Path::new(BIN), 64, &[]);
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("lun");
    let log = format!("{}:512MiB", dir.path().join("log").display());
    let data: Vec<u8> = (0..4u32 << 20).map(|i| (i.wrapping_mul(40_503) >> 7) as u8).collect();
    let url = remote.url(0);
    let args = ["mount", "--cache-log", log.as_str(), "--cache-mode", "immediate", url.as_str()];
    for round in 0..2 {
        let mut args: Vec<&str> = args.to_vec();
        let f = file.to_str().unwrap();
        args.push(f);
        let mut m = spawn_stics(Path::new(BIN), &args, &[], Some(&dir.path().join(format!("mount{round}.log"))));
        assert!(wait_mounted(&file, true, Duration::from_secs(20)), "stics mount did not mount");
        let mut fh = std::fs::OpenOptions::new().read(true).write(true).open(&file).unwrap();
        if round == 0 {
            fh.seek(SeekFrom::Start(1 << 20)).unwrap();
            fh.write_all(&data).unwrap();
            fh.sync_all().unwrap();
        }
        let mut back = vec![0u8; data.len()];
        fh.seek(SeekFrom::Start(1 << 20)).unwrap();
        fh.read_exact(&mut back).unwrap();
        assert!(back == data, "round {round}: what was written through the in-process cache reads back");
        drop(fh);
        assert!(m.signal(libc::SIGTERM));
        assert!(m.wait_exit(Duration::from_secs(20)).is_some(), "stics mount stops on SIGTERM");
        assert!(wait_mounted(&file, false, Duration::from_secs(5)));
    }
}

#[test]
fn one_gateway_per_remote_lun_keeps_out_a_second_gateway_and_stray_writers() {
    use stics_block::BlockError;
    let remote = SticsTarget::with_file_lun(Path::new(BIN), 64, &[]);
    let dir = tempfile::tempdir().unwrap();
    let log_a = dir.path().join("log-a");
    let (mut gw, port) = gateway(&remote.url(0), &log_a, "log", &dir.path().join("a.log"));
    let (rt, lun) = open(port);
    let data = Bytes::from(vec![0x5a; 8192]);
    rt.block_on(lun.write(0, data.clone(), true)).unwrap();

    // (a) A second gateway, with its own log, on the same remote: refused at start.
    let stderr = refused_gateway(&remote.url(0), &dir.path().join("log-b"), &dir.path().join("b.log"));
    assert!(stderr.contains("another writer holds the remote LUN: reservation key 0x"), "{stderr}");

    // (b) A plain initiator on the remote reads, but its writes end in RESERVATION CONFLICT.
    let stray = rt.block_on(Lun::open(&IscsiUrl::parse(&remote.url(0)).unwrap(), &LunOptions::default())).unwrap();
    assert_eq!(rt.block_on(stray.read(1000, 1)).unwrap().len(), 512);
    let e = rt.block_on(stray.write(1000, Bytes::from(vec![1u8; 512]), false)).unwrap_err();
    assert!(matches!(e, BlockError::Reserved { holder: None }), "{e:?}");

    // (c) Gateway A killed and started again on its log: it takes the remote back and serves.
    gw.kill();
    drop(lun);
    let (_gw, port) = gateway(&remote.url(0), &log_a, "log", &dir.path().join("a2.log"));
    let u = IscsiUrl::parse(&url(port)).unwrap();
    let lun = rt.block_on(Lun::open(&u, &LunOptions::default())).unwrap();
    assert_eq!(rt.block_on(lun.read(0, 16)).unwrap(), data, "what was acknowledged before the kill");
    let more = Bytes::from(vec![0xa5; 4096]);
    rt.block_on(lun.write(64, more.clone(), true)).unwrap();
    assert_eq!(rt.block_on(lun.read(64, 8)).unwrap(), more);
    let a2 = std::fs::read_to_string(dir.path().join("a2.log")).unwrap();
    assert!(a2.contains("took the remote back"), "{a2}");
    let e = rt.block_on(stray.write(1000, Bytes::from(vec![1u8; 512]), false)).unwrap_err();
    assert!(matches!(e, BlockError::Reserved { holder: None }), "still kept out: {e:?}");
}

/// SIGKILL of the gateway at random moments of a random write workload, its remote a `stics
/// target` over a Ceph RBD image on the far side of an 8 ms (one-way) `stics wan` link: every
/// acknowledged write survives, nothing torn or misplaced.
#[cfg(feature = "rbd")]
#[test]
fn rbd_remote_behind_an_8_ms_wan_loses_no_acknowledged_write_across_gateway_sigkills() {
    use std::path::PathBuf;
    use stics_testkit::proc::{spawn, Guard};

    /// The WAN and, on its storage side, a Ceph cluster and a target over an image of it; torn
    /// down in that order (the cluster's daemons before their namespace).
    struct FarSide {
        remote: Guard,
        cluster: PathBuf,
        name: String,
        dir: tempfile::TempDir,
    }
    impl FarSide {
        fn wan(&self) -> Command {
            let mut c = Command::new(BIN);
            c.args(["wan", "--name", &self.name, "--runtime-dir"]).arg(self.dir.path().join("wan"));
            c
        }
        fn storage(&self, args: &[&str]) -> Command {
            let mut c = self.wan();
            c.args(["exec", "storage", "--"]).args(args);
            c
        }
    }
    impl Drop for FarSide {
        fn drop(&mut self) {
            self.remote.kill();
            let _ = Command::new("bash").arg(stics_testkit::ceph::script()).arg("stop").arg(&self.cluster).status();
            let _ = self.wan().arg("down").output();
        }
    }

    let _one = one_at_a_time();
    let dir = tempfile::tempdir().unwrap();
    let mut far = FarSide {
        remote: Guard::default(),
        cluster: dir.path().join("cluster"),
        name: format!("gr{}", std::process::id()),
        dir,
    };
    run_ok(far.wan().args(["up", "--delay", "8ms"]));
    let storage = run_ok(far.wan().args(["addr", "storage"])).trim().to_owned();
    let script = stics_testkit::ceph::script();
    let out = run_ok(&mut far.storage(&["bash", script.to_str().unwrap(), "start", far.cluster.to_str().unwrap()]));
    let conf = out.lines().last().unwrap().trim().to_owned();
    run_ok(&mut far.storage(&["rbd", "-c", &conf, "create", "--size", "64M", "rbd/gw"]));
    let lun = format!("rbd:rbd/gw?conf={conf}");
    let listen = format!("{storage}:3260");
    far.remote = spawn(
        &mut far.storage(&[BIN, "target", "--listen", &listen, "--iqn", IQN, "--lun", &lun]),
        Some(&far.dir.path().join("remote.log")),
    );
    let remote = format!("iscsi://{listen}/{IQN}/0");
    let host = PathBuf::from(format!("/run/netns/{}-host", far.name));
    let dir = far.dir.path().to_owned();
    // The gateways and the client run in the WAN's host namespace: this thread enters it, and
    // the processes and runtime threads it starts inherit it.
    std::thread::spawn(move || {
        let ns = std::fs::File::open(&host).unwrap();
        // SAFETY: setns on a namespace file this thread opened; it changes only this thread.
        let r = unsafe { libc::setns(std::os::fd::AsRawFd::as_raw_fd(&ns), libc::CLONE_NEWNET) };
        assert_eq!(r, 0, "setns into {}: {}", host.display(), std::io::Error::last_os_error());
        let t = Instant::now();
        while std::net::TcpStream::connect(&listen).is_err() {
            assert!(t.elapsed() < Duration::from_secs(30), "the remote target did not listen on {listen}");
            std::thread::sleep(Duration::from_millis(100));
        }
        sigkill_rounds_on(&remote, &dir, "log", 13, 50);
    })
    .join()
    .unwrap();
    assert!(far.remote.alive(), "the remote target served throughout");
}

/// A second `stics gateway` on the log a running one uses would take the remote back under the
/// same key and append at the same tail: it is refused before it touches the log or logs in,
/// naming the holder, and so is `stics mount --cache-log` on that log. The first serves on, and
/// once it is killed the log is free again.
#[test]
fn a_second_gateway_on_the_same_log_is_refused_naming_the_holder() {
    let remote = SticsTarget::with_file_lun(Path::new(BIN), 64, &[]);
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("log");
    let (mut a, port) = gateway(&remote.url(0), &log, "log", &dir.path().join("a.log"));
    let holder = format!("in use by process {}", a.pid());
    let (rt, lun) = open(port);
    let data = Bytes::from(vec![0x3c; 8192]);
    rt.block_on(lun.write(0, data.clone(), true)).unwrap();

    let said = refused_gateway(&remote.url(0), &log, &dir.path().join("b.log"));
    assert!(said.contains(&holder) && said.contains("stics gateway"), "the error names the holder: {said}");
    assert!(!said.contains("took the remote back"), "refused before claiming the remote: {said}");

    let file = dir.path().join("lun");
    std::fs::File::create(&file).unwrap();
    let m_err = dir.path().join("mount.log");
    let (cache_log, remote_url) = (format!("{}:256MiB", log.display()), remote.url(0));
    let args = ["mount", "--cache-log", cache_log.as_str(), remote_url.as_str(), file.to_str().unwrap()];
    let mut m = spawn_stics(Path::new(BIN), &args, &[], Some(&m_err));
    let exited = m.wait_exit(Duration::from_secs(20));
    let said = std::fs::read_to_string(&m_err).unwrap_or_default();
    assert!(exited.is_some_and(|s| !s.success()), "stics mount on the same log must fail ({exited:?}): {said}");
    assert!(said.contains(&holder), "the error names the holder: {said}");

    assert!(a.alive(), "the first gateway still runs");
    assert_eq!(rt.block_on(lun.read(0, 16)).unwrap(), data, "the first gateway still reads back what it took");
    let more = Bytes::from(vec![0xc3; 4096]);
    rt.block_on(lun.write(64, more.clone(), true)).unwrap();
    assert_eq!(rt.block_on(lun.read(64, 8)).unwrap(), more, "and still takes writes");

    // SIGKILL leaves no lock behind: the next gateway on the log serves what was acknowledged.
    a.kill();
    drop(lun);
    let (_c, port) = gateway(&remote.url(0), &log, "log", &dir.path().join("c.log"));
    let (rt2, lun) = open(port);
    assert_eq!(rt2.block_on(lun.read(0, 16)).unwrap(), data);
    assert_eq!(rt2.block_on(lun.read(64, 8)).unwrap(), more);
}

#[test]
fn write_through_reads_through_the_gateway_return_what_was_just_written() {
    // Write-through writes bypassed the cache's core: a block read once (and so in the read
    // cache) read back its old content after it was written, for 40 of 40 blocks tried.
    let remote = SticsTarget::with_file_lun(Path::new(BIN), 64, &[]);
    let dir = tempfile::tempdir().unwrap();
    let (_gw, port) = gateway(&remote.url(0), &dir.path().join("log"), "write-through", &dir.path().join("gw.log"));
    let (rt, lun) = open(port);
    for i in 0..40u64 {
        let lba = i * 64;
        rt.block_on(lun.read(lba, 8)).unwrap();
        let new = stamp_run(lba, 8, i + 1, 512);
        rt.block_on(lun.write(lba, new.clone(), false)).unwrap();
        assert_eq!(rt.block_on(lun.read(lba, 8)).unwrap(), new, "block {lba} right after it was written");
    }
    // And the remote has each at once.
    let (rt2, direct) = open_url(&remote.url(0));
    for i in 0..40u64 {
        let got = rt2.block_on(direct.read(i * 64, 8)).unwrap();
        assert!(check_at(&got[..512], i * 64, i + 1..=i + 1).is_ok(), "block {} on the remote", i * 64);
    }
}

#[test]
fn write_through_restarted_over_a_log_with_dirty_data_serves_and_keeps_the_newest_write() {
    // A gateway restarted in write-through mode over a log that still held dirty data served the
    // logged version, and destage later wrote it over the newer write on the remote.
    let remote = SticsTarget::with_file_lun(Path::new(BIN), 64, &[]);
    let proxy = Proxy::start(remote.port);
    let via = format!("iscsi://127.0.0.1:{}/{IQN}/0", proxy.port);
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("log");
    let (mut gw, port, metrics) = gateway_with_metrics(&via, &log, "log", &dir.path().join("gw.log"));
    proxy.freeze(true);
    proxy.cut();
    let (rt, lun) = open(port);
    for i in 0..20u64 {
        rt.block_on(lun.write(i * 16, stamp_run(i * 16, 8, 1, 512), false)).unwrap();
    }
    assert!(status(metrics)["dirty_bytes"].as_u64().unwrap() > 0, "the remote is cut off: all of it dirty");
    gw.kill();
    drop(lun);
    proxy.freeze(false);
    let (_gw, port, metrics) = gateway_with_metrics(&via, &log, "write-through", &dir.path().join("gw2.log"));
    let (rt, lun) = open(port);
    for i in 0..20u64 {
        let lba = i * 16;
        assert!(check_at(&rt.block_on(lun.read(lba, 1)).unwrap(), lba, 1..=1).is_ok(), "block {lba} from the log");
        let newer = stamp_run(lba, 8, 2, 512);
        rt.block_on(lun.write(lba, newer.clone(), false)).unwrap();
        assert_eq!(rt.block_on(lun.read(lba, 8)).unwrap(), newer, "block {lba} after the newer write");
    }
    let drained: serde_json::Value = serde_json::from_str(&http(metrics, "POST /drain")).unwrap();
    assert_eq!(drained["dirty_bytes"], 0);
    let (rt2, direct) = open_url(&remote.url(0));
    for i in 0..20u64 {
        let got = rt2.block_on(direct.read(i * 16, 8)).unwrap();
        assert!(check_at(&got[..512], i * 16, 2..=2).is_ok(), "block {} on the remote holds the newer write", i * 16);
    }
}

#[test]
fn discarding_a_whole_terabyte_lun_keeps_the_gateway_within_its_memory_also_across_a_sigkill() {
    // The dirty index cost memory per block: UNMAP of 4 GiB grew a gateway from 9 to 1,531 MiB,
    // and recovery rebuilt the same index, so a restart died too.
    const TIB: u64 = 1 << 40;
    const RAM_MIB: u64 = 8;
    const READ_CACHE_MIB: u64 = 16;
    // The gateway's own configured memory, and the 64 MiB the issue allows beyond it.
    const BOUND_KIB: u64 = (RAM_MIB + READ_CACHE_MIB + 64) << 10;
    let _serial = one_at_a_time();
    let remote = SticsTarget::with_luns(Path::new(BIN), IQN, &["null:1TiB"]);
    let proxy = Proxy::start(remote.port);
    let via = format!("iscsi://127.0.0.1:{}/{IQN}/0", proxy.port);
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("log");
    let extra = ["--read-cache", "16MiB", "--metrics"];
    let start = |name: &str| {
        let metrics = free_port();
        let m = format!("127.0.0.1:{metrics}");
        let (g, port) = gateway_with(&via, &log, "log", &dir.path().join(name), &[extra[0], extra[1], extra[2], &m]);
        assert!(wait_port(metrics, Duration::from_secs(20)));
        (g, port, metrics)
    };
    let (mut gw, port, metrics) = start("gw.log");
    let (rt, lun) = open(port);
    // The remote cut off: every discard stays dirty in the log and in the index.
    proxy.freeze(true);
    proxy.cut();
    assert_eq!(lun.geometry().bytes(), TIB);
    let blocks = lun.geometry().num_blocks;
    let mut peak = gw.rss_kib().unwrap();
    // Half of it, in 64 GiB discards (each many UNMAP commands), watching the gateway's size.
    let step = (64u64 << 30) / 512;
    let mut at = 0;
    while at < blocks / 2 {
        rt.block_on(lun.discard(at, step)).unwrap();
        at += step;
        peak = peak.max(gw.rss_kib().unwrap());
    }
    let s = status(metrics);
    assert_eq!(s["dirty_bytes"].as_u64().unwrap(), TIB / 2, "{s}");
    assert!(s["index_extents"].as_u64().unwrap() < 100_000, "{s}");
    assert!(peak < BOUND_KIB, "discarding half of 1 TiB took the gateway to {peak} KiB (bound {BOUND_KIB})");
    gw.kill();
    drop(lun);
    drop(rt);
    // The restart recovers the same index from the log, then takes the other half. It claims
    // the remote before it serves: the link is back for that, but destage stays held back.
    proxy.freeze(false);
    let (gw, port, metrics) = start("gw2.log");
    let recovered = gw.rss_kib().unwrap();
    proxy.freeze(true);
    proxy.cut();
    let (rt, lun) = open(port);
    while at < blocks {
        let n = step.min(blocks - at);
        rt.block_on(lun.discard(at, n)).unwrap();
        at += n;
        peak = peak.max(gw.rss_kib().unwrap());
    }
    assert!(recovered < BOUND_KIB, "recovering the log took the gateway to {recovered} KiB (bound {BOUND_KIB})");
    assert!(peak < BOUND_KIB, "discarding all of 1 TiB took the gateway to {peak} KiB (bound {BOUND_KIB})");
    assert!(status(metrics)["dirty_bytes"].as_u64().unwrap() >= TIB / 2);
    // Back on the link, destage sends it all as a few commands and the LUN reads zeros.
    proxy.freeze(false);
    wait_status(metrics, Duration::from_secs(120), "clean once the link is back", |s| s["dirty_bytes"] == 0);
    peak = peak.max(gw.rss_kib().unwrap());
    assert!(peak < BOUND_KIB, "destaging took the gateway to {peak} KiB (bound {BOUND_KIB})");
    for lba in [0, blocks / 3, blocks - 8] {
        assert!(rt.block_on(lun.read(lba, 8)).unwrap().iter().all(|&b| b == 0), "block {lba} reads zeros");
    }
    eprintln!("1 TiB discarded through the gateway: peak {peak} KiB, {recovered} KiB after recovering half of it");
}

#[test]
fn sequential_reads_keep_their_read_ahead_while_destage_runs() {
    // Read-ahead data was thrown away whenever any epoch reached the remote, so while destage
    // ran every sequential read went to the remote: 16.7 ms each at 8 ms one way, against
    // 0.25 ms after a drain. Here a writer keeps destage busy with flushed writes between the
    // reads, and the reads must still come mostly from the read-ahead.
    let remote = SticsTarget::with_file_lun(Path::new(BIN), 256, &[]);
    let (rt0, direct) = open_url(&remote.url(0));
    // The remote's blocks hold data, not holes.
    for mib in 0..64u64 {
        let lba = mib * 2048;
        rt0.block_on(direct.write(lba, stamp_run(lba, 2048, 1, 512), false)).unwrap();
    }
    drop(direct);
    let dir = tempfile::tempdir().unwrap();
    let (_gw, port, metrics) =
        gateway_with_metrics(&remote.url(0), &dir.path().join("log"), "immediate", &dir.path().join("gw.log"));
    let (rt, lun) = open(port);
    let (reads, writes_per_read) = (1000u64, 4u64);
    let mut w = 0u64;
    let before = status(metrics);
    for i in 0..reads {
        for _ in 0..writes_per_read {
            w += 1;
            let lba = 200_000 + (w % 4000) * 8;
            rt.block_on(lun.write(lba, stamp_run(lba, 1, w, 512), false)).unwrap();
            rt.block_on(lun.flush()).unwrap();
        }
        let lba = i * 16;
        let got = rt.block_on(lun.read(lba, 16)).unwrap();
        assert!(check_at(&got[..512], lba, 1..=1).is_ok(), "block {lba}");
    }
    let after = status(metrics);
    let n = |k: &str| after[k].as_u64().unwrap() - before[k].as_u64().unwrap();
    // Each block read is looked up in the read cache once (nothing else looks there).
    let (hits, misses) = (n("read_cache_hits"), n("read_cache_misses"));
    assert_eq!(hits + misses, reads * 16);
    assert!(n("blocks_destaged") > 0 && after["destaged_epoch"].as_u64() > before["destaged_epoch"].as_u64());
    assert!(misses * 4 < reads * 16, "{misses} of {} blocks read missed the read cache while destage ran", reads * 16);
    eprintln!("sequential reads while destage ran: {hits} blocks from the read cache, {misses} missed it");
}

/// tgt keeps persistent-reservation registrations per session, so a gateway whose connection to
/// it was cut comes back to a LUN that refuses its writes and its SYNCHRONIZE CACHE with
/// RESERVATION CONFLICT until it claims it again. The cut is timed with a SYNCHRONIZE CACHE on
/// its way to tgt, the case that stalled destage: the flush was reissued on the new session,
/// refused, retried every 200 ms forever, and POST /drain never answered. Destage must take the
/// claim back and go on.
#[test]
fn a_connection_cut_between_the_gateway_and_tgt_does_not_stall_destage() {
    const BLOCKS: u64 = 4096;
    let seed = 41;
    let tgt = stics_testkit::peers::Tgt::start(16);
    let proxy = SyncCut::start(tgt.port);
    let dir = tempfile::tempdir().unwrap();
    let stderr = dir.path().join("gw.log");
    let (mut gw, port, metrics) =
        gateway_with_metrics(&tgt.url_via(proxy.port), &dir.path().join("log"), "log", &stderr);
    let ledger = Ledger::new(BLOCKS, 512, Durable::OnAck);
    let acked = ledger.acked();
    let stop = Arc::new(AtomicBool::new(false));
    let pace = Pace { pause: Some(Duration::from_micros(500)), flush_one_in: 1, timeout: None };
    let w = writer(port, ledger, seed, pace, Arc::clone(&stop));
    std::thread::sleep(Duration::from_secs(2));
    proxy.arm();
    let armed = Instant::now();
    while !proxy.fired() {
        assert!(armed.elapsed() < Duration::from_secs(20), "no SYNCHRONIZE CACHE reached tgt in 20 s");
        std::thread::sleep(Duration::from_millis(10));
    }
    let before = acked.load(Ordering::Relaxed);
    std::thread::sleep(Duration::from_secs(2));
    let after_cut = acked.load(Ordering::Relaxed) - before;
    stop.store(true, Ordering::Relaxed);
    let (mut ledger, err) = w.join().unwrap();
    assert!(err.is_none(), "seed {seed}: a write through the gateway failed: {err:?}");
    assert!(after_cut > 0, "seed {seed}: writes went on after the cut");
    let t = Instant::now();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(http(metrics, "POST /drain"));
    });
    let drained = rx.recv_timeout(Duration::from_secs(60)).unwrap_or_else(|_| {
        panic!(
            "POST /drain did not answer within 60 s: {}; the gateway said:\n{}",
            status(metrics),
            std::fs::read_to_string(&stderr).unwrap_or_default()
        )
    });
    let drained: serde_json::Value = serde_json::from_str(&drained).unwrap();
    assert_eq!(drained["dirty_bytes"], 0, "after POST /drain: {drained}");
    let drain_took = t.elapsed();
    gw.kill();
    let (rt, lun) = open_url(&tgt.url());
    rt.block_on(ledger.verify(&lun, &format!("seed {seed}: tgt alone after the cut and POST /drain")));
    eprintln!(
        "{} writes acknowledged, {after_cut} in the 2 s after the cut; drain took {drain_took:?}",
        acked.load(Ordering::Relaxed)
    );
}

/// A loopback TCP proxy to `127.0.0.1:upstream` that, once armed, cuts the connection that
/// carries the next SYNCHRONIZE CACHE, before the target sees it.
struct SyncCut {
    port: u16,
    armed: Arc<AtomicBool>,
    fired: Arc<AtomicBool>,
    stop: Arc<AtomicBool>,
}

impl SyncCut {
    fn start(upstream: u16) -> SyncCut {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        listener.set_nonblocking(true).unwrap();
        let p = SyncCut { port, armed: Arc::default(), fired: Arc::default(), stop: Arc::default() };
        let (armed, fired, stop) = (Arc::clone(&p.armed), Arc::clone(&p.fired), Arc::clone(&p.stop));
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                let Ok((down, _)) = listener.accept() else {
                    std::thread::sleep(Duration::from_millis(5));
                    continue;
                };
                let Ok(up) = std::net::TcpStream::connect(("127.0.0.1", upstream)) else { continue };
                let _ = (down.set_nonblocking(false), down.set_nodelay(true), up.set_nodelay(true));
                let (Ok(down2), Ok(up2)) = (down.try_clone(), up.try_clone()) else { continue };
                std::thread::spawn(move || copy(up2, down2));
                let (armed, fired) = (Arc::clone(&armed), Arc::clone(&fired));
                std::thread::spawn(move || forward_until_sync(down, up, &armed, &fired));
            }
        });
        p
    }

    fn arm(&self) {
        self.armed.store(true, Ordering::SeqCst);
    }

    /// True once a connection was cut.
    fn fired(&self) -> bool {
        self.fired.load(Ordering::SeqCst)
    }
}

impl Drop for SyncCut {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

fn copy(mut from: std::net::TcpStream, mut to: std::net::TcpStream) {
    let _ = std::io::copy(&mut from, &mut to);
    let _ = to.shutdown(std::net::Shutdown::Both);
}

/// Forwards whole PDUs (no digests: the gateway offers none) from initiator to target; when
/// armed, closes both sides instead of forwarding a SCSI Command PDU whose CDB is SYNCHRONIZE
/// CACHE (10) or (16).
fn forward_until_sync(
    mut down: std::net::TcpStream,
    mut up: std::net::TcpStream,
    armed: &AtomicBool,
    fired: &AtomicBool,
) {
    use std::io::{Read, Write};
    let mut buf = Vec::new();
    let mut chunk = vec![0u8; 1 << 16];
    loop {
        let n = match down.read(&mut chunk) {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        buf.extend_from_slice(&chunk[..n]);
        while let Ok(len) = stics_wire::frame::check(&buf, stics_wire::Digests::default(), 1 << 24) {
            let is_sync = buf[0] & 0x3f == 0x01 && matches!(buf[32], 0x35 | 0x91);
            if is_sync && armed.swap(false, Ordering::SeqCst) {
                let _ = down.shutdown(std::net::Shutdown::Both);
                let _ = up.shutdown(std::net::Shutdown::Both);
                fired.store(true, Ordering::SeqCst);
                return;
            }
            if up.write_all(&buf[..len]).is_err() {
                break;
            }
            buf.drain(..len);
        }
    }
    let _ = up.shutdown(std::net::Shutdown::Both);
}

#[test]
fn max_lag_bounds_how_far_a_slow_remote_falls_behind_a_faster_host() {
    // --max-lag held only in front of a stics SG: over any other remote the gateway took writes
    // as fast as its log did, and the remote fell as far behind as the log's size allowed.
    let remote = SticsTarget::with_luns(Path::new(BIN), IQN, &["disk(mem:256MiB, model=as010a1)"]);
    let dir = tempfile::tempdir().unwrap();
    let (_gw, port, metrics) = gateway_with_metrics_and(
        &remote.url(0),
        &dir.path().join("log"),
        "log",
        &dir.path().join("gw.log"),
        &["--max-lag", "2"],
    );
    let (rt, lun) = open(port);
    let started = Instant::now();
    let (mut worst, mut polled, mut written) = (0.0f64, started, 0u64);
    // 64 KiB writes scattered over the LUN: the disk model seeks for each.
    let spread = (256 << 20) / (64 << 10);
    while started.elapsed() < Duration::from_secs(12) {
        let lba = (written * 7919 % spread) * 128;
        rt.block_on(lun.write(lba, stamp_run(lba, 128, written, 512), false)).unwrap();
        written += 1;
        if polled.elapsed() >= Duration::from_millis(100) {
            worst = worst.max(status(metrics)["destage_lag_secs"].as_f64().expect("lag"));
            polled = Instant::now();
        }
    }
    assert!(worst < 3.0, "the remote fell {worst:.2} s behind under --max-lag 2");
    let s = status(metrics);
    assert!(s["remote_write_bytes"].as_u64().unwrap_or(0) > 0, "destage moved nothing: {s}");
    http(metrics, "POST /drain");
    let (rt2, direct) = open_url(&remote.url(0));
    let last = written - 1;
    let lba = (last * 7919 % spread) * 128;
    assert_eq!(rt2.block_on(direct.read(lba, 128)).unwrap(), stamp_run(lba, 128, last, 512), "the last write");
    drop((rt, lun));
}
