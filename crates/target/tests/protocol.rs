//! The target in process on 127.0.0.1:0 over memory LUNs, spoken to with raw PDUs built by
//! stics-wire: login (with and without CHAP), discovery, reads and writes with immediate data
//! and R2T, digests, NOP, task management, logout, and bad input that must hurt nobody else.

use std::net::SocketAddr;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use stics_target::{Config, Credentials, Limits, Server, TargetConfig};
use stics_wire::frame::{self, Digests};
use stics_wire::pdu::*;
use stics_wire::{chap, text};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::oneshot;

const IQN: &str = "iqn.2024-01.org.stics.test:disk";
const INITIATOR: &str = "iqn.2024-01.org.stics.test:initiator";

fn config(chap: Option<(&str, &str)>, mutual: Option<(&str, &str)>, limits: Limits) -> Config {
    let cred = |c: Option<(&str, &str)>| c.map(|(u, s)| Credentials { user: u.into(), secret: s.into() });
    Config {
        listen: vec!["127.0.0.1:0".into()],
        limits,
        targets: vec![TargetConfig {
            iqn: IQN.into(),
            alias: None,
            luns: vec!["mem:16M".into()],
            chap: cred(chap),
            mutual_chap: cred(mutual),
            initiators: vec![],
        }],
    }
}

struct Running {
    addr: SocketAddr,
    stop: Option<oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<()>,
}

impl Running {
    async fn stop(mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        let _ = tokio::time::timeout(Duration::from_secs(10), &mut self.task).await;
    }
}

async fn start(c: Config) -> Running {
    let server = Server::bind(&c).await.unwrap();
    let addr = server.local_addrs()[0];
    let (tx, rx) = oneshot::channel::<()>();
    let task = tokio::spawn(async move {
        server
            .run(async {
                let _ = rx.await;
            })
            .await
            .unwrap();
    });
    Running { addr, stop: Some(tx), task }
}

struct Client {
    s: TcpStream,
    buf: BytesMut,
    digests: Digests,
    cmd_sn: u32,
    itt: u32,
    isid: [u8; 6],
    max_xmit: u32,
}

impl Client {
    async fn connect(addr: SocketAddr) -> Client {
        let s = TcpStream::connect(addr).await.unwrap();
        s.set_nodelay(true).unwrap();
        Client {
            s,
            buf: BytesMut::new(),
            digests: Digests::default(),
            cmd_sn: 1,
            itt: 0x100,
            isid: [0x80, 0, 0, 0, 0x12, 0x34],
            max_xmit: 8192,
        }
    }

    async fn send(&mut self, p: Pdu) {
        let mut out = BytesMut::new();
        frame::encode(&p, self.digests, &mut out);
        self.s.write_all(&out).await.unwrap();
    }

    /// The next PDU, or None on EOF or after 5 s.
    async fn try_recv(&mut self, wait: Duration) -> Option<Pdu> {
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            match frame::check(&self.buf, self.digests, 1 << 24) {
                Ok(n) => return Some(frame::parse(self.buf.split_to(n).freeze(), self.digests).unwrap()),
                Err(_) => {
                    let r = tokio::time::timeout_at(deadline, self.s.read_buf(&mut self.buf)).await;
                    match r {
                        Ok(Ok(n)) if n > 0 => {}
                        _ => return None,
                    }
                }
            }
        }
    }

    async fn recv(&mut self) -> Pdu {
        self.try_recv(Duration::from_secs(5)).await.expect("a PDU from the target")
    }

    /// True once the target has closed the connection.
    async fn closed(&mut self) -> bool {
        let mut b = [0u8; 4096];
        loop {
            match tokio::time::timeout(Duration::from_secs(5), self.s.read(&mut b)).await {
                Ok(Ok(0)) | Ok(Err(_)) => return true,
                Ok(Ok(_)) => continue,
                Err(_) => return false,
            }
        }
    }

    fn next_itt(&mut self) -> u32 {
        self.itt += 1;
        self.itt
    }

    async fn login_step(
        &mut self,
        csg: u8,
        nsg: u8,
        transit: bool,
        kv: &[(&str, String)],
    ) -> (LoginResponse, Vec<(String, String)>) {
        let h = LoginRequest {
            transit,
            csg,
            nsg,
            isid: self.isid,
            itt: 1,
            cid: 1,
            cmd_sn: self.cmd_sn,
            ..Default::default()
        };
        self.send(Pdu::new(h, text::encode(kv))).await;
        let p = self.recv().await;
        let Header::LoginResponse(r) = p.header else { panic!("expected a login response, got {:?}", p.header) };
        (r, text::parse(&p.data).unwrap())
    }

    /// Logs in without authentication, straight to operational negotiation.
    async fn login(&mut self, ops: &[(&str, &str)]) -> Vec<(String, String)> {
        let mut kv: Vec<(&str, String)> =
            vec![("InitiatorName", INITIATOR.into()), ("SessionType", "Normal".into()), ("TargetName", IQN.into())];
        kv.extend(ops.iter().map(|(k, v)| (*k, v.to_string())));
        let (r, answers) = self.login_step(1, 3, true, &kv).await;
        assert_eq!((r.status_class, r.status_detail), (0, 0), "login failed: {answers:?}");
        assert!(r.transit && r.tsih != 0);
        self.apply(&answers);
        answers
    }

    fn apply(&mut self, answers: &[(String, String)]) {
        for (k, v) in answers {
            match (k.as_str(), v.as_str()) {
                ("HeaderDigest", "CRC32C") => self.digests.header = true,
                ("DataDigest", "CRC32C") => self.digests.data = true,
                ("MaxRecvDataSegmentLength", n) => self.max_xmit = n.parse().unwrap(),
                _ => {}
            }
        }
    }

    fn cmd(&mut self, cdb: &[u8], read: u32, write: u32, imm: bool) -> ScsiCommand {
        let mut c = [0u8; 16];
        c[..cdb.len()].copy_from_slice(cdb);
        let h = ScsiCommand {
            final_: true,
            read: read > 0,
            write: write > 0,
            attr: attr::SIMPLE,
            itt: self.next_itt(),
            expected_len: read.max(write),
            cmd_sn: self.cmd_sn,
            cdb: c,
            immediate: imm,
            ..Default::default()
        };
        if !imm {
            self.cmd_sn += 1;
        }
        h
    }

    /// Runs one command to completion: answers R2Ts with Data-Out of at most `seg` bytes,
    /// collects Data-In. Returns (status, data, sense segment).
    async fn run(
        &mut self,
        cdb: &[u8],
        read: u32,
        write: &[u8],
        immediate_len: usize,
        seg: usize,
    ) -> (u8, Vec<u8>, Bytes) {
        let h = self.cmd(cdb, read, write.len() as u32, false);
        let imm = immediate_len.min(write.len());
        self.send(Pdu::new(h, Bytes::copy_from_slice(&write[..imm]))).await;
        let mut data = Vec::new();
        loop {
            let p = self.recv().await;
            match p.header {
                Header::R2t(r) => {
                    assert_eq!(r.itt, h.itt);
                    let (mut off, end) = (r.buffer_offset as usize, (r.buffer_offset + r.desired_len) as usize);
                    let mut sn = 0;
                    while off < end {
                        let n = seg.min(end - off);
                        let d = DataOut {
                            final_: off + n == end,
                            itt: h.itt,
                            ttt: r.ttt,
                            data_sn: sn,
                            buffer_offset: off as u32,
                            ..Default::default()
                        };
                        self.send(Pdu::new(d, Bytes::copy_from_slice(&write[off..off + n]))).await;
                        sn += 1;
                        off += n;
                    }
                }
                Header::DataIn(d) => {
                    assert_eq!(d.buffer_offset as usize, data.len());
                    data.extend_from_slice(&p.data);
                    if d.status_present {
                        return (d.status, data, Bytes::new());
                    }
                }
                Header::ScsiResponse(r) => return (r.status, data, p.data),
                other => panic!("unexpected {other:?}"),
            }
        }
    }

    /// Clears the unit attention every new session starts with.
    async fn clear_ua(&mut self) {
        for _ in 0..3 {
            if self.run(&[0u8; 6], 0, &[], 0, 0).await.0 == 0 {
                return;
            }
        }
        panic!("TEST UNIT READY never succeeded");
    }

    async fn write10(&mut self, lba: u32, data: &[u8], immediate: usize, seg: usize) -> u8 {
        let blocks = (data.len() / 512) as u16;
        let mut cdb = [0x2a, 0, 0, 0, 0, 0, 0, 0, 0, 0];
        cdb[2..6].copy_from_slice(&lba.to_be_bytes());
        cdb[7..9].copy_from_slice(&blocks.to_be_bytes());
        self.run(&cdb, 0, data, immediate, seg).await.0
    }

    async fn read10(&mut self, lba: u32, blocks: u16) -> Vec<u8> {
        let mut cdb = [0x28, 0, 0, 0, 0, 0, 0, 0, 0, 0];
        cdb[2..6].copy_from_slice(&lba.to_be_bytes());
        cdb[7..9].copy_from_slice(&blocks.to_be_bytes());
        let (status, data, _) = self.run(&cdb, u32::from(blocks) * 512, &[], 0, 0).await;
        assert_eq!(status, 0);
        data
    }
}

fn pattern(n: usize, seed: u8) -> Vec<u8> {
    (0..n).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed)).collect()
}

fn get<'a>(kv: &'a [(String, String)], k: &str) -> Option<&'a str> {
    kv.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn login_then_write_with_immediate_data_and_read_back() {
    let t = start(config(None, None, Limits::default())).await;
    let mut c = Client::connect(t.addr).await;
    let answers =
        c.login(&[("MaxRecvDataSegmentLength", "65536"), ("ImmediateData", "Yes"), ("InitialR2T", "No")]).await;
    assert_eq!(get(&answers, "MaxRecvDataSegmentLength"), Some("262144"));
    assert_eq!(get(&answers, "TargetPortalGroupTag"), Some("1"));
    c.clear_ua().await;
    let data = pattern(8192, 1);
    assert_eq!(c.write10(100, &data, 8192, 8192).await, 0);
    assert_eq!(c.read10(100, 16).await, data);
    // A read larger than the initiator's 8192-byte segments comes in several Data-In PDUs.
    let big = pattern(256 * 1024, 9);
    assert_eq!(c.write10(1000, &big, 65536, 65536).await, 0);
    assert_eq!(c.read10(1000, 512).await, big);
    t.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_follow_r2t_with_small_first_and_max_burst() {
    let t = start(config(None, None, Limits::default())).await;
    let mut c = Client::connect(t.addr).await;
    let a = c
        .login(&[
            ("InitialR2T", "Yes"),
            ("ImmediateData", "No"),
            ("FirstBurstLength", "512"),
            ("MaxBurstLength", "1024"),
            ("MaxOutstandingR2T", "1"),
            ("MaxRecvDataSegmentLength", "512"),
        ])
        .await;
    assert_eq!(get(&a, "MaxBurstLength"), Some("1024"));
    assert_eq!(get(&a, "InitialR2T"), Some("Yes"));
    c.clear_ua().await;
    let data = pattern(16 * 512, 3);
    // Data-Out of 256 bytes: two per 512-byte segment limit, four per burst.
    assert_eq!(c.write10(7, &data, 0, 256).await, 0);
    assert_eq!(c.read10(7, 16).await, data);
    t.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn digests_protect_header_and_data() {
    let t = start(config(None, None, Limits::default())).await;
    let mut c = Client::connect(t.addr).await;
    let a = c.login(&[("HeaderDigest", "CRC32C,None"), ("DataDigest", "CRC32C,None")]).await;
    assert_eq!(get(&a, "HeaderDigest"), Some("CRC32C"));
    assert!(c.digests.header && c.digests.data);
    c.clear_ua().await;
    let data = pattern(4096, 5);
    assert_eq!(c.write10(0, &data, 4096, 4096).await, 0);
    assert_eq!(c.read10(0, 8).await, data);
    // A NOP-Out whose data digest is wrong is rejected with the BHS echoed; the session goes on.
    let itt = c.next_itt();
    let nop = NopOut { immediate: true, itt, ttt: RESERVED_TAG, cmd_sn: c.cmd_sn, ..Default::default() };
    let mut out = BytesMut::new();
    frame::encode(&Pdu::new(nop, Bytes::from_static(b"ping")), c.digests, &mut out);
    let n = out.len();
    out[n - 1] ^= 0xff;
    c.s.write_all(&out).await.unwrap();
    let p = c.recv().await;
    let Header::Reject(r) = p.header else { panic!("{:?}", p.header) };
    assert_eq!(r.reason, reject::DIGEST_ERROR);
    assert_eq!(&p.data[..], &out[..48]);
    assert_eq!(c.read10(0, 8).await, data);
    // A wrong header digest ends the connection: its lengths can no longer be trusted.
    let mut out = BytesMut::new();
    frame::encode(&Pdu::new(nop, Bytes::new()), c.digests, &mut out);
    out[50] ^= 1;
    c.s.write_all(&out).await.unwrap();
    assert!(c.closed().await);
    t.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nop_out_ping_echoes_its_data() {
    let t = start(config(None, None, Limits::default())).await;
    let mut c = Client::connect(t.addr).await;
    c.login(&[]).await;
    let itt = c.next_itt();
    c.send(Pdu::new(
        NopOut { itt, ttt: RESERVED_TAG, cmd_sn: c.cmd_sn, ..Default::default() },
        Bytes::from_static(b"hello"),
    ))
    .await;
    c.cmd_sn += 1;
    let p = c.recv().await;
    let Header::NopIn(n) = p.header else { panic!() };
    assert_eq!((n.itt, n.ttt, n.exp_cmd_sn), (itt, RESERVED_TAG, c.cmd_sn));
    assert_eq!(&p.data[..], b"hello");
    t.stop().await;
}

async fn chap_login(
    c: &mut Client,
    user: &str,
    secret: &str,
    mutual: Option<(&[u8], &str)>,
) -> (u8, u8, Vec<(String, String)>) {
    let kv = vec![
        ("InitiatorName", INITIATOR.to_string()),
        ("SessionType", "Normal".into()),
        ("TargetName", IQN.into()),
        ("AuthMethod", "CHAP,None".into()),
    ];
    let (r, a) = c.login_step(0, 1, true, &kv).await;
    assert_eq!(r.status_class, 0);
    assert_eq!(get(&a, "AuthMethod"), Some("CHAP"));
    let (r, a) = c.login_step(0, 1, false, &[("CHAP_A", "5".into())]).await;
    assert_eq!(r.status_class, 0);
    let id: u8 = get(&a, "CHAP_I").unwrap().parse().unwrap();
    let challenge = chap::decode_binary(get(&a, "CHAP_C").unwrap()).unwrap();
    let resp = chap::encode_hex(&chap::response(id, secret.as_bytes(), &challenge));
    let mut kv = vec![("CHAP_N", user.to_string()), ("CHAP_R", resp)];
    if let Some((ch, _)) = mutual {
        kv.push(("CHAP_I", "77".into()));
        kv.push(("CHAP_C", chap::encode_hex(ch)));
    }
    let (r, a) = c.login_step(0, 1, true, &kv).await;
    (r.status_class, r.status_detail, a)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chap_right_secret_logs_in_and_wrong_secret_is_refused() {
    let t = start(config(Some(("alice", "alice-secret-12")), None, Limits::default())).await;
    let mut c = Client::connect(t.addr).await;
    let (class, detail, _) = chap_login(&mut c, "alice", "alice-secret-12", None).await;
    assert_eq!((class, detail), (0, 0));
    let (r, _) = c.login_step(1, 3, true, &[]).await;
    assert!(r.transit && r.tsih != 0);
    c.clear_ua().await;

    let mut bad = Client::connect(t.addr).await;
    let (class, detail, _) = chap_login(&mut bad, "alice", "wrong-secret", None).await;
    assert_eq!((class, detail), (2, 1));
    assert!(bad.closed().await);

    // Without CHAP at all: refused too.
    let mut none = Client::connect(t.addr).await;
    let kv = vec![("InitiatorName", INITIATOR.to_string()), ("TargetName", IQN.into()), ("AuthMethod", "None".into())];
    let (r, _) = none.login_step(0, 1, true, &kv).await;
    assert_eq!((r.status_class, r.status_detail), (2, 1));
    t.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mutual_chap_target_answers_with_its_own_secret() {
    let t = start(config(Some(("alice", "alice-secret-12")), Some(("target", "target-secret-34")), Limits::default()))
        .await;
    let mut c = Client::connect(t.addr).await;
    let challenge = [9u8, 8, 7, 6, 5, 4, 3, 2, 1, 0, 1, 2, 3, 4, 5, 6];
    let (class, _, a) = chap_login(&mut c, "alice", "alice-secret-12", Some((&challenge, "target-secret-34"))).await;
    assert_eq!(class, 0);
    assert_eq!(get(&a, "CHAP_N"), Some("target"));
    let r = chap::decode_binary(get(&a, "CHAP_R").unwrap()).unwrap();
    assert!(chap::verify(77, b"target-secret-34", &challenge, &r));
    t.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn discovery_session_lists_targets_with_send_targets_all() {
    let t = start(config(None, None, Limits::default())).await;
    let mut c = Client::connect(t.addr).await;
    let kv = vec![("InitiatorName", INITIATOR.to_string()), ("SessionType", "Discovery".into())];
    let (r, _) = c.login_step(1, 3, true, &kv).await;
    assert_eq!(r.status_class, 0);
    let itt = c.next_itt();
    c.send(Pdu::new(
        TextRequest { final_: true, itt, ttt: RESERVED_TAG, cmd_sn: c.cmd_sn, ..Default::default() },
        text::encode(&[("SendTargets", "All")]),
    ))
    .await;
    c.cmd_sn += 1;
    let p = c.recv().await;
    let kv = text::parse(&p.data).unwrap();
    assert_eq!(get(&kv, "TargetName"), Some(IQN));
    assert_eq!(get(&kv, "TargetAddress"), Some(format!("{},1", t.addr).as_str()));
    // SCSI commands have no place in a discovery session.
    let h = c.cmd(&[0u8; 6], 0, 0, false);
    c.send(Pdu::new(h, Bytes::new())).await;
    let Header::Reject(r) = c.recv().await.header else { panic!() };
    assert_eq!(r.reason, reject::PROTOCOL_ERROR);
    t.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn abort_task_lun_reset_and_logout() {
    let t = start(config(None, None, Limits::default())).await;
    let mut c = Client::connect(t.addr).await;
    c.login(&[("InitialR2T", "Yes"), ("ImmediateData", "No")]).await;
    c.clear_ua().await;
    // A write that waits for its data (R2T) is aborted.
    let h = c.cmd(&[0x2a, 0, 0, 0, 0, 0, 0, 0, 8, 0], 0, 4096, false);
    c.send(Pdu::new(h, Bytes::new())).await;
    let Header::R2t(r2t) = c.recv().await.header else { panic!() };
    let itt = c.next_itt();
    let tm = TaskMgmtRequest {
        immediate: true,
        function: tmf::ABORT_TASK,
        itt,
        referenced_tag: h.itt,
        cmd_sn: c.cmd_sn,
        ref_cmd_sn: h.cmd_sn,
        ..Default::default()
    };
    c.send(Pdu::new(tm, Bytes::new())).await;
    let Header::TaskMgmtResponse(r) = c.recv().await.header else { panic!() };
    assert_eq!((r.itt, r.response), (itt, tmf::FUNCTION_COMPLETE));
    // Data for the aborted task is ignored quietly.
    let d = DataOut { final_: true, itt: h.itt, ttt: r2t.ttt, ..Default::default() };
    c.send(Pdu::new(d, Bytes::from(vec![0u8; 4096]))).await;
    // Aborting it again: it no longer exists.
    let itt = c.next_itt();
    c.send(Pdu::new(
        TaskMgmtRequest {
            immediate: true,
            function: tmf::ABORT_TASK,
            itt,
            referenced_tag: h.itt,
            cmd_sn: c.cmd_sn,
            ..Default::default()
        },
        Bytes::new(),
    ))
    .await;
    let Header::TaskMgmtResponse(r) = c.recv().await.header else { panic!() };
    assert_eq!(r.response, tmf::TASK_DOES_NOT_EXIST);
    // LUN RESET completes; a LUN that does not exist says so.
    for (lun, want) in [(0u64, tmf::FUNCTION_COMPLETE), (5, tmf::LUN_DOES_NOT_EXIST)] {
        let itt = c.next_itt();
        let tm = TaskMgmtRequest {
            immediate: true,
            function: tmf::LOGICAL_UNIT_RESET,
            lun: stics_wire::lun::encode(lun),
            itt,
            referenced_tag: RESERVED_TAG,
            cmd_sn: c.cmd_sn,
            ..Default::default()
        };
        c.send(Pdu::new(tm, Bytes::new())).await;
        let Header::TaskMgmtResponse(r) = c.recv().await.header else { panic!() };
        assert_eq!(r.response, want);
    }
    // Logout ends the session and the connection.
    let itt = c.next_itt();
    c.send(Pdu::new(
        LogoutRequest {
            immediate: true,
            reason: logout::CLOSE_SESSION,
            itt,
            cid: 1,
            cmd_sn: c.cmd_sn,
            ..Default::default()
        },
        Bytes::new(),
    ))
    .await;
    let Header::LogoutResponse(r) = c.recv().await.header else { panic!() };
    assert_eq!(r.response, logout::SUCCESS);
    assert!(c.closed().await);
    t.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cmdsn_outside_the_window_is_ignored_and_gaps_are_waited_for() {
    let t = start(config(None, None, Limits { queue_depth: 8, ..Limits::default() })).await;
    let mut c = Client::connect(t.addr).await;
    c.login(&[]).await;
    c.clear_ua().await;
    // Beyond MaxCmdSN: silently dropped.
    let mut h = c.cmd(&[0u8; 6], 0, 0, false);
    c.cmd_sn -= 1;
    h.cmd_sn = c.cmd_sn + 8;
    c.send(Pdu::new(h, Bytes::new())).await;
    assert!(c.try_recv(Duration::from_millis(300)).await.is_none());
    // Two commands sent in reverse CmdSN order: both answered once the gap is filled.
    let a = c.cmd(&[0u8; 6], 0, 0, false);
    let b = c.cmd(&[0u8; 6], 0, 0, false);
    c.send(Pdu::new(b, Bytes::new())).await;
    assert!(c.try_recv(Duration::from_millis(200)).await.is_none());
    c.send(Pdu::new(a, Bytes::new())).await;
    let mut itts = vec![];
    for _ in 0..2 {
        let p = c.recv().await;
        let Header::ScsiResponse(r) = p.header else { panic!() };
        assert_eq!(r.status, 0);
        itts.push(r.itt);
    }
    assert_eq!(itts, vec![a.itt, b.itt]);
    t.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn same_isid_and_initiator_reinstates_the_session() {
    let t = start(config(None, None, Limits::default())).await;
    let mut a = Client::connect(t.addr).await;
    a.login(&[]).await;
    let mut b = Client::connect(t.addr).await;
    b.login(&[]).await;
    assert!(a.closed().await, "the old session ends");
    b.clear_ua().await;
    t.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_truncated_and_oversized_pdus_leave_other_sessions_working() {
    let t = start(config(None, None, Limits::default())).await;
    let mut good = Client::connect(t.addr).await;
    good.login(&[]).await;
    good.clear_ua().await;
    let data = pattern(4096, 7);
    assert_eq!(good.write10(50, &data, 4096, 4096).await, 0);

    // Garbage before login: the connection is closed without a reply.
    let mut g = Client::connect(t.addr).await;
    g.s.write_all(&[0xffu8; 200]).await.unwrap();
    assert!(g.closed().await);

    // A login PDU announcing a huge data segment is refused before anything is allocated.
    let mut o = Client::connect(t.addr).await;
    let mut bhs = Header::from(LoginRequest { csg: 1, nsg: 3, transit: true, ..Default::default() }).encode();
    bhs[5..8].copy_from_slice(&[0xff, 0xff, 0xff]);
    o.s.write_all(&bhs).await.unwrap();
    assert!(o.closed().await);

    // In full feature phase: oversized data segment, then an unknown opcode, then truncation.
    let mut f = Client::connect(t.addr).await;
    f.isid[5] = 0x99;
    f.login(&[]).await;
    let mut bad = Header::from(NopOut { itt: 1, ttt: RESERVED_TAG, ..Default::default() }).encode();
    bad[0] = 0x1c;
    f.s.write_all(&bad).await.unwrap();
    let Header::Reject(r) = f.recv().await.header else { panic!() };
    assert_eq!(r.reason, reject::COMMAND_NOT_SUPPORTED);
    let mut big = Header::from(NopOut { itt: 1, ttt: RESERVED_TAG, ..Default::default() }).encode();
    big[5..8].copy_from_slice(&[0x10, 0, 0]);
    f.s.write_all(&big).await.unwrap();
    assert!(f.closed().await);

    let mut tr = Client::connect(t.addr).await;
    tr.isid[5] = 0x98;
    tr.login(&[]).await;
    tr.s.write_all(&bhs[..20]).await.unwrap();
    drop(tr);

    assert_eq!(good.read10(50, 8).await, data);
    t.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn login_flood_is_bounded_and_stalled_logins_time_out() {
    let limits = Limits { max_connections: 20, max_logins: 4, login_timeout_secs: 1, ..Limits::default() };
    let t = start(config(None, None, limits)).await;
    let mut good = Client::connect(t.addr).await;
    good.login(&[]).await;
    good.clear_ua().await;
    let mut flood = Vec::new();
    for _ in 0..100 {
        if let Ok(s) = TcpStream::connect(t.addr).await {
            flood.push(s);
        }
    }
    // Existing sessions keep working during the flood.
    let data = pattern(4096, 11);
    assert_eq!(good.write10(9, &data, 4096, 4096).await, 0);
    assert_eq!(good.read10(9, 8).await, data);
    // Stalled logins are closed after the login timeout (excess connections at once).
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let mut open = 0;
    for s in &mut flood {
        let mut b = [0u8; 1];
        if let Ok(Ok(n)) = tokio::time::timeout(Duration::from_millis(50), s.read(&mut b)).await {
            assert_eq!(n, 0);
        } else {
            open += 1;
        }
    }
    assert!(open <= 19, "{open} flood connections still open");
    drop(flood);
    tokio::time::sleep(Duration::from_millis(1500)).await;
    // After the flood, new logins work again.
    let mut late = Client::connect(t.addr).await;
    late.isid[5] = 0x77;
    late.login(&[]).await;
    t.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_that_never_reads_is_throttled_not_buffered() {
    let t = start(config(None, None, Limits::default())).await;
    let mut good = Client::connect(t.addr).await;
    good.login(&[]).await;
    good.clear_ua().await;
    let mut hog = Client::connect(t.addr).await;
    hog.isid[5] = 0x55;
    hog.login(&[("MaxRecvDataSegmentLength", "262144")]).await;
    // 256 KiB pings whose echoes the hog never reads: once the target holds its limit of
    // queued answers (plus socket buffers), it stops reading and the hog's writes stall.
    let mut ping = BytesMut::new();
    for i in 0..16u32 {
        let nop =
            NopOut { immediate: true, itt: 1000 + i, ttt: RESERVED_TAG, cmd_sn: hog.cmd_sn, ..Default::default() };
        frame::encode(&Pdu::new(nop, Bytes::from(vec![0x5a; 256 * 1024])), hog.digests, &mut ping);
    }
    let mut sent = 0usize;
    let stalled = loop {
        match tokio::time::timeout(Duration::from_secs(2), hog.s.write_all(&ping)).await {
            Ok(Ok(())) => sent += ping.len(),
            Ok(Err(e)) => panic!("{e}"),
            Err(_) => break true,
        }
        if sent > 1 << 30 {
            break false;
        }
    };
    assert!(stalled, "the target kept reading {sent} bytes without answers being read");
    let data = pattern(4096, 13);
    assert_eq!(good.write10(3, &data, 4096, 4096).await, 0);
    assert_eq!(good.read10(3, 8).await, data);
    drop(hog);
    t.stop().await;
}

async fn lun_reset(c: &mut Client) -> u8 {
    let itt = c.next_itt();
    let tm = TaskMgmtRequest {
        immediate: true,
        function: tmf::LOGICAL_UNIT_RESET,
        lun: stics_wire::lun::encode(0),
        itt,
        referenced_tag: RESERVED_TAG,
        cmd_sn: c.cmd_sn,
        ..Default::default()
    };
    c.send(Pdu::new(tm, Bytes::new())).await;
    let Header::TaskMgmtResponse(r) = c.recv().await.header else { panic!() };
    r.response
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lun_reset_aborts_the_waiting_writes_of_other_sessions() {
    let t = start(config(None, None, Limits::default())).await;
    let mut b = Client::connect(t.addr).await;
    b.login(&[("InitialR2T", "Yes"), ("ImmediateData", "No")]).await;
    b.clear_ua().await;
    // B's write waits for its data when A resets the LUN.
    let h = b.cmd(&[0x2a, 0, 0, 0, 0, 0, 0, 0, 8, 0], 0, 4096, false);
    b.send(Pdu::new(h, Bytes::new())).await;
    let Header::R2t(r2t) = b.recv().await.header else { panic!() };
    let mut a = Client::connect(t.addr).await;
    a.isid = [0x80, 0, 0, 0, 0x56, 0x78];
    a.login(&[]).await;
    a.clear_ua().await;
    assert_eq!(lun_reset(&mut a).await, tmf::FUNCTION_COMPLETE);
    // The data B sends afterwards belongs to an aborted task: it is dropped, nothing answers.
    let d = DataOut { final_: true, itt: h.itt, ttt: r2t.ttt, ..Default::default() };
    b.send(Pdu::new(d, Bytes::from(pattern(4096, 9)))).await;
    // B learns of the reset from a unit attention; the resetting session does not get one.
    let (status, _, sense) = b.run(&[0u8; 6], 0, &[], 0, 0).await;
    assert_eq!(status, 2);
    assert_eq!((sense.get(4).map(|k| k & 0x0f), sense.get(14), sense.get(15)), (Some(6), Some(&0x29), Some(&0x03)));
    assert_eq!(a.run(&[0u8; 6], 0, &[], 0, 0).await.0, 0);
    // The aborted write never reached the LUN.
    assert!(b.read10(0, 8).await.iter().all(|&x| x == 0));
    t.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_connection_is_pinged_and_dropped_when_it_stops_answering() {
    let limits = Limits { nop_in_interval_secs: 1, nop_in_timeout_secs: 1, ..Limits::default() };
    let t = start(config(None, None, limits)).await;
    let mut c = Client::connect(t.addr).await;
    c.login(&[]).await;
    let p = c.try_recv(Duration::from_secs(5)).await.expect("a NOP-In ping");
    let Header::NopIn(n) = p.header else { panic!("expected a NOP-In, got {:?}", p.header) };
    assert_eq!(n.itt, RESERVED_TAG);
    assert_ne!(n.ttt, RESERVED_TAG, "the ping asks for an answer");
    // Answered: the connection stays and a later ping comes.
    let answer = NopOut { immediate: true, itt: RESERVED_TAG, ttt: n.ttt, cmd_sn: c.cmd_sn, ..Default::default() };
    c.send(Pdu::new(answer, Bytes::new())).await;
    let p = c.try_recv(Duration::from_secs(5)).await.expect("a second ping");
    assert!(matches!(p.header, Header::NopIn(n) if n.itt == RESERVED_TAG));
    // Not answered: the target gives up on the connection.
    assert!(c.closed().await);
    t.stop().await;
}
