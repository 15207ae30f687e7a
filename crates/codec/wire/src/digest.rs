//! CRC32C header and data digests (RFC 7143 §12.1), as they appear on the wire.

/// CRC32C of `parts` taken as one byte string.
pub fn crc32c(parts: &[&[u8]]) -> u32 {
    parts.iter().fold(0u32, |crc, p| crc32c::crc32c_append(crc, p))
}

/// The four digest bytes as iSCSI sends them: the CRC in little-endian byte order, which
/// is what RFC 7143 Appendix B's examples show (32 zero bytes give `aa 36 91 8a`).
pub fn to_wire(crc: u32) -> [u8; 4] {
    crc.to_le_bytes()
}

/// Reads a digest from its wire bytes.
pub fn from_wire(b: [u8; 4]) -> u32 {
    u32::from_le_bytes(b)
}

#[cfg(test)]
#[expect(clippy::indexing_slicing, reason = "tests")]
mod tests {
    use super::*;

    /// RFC 7143 Appendix B, "Examples of CRC Calculations".
    #[test]
    fn rfc_7143_appendix_b_vectors() {
        assert_eq!(to_wire(crc32c(&[&[0u8; 32]])), [0xaa, 0x36, 0x91, 0x8a]);
        assert_eq!(to_wire(crc32c(&[&[0xffu8; 32]])), [0x43, 0xab, 0xa8, 0x62]);
        let inc: Vec<u8> = (0u8..32).collect();
        assert_eq!(to_wire(crc32c(&[&inc])), [0x4e, 0x79, 0xdd, 0x46]);
        let dec: Vec<u8> = (0u8..32).rev().collect();
        assert_eq!(to_wire(crc32c(&[&dec])), [0x5c, 0xdb, 0x3f, 0x11]);
    }

    #[test]
    fn split_input_gives_same_crc() {
        let data: Vec<u8> = (0..100u8).collect();
        assert_eq!(crc32c(&[&data]), crc32c(&[&data[..33], &data[33..]]));
    }
}
