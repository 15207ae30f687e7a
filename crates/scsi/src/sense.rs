//! Sense data: the one place where SCSI errors become the fixed-format bytes sent to initiators.

use bytes::Bytes;

/// SCSI status codes.
pub mod status {
    pub const GOOD: u8 = 0x00;
    pub const CHECK_CONDITION: u8 = 0x02;
    pub const BUSY: u8 = 0x08;
    pub const RESERVATION_CONFLICT: u8 = 0x18;
    pub const TASK_SET_FULL: u8 = 0x28;
}

/// Sense keys.
pub mod key {
    pub const NO_SENSE: u8 = 0x0;
    pub const NOT_READY: u8 = 0x2;
    pub const MEDIUM_ERROR: u8 = 0x3;
    pub const HARDWARE_ERROR: u8 = 0x4;
    pub const ILLEGAL_REQUEST: u8 = 0x5;
    pub const UNIT_ATTENTION: u8 = 0x6;
    pub const DATA_PROTECT: u8 = 0x7;
    pub const ABORTED_COMMAND: u8 = 0xb;
    pub const MISCOMPARE: u8 = 0xe;
}

/// Sense-key specific data (bytes 15..18 of fixed sense).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sks {
    /// Field pointer: which byte (and optionally bit) of the CDB (`cdb`) or parameter list was bad.
    Field { cdb: bool, byte: u16, bit: Option<u8> },
}

/// One sense condition; [`Sense::to_bytes`] is the only encoder.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sense {
    pub key: u8,
    pub asc: u8,
    pub ascq: u8,
    /// INFORMATION field (sets VALID); for MISCOMPARE it is the offset of the first differing byte.
    pub info: Option<u32>,
    pub sks: Option<Sks>,
    /// Deferred error (response code 71h) instead of current (70h).
    pub deferred: bool,
}

/// Length of the fixed-format sense data we produce.
pub const SENSE_LEN: usize = 18;

impl Sense {
    /// A sense condition without INFORMATION or sense-key specific data.
    pub const fn new(key: u8, asc: u8, ascq: u8) -> Self {
        Sense { key, asc, ascq, info: None, sks: None, deferred: false }
    }

    /// INVALID FIELD IN CDB pointing at `byte` (and `bit`, the most significant bit of the field).
    pub const fn invalid_cdb_field(byte: u16, bit: Option<u8>) -> Self {
        Sense { sks: Some(Sks::Field { cdb: true, byte, bit }), ..Sense::new(key::ILLEGAL_REQUEST, 0x24, 0x00) }
    }

    /// INVALID FIELD IN PARAMETER LIST pointing at `byte` of the parameter data.
    pub const fn invalid_param_field(byte: u16, bit: Option<u8>) -> Self {
        Sense { sks: Some(Sks::Field { cdb: false, byte, bit }), ..Sense::new(key::ILLEGAL_REQUEST, 0x26, 0x00) }
    }

    pub const fn invalid_opcode() -> Self {
        Sense {
            sks: Some(Sks::Field { cdb: true, byte: 0, bit: None }),
            ..Sense::new(key::ILLEGAL_REQUEST, 0x20, 0x00)
        }
    }

    pub const fn lba_out_of_range() -> Self {
        Sense::new(key::ILLEGAL_REQUEST, 0x21, 0x00)
    }

    pub const fn lun_not_supported() -> Self {
        Sense::new(key::ILLEGAL_REQUEST, 0x25, 0x00)
    }

    pub const fn param_list_length_error() -> Self {
        Sense::new(key::ILLEGAL_REQUEST, 0x1a, 0x00)
    }

    pub const fn invalid_field_in_iu() -> Self {
        Sense::new(key::ILLEGAL_REQUEST, 0x0e, 0x03)
    }

    pub const fn saving_not_supported() -> Self {
        Sense::new(key::ILLEGAL_REQUEST, 0x39, 0x00)
    }

    pub const fn invalid_release_of_pr() -> Self {
        Sense::new(key::ILLEGAL_REQUEST, 0x26, 0x04)
    }

    pub const fn miscompare(offset: u32) -> Self {
        Sense { info: Some(offset), ..Sense::new(key::MISCOMPARE, 0x1d, 0x00) }
    }

    pub const fn medium_error(lba: u32) -> Self {
        // 11h/00h UNRECOVERED READ ERROR is the generic medium error initiators understand.
        Sense { info: Some(lba), ..Sense::new(key::MEDIUM_ERROR, 0x11, 0x00) }
    }

    pub const fn write_error(lba: u32) -> Self {
        Sense { info: Some(lba), ..Sense::new(key::MEDIUM_ERROR, 0x0c, 0x00) }
    }

    pub const fn not_ready_unreachable() -> Self {
        // 04h/00h LOGICAL UNIT NOT READY, CAUSE NOT REPORTABLE: the initiator retries.
        Sense::new(key::NOT_READY, 0x04, 0x00)
    }

    pub const fn internal_target_failure() -> Self {
        Sense::new(key::HARDWARE_ERROR, 0x44, 0x00)
    }

    pub const fn write_protected() -> Self {
        Sense::new(key::DATA_PROTECT, 0x27, 0x00)
    }

    pub const fn no_sense() -> Self {
        Sense::new(key::NO_SENSE, 0x00, 0x00)
    }

    /// The 18-byte fixed-format encoding (SPC-4 4.5.3).
    pub fn to_array(&self) -> [u8; SENSE_LEN] {
        let mut b = [0u8; SENSE_LEN];
        b[0] = if self.deferred { 0x71 } else { 0x70 };
        if let Some(info) = self.info {
            b[0] |= 0x80;
            b[3..7].copy_from_slice(&info.to_be_bytes());
        }
        b[2] = self.key & 0x0f;
        b[7] = (SENSE_LEN - 8) as u8;
        b[12] = self.asc;
        b[13] = self.ascq;
        if let Some(Sks::Field { cdb, byte, bit }) = self.sks {
            b[15] = 0x80 | if cdb { 0x40 } else { 0 };
            if let Some(bit) = bit {
                b[15] |= 0x08 | (bit & 0x07);
            }
            b[16..18].copy_from_slice(&byte.to_be_bytes());
        }
        b
    }

    /// The encoding as shared bytes for a [`crate::Response`].
    pub fn to_bytes(&self) -> Bytes {
        Bytes::copy_from_slice(&self.to_array())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn invalid_field_in_cdb_carries_field_pointer() {
        let b = Sense::invalid_cdb_field(2, Some(7)).to_array();
        assert_eq!(b, [0x70, 0, 5, 0, 0, 0, 0, 10, 0, 0, 0, 0, 0x24, 0, 0, 0x80 | 0x40 | 0x08 | 7, 0, 2]);
    }

    #[test]
    fn miscompare_sets_valid_and_information() {
        let b = Sense::miscompare(0x1234).to_array();
        assert_eq!(&b[..8], &[0xf0, 0, 0x0e, 0, 0, 0x12, 0x34, 10]);
        assert_eq!((b[12], b[13]), (0x1d, 0));
        assert_eq!(b[15], 0);
    }

    #[test]
    fn parameter_list_pointer_has_cd_clear() {
        let b = Sense::invalid_param_field(300, None).to_array();
        assert_eq!(&b[15..], &[0x80, 0x01, 0x2c]);
        assert_eq!(b[12], 0x26);
    }

    #[test]
    fn deferred_uses_response_code_71() {
        let s = Sense { deferred: true, ..Sense::lba_out_of_range() };
        assert_eq!(s.to_array()[0], 0x71);
    }
}
