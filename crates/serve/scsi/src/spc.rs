//! Data-in payloads of the SPC/SBC informational commands: INQUIRY and its VPD pages, mode pages,
//! READ CAPACITY, and the table of supported operation codes.

use std::sync::atomic::Ordering;

use stics_sam::data::DIRECT_ACCESS;
use stics_sam::op::{self, mode_page, pr_in, pr_out, vpd as page};

use crate::lu::LogicalUnit;
use crate::Nexus;

/// Maximum UNMAP LBA count and block descriptor count (Block Limits VPD).
/// Initiators (libiscsi among them) expect at most 1 Mi blocks per descriptor.
pub const MAX_UNMAP_LBAS: u32 = 0x10_0000;
pub const MAX_UNMAP_DESCRIPTORS: u32 = 256;
/// Maximum WRITE SAME length in blocks, whatever the block size; a LUN whose transfer limit
/// holds fewer blocks reports and enforces that instead.
pub const MAX_WRITE_SAME_BLOCKS: u64 = 0x1_0000;
/// Maximum COMPARE AND WRITE length in blocks (the one-byte field's largest value); lower when
/// twice the blocks do not fit in one transfer.
pub const MAX_CAW_BLOCKS: u8 = 255;

fn pad(s: &str, n: usize) -> Vec<u8> {
    // SPC-4 4.4.1: printable ASCII only, left-aligned, space padded.
    let mut v: Vec<u8> = s.bytes().map(|b| if (0x20..0x7f).contains(&b) { b } else { b'_' }).take(n).collect();
    v.resize(n, b' ');
    v
}

/// Standard INQUIRY data for a present LU.
pub fn standard_inquiry(lu: &LogicalUnit) -> Vec<u8> {
    let mut v = vec![0u8; 74];
    v[0] = DIRECT_ACCESS; // connected
    v[2] = 0x06; // SPC-4
    v[3] = 0x12; // HISUP, response data format 2
    v[4] = (v.len() - 5) as u8;
    v[7] = 0x02; // CMDQUE
    v[8..16].copy_from_slice(&pad(&lu.cfg.vendor, 8));
    v[16..32].copy_from_slice(&pad(&lu.cfg.product, 16));
    v[32..36].copy_from_slice(&pad(&lu.cfg.revision, 4));
    // Version descriptors: SAM-5, iSCSI (no version claimed), SPC-4, SBC-3.
    for (i, d) in [0x00a0u16, 0x0960, 0x0460, 0x04c0].iter().enumerate() {
        v[58 + 2 * i..60 + 2 * i].copy_from_slice(&d.to_be_bytes());
    }
    v
}

/// Standard INQUIRY data for a LUN with no logical unit behind it (qualifier 011b, type 1Fh).
pub fn missing_lun_inquiry() -> Vec<u8> {
    let mut v = vec![0u8; 36];
    v[0] = 0x7f;
    v[2] = 0x06;
    v[3] = 0x12;
    v[4] = 31;
    v
}

/// VPD pages we serve, ascending.
pub const VPD_PAGES: [u8; 7] = [
    page::SUPPORTED_PAGES,
    page::UNIT_SERIAL_NUMBER,
    page::DEVICE_IDENTIFICATION,
    page::EXTENDED_INQUIRY_DATA,
    page::BLOCK_LIMITS,
    page::BLOCK_DEVICE_CHARACTERISTICS,
    page::LOGICAL_BLOCK_PROVISIONING,
];

fn vpd(page: u8, body: Vec<u8>) -> Vec<u8> {
    let mut v = Vec::with_capacity(4 + body.len());
    v.extend_from_slice(&[0x00, page]);
    v.extend_from_slice(&(body.len() as u16).to_be_bytes());
    v.extend_from_slice(&body);
    v
}

fn designator(code_set: u8, piv_assoc_type: u8, data: &[u8]) -> Vec<u8> {
    let mut v = vec![code_set, piv_assoc_type, 0, data.len() as u8];
    v.extend_from_slice(data);
    v
}

fn scsi_name(s: &str) -> Vec<u8> {
    let mut v = s.as_bytes().to_vec();
    v.truncate(250);
    v.push(0);
    while v.len() & 3 != 0 {
        v.push(0);
    }
    v
}

/// One VPD page, or None when the page is not supported.
pub fn vpd_page(lu: &LogicalUnit, nexus: &Nexus, code: u8) -> Option<Vec<u8>> {
    let bs = lu.geo.block_size.max(1);
    Some(match code {
        page::SUPPORTED_PAGES => vpd(code, VPD_PAGES.to_vec()),
        page::UNIT_SERIAL_NUMBER => vpd(code, lu.cfg.serial.bytes().filter(|b| (0x20..0x7f).contains(b)).collect()),
        page::DEVICE_IDENTIFICATION => {
            let naa = if lu.cfg.naa_id >> 60 == 0 { lu.cfg.naa_id | (0x5 << 60) } else { lu.cfg.naa_id };
            let mut body = designator(0x01, 0x03, &naa.to_be_bytes());
            let mut t10 = pad(&lu.cfg.vendor, 8);
            t10.extend(lu.cfg.serial.bytes().filter(|b| (0x20..0x7f).contains(b)).take(200));
            body.extend(designator(0x02, 0x01, &t10));
            // Relative target port (association: target port, protocol iSCSI, PIV).
            body.extend(designator(0x51, 0x94, &[0, 0, 0, 1]));
            // SCSI name string of the target port (iSCSI: name,t,0xTPGT).
            if !nexus.target_name.is_empty() {
                let port = format!("{},t,0x{:04x}", nexus.target_name, nexus.tpgt);
                body.extend(designator(0x53, 0x98, &scsi_name(&port)));
                // And of the target device.
                body.extend(designator(0x53, 0xa8, &scsi_name(&nexus.target_name)));
            }
            vpd(code, body)
        }
        page::EXTENDED_INQUIRY_DATA => {
            let mut b = vec![0u8; 0x3c];
            // HEADSUP, ORDSUP, SIMPSUP: the session layer honours every task attribute.
            b[1] = 0x07;
            vpd(code, b)
        }
        page::BLOCK_LIMITS => {
            let mut b = vec![0u8; 0x3c];
            // WSNZ = 0: a WRITE SAME of 0 blocks runs to the end of the medium.
            b[1] = lu.max_caw_blocks();
            b[2..4].copy_from_slice(&(1u16 << lu.cfg.lbppbe.min(15)).to_be_bytes());
            b[4..8].copy_from_slice(&(lu.max_transfer_blocks() as u32).to_be_bytes());
            b[8..12].copy_from_slice(&((1u32 << 20) / bs).max(1).to_be_bytes());
            b[12..16].copy_from_slice(&(lu.max_transfer_blocks() as u32).to_be_bytes());
            if lu.discard {
                b[16..20].copy_from_slice(&MAX_UNMAP_LBAS.to_be_bytes());
                b[20..24].copy_from_slice(&MAX_UNMAP_DESCRIPTORS.to_be_bytes());
                b[24..28].copy_from_slice(&(1u32 << lu.cfg.lbppbe.min(16)).to_be_bytes());
            }
            b[32..40].copy_from_slice(&lu.max_write_same_blocks().to_be_bytes());
            vpd(code, b)
        }
        page::BLOCK_DEVICE_CHARACTERISTICS => {
            let mut b = vec![0u8; 0x3c];
            b[0..2].copy_from_slice(&1u16.to_be_bytes()); // non-rotating medium
            vpd(code, b)
        }
        page::LOGICAL_BLOCK_PROVISIONING => {
            let mut b = vec![0u8; 4];
            if lu.discard {
                b[1] = 0x80 | 0x40 | 0x20 | 0x04; // LBPU, LBPWS, LBPWS10, LBPRZ
                b[2] = 0x02; // thin provisioned
            }
            vpd(code, b)
        }
        _ => return None,
    })
}

/// READ CAPACITY (10) data.
pub fn read_capacity10(lu: &LogicalUnit) -> Vec<u8> {
    let last = lu.geo.num_blocks.saturating_sub(1);
    let mut v = Vec::with_capacity(8);
    v.extend_from_slice(&(last.min(0xffff_ffff) as u32).to_be_bytes());
    v.extend_from_slice(&lu.geo.block_size.to_be_bytes());
    v
}

/// READ CAPACITY (16) data.
pub fn read_capacity16(lu: &LogicalUnit) -> Vec<u8> {
    let mut v = vec![0u8; 32];
    v[0..8].copy_from_slice(&lu.geo.num_blocks.saturating_sub(1).to_be_bytes());
    v[8..12].copy_from_slice(&lu.geo.block_size.to_be_bytes());
    v[13] = lu.cfg.lbppbe & 0x0f;
    if lu.discard {
        v[14] = 0x80 | 0x40; // LBPME, LBPRZ
    }
    v
}

/// Mode page codes we implement, in the order MODE SENSE returns them for 3Fh.
pub const MODE_PAGES: [u8; 5] = [
    mode_page::READ_WRITE_ERROR_RECOVERY,
    mode_page::DISCONNECT_RECONNECT,
    mode_page::CACHING,
    mode_page::CONTROL,
    mode_page::INFORMATIONAL_EXCEPTIONS,
];

/// Page control values of MODE SENSE.
pub const PC_CURRENT: u8 = 0;
pub const PC_CHANGEABLE: u8 = 1;
pub const PC_DEFAULT: u8 = 2;
pub const PC_SAVED: u8 = 3;

/// One mode page (with its two-byte header) for a page control.
pub fn mode_page(lu: &LogicalUnit, page: u8, pc: u8) -> Option<Vec<u8>> {
    let changeable = pc == PC_CHANGEABLE;
    let mut v = match page {
        mode_page::READ_WRITE_ERROR_RECOVERY => vec![0x01, 0x0a, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0],
        mode_page::DISCONNECT_RECONNECT => vec![0x02, 0x0e, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0],
        mode_page::CACHING => {
            let mut p = vec![0u8; 20];
            p[0] = 0x08;
            p[1] = 0x12;
            let wce = match pc {
                PC_CURRENT => lu.wce.load(Ordering::Acquire),
                // Changeable only when the device has a cache to turn off; default follows it.
                PC_CHANGEABLE | PC_DEFAULT => lu.volatile,
                _ => lu.volatile,
            };
            if wce {
                p[2] |= 0x04;
            }
            p
        }
        mode_page::CONTROL => {
            let mut p = vec![0u8; 12];
            p[0] = 0x0a;
            p[1] = 0x0a;
            if !changeable {
                p[2] = 0x20; // TST 001b: a task set per I_T nexus, as task attributes are kept
                p[3] = 0x10; // unrestricted reordering allowed
                p[8..10].copy_from_slice(&0xffffu16.to_be_bytes()); // busy timeout: unlimited
            }
            p
        }
        mode_page::INFORMATIONAL_EXCEPTIONS => vec![0x1c, 0x0a, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0],
        _ => return None,
    };
    if changeable && page != mode_page::CACHING {
        // Nothing but WCE is changeable; the masks are all zero.
        for b in v.iter_mut().skip(2) {
            *b = 0;
        }
    }
    Some(v)
}

/// One row of the supported operation codes table.
pub struct OpInfo {
    pub opcode: u8,
    pub sa: Option<u8>,
    /// CDB usage data: which bits of each CDB byte the device server looks at.
    pub usage: &'static [u8],
}

macro_rules! op {
    ($o:expr, [$($u:expr),*]) => { OpInfo { opcode: $o, sa: None, usage: &[$o, $($u),*] } };
    ($o:expr, $sa:expr, [$($u:expr),*]) => { OpInfo { opcode: $o, sa: Some($sa), usage: &[$o, $($u),*] } };
}

const F: u8 = 0xff;

/// Every command we implement with its CDB usage bitmap.
pub static OPS: &[OpInfo] = &[
    op!(op::TEST_UNIT_READY, [0, 0, 0, 0, 0x07]),
    op!(op::REQUEST_SENSE, [0x01, 0, 0, F, 0x07]),
    op!(op::READ_6, [0x1f, F, F, F, 0x07]),
    op!(op::WRITE_6, [0x1f, F, F, F, 0x07]),
    op!(op::INQUIRY, [0x01, F, F, F, 0x07]),
    op!(op::MODE_SELECT_6, [0x11, 0, 0, F, 0x07]),
    op!(op::RESERVE_6, [0, 0, 0, 0, 0x07]),
    op!(op::RELEASE_6, [0, 0, 0, 0, 0x07]),
    op!(op::MODE_SENSE_6, [0x08, F, F, F, 0x07]),
    op!(op::START_STOP_UNIT, [0x01, 0, 0x0f, 0xf3, 0x07]),
    op!(op::RECEIVE_DIAGNOSTIC, [0x01, F, F, F, 0x07]),
    op!(op::SEND_DIAGNOSTIC, [0x04, 0, F, F, 0x07]),
    op!(op::PREVENT_ALLOW, [0, 0, 0, 0x03, 0x07]),
    op!(op::READ_CAPACITY_10, [0, F, F, F, F, 0, 0, 0x01, 0x07]),
    op!(op::READ_10, [0x18, F, F, F, F, 0x1f, F, F, 0x07]),
    op!(op::WRITE_10, [0x1a, F, F, F, F, 0x1f, F, F, 0x07]),
    op!(op::WRITE_VERIFY_10, [0x12, F, F, F, F, 0x1f, F, F, 0x07]),
    op!(op::VERIFY_10, [0x12, F, F, F, F, 0x1f, F, F, 0x07]),
    op!(op::PRE_FETCH_10, [0x02, F, F, F, F, 0x1f, F, F, 0x07]),
    op!(op::SYNC_CACHE_10, [0x02, F, F, F, F, 0x1f, F, F, 0x07]),
    op!(op::READ_DEFECT_DATA_10, [0, 0x1f, 0, 0, 0, 0, F, F, 0x07]),
    op!(op::WRITE_SAME_10, [0x08, F, F, F, F, 0x1f, F, F, 0x07]),
    op!(op::UNMAP, [0, 0, 0, 0, 0, 0x1f, F, F, 0x07]),
    op!(op::LOG_SENSE, [0x03, F, F, 0, 0, 0, F, F, 0x07]),
    op!(op::MODE_SELECT_10, [0x11, 0, 0, 0, 0, 0, F, F, 0x07]),
    op!(op::RESERVE_10, [0, 0, 0, 0, 0, 0, 0, 0, 0x07]),
    op!(op::RELEASE_10, [0, 0, 0, 0, 0, 0, 0, 0, 0x07]),
    op!(op::MODE_SENSE_10, [0x18, F, F, 0, 0, 0, F, F, 0x07]),
    op!(op::PR_IN, pr_in::READ_KEYS, [0x1f, 0, 0, 0, 0, 0, F, F, 0x07]),
    op!(op::PR_IN, pr_in::READ_RESERVATION, [0x1f, 0, 0, 0, 0, 0, F, F, 0x07]),
    op!(op::PR_IN, pr_in::REPORT_CAPABILITIES, [0x1f, 0, 0, 0, 0, 0, F, F, 0x07]),
    op!(op::PR_IN, pr_in::READ_FULL_STATUS, [0x1f, 0, 0, 0, 0, 0, F, F, 0x07]),
    op!(op::PR_OUT, pr_out::REGISTER, [0x1f, F, 0, 0, F, F, F, F, 0x07]),
    op!(op::PR_OUT, pr_out::RESERVE, [0x1f, F, 0, 0, F, F, F, F, 0x07]),
    op!(op::PR_OUT, pr_out::RELEASE, [0x1f, F, 0, 0, F, F, F, F, 0x07]),
    op!(op::PR_OUT, pr_out::CLEAR, [0x1f, F, 0, 0, F, F, F, F, 0x07]),
    op!(op::PR_OUT, pr_out::PREEMPT, [0x1f, F, 0, 0, F, F, F, F, 0x07]),
    op!(op::PR_OUT, pr_out::PREEMPT_AND_ABORT, [0x1f, F, 0, 0, F, F, F, F, 0x07]),
    op!(op::PR_OUT, pr_out::REGISTER_AND_IGNORE, [0x1f, F, 0, 0, F, F, F, F, 0x07]),
    op!(op::READ_16, [0x18, F, F, F, F, F, F, F, F, F, F, F, F, 0x1f, 0x07]),
    op!(op::COMPARE_AND_WRITE, [0x18, F, F, F, F, F, F, F, F, 0, 0, 0, F, 0x1f, 0x07]),
    op!(op::WRITE_16, [0x1a, F, F, F, F, F, F, F, F, F, F, F, F, 0x1f, 0x07]),
    op!(op::ORWRITE_16, [0x18, F, F, F, F, F, F, F, F, F, F, F, F, 0x1f, 0x07]),
    op!(op::WRITE_VERIFY_16, [0x12, F, F, F, F, F, F, F, F, F, F, F, F, 0x1f, 0x07]),
    op!(op::VERIFY_16, [0x12, F, F, F, F, F, F, F, F, F, F, F, F, 0x1f, 0x07]),
    op!(op::PRE_FETCH_16, [0x02, F, F, F, F, F, F, F, F, F, F, F, F, 0x1f, 0x07]),
    op!(op::SYNC_CACHE_16, [0x02, F, F, F, F, F, F, F, F, F, F, F, F, 0x1f, 0x07]),
    op!(op::WRITE_SAME_16, [0x09, F, F, F, F, F, F, F, F, F, F, F, F, 0x1f, 0x07]),
    op!(op::SERVICE_ACTION_IN_16, op::SA_READ_CAPACITY_16, [0x1f, F, F, F, F, F, F, F, F, F, F, F, F, 0, 0x07]),
    op!(op::SERVICE_ACTION_IN_16, op::SA_GET_LBA_STATUS, [0x1f, F, F, F, F, F, F, F, F, F, F, F, F, 0, 0x07]),
    op!(op::REPORT_LUNS, [0, F, 0, 0, 0, F, F, F, F, 0, 0x07]),
    op!(op::MAINTENANCE_IN, op::SA_REPORT_SUPPORTED_OPCODES, [0x1f, 0x87, F, F, F, F, F, F, F, 0, 0x07]),
    op!(op::MAINTENANCE_IN, op::SA_REPORT_SUPPORTED_TMFS, [0x1f, 0x80, 0, 0, 0, F, F, F, F, 0, 0x07]),
    op!(op::READ_12, [0x18, F, F, F, F, F, F, F, F, 0x1f, 0x07]),
    op!(op::WRITE_12, [0x1a, F, F, F, F, F, F, F, F, 0x1f, 0x07]),
    op!(op::WRITE_VERIFY_12, [0x12, F, F, F, F, F, F, F, F, 0x1f, 0x07]),
    op!(op::VERIFY_12, [0x12, F, F, F, F, F, F, F, F, 0x1f, 0x07]),
    op!(op::READ_DEFECT_DATA_12, [0x1f, 0, 0, 0, 0, F, F, F, F, 0, 0x07]),
];

/// Commands not offered on this LU (UNMAP without discard support).
pub fn op_supported(lu: &LogicalUnit, o: &OpInfo) -> bool {
    o.opcode != op::UNMAP || lu.discard
}

/// The command timeouts descriptor (12 bytes; no timeouts are given).
pub fn timeouts_descriptor() -> [u8; 12] {
    let mut t = [0u8; 12];
    t[1] = 0x0a;
    t
}
