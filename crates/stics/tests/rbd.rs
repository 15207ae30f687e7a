//! `stics target` over Ceph RBD images (`rbd:POOL/IMAGE`) on throwaway clusters
//! (`scripts/ceph-cluster.sh`; one shared by the single-OSD tests): libiscsi's suite, qemu-img in and out with `rbd export`
//! seeing what was written, ext4 and PostMark, one writer per image under RBD's exclusive lock,
//! read-only snapshots, an unreachable cluster, and an OSD lost under a verified workload.
//! Built only with the `rbd` feature; without a cluster these tests fail, they never skip.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use bytes::Bytes;
use stics_block::BlockDev;
use stics_initiator::{IscsiUrl, Lun, LunOptions};
use stics_testkit::ceph::Ceph;
use stics_testkit::net::free_port;
use stics_testkit::peers::{SticsOptions, SticsTarget};
use stics_testkit::proc::{one_at_a_time, run_ok, spawn_stics, wait_mounted, Guard};

const BIN: &str = env!("CARGO_BIN_EXE_stics");
const IQN: &str = stics_testkit::IQN;

/// `stics target` serving `luns`, its stderr in `log`.
fn target(luns: &[&str], log: &Path) -> SticsTarget {
    let mut args = Vec::new();
    for l in luns {
        args.extend(["--lun".to_owned(), (*l).to_owned()]);
    }
    let options = SticsOptions {
        iqn: Some(IQN.into()),
        args,
        env: vec![("RUST_LOG".into(), "info".into())],
        stderr: Some(log.to_owned()),
    };
    SticsTarget::start(Path::new(BIN), options)
}

/// Runs `stics target` with `lun`, expecting it to refuse to start; its stderr and how long it took.
fn refused(lun: &str, limit: Duration) -> (String, Duration) {
    let t = Instant::now();
    let log = tempfile::NamedTempFile::new().unwrap();
    let listen = format!("127.0.0.1:{}", free_port());
    let args = ["target", "--listen", &listen, "--iqn", IQN, "--lun", lun];
    let mut g = spawn_stics(Path::new(BIN), &args, &[], Some(log.path()));
    let status = g.wait_exit(limit);
    let took = t.elapsed();
    let err = std::fs::read_to_string(log.path()).unwrap_or_default();
    let status =
        status.unwrap_or_else(|| panic!("stics target neither served nor refused {lun} within {limit:?}:\n{err}"));
    assert!(!status.success(), "stics target served {lun} where it should have refused:\n{err}");
    (err, took)
}

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap()
}

fn open(rt: &tokio::runtime::Runtime, url: &str) -> Lun {
    let u = IscsiUrl::parse(url).unwrap();
    rt.block_on(Lun::open(&u, &LunOptions::default())).unwrap_or_else(|e| panic!("open {url}: {e}"))
}

fn sha256(path: &Path) -> String {
    let out = run_ok(Command::new("sha256sum").arg(path));
    out.split_whitespace().next().unwrap().to_owned()
}

#[test]
fn rbd_lun_passes_iscsi_test_cu_all() {
    let _one = one_at_a_time();
    let ceph = Ceph::shared();
    ceph.create_image("cu", "1G");
    let lun = ceph.spec("cu", "");
    let keep = tempfile::tempdir().unwrap();
    let out = Command::new(BIN)
        .args(["bench", "conformance", "--stics-only", "--json", "--lun", &lun, "--keep"])
        .arg(keep.path())
        .output()
        .expect("run stics bench conformance");
    let stdout = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        let kept = keep.keep();
        panic!(
            "conformance failures on {lun} (raw logs kept in {}):\n{stdout}\n{}",
            kept.display(),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let report: serde_json::Value = serde_json::from_str(&stdout).expect("a JSON report");
    let row = &report["sections"][0]["rows"][0];
    assert_eq!(row["tests"], 230.0, "every test of the suite ran: {row}");
    assert_eq!(row["failed"], 0.0, "no failed test: {report}");
}

#[test]
fn rbd_lun_carries_qemu_img_ext4_and_postmark_and_rbd_export_sees_what_was_written() {
    let _one = one_at_a_time();
    let ceph = Ceph::shared();
    ceph.create_image("disk", "256M");
    let dir = ceph.dir();
    let t = target(&[&ceph.spec("disk", "")], &dir.join("target.log"));
    let url = format!("iscsi://127.0.0.1:{}/{IQN}/0", t.port);

    // qemu-img convert in and out: the same bytes come back, and the cluster holds them.
    let src = dir.join("src.img");
    std::fs::write(&src, stics_testkit::pattern::noise(42, 64 << 20)).unwrap();
    run_ok(Command::new("qemu-img").args(["convert", "-n", "-f", "raw", "-O", "raw"]).arg(&src).arg(&url));
    let back = dir.join("back.img");
    run_ok(Command::new("qemu-img").args(["convert", "-f", "raw", "-O", "raw", &url]).arg(&back));
    let mut want = std::fs::read(&src).unwrap();
    want.resize(256 << 20, 0);
    std::fs::write(&src, &want).unwrap();
    assert_eq!(sha256(&back), sha256(&src), "qemu-img read back what it wrote");
    let exported = dir.join("export.img");
    ceph.rbd(&["export", "--no-progress", "rbd/disk", exported.to_str().unwrap()]);
    assert_eq!(sha256(&exported), sha256(&src), "rbd export holds what the client wrote");

    // ext4 on `stics mount` of the LUN, PostMark, a clean fsck.
    let file = dir.join("lun");
    std::fs::File::create(&file).unwrap();
    let mut mount = spawn_stics(Path::new(BIN), &["mount", &url, file.to_str().unwrap()], &[], None);
    assert!(wait_mounted(&file, true, Duration::from_secs(10)), "stics mount did not mount");
    let fs = dir.join("fs");
    std::fs::create_dir(&fs).unwrap();
    run_ok(Command::new("mkfs.ext4").args(["-F", "-q"]).arg(&file));
    run_ok(Command::new("mount").args(["-o", "loop"]).arg(&file).arg(&fs));
    let cfg = dir.join("postmark.cfg");
    std::fs::write(&cfg, format!("set location {}\nset number 300\nset transactions 3000\nrun\nquit\n", fs.display()))
        .unwrap();
    let pm = Command::new("postmark").arg(&cfg).output().unwrap();
    run_ok(Command::new("umount").arg(&fs));
    stics_bench::exp::fs::released(&file, Duration::from_secs(60)).unwrap();
    let fsck = Command::new("e2fsck").arg("-fn").arg(&file).output().unwrap();
    assert!(mount.signal(libc::SIGTERM));
    assert!(mount.wait_exit(Duration::from_secs(10)).is_some_and(|s| s.success()), "stics mount stopped cleanly");
    let pm = String::from_utf8_lossy(&pm.stdout);
    assert!(pm.contains("Time:"), "PostMark ran: {pm}");
    assert!(fsck.status.success(), "e2fsck: {}", String::from_utf8_lossy(&fsck.stdout));
    // What the file system wrote is in the cluster too.
    drop(t);
    std::fs::remove_file(&exported).unwrap();
    ceph.rbd(&["export", "--no-progress", "rbd/disk", exported.to_str().unwrap()]);
    let fsck = Command::new("e2fsck").arg("-fn").arg(&exported).output().unwrap();
    assert!(fsck.status.success(), "the exported image fscks clean: {}", String::from_utf8_lossy(&fsck.stdout));
}

#[test]
fn rbd_image_has_one_writer_and_snapshots_are_served_read_only() {
    let _one = one_at_a_time();
    let ceph = Ceph::shared();
    ceph.create_image("one", "64M");
    let dir = ceph.dir();
    let spec = ceph.spec("one", "");
    let mut first = target(&[&spec], &dir.join("first.log"));
    let rt = rt();
    let lun = open(&rt, &first.url(0));
    rt.block_on(lun.write(0, Bytes::from(vec![0x5au8; 4096]), true)).unwrap();
    rt.block_on(lun.close());
    ceph.rbd(&["snap", "create", "rbd/one@s1"]);

    // A second target refuses the image while the first holds it, and says who does.
    let (err, _) = refused(&spec, Duration::from_secs(30));
    assert!(err.contains("rbd/one") && err.contains("in use by another writer"), "{err}");

    // A snapshot may be served beside the writer: read-only, with the snapshot's data.
    let snap = target(&[&ceph.spec("one@s1", "")], &dir.join("snap.log"));
    let s = open(&rt, &snap.url(0));
    assert_eq!(rt.block_on(s.read(0, 8)).unwrap(), Bytes::from(vec![0x5au8; 4096]));
    let e = rt.block_on(s.write(0, Bytes::from(vec![1u8; 512]), false)).expect_err("a snapshot is read-only");
    assert!(e.to_string().contains("sense key 0x7 asc 0x27"), "DATA PROTECT, WRITE PROTECTED: {e}");
    rt.block_on(s.close());
    drop(snap);

    // The writer is lost without a goodbye: once the cluster notices (its watch times out), a
    // new target takes the image over.
    first.kill();
    let t = Instant::now();
    let second = loop {
        let port = free_port();
        let log = dir.join("second.log");
        let mut g: Guard = spawn_stics(
            Path::new(BIN),
            &["target", "--listen", &format!("127.0.0.1:{port}"), "--iqn", IQN, "--lun", &spec],
            &[],
            Some(&log),
        );
        if stics_testkit::proc::wait_port(port, Duration::from_secs(20)) && g.alive() {
            break (g, port);
        }
        g.kill();
        assert!(
            t.elapsed() < Duration::from_secs(90),
            "no target could take the image over: {:?}",
            std::fs::read_to_string(&log)
        );
    };
    eprintln!("a new writer took the image over {:?} after the old one was killed", t.elapsed());
    let lun = open(&rt, &format!("iscsi://127.0.0.1:{}/{IQN}/0", second.1));
    assert_eq!(rt.block_on(lun.read(0, 8)).unwrap(), Bytes::from(vec![0x5au8; 4096]));
    rt.block_on(lun.write(8, Bytes::from(vec![7u8; 512]), true)).unwrap();
    rt.block_on(lun.close());
}

#[test]
fn rbd_cluster_out_of_reach_is_refused_within_the_time_limit() {
    let dir = tempfile::tempdir().unwrap();
    let conf = dir.path().join("ceph.conf");
    std::fs::write(&conf, format!("[global]\nmon host = v1:127.0.0.1:{}\nauth client required = none\n", free_port()))
        .unwrap();
    let spec = format!("rbd:rbd/img?conf={}&timeout=3", conf.display());
    let (err, took) = refused(&spec, Duration::from_secs(30));
    assert!(err.contains("cannot reach the Ceph cluster"), "{err}");
    assert!(took < Duration::from_secs(15), "refused only after {took:?}");
}

#[test]
fn rbd_osd_killed_under_verified_writes_reaches_no_client() {
    let _one = one_at_a_time();
    let ceph = Ceph::start(3);
    ceph.create_image("nodes", "64M");
    let t = target(&[&ceph.spec("nodes", "")], &ceph.dir().join("target.log"));
    let c = stics_testkit::workload::run_with_fault(&t.url(0), 25, || {
        std::thread::sleep(Duration::from_secs(5));
        ceph.kill_osd(1);
    });
    assert!(c.commands > 0);
    let status = ceph.ceph(&["osd", "stat"]);
    assert!(status.contains("2 up"), "osd.1 is down: {status}");
}
