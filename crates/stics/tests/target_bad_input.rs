//! Hostile peers against a running `stics target`: garbage, truncated and oversized PDUs,
//! protocol violations and a login flood. A session opened before the abuse keeps working
//! without reconnecting, new sessions still log in afterwards, the process never dies and its
//! memory stays bounded. CHAP: a wrong secret is refused and no secret reaches the log.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::thread::sleep;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use stics_block::BlockDev;
use stics_initiator::{IscsiUrl, Lun, LunOptions};
use stics_testkit::client::{encode, write10_cdb};
use stics_testkit::pattern::ramp;
use stics_testkit::peers::{SticsOptions, SticsTarget};
use stics_wire::pdu::{stage, DataOut, LoginRequest, Pdu, ScsiCommand};
use stics_wire::{text, Digests};

const IQN: &str = "iqn.2024-01.org.stics.test:bad-input";

/// `stics target` with `extra` arguments, debug logging into `log`, and `env`.
fn start(extra: &[&str], log: Option<&Path>, env: &[(&str, &str)]) -> SticsTarget {
    let mut env: Vec<(String, String)> = env.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
    env.push(("RUST_LOG".into(), "debug".into()));
    let options = SticsOptions {
        // A config file names its own targets.
        iqn: (!extra.contains(&"--config")).then(|| IQN.to_owned()),
        args: extra.iter().map(std::string::ToString::to_string).collect(),
        env,
        stderr: log.map(Path::to_owned),
    };
    SticsTarget::start(Path::new(env!("CARGO_BIN_EXE_stics")), options)
}

/// The URL of LUN 0 of [`IQN`] (also when a config file names it).
fn url(t: &SticsTarget) -> String {
    format!("iscsi://127.0.0.1:{}/{IQN}/0", t.port)
}

fn connect(port: u16) -> TcpStream {
    let s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    s
}

fn wire(pdu: &Pdu) -> BytesMut {
    encode(pdu, Digests::default())
}

/// The target's login timeout (`login_timeout_secs`, 15 s by default) plus slack: a connection
/// that is still open after this long is being held, which is what a hostile peer wants.
const CLOSE_WITHIN: Duration = Duration::from_secs(25);

/// Sends `bytes` on a fresh connection and waits for the target to close it; returns how long
/// that took, or panics naming the probe if the target kept it open.
fn send_and_expect_close(port: u16, name: &str, bytes: &[u8]) -> Duration {
    let start = Instant::now();
    let mut s = connect(port);
    s.set_read_timeout(Some(CLOSE_WITHIN)).unwrap();
    let _ = s.write_all(bytes);
    let mut sink = [0u8; 4096];
    loop {
        match s.read(&mut sink) {
            Ok(0) => return start.elapsed(),
            Ok(_) => {}
            Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {
                panic!("{name}: the target kept the connection open for {CLOSE_WITHIN:?}")
            }
            // A reset is the target closing with our unread bytes still queued.
            Err(_) => return start.elapsed(),
        }
    }
}

fn login_pdu(data_len_override: Option<u32>) -> BytesMut {
    let keys = text::encode(&[
        ("InitiatorName", "iqn.2024-01.org.stics.test:raw"),
        ("SessionType", "Normal"),
        ("TargetName", IQN),
    ]);
    let h = LoginRequest {
        transit: true,
        csg: stage::OPERATIONAL,
        nsg: stage::FULL_FEATURE,
        isid: [0x80, 1, 2, 3, 4, 5],
        ..Default::default()
    };
    let mut b = wire(&Pdu::new(h, keys));
    if let Some(len) = data_len_override {
        b[5..8].copy_from_slice(&len.to_be_bytes()[1..4]);
    }
    b
}

/// Logs in over a raw socket and returns the connection in full feature phase.
fn raw_session(port: u16) -> TcpStream {
    let mut s = connect(port);
    s.write_all(&login_pdu(None)).unwrap();
    let mut bhs = [0u8; 48];
    s.read_exact(&mut bhs).unwrap();
    assert_eq!(bhs[0] & 0x3f, 0x23, "login response");
    assert_eq!((bhs[36], bhs[37]), (0, 0), "login succeeded");
    let dsl = u32::from_be_bytes([0, bhs[5], bhs[6], bhs[7]]) as usize;
    let mut rest = vec![0u8; dsl.div_ceil(4) * 4];
    s.read_exact(&mut rest).unwrap();
    s
}

#[test]
fn hostile_peers_do_not_disturb_other_sessions_or_grow_memory() {
    let mut t = start(&["--lun", "mem:64MiB"], None, &[]);
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let url = IscsiUrl::parse(&url(&t)).unwrap();
    let lun = Arc::new(rt.block_on(Lun::open(&url, &LunOptions::default())).unwrap());
    rt.block_on(lun.write(0, ramp(1, 65536), true)).unwrap();
    let baseline = t.process().rss_kib().unwrap();

    // Keep the good session busy while the abuse goes on.
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let busy = {
        let (lun, stop) = (lun.clone(), stop.clone());
        rt.spawn(async move {
            let mut round = 0u8;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                round = round.wrapping_add(1);
                let data = ramp(round, 65536);
                lun.write(2048, data.clone(), false).await.expect("write during abuse");
                assert_eq!(lun.read(2048, 128).await.expect("read during abuse"), data);
            }
            round
        })
    };

    let port = t.port;
    // Garbage, and a stream of zeros (a BHS of opcode 0 before login).
    let mut noise = vec![0u8; 256 * 1024];
    let mut x: u32 = 12345;
    for b in &mut noise {
        x = x.wrapping_mul(1_103_515_245).wrapping_add(12345);
        *b = (x >> 16) as u8;
    }
    let mut probes: Vec<(&str, Vec<u8>)> = vec![("garbage", noise.clone()), ("zeros", vec![0u8; 4096])];
    // Truncated: half a BHS, then a BHS whose data never comes (closed at the login timeout).
    probes.push(("half a BHS", login_pdu(None)[..30].to_vec()));
    probes.push(("BHS without its data", login_pdu(Some(1000))[..60].to_vec()));
    // Oversized: a login PDU declaring a 16 MiB data segment, followed by 1 MiB of it.
    let mut big = login_pdu(Some(0x00ff_ffff)).to_vec();
    big.truncate(48);
    big.extend(std::iter::repeat_n(b'A', 1 << 20));
    probes.push(("16 MiB login data segment", big));
    // Unknown opcode, and a SCSI command and a Data-Out before login.
    let mut unknown = vec![0u8; 48];
    unknown[0] = 0x1c;
    probes.push(("unknown opcode", unknown));
    let cmd = ScsiCommand {
        final_: true,
        read: true,
        expected_len: 512,
        cdb: [0x28, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0],
        ..Default::default()
    };
    probes.push(("SCSI command before login", wire(&Pdu::new(cmd, Bytes::new())).to_vec()));
    let data_out = DataOut { final_: true, itt: 7, ttt: 0xffff_ffff, ..Default::default() };
    probes.push(("Data-Out before login", wire(&Pdu::new(data_out, ramp(3, 4096))).to_vec()));
    // All at once: the slow ones wait out the login timeout side by side.
    let probes: Vec<_> = probes
        .into_iter()
        .map(|(name, bytes)| std::thread::spawn(move || (name, send_and_expect_close(port, name, &bytes))))
        .collect();
    // In full feature phase: a data segment larger than the negotiated limit, then garbage.
    let mut s = raw_session(port);
    // WRITE(10) of 4 MiB.
    let mut cdb = [0u8; 16];
    cdb[..10].copy_from_slice(&write10_cdb(0, 0x2000));
    let mut huge = wire(&Pdu::new(
        ScsiCommand { final_: true, write: true, expected_len: 4 << 20, cmd_sn: 1, cdb, ..Default::default() },
        Bytes::new(),
    ));
    huge[5..8].copy_from_slice(&[0x40, 0, 0]);
    let _ = s.write_all(&huge);
    let _ = s.write_all(&noise[..65536]);
    drop(s);
    // A login flood: many connections that send half a login and hold it open.
    let flood: Vec<TcpStream> = (0..400)
        .filter_map(|_| {
            let mut c = TcpStream::connect(("127.0.0.1", port)).ok()?;
            let _ = c.write_all(&login_pdu(None)[..20]);
            Some(c)
        })
        .collect();
    sleep(Duration::from_secs(1));
    let during = t.process().rss_kib().unwrap();
    assert!(t.process().alive(), "target died under the flood");
    drop(flood);

    for p in probes {
        let (name, took) = p.join().expect("a hostile probe was left open");
        eprintln!("{name}: closed by the target after {took:.2?}");
    }

    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let rounds = rt.block_on(busy).unwrap();
    assert!(rounds > 0);
    assert_eq!(rt.block_on(lun.read(0, 128)).unwrap(), ramp(1, 65536), "data written before the abuse");
    assert_eq!(lun.counters().reconnects, 0, "the good session was never dropped");

    // A new session logs in and works after the abuse.
    let fresh = rt.block_on(Lun::open(&url, &LunOptions::default())).expect("login after the abuse");
    assert_eq!(rt.block_on(fresh.read(0, 128)).unwrap(), ramp(1, 65536));
    rt.block_on(fresh.close());
    rt.block_on(lun.close());
    let after = t.process().rss_kib().unwrap();
    assert!(t.process().alive(), "target died");
    eprintln!("RSS KiB: baseline {baseline}, during flood {during}, after {after}");
    assert!(during < baseline + 96 * 1024, "RSS grew from {baseline} to {during} KiB under abuse");
    assert!(after < baseline + 96 * 1024, "RSS grew from {baseline} to {after} KiB after abuse");
}

#[test]
fn wrong_chap_secret_is_refused_and_no_secret_is_logged() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("target.log");
    let secret = "sekrit-passw0rd-12";
    let config = dir.path().join("target.toml");
    std::fs::write(
        &config,
        format!(
            "[[target]]\niqn = \"{IQN}\"\nluns = [\"mem:16MiB\"]\nchap = {{ user = \"alice\", secret = \"{secret}\" }}\n"
        ),
    )
    .unwrap();
    let t = start(&["--config", config.to_str().unwrap()], Some(&log), &[]);
    let inq = |user: &str, pass: &str| {
        Command::new("iscsi-inq").arg(format!("iscsi://{user}%{pass}@127.0.0.1:{}/{IQN}/0", t.port)).output().unwrap()
    };
    let good = inq("alice", secret);
    assert!(good.status.success(), "right secret refused: {}", String::from_utf8_lossy(&good.stderr));
    let bad = inq("alice", "wrong-secret-xyz1");
    assert!(!bad.status.success(), "wrong secret accepted");
    let nobody = Command::new("iscsi-inq").arg(url(&t)).output().unwrap();
    assert!(!nobody.status.success(), "login without CHAP accepted");
    drop(t);
    let text = std::fs::read_to_string(&log).unwrap();
    assert_eq!(text.matches("login refused").count(), 2, "both refused logins are logged: {text}");
    assert!(!text.contains(secret), "the CHAP secret appears in the log");
    assert!(!text.contains("wrong-secret-xyz1"), "a tried secret appears in the log");

    let printed = Command::new(env!("CARGO_BIN_EXE_stics"))
        .args(["target", "--config", config.to_str().unwrap(), "--print-config"])
        .output()
        .unwrap();
    let printed = String::from_utf8_lossy(&printed.stdout);
    assert!(printed.contains("user = \"alice\""), "--print-config shows the CHAP user: {printed}");
    assert!(!printed.contains(secret), "--print-config shows the CHAP secret: {printed}");
}

#[test]
fn mutual_chap_from_the_environment_authenticates_both_ways_and_no_secret_is_logged() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("target.log");
    let (secret, mutual) = ("alice-env-secret-34", "target-env-secret-56");
    let t = start(
        &["--lun", "mem:16MiB", "--chap-user", "alice", "--mutual-user", "disk0"],
        Some(&log),
        &[("STICS_CHAP_SECRET", secret), ("STICS_MUTUAL_SECRET", mutual)],
    );
    let inq = |pass: &str, query: &str| {
        Command::new("iscsi-inq")
            .arg(format!("iscsi://alice%{pass}@127.0.0.1:{}/{IQN}/0{query}", t.port))
            .output()
            .unwrap()
    };
    let good = inq(secret, &format!("?target_user=disk0&target_password={mutual}"));
    assert!(good.status.success(), "mutual CHAP login refused: {}", String::from_utf8_lossy(&good.stderr));
    // The initiator checks the target's answer: a target that does not know the secret the
    // initiator expects must not pass.
    let impostor = inq(secret, "?target_user=disk0&target_password=not-the-target-secret9");
    assert!(!impostor.status.success(), "initiator accepted a target answer made with another secret");
    let bad = inq("wrong-secret-xyz2", &format!("?target_user=disk0&target_password={mutual}"));
    assert!(!bad.status.success(), "wrong initiator secret accepted");
    drop(t);
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(!text.contains(secret) && !text.contains(mutual), "a CHAP secret appears in the log: {text}");
    assert!(!text.contains("wrong-secret-xyz2"), "a tried secret appears in the log");
}
