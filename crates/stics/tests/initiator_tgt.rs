//! The initiator against tgt (Debian's user-space target, a peer written elsewhere): listing,
//! data integrity with digests and R2T-solicited bursts, interleaving, several sessions, CHAP,
//! the claim kept across cut connections.

use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use stics_block::BlockDev;
use stics_initiator::{Error, IscsiUrl, LoginError, Lun, LunOptions};
use stics_testkit::net::Proxy;
use stics_testkit::pattern::noise;
use stics_testkit::peers::{Tgt, TgtOptions};
use stics_testkit::workload::{fault_options, zeroing_reads_back_zeros};
use stics_testkit::IQN;

#[test]
fn ls_lists_target_and_lun_with_size_and_block_size() {
    let tgt = Tgt::start(64);
    let out = Command::new(env!("CARGO_BIN_EXE_stics"))
        .args(["ls", "--stats", &format!("iscsi://127.0.0.1:{}/", tgt.port)])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}{}", String::from_utf8_lossy(&out.stderr));
    assert!(stdout.contains(&format!("Target:{IQN} Portal:127.0.0.1:{}", tgt.port)), "{stdout}");
    assert!(stdout.contains("Lun:0    Type:STORAGE_ARRAY_CONTROLLER"), "{stdout}");
    assert!(stdout.contains("Lun:1    Type:DIRECT_ACCESS (Size:64M Blocks:131072 BlockSize:512)"), "{stdout}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("round trips"), "counters printed on request: {stderr}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn data_written_with_digests_and_r2t_bursts_reads_back_identically() {
    let digests = vec![("HeaderDigest".into(), "CRC32C".into()), ("DataDigest".into(), "CRC32C".into())];
    let tgt = Tgt::start_with(64, TgtOptions { params: digests, ..TgtOptions::default() });
    let url = IscsiUrl::parse(&tgt.url()).unwrap();
    let mut opts = LunOptions::default();
    opts.config.offer.header_digest = true;
    opts.config.offer.data_digest = true;
    // Small segments and bursts so that one command needs several Data-Out PDUs and R2Ts.
    opts.config.offer.max_recv_data_segment_length = 8192;
    opts.config.offer.first_burst_length = 16384;
    opts.config.offer.max_burst_length = 65536;
    opts.max_transfer = 4 << 20;
    let lun = Lun::open(&url, &opts).await.unwrap();
    let p = lun.sessions()[0].params();
    assert!(p.header_digest && p.data_digest, "digests in force: {p:?}");
    assert_eq!(lun.geometry().block_size, 512);
    let sizes = [512usize, 4096, 8192, 65536, 300 * 1024, 3 << 20];
    let mut lba = 0u64;
    let mut written = Vec::new();
    for (i, &n) in sizes.iter().enumerate() {
        let data = noise(i as u64 + 1, n);
        lun.write(lba, data.clone(), i % 2 == 0).await.unwrap();
        written.push((lba, data));
        lba += (n / 512) as u64 + 7;
    }
    lun.flush().await.unwrap();
    for (lba, data) in &written {
        let back = lun.read(*lba, (data.len() / 512) as u32).await.unwrap();
        assert!(back == *data, "mismatch at lba {lba}");
    }
    let c = lun.counters();
    assert!(c.round_trips > c.commands, "large writes took R2T round trips: {c:?}");
    assert!(c.pdus_sent > c.commands * 2, "{c:?}");
    lun.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn small_writes_go_as_immediate_data_in_one_round_trip() {
    let tgt = Tgt::start(16);
    let url = IscsiUrl::parse(&tgt.url()).unwrap();
    let lun = Lun::open(&url, &LunOptions::default()).await.unwrap();
    let before = lun.counters();
    for i in 0..20u64 {
        lun.write(i * 8, noise(i, 4096), false).await.unwrap();
    }
    let d = lun.counters();
    assert_eq!(d.commands - before.commands, 20);
    assert_eq!(d.round_trips - before.round_trips, 20, "no R2T for 4 KiB writes");
    assert_eq!(d.pdus_sent - before.pdus_sent, 20, "data rides in the command PDU");
    lun.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_commands_interleave_on_one_session() {
    let tgt = Tgt::start(64);
    let url = IscsiUrl::parse(&tgt.url()).unwrap();
    let lun = Arc::new(Lun::open(&url, &LunOptions::default()).await.unwrap());
    let mut set = tokio::task::JoinSet::new();
    for w in 0..32u64 {
        let lun = lun.clone();
        set.spawn(async move {
            for k in 0..20u64 {
                let lba = (w * 20 + k) * 8;
                let data = noise(lba, 4096);
                lun.write(lba, data.clone(), false).await.unwrap();
                assert_eq!(lun.read(lba, 8).await.unwrap(), data);
            }
        });
    }
    while let Some(r) = set.join_next().await {
        r.unwrap();
    }
    let c = lun.counters();
    assert!(c.max_in_flight >= 8, "commands overlapped on the session: {c:?}");
    assert_eq!(c.reconnects, 0);
    lun.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn several_sessions_share_the_load() {
    let tgt = Tgt::start(16);
    let url = IscsiUrl::parse(&tgt.url()).unwrap();
    let lun = Lun::open(&url, &LunOptions { sessions: 3, ..LunOptions::default() }).await.unwrap();
    for i in 0..30u64 {
        lun.write(i, noise(i, 512), false).await.unwrap();
    }
    for i in 0..30u64 {
        assert_eq!(lun.read(i, 1).await.unwrap(), noise(i, 512));
    }
    lun.flush().await.unwrap();
    for s in lun.sessions() {
        assert!(s.counters().commands >= 20, "each session carried commands: {:?}", s.counters());
    }
    lun.close().await;
}

fn chap_tgt() -> Tgt {
    Tgt::start_with(
        16,
        TgtOptions {
            incoming: Some(("alice".into(), "alicesecret12".into())),
            outgoing: Some(("tgtuser".into(), "targetsecret1".into())),
            params: Vec::new(),
        },
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chap_one_way_and_mutual_log_in() {
    let tgt = chap_tgt();
    let one_way = format!("iscsi://alice%alicesecret12@127.0.0.1:{}/{IQN}/1", tgt.port);
    let lun = Lun::open(&IscsiUrl::parse(&one_way).unwrap(), &LunOptions::default()).await.unwrap();
    lun.write(0, noise(1, 512), false).await.unwrap();
    lun.close().await;
    let mutual = format!("{one_way}?target_user=tgtuser&target_password=targetsecret1");
    let lun = Lun::open(&IscsiUrl::parse(&mutual).unwrap(), &LunOptions::default()).await.unwrap();
    assert_eq!(lun.read(0, 1).await.unwrap(), noise(1, 512));
    lun.close().await;
    // The target proving itself with the wrong secret is refused by us.
    let bad_mutual = format!("{one_way}?target_user=tgtuser&target_password=notthesecret");
    let e = Lun::open(&IscsiUrl::parse(&bad_mutual).unwrap(), &LunOptions::default()).await.unwrap_err();
    assert!(matches!(e, Error::Login(LoginError::Auth(_))), "{e}");
}

#[test]
fn wrong_chap_secret_is_a_clear_error_without_retries() {
    let tgt = chap_tgt();
    let url = format!("iscsi://alice%wrongsecret99@127.0.0.1:{}/{IQN}/1", tgt.port);
    let started = Instant::now();
    let out = Command::new(env!("CARGO_BIN_EXE_stics")).args(["ls", "--stats", &url]).output().unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("authentication failed"), "{stderr}");
    assert!(!stderr.contains("wrongsecret99"), "secret leaked: {stderr}");
    assert!(started.elapsed() < Duration::from_secs(5), "no retry loop");
    // No credentials at all against a CHAP target: told what to do.
    let out = Command::new(env!("CARGO_BIN_EXE_stics")).args(["ls", &tgt.url()]).output().unwrap();
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("authentication"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_chap_secret_fails_the_open_with_a_permanent_error() {
    let tgt = chap_tgt();
    let url = format!("iscsi://alice%wrongsecret99@127.0.0.1:{}/{IQN}/1", tgt.port);
    let e = Lun::open(&IscsiUrl::parse(&url).unwrap(), &LunOptions::default()).await.unwrap_err();
    assert!(e.is_permanent(), "{e}");
    assert!(e.to_string().contains("authentication failed"), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zeroing_a_range_reads_back_zeros_from_tgt() {
    let tgt = Tgt::start(16);
    zeroing_reads_back_zeros(&tgt.url()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tgt_without_thin_provisioning_refuses_discard_cleanly() {
    let tgt = Tgt::start(8);
    let lun = Lun::open(&IscsiUrl::parse(&tgt.url()).unwrap(), &LunOptions::default()).await.unwrap();
    assert!(!lun.supports_discard());
    let e = lun.discard(0, 8).await.unwrap_err();
    assert!(e.to_string().contains("does not unmap"), "{e}");
    lun.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_writer_claims_the_lun_with_a_persistent_reservation() {
    let mut tgt = Tgt::start(16);
    let url = tgt.url();
    stics_testkit::workload::one_writer_claim(&url, || tgt.restart()).await;
}

/// A restarting tgt opens its portal before its target lets initiators in, and refuses logins
/// meanwhile with "target not found". That refusal ends a first login, but a session the target
/// accepted before keeps trying within its recovery window: a write issued across the restart
/// waits and succeeds once the target is back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_is_reinstated_when_a_restarted_tgt_lets_initiators_in_late() {
    let mut tgt = Tgt::start(16);
    let url = IscsiUrl::parse(&tgt.url()).unwrap();
    let lun = Arc::new(Lun::open(&url, &LunOptions::default()).await.unwrap());
    lun.write(0, noise(1, 4096), false).await.unwrap();
    tgt.restart_unbound();
    let e = Lun::open(&url, &LunOptions::default()).await.unwrap_err();
    assert!(e.is_permanent() && e.to_string().contains("target not found"), "a first login gives up: {e}");
    let write = tokio::spawn({
        let lun = Arc::clone(&lun);
        async move { lun.write(8, noise(2, 4096), false).await }
    });
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(!write.is_finished(), "the write waits for the target");
    tgt.finish_restart();
    write.await.unwrap().unwrap();
    assert_eq!(lun.read(8, 8).await.unwrap(), noise(2, 4096));
    assert!(lun.sessions().iter().any(|s| s.logins() > 1), "the session was reinstated");
    Arc::into_inner(lun).unwrap().close().await;
}

/// tgt ties registrations to the session: after a cut connection the reinstated session is
/// refused writes and SYNCHRONIZE CACHE with RESERVATION CONFLICT. A write on the wire when the
/// connection was cut (reissued, refused, claimed again, sent again) and a flush after another cut
/// both succeed, and the claim still keeps other writers out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_on_tgt_is_taken_again_after_a_cut_connection() {
    const KEY: u64 = 0x5717_c5ca_c4e0_0003;
    let tgt = Tgt::start(16);
    let proxy = Proxy::start(tgt.port);
    let lun = Arc::new(Lun::open(&IscsiUrl::parse(&tgt.url_via(proxy.port)).unwrap(), &fault_options()).await.unwrap());
    assert_eq!(lun.claim(KEY).await.unwrap(), stics_block::Claim::Held);
    lun.write(0, noise(1, 4096), false).await.unwrap();
    // The write leaves before the cut and is lost with the connection.
    proxy.freeze(true);
    let write = tokio::spawn({
        let lun = Arc::clone(&lun);
        async move { lun.write(8, noise(2, 4096), false).await }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    proxy.freeze(false);
    proxy.cut();
    write.await.unwrap().unwrap();
    assert_eq!(lun.sessions()[0].logins(), 2, "the session was reinstated once");
    // A cut with nothing in flight: the flush is the first command of the new session.
    proxy.cut();
    let t = Instant::now();
    while lun.sessions()[0].logins() < 3 {
        assert!(t.elapsed() < Duration::from_secs(10), "the session was not reinstated");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    lun.flush().await.unwrap();
    assert!(lun.resets() >= 2, "each reinstatement counts");
    assert_eq!(lun.read(0, 16).await.unwrap(), [noise(1, 4096), noise(2, 4096)].concat());
    let stray = Lun::open(&IscsiUrl::parse(&tgt.url()).unwrap(), &LunOptions::default()).await.unwrap();
    let e = stray.write(16, noise(3, 512), false).await.unwrap_err();
    assert!(matches!(e, stics_block::BlockError::Reserved { holder: None }), "{e:?}");
    stray.close().await;
    lun.close().await;
}

/// A writer whose claim was broken while its connection was down (`stics release` naming its
/// key, then another writer's claim) does not take the LUN back: its next write fails naming the
/// new holder's key, and the ones after it fail without trying again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_lost_to_another_key_on_tgt_is_not_taken_back() {
    const K1: u64 = 0x5717_c5ca_c4e0_0004;
    const K2: u64 = 0x5717_c5ca_c4e0_0005;
    let tgt = Tgt::start(16);
    let proxy = Proxy::start(tgt.port);
    let a = Lun::open(&IscsiUrl::parse(&tgt.url_via(proxy.port)).unwrap(), &fault_options()).await.unwrap();
    assert_eq!(a.claim(K1).await.unwrap(), stics_block::Claim::Held);
    a.write(0, noise(1, 4096), false).await.unwrap();
    proxy.cut();
    let t = Instant::now();
    while a.sessions()[0].logins() < 2 {
        assert!(t.elapsed() < Duration::from_secs(10), "the session was not reinstated");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let b = Lun::open(&IscsiUrl::parse(&tgt.url()).unwrap(), &LunOptions::default()).await.unwrap();
    b.release_holder(K1).await.unwrap();
    assert_eq!(b.claim(K2).await.unwrap(), stics_block::Claim::Held);
    let e = a.write(8, noise(2, 4096), false).await.unwrap_err();
    assert!(matches!(e, stics_block::BlockError::Reserved { holder: Some(K2) }), "{e:?}");
    assert!(!e.is_transient());
    let e = a.write(8, noise(2, 4096), false).await.unwrap_err();
    assert!(matches!(e, stics_block::BlockError::Reserved { holder: None }), "{e:?}");
    b.write(8, noise(3, 4096), false).await.unwrap();
    assert_eq!(b.read(8, 8).await.unwrap(), noise(3, 4096));
    a.close().await;
    b.close().await;
}
