//! Sense data (SPC-4 4.5): sense keys, named ASC/ASCQ pairs, and the [`Sense`] value with the
//! one encoder of the bytes sent to initiators and the parser of what targets send back.

use bytes::Bytes;

/// Sense keys (SPC-4 table 27).
pub mod key {
    /// NO SENSE
    pub const NO_SENSE: u8 = 0x0;
    /// RECOVERED ERROR
    pub const RECOVERED_ERROR: u8 = 0x1;
    /// NOT READY
    pub const NOT_READY: u8 = 0x2;
    /// MEDIUM ERROR
    pub const MEDIUM_ERROR: u8 = 0x3;
    /// HARDWARE ERROR
    pub const HARDWARE_ERROR: u8 = 0x4;
    /// ILLEGAL REQUEST
    pub const ILLEGAL_REQUEST: u8 = 0x5;
    /// UNIT ATTENTION
    pub const UNIT_ATTENTION: u8 = 0x6;
    /// DATA PROTECT
    pub const DATA_PROTECT: u8 = 0x7;
    /// ABORTED COMMAND
    pub const ABORTED_COMMAND: u8 = 0xb;
    /// MISCOMPARE
    pub const MISCOMPARE: u8 = 0xe;
}

/// Additional sense code and qualifier pairs (SPC-4 table D.2), as `(ASC, ASCQ)`.
pub mod asc {
    /// NO ADDITIONAL SENSE INFORMATION
    pub const NO_ADDITIONAL_SENSE: (u8, u8) = (0x00, 0x00);
    /// LOGICAL UNIT NOT READY, CAUSE NOT REPORTABLE
    pub const LUN_NOT_READY: (u8, u8) = (0x04, 0x00);
    /// LOGICAL UNIT COMMUNICATION TIME-OUT
    pub const LU_COMMUNICATION_TIMEOUT: (u8, u8) = (0x08, 0x01);
    /// WRITE ERROR
    pub const WRITE_ERROR: (u8, u8) = (0x0c, 0x00);
    /// INVALID FIELD IN COMMAND INFORMATION UNIT
    pub const INVALID_FIELD_IN_IU: (u8, u8) = (0x0e, 0x03);
    /// UNRECOVERED READ ERROR
    pub const UNRECOVERED_READ_ERROR: (u8, u8) = (0x11, 0x00);
    /// PARAMETER LIST LENGTH ERROR
    pub const PARAMETER_LIST_LENGTH_ERROR: (u8, u8) = (0x1a, 0x00);
    /// MISCOMPARE DURING VERIFY OPERATION
    pub const MISCOMPARE_DURING_VERIFY: (u8, u8) = (0x1d, 0x00);
    /// INVALID COMMAND OPERATION CODE
    pub const INVALID_COMMAND_OPERATION_CODE: (u8, u8) = (0x20, 0x00);
    /// LOGICAL BLOCK ADDRESS OUT OF RANGE
    pub const LBA_OUT_OF_RANGE: (u8, u8) = (0x21, 0x00);
    /// INVALID FIELD IN CDB
    pub const INVALID_FIELD_IN_CDB: (u8, u8) = (0x24, 0x00);
    /// LOGICAL UNIT NOT SUPPORTED
    pub const LUN_NOT_SUPPORTED: (u8, u8) = (0x25, 0x00);
    /// INVALID FIELD IN PARAMETER LIST
    pub const INVALID_FIELD_IN_PARAMETER_LIST: (u8, u8) = (0x26, 0x00);
    /// INVALID RELEASE OF PERSISTENT RESERVATION
    pub const INVALID_RELEASE_OF_PR: (u8, u8) = (0x26, 0x04);
    /// WRITE PROTECTED
    pub const WRITE_PROTECTED: (u8, u8) = (0x27, 0x00);
    /// SPACE ALLOCATION FAILED WRITE PROTECT (a thin-provisioned LUN whose pool is full)
    pub const SPACE_ALLOCATION_FAILED: (u8, u8) = (0x27, 0x07);
    /// POWER ON, RESET, OR BUS DEVICE RESET OCCURRED
    pub const POWER_ON_RESET: (u8, u8) = (0x29, 0x00);
    /// POWER ON OCCURRED
    pub const POWER_ON_OCCURRED: (u8, u8) = (0x29, 0x01);
    /// BUS DEVICE RESET FUNCTION OCCURRED
    pub const BUS_DEVICE_RESET: (u8, u8) = (0x29, 0x03);
    /// MODE PARAMETERS CHANGED
    pub const MODE_PARAMETERS_CHANGED: (u8, u8) = (0x2a, 0x01);
    /// RESERVATIONS PREEMPTED
    pub const RESERVATIONS_PREEMPTED: (u8, u8) = (0x2a, 0x03);
    /// RESERVATIONS RELEASED
    pub const RESERVATIONS_RELEASED: (u8, u8) = (0x2a, 0x04);
    /// REGISTRATIONS PREEMPTED
    pub const REGISTRATIONS_PREEMPTED: (u8, u8) = (0x2a, 0x05);
    /// COMMANDS CLEARED BY ANOTHER INITIATOR
    pub const COMMANDS_CLEARED_BY_ANOTHER_INITIATOR: (u8, u8) = (0x2f, 0x00);
    /// COMMAND SEQUENCE ERROR
    pub const COMMAND_SEQUENCE_ERROR: (u8, u8) = (0x2c, 0x00);
    /// SAVING PARAMETERS NOT SUPPORTED
    pub const SAVING_PARAMETERS_NOT_SUPPORTED: (u8, u8) = (0x39, 0x00);
    /// INTERNAL TARGET FAILURE
    pub const INTERNAL_TARGET_FAILURE: (u8, u8) = (0x44, 0x00);
    /// PROTOCOL SERVICE CRC ERROR (iSCSI: a data digest failed, RFC 7143 §13.5.1)
    pub const PROTOCOL_SERVICE_CRC_ERROR: (u8, u8) = (0x47, 0x05);
    /// DATA PHASE ERROR
    pub const DATA_PHASE_ERROR: (u8, u8) = (0x4b, 0x00);
}

/// Sense-key specific data (bytes 15..18 of fixed sense, or the sense-key specific descriptor).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sks {
    /// Field pointer: which byte (and optionally bit) of the CDB (`cdb`) or parameter list was bad.
    Field { cdb: bool, byte: u16, bit: Option<u8> },
}

impl Sks {
    /// The three bytes with SKSV set (SPC-4 4.5.2.4.2).
    fn to_bytes(self) -> [u8; 3] {
        let Sks::Field { cdb, byte, bit } = self;
        let mut b0 = 0x80 | if cdb { 0x40 } else { 0 };
        if let Some(bit) = bit {
            b0 |= 0x08 | (bit & 0x07);
        }
        let [hi, lo] = byte.to_be_bytes();
        [b0, hi, lo]
    }

    /// The field pointer in three sense-key specific bytes; only ILLEGAL REQUEST carries one.
    fn parse(key: u8, b: &[u8]) -> Option<Sks> {
        let (&b0, &hi, &lo) = (b.first()?, b.get(1)?, b.get(2)?);
        if b0 & 0x80 == 0 || key != key::ILLEGAL_REQUEST {
            return None;
        }
        let bit = (b0 & 0x08 != 0).then_some(b0 & 0x07);
        Some(Sks::Field { cdb: b0 & 0x40 != 0, byte: u16::from_be_bytes([hi, lo]), bit })
    }
}

/// One sense condition; [`Sense::to_array`] is the encoder of what targets send, [`Sense::parse`]
/// the decoder of what initiators receive.
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

    /// A sense condition from a key and one of the [`asc`] pairs.
    pub const fn of(key: u8, code: (u8, u8)) -> Self {
        Sense::new(key, code.0, code.1)
    }

    /// INVALID FIELD IN CDB pointing at `byte` (and `bit`, the most significant bit of the field).
    pub const fn invalid_cdb_field(byte: u16, bit: Option<u8>) -> Self {
        Sense {
            sks: Some(Sks::Field { cdb: true, byte, bit }),
            ..Sense::of(key::ILLEGAL_REQUEST, asc::INVALID_FIELD_IN_CDB)
        }
    }

    /// INVALID FIELD IN PARAMETER LIST pointing at `byte` of the parameter data.
    pub const fn invalid_param_field(byte: u16, bit: Option<u8>) -> Self {
        Sense {
            sks: Some(Sks::Field { cdb: false, byte, bit }),
            ..Sense::of(key::ILLEGAL_REQUEST, asc::INVALID_FIELD_IN_PARAMETER_LIST)
        }
    }

    pub const fn invalid_opcode() -> Self {
        Sense {
            sks: Some(Sks::Field { cdb: true, byte: 0, bit: None }),
            ..Sense::of(key::ILLEGAL_REQUEST, asc::INVALID_COMMAND_OPERATION_CODE)
        }
    }

    pub const fn lba_out_of_range() -> Self {
        Sense::of(key::ILLEGAL_REQUEST, asc::LBA_OUT_OF_RANGE)
    }

    pub const fn lun_not_supported() -> Self {
        Sense::of(key::ILLEGAL_REQUEST, asc::LUN_NOT_SUPPORTED)
    }

    pub const fn param_list_length_error() -> Self {
        Sense::of(key::ILLEGAL_REQUEST, asc::PARAMETER_LIST_LENGTH_ERROR)
    }

    pub const fn invalid_field_in_iu() -> Self {
        Sense::of(key::ILLEGAL_REQUEST, asc::INVALID_FIELD_IN_IU)
    }

    /// A command that needs earlier ones this nexus did not send (a link COMMIT of a group
    /// whose pieces are missing).
    pub const fn command_sequence_error() -> Self {
        Sense::of(key::ILLEGAL_REQUEST, asc::COMMAND_SEQUENCE_ERROR)
    }

    pub const fn saving_not_supported() -> Self {
        Sense::of(key::ILLEGAL_REQUEST, asc::SAVING_PARAMETERS_NOT_SUPPORTED)
    }

    pub const fn invalid_release_of_pr() -> Self {
        Sense::of(key::ILLEGAL_REQUEST, asc::INVALID_RELEASE_OF_PR)
    }

    pub const fn miscompare(offset: u32) -> Self {
        Sense { info: Some(offset), ..Sense::of(key::MISCOMPARE, asc::MISCOMPARE_DURING_VERIFY) }
    }

    pub const fn medium_error(lba: u32) -> Self {
        // UNRECOVERED READ ERROR is the generic medium error initiators understand.
        Sense { info: Some(lba), ..Sense::of(key::MEDIUM_ERROR, asc::UNRECOVERED_READ_ERROR) }
    }

    pub const fn write_error(lba: u32) -> Self {
        Sense { info: Some(lba), ..Sense::of(key::MEDIUM_ERROR, asc::WRITE_ERROR) }
    }

    pub const fn not_ready_unreachable() -> Self {
        // CAUSE NOT REPORTABLE: the initiator retries.
        Sense::of(key::NOT_READY, asc::LUN_NOT_READY)
    }

    pub const fn internal_target_failure() -> Self {
        Sense::of(key::HARDWARE_ERROR, asc::INTERNAL_TARGET_FAILURE)
    }

    /// Write data that broke the transport's sequence rules.
    pub const fn data_phase_error() -> Self {
        Sense::of(key::ABORTED_COMMAND, asc::DATA_PHASE_ERROR)
    }

    /// Write data lost to a digest error: the initiator may retry the command.
    pub const fn protocol_crc_error() -> Self {
        Sense::of(key::ABORTED_COMMAND, asc::PROTOCOL_SERVICE_CRC_ERROR)
    }

    pub const fn write_protected() -> Self {
        Sense::of(key::DATA_PROTECT, asc::WRITE_PROTECTED)
    }

    /// A thin-provisioned LUN could not allocate space for a write.
    pub const fn space_allocation_failed() -> Self {
        Sense::of(key::DATA_PROTECT, asc::SPACE_ALLOCATION_FAILED)
    }

    /// What the logical unit depends on did not answer within its bound.
    pub const fn communication_timeout() -> Self {
        Sense::of(key::HARDWARE_ERROR, asc::LU_COMMUNICATION_TIMEOUT)
    }

    pub const fn no_sense() -> Self {
        Sense::of(key::NO_SENSE, asc::NO_ADDITIONAL_SENSE)
    }

    /// A UNIT ATTENTION reporting one of the [`asc`] pairs.
    pub const fn unit_attention(code: (u8, u8)) -> Self {
        Sense::of(key::UNIT_ATTENTION, code)
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
        if let Some(sks) = self.sks {
            b[15..18].copy_from_slice(&sks.to_bytes());
        }
        b
    }

    /// The encoding as shared bytes, as a SCSI response carries it.
    pub fn to_bytes(&self) -> Bytes {
        Bytes::copy_from_slice(&self.to_array())
    }

    /// The descriptor-format encoding (SPC-4 4.5.2): response code 72h/73h, then an
    /// information descriptor and a sense-key specific descriptor when present.
    pub fn to_descriptor(&self) -> Vec<u8> {
        let mut descriptors = Vec::new();
        if let Some(info) = self.info {
            descriptors.extend_from_slice(&[0x00, 0x0a, 0x80, 0]);
            descriptors.extend_from_slice(&u64::from(info).to_be_bytes());
        }
        if let Some(sks) = self.sks {
            descriptors.extend_from_slice(&[0x02, 0x06, 0, 0]);
            descriptors.extend_from_slice(&sks.to_bytes());
            descriptors.push(0);
        }
        let code = if self.deferred { 0x73 } else { 0x72 };
        let mut b = vec![code, self.key & 0x0f, self.asc, self.ascq, 0, 0, 0, descriptors.len() as u8];
        b.extend(descriptors);
        b
    }

    /// Parses fixed (70h/71h) or descriptor (72h/73h) sense data. Fields past the end of short
    /// fixed-format data read as zero; `None` for other response codes or when the sense key
    /// itself is missing.
    pub fn parse(s: &[u8]) -> Option<Sense> {
        let b0 = *s.first()?;
        let at = |i: usize| s.get(i).copied().unwrap_or(0);
        match b0 & 0x7f {
            0x70 | 0x71 => {
                let key = s.get(2)? & 0x0f;
                let info = (b0 & 0x80 != 0).then(|| u32::from_be_bytes([at(3), at(4), at(5), at(6)]));
                Some(Sense {
                    key,
                    asc: at(12),
                    ascq: at(13),
                    info,
                    sks: s.get(15..18).and_then(|b| Sks::parse(key, b)),
                    deferred: b0 & 0x7f == 0x71,
                })
            }
            0x72 | 0x73 => {
                let key = s.get(1)? & 0x0f;
                let mut sense = Sense { deferred: b0 & 0x7f == 0x73, ..Sense::new(key, *s.get(2)?, *s.get(3)?) };
                let end = (8 + usize::from(at(7))).min(s.len());
                let mut d = s.get(8..end).unwrap_or_default();
                while let (Some(&ty), Some(&len)) = (d.first(), d.get(1)) {
                    let body = d.get(2..2 + usize::from(len)).unwrap_or_default();
                    match ty {
                        // Information: VALID, reserved, then eight bytes; wider values do not fit ours.
                        0x00 if body.first().is_some_and(|v| v & 0x80 != 0) => {
                            sense.info = body
                                .get(2..10)
                                .and_then(|v| v.try_into().ok())
                                .and_then(|v| u32::try_from(u64::from_be_bytes(v)).ok());
                        }
                        0x02 => sense.sks = body.get(2..5).and_then(|b| Sks::parse(key, b)),
                        _ => {}
                    }
                    d = d.get(2 + usize::from(len)..).unwrap_or_default();
                }
                Some(sense)
            }
            _ => None,
        }
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

    #[test]
    fn parses_fixed_and_descriptor() {
        let mut f = [0u8; 18];
        f[0] = 0x70;
        f[2] = 0x06;
        f[12] = 0x29;
        assert_eq!(Sense::parse(&f), Some(Sense::new(6, 0x29, 0)));
        assert_eq!(Sense::parse(&[0x72, 0x05, 0x24, 0x00]), Some(Sense::new(5, 0x24, 0)));
        assert_eq!(Sense::parse(&[0x70]), None);
        assert_eq!(Sense::parse(&[0x7f, 0, 5]), None);
    }

    #[test]
    fn descriptor_format_layout() {
        // SPC-4 4.5.2: header with the additional length, then the information descriptor.
        let b = Sense::miscompare(0x1234).to_descriptor();
        assert_eq!(b, [0x72, 0x0e, 0x1d, 0, 0, 0, 0, 12, 0x00, 0x0a, 0x80, 0, 0, 0, 0, 0, 0, 0, 0x12, 0x34]);
        let b = Sense::invalid_cdb_field(2, None).to_descriptor();
        assert_eq!(b, [0x72, 0x05, 0x24, 0, 0, 0, 0, 8, 0x02, 0x06, 0, 0, 0xc0, 0, 2, 0]);
        assert_eq!(Sense::no_sense().to_descriptor(), [0x72, 0, 0, 0, 0, 0, 0, 0]);
    }

    fn any_sense() -> impl Strategy<Value = Sense> {
        let sks =
            prop_oneof![
                Just(None),
                (any::<bool>(), any::<u16>(), proptest::option::of(0u8..8))
                    .prop_map(|(cdb, byte, bit)| Some(Sks::Field { cdb, byte, bit })),
            ];
        (0u8..16, any::<u8>(), any::<u8>(), proptest::option::of(any::<u32>()), sks, any::<bool>()).prop_map(
            |(key, asc, ascq, info, sks, deferred)| {
                // Only ILLEGAL REQUEST carries a field pointer.
                let key = if sks.is_some() { key::ILLEGAL_REQUEST } else { key };
                Sense { key, asc, ascq, info, sks, deferred }
            },
        )
    }

    use proptest::prelude::*;

    proptest! {
        #[test]
        fn fixed_format_round_trips(s in any_sense()) {
            prop_assert_eq!(Sense::parse(&s.to_array()), Some(s));
        }

        #[test]
        fn descriptor_format_round_trips(s in any_sense()) {
            prop_assert_eq!(Sense::parse(&s.to_descriptor()), Some(s));
        }

        #[test]
        fn parse_never_panics(b in proptest::collection::vec(any::<u8>(), 0..40)) {
            let _ = Sense::parse(&b);
        }
    }
}
