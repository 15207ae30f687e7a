//! The CDB codec: a pure decoder from CDB bytes to a typed command (it never panics and does no
//! I/O), and beside it the builders of the CDBs an initiator sends.

pub use crate::op;
use crate::sense::Sense;

/// Why a CDB could not be decoded; each maps to one sense condition.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum CdbError {
    /// The operation code (or its service action) is not implemented.
    #[error("unsupported operation code {opcode:#04x}")]
    InvalidOpcode { opcode: u8 },
    /// A field holds a value we do not support; `byte`/`bit` point at it.
    #[error("invalid field in CDB at byte {byte}")]
    InvalidField { byte: u16, bit: Option<u8> },
    /// The CDB is shorter than its operation code requires (or empty).
    #[error("CDB of {got} bytes is shorter than the {needed} its opcode needs")]
    TooShort { needed: usize, got: usize },
}

impl CdbError {
    /// The sense data this error reports.
    pub fn sense(&self) -> Sense {
        match *self {
            CdbError::InvalidOpcode { .. } => Sense::invalid_opcode(),
            CdbError::InvalidField { byte, bit } => Sense::invalid_cdb_field(byte, bit),
            CdbError::TooShort { .. } => Sense::invalid_cdb_field(0, None),
        }
    }
}

/// Which READ/WRITE CDB form carried a data transfer (they differ in field positions).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RwForm {
    Six,
    Ten,
    Twelve,
    Sixteen,
}

/// Fields shared by READ, WRITE, WRITE AND VERIFY, VERIFY and ORWRITE.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rw {
    pub lba: u64,
    pub blocks: u32,
    pub fua: bool,
    pub dpo: bool,
    pub form: RwForm,
}

/// The fields of WRITE SAME(10/16).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WriteSame {
    pub lba: u64,
    /// Zero means "to the end of the medium" (WSNZ = 0).
    pub blocks: u32,
    pub unmap: bool,
    pub anchor: bool,
    /// No data-out buffer: the block is zeros (16-byte form only).
    pub ndob: bool,
    pub sixteen: bool,
}

/// The fields of MODE SENSE(6/10).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ModeSense {
    pub ten: bool,
    /// Disable block descriptors.
    pub dbd: bool,
    /// Long LBA block descriptors (10-byte form only).
    pub llbaa: bool,
    /// Page control: 0 current, 1 changeable, 2 default, 3 saved.
    pub pc: u8,
    pub page: u8,
    pub subpage: u8,
    pub alloc: u32,
}

/// A decoded command with its fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cdb {
    TestUnitReady,
    RequestSense {
        desc: bool,
        alloc: u32,
    },
    Inquiry {
        evpd: bool,
        page: u8,
        alloc: u32,
    },
    ReportLuns {
        select: u8,
        alloc: u32,
    },
    ReadCapacity10,
    ReadCapacity16 {
        alloc: u32,
    },
    GetLbaStatus {
        lba: u64,
        alloc: u32,
    },
    Read(Rw),
    Write(Rw),
    WriteVerify {
        rw: Rw,
        bytchk: bool,
    },
    /// `bytchk`: 0 = medium check only, 1 = compare with data-out.
    Verify {
        rw: Rw,
        bytchk: bool,
    },
    OrWrite(Rw),
    CompareAndWrite {
        lba: u64,
        blocks: u8,
        fua: bool,
    },
    WriteSame(WriteSame),
    Unmap {
        anchor: bool,
        param_len: u32,
    },
    SyncCache {
        lba: u64,
        blocks: u32,
        immed: bool,
    },
    PreFetch {
        lba: u64,
        blocks: u32,
        immed: bool,
    },
    ModeSense(ModeSense),
    ModeSelect {
        ten: bool,
        pf: bool,
        sp: bool,
        param_len: u32,
    },
    StartStopUnit {
        immed: bool,
        power_condition: u8,
        loej: bool,
        start: bool,
    },
    PreventAllow {
        prevent: u8,
    },
    Reserve {
        ten: bool,
    },
    Release {
        ten: bool,
    },
    PrIn {
        sa: u8,
        alloc: u32,
    },
    PrOut {
        sa: u8,
        scope: u8,
        ptype: u8,
        param_len: u32,
    },
    ReportSupportedOpcodes {
        rctd: bool,
        options: u8,
        opcode: u8,
        sa: u16,
        alloc: u32,
    },
    ReportSupportedTmfs {
        repd: bool,
        alloc: u32,
    },
    LogSense {
        ppc: bool,
        sp: bool,
        pc: u8,
        page: u8,
        subpage: u8,
        alloc: u32,
    },
    SendDiagnostic {
        selftest: bool,
        param_len: u32,
    },
    ReceiveDiagnostic {
        pcv: bool,
        page: u8,
        alloc: u32,
    },
    ReadDefectData {
        twelve: bool,
        alloc: u32,
    },
}

impl Cdb {
    /// The CDB length a given operation code uses (by group code), or None for unknown groups.
    pub fn len_for_opcode(opcode: u8) -> Option<usize> {
        match opcode >> 5 {
            0 => Some(6),
            1 | 2 => Some(10),
            4 => Some(16),
            5 => Some(12),
            _ => None,
        }
    }

    /// True for commands whose data moves from the initiator to the target.
    pub fn is_data_out(&self) -> bool {
        matches!(
            self,
            Cdb::Write(_)
                | Cdb::WriteVerify { .. }
                | Cdb::Verify { bytchk: true, .. }
                | Cdb::OrWrite(_)
                | Cdb::CompareAndWrite { .. }
                | Cdb::WriteSame(_)
                | Cdb::Unmap { .. }
                | Cdb::ModeSelect { .. }
                | Cdb::PrOut { .. }
                | Cdb::SendDiagnostic { .. }
        )
    }
}

/// Bounds-checked big-endian field reads over a CDB (missing bytes read as zero).
struct Fields<'a>(&'a [u8]);

impl Fields<'_> {
    fn u8(&self, i: usize) -> u8 {
        self.0.get(i).copied().unwrap_or(0)
    }
    fn bit(&self, i: usize, bit: u8) -> bool {
        self.u8(i) & (1 << bit) != 0
    }
    fn be(&self, at: usize, n: usize) -> u64 {
        (at..at + n).fold(0u64, |acc, i| (acc << 8) | u64::from(self.u8(i)))
    }
    fn u16(&self, at: usize) -> u16 {
        self.be(at, 2) as u16
    }
    fn u32(&self, at: usize) -> u32 {
        self.be(at, 4) as u32
    }
    fn u64(&self, at: usize) -> u64 {
        self.be(at, 8)
    }
}

fn invalid(byte: u16, bit: Option<u8>) -> CdbError {
    CdbError::InvalidField { byte, bit }
}

/// Rejects a non-zero RDPROTECT/WRPROTECT/VRPROTECT: this crate formats without protection information.
fn no_protect(f: &Fields) -> Result<(), CdbError> {
    if f.u8(1) & 0xe0 != 0 {
        return Err(invalid(1, Some(7)));
    }
    Ok(())
}

fn rw(f: &Fields, form: RwForm) -> Rw {
    match form {
        RwForm::Six => {
            let lba = f.be(1, 3) & 0x1f_ffff;
            let n = f.u8(4);
            // A transfer length of zero means 256 blocks in the 6-byte form (SBC-3 5.8).
            let blocks = if n == 0 { 256 } else { u32::from(n) };
            Rw { lba, blocks, fua: false, dpo: false, form }
        }
        RwForm::Ten => {
            Rw { lba: u64::from(f.u32(2)), blocks: u32::from(f.u16(7)), fua: f.bit(1, 3), dpo: f.bit(1, 4), form }
        }
        RwForm::Twelve => Rw { lba: u64::from(f.u32(2)), blocks: f.u32(6), fua: f.bit(1, 3), dpo: f.bit(1, 4), form },
        RwForm::Sixteen => Rw { lba: f.u64(2), blocks: f.u32(10), fua: f.bit(1, 3), dpo: f.bit(1, 4), form },
    }
}

fn form_of(opcode: u8) -> RwForm {
    match opcode >> 5 {
        0 => RwForm::Six,
        1 | 2 => RwForm::Ten,
        5 => RwForm::Twelve,
        _ => RwForm::Sixteen,
    }
}

/// Decodes a CDB (6..=260 bytes; iSCSI pads to 16). Never panics.
pub fn decode_cdb(cdb: &[u8]) -> Result<Cdb, CdbError> {
    let opcode = *cdb.first().ok_or(CdbError::TooShort { needed: 6, got: 0 })?;
    let needed = Cdb::len_for_opcode(opcode).ok_or(CdbError::InvalidOpcode { opcode })?;
    if cdb.len() < needed {
        return Err(CdbError::TooShort { needed, got: cdb.len() });
    }
    let f = Fields(cdb);
    use op::*;
    let c = match opcode {
        TEST_UNIT_READY => Cdb::TestUnitReady,
        REQUEST_SENSE => Cdb::RequestSense { desc: f.bit(1, 0), alloc: u32::from(f.u8(4)) },
        INQUIRY => {
            if f.bit(1, 1) {
                // CMDDT is obsolete since SPC-3.
                return Err(invalid(1, Some(1)));
            }
            let evpd = f.bit(1, 0);
            let page = f.u8(2);
            if !evpd && page != 0 {
                return Err(invalid(2, None));
            }
            Cdb::Inquiry { evpd, page, alloc: u32::from(f.u16(3)) }
        }
        REPORT_LUNS => Cdb::ReportLuns { select: f.u8(2), alloc: f.u32(6) },
        READ_CAPACITY_10 => {
            if !f.bit(8, 0) && f.u32(2) != 0 {
                // A non-zero LBA needs PMI set (SBC-3 5.15).
                return Err(invalid(2, None));
            }
            Cdb::ReadCapacity10
        }
        SERVICE_ACTION_IN_16 => match f.u8(1) & 0x1f {
            SA_READ_CAPACITY_16 => Cdb::ReadCapacity16 { alloc: f.u32(10) },
            SA_GET_LBA_STATUS => Cdb::GetLbaStatus { lba: f.u64(2), alloc: f.u32(10) },
            _ => return Err(invalid(1, Some(4))),
        },
        READ_6 | READ_10 | READ_12 | READ_16 => {
            if opcode != READ_6 {
                no_protect(&f)?;
            }
            Cdb::Read(rw(&f, form_of(opcode)))
        }
        WRITE_6 | WRITE_10 | WRITE_12 | WRITE_16 => {
            if opcode != WRITE_6 {
                no_protect(&f)?;
            }
            Cdb::Write(rw(&f, form_of(opcode)))
        }
        WRITE_VERIFY_10 | WRITE_VERIFY_12 | WRITE_VERIFY_16 => {
            no_protect(&f)?;
            // WRITE AND VERIFY has no FUA bit; it is durable like a FUA write.
            let mut r = rw(&f, form_of(opcode));
            r.fua = true;
            Cdb::WriteVerify { rw: r, bytchk: f.bit(1, 1) }
        }
        VERIFY_10 | VERIFY_12 | VERIFY_16 => {
            no_protect(&f)?;
            let bytchk = (f.u8(1) >> 1) & 0x3;
            if bytchk > 1 {
                // BYTCHK 10b (unspecified) and 11b (one block, compared to all) are not supported.
                return Err(invalid(1, Some(2)));
            }
            let mut r = rw(&f, form_of(opcode));
            r.fua = false;
            Cdb::Verify { rw: r, bytchk: bytchk == 1 }
        }
        ORWRITE_16 => {
            no_protect(&f)?;
            Cdb::OrWrite(rw(&f, RwForm::Sixteen))
        }
        COMPARE_AND_WRITE => {
            no_protect(&f)?;
            Cdb::CompareAndWrite { lba: f.u64(2), blocks: f.u8(13), fua: f.bit(1, 3) }
        }
        WRITE_SAME_10 | WRITE_SAME_16 => {
            no_protect(&f)?;
            let sixteen = opcode == WRITE_SAME_16;
            let (lba, blocks) =
                if sixteen { (f.u64(2), f.u32(10)) } else { (u64::from(f.u32(2)), u32::from(f.u16(7))) };
            let ndob = sixteen && f.bit(1, 0);
            if f.bit(1, 1) || f.bit(1, 2) && !sixteen {
                // LBDATA and PBDATA (obsolete) are not supported.
                return Err(invalid(1, Some(if f.bit(1, 2) { 2 } else { 1 })));
            }
            Cdb::WriteSame(WriteSame { lba, blocks, unmap: f.bit(1, 3), anchor: f.bit(1, 4), ndob, sixteen })
        }
        UNMAP => Cdb::Unmap { anchor: f.bit(1, 0), param_len: u32::from(f.u16(7)) },
        SYNC_CACHE_10 => Cdb::SyncCache { lba: u64::from(f.u32(2)), blocks: u32::from(f.u16(7)), immed: f.bit(1, 1) },
        SYNC_CACHE_16 => Cdb::SyncCache { lba: f.u64(2), blocks: f.u32(10), immed: f.bit(1, 1) },
        PRE_FETCH_10 => Cdb::PreFetch { lba: u64::from(f.u32(2)), blocks: u32::from(f.u16(7)), immed: f.bit(1, 1) },
        PRE_FETCH_16 => Cdb::PreFetch { lba: f.u64(2), blocks: f.u32(10), immed: f.bit(1, 1) },
        MODE_SENSE_6 | MODE_SENSE_10 => {
            let ten = opcode == MODE_SENSE_10;
            Cdb::ModeSense(ModeSense {
                ten,
                dbd: f.bit(1, 3),
                llbaa: ten && f.bit(1, 4),
                pc: f.u8(2) >> 6,
                page: f.u8(2) & 0x3f,
                subpage: f.u8(3),
                alloc: if ten { u32::from(f.u16(7)) } else { u32::from(f.u8(4)) },
            })
        }
        MODE_SELECT_6 | MODE_SELECT_10 => {
            let ten = opcode == MODE_SELECT_10;
            Cdb::ModeSelect {
                ten,
                pf: f.bit(1, 4),
                sp: f.bit(1, 0),
                param_len: if ten { u32::from(f.u16(7)) } else { u32::from(f.u8(4)) },
            }
        }
        START_STOP_UNIT => Cdb::StartStopUnit {
            immed: f.bit(1, 0),
            power_condition: f.u8(4) >> 4,
            loej: f.bit(4, 1),
            start: f.bit(4, 0),
        },
        PREVENT_ALLOW => Cdb::PreventAllow { prevent: f.u8(4) & 0x3 },
        RESERVE_6 | RESERVE_10 => {
            let ten = opcode == RESERVE_10;
            if ten && f.bit(1, 4) {
                // Third-party reservations are not supported.
                return Err(invalid(1, Some(4)));
            }
            if !ten && f.bit(1, 0) {
                // Extent reservations are obsolete.
                return Err(invalid(1, Some(0)));
            }
            Cdb::Reserve { ten }
        }
        RELEASE_6 | RELEASE_10 => {
            let ten = opcode == RELEASE_10;
            if ten && f.bit(1, 4) {
                return Err(invalid(1, Some(4)));
            }
            if !ten && f.bit(1, 0) {
                return Err(invalid(1, Some(0)));
            }
            Cdb::Release { ten }
        }
        PR_IN => Cdb::PrIn { sa: f.u8(1) & 0x1f, alloc: u32::from(f.u16(7)) },
        PR_OUT => Cdb::PrOut { sa: f.u8(1) & 0x1f, scope: f.u8(2) >> 4, ptype: f.u8(2) & 0xf, param_len: f.u32(5) },
        MAINTENANCE_IN => match f.u8(1) & 0x1f {
            SA_REPORT_SUPPORTED_OPCODES => Cdb::ReportSupportedOpcodes {
                rctd: f.bit(2, 7),
                options: f.u8(2) & 0x7,
                opcode: f.u8(3),
                sa: f.u16(4),
                alloc: f.u32(6),
            },
            SA_REPORT_SUPPORTED_TMFS => Cdb::ReportSupportedTmfs { repd: f.bit(2, 7), alloc: f.u32(6) },
            _ => return Err(invalid(1, Some(4))),
        },
        LOG_SENSE => Cdb::LogSense {
            ppc: f.bit(1, 1),
            sp: f.bit(1, 0),
            pc: f.u8(2) >> 6,
            page: f.u8(2) & 0x3f,
            subpage: f.u8(3),
            alloc: u32::from(f.u16(7)),
        },
        SEND_DIAGNOSTIC => Cdb::SendDiagnostic { selftest: f.bit(1, 2), param_len: u32::from(f.u16(3)) },
        RECEIVE_DIAGNOSTIC => Cdb::ReceiveDiagnostic { pcv: f.bit(1, 0), page: f.u8(2), alloc: u32::from(f.u16(3)) },
        READ_DEFECT_DATA_10 => Cdb::ReadDefectData { twelve: false, alloc: u32::from(f.u16(7)) },
        READ_DEFECT_DATA_12 => Cdb::ReadDefectData { twelve: true, alloc: f.u32(6) },
        _ => return Err(CdbError::InvalidOpcode { opcode }),
    };
    Ok(c)
}

/// A zeroed CDB of the 16 bytes an iSCSI header carries, with its operation code.
fn cdb16(opcode: u8) -> [u8; 16] {
    let mut c = [0u8; 16];
    c[0] = opcode;
    c
}

fn rw16(opcode: u8, lba: u64, blocks: u32, fua: bool) -> [u8; 16] {
    let mut c = cdb16(opcode);
    c[1] = if fua { 0x08 } else { 0 };
    c[2..10].copy_from_slice(&lba.to_be_bytes());
    c[10..14].copy_from_slice(&blocks.to_be_bytes());
    c
}

/// READ(16) of `blocks` blocks at `lba`.
pub fn read16(lba: u64, blocks: u32) -> [u8; 16] {
    rw16(op::READ_16, lba, blocks, false)
}

/// WRITE(16); `fua` forces the data to the medium before status.
pub fn write16(lba: u64, blocks: u32, fua: bool) -> [u8; 16] {
    rw16(op::WRITE_16, lba, blocks, fua)
}

/// WRITE SAME(16): the one block of data sent is written to `blocks` blocks from `lba`.
pub fn write_same16(lba: u64, blocks: u32) -> [u8; 16] {
    rw16(op::WRITE_SAME_16, lba, blocks, false)
}

/// SYNCHRONIZE CACHE(10) of the whole medium.
pub fn synchronize_cache10() -> [u8; 16] {
    cdb16(op::SYNC_CACHE_10)
}

/// READ CAPACITY(16) (SERVICE ACTION IN(16)).
pub fn read_capacity16(alloc: u32) -> [u8; 16] {
    let mut c = cdb16(op::SERVICE_ACTION_IN_16);
    c[1] = op::SA_READ_CAPACITY_16;
    c[10..14].copy_from_slice(&alloc.to_be_bytes());
    c
}

/// READ CAPACITY(10).
pub fn read_capacity10() -> [u8; 16] {
    cdb16(op::READ_CAPACITY_10)
}

/// Standard INQUIRY.
pub fn inquiry(alloc: u16) -> [u8; 16] {
    let mut c = cdb16(op::INQUIRY);
    c[3..5].copy_from_slice(&alloc.to_be_bytes());
    c
}

/// INQUIRY of vital product data page `page` (see [`op::vpd`]).
pub fn inquiry_vpd(page: u8, alloc: u16) -> [u8; 16] {
    let mut c = inquiry(alloc);
    c[1] = 0x01; // EVPD
    c[2] = page;
    c
}

/// UNMAP with a parameter list of `descriptors` block descriptors
/// ([`crate::data::unmap_parameters`]).
pub fn unmap(descriptors: usize) -> [u8; 16] {
    let mut c = cdb16(op::UNMAP);
    let len = u16::try_from(descriptors.saturating_mul(16).saturating_add(8)).unwrap_or(u16::MAX);
    c[7..9].copy_from_slice(&len.to_be_bytes());
    c
}

/// REPORT LUNS, all LUNs.
pub fn report_luns(alloc: u32) -> [u8; 16] {
    let mut c = cdb16(op::REPORT_LUNS);
    c[6..10].copy_from_slice(&alloc.to_be_bytes());
    c
}

/// MODE SENSE(6) of the current values of `page` (see [`op::mode_page`]), without block
/// descriptors.
pub fn mode_sense6(page: u8, alloc: u8) -> [u8; 16] {
    let mut c = cdb16(op::MODE_SENSE_6);
    c[1] = 0x08; // DBD
    c[2] = page & 0x3f;
    c[4] = alloc;
    c
}

/// PERSISTENT RESERVE IN with service action `sa` (see [`op::pr_in`]).
pub fn pr_in(sa: u8, alloc: u16) -> [u8; 16] {
    let mut c = cdb16(op::PR_IN);
    c[1] = sa & 0x1f;
    c[7..9].copy_from_slice(&alloc.to_be_bytes());
    c
}

/// PERSISTENT RESERVE OUT with service action `sa` (see [`op::pr_out`]), reservation type
/// `ptype` (see [`op::pr_type`]; scope LU), carrying the 24-byte basic parameter list
/// ([`crate::data::pr_out_parameters`]).
pub fn pr_out(sa: u8, ptype: u8) -> [u8; 16] {
    let mut c = cdb16(op::PR_OUT);
    c[1] = sa & 0x1f;
    c[2] = ptype & 0x0f;
    c[5..9].copy_from_slice(&crate::data::PR_OUT_PARAMETERS_LEN.to_be_bytes());
    c
}

/// TEST UNIT READY.
pub fn test_unit_ready() -> [u8; 16] {
    cdb16(op::TEST_UNIT_READY)
}

#[cfg(test)]
#[expect(clippy::unwrap_used, reason = "tests")]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn read6_zero_length_means_256_blocks() {
        let c = decode_cdb(&[0x08, 0x01, 0x02, 0x03, 0, 0]).unwrap();
        assert_eq!(c, Cdb::Read(Rw { lba: 0x010203, blocks: 256, fua: false, dpo: false, form: RwForm::Six }));
    }

    #[test]
    fn read10_fields_and_fua_dpo() {
        let c = decode_cdb(&[0x28, 0x18, 0, 0, 0x10, 0, 0, 0x00, 0x08, 0]).unwrap();
        assert_eq!(c, Cdb::Read(Rw { lba: 0x1000, blocks: 8, fua: true, dpo: true, form: RwForm::Ten }));
    }

    #[test]
    fn write16_reads_64_bit_lba() {
        let mut b = [0u8; 16];
        b[0] = 0x8a;
        b[2..10].copy_from_slice(&0x0102_0304_0506_0708u64.to_be_bytes());
        b[10..14].copy_from_slice(&0x20u32.to_be_bytes());
        let c = decode_cdb(&b).unwrap();
        assert_eq!(
            c,
            Cdb::Write(Rw { lba: 0x0102_0304_0506_0708, blocks: 0x20, fua: false, dpo: false, form: RwForm::Sixteen })
        );
    }

    #[test]
    fn rdprotect_is_invalid_field_at_byte_1_bit_7() {
        assert_eq!(
            decode_cdb(&[0x28, 0x20, 0, 0, 0, 0, 0, 0, 1, 0]),
            Err(CdbError::InvalidField { byte: 1, bit: Some(7) })
        );
    }

    #[test]
    fn inquiry_page_without_evpd_is_invalid_field_at_byte_2() {
        assert_eq!(decode_cdb(&[0x12, 0, 0x80, 0, 0xff, 0]), Err(CdbError::InvalidField { byte: 2, bit: None }));
        assert_eq!(
            decode_cdb(&[0x12, 1, 0x80, 0x01, 0x00, 0]),
            Ok(Cdb::Inquiry { evpd: true, page: 0x80, alloc: 256 })
        );
    }

    #[test]
    fn unknown_opcode_and_short_cdb() {
        assert_eq!(decode_cdb(&[0xc0; 16]), Err(CdbError::InvalidOpcode { opcode: 0xc0 }));
        assert_eq!(decode_cdb(&[0x28, 0, 0]), Err(CdbError::TooShort { needed: 10, got: 3 }));
        assert_eq!(decode_cdb(&[]), Err(CdbError::TooShort { needed: 6, got: 0 }));
    }

    #[test]
    fn service_action_in_dispatches_read_capacity_16() {
        let mut b = [0u8; 16];
        b[0] = 0x9e;
        b[1] = 0x10;
        b[13] = 32;
        assert_eq!(decode_cdb(&b), Ok(Cdb::ReadCapacity16 { alloc: 32 }));
        b[1] = 0x11;
        assert_eq!(decode_cdb(&b), Err(CdbError::InvalidField { byte: 1, bit: Some(4) }));
    }

    #[test]
    fn pr_out_fields() {
        let b = [0x5f, 0x01, 0x03, 0, 0, 0, 0, 0, 24, 0];
        assert_eq!(decode_cdb(&b), Ok(Cdb::PrOut { sa: 1, scope: 0, ptype: 3, param_len: 24 }));
    }

    proptest! {
        #[test]
        fn decode_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..40)) {
            let _ = decode_cdb(&bytes);
        }

        #[test]
        fn decode_never_panics_on_known_opcodes(op in prop::sample::select(vec![
            0x00u8, 0x03, 0x08, 0x0a, 0x12, 0x15, 0x16, 0x17, 0x1a, 0x1b, 0x1c, 0x1d, 0x1e, 0x25, 0x28, 0x2a,
            0x2e, 0x2f, 0x34, 0x35, 0x37, 0x41, 0x42, 0x4d, 0x55, 0x56, 0x57, 0x5a, 0x5e, 0x5f, 0x88, 0x89,
            0x8a, 0x8b, 0x8e, 0x8f, 0x90, 0x91, 0x93, 0x9e, 0xa0, 0xa3, 0xa8, 0xaa, 0xae, 0xaf, 0xb7]),
            rest in proptest::collection::vec(any::<u8>(), 0..20)) {
            let mut b = vec![op];
            b.extend(rest);
            let _ = decode_cdb(&b);
        }
    }

    #[test]
    fn read16_layout() {
        let c = read16(0x0102_0304_0506_0708, 0x10);
        assert_eq!(c[0], 0x88);
        assert_eq!(&c[2..10], &[1, 2, 3, 4, 5, 6, 7, 8]);
        assert_eq!(&c[10..14], &[0, 0, 0, 0x10]);
        assert_eq!(write16(0, 1, true)[1], 0x08);
    }

    #[test]
    fn write_same_inquiry_vpd_and_unmap_layout() {
        let c = write_same16(7, 9);
        assert_eq!((c[0], c[9], c[13]), (0x93, 7, 9));
        let v = inquiry_vpd(op::vpd::BLOCK_LIMITS, 64);
        assert_eq!(&v[..5], &[0x12, 1, 0xb0, 0, 64]);
        let c = unmap(2);
        assert_eq!((c[0], c[7], c[8]), (0x42, 0, 40));
    }

    #[test]
    fn persistent_reserve_builders_layout_and_decode() {
        let c = pr_in(op::pr_in::READ_RESERVATION, 24);
        assert_eq!(&c[..10], &[0x5e, 0x01, 0, 0, 0, 0, 0, 0, 24, 0]);
        assert_eq!(decode_cdb(&c), Ok(Cdb::PrIn { sa: 1, alloc: 24 }));
        let c = pr_out(op::pr_out::PREEMPT, op::pr_type::WRITE_EXCLUSIVE);
        assert_eq!(&c[..10], &[0x5f, 0x04, 0x01, 0, 0, 0, 0, 0, 24, 0]);
        assert_eq!(decode_cdb(&c), Ok(Cdb::PrOut { sa: 4, scope: 0, ptype: 1, param_len: 24 }));
        let c = pr_out(op::pr_out::REGISTER_AND_IGNORE, 0);
        assert_eq!(decode_cdb(&c), Ok(Cdb::PrOut { sa: 6, scope: 0, ptype: 0, param_len: 24 }));
    }

    #[test]
    fn fixed_builders_decode_to_their_commands() {
        assert_eq!(decode_cdb(&synchronize_cache10()), Ok(Cdb::SyncCache { lba: 0, blocks: 0, immed: false }));
        assert_eq!(decode_cdb(&read_capacity10()), Ok(Cdb::ReadCapacity10));
        assert_eq!(decode_cdb(&test_unit_ready()), Ok(Cdb::TestUnitReady));
    }

    fn rw16_of(lba: u64, blocks: u32, fua: bool) -> Rw {
        Rw { lba, blocks, fua, dpo: false, form: RwForm::Sixteen }
    }

    proptest! {
        #[test]
        fn read_write_builders_round_trip(lba in any::<u64>(), blocks in any::<u32>(), fua in any::<bool>()) {
            prop_assert_eq!(decode_cdb(&read16(lba, blocks)), Ok(Cdb::Read(rw16_of(lba, blocks, false))));
            prop_assert_eq!(decode_cdb(&write16(lba, blocks, fua)), Ok(Cdb::Write(rw16_of(lba, blocks, fua))));
            let ws = WriteSame { lba, blocks, unmap: false, anchor: false, ndob: false, sixteen: true };
            prop_assert_eq!(decode_cdb(&write_same16(lba, blocks)), Ok(Cdb::WriteSame(ws)));
        }

        #[test]
        fn informational_builders_round_trip(alloc in any::<u32>(), alloc16 in any::<u16>(), page in any::<u8>()) {
            prop_assert_eq!(decode_cdb(&read_capacity16(alloc)), Ok(Cdb::ReadCapacity16 { alloc }));
            prop_assert_eq!(decode_cdb(&report_luns(alloc)), Ok(Cdb::ReportLuns { select: 0, alloc }));
            let alloc = u32::from(alloc16);
            prop_assert_eq!(decode_cdb(&inquiry(alloc16)), Ok(Cdb::Inquiry { evpd: false, page: 0, alloc }));
            prop_assert_eq!(decode_cdb(&inquiry_vpd(page, alloc16)), Ok(Cdb::Inquiry { evpd: true, page, alloc }));
        }

        #[test]
        fn mode_sense6_round_trips(page in 0u8..0x40, alloc in any::<u8>()) {
            let want = ModeSense { ten: false, dbd: true, llbaa: false, pc: 0, page, subpage: 0, alloc: u32::from(alloc) };
            prop_assert_eq!(decode_cdb(&mode_sense6(page, alloc)), Ok(Cdb::ModeSense(want)));
        }

        #[test]
        fn unmap_round_trips(n in 0usize..4000) {
            let param_len = 8 + 16 * n as u32;
            prop_assert_eq!(decode_cdb(&unmap(n)), Ok(Cdb::Unmap { anchor: false, param_len }));
        }
    }
}
