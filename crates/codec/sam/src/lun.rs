//! The 8-byte LUN field (SAM-5 §4.7): peripheral and flat-space single-level addressing.

/// Encodes a LUN number for the wire: peripheral addressing below 256, flat space up to 16383.
pub fn encode(lun: u64) -> u64 {
    if lun < 256 {
        lun << 48
    } else {
        ((0x4000 | (lun & 0x3fff)) << 48) & 0xffff_0000_0000_0000
    }
}

/// Decodes a LUN field. `None` for addressing methods a single-level target cannot resolve
/// (logical unit or extended addressing, or a second level); callers answer
/// LOGICAL UNIT NOT SUPPORTED.
pub fn decode(field: u64) -> Option<u64> {
    let b0 = (field >> 56) as u8;
    let b1 = (field >> 48) as u8;
    if field & 0x0000_ffff_ffff_ffff != 0 {
        return None;
    }
    match b0 >> 6 {
        0 if b0 & 0x3f == 0 => Some(u64::from(b1)),
        1 => Some((u64::from(b0 & 0x3f) << 8) | u64::from(b1)),
        _ => None,
    }
}

/// The field as the eight bytes REPORT LUNS lists and iSCSI headers carry.
pub fn to_bytes(lun: u64) -> [u8; 8] {
    encode(lun).to_be_bytes()
}

/// [`decode`] of eight bytes, with `u64::MAX` (no such LUN) for fields it cannot resolve.
pub fn from_bytes(b: [u8; 8]) -> u64 {
    decode(u64::from_be_bytes(b)).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn peripheral_and_flat_addressing() {
        assert_eq!(encode(0), 0);
        assert_eq!(encode(1), 0x0001_0000_0000_0000);
        assert_eq!(encode(300), 0x412c_0000_0000_0000);
        for l in [0u64, 1, 255, 256, 16383] {
            assert_eq!(decode(encode(l)), Some(l));
        }
        assert_eq!(decode(0x0001_0000_0000_0001), None);
        assert_eq!(decode(0xc000_0000_0000_0000), None);
        assert_eq!(decode(0x0101_0000_0000_0000), None);
        assert_eq!(to_bytes(300), [0x41, 0x2c, 0, 0, 0, 0, 0, 0]);
        assert_eq!(from_bytes(to_bytes(300)), 300);
        assert_eq!(from_bytes([0xc0, 0, 0, 0, 0, 0, 0, 0]), u64::MAX);
    }
}
