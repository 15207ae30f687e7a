//! Command-family tests: a `Device` over memory, null and file devices, no network.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use proptest::prelude::*;
use stics_block::{BlockDev, BlockError, FileDev, Geometry, MemDev, NullDev};
use stics_testkit::client::{read10_cdb, write10_cdb};
use stics_testkit::faults::{FaultDev, Op, Rule};

use crate::*;

const BS: u32 = 512;
const NB: u64 = 4096;

fn nexus(id: u64) -> Nexus {
    Nexus {
        id,
        initiator_name: format!("iqn.2024-01.org.test:init{id}"),
        isid: [0x80, 0, 0, 0, 0, id as u8],
        target_name: "iqn.2024-01.org.test:target".into(),
        tpgt: 1,
    }
}

fn mem_device() -> Device {
    let lu = LogicalUnit::new(Arc::new(MemDev::new(BS, NB)), LuConfig::default());
    Device::new(vec![Arc::new(lu)])
}

fn cmd(cdb: &[u8], expected_len: u32, data_out: &[u8]) -> Command {
    let mut c = cdb.to_vec();
    c.resize(16.max(cdb.len()), 0);
    Command {
        lun: 0,
        cdb: Bytes::from(c),
        expected_len,
        direction: if data_out.is_empty() { Direction::Read } else { Direction::Write },
        data_out: Bytes::copy_from_slice(data_out),
        attr: TaskAttr::Simple,
    }
}

async fn run(d: &Device, n: &Nexus, cdb: &[u8], edtl: u32, out: &[u8]) -> Response {
    d.execute(n, cmd(cdb, edtl, out)).await
}

fn sense(r: &Response) -> (u8, u8, u8) {
    r.sense_triple().expect("sense data")
}

const ILLEGAL: u8 = 0x05;

#[tokio::test]
async fn write_then_read_round_trips() {
    let d = mem_device();
    let n = nexus(1);
    let data: Vec<u8> = (0..4 * BS).map(|i| i as u8).collect();
    let r = run(&d, &n, &write10_cdb(10, 4), 4 * BS, &data).await;
    assert_eq!((r.status, r.residual), (0, Residual::None));
    let r = run(&d, &n, &read10_cdb(10, 4), 4 * BS, &[]).await;
    assert_eq!(r.status, 0);
    assert_eq!(&r.data_in[..], &data[..]);
}

#[tokio::test]
async fn read_residuals_follow_rfc7143() {
    let d = mem_device();
    let n = nexus(1);
    let r = run(&d, &n, &read10_cdb(0, 1), 0, &[]).await;
    assert_eq!((r.status, r.residual, r.data_in.len()), (0, Residual::Overflow(BS), 0));
    let r = run(&d, &n, &read10_cdb(0, 1), 10000, &[]).await;
    assert_eq!((r.status, r.residual, r.data_in.len()), (0, Residual::Underflow(10000 - BS), BS as usize));
    let r = run(&d, &n, &read10_cdb(0, 1), 200, &[]).await;
    assert_eq!((r.status, r.residual, r.data_in.len()), (0, Residual::Overflow(BS - 200), 200));
    let r = run(&d, &n, &read10_cdb(0, 2), BS, &[]).await;
    assert_eq!((r.status, r.residual, r.data_in.len()), (0, Residual::Overflow(BS), BS as usize));
}

#[tokio::test]
async fn write_with_edtl_shorter_than_cdb_writes_whole_blocks_and_reports_overflow() {
    let d = mem_device();
    let n = nexus(1);
    let a = vec![b'a'; 2 * BS as usize];
    // EDTL 0: GOOD, nothing written, the whole block is overflow.
    run(&d, &n, &write10_cdb(0, 2), 2 * BS, &a).await;
    let r = run(&d, &n, &write10_cdb(0, 1), 0, &[]).await;
    assert_eq!((r.status, r.residual), (0, Residual::Overflow(BS)));
    // EDTL 200 of a 512-byte block: a partial block is never written.
    let r = run(&d, &n, &write10_cdb(0, 1), 200, &[b'b'; 200]).await;
    assert_eq!((r.status, r.residual), (0, Residual::Overflow(BS - 200)));
    let r = run(&d, &n, &read10_cdb(0, 2), 2 * BS, &[]).await;
    assert!(r.data_in.iter().all(|&b| b == b'a'));
    // Two blocks with EDTL of one: the first is written, the second untouched.
    for wv in [0x2a, 0x2e] {
        run(&d, &n, &write10_cdb(0, 2), 2 * BS, &a).await;
        let mut cdb = write10_cdb(0, 2);
        cdb[0] = wv;
        let r = run(&d, &n, &cdb, BS, &vec![b'b'; BS as usize]).await;
        assert_eq!((r.status, r.residual), (0, Residual::Overflow(BS)), "opcode {wv:#x}");
        let r = run(&d, &n, &read10_cdb(0, 2), 2 * BS, &[]).await;
        assert!(r.data_in[..BS as usize].iter().all(|&b| b == b'b'));
        assert!(r.data_in[BS as usize..].iter().all(|&b| b == b'a'));
    }
}

#[tokio::test]
async fn write_with_edtl_longer_than_cdb_writes_only_the_cdb_length() {
    let d = mem_device();
    let n = nexus(1);
    run(&d, &n, &write10_cdb(0, 2), 2 * BS, &vec![b'a'; 2 * BS as usize]).await;
    let r = run(&d, &n, &write10_cdb(0, 1), 2 * BS, &vec![b'c'; 2 * BS as usize]).await;
    assert_eq!((r.status, r.residual), (0, Residual::Underflow(BS)));
    let r = run(&d, &n, &read10_cdb(0, 2), 2 * BS, &[]).await;
    assert!(r.data_in[..BS as usize].iter().all(|&b| b == b'c'));
    assert!(r.data_in[BS as usize..].iter().all(|&b| b == b'a'));
}

#[tokio::test]
async fn compare_and_write_with_edtl_not_matching_the_cdb_is_invalid_field_in_cdb() {
    let d = mem_device();
    let n = nexus(1);
    // 256 blocks encode as NUMBER OF LOGICAL BLOCKS 0, with 2 x 256 blocks of data.
    let caw0 = [0x89, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0];
    let r = run(&d, &n, &caw0, 2 * 256 * BS, &vec![0; 2 * 256 * BS as usize]).await;
    assert_eq!((r.status, sense(&r)), (2, (ILLEGAL, 0x24, 0)));
    // A true zero-block COMPARE AND WRITE is not an error.
    assert_eq!(run(&d, &n, &caw0, 0, &[]).await.status, 0);
    // One block in the CDB, data for two.
    let mut caw1 = caw0;
    caw1[13] = 1;
    let r = run(&d, &n, &caw1, 4 * BS, &vec![0; 4 * BS as usize]).await;
    assert_eq!(sense(&r), (ILLEGAL, 0x24, 0));
    let r = run(&d, &n, &caw1, 2 * BS, &vec![0; 2 * BS as usize]).await;
    assert_eq!(r.status, 0);
}

#[tokio::test]
async fn block_limits_max_unmap_lba_count_is_at_most_one_mebiblock() {
    let d = mem_device();
    let n = nexus(1);
    let r = run(&d, &n, &[0x12, 1, 0xb0, 0, 64, 0], 64, &[]).await;
    assert_eq!(r.status, 0);
    let max_unmap = u32::from_be_bytes([r.data_in[20], r.data_in[21], r.data_in[22], r.data_in[23]]);
    assert!(max_unmap > 0 && max_unmap <= 1 << 20, "{max_unmap}");
}

#[tokio::test]
async fn write_same10_of_zero_blocks_with_unmap_unmaps_to_the_end_whatever_the_data() {
    let d = mem_device();
    let n = nexus(1);
    for i in [1u32, 7, 256] {
        let lba = NB as u32 - i;
        run(&d, &n, &write10_cdb(lba, i as u16), i * BS, &vec![0xff; (i * BS) as usize]).await;
        let mut ws = [0x41, 0x08, 0, 0, 0, 0, 0, 0, 0, 0];
        ws[2..6].copy_from_slice(&lba.to_be_bytes());
        let r = run(&d, &n, &ws, BS, &[0xff; BS as usize]).await;
        assert_eq!(r.status, 0);
        let r = run(&d, &n, &read10_cdb(lba, i as u16), i * BS, &[]).await;
        assert!(r.data_in.iter().all(|&b| b == 0), "{i} blocks");
    }
}

#[tokio::test]
async fn lun_reset_spares_the_resetting_nexus_the_unit_attention() {
    let d = mem_device();
    let (a, b) = (nexus(1), nexus(2));
    d.nexus_added(&a);
    d.nexus_added(&b);
    run(&d, &a, &[0, 0, 0, 0, 0, 0], 0, &[]).await;
    run(&d, &b, &[0, 0, 0, 0, 0, 0], 0, &[]).await;
    assert_eq!(run(&d, &a, &[0x16, 0, 0, 0, 0, 0], 0, &[]).await.status, 0);
    assert_eq!(d.lun_reset(0, &a), TmfResult::Complete);
    // The reset released the reservation; the resetting nexus goes on without a unit attention.
    assert_eq!(run(&d, &a, &[0, 0, 0, 0, 0, 0], 0, &[]).await.status, 0);
    assert_eq!(sense(&run(&d, &b, &[0, 0, 0, 0, 0, 0], 0, &[]).await), (0x06, 0x29, 0x03));
    assert_eq!(run(&d, &b, &[0x16, 0, 0, 0, 0, 0], 0, &[]).await.status, 0);
    // A warm target reset does the same; a cold one tells everybody.
    assert_eq!(d.target_reset(&b, false), TmfResult::Complete);
    assert_eq!(run(&d, &b, &[0, 0, 0, 0, 0, 0], 0, &[]).await.status, 0);
    assert_eq!(sense(&run(&d, &a, &[0, 0, 0, 0, 0, 0], 0, &[]).await), (0x06, 0x29, 0x03));
    d.target_reset(&b, true);
    assert_eq!(sense(&run(&d, &b, &[0, 0, 0, 0, 0, 0], 0, &[]).await), (0x06, 0x29, 0x01));
}

#[tokio::test]
async fn zero_length_transfers_and_read6_256() {
    let d = mem_device();
    let n = nexus(1);
    let r = run(&d, &n, &read10_cdb(0, 0), 0, &[]).await;
    assert_eq!((r.status, r.residual), (0, Residual::None));
    let r = run(&d, &n, &read10_cdb(NB as u32 + 1, 0), 0, &[]).await;
    assert_eq!(sense(&r), (ILLEGAL, 0x21, 0));
    let r = run(&d, &n, &[0x08, 0, 0, 0, 0, 0], 256 * BS, &[]).await;
    assert_eq!((r.status, r.data_in.len()), (0, 256 * BS as usize));
    let r = run(&d, &n, &write10_cdb(0, 0), 0, &[]).await;
    assert_eq!(r.status, 0);
}

#[tokio::test]
async fn beyond_end_is_lba_out_of_range() {
    let d = mem_device();
    let n = nexus(1);
    for (lba, blocks) in [(NB as u32, 1u16), (NB as u32 - 1, 2), (u32::MAX, 1), (0x8000_0000, 1)] {
        let r = run(&d, &n, &read10_cdb(lba, blocks), u32::from(blocks) * BS, &[]).await;
        assert_eq!(sense(&r), (ILLEGAL, 0x21, 0), "lba {lba}");
        let r =
            run(&d, &n, &write10_cdb(lba, blocks), u32::from(blocks) * BS, &vec![0; usize::from(blocks) * 512]).await;
        assert_eq!(sense(&r), (ILLEGAL, 0x21, 0), "lba {lba}");
    }
}

#[tokio::test]
async fn large_reads_work_and_oversized_transfers_are_invalid_field() {
    let lu = LogicalUnit::new(Arc::new(NullDev::new(512, 1 << 24)), LuConfig::default());
    let d = Device::new(vec![Arc::new(lu)]);
    let n = nexus(1);
    let mut c = vec![0xa8, 0, 0, 0, 0, 0];
    c.extend_from_slice(&65536u32.to_be_bytes());
    c.extend_from_slice(&[0, 0]);
    let r = run(&d, &n, &c, 32 << 20, &[]).await;
    assert_eq!((r.status, r.data_in.len()), (0, 32 << 20));
    let too_many = (MAX_TRANSFER_BYTES / 512 + 1) as u32;
    c[6..10].copy_from_slice(&too_many.to_be_bytes());
    let r = run(&d, &n, &c, 0, &[]).await;
    assert_eq!(sense(&r), (ILLEGAL, 0x24, 0));
    assert_eq!(&r.sense.unwrap()[15..18], &[0xc0, 0, 6]);
}

#[tokio::test]
async fn block_limits_report_and_enforce_the_configured_transfer_length() {
    let cfg = LuConfig { max_transfer_bytes: 1 << 20, ..LuConfig::default() };
    let lu = LogicalUnit::new(Arc::new(NullDev::new(512, 1 << 24)), cfg);
    let d = Device::new(vec![Arc::new(lu)]);
    let n = nexus(1);
    let r = run(&d, &n, &[0x12, 1, 0xb0, 0, 64, 0], 64, &[]).await;
    let blocks = 2048u32.to_be_bytes();
    assert_eq!(&r.data_in[8..12], &blocks, "MAXIMUM TRANSFER LENGTH");
    assert_eq!(&r.data_in[16..20], &blocks, "MAXIMUM PREFETCH LENGTH");
    let r = run(&d, &n, &read10_cdb(0, 2048), 1 << 20, &[]).await;
    assert_eq!(r.status, 0);
    let r = run(&d, &n, &read10_cdb(0, 2049), (1 << 20) + 512, &[]).await;
    assert_eq!(sense(&r), (ILLEGAL, 0x24, 0));
}

#[tokio::test]
async fn inquiry_standard_vpd_and_missing_lun() {
    let d = mem_device();
    let n = nexus(1);
    let r = run(&d, &n, &[0x12, 0, 0, 0, 255, 0], 255, &[]).await;
    assert_eq!(r.status, 0);
    let b = &r.data_in;
    assert_eq!((b[0], b[2], b[3] & 0x0f, usize::from(b[4]) + 5), (0, 6, 2, b.len()));
    assert_eq!(r.residual, Residual::Underflow(255 - b.len() as u32));
    assert!(b[58..74].chunks(2).any(|c| c == [0x04, 0x60]));
    let r = run(&d, &n, &[0x12, 1, 0, 0, 255, 0], 255, &[]).await;
    assert_eq!(&r.data_in[4..], &[0x00, 0x80, 0x83, 0x86, 0xb0, 0xb1, 0xb2]);
    // Extended INQUIRY Data: HEADSUP, ORDSUP, SIMPSUP.
    let r = run(&d, &n, &[0x12, 1, 0x86, 0, 255, 0], 255, &[]).await;
    assert_eq!((r.data_in.len(), r.data_in[3], r.data_in[5]), (64, 0x3c, 0x07));
    assert!(stics_sam::data::parse_ordsup(&r.data_in));
    let r = run(&d, &n, &[0x12, 1, 0xb0, 0, 255, 0], 255, &[]).await;
    assert_eq!((r.data_in.len(), r.data_in[3]), (64, 0x3c));
    let r = run(&d, &n, &[0x12, 1, 0xb2, 0, 255, 0], 255, &[]).await;
    assert_eq!(r.data_in[5] & 0xe0, 0xe0);
    let r = run(&d, &n, &[0x12, 1, 0x83, 0, 255, 0], 255, &[]).await;
    assert_eq!(&r.data_in[4..8], &[0x01, 0x03, 0x00, 0x08]);
    let r = run(&d, &n, &[0x12, 1, 0x99, 0, 255, 0], 255, &[]).await;
    assert_eq!(sense(&r), (ILLEGAL, 0x24, 0));
    let mut c = cmd(&[0x12, 0, 0, 0, 96, 0], 96, &[]);
    c.lun = 5;
    let r = d.execute(&n, c).await;
    assert_eq!((r.status, r.data_in[0]), (0, 0x7f));
    let mut c = cmd(&read10_cdb(0, 1), 512, &[]);
    c.lun = 5;
    assert_eq!(sense(&d.execute(&n, c).await), (ILLEGAL, 0x25, 0));
}

#[tokio::test]
async fn read_capacity_reports_size_and_thin_provisioning() {
    let d = mem_device();
    let n = nexus(1);
    let r = run(&d, &n, &[0x25, 0, 0, 0, 0, 0, 0, 0, 0, 0], 8, &[]).await;
    assert_eq!(&r.data_in[..], &[0, 0, 0x0f, 0xff, 0, 0, 2, 0]);
    let r = run(&d, &n, &[0x9e, 0x10, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 32, 0, 0], 32, &[]).await;
    assert_eq!(&r.data_in[..12], &[0, 0, 0, 0, 0, 0, 0x0f, 0xff, 0, 0, 2, 0]);
    assert_eq!(r.data_in[14] & 0xc0, 0xc0);
}

#[tokio::test]
async fn unit_attention_after_login_is_reported_once_and_spares_inquiry() {
    let d = mem_device();
    let n = nexus(1);
    d.nexus_added(&n);
    let r = run(&d, &n, &[0x12, 0, 0, 0, 36, 0], 36, &[]).await;
    assert_eq!(r.status, 0);
    let r = run(&d, &n, &[0, 0, 0, 0, 0, 0], 0, &[]).await;
    assert_eq!(sense(&r), (0x06, 0x29, 0x00));
    let r = run(&d, &n, &[0, 0, 0, 0, 0, 0], 0, &[]).await;
    assert_eq!(r.status, 0);
    let other = nexus(2);
    d.nexus_added(&other);
    run(&d, &other, &[0, 0, 0, 0, 0, 0], 0, &[]).await;
    d.lun_reset(0, &other);
    let r = run(&d, &n, &[0x03, 0, 0, 0, 18, 0], 18, &[]).await;
    assert_eq!((r.status, r.data_in[2], r.data_in[12], r.data_in[13]), (0, 0x06, 0x29, 0x03));
    let r = run(&d, &n, &[0, 0, 0, 0, 0, 0], 0, &[]).await;
    assert_eq!(r.status, 0);
}

#[tokio::test]
async fn report_luns_lists_every_lun_on_any_lun() {
    let lus =
        (0..3).map(|_| Arc::new(LogicalUnit::new(Arc::new(NullDev::new(512, 64)), LuConfig::default()))).collect();
    let d = Device::new(lus);
    let n = nexus(1);
    let mut c = cmd(&[0xa0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0], 256, &[]);
    c.lun = 9;
    let r = d.execute(&n, c).await;
    assert_eq!(r.status, 0);
    assert_eq!(&r.data_in[..8], &[0, 0, 0, 24, 0, 0, 0, 0]);
    assert_eq!(&r.data_in[16..24], &lun_to_bytes(1));
    let r = run(&d, &n, &[0xa0, 0, 7, 0, 0, 0, 0, 0, 1, 0, 0, 0], 256, &[]).await;
    assert_eq!(sense(&r), (ILLEGAL, 0x24, 0));
    assert_eq!(lun_from_bytes(lun_to_bytes(300)), 300);
}

#[tokio::test]
async fn mode_sense_pages_and_mode_select_of_wce() {
    let dir = tempfile::tempdir().unwrap();
    let f = FileDev::open(&dir.path().join("lun"), Some(1 << 20), 512).unwrap();
    let d = Device::new(vec![Arc::new(LogicalUnit::new(Arc::new(f), LuConfig::default()))]);
    let (a, b) = (nexus(1), nexus(2));
    let r = run(&d, &a, &[0x1a, 0, 0x3f, 0, 255, 0], 255, &[]).await;
    assert_eq!(r.status, 0);
    assert_eq!(usize::from(r.data_in[0]) + 1, r.data_in.len());
    assert_eq!((r.data_in[2], r.data_in[3]), (0x10, 8));
    let r = run(&d, &a, &[0x1a, 0x08, 0x08, 0, 255, 0], 255, &[]).await;
    assert_eq!((r.data_in[4], r.data_in[6] & 0x04), (0x08, 0x04), "WCE follows the volatile cache");
    let r = run(&d, &a, &[0x1a, 0x08, 0x48, 0, 255, 0], 255, &[]).await;
    assert_eq!(r.data_in[6], 0x04, "only WCE is changeable");
    let r = run(&d, &a, &[0x1a, 0x08, 0xc8, 0, 255, 0], 255, &[]).await;
    assert_eq!(sense(&r), (ILLEGAL, 0x39, 0));
    let r = run(&d, &a, &[0x5a, 0x10, 0x3f, 0, 0, 0, 0, 0x10, 0, 0], 4096, &[]).await;
    assert_eq!((r.status, r.data_in[4] & 1, r.data_in[7]), (0, 1, 16));
    d.nexus_added(&a);
    d.nexus_added(&b);
    run(&d, &a, &[0, 0, 0, 0, 0, 0], 0, &[]).await;
    run(&d, &b, &[0, 0, 0, 0, 0, 0], 0, &[]).await;
    // Turn the write cache off.
    let mut page = vec![0u8, 0, 0x10, 0, 0x08, 0x12];
    page.resize(4 + 20, 0);
    let r = run(&d, &a, &[0x15, 0x10, 0, 0, 24, 0], 24, &page).await;
    assert_eq!(r.status, 0, "{:?}", r.sense_triple());
    let r = run(&d, &a, &[0x1a, 0x08, 0x08, 0, 255, 0], 255, &[]).await;
    assert_eq!(r.data_in[6] & 0x04, 0);
    let r = run(&d, &b, &[0, 0, 0, 0, 0, 0], 0, &[]).await;
    assert_eq!(sense(&r), (0x06, 0x2a, 0x01));
    // Changing a field that is not changeable is refused with a pointer to it.
    page[4 + 3] = 0xff;
    let r = run(&d, &a, &[0x15, 0x10, 0, 0, 24, 0], 24, &page).await;
    assert_eq!(sense(&r), (ILLEGAL, 0x26, 0));
    assert_eq!(&r.sense.unwrap()[15..18], &[0x80, 0, 7]);
    let r = run(&d, &a, &[0x15, 0x10, 0, 0, 2, 0], 2, &page[..2]).await;
    assert_eq!(sense(&r), (ILLEGAL, 0x1a, 0));
}

#[tokio::test]
async fn reserve6_conflicts_for_others_and_goes_with_the_session_or_reset() {
    let d = mem_device();
    let (a, b) = (nexus(1), nexus(2));
    d.nexus_added(&a);
    d.nexus_added(&b);
    run(&d, &a, &[0, 0, 0, 0, 0, 0], 0, &[]).await;
    run(&d, &b, &[0, 0, 0, 0, 0, 0], 0, &[]).await;
    assert_eq!(run(&d, &a, &[0x16, 0, 0, 0, 0, 0], 0, &[]).await.status, 0);
    assert_eq!(run(&d, &a, &[0x16, 0, 0, 0, 0, 0], 0, &[]).await.status, 0);
    assert_eq!(run(&d, &b, &[0x16, 0, 0, 0, 0, 0], 0, &[]).await.status, 0x18);
    assert_eq!(run(&d, &b, &[0x17, 0, 0, 0, 0, 0], 0, &[]).await.status, 0);
    assert_eq!(run(&d, &b, &[0x1a, 0, 0x3f, 0, 255, 0], 255, &[]).await.status, 0x18);
    assert_eq!(run(&d, &b, &[0x12, 0, 0, 0, 36, 0], 36, &[]).await.status, 0);
    assert_eq!(run(&d, &a, &read10_cdb(0, 1), 512, &[]).await.status, 0);
    d.nexus_removed(&a);
    assert_eq!(run(&d, &b, &[0x16, 0, 0, 0, 0, 0], 0, &[]).await.status, 0);
    assert_eq!(run(&d, &a, &[0x16, 0, 0, 0, 0, 0], 0, &[]).await.status, 0x18);
    d.lun_reset(0, &a);
    run(&d, &b, &[0, 0, 0, 0, 0, 0], 0, &[]).await;
    assert_eq!(run(&d, &a, &[0x16, 0, 0, 0, 0, 0], 0, &[]).await.status, 0, "LUN reset cleared b's reservation");
}

fn prout(sa: u8, ptype: u8) -> Vec<u8> {
    vec![0x5f, sa, ptype, 0, 0, 0, 0, 0, 24, 0]
}

fn prout_params(key: u64, sa_key: u64) -> Vec<u8> {
    let mut p = vec![0u8; 24];
    p[..8].copy_from_slice(&key.to_be_bytes());
    p[8..16].copy_from_slice(&sa_key.to_be_bytes());
    p
}

#[tokio::test]
async fn persistent_reservation_write_exclusive_blocks_other_writers_only() {
    let d = mem_device();
    let (a, b) = (nexus(1), nexus(2));
    assert_eq!(run(&d, &a, &prout(6, 0), 24, &prout_params(0, 0xaa)).await.status, 0);
    assert_eq!(run(&d, &b, &prout(6, 0), 24, &prout_params(0, 0xbb)).await.status, 0);
    assert_eq!(run(&d, &a, &prout(1, 1), 24, &prout_params(0xaa, 0)).await.status, 0);
    let blk = vec![1u8; 512];
    assert_eq!(run(&d, &a, &write10_cdb(0, 1), 512, &blk).await.status, 0);
    assert_eq!(run(&d, &b, &read10_cdb(0, 1), 512, &[]).await.status, 0);
    assert_eq!(run(&d, &b, &write10_cdb(0, 1), 512, &blk).await.status, 0x18);
    // READ RESERVATION shows a's key and type 1.
    let r = run(&d, &b, &[0x5e, 1, 0, 0, 0, 0, 0, 0, 255, 0], 255, &[]).await;
    assert_eq!(&r.data_in[4..24], &[0, 0, 0, 16, 0, 0, 0, 0, 0, 0, 0, 0xaa, 0, 0, 0, 0, 0, 1, 0, 0]);
    // b preempts a: a's key goes and a gets REGISTRATIONS PREEMPTED.
    d.nexus_added(&a);
    run(&d, &a, &[0, 0, 0, 0, 0, 0], 0, &[]).await;
    assert_eq!(run(&d, &b, &prout(4, 3), 24, &prout_params(0xbb, 0xaa)).await.status, 0);
    let r = run(&d, &a, &read10_cdb(0, 1), 512, &[]).await;
    assert_eq!(sense(&r), (0x06, 0x2a, 0x05));
    assert_eq!(run(&d, &a, &read10_cdb(0, 1), 512, &[]).await.status, 0x18);
    let r = run(&d, &a, &[0x5e, 0, 0, 0, 0, 0, 0, 0, 255, 0], 255, &[]).await;
    assert_eq!(&r.data_in[4..16], &[0, 0, 0, 8, 0, 0, 0, 0, 0, 0, 0, 0xbb]);
    // RESERVE(6) while registrations exist conflicts; PR IN REPORT CAPABILITIES is always allowed.
    assert_eq!(run(&d, &a, &[0x16, 0, 0, 0, 0, 0], 0, &[]).await.status, 0x18);
    let r = run(&d, &a, &[0x5e, 2, 0, 0, 0, 0, 0, 0, 8, 0], 8, &[]).await;
    assert_eq!((r.status, r.data_in[1]), (0, 8));
    // Bad parameter list length.
    let r = run(&d, &b, &[0x5f, 3, 0, 0, 0, 0, 0, 0, 20, 0], 20, &prout_params(0xbb, 0)[..20]).await;
    assert_eq!(sense(&r), (ILLEGAL, 0x1a, 0));
    assert_eq!(run(&d, &b, &prout(3, 0), 24, &prout_params(0xbb, 0)).await.status, 0);
    assert_eq!(run(&d, &a, &write10_cdb(0, 1), 512, &blk).await.status, 0);
}

#[tokio::test]
async fn compare_and_write_miscompare_reports_offset() {
    let d = mem_device();
    let n = nexus(1);
    run(&d, &n, &write10_cdb(3, 1), 512, &[7u8; 512]).await;
    let caw = [0x89, 0, 0, 0, 0, 0, 0, 0, 0, 3, 0, 0, 0, 1, 0, 0];
    let mut data = vec![7u8; 512];
    data[100] = 8;
    data.extend_from_slice(&[9u8; 512]);
    let r = run(&d, &n, &caw, 1024, &data).await;
    assert_eq!(sense(&r), (0x0e, 0x1d, 0));
    assert_eq!(&r.sense.as_ref().unwrap()[3..7], &100u32.to_be_bytes());
    data[100] = 7;
    assert_eq!(run(&d, &n, &caw, 1024, &data).await.status, 0);
    let r = run(&d, &n, &read10_cdb(3, 1), 512, &[]).await;
    assert!(r.data_in.iter().all(|&b| b == 9));
    // Data-out not exactly twice the blocks is refused.
    assert_eq!(run(&d, &n, &caw, 2048, &[0u8; 2048]).await.status, 2);
}

/// A device with a compare-and-write step of its own, which says "differs at byte 42" to
/// every request and counts them; reads and writes go to RAM.
struct CawDev(MemDev, std::sync::atomic::AtomicU32);

#[async_trait]
impl BlockDev for CawDev {
    fn geometry(&self) -> Geometry {
        self.0.geometry()
    }
    fn volatile_cache(&self) -> bool {
        false
    }
    async fn read(&self, lba: u64, blocks: u32) -> Result<Bytes, BlockError> {
        self.0.read(lba, blocks).await
    }
    async fn write(&self, lba: u64, data: Bytes, fua: bool) -> Result<(), BlockError> {
        self.0.write(lba, data, fua).await
    }
    async fn flush(&self) -> Result<(), BlockError> {
        Ok(())
    }
    async fn compare_and_write(&self, _: u64, _: Bytes, _: Bytes, _: bool) -> Result<Option<u64>, BlockError> {
        self.1.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Ok(Some(42))
    }
}

#[tokio::test]
async fn compare_and_write_uses_the_devices_own_step_when_it_has_one() {
    let dev = Arc::new(CawDev(MemDev::new(512, 64), std::sync::atomic::AtomicU32::new(0)));
    let d = Device::new(vec![Arc::new(LogicalUnit::new(dev.clone(), LuConfig::default()))]);
    let n = nexus(1);
    let caw = [0x89, 0, 0, 0, 0, 0, 0, 0, 0, 3, 0, 0, 0, 1, 0, 0];
    // Blocks of zeros compared with zeros: equal here, yet the device's answer counts.
    let r = run(&d, &n, &caw, 1024, &[0u8; 1024]).await;
    assert_eq!(sense(&r), (0x0e, 0x1d, 0));
    assert_eq!(&r.sense.as_ref().unwrap()[3..7], &42u32.to_be_bytes());
    assert_eq!(dev.1.load(std::sync::atomic::Ordering::Relaxed), 1);
}

/// A device that writes block by block and yields between blocks, so that unlocked
/// read-compare-write sequences would interleave with other writes.
struct SlowDev(MemDev);

#[async_trait]
impl BlockDev for SlowDev {
    fn geometry(&self) -> Geometry {
        self.0.geometry()
    }
    fn volatile_cache(&self) -> bool {
        false
    }
    async fn read(&self, lba: u64, blocks: u32) -> Result<Bytes, BlockError> {
        tokio::task::yield_now().await;
        self.0.read(lba, blocks).await
    }
    async fn write(&self, lba: u64, data: Bytes, fua: bool) -> Result<(), BlockError> {
        for (i, c) in data.chunks(512).enumerate() {
            tokio::task::yield_now().await;
            self.0.write(lba + i as u64, Bytes::copy_from_slice(c), fua).await?;
        }
        Ok(())
    }
    async fn flush(&self) -> Result<(), BlockError> {
        Ok(())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compare_and_write_is_atomic_against_concurrent_writes() {
    let lu = LogicalUnit::new(Arc::new(SlowDev(MemDev::new(512, 64))), LuConfig::default());
    let d = Arc::new(Device::new(vec![Arc::new(lu)]));
    let caw8 = [0x89, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 8, 0, 0];
    for round in 0..200u32 {
        let a = vec![0xaa; 4096];
        run(&d, &nexus(1), &write10_cdb(0, 8), 4096, &a).await;
        let d1 = Arc::clone(&d);
        let caw = tokio::spawn(async move {
            let mut data = vec![0xaa; 4096];
            data.extend_from_slice(&[0xbb; 4096]);
            run(&d1, &nexus(1), &caw8, 8192, &data).await.status
        });
        let d2 = Arc::clone(&d);
        let w = tokio::spawn(async move { run(&d2, &nexus(2), &write10_cdb(0, 8), 4096, &[0xcc; 4096]).await.status });
        let (s1, s2) = (caw.await.unwrap(), w.await.unwrap());
        assert_eq!(s2, 0);
        let r = run(&d, &nexus(1), &read10_cdb(0, 8), 4096, &[]).await;
        let first = r.data_in[0];
        assert!(r.data_in.iter().all(|&b| b == first), "torn result in round {round}");
        if s1 == 0 {
            // CAW succeeded: it ran before the write (result cc) or after (result bb).
            assert!(first == 0xbb || first == 0xcc);
        } else {
            assert_eq!(first, 0xcc);
        }
    }
    // Counter increments by CAW from many tasks: none is lost.
    let zero = vec![0u8; 512];
    run(&d, &nexus(1), &write10_cdb(0, 1), 512, &zero).await;
    let caw1 = [0x89, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0];
    let mut tasks = Vec::new();
    for t in 0..4u64 {
        let d = Arc::clone(&d);
        tasks.push(tokio::spawn(async move {
            let mut done = 0;
            while done < 25 {
                let cur = run(&d, &nexus(t), &read10_cdb(0, 1), 512, &[]).await.data_in;
                let v = u64::from_be_bytes(cur[..8].try_into().unwrap());
                let mut data = cur.to_vec();
                let mut next = vec![0u8; 512];
                next[..8].copy_from_slice(&(v + 1).to_be_bytes());
                data.extend_from_slice(&next);
                if run(&d, &nexus(t), &caw1, 1024, &data).await.status == 0 {
                    done += 1;
                }
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let cur = run(&d, &nexus(1), &read10_cdb(0, 1), 512, &[]).await.data_in;
    assert_eq!(u64::from_be_bytes(cur[..8].try_into().unwrap()), 100);
}

#[tokio::test]
async fn verify_bytchk_compares_and_reports_miscompare() {
    let d = mem_device();
    let n = nexus(1);
    run(&d, &n, &write10_cdb(0, 2), 1024, &[5u8; 1024]).await;
    let mut v = read10_cdb(0, 2);
    v[0] = 0x2f;
    v[1] = 0x02;
    assert_eq!(run(&d, &n, &v, 1024, &[5u8; 1024]).await.status, 0);
    let mut data = vec![5u8; 1024];
    data[700] = 0;
    let r = run(&d, &n, &v, 1024, &data).await;
    assert_eq!(sense(&r), (0x0e, 0x1d, 0));
    assert_eq!(&r.sense.unwrap()[3..7], &700u32.to_be_bytes());
    v[1] = 0;
    assert_eq!(run(&d, &n, &v, 0, &[]).await.status, 0);
}

#[tokio::test]
async fn unmap_write_same_and_get_lba_status() {
    let d = mem_device();
    let n = nexus(1);
    run(&d, &n, &write10_cdb(0, 256), 256 * 512, &vec![0xff; 256 * 512]).await;
    let mut p = vec![0, 22, 0, 16, 0, 0, 0, 0];
    p.extend_from_slice(&0u64.to_be_bytes());
    p.extend_from_slice(&2048u32.to_be_bytes());
    p.extend_from_slice(&[0; 4]);
    let r = run(&d, &n, &[0x42, 0, 0, 0, 0, 0, 0, 0, 24, 0], 24, &p).await;
    assert_eq!(r.status, 0);
    let r = run(&d, &n, &read10_cdb(0, 4), 2048, &[]).await;
    assert!(r.data_in.iter().all(|&b| b == 0));
    let r = run(&d, &n, &[0x9e, 0x12, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 24, 0, 0], 24, &[]).await;
    assert_eq!((r.status, r.data_in[20]), (0, 1), "deallocated");
    // Out-of-range descriptor.
    p[8..16].copy_from_slice(&(NB - 1).to_be_bytes());
    let r = run(&d, &n, &[0x42, 0, 0, 0, 0, 0, 0, 0, 24, 0], 24, &p).await;
    assert_eq!(sense(&r), (ILLEGAL, 0x21, 0));
    // Parameter list shorter than the header.
    let r = run(&d, &n, &[0x42, 0, 0, 0, 0, 0, 0, 0, 4, 0], 4, &p[..4]).await;
    assert_eq!(sense(&r), (ILLEGAL, 0x1a, 0));
    // WRITE SAME(10) of 16 blocks of 0x5a, then with UNMAP and zeros.
    let ws = [0x41, 0, 0, 0, 0, 8, 0, 0, 16, 0];
    assert_eq!(run(&d, &n, &ws, 512, &[0x5a; 512]).await.status, 0);
    let r = run(&d, &n, &read10_cdb(8, 16), 16 * 512, &[]).await;
    assert!(r.data_in.iter().all(|&b| b == 0x5a));
    let mut wsu = ws;
    wsu[1] = 0x08;
    assert_eq!(run(&d, &n, &wsu, 512, &[0; 512]).await.status, 0);
    let r = run(&d, &n, &read10_cdb(8, 16), 16 * 512, &[]).await;
    assert!(r.data_in.iter().all(|&b| b == 0));
    // Wrong data-out size and ANCHOR are refused.
    assert_eq!(run(&d, &n, &ws, 1024, &[0x5a; 1024]).await.status, 2);
    assert_eq!(run(&d, &n, &ws, 256, &[0x5a; 256]).await.status, 2);
    let mut wsa = ws;
    wsa[1] = 0x10;
    assert_eq!(sense(&run(&d, &n, &wsa, 512, &[0; 512]).await), (ILLEGAL, 0x24, 0));
}

#[tokio::test]
async fn report_supported_opcodes_all_and_one() {
    let d = mem_device();
    let n = nexus(1);
    let r = run(&d, &n, &[0xa3, 0x0c, 0x80, 0, 0, 0, 0, 0, 0xff, 0xff, 0, 0], 65535, &[]).await;
    assert_eq!(r.status, 0);
    let len = u32::from_be_bytes(r.data_in[..4].try_into().unwrap()) as usize;
    assert_eq!(len + 4, r.data_in.len());
    assert_eq!(len % 20, 0, "descriptors with timeouts are 20 bytes");
    let r = run(&d, &n, &[0xa3, 0x0c, 0x01, 0x28, 0, 0, 0, 0, 0xff, 0xff, 0, 0], 65535, &[]).await;
    assert_eq!(&r.data_in[..5], &[0, 3, 0, 10, 0x28]);
    assert_eq!(r.data_in[5] & 0x18, 0x18);
    let r = run(&d, &n, &[0xa3, 0x0c, 0x01, 0x9e, 0, 0, 0, 0, 0xff, 0xff, 0, 0], 65535, &[]).await;
    assert_eq!(sense(&r), (ILLEGAL, 0x24, 0));
    let r = run(&d, &n, &[0xa3, 0x0c, 0x02, 0x9e, 0, 0x10, 0, 0, 0xff, 0xff, 0, 0], 65535, &[]).await;
    assert_eq!(&r.data_in[..6], &[0, 3, 0, 16, 0x9e, 0x1f]);
    let r = run(&d, &n, &[0xa3, 0x0c, 0x01, 0xc5, 0, 0, 0, 0, 0xff, 0xff, 0, 0], 65535, &[]).await;
    assert_eq!(&r.data_in[..], &[0, 1, 0, 0]);
}

#[tokio::test]
async fn sync_cache_flushes_file_device_and_checks_range() {
    let dir = tempfile::tempdir().unwrap();
    let f = FileDev::open(&dir.path().join("lun"), Some(1 << 20), 512).unwrap();
    let d = Device::new(vec![Arc::new(LogicalUnit::new(Arc::new(f), LuConfig::default()))]);
    let n = nexus(1);
    let mut w = write10_cdb(1, 1);
    w[1] = 0x08;
    assert_eq!(run(&d, &n, &w, 512, &[3; 512]).await.status, 0);
    assert_eq!(run(&d, &n, &[0x35, 0, 0, 0, 0, 0, 0, 0, 0, 0], 0, &[]).await.status, 0);
    let r = run(&d, &n, &[0x35, 0, 0, 0, 0x08, 0, 0, 0, 1, 0], 0, &[]).await;
    assert_eq!(sense(&r), (ILLEGAL, 0x21, 0));
}

#[tokio::test]
async fn expected_data_out_follows_the_cdb() {
    let d = mem_device();
    assert_eq!(d.expected_data_out(0, &write10_cdb(0, 3)), Some(1536));
    assert_eq!(d.expected_data_out(0, &read10_cdb(0, 3)), None);
    assert_eq!(d.expected_data_out(0, &[0x89, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2, 0, 0]), Some(2048));
    assert_eq!(d.expected_data_out(0, &[0x42, 0, 0, 0, 0, 0, 0, 0, 24, 0]), Some(24));
    assert_eq!(d.expected_data_out(1, &write10_cdb(0, 3)), None);
}

#[tokio::test]
async fn read_only_lun_refuses_writes_with_write_protected() {
    let cfg = LuConfig { read_only: true, ..LuConfig::default() };
    let d = Device::new(vec![Arc::new(LogicalUnit::new(Arc::new(MemDev::new(512, 64)), cfg))]);
    let r = run(&d, &nexus(1), &write10_cdb(0, 1), 512, &[0; 512]).await;
    assert_eq!(sense(&r), (0x07, 0x27, 0));
    let r = run(&d, &nexus(1), &[0x1a, 0, 0x3f, 0, 255, 0], 255, &[]).await;
    assert_eq!(r.data_in[2] & 0x80, 0x80);
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]
    #[test]
    fn execute_never_panics(cdb in proptest::collection::vec(any::<u8>(), 0..24),
                            data in proptest::collection::vec(any::<u8>(), 0..1100),
                            edtl in 0u32..4096, lun in 0u64..3) {
        let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
        let d = Device::new(vec![Arc::new(LogicalUnit::new(Arc::new(MemDev::new(512, 64)), LuConfig::default()))]);
        let n = nexus(1);
        d.nexus_added(&n);
        let c = Command { lun, cdb: Bytes::from(cdb), expected_len: edtl, direction: Direction::Bidi,
                          data_out: Bytes::from(data), attr: TaskAttr::Simple };
        let r = rt.block_on(d.execute(&n, c));
        prop_assert!(r.data_in.len() <= edtl as usize);
        prop_assert_eq!(r.status == 2, r.sense.is_some());
    }
}

#[tokio::test]
async fn initiator_builders_and_parsers_agree_with_the_emulation() {
    use stics_sam::{cdb as build, data, op, status};
    let d = mem_device();
    let n = nexus(1);
    let lu_dev = d.lu(0).expect("LUN 0").dev().clone();
    d.nexus_added(&n);
    // The first command reports the power-on unit attention, parsed like any sense data.
    let r = run(&d, &n, &build::test_unit_ready(), 0, &[]).await;
    let ua = r.sense.as_deref().and_then(Sense::parse);
    assert_eq!(ua, Some(Sense::unit_attention(sense::asc::POWER_ON_RESET)));

    let r = run(&d, &n, &build::read_capacity16(32), 32, &[]).await;
    let cap = data::parse_capacity16(&r.data_in).expect("READ CAPACITY(16) data");
    assert_eq!((cap.block_size, cap.num_blocks, cap.thin), (BS, NB, lu_dev.supports_discard()));
    let r = run(&d, &n, &build::read_capacity10(), 8, &[]).await;
    assert_eq!(data::parse_capacity10(&r.data_in).map(|c| (c.block_size, c.num_blocks)), Some((BS, NB)));

    let r = run(&d, &n, &build::inquiry(96), 96, &[]).await;
    let inq = data::parse_inquiry(&r.data_in).expect("INQUIRY data");
    assert_eq!((inq.qualifier, inq.device_type), (0, data::DIRECT_ACCESS));
    assert_eq!((inq.vendor.as_str(), inq.product.as_str()), ("STICS", "VIRTUAL-DISK"));
    let r = run(&d, &n, &build::report_luns(64), 64, &[]).await;
    assert_eq!(data::parse_report_luns(&r.data_in), vec![0]);
    let r = run(&d, &n, &build::mode_sense6(op::mode_page::CACHING, 64), 64, &[]).await;
    assert_eq!(data::parse_wce(&r.data_in), Some(lu_dev.volatile_cache()));

    let r = run(&d, &n, &build::inquiry_vpd(op::vpd::BLOCK_LIMITS, 64), 64, &[]).await;
    let bl = data::parse_block_limits(&r.data_in).expect("Block Limits VPD");
    assert_eq!(bl.max_write_same, spc::MAX_WRITE_SAME_BLOCKS);
    let r = run(&d, &n, &build::inquiry_vpd(op::vpd::LOGICAL_BLOCK_PROVISIONING, 64), 64, &[]).await;
    assert_eq!(data::parse_unmap_supported(&r.data_in), Some(lu_dev.supports_discard()));

    let block = vec![0xa5u8; BS as usize];
    let r = run(&d, &n, &build::write16(8, 1, true), BS, &block).await;
    assert_eq!(r.status, status::GOOD);
    let r = run(&d, &n, &build::read16(8, 1), BS, &[]).await;
    assert_eq!((r.status, &r.data_in[..]), (status::GOOD, &block[..]));
    let r = run(&d, &n, &build::write_same16(16, 4), BS, &block).await;
    assert_eq!(r.status, status::GOOD);
    let r = run(&d, &n, &build::synchronize_cache10(), 0, &[]).await;
    assert_eq!(r.status, status::GOOD);
    let r = run(&d, &n, &build::read16(NB, 1), BS, &[]).await;
    assert_eq!(r.status, status::CHECK_CONDITION);
    assert_eq!(r.sense.as_deref().and_then(Sense::parse), Some(Sense::lba_out_of_range()));
    if lu_dev.supports_discard() {
        let params = data::unmap_parameters(&[(16, 4)]);
        let r = run(&d, &n, &build::unmap(1), params.len() as u32, &params).await;
        assert_eq!(r.status, status::GOOD);
    }
}

// 4096-byte logical blocks: every length the emulation computes or reports is in the LUN's
// blocks, never in 512-byte sectors.

const BS4K: u32 = 4096;

fn device_4k(dev: Arc<dyn BlockDev>, max_transfer_bytes: u64) -> Device {
    let cfg = LuConfig { max_transfer_bytes, ..LuConfig::default() };
    Device::new(vec![Arc::new(LogicalUnit::new(dev, cfg))])
}

fn be32(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes(b[at..at + 4].try_into().unwrap())
}

#[tokio::test]
async fn four_k_capacity_block_limits_and_mode_block_descriptors_count_4096_byte_blocks() {
    let d = device_4k(Arc::new(MemDev::new(BS4K, 1024)), MAX_TRANSFER_BYTES);
    let n = nexus(1);
    let r = run(&d, &n, &[0x25, 0, 0, 0, 0, 0, 0, 0, 0, 0], 8, &[]).await;
    assert_eq!(&r.data_in[..], &[0, 0, 0x03, 0xff, 0, 0, 0x10, 0]);
    let r = run(&d, &n, &stics_sam::cdb::read_capacity16(32), 32, &[]).await;
    let cap = stics_sam::data::parse_capacity16(&r.data_in).unwrap();
    assert_eq!((cap.block_size, cap.num_blocks), (BS4K, 1024));

    let r = run(&d, &n, &[0x12, 1, 0xb0, 0, 64, 0], 64, &[]).await;
    let b = &r.data_in;
    let max_transfer = (MAX_TRANSFER_BYTES / u64::from(BS4K)) as u32;
    assert_eq!(be32(b, 8), max_transfer, "MAXIMUM TRANSFER LENGTH");
    assert_eq!(be32(b, 12), (1 << 20) / BS4K, "OPTIMAL TRANSFER LENGTH: 1 MiB");
    assert_eq!(be32(b, 16), max_transfer, "MAXIMUM PREFETCH LENGTH");
    assert_eq!(u64::from_be_bytes(b[36..44].try_into().unwrap()), u64::from(max_transfer), "MAXIMUM WRITE SAME LENGTH");

    // MODE SENSE(6): an 8-byte block descriptor with 1024 blocks of 4096 bytes.
    let r = run(&d, &n, &[0x1a, 0, 0x08, 0, 255, 0], 255, &[]).await;
    assert_eq!((r.status, r.data_in[3]), (0, 8));
    assert_eq!(&r.data_in[4..12], &[0, 0, 0x04, 0, 0, 0, 0x10, 0]);
    // MODE SENSE(10) with LLBAA: a 16-byte descriptor.
    let r = run(&d, &n, &[0x5a, 0x10, 0x08, 0, 0, 0, 0, 0, 255, 0], 255, &[]).await;
    assert_eq!((r.data_in[4] & 1, r.data_in[7]), (1, 16));
    assert_eq!(u64::from_be_bytes(r.data_in[8..16].try_into().unwrap()), 1024);
    assert_eq!(be32(&r.data_in, 20), BS4K);

    // MODE SELECT(6) takes a block descriptor with the LUN's block length and refuses 512.
    let mut p = vec![0u8, 0, 0, 8, 0, 0, 0x04, 0, 0, 0, 0x10, 0];
    let r = run(&d, &n, &[0x15, 0x10, 0, 0, 12, 0], 12, &p).await;
    assert_eq!(r.status, 0, "{:?}", r.sense_triple());
    p[10] = 0x02;
    let r = run(&d, &n, &[0x15, 0x10, 0, 0, 12, 0], 12, &p).await;
    assert_eq!(sense(&r), (ILLEGAL, 0x26, 0));
}

#[tokio::test]
async fn four_k_write_same_length_is_capped_by_the_transfer_limit() {
    // The target's default command limit, 32 MiB: 65536 blocks of 512 bytes, 8192 of 4096.
    let limit = 32u64 << 20;
    let n = nexus(1);
    for (bs, max_ws) in [(512u32, 65536u32), (BS4K, 8192)] {
        let d = device_4k(Arc::new(NullDev::new(bs, 1 << 20)), limit);
        let r = run(&d, &n, &stics_sam::cdb::inquiry_vpd(0xb0, 64), 64, &[]).await;
        let bl = stics_sam::data::parse_block_limits(&r.data_in).unwrap();
        assert_eq!(bl.max_write_same, u64::from(max_ws), "{bs}-byte blocks");
        // A host may WRITE the range it is about to WRITE SAME in one command.
        assert!(u64::from(max_ws) * u64::from(bs) <= limit);
        let block = vec![0x5a; bs as usize];
        let r = run(&d, &n, &stics_sam::cdb::write_same16(0, max_ws), bs, &block).await;
        assert_eq!(r.status, 0, "{bs}: {:?}", r.sense_triple());
        let r = run(&d, &n, &stics_sam::cdb::write_same16(0, max_ws + 1), bs, &block).await;
        assert_eq!(sense(&r), (ILLEGAL, 0x24, 0), "{bs}-byte blocks");
        assert_eq!(&r.sense.unwrap()[15..18], &[0xc0, 0, 10], "points at the NUMBER OF LOGICAL BLOCKS");
    }
}

#[tokio::test]
async fn four_k_write_same_takes_one_4096_byte_block_and_repeats_it() {
    let d = device_4k(Arc::new(MemDev::new(BS4K, 1024)), MAX_TRANSFER_BYTES);
    let n = nexus(1);
    let ws = stics_sam::cdb::write_same16(4, 3);
    let block: Vec<u8> = (0..BS4K).map(|i| (i / 7) as u8).collect();
    // One 512-byte sector is not a block here.
    assert_eq!(sense(&run(&d, &n, &ws, 512, &block[..512]).await), (ILLEGAL, 0x0e, 0x03));
    let r = run(&d, &n, &ws, BS4K, &block).await;
    assert_eq!((r.status, r.residual), (0, Residual::None));
    let r = run(&d, &n, &read10_cdb(4, 3), 3 * BS4K, &[]).await;
    assert!(r.data_in.chunks(BS4K as usize).all(|c| c == &block[..]));
    assert_eq!(d.expected_data_out(0, &ws), Some(4096));
    assert_eq!(d.expected_data_out(0, &write10_cdb(0, 3)), Some(3 * 4096));
    assert_eq!(d.expected_data_out(0, &[0x89, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2, 0, 0]), Some(4 * 4096));
}

#[tokio::test]
async fn four_k_compare_and_write_verify_and_orwrite_work_in_4096_byte_blocks() {
    let d = device_4k(Arc::new(MemDev::new(BS4K, 1024)), MAX_TRANSFER_BYTES);
    let n = nexus(1);
    let bs = BS4K as usize;
    run(&d, &n, &write10_cdb(10, 2), 2 * BS4K, &vec![0x11; 2 * bs]).await;
    // COMPARE AND WRITE of two blocks: 8 KiB to compare, 8 KiB to write; the miscompare
    // offset counts bytes into the second block.
    let caw = [0x89, 0, 0, 0, 0, 0, 0, 0, 0, 10, 0, 0, 0, 2, 0, 0];
    let mut data = vec![0x11; 2 * bs];
    data[bs + 100] = 0;
    data.extend(vec![0x22; 2 * bs]);
    let r = run(&d, &n, &caw, 4 * BS4K, &data).await;
    assert_eq!(sense(&r), (0x0e, 0x1d, 0));
    assert_eq!(&r.sense.as_ref().unwrap()[3..7], &(4096u32 + 100).to_be_bytes());
    data[bs + 100] = 0x11;
    assert_eq!(run(&d, &n, &caw, 4 * BS4K, &data).await.status, 0);
    // Sized for 512-byte blocks: refused.
    assert_eq!(sense(&run(&d, &n, &caw, 4 * 512, &data[..4 * 512]).await), (ILLEGAL, 0x24, 0));
    // VERIFY(10) with BYTCHK: 8 KiB compared, a miscompare in the second block reported.
    let mut v = read10_cdb(10, 2);
    v[0] = 0x2f;
    v[1] = 0x02;
    let mut want = vec![0x22; 2 * bs];
    assert_eq!(run(&d, &n, &v, 2 * BS4K, &want).await.status, 0);
    want[bs + 5] = 0x23;
    let r = run(&d, &n, &v, 2 * BS4K, &want).await;
    assert_eq!(&r.sense.as_ref().unwrap()[3..7], &(4096u32 + 5).to_be_bytes());
    assert_eq!(sense(&run(&d, &n, &v, 2 * 512, &want[..2 * 512]).await), (ILLEGAL, 0x0e, 0x03));
    // ORWRITE(16) of two blocks ORs 8 KiB.
    let mut or = stics_sam::cdb::write16(10, 2, false);
    or[0] = 0x8b;
    let r = run(&d, &n, &or, 2 * BS4K, &vec![0x44; 2 * bs]).await;
    assert_eq!((r.status, r.residual), (0, Residual::None));
    let r = run(&d, &n, &read10_cdb(10, 2), 2 * BS4K, &[]).await;
    assert!(r.data_in.iter().all(|&b| b == 0x66));
}

#[tokio::test]
async fn four_k_compare_and_write_length_fits_one_transfer() {
    // 64 KiB commands hold 16 blocks of 4096 bytes: COMPARE AND WRITE of at most 8.
    let d = device_4k(Arc::new(MemDev::new(BS4K, 1024)), 64 << 10);
    let n = nexus(1);
    let r = run(&d, &n, &[0x12, 1, 0xb0, 0, 64, 0], 64, &[]).await;
    assert_eq!(r.data_in[5], 8, "MAXIMUM COMPARE AND WRITE LENGTH");
    let mut caw = [0x89, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 8, 0, 0];
    assert_eq!(run(&d, &n, &caw, 16 * BS4K, &vec![0; 16 * BS4K as usize]).await.status, 0);
    caw[13] = 9;
    let r = run(&d, &n, &caw, 18 * BS4K, &vec![0; 18 * BS4K as usize]).await;
    assert_eq!(sense(&r), (ILLEGAL, 0x24, 0));
    assert_eq!(&r.sense.unwrap()[15..18], &[0xc0, 0, 13]);
    // The default limit leaves the one-byte field's full range.
    let d = device_4k(Arc::new(MemDev::new(BS4K, 1024)), MAX_TRANSFER_BYTES);
    let r = run(&d, &n, &[0x12, 1, 0xb0, 0, 64, 0], 64, &[]).await;
    assert_eq!(r.data_in[5], 255);
}

#[tokio::test]
async fn four_k_unmap_and_get_lba_status_count_4096_byte_blocks() {
    let d = device_4k(Arc::new(MemDev::new(BS4K, 1024)), MAX_TRANSFER_BYTES);
    let n = nexus(1);
    run(&d, &n, &write10_cdb(0, 512), 512 * BS4K, &vec![0xff; 512 * BS4K as usize]).await;
    // 256 blocks of 4096 bytes are 1 MiB, the memory device's allocation unit.
    let p = stics_sam::data::unmap_parameters(&[(256, 256)]);
    let r = run(&d, &n, &stics_sam::cdb::unmap(1), p.len() as u32, &p).await;
    assert_eq!(r.status, 0);
    let r = run(&d, &n, &read10_cdb(255, 2), 2 * BS4K, &[]).await;
    assert!(r.data_in[..BS4K as usize].iter().all(|&b| b == 0xff));
    assert!(r.data_in[BS4K as usize..].iter().all(|&b| b == 0));
    let r = run(&d, &n, &[0x9e, 0x12, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 56, 0, 0], 56, &[]).await;
    assert_eq!(r.status, 0);
    let descs: Vec<(u64, u32, u8)> = r.data_in[8..]
        .chunks(16)
        .map(|c| (u64::from_be_bytes(c[..8].try_into().unwrap()), be32(c, 8), c[12]))
        .collect();
    // Blocks 256..512 were unmapped and 512.. never written: one deallocated run to the end.
    assert_eq!(descs, vec![(0, 256, 0), (256, 768, 1)]);
    // A descriptor past the last 4096-byte block is out of range.
    let p = stics_sam::data::unmap_parameters(&[(1023, 2)]);
    let r = run(&d, &n, &stics_sam::cdb::unmap(1), p.len() as u32, &p).await;
    assert_eq!(sense(&r), (ILLEGAL, 0x21, 0));
}

proptest! {
    #[test]
    fn first_difference_finds_the_first_differing_byte(len in 0usize..9000, extra in 0usize..700,
                                                       flips in proptest::collection::vec(any::<prop::sample::Index>(), 0..3)) {
        let a: Vec<u8> = (0..len + extra).map(|i| (i * 31 % 251) as u8).collect();
        let mut b = a[..len].to_vec();
        for f in &flips {
            if !b.is_empty() {
                let i = f.index(b.len());
                b[i] ^= 0x80;
            }
        }
        let naive = a.iter().zip(&b).position(|(x, y)| x != y);
        prop_assert_eq!(crate::device::first_difference(&a, &b), naive);
        prop_assert_eq!(crate::device::first_difference(&b, &a), naive);
    }
}

#[tokio::test(start_paused = true)]
async fn a_device_that_lost_its_volatile_cache_is_reported_as_a_reset_to_every_session() {
    // A cache in write-through mode passes its remote's resets on: an initiator must not count
    // on a flush to cover writes the remote may have lost before it.
    let dev = Arc::new(FaultDev::new(BS, NB, 1));
    assert!(dev.volatile_cache());
    let d = Device::new(vec![Arc::new(LogicalUnit::new(dev.clone(), LuConfig::default()))]);
    let (a, b) = (nexus(1), nexus(2));
    for n in [&a, &b] {
        d.nexus_added(n);
        run(&d, n, &[0; 6], 0, &[]).await;
        assert_eq!(run(&d, n, &[0; 6], 0, &[]).await.status, 0, "the login's unit attention is cleared");
    }
    let ua = |r: &Response| r.sense.as_deref().and_then(Sense::parse);
    let reset = Some(Sense::unit_attention(sense::asc::POWER_ON_RESET));
    dev.power_cycle();
    for n in [&a, &b] {
        let r = run(&d, n, &[0; 6], 0, &[]).await;
        assert_eq!(ua(&r), reset, "every session learns of the reset");
        assert_eq!(run(&d, n, &[0; 6], 0, &[]).await.status, 0, "once");
    }
    // A reset while a write runs: the write's answer is the unit attention.
    dev.add_rule(Rule::delay(Op::Write, Duration::from_millis(100)).times(1));
    let cycle = async {
        tokio::time::sleep(Duration::from_millis(10)).await;
        dev.power_cycle();
    };
    let w = write10_cdb(0, 1);
    let (r, ()) = tokio::join!(run(&d, &a, &w, 512, &[7; 512]), cycle);
    assert_eq!(ua(&r), reset, "the write may rest on what was lost");
    assert_eq!(ua(&run(&d, &b, &[0; 6], 0, &[]).await), reset, "and the other session learns too");
    assert_eq!(run(&d, &a, &write10_cdb(0, 1), 512, &[7; 512]).await.status, 0, "sent again, it succeeds");
}

/// A memory LUN that takes groups and keeps each one committed (the SG's side without a journal).
struct Groups {
    mem: MemDev,
    committed: std::sync::Mutex<Vec<Bytes>>,
}

#[async_trait]
impl BlockDev for Groups {
    fn geometry(&self) -> Geometry {
        self.mem.geometry()
    }
    fn volatile_cache(&self) -> bool {
        false
    }
    async fn read(&self, lba: u64, blocks: u32) -> Result<Bytes, BlockError> {
        self.mem.read(lba, blocks).await
    }
    async fn write(&self, lba: u64, data: Bytes, fua: bool) -> Result<(), BlockError> {
        self.mem.write(lba, data, fua).await
    }
    async fn flush(&self) -> Result<(), BlockError> {
        Ok(())
    }
    fn group_sink(&self) -> Option<&dyn stics_block::GroupSink> {
        Some(self)
    }
}

#[async_trait]
impl stics_block::GroupSink for Groups {
    fn max_group(&self) -> u32 {
        64 << 10
    }
    async fn commit(&self, group: Bytes) -> Result<(), BlockError> {
        self.committed.lock().unwrap().push(group);
        Ok(())
    }
    async fn link_status(&self, _fence: u64) -> Result<Bytes, BlockError> {
        Ok(Bytes::new())
    }
}

#[tokio::test]
async fn a_link_commit_sent_before_its_pieces_arrived_waits_for_them_and_a_refused_piece_fails_it() {
    let groups = Arc::new(Groups { mem: MemDev::new(BS, NB), committed: std::sync::Mutex::new(Vec::new()) });
    let d = Device::new(vec![Arc::new(LogicalUnit::new(groups.clone(), LuConfig::default()))]);
    let n = nexus(1);
    d.nexus_added(&n);
    let _ = run(&d, &n, &[0; 6], 0, &[]).await; // the unit attention of a new nexus
    let (first, second) = (vec![1u8; 4096], vec![2u8; 100]);
    // The commit runs first, as it may when a piece's data comes after an R2T.
    let cdb = stics_link::cdb::commit(7, 4196);
    let commit = run(&d, &n, &cdb, 0, &[]);
    let pieces = async {
        tokio::time::sleep(Duration::from_millis(50)).await;
        let a = run(&d, &n, &stics_link::cdb::write(7, 4096), 100, &second).await;
        tokio::time::sleep(Duration::from_millis(50)).await;
        let b = run(&d, &n, &stics_link::cdb::write(7, 0), 4096, &first).await;
        (a.status, b.status)
    };
    let (c, (a, b)) = tokio::join!(commit, pieces);
    assert_eq!((c.status, a, b), (0, 0, 0));
    let got = groups.committed.lock().unwrap().clone();
    assert_eq!(got.len(), 1);
    assert_eq!(&got[0][..4096], &first[..]);
    assert_eq!(&got[0][4096..], &second[..]);

    // A piece beyond the largest group is refused, and so is the commit waiting for it, at once.
    let cdb = stics_link::cdb::commit(8, 8192);
    let commit = run(&d, &n, &cdb, 0, &[]);
    let piece = async {
        tokio::time::sleep(Duration::from_millis(50)).await;
        run(&d, &n, &stics_link::cdb::write(8, 64 << 10), 4096, &first).await.status
    };
    let started = std::time::Instant::now();
    let (c, p) = tokio::join!(commit, piece);
    assert_eq!((p, sense(&c)), (2, (ILLEGAL, 0x2c, 0x00)), "command sequence error");
    assert!(started.elapsed() < crate::link::COMMIT_WAIT, "it did not wait for its time out");

    // A commit whose session ends gives up rather than wait.
    let cdb = stics_link::cdb::commit(9, 4096);
    let commit = run(&d, &n, &cdb, 0, &[]);
    let gone = async {
        tokio::time::sleep(Duration::from_millis(50)).await;
        d.nexus_removed(&n);
    };
    let (c, ()) = tokio::join!(commit, gone);
    assert_eq!(sense(&c), (ILLEGAL, 0x2c, 0x00));
    assert_eq!(groups.committed.lock().unwrap().len(), 1);
}
