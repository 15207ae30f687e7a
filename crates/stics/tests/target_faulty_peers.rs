//! `stics target` under faulty and hostile peers, each case with a raw client: data digest
//! errors on immediate data and on Data-Out end the command with CHECK CONDITION and the session
//! goes on; an ABORT TASK for a command that never arrived fills its CmdSN; a peer that never
//! reads holds memory under the configured bound; dead peers give their session slots back
//! within the keep-alive timeout; a flood of bad PDUs is logged a few lines at a time, with
//! counts of what was left out.

use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, Instant};

use bytes::Bytes;
use stics_testkit::client::{encode, write10_cdb, Client};
use stics_testkit::peers::{SticsOptions, SticsTarget};
use stics_wire::pdu::{reject, tmf, DataOut, Header, NopOut, Pdu, ScsiCommand, RESERVED_TAG};
use stics_wire::Digests;

const IQN: &str = stics_testkit::IQN;

/// `stics target` with a TOML config of `limits` (lines of `[limits]`) and one LUN, logging to
/// `log` when given.
fn start(dir: &Path, limits: &str, lun: &str, log: Option<&Path>) -> SticsTarget {
    let config = dir.join("target.toml");
    std::fs::write(&config, format!("[limits]\n{limits}\n[[target]]\niqn = \"{IQN}\"\nluns = [\"{lun}\"]\n")).unwrap();
    let options = SticsOptions {
        iqn: None,
        args: vec!["--config".into(), config.display().to_string()],
        env: vec![("RUST_LOG".into(), "info".into())],
        stderr: log.map(Path::to_owned),
    };
    SticsTarget::start(Path::new(env!("CARGO_BIN_EXE_stics")), options)
}

fn addr(t: &SticsTarget) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], t.port))
}

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap()
}

/// `p` encoded with the client's digests and its data digest broken.
fn with_bad_data_digest(p: &Pdu, digests: Digests) -> Vec<u8> {
    let mut b = encode(p, digests);
    let n = b.len();
    b[n - 1] ^= 0x5a;
    b.to_vec()
}

/// The sense key, ASC and ASCQ of a CHECK CONDITION response's sense segment.
fn sense_of(data: &Bytes) -> (u8, u8, u8) {
    let s = &data[2..];
    (s[2] & 0x0f, s[12], s[13])
}

const CRC_ERROR: (u8, u8, u8) = (0x0b, 0x47, 0x05);

async fn expect_digest_reject(c: &mut Client) {
    match c.recv_header().await {
        Header::Reject(r) => assert_eq!(r.reason, reject::DIGEST_ERROR),
        other => panic!("expected a Reject for the data digest, got {other:?}"),
    }
}

/// The SCSI Response for `itt`: its status and sense segment.
async fn expect_response(c: &mut Client, itt: u32) -> (u8, Bytes) {
    let p = c.recv().await;
    match p.header {
        Header::ScsiResponse(r) => {
            assert_eq!(r.itt, itt);
            (r.status, p.data)
        }
        other => panic!("expected the SCSI Response of {itt:#x}, got {other:?}"),
    }
}

#[test]
fn a_data_digest_error_on_immediate_data_ends_the_command_and_the_session_goes_on() {
    let dir = tempfile::tempdir().unwrap();
    let t = start(dir.path(), "", "mem:64MiB", None);
    rt().block_on(async {
        let mut c = Client::connect(addr(&t)).await;
        c.login(&[("DataDigest", "CRC32C"), ("ImmediateData", "Yes"), ("InitialR2T", "No")]).await;
        assert!(c.digests.data, "the target agreed to data digests");
        c.clear_ua().await;
        // All the data immediate, its digest broken.
        let h = c.cmd(&write10_cdb(0, 8), 0, 4096, false);
        let bad = with_bad_data_digest(&Pdu::new(h, Bytes::from(vec![0xabu8; 4096])), c.digests);
        c.send_raw(&bad).await;
        expect_digest_reject(&mut c).await;
        let (status, sense) = expect_response(&mut c, h.itt).await;
        assert_eq!((status, sense_of(&sense)), (0x02, CRC_ERROR));
        // The next CmdSN is not held behind a hole, and nothing was written.
        assert_eq!(c.read10(0, 8).await, vec![0u8; 4096]);
        // The initiator retries, and the write lands.
        assert_eq!(c.write10(0, &[0xabu8; 4096], 4096, 4096).await, 0);
        assert_eq!(c.read10(0, 8).await, vec![0xabu8; 4096]);
        c.logout().await;
    });
}

#[test]
fn a_data_digest_error_on_a_solicited_data_out_ends_the_write_once_its_data_is_in() {
    let dir = tempfile::tempdir().unwrap();
    let t = start(dir.path(), "", "mem:64MiB", None);
    rt().block_on(async {
        let mut c = Client::connect(addr(&t)).await;
        c.login(&[("DataDigest", "CRC32C"), ("ImmediateData", "No"), ("InitialR2T", "Yes")]).await;
        c.clear_ua().await;
        let (h, r2t) = c.write10_awaiting_r2t(16, 16).await;
        assert_eq!(r2t.desired_len, 8192);
        let first = DataOut { final_: false, itt: h.itt, ttt: r2t.ttt, data_sn: 0, ..Default::default() };
        c.send_raw(&with_bad_data_digest(&Pdu::new(first, Bytes::from(vec![1u8; 4096])), c.digests)).await;
        expect_digest_reject(&mut c).await;
        let last =
            DataOut { final_: true, itt: h.itt, ttt: r2t.ttt, data_sn: 1, buffer_offset: 4096, ..Default::default() };
        c.send(Pdu::new(last, Bytes::from(vec![1u8; 4096]))).await;
        let (status, sense) = expect_response(&mut c, h.itt).await;
        assert_eq!((status, sense_of(&sense)), (0x02, CRC_ERROR));
        assert_eq!(c.read10(16, 16).await, vec![0u8; 8192], "a write with lost data is not executed");
        c.logout().await;
    });
}

#[test]
fn abort_task_of_a_command_that_never_arrived_fills_its_cmdsn() {
    let dir = tempfile::tempdir().unwrap();
    let t = start(dir.path(), "", "mem:64MiB", None);
    rt().block_on(async {
        let mut c = Client::session(addr(&t), &[]).await;
        // The command of this CmdSN is lost on the way; the one after it waits behind the hole.
        let lost = c.cmd(&write10_cdb(0, 1), 0, 512, false);
        let read = c.cmd(&[0x28, 0, 0, 0, 0, 0, 0, 0, 1, 0], 512, 0, false);
        c.send(Pdu::new(read, Bytes::new())).await;
        assert!(c.try_recv(Duration::from_millis(300)).await.is_none(), "nothing runs before the gap fills");
        let r = c.task_mgmt(tmf::ABORT_TASK, 0, lost.itt, lost.cmd_sn).await;
        assert_eq!(r.response, tmf::FUNCTION_COMPLETE);
        let p = c.recv().await;
        assert!(
            matches!(p.header, Header::DataIn(d) if d.itt == read.itt && d.status_present && d.status == 0),
            "the command after the hole completes: {:?}",
            p.header
        );
        assert_eq!(c.read10(0, 1).await, vec![0u8; 512]);
        c.logout().await;
    });
}

/// A raw session that sends `count` READ(16)s of `len` bytes in one write and never reads.
async fn greedy_reader(addr: SocketAddr, isid: u8, count: u32, len: u32) -> Client {
    let mut c = Client::connect(addr).await;
    c.isid[5] = isid;
    c.login(&[]).await;
    let mut burst = Vec::new();
    for i in 0..count {
        let mut cdb = [0u8; 16];
        cdb[0] = 0x88;
        cdb[2..10].copy_from_slice(&(u64::from(i) * u64::from(len / 512)).to_be_bytes());
        cdb[10..14].copy_from_slice(&(len / 512).to_be_bytes());
        let h: ScsiCommand = c.cmd(&cdb, len, 0, false);
        burst.extend_from_slice(&encode(&Pdu::new(h, Bytes::new()), c.digests));
    }
    c.send_raw(&burst).await;
    c
}

#[test]
fn peers_that_never_read_hold_memory_under_the_configured_bounds() {
    let dir = tempfile::tempdir().unwrap();
    let limits = "max_command_bytes = 67108864\nsession_output_buffer_bytes = 67108864\n\
                  target_output_buffer_bytes = 134217728";
    // A sparse file: every read fills a fresh buffer (a memory LUN could hand out shared zeros).
    let lun = format!("file:{}:8GiB", dir.path().join("lun.img").display());
    let mut t = start(dir.path(), limits, &lun, None);
    rt().block_on(async {
        // Warm up the allocator with one normal read, then measure.
        let mut good = Client::session(addr(&t), &[]).await;
        assert_eq!(good.read10(0, 8).await.len(), 4096);
        let baseline = t.process().rss_kib().unwrap();
        // Four sessions, each asking for 128 reads of 64 MiB (32 GiB in all) without reading.
        let mut greedy = Vec::new();
        for i in 0..4u8 {
            greedy.push(greedy_reader(addr(&t), 0x40 + i, 128, 64 << 20).await);
        }
        let mut peak = baseline;
        for _ in 0..40 {
            tokio::time::sleep(Duration::from_millis(250)).await;
            peak = peak.max(t.process().rss_kib().unwrap());
        }
        eprintln!("RSS KiB: baseline {baseline}, peak while 4 peers never read {peak}");
        // The target bound (128 MiB) plus one session's worth in flight and slack for the
        // runtime and socket buffers.
        assert!(peak < baseline + 256 * 1024, "RSS grew from {baseline} to {peak} KiB");
        // Other sessions still get their reads within the target bound's turn.
        drop(greedy);
        assert_eq!(good.read10(0, 8).await.len(), 4096);
        good.logout().await;
    });
}

#[test]
fn dead_and_silent_peers_give_their_session_slots_back_within_the_keep_alive_timeout() {
    let dir = tempfile::tempdir().unwrap();
    let limits = "max_sessions = 4\nnop_in_interval_secs = 2\nnop_in_timeout_secs = 2\nwarning_interval_secs = 1";
    let t = start(dir.path(), limits, "mem:1GiB", None);
    rt().block_on(async {
        // Four sessions fill their output queues.
        let mut peers = Vec::new();
        for i in 0..4u8 {
            peers.push(greedy_reader(addr(&t), 0x10 + i, 64, 8 << 20).await);
        }
        let mut refused = Client::connect(addr(&t)).await;
        refused.isid[5] = 0x30;
        let kv = [
            ("InitiatorName", refused.initiator.clone()),
            ("SessionType", "Normal".into()),
            ("TargetName", IQN.into()),
        ];
        let (r, _) = refused.login_step(1, 3, true, &kv).await;
        assert_eq!(r.status_class, 3, "the fifth session is refused while four live");
        // Two reset their connections; two stay open and never read again.
        let silent = peers.split_off(2);
        for c in peers {
            c.reset();
        }
        // Within the ping interval plus its timeout (and slack), every slot is free again.
        let start = Instant::now();
        let mut fresh = Vec::new();
        for i in 0..4u8 {
            loop {
                let mut c = Client::connect(addr(&t)).await;
                c.isid[5] = 0x50 + i;
                let kv = [
                    ("InitiatorName", c.initiator.clone()),
                    ("SessionType", "Normal".into()),
                    ("TargetName", IQN.into()),
                ];
                let (r, answers) = c.login_step(1, 3, true, &kv).await;
                if r.status_class == 0 {
                    c.apply(&answers);
                    fresh.push(c);
                    break;
                }
                assert!(
                    start.elapsed() < Duration::from_secs(12),
                    "session slots still held after {:?}",
                    start.elapsed()
                );
                tokio::time::sleep(Duration::from_millis(200)).await;
                // The sessions already in keep talking, or they would be taken for dead too.
                for f in &mut fresh {
                    let nop = NopOut {
                        immediate: true,
                        itt: RESERVED_TAG,
                        ttt: RESERVED_TAG,
                        cmd_sn: f.cmd_sn,
                        ..Default::default()
                    };
                    f.send(Pdu::new(nop, Bytes::new())).await;
                }
            }
        }
        eprintln!("four new sessions logged in {:?} after the peers died or went silent", start.elapsed());
        for c in &mut fresh {
            c.clear_ua().await;
            assert_eq!(c.read10(0, 1).await.len(), 512);
        }
        drop(silent);
    });
}

#[test]
fn a_flood_of_bad_pdus_is_logged_a_few_lines_at_a_time_with_counts_of_the_rest() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("target.log");
    let t = start(dir.path(), "warning_interval_secs = 3", "mem:64MiB", Some(&log));
    rt().block_on(async {
        // Twenty connections, each sending a SCSI command before logging in.
        let cmd = ScsiCommand { final_: true, read: true, expected_len: 512, ..Default::default() };
        let bytes = encode(&Pdu::new(cmd, Bytes::new()), Digests::default());
        for _ in 0..20 {
            let mut c = Client::connect(addr(&t)).await;
            c.send_raw(&bytes).await;
            assert!(c.closed().await);
        }
        // After the interval, the next one is logged with the count of those left out.
        tokio::time::sleep(Duration::from_millis(3200)).await;
        let mut c = Client::connect(addr(&t)).await;
        c.send_raw(&bytes).await;
        assert!(c.closed().await);
    });
    let text = std::fs::read_to_string(&log).unwrap();
    let lines: Vec<&str> = text.lines().filter(|l| l.contains("non-login PDU during login")).collect();
    assert_eq!(lines.len(), 6, "five lines, then one after the interval: {lines:#?}");
    assert!(lines[5].contains("suppressed=15"), "{}", lines[5]);
}
