//! The few SCSI commands the initiator issues (SBC-3, SPC-4): CDB builders, and parsers for
//! what comes back (READ CAPACITY, INQUIRY, REPORT LUNS, MODE SENSE, sense data).

use bytes::Bytes;

/// SCSI status codes (SAM-5 §5.3).
pub mod status {
    pub const GOOD: u8 = 0x00;
    pub const CHECK_CONDITION: u8 = 0x02;
    pub const BUSY: u8 = 0x08;
    pub const RESERVATION_CONFLICT: u8 = 0x18;
    pub const TASK_SET_FULL: u8 = 0x28;
    pub const TASK_ABORTED: u8 = 0x40;
}

/// Sense keys worth telling apart.
pub mod sense_key {
    pub const NOT_READY: u8 = 0x2;
    pub const ILLEGAL_REQUEST: u8 = 0x5;
    pub const UNIT_ATTENTION: u8 = 0x6;
    pub const ABORTED_COMMAND: u8 = 0xb;
}

/// READ(16) of `blocks` blocks at `lba`.
pub fn read16(lba: u64, blocks: u32) -> [u8; 16] {
    rw16(0x88, lba, blocks, false)
}

/// WRITE(16); `fua` forces the data to the medium before status.
pub fn write16(lba: u64, blocks: u32, fua: bool) -> [u8; 16] {
    rw16(0x8a, lba, blocks, fua)
}

fn rw16(op: u8, lba: u64, blocks: u32, fua: bool) -> [u8; 16] {
    let mut c = [0u8; 16];
    c[0] = op;
    c[1] = if fua { 0x08 } else { 0 };
    c[2..10].copy_from_slice(&lba.to_be_bytes());
    c[10..14].copy_from_slice(&blocks.to_be_bytes());
    c
}

/// WRITE SAME(16): the one block of data sent is written to `blocks` blocks from `lba`.
pub fn write_same16(lba: u64, blocks: u32) -> [u8; 16] {
    rw16(0x93, lba, blocks, false)
}

/// SYNCHRONIZE CACHE(10) of the whole medium.
pub fn synchronize_cache10() -> [u8; 16] {
    let mut c = [0u8; 16];
    c[0] = 0x35;
    c
}

/// READ CAPACITY(16) (SERVICE ACTION IN(16), action 0x10).
pub fn read_capacity16(alloc: u32) -> [u8; 16] {
    let mut c = [0u8; 16];
    c[0] = 0x9e;
    c[1] = 0x10;
    c[10..14].copy_from_slice(&alloc.to_be_bytes());
    c
}

/// READ CAPACITY(10).
pub fn read_capacity10() -> [u8; 16] {
    let mut c = [0u8; 16];
    c[0] = 0x25;
    c
}

/// Standard INQUIRY.
pub fn inquiry(alloc: u16) -> [u8; 16] {
    let mut c = [0u8; 16];
    c[0] = 0x12;
    c[3..5].copy_from_slice(&alloc.to_be_bytes());
    c
}

/// INQUIRY of vital product data page `page`.
pub fn inquiry_vpd(page: u8, alloc: u16) -> [u8; 16] {
    let mut c = inquiry(alloc);
    c[1] = 0x01; // EVPD
    c[2] = page;
    c
}

/// The Block Limits VPD page (SBC-3 §6.6.3).
pub const VPD_BLOCK_LIMITS: u8 = 0xb0;
/// The Logical Block Provisioning VPD page (SBC-3 §6.6.4).
pub const VPD_PROVISIONING: u8 = 0xb2;

/// What the Block Limits VPD page says (0 where the target reports no limit).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BlockLimits {
    /// MAXIMUM UNMAP LBA COUNT.
    pub max_unmap_blocks: u32,
    /// MAXIMUM UNMAP BLOCK DESCRIPTOR COUNT.
    pub max_unmap_descriptors: u32,
    /// MAXIMUM WRITE SAME LENGTH.
    pub max_write_same: u64,
}

/// Parses Block Limits VPD data.
pub fn parse_block_limits(d: &[u8]) -> Option<BlockLimits> {
    if *d.get(1)? != VPD_BLOCK_LIMITS {
        return None;
    }
    let u32_at = |i: usize| d.get(i..i + 4).and_then(|b| b.try_into().ok()).map(u32::from_be_bytes);
    Some(BlockLimits {
        max_unmap_blocks: u32_at(20)?,
        max_unmap_descriptors: u32_at(24)?,
        max_write_same: u64::from_be_bytes(d.get(36..44)?.try_into().ok()?),
    })
}

/// LBPU from Logical Block Provisioning VPD data: the target accepts UNMAP.
pub fn parse_unmap_supported(d: &[u8]) -> Option<bool> {
    if *d.get(1)? != VPD_PROVISIONING {
        return None;
    }
    Some(d.get(5)? & 0x80 != 0)
}

/// UNMAP with a parameter list of `n` descriptors.
pub fn unmap(n: usize) -> [u8; 16] {
    let mut c = [0u8; 16];
    c[0] = 0x42;
    c[7..9].copy_from_slice(&(8 + 16 * n as u16).to_be_bytes());
    c
}

/// UNMAP's parameter list for the given (lba, blocks) ranges.
pub fn unmap_parameters(ranges: &[(u64, u32)]) -> Vec<u8> {
    let desc_len = 16 * ranges.len() as u16;
    let mut p = Vec::with_capacity(8 + usize::from(desc_len));
    p.extend_from_slice(&(desc_len + 6).to_be_bytes());
    p.extend_from_slice(&desc_len.to_be_bytes());
    p.extend_from_slice(&[0; 4]);
    for &(lba, blocks) in ranges {
        p.extend_from_slice(&lba.to_be_bytes());
        p.extend_from_slice(&blocks.to_be_bytes());
        p.extend_from_slice(&[0; 4]);
    }
    p
}

/// REPORT LUNS, all LUNs.
pub fn report_luns(alloc: u32) -> [u8; 16] {
    let mut c = [0u8; 16];
    c[0] = 0xa0;
    c[6..10].copy_from_slice(&alloc.to_be_bytes());
    c
}

/// MODE SENSE(6) of the caching page (0x08), current values.
pub fn mode_sense6_caching(alloc: u8) -> [u8; 16] {
    let mut c = [0u8; 16];
    c[0] = 0x1a;
    c[1] = 0x08; // DBD: no block descriptors.
    c[2] = 0x08;
    c[4] = alloc;
    c
}

/// TEST UNIT READY.
pub fn test_unit_ready() -> [u8; 16] {
    [0u8; 16]
}

/// Capacity as READ CAPACITY reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Capacity {
    pub block_size: u32,
    pub num_blocks: u64,
    /// LBPME: the LUN is thin-provisioned (blocks can be unmapped).
    pub thin: bool,
    /// LBPRZ: unmapped blocks read as zeros.
    pub unmapped_read_zero: bool,
}

/// Parses READ CAPACITY(16) data.
pub fn parse_capacity16(d: &[u8]) -> Option<Capacity> {
    let last = u64::from_be_bytes(d.get(0..8)?.try_into().ok()?);
    let bs = u32::from_be_bytes(d.get(8..12)?.try_into().ok()?);
    let b14 = d.get(14).copied().unwrap_or(0);
    (bs > 0).then_some(Capacity {
        block_size: bs,
        num_blocks: last.checked_add(1)?,
        thin: b14 & 0x80 != 0,
        unmapped_read_zero: b14 & 0x40 != 0,
    })
}

/// Parses READ CAPACITY(10) data.
pub fn parse_capacity10(d: &[u8]) -> Option<Capacity> {
    let last = u32::from_be_bytes(d.get(0..4)?.try_into().ok()?);
    let bs = u32::from_be_bytes(d.get(4..8)?.try_into().ok()?);
    (bs > 0).then_some(Capacity {
        block_size: bs,
        num_blocks: u64::from(last) + 1,
        thin: false,
        unmapped_read_zero: false,
    })
}

/// The parts of standard INQUIRY data that listings show.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Inquiry {
    pub qualifier: u8,
    pub device_type: u8,
    pub vendor: String,
    pub product: String,
}

/// Parses standard INQUIRY data.
pub fn parse_inquiry(d: &[u8]) -> Option<Inquiry> {
    let b0 = *d.first()?;
    let text =
        |r: std::ops::Range<usize>| d.get(r).map(|s| String::from_utf8_lossy(s).trim().to_owned()).unwrap_or_default();
    Some(Inquiry { qualifier: b0 >> 5, device_type: b0 & 0x1f, vendor: text(8..16), product: text(16..32) })
}

/// A peripheral device type's name as iscsi-ls prints it.
pub fn device_type_name(t: u8) -> &'static str {
    match t {
        0x00 => "DIRECT_ACCESS",
        0x01 => "SEQUENTIAL_ACCESS",
        0x05 => "MMC",
        0x0c => "STORAGE_ARRAY_CONTROLLER",
        0x0d => "ENCLOSURE_SERVICES",
        0x1f => "UNKNOWN",
        _ => "OTHER",
    }
}

/// Parses REPORT LUNS data into LUN numbers (entries in an addressing this initiator cannot
/// read are skipped).
pub fn parse_report_luns(d: &[u8]) -> Vec<u64> {
    let Some(len) = d.get(0..4).and_then(|b| b.try_into().ok()).map(u32::from_be_bytes) else {
        return Vec::new();
    };
    d.get(8..)
        .unwrap_or_default()
        .chunks_exact(8)
        .take(len as usize / 8)
        .filter_map(|c| c.try_into().ok().map(u64::from_be_bytes))
        .filter_map(stics_wire::lun::decode)
        .collect()
}

/// Whether MODE SENSE(6) caching-page data says the write cache is on (WCE).
pub fn parse_wce(d: &[u8]) -> Option<bool> {
    let bdl = usize::from(*d.get(3)?);
    let page = d.get(4 + bdl..)?;
    if page.first()? & 0x3f != 0x08 {
        return None;
    }
    Some(page.get(2)? & 0x04 != 0)
}

/// Sense key, ASC and ASCQ of fixed or descriptor sense data.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sense {
    pub key: u8,
    pub asc: u8,
    pub ascq: u8,
}

/// Parses sense data.
pub fn parse_sense(s: &[u8]) -> Option<Sense> {
    let code = s.first()? & 0x7f;
    match code {
        0x70 | 0x71 => {
            Some(Sense { key: s.get(2)? & 0x0f, asc: *s.get(12).unwrap_or(&0), ascq: *s.get(13).unwrap_or(&0) })
        }
        0x72 | 0x73 => Some(Sense { key: s.get(1)? & 0x0f, asc: *s.get(2)?, ascq: *s.get(3)? }),
        _ => None,
    }
}

/// A finished SCSI command as the target reported it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScsiOutcome {
    pub status: u8,
    /// Data read (cut to what the target sent when it reported an underflow).
    pub data: Bytes,
    pub sense: Option<Bytes>,
}

impl ScsiOutcome {
    /// Parsed sense data, if any.
    pub fn sense(&self) -> Option<Sense> {
        self.sense.as_deref().and_then(parse_sense)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn read16_layout() {
        let c = read16(0x0102_0304_0506_0708, 0x10);
        assert_eq!(c[0], 0x88);
        assert_eq!(&c[2..10], &[1, 2, 3, 4, 5, 6, 7, 8]);
        assert_eq!(&c[10..14], &[0, 0, 0, 0x10]);
        assert_eq!(write16(0, 1, true)[1], 0x08);
    }

    #[test]
    fn capacity_parsers() {
        let mut d = [0u8; 32];
        d[7] = 0xff;
        d[10] = 0x02;
        assert_eq!(
            parse_capacity16(&d),
            Some(Capacity { block_size: 512, num_blocks: 256, thin: false, unmapped_read_zero: false })
        );
        d[14] = 0xc0;
        assert!(parse_capacity16(&d).is_some_and(|c| c.thin && c.unmapped_read_zero));
        assert_eq!(parse_capacity16(&d[..5]), None);
        assert_eq!(
            parse_capacity10(&[0, 0, 0, 9, 0, 0, 0x10, 0]).map(|c| (c.block_size, c.num_blocks)),
            Some((4096, 10))
        );
        assert_eq!(parse_capacity10(&[0, 0, 0, 9, 0, 0, 0, 0]), None);
    }

    #[test]
    fn report_luns_decodes_peripheral_and_flat() {
        let mut d = vec![0, 0, 0, 16, 0, 0, 0, 0];
        d.extend_from_slice(&[0, 1, 0, 0, 0, 0, 0, 0]);
        d.extend_from_slice(&[0x41, 0x2c, 0, 0, 0, 0, 0, 0]);
        assert_eq!(parse_report_luns(&d), vec![1, 300]);
        assert_eq!(parse_report_luns(&d[..3]), Vec::<u64>::new());
    }

    #[test]
    fn sense_fixed_and_descriptor() {
        let mut f = [0u8; 18];
        f[0] = 0x70;
        f[2] = 0x06;
        f[12] = 0x29;
        assert_eq!(parse_sense(&f), Some(Sense { key: 6, asc: 0x29, ascq: 0 }));
        assert_eq!(parse_sense(&[0x72, 0x05, 0x24, 0x00]), Some(Sense { key: 5, asc: 0x24, ascq: 0 }));
        assert_eq!(parse_sense(&[0x70]), None);
    }

    #[test]
    fn write_same_and_block_limits() {
        let c = write_same16(7, 9);
        assert_eq!((c[0], c[9], c[13]), (0x93, 7, 9));
        let v = inquiry_vpd(VPD_BLOCK_LIMITS, 64);
        assert_eq!(&v[..5], &[0x12, 1, 0xb0, 0, 64]);
        let mut d = [0u8; 64];
        d[1] = 0xb0;
        d[43] = 0x20;
        d[42] = 0x01;
        d[23] = 0x80;
        d[27] = 4;
        let want = BlockLimits { max_unmap_blocks: 0x80, max_unmap_descriptors: 4, max_write_same: 0x120 };
        assert_eq!(parse_block_limits(&d), Some(want));
        assert_eq!(parse_block_limits(&d[..40]), None);
        d[1] = 0xb1;
        assert_eq!(parse_block_limits(&d), None);
        assert_eq!(parse_unmap_supported(&[0, 0xb2, 0, 4, 0, 0x80, 0, 0]), Some(true));
        assert_eq!(parse_unmap_supported(&[0, 0xb2, 0, 4, 0, 0x40, 0, 0]), Some(false));
        assert_eq!(parse_unmap_supported(&[0, 0xb0, 0, 4, 0, 0x80]), None);
    }

    #[test]
    fn unmap_parameter_list_layout() {
        // SBC-3 table 95/96: header with both lengths, then 16-byte descriptors.
        let p = unmap_parameters(&[(0x0102, 8), (0x10, 1)]);
        assert_eq!(p.len(), 8 + 32);
        assert_eq!(&p[..4], &[0, 38, 0, 32]);
        assert_eq!(&p[8..20], &[0, 0, 0, 0, 0, 0, 1, 2, 0, 0, 0, 8]);
        assert_eq!(&p[24..36], &[0, 0, 0, 0, 0, 0, 0, 0x10, 0, 0, 0, 1]);
        let c = unmap(2);
        assert_eq!((c[0], c[7], c[8]), (0x42, 0, 40));
    }

    #[test]
    fn wce_from_caching_page() {
        assert_eq!(parse_wce(&[0x17, 0, 0, 0, 0x08, 0x12, 0x04, 0]), Some(true));
        assert_eq!(parse_wce(&[0x17, 0, 0, 0, 0x08, 0x12, 0x00, 0]), Some(false));
        assert_eq!(parse_wce(&[0x17, 0, 0, 8, 0, 0, 0, 0, 0, 0, 0, 0, 0x08, 0x12, 0x04]), Some(true));
        assert_eq!(parse_wce(&[0x3]), None);
    }
}
