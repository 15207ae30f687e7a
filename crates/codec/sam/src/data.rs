//! Parameter data an initiator reads and writes: parsers of the data-in of READ CAPACITY,
//! INQUIRY and its Block Limits and Logical Block Provisioning VPD pages, REPORT LUNS and
//! MODE SENSE and PERSISTENT RESERVE IN, and the UNMAP and PERSISTENT RESERVE OUT parameter
//! lists it sends.

use crate::op::{mode_page, vpd};

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

/// Parses Block Limits VPD data (SBC-3 6.6.3).
pub fn parse_block_limits(d: &[u8]) -> Option<BlockLimits> {
    if *d.get(1)? != vpd::BLOCK_LIMITS {
        return None;
    }
    let u32_at = |i: usize| d.get(i..i + 4).and_then(|b| b.try_into().ok()).map(u32::from_be_bytes);
    Some(BlockLimits {
        max_unmap_blocks: u32_at(20)?,
        max_unmap_descriptors: u32_at(24)?,
        max_write_same: u64::from_be_bytes(d.get(36..44)?.try_into().ok()?),
    })
}

/// LBPU from Logical Block Provisioning VPD data (SBC-3 6.6.4): the target accepts UNMAP.
pub fn parse_unmap_supported(d: &[u8]) -> Option<bool> {
    if *d.get(1)? != vpd::LOGICAL_BLOCK_PROVISIONING {
        return None;
    }
    Some(d.get(5)? & 0x80 != 0)
}

/// UNMAP's parameter list for the given (lba, blocks) ranges (SBC-3 5.28.2).
pub fn unmap_parameters(ranges: &[(u64, u32)]) -> Vec<u8> {
    let desc_len = u16::try_from(16 * ranges.len()).unwrap_or(u16::MAX);
    let mut p = Vec::with_capacity(8 + usize::from(desc_len));
    p.extend_from_slice(&desc_len.saturating_add(6).to_be_bytes());
    p.extend_from_slice(&desc_len.to_be_bytes());
    p.extend_from_slice(&[0; 4]);
    for &(lba, blocks) in ranges {
        p.extend_from_slice(&lba.to_be_bytes());
        p.extend_from_slice(&blocks.to_be_bytes());
        p.extend_from_slice(&[0; 4]);
    }
    p
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

/// ORDSUP of an Extended INQUIRY Data VPD page: the unit honours the ORDERED task attribute.
/// False for another page or data too short to hold the bit.
pub fn parse_ordsup(d: &[u8]) -> bool {
    d.get(1) == Some(&vpd::EXTENDED_INQUIRY_DATA) && d.get(5).is_some_and(|b| b & 0x02 != 0)
}

/// Parses standard INQUIRY data.
pub fn parse_inquiry(d: &[u8]) -> Option<Inquiry> {
    let b0 = *d.first()?;
    let text =
        |r: std::ops::Range<usize>| d.get(r).map(|s| String::from_utf8_lossy(s).trim().to_owned()).unwrap_or_default();
    Some(Inquiry { qualifier: b0 >> 5, device_type: b0 & 0x1f, vendor: text(8..16), product: text(16..32) })
}

/// Peripheral device type of a direct-access block device (SBC).
pub const DIRECT_ACCESS: u8 = 0x00;

/// A peripheral device type's name as iscsi-ls prints it.
pub fn device_type_name(t: u8) -> &'static str {
    match t {
        DIRECT_ACCESS => "DIRECT_ACCESS",
        0x01 => "SEQUENTIAL_ACCESS",
        0x05 => "MMC",
        0x0c => "STORAGE_ARRAY_CONTROLLER",
        0x0d => "ENCLOSURE_SERVICES",
        0x1f => "UNKNOWN",
        _ => "OTHER",
    }
}

/// Parses REPORT LUNS data into LUN numbers (entries in an addressing a single-level initiator
/// cannot read are skipped).
pub fn parse_report_luns(d: &[u8]) -> Vec<u64> {
    let Some(len) = d.get(0..4).and_then(|b| b.try_into().ok()).map(u32::from_be_bytes) else {
        return Vec::new();
    };
    d.get(8..)
        .unwrap_or_default()
        .chunks_exact(8)
        .take(len as usize / 8)
        .filter_map(|c| c.try_into().ok().map(u64::from_be_bytes))
        .filter_map(crate::lun::decode)
        .collect()
}

/// Whether MODE SENSE(6) caching-page data says the write cache is on (WCE).
pub fn parse_wce(d: &[u8]) -> Option<bool> {
    let bdl = usize::from(*d.get(3)?);
    let page = d.get(4 + bdl..)?;
    if page.first()? & 0x3f != mode_page::CACHING {
        return None;
    }
    Some(page.get(2)? & 0x04 != 0)
}

/// The logical unit's name from Device Identification VPD data (SPC-4 7.8.6): the best
/// designator whose association is the logical unit, as text (`naa.HEX`, `eui.HEX`, the SCSI
/// name string, or `t10.VENDOR...`). `None` when the page names the logical unit no way.
pub fn parse_device_identification(d: &[u8]) -> Option<String> {
    let &[_, page, hi, lo, ..] = d else { return None };
    if page != vpd::DEVICE_IDENTIFICATION {
        return None;
    }
    let end = (4 + usize::from(u16::from_be_bytes([hi, lo]))).min(d.len());
    let mut best: Option<(u8, String)> = None;
    let mut at = 4;
    // Each designator's 4-byte header lies within the page length; its body within the data.
    while let Some(&[code_set, kind, _, len]) = d.get(at..end).and_then(|h| h.get(..4)) {
        let (code_set, len) = (code_set & 0x0f, usize::from(len));
        let Some(body) = d.get(at + 4..at + 4 + len) else { break };
        at += 4 + len;
        if (kind >> 4) & 0x03 != 0 {
            continue; // a port's or the target device's name, not the logical unit's
        }
        let hex = || body.iter().map(|b| format!("{b:02x}")).collect::<String>();
        let text = || String::from_utf8_lossy(body).trim_end_matches(['\0', ' ']).to_owned();
        let (rank, name) = match kind & 0x0f {
            3 => (0, format!("naa.{}", hex())),
            2 => (1, format!("eui.{}", hex())),
            8 if code_set == 3 => (2, text()),
            1 => (3, format!("t10.{}", if code_set == 2 { text() } else { hex() })),
            _ => continue,
        };
        if best.as_ref().is_none_or(|(r, _)| rank < *r) {
            best = Some((rank, name));
        }
    }
    best.map(|(_, n)| n)
}

/// Length of the basic PERSISTENT RESERVE OUT parameter list.
pub const PR_OUT_PARAMETERS_LEN: u32 = 24;

/// The basic PERSISTENT RESERVE OUT parameter list (SPC-4 6.16.3): this nexus's reservation
/// key and the service action reservation key, with SPEC_I_PT, ALL_TG_PT and APTPL clear.
pub fn pr_out_parameters(key: u64, sa_key: u64) -> Vec<u8> {
    let mut p = [0u8; PR_OUT_PARAMETERS_LEN as usize];
    p[..8].copy_from_slice(&key.to_be_bytes());
    p[8..16].copy_from_slice(&sa_key.to_be_bytes());
    p.to_vec()
}

/// A persistent reservation as READ RESERVATION reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PrReservation {
    /// The holder's reservation key (0 for all-registrants types).
    pub key: u64,
    /// Reservation type (see [`crate::op::pr_type`]).
    pub ptype: u8,
    /// Scope (0: the logical unit).
    pub scope: u8,
}

/// Parses READ RESERVATION data (SPC-4 6.15.3): the PR generation and the reservation, if any.
pub fn parse_read_reservation(d: &[u8]) -> Option<(u32, Option<PrReservation>)> {
    let generation = u32::from_be_bytes(d.get(..4)?.try_into().ok()?);
    let len = u32::from_be_bytes(d.get(4..8)?.try_into().ok()?);
    if len == 0 {
        return Some((generation, None));
    }
    let key = u64::from_be_bytes(d.get(8..16)?.try_into().ok()?);
    let st = *d.get(21)?;
    Some((generation, Some(PrReservation { key, ptype: st & 0x0f, scope: st >> 4 })))
}

/// Parses READ KEYS data (SPC-4 6.15.2): the PR generation and every registered key (as many
/// as the data holds when the allocation length cut the list).
pub fn parse_read_keys(d: &[u8]) -> Option<(u32, Vec<u64>)> {
    let generation = u32::from_be_bytes(d.get(..4)?.try_into().ok()?);
    let len = u32::from_be_bytes(d.get(4..8)?.try_into().ok()?) as usize;
    let list = d.get(8..).unwrap_or_default();
    let list = list.get(..len).unwrap_or(list);
    let keys = list.chunks_exact(8).filter_map(|k| k.try_into().ok()).map(u64::from_be_bytes).collect();
    Some((generation, keys))
}

#[cfg(test)]
#[expect(clippy::indexing_slicing, reason = "tests")]
mod tests {
    #[test]
    fn the_logical_units_naa_name_wins_over_t10_and_port_names() {
        let mut page = vec![0x00, 0x83, 0, 0];
        page.extend([0x02, 0x01, 0, 8]);
        page.extend(b"STICS   ");
        page.extend([0x51, 0x94, 0, 4, 0, 0, 0, 1]);
        page.extend([0x01, 0x03, 0, 8, 0x60, 1, 2, 3, 4, 5, 6, 7]);
        let n = (page.len() - 4) as u16;
        page[2..4].copy_from_slice(&n.to_be_bytes());
        assert_eq!(super::parse_device_identification(&page).as_deref(), Some("naa.6001020304050607"));
        page.truncate(4 + 12 + 8);
        page[2..4].copy_from_slice(&20u16.to_be_bytes());
        assert_eq!(super::parse_device_identification(&page).as_deref(), Some("t10.STICS"));
        assert_eq!(super::parse_device_identification(&[0, 0x80, 0, 0]), None);
        assert_eq!(super::parse_device_identification(&[0, 0x83, 0, 200, 1]), None);
    }

    #[test]
    fn device_identification_stops_at_a_designator_cut_short() {
        assert_eq!(super::parse_device_identification(&[]), None);
        assert_eq!(super::parse_device_identification(&[0, 0x83, 0]), None);
        // The page length ends inside the second designator's header: the first one stands.
        let mut page = vec![0x00, 0x83, 0, 14, 0x02, 0x01, 0, 8];
        page.extend(b"STICS   ");
        page.extend([0x01, 0x03, 0, 8, 0x60, 1, 2, 3, 4, 5, 6, 7]);
        assert_eq!(super::parse_device_identification(&page).as_deref(), Some("t10.STICS"));
        // A body longer than the data ends the walk.
        page.truncate(4 + 12 + 4 + 3);
        page[3] = 20;
        assert_eq!(super::parse_device_identification(&page).as_deref(), Some("t10.STICS"));
        assert_eq!(super::parse_device_identification(&page[..4 + 4 + 7]), None);
    }

    #[test]
    fn ordsup_of_the_extended_inquiry_page_and_nothing_shorter() {
        assert!(super::parse_ordsup(&[0, 0x86, 0, 0x3c, 0, 0x02]));
        assert!(!super::parse_ordsup(&[0, 0x86, 0, 0x3c, 0, 0x05]));
        assert!(!super::parse_ordsup(&[0, 0x83, 0, 0x3c, 0, 0x02]));
        assert!(!super::parse_ordsup(&[0, 0x86, 0, 0x3c, 0]));
        assert!(!super::parse_ordsup(&[]));
    }

    use super::*;

    #[test]
    fn pr_out_parameter_list_layout() {
        // SPC-4 table 225: key, service action key, obsolete, flags, reserved, obsolete.
        let p = pr_out_parameters(0x0102_0304_0506_0708, 0x1112_1314_1516_1718);
        assert_eq!(p.len(), 24);
        assert_eq!(&p[..8], &[1, 2, 3, 4, 5, 6, 7, 8]);
        assert_eq!(&p[8..16], &[0x11, 0x12, 0x13, 0x14, 0x15, 0x16, 0x17, 0x18]);
        assert_eq!(&p[16..], &[0; 8]);
    }

    #[test]
    fn read_reservation_with_and_without_a_reservation() {
        let none = [0, 0, 0, 7, 0, 0, 0, 0];
        assert_eq!(parse_read_reservation(&none), Some((7, None)));
        let mut d = vec![0, 0, 0, 9, 0, 0, 0, 16];
        d.extend_from_slice(&[0xab, 0xcd, 0, 0, 0, 0, 0x12, 0x34]);
        d.extend_from_slice(&[0, 0, 0, 0, 0, 0x01, 0, 0]);
        let want = PrReservation { key: 0xabcd_0000_0000_1234, ptype: 1, scope: 0 };
        assert_eq!(parse_read_reservation(&d), Some((9, Some(want))));
        assert_eq!(parse_read_reservation(&d[..20]), None);
        assert_eq!(parse_read_reservation(&d[..6]), None);
    }

    #[test]
    fn read_keys_lists_each_key_and_stops_at_the_data() {
        let mut d = vec![0, 0, 0, 3, 0, 0, 0, 24];
        d.extend_from_slice(&1u64.to_be_bytes());
        d.extend_from_slice(&0xffu64.to_be_bytes());
        assert_eq!(parse_read_keys(&d), Some((3, vec![1, 0xff])));
        d.extend_from_slice(&[5; 8]);
        d.extend_from_slice(&[6; 8]);
        assert_eq!(parse_read_keys(&d), Some((3, vec![1, 0xff, 0x0505_0505_0505_0505])));
        assert_eq!(parse_read_keys(&[0, 0, 0, 1, 0, 0, 0, 0]), Some((1, vec![])));
        assert_eq!(parse_read_keys(&[0, 0, 0]), None);
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
    fn block_limits_and_provisioning() {
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
    }

    #[test]
    fn wce_from_caching_page() {
        assert_eq!(parse_wce(&[0x17, 0, 0, 0, 0x08, 0x12, 0x04, 0]), Some(true));
        assert_eq!(parse_wce(&[0x17, 0, 0, 0, 0x08, 0x12, 0x00, 0]), Some(false));
        assert_eq!(parse_wce(&[0x17, 0, 0, 8, 0, 0, 0, 0, 0, 0, 0, 0, 0x08, 0x12, 0x04]), Some(true));
        assert_eq!(parse_wce(&[0x3]), None);
    }
}
