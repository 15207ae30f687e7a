//! The initiator against `stics target`: listing, data integrity with digests and R2T bursts,
//! CHAP, and a SIGKILL of the target in the middle of a verified workload.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use bytes::Bytes;
use stics_block::BlockDev;
use stics_initiator::{IscsiUrl, Lun, LunOptions};
use stics_testkit::peers::SticsTarget;
use stics_testkit::workload::{run_with_fault, zeroing_reads_back_zeros};
use stics_testkit::IQN;

/// `stics target` with LUN 0 on a sparse file of `size_mib` MiB.
fn start(size_mib: u64, extra: &[&str]) -> SticsTarget {
    SticsTarget::with_file_lun(Path::new(env!("CARGO_BIN_EXE_stics")), size_mib, extra)
}

#[test]
fn ls_lists_the_stics_target_and_its_file_lun() {
    let t = start(32, &[]);
    let out = Command::new(env!("CARGO_BIN_EXE_stics"))
        .args(["ls", &format!("iscsi://127.0.0.1:{}", t.port)])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}{}", String::from_utf8_lossy(&out.stderr));
    assert!(stdout.contains(&format!("Target:{IQN}")), "{stdout}");
    assert!(stdout.contains("Lun:0    Type:DIRECT_ACCESS (Size:32M Blocks:65536 BlockSize:512)"), "{stdout}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn data_with_digests_and_r2t_bursts_reads_back_from_stics_target() {
    let t = start(32, &[]);
    let mut opts = LunOptions::default();
    opts.config.offer.header_digest = true;
    opts.config.offer.data_digest = true;
    opts.config.offer.initial_r2t = true;
    opts.config.offer.first_burst_length = 16384;
    opts.config.offer.max_burst_length = 65536;
    opts.max_transfer = 2 << 20;
    let lun = Lun::open(&IscsiUrl::parse(&t.url(0)).unwrap(), &opts).await.unwrap();
    let p = lun.sessions()[0].params();
    assert!(p.header_digest && p.data_digest, "{p:?}");
    let data: Bytes =
        (0..(2u32 << 20)).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8).collect::<Vec<u8>>().into();
    lun.write(100, data.clone(), true).await.unwrap();
    lun.flush().await.unwrap();
    assert!(lun.read(100, 4096).await.unwrap() == data);
    let c = lun.counters();
    assert!(c.round_trips > c.commands, "R2T round trips: {c:?}");
    lun.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mutual_chap_with_stics_target_and_wrong_secret_refused() {
    let t = start(
        8,
        &[
            "--chap-user",
            "alice",
            "--chap-secret",
            "alicesecret12",
            "--mutual-user",
            "tgt",
            "--mutual-secret",
            "targetsecret1",
        ],
    );
    let base = format!("iscsi://alice%alicesecret12@127.0.0.1:{}/{IQN}/0", t.port);
    let url = format!("{base}?target_user=tgt&target_password=targetsecret1");
    let lun = Lun::open(&IscsiUrl::parse(&url).unwrap(), &LunOptions::default()).await.unwrap();
    lun.write(0, Bytes::from(vec![5u8; 512]), false).await.unwrap();
    lun.close().await;
    let bad = format!("iscsi://alice%nottheright1@127.0.0.1:{}/{IQN}/0", t.port);
    let e = Lun::open(&IscsiUrl::parse(&bad).unwrap(), &LunOptions::default()).await.unwrap_err();
    assert!(e.to_string().contains("authentication failed"), "{e}");
}

#[test]
fn stics_target_killed_and_restarted_mid_workload_loses_no_write() {
    let mut t = start(16, &[]);
    let url = t.url(0);
    let c = run_with_fault(&url, 4, || {
        std::thread::sleep(Duration::from_millis(1000));
        t.kill();
        std::thread::sleep(Duration::from_millis(500));
        t.restart();
    });
    assert!(c.reconnects >= 1, "{c:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zeroing_a_range_is_one_write_same_on_stics_target() {
    let t = start(32, &[]);
    let used = zeroing_reads_back_zeros(&t.url(0)).await;
    assert_eq!(used, 1, "9000 blocks zeroed by one WRITE SAME");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn discard_unmaps_blocks_of_a_stics_file_lun_and_they_read_zero() {
    use std::os::unix::fs::MetadataExt;
    let t = start(32, &[]);
    let lun = Lun::open(&IscsiUrl::parse(&t.url(0)).unwrap(), &LunOptions::default()).await.unwrap();
    assert!(lun.supports_discard(), "a file LUN is thin-provisioned and unmapped blocks read zero");
    lun.write(0, Bytes::from(vec![0x77u8; 8 << 20]), false).await.unwrap();
    lun.flush().await.unwrap();
    let allocated = std::fs::metadata(t.file()).unwrap().blocks();
    // 4 MiB from block 2048: whole file-system blocks, so the hole is real.
    lun.discard(2048, 8192).await.unwrap();
    lun.flush().await.unwrap();
    let b = lun.read(0, 16384).await.unwrap();
    assert!(b[..2048 * 512].iter().all(|&x| x == 0x77));
    assert!(b[2048 * 512..10_240 * 512].iter().all(|&x| x == 0));
    assert!(b[10_240 * 512..].iter().all(|&x| x == 0x77));
    let after = std::fs::metadata(t.file()).unwrap().blocks();
    assert!(after + 8000 <= allocated, "space freed: {allocated} → {after} sectors");
    lun.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_writer_claims_the_lun_with_a_persistent_reservation() {
    let mut t = start(16, &[]);
    let url = t.url(0);
    stics_testkit::workload::one_writer_claim(&url, || t.restart()).await;
}
