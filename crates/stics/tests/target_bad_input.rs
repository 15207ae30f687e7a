//! Hostile peers against a running `stics target`: garbage, truncated and oversized PDUs,
//! protocol violations and a login flood. A session opened before the abuse keeps working
//! without reconnecting, new sessions still log in afterwards, the process never dies and its
//! memory stays bounded. CHAP: a wrong secret is refused and no secret reaches the log.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::thread::sleep;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use stics_block::BlockDev;
use stics_initiator::{IscsiUrl, Lun, LunOptions};
use stics_wire::pdu::{stage, LoginRequest, Pdu, ScsiCommand};
use stics_wire::{encode, text, Digests};

const IQN: &str = "iqn.2024-01.org.stics.test:bad-input";

struct Target {
    child: Child,
    port: u16,
}

impl Target {
    fn start(extra: &[&str], log: Option<&std::path::Path>) -> Target {
        let port = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let stderr = match log {
            Some(p) => Stdio::from(std::fs::File::create(p).unwrap()),
            None => Stdio::null(),
        };
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_stics"));
        cmd.args(["target", "--listen", &format!("127.0.0.1:{port}")]);
        // A config file names its own targets.
        if !extra.contains(&"--config") {
            cmd.args(["--iqn", IQN]);
        }
        let child = cmd
            .args(extra)
            .env("RUST_LOG", "debug")
            .stdout(Stdio::null())
            .stderr(stderr)
            .spawn()
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(20);
        while TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(Instant::now() < deadline, "target did not listen");
            sleep(Duration::from_millis(50));
        }
        Target { child, port }
    }

    fn url(&self) -> String {
        format!("iscsi://127.0.0.1:{}/{IQN}/0", self.port)
    }

    fn alive(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    fn rss_kib(&self) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id())).unwrap();
        let line = status.lines().find(|l| l.starts_with("VmRSS:")).unwrap();
        line.split_whitespace().nth(1).unwrap().parse().unwrap()
    }
}

impl Drop for Target {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn connect(port: u16) -> TcpStream {
    let s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    s
}

fn wire(pdu: &Pdu) -> BytesMut {
    let mut out = BytesMut::new();
    encode(pdu, Digests::default(), &mut out);
    out
}

/// Sends `bytes` and waits until the target closes the connection (or answers and closes).
fn send_and_expect_close(port: u16, bytes: &[u8]) {
    let mut s = connect(port);
    let _ = s.write_all(bytes);
    let mut sink = [0u8; 4096];
    loop {
        match s.read(&mut sink) {
            Ok(0) | Err(_) => return,
            Ok(_) => {}
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

fn pattern(seed: u8, len: usize) -> Bytes {
    Bytes::from((0..len).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed)).collect::<Vec<_>>())
}

#[test]
fn hostile_peers_do_not_disturb_other_sessions_or_grow_memory() {
    let mut t = Target::start(&["--lun", "mem:64MiB"], None);
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let url = IscsiUrl::parse(&t.url()).unwrap();
    let lun = Arc::new(rt.block_on(Lun::open(&url, &LunOptions::default())).unwrap());
    rt.block_on(lun.write(0, pattern(1, 65536), true)).unwrap();
    let baseline = t.rss_kib();

    // Keep the good session busy while the abuse goes on.
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let busy = {
        let (lun, stop) = (lun.clone(), stop.clone());
        rt.spawn(async move {
            let mut round = 0u8;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                round = round.wrapping_add(1);
                let data = pattern(round, 65536);
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
    for b in noise.iter_mut() {
        x = x.wrapping_mul(1_103_515_245).wrapping_add(12345);
        *b = (x >> 16) as u8;
    }
    send_and_expect_close(port, &noise);
    send_and_expect_close(port, &[0u8; 4096]);
    // Truncated: half a BHS, then a BHS whose data never comes.
    send_and_expect_close(port, &login_pdu(None)[..30]);
    send_and_expect_close(port, &login_pdu(Some(1000))[..60]);
    // Oversized: a login PDU declaring a 16 MiB data segment, followed by 1 MiB of it.
    let mut big = login_pdu(Some(0x00ff_ffff)).to_vec();
    big.truncate(48);
    big.extend(std::iter::repeat_n(b'A', 1 << 20));
    send_and_expect_close(port, &big);
    // Unknown opcode, and a SCSI command before login.
    let mut unknown = [0u8; 48];
    unknown[0] = 0x1c;
    send_and_expect_close(port, &unknown);
    let cmd = ScsiCommand { final_: true, read: true, expected_len: 512, cdb: [0x28, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0], ..Default::default() };
    send_and_expect_close(port, &wire(&Pdu::new(cmd, Bytes::new())));
    // In full feature phase: a data segment larger than the negotiated limit, then garbage.
    let mut s = raw_session(port);
    let mut huge = wire(&Pdu::new(
        ScsiCommand { final_: true, write: true, expected_len: 4 << 20, cmd_sn: 1, cdb: [0x2a, 0, 0, 0, 0, 0, 0, 0x20, 0, 0, 0, 0, 0, 0, 0, 0], ..Default::default() },
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
    let during = t.rss_kib();
    assert!(t.alive(), "target died under the flood");
    drop(flood);

    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let rounds = rt.block_on(busy).unwrap();
    assert!(rounds > 0);
    assert_eq!(rt.block_on(lun.read(0, 128)).unwrap(), pattern(1, 65536), "data written before the abuse");
    assert_eq!(lun.counters().reconnects, 0, "the good session was never dropped");

    // A new session logs in and works after the abuse.
    let fresh = rt.block_on(Lun::open(&url, &LunOptions::default())).expect("login after the abuse");
    assert_eq!(rt.block_on(fresh.read(0, 128)).unwrap(), pattern(1, 65536));
    rt.block_on(fresh.close());
    rt.block_on(lun.close());
    let after = t.rss_kib();
    assert!(t.alive(), "target died");
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
    let t = Target::start(&["--config", config.to_str().unwrap()], Some(&log));
    let inq = |user: &str, pass: &str| {
        Command::new("iscsi-inq")
            .arg(format!("iscsi://{user}%{pass}@127.0.0.1:{}/{IQN}/0", t.port))
            .output()
            .unwrap()
    };
    let good = inq("alice", secret);
    assert!(good.status.success(), "right secret refused: {}", String::from_utf8_lossy(&good.stderr));
    let bad = inq("alice", "wrong-secret-xyz1");
    assert!(!bad.status.success(), "wrong secret accepted");
    let nobody = Command::new("iscsi-inq").arg(t.url()).output().unwrap();
    assert!(!nobody.status.success(), "login without CHAP accepted");
    drop(t);
    let text = std::fs::read_to_string(&log).unwrap();
    assert_eq!(text.matches("login refused").count(), 2, "both refused logins are logged: {text}");
    assert!(!text.contains(secret), "the CHAP secret appears in the log");
    assert!(!text.contains("wrong-secret-xyz1"), "a tried secret appears in the log");
}
