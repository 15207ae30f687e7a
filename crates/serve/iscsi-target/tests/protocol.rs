//! The target in process on 127.0.0.1:0 over memory LUNs, spoken to with raw PDUs built by
//! stics-wire: login (with and without CHAP), discovery, reads and writes with immediate data
//! and R2T, digests, NOP, task management, logout, and bad input that must hurt nobody else.

use std::time::Duration;

use bytes::{Bytes, BytesMut};
use stics_target::{Credentials, Limits, ServerConfig, Target};
use stics_testkit::client::{encode, get, Client};
use stics_testkit::pattern::ramp;
use stics_testkit::peers::{loopback, mem, InProcess};
use stics_testkit::{INITIATOR, IQN};
use stics_wire::frame;
use stics_wire::pdu::*;
use stics_wire::{chap, text};
use tokio::io::AsyncReadExt;
use tokio::net::TcpStream;

fn config(chap: Option<(&str, &str)>, mutual: Option<(&str, &str)>, limits: Limits) -> ServerConfig {
    let cred = |c: Option<(&str, &str)>| c.map(|(u, s)| Credentials { user: u.into(), secret: s.into() });
    let target = Target { chap: cred(chap), mutual_chap: cred(mutual), ..Target::new(IQN, vec![mem(16 << 20, 512)]) };
    ServerConfig { limits, ..ServerConfig::new(vec![loopback()], vec![target]) }
}

async fn start(c: ServerConfig) -> InProcess {
    InProcess::start(c).await
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
    let data = ramp(1, 8192);
    assert_eq!(c.write10(100, &data, 8192, 8192).await, 0);
    assert_eq!(c.read10(100, 16).await, data);
    // A read larger than the initiator's 8192-byte segments comes in several Data-In PDUs.
    let big = ramp(9, 256 * 1024);
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
    let data = ramp(3, 16 * 512);
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
    let data = ramp(5, 4096);
    assert_eq!(c.write10(0, &data, 4096, 4096).await, 0);
    assert_eq!(c.read10(0, 8).await, data);
    // A NOP-Out whose data digest is wrong is rejected with the BHS echoed; the session goes on.
    let itt = c.next_itt();
    let nop = NopOut { immediate: true, itt, ttt: RESERVED_TAG, cmd_sn: c.cmd_sn, ..Default::default() };
    let mut out = encode(&Pdu::new(nop, Bytes::from_static(b"ping")), c.digests);
    let n = out.len();
    out[n - 1] ^= 0xff;
    c.send_raw(&out).await;
    let p = c.recv().await;
    let Header::Reject(r) = p.header else { panic!("{:?}", p.header) };
    assert_eq!(r.reason, reject::DIGEST_ERROR);
    assert_eq!(&p.data[..], &out[..48]);
    assert_eq!(c.read10(0, 8).await, data);
    // A wrong header digest ends the connection: its lengths can no longer be trusted.
    let mut out = encode(&Pdu::new(nop, Bytes::new()), c.digests);
    out[50] ^= 1;
    c.send_raw(&out).await;
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
    let mut c = Client::session(t.addr, &[("InitialR2T", "Yes"), ("ImmediateData", "No")]).await;
    // A write that waits for its data (R2T) is aborted.
    let (h, r2t) = c.write10_awaiting_r2t(0, 8).await;
    // The response's ITT is checked against the request's by task_mgmt.
    let r = c.task_mgmt(tmf::ABORT_TASK, 0, h.itt, h.cmd_sn).await;
    assert_eq!(r.response, tmf::FUNCTION_COMPLETE);
    // Data for the aborted task is ignored quietly.
    let d = DataOut { final_: true, itt: h.itt, ttt: r2t.ttt, ..Default::default() };
    c.send(Pdu::new(d, Bytes::from(vec![0u8; 4096]))).await;
    // Aborting it again: it no longer exists.
    let r = c.task_mgmt(tmf::ABORT_TASK, 0, h.itt, 0).await;
    assert_eq!(r.response, tmf::TASK_DOES_NOT_EXIST);
    // LUN RESET completes; a LUN that does not exist says so.
    for (lun, want) in [(0u64, tmf::FUNCTION_COMPLETE), (5, tmf::LUN_DOES_NOT_EXIST)] {
        let r = c.task_mgmt(tmf::LOGICAL_UNIT_RESET, lun, RESERVED_TAG, 0).await;
        assert_eq!(r.response, want);
    }
    // Logout ends the session and the connection.
    let r = c.logout().await;
    assert_eq!(r.response, logout::SUCCESS);
    assert!(c.closed().await);
    t.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cmdsn_outside_the_window_is_ignored_and_gaps_are_waited_for() {
    let t = start(config(None, None, Limits { queue_depth: 8, ..Limits::default() })).await;
    let mut c = Client::session(t.addr, &[]).await;
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
    let mut good = Client::session(t.addr, &[]).await;
    let data = ramp(7, 4096);
    assert_eq!(good.write10(50, &data, 4096, 4096).await, 0);

    // Garbage before login: the connection is closed without a reply.
    let mut g = Client::connect(t.addr).await;
    g.send_raw(&[0xffu8; 200]).await;
    assert!(g.closed().await);

    // A login PDU announcing a huge data segment is refused before anything is allocated.
    let mut o = Client::connect(t.addr).await;
    let mut bhs = Header::from(LoginRequest { csg: 1, nsg: 3, transit: true, ..Default::default() }).encode();
    bhs[5..8].copy_from_slice(&[0xff, 0xff, 0xff]);
    o.send_raw(&bhs).await;
    assert!(o.closed().await);

    // In full feature phase: oversized data segment, then an unknown opcode, then truncation.
    let mut f = Client::connect(t.addr).await;
    f.isid[5] = 0x99;
    f.login(&[]).await;
    let mut bad = Header::from(NopOut { itt: 1, ttt: RESERVED_TAG, ..Default::default() }).encode();
    bad[0] = 0x1c;
    f.send_raw(&bad).await;
    let Header::Reject(r) = f.recv().await.header else { panic!() };
    assert_eq!(r.reason, reject::COMMAND_NOT_SUPPORTED);
    let mut big = Header::from(NopOut { itt: 1, ttt: RESERVED_TAG, ..Default::default() }).encode();
    big[5..8].copy_from_slice(&[0x10, 0, 0]);
    f.send_raw(&big).await;
    assert!(f.closed().await);

    let mut tr = Client::connect(t.addr).await;
    tr.isid[5] = 0x98;
    tr.login(&[]).await;
    tr.send_raw(&bhs[..20]).await;
    drop(tr);

    assert_eq!(good.read10(50, 8).await, data);
    t.stop().await;
}

// Timers under test: paused tokio time runs them without waiting.
#[tokio::test(start_paused = true)]
async fn login_flood_is_bounded_and_stalled_logins_time_out() {
    let limits = Limits { max_connections: 20, max_logins: 4, login_timeout_secs: 1, ..Limits::default() };
    let t = start(config(None, None, limits)).await;
    let mut good = Client::session(t.addr, &[]).await;
    let mut flood = Vec::new();
    for _ in 0..100 {
        if let Ok(s) = TcpStream::connect(t.addr).await {
            flood.push(s);
        }
    }
    // Existing sessions keep working during the flood.
    let data = ramp(11, 4096);
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
    let mut good = Client::session(t.addr, &[]).await;
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
        if !hog.try_send_raw(&ping, Duration::from_secs(2)).await {
            break true;
        }
        sent += ping.len();
        if sent > 1 << 30 {
            break false;
        }
    };
    assert!(stalled, "the target kept reading {sent} bytes without answers being read");
    let data = ramp(13, 4096);
    assert_eq!(good.write10(3, &data, 4096, 4096).await, 0);
    assert_eq!(good.read10(3, 8).await, data);
    drop(hog);
    t.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lun_reset_aborts_the_waiting_writes_of_other_sessions() {
    let t = start(config(None, None, Limits::default())).await;
    let mut b = Client::session(t.addr, &[("InitialR2T", "Yes"), ("ImmediateData", "No")]).await;
    // B's write waits for its data when A resets the LUN.
    let (h, r2t) = b.write10_awaiting_r2t(0, 8).await;
    let mut a = Client::connect(t.addr).await;
    a.isid = [0x80, 0, 0, 0, 0x56, 0x78];
    a.login(&[]).await;
    a.clear_ua().await;
    assert_eq!(a.task_mgmt(tmf::LOGICAL_UNIT_RESET, 0, RESERVED_TAG, 0).await.response, tmf::FUNCTION_COMPLETE);
    // The data B sends afterwards belongs to an aborted task: it is dropped, nothing answers.
    let d = DataOut { final_: true, itt: h.itt, ttt: r2t.ttt, ..Default::default() };
    b.send(Pdu::new(d, ramp(9, 4096))).await;
    // B learns of the reset from a unit attention; the resetting session does not get one.
    let (status, _, sense) = b.run(&[0u8; 6], 0, &[], 0, 0).await;
    assert_eq!(status, 2);
    assert_eq!((sense.get(4).map(|k| k & 0x0f), sense.get(14), sense.get(15)), (Some(6), Some(&0x29), Some(&0x03)));
    assert_eq!(a.run(&[0u8; 6], 0, &[], 0, 0).await.0, 0);
    // The aborted write never reached the LUN.
    assert!(b.read10(0, 8).await.iter().all(|&x| x == 0));
    t.stop().await;
}

// Timers under test: paused tokio time runs them without waiting.
#[tokio::test(start_paused = true)]
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

#[tokio::test]
async fn a_command_limit_below_one_block_is_refused_at_startup() {
    let limits = Limits { max_command_bytes: 2048, ..Limits::default() };
    let mut c = config(None, None, limits);
    c.targets[0].luns = vec![mem(16 << 20, 4096)];
    let e = stics_target::Server::bind(c).await.err().expect("refused").to_string();
    assert!(e.contains("max_command_bytes = 2048 is less than one 4096-byte block"), "{e}");
}
