//! `stics gateway` as a process in front of a `stics target` process: libiscsi's conformance
//! suite through it in `log` and `immediate` modes, `qemu-img convert` in and out, SIGKILL at
//! random moments of a verified write workload with restarts on the same log, and one writer per
//! remote LUN (a second gateway and stray initiators are kept out).

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use bytes::Bytes;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use stics_block::BlockDev;
use stics_initiator::{IscsiUrl, Lun, LunOptions};
use stics_testkit::net::free_port;
use stics_testkit::pattern::{check, stamp_run, Bad};
use stics_testkit::peers::SticsTarget;
use stics_testkit::proc::{spawn, wait_port, Guard};

const BIN: &str = env!("CARGO_BIN_EXE_stics");
const GATEWAY_IQN: &str = "iqn.2024-01.org.stics.test:gateway";

/// A gateway process on a free port, in front of `remote`, with its log at `log`.
fn gateway(remote: &str, log: &Path, mode: &str, stderr: &Path) -> (Guard, u16) {
    let port = free_port();
    let mut cmd = Command::new(BIN);
    cmd.args(["gateway", "--listen", &format!("127.0.0.1:{port}"), "--iqn", GATEWAY_IQN, "--remote", remote]).args([
        "--log",
        &format!("{}:256MiB", log.display()),
        "--mode",
        mode,
        "--ram",
        "8MiB",
    ]);
    let g = spawn(&mut cmd, Some(stderr));
    assert!(wait_port(port, Duration::from_secs(20)), "the gateway did not listen; see {}", stderr.display());
    (g, port)
}

fn url(port: u16) -> String {
    format!("iscsi://127.0.0.1:{port}/{GATEWAY_IQN}/0")
}

#[test]
fn iscsi_test_cu_all_has_no_failures_through_the_gateway_in_each_mode() {
    let root = concat!(env!("CARGO_MANIFEST_DIR"), "/../..");
    for mode in ["log", "immediate"] {
        let remote = SticsTarget::with_file_lun(Path::new(BIN), 1024, &[]);
        let dir = tempfile::tempdir().unwrap();
        let (_gw, port) = gateway(&remote.url(0), &dir.path().join("log"), mode, &dir.path().join("gw.log"));
        let log = dir.path().join("cu.log");
        let out = Command::new("iscsi-test-cu").args(["-d", "--test=ALL", &url(port)]).output().expect("iscsi-test-cu");
        std::fs::write(&log, [out.stdout, out.stderr].concat()).unwrap();
        let parsed = Command::new("python3").arg(format!("{root}/scripts/cu-parse.py")).arg(&log).output().unwrap();
        let json: serde_json::Value = serde_json::from_slice(&parsed.stdout).expect("cu-parse.py output");
        assert_eq!(json["tests"], 230, "{mode}: every test ran: {json}");
        assert_eq!(json["failed"], serde_json::json!([]), "{mode}: no failures: {json}");
    }
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

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap()
}

/// The gateway's LUN through the initiator, with the runtime its sessions run on.
fn open(port: u16) -> (tokio::runtime::Runtime, Lun) {
    let rt = runtime();
    let u = IscsiUrl::parse(&url(port)).unwrap();
    let lun = rt.block_on(Lun::open(&u, &LunOptions::default())).unwrap();
    (rt, lun)
}

/// Versions of blocks 0..n (0: never written).
fn versions(bytes: &[u8], n: u64) -> Vec<u64> {
    (0..n)
        .map(|b| match check(&bytes[b as usize * 512..(b as usize + 1) * 512]) {
            Ok((lba, v)) if lba == b => v,
            Err(Bad::Blank) => 0,
            other => panic!("block {b} is {other:?}"),
        })
        .collect()
}

#[test]
fn sigkill_at_random_moments_loses_no_acknowledged_write() {
    const BLOCKS: u64 = 2048;
    let remote = SticsTarget::with_file_lun(Path::new(BIN), 64, &[]);
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("log");
    let mut rng = StdRng::seed_from_u64(7);
    // The newest acknowledged version of each block, and every version written since.
    let mut acked = vec![0u64; BLOCKS as usize];
    let mut version = 0u64;
    for round in 0..12 {
        let (mut gw, port) = gateway(&remote.url(0), &log, "log", &dir.path().join(format!("gw{round}.log")));
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
        let u = IscsiUrl::parse(&url(port)).unwrap();
        let lun = rt.block_on(Lun::open(&u, &LunOptions::default())).unwrap();
        // Everything acknowledged before the last kill reads back.
        let seen = versions(&rt.block_on(lun.read(0, BLOCKS as u32)).unwrap(), BLOCKS);
        for b in 0..BLOCKS as usize {
            assert!(
                seen[b] >= acked[b],
                "round {round}: block {b} shows version {} after {} was acknowledged",
                seen[b],
                acked[b]
            );
        }
        acked = seen;
        // Writes until the kill, which comes at a random moment.
        let kill_after = Duration::from_millis(rng.gen_range(50..600));
        let started = std::time::Instant::now();
        let mut seed = rng.gen::<u64>();
        rt.block_on(async {
            loop {
                if started.elapsed() >= kill_after {
                    break;
                }
                seed = seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
                let blocks = 1 + (seed >> 40) % 16;
                let lba = (seed >> 8) % (BLOCKS - blocks);
                version += 1;
                let data = Bytes::from(stamp_run(lba, blocks, version, 512));
                if lun.write(lba, data, false).await.is_err() {
                    break;
                }
                for b in lba..lba + blocks {
                    acked[b as usize] = version;
                }
            }
        });
        gw.kill();
        drop(lun);
        drop(rt);
    }
    // A last start on the same log: every acknowledged write is still there.
    let (_gw, port) = gateway(&remote.url(0), &log, "log", &dir.path().join("last.log"));
    let (rt, lun) = open(port);
    let seen = versions(&rt.block_on(lun.read(0, BLOCKS as u32)).unwrap(), BLOCKS);
    for b in 0..BLOCKS as usize {
        assert!(seen[b] >= acked[b], "block {b} shows version {} after {} was acknowledged", seen[b], acked[b]);
    }
}

#[test]
fn stics_mount_with_a_cache_log_keeps_written_data_across_a_restart() {
    use std::io::{Read, Seek, SeekFrom, Write};
    use stics_testkit::proc::{spawn_stics, wait_mounted};
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
        assert!(m.signal("TERM"));
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
    let b_err = dir.path().join("b.log");
    let mut cmd = Command::new(BIN);
    cmd.args(["gateway", "--listen", &format!("127.0.0.1:{}", free_port()), "--iqn", GATEWAY_IQN]).args([
        "--remote",
        &remote.url(0),
        "--log",
        &format!("{}:256MiB", dir.path().join("log-b").display()),
        "--ram",
        "8MiB",
    ]);
    let mut b = spawn(&mut cmd, Some(&b_err));
    let status = b.wait_exit(Duration::from_secs(20)).expect("the second gateway exits");
    assert!(!status.success(), "the second gateway must fail");
    let stderr = std::fs::read_to_string(&b_err).unwrap();
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
