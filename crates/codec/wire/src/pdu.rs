//! Typed iSCSI PDU headers (RFC 7143 §11): one struct per opcode, each encoded to and decoded
//! from the 48-byte Basic Header Segment.

use bytes::Bytes;

/// Length of the Basic Header Segment.
pub const BHS_LEN: usize = 48;
const _: () = assert!(BHS_LEN == 48, "RFC 7143 §11.2: the BHS is 48 bytes");

/// A raw Basic Header Segment.
pub type Bhs = [u8; BHS_LEN];

/// Initiator Task Tag value meaning "no task" (NOP-In pings, Async messages, Reject).
pub const RESERVED_TAG: u32 = 0xffff_ffff;

/// Opcodes (RFC 7143 §11.2.1.2).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Opcode {
    NopOut = 0x00,
    ScsiCommand = 0x01,
    TaskMgmtRequest = 0x02,
    LoginRequest = 0x03,
    TextRequest = 0x04,
    DataOut = 0x05,
    LogoutRequest = 0x06,
    SnackRequest = 0x10,
    NopIn = 0x20,
    ScsiResponse = 0x21,
    TaskMgmtResponse = 0x22,
    LoginResponse = 0x23,
    TextResponse = 0x24,
    DataIn = 0x25,
    LogoutResponse = 0x26,
    R2t = 0x31,
    AsyncMessage = 0x32,
    Reject = 0x3f,
}

impl Opcode {
    /// Decodes the low six bits of BHS byte 0.
    pub fn from_u8(v: u8) -> Option<Opcode> {
        use Opcode::{
            AsyncMessage, DataIn, DataOut, LoginRequest, LoginResponse, LogoutRequest, LogoutResponse, NopIn, NopOut,
            R2t, Reject, ScsiCommand, ScsiResponse, SnackRequest, TaskMgmtRequest, TaskMgmtResponse, TextRequest,
            TextResponse,
        };
        Some(match v & 0x3f {
            0x00 => NopOut,
            0x01 => ScsiCommand,
            0x02 => TaskMgmtRequest,
            0x03 => LoginRequest,
            0x04 => TextRequest,
            0x05 => DataOut,
            0x06 => LogoutRequest,
            0x10 => SnackRequest,
            0x20 => NopIn,
            0x21 => ScsiResponse,
            0x22 => TaskMgmtResponse,
            0x23 => LoginResponse,
            0x24 => TextResponse,
            0x25 => DataIn,
            0x26 => LogoutResponse,
            0x31 => R2t,
            0x32 => AsyncMessage,
            0x3f => Reject,
            _ => return None,
        })
    }

    /// True for PDUs an initiator sends.
    pub fn from_initiator(self) -> bool {
        (self as u8) < 0x20
    }
}

/// Task attributes of a SCSI Command (RFC 7143 §11.3.1).
pub mod attr {
    pub const UNTAGGED: u8 = 0;
    pub const SIMPLE: u8 = 1;
    pub const ORDERED: u8 = 2;
    pub const HEAD_OF_QUEUE: u8 = 3;
    pub const ACA: u8 = 4;
}

/// Task management function codes (RFC 7143 §11.5.1).
pub mod tmf {
    pub const ABORT_TASK: u8 = 1;
    pub const ABORT_TASK_SET: u8 = 2;
    pub const CLEAR_ACA: u8 = 3;
    pub const CLEAR_TASK_SET: u8 = 4;
    pub const LOGICAL_UNIT_RESET: u8 = 5;
    pub const TARGET_WARM_RESET: u8 = 6;
    pub const TARGET_COLD_RESET: u8 = 7;
    pub const TASK_REASSIGN: u8 = 8;

    /// Task management responses (RFC 7143 §11.6.1).
    pub const FUNCTION_COMPLETE: u8 = 0;
    pub const TASK_DOES_NOT_EXIST: u8 = 1;
    pub const LUN_DOES_NOT_EXIST: u8 = 2;
    pub const TASK_STILL_ALLEGIANT: u8 = 3;
    pub const REASSIGNMENT_NOT_SUPPORTED: u8 = 4;
    pub const NOT_SUPPORTED: u8 = 5;
    pub const AUTHORIZATION_FAILED: u8 = 6;
    pub const REJECTED: u8 = 255;
}

/// Reject reasons (RFC 7143 §11.17.1).
pub mod reject {
    pub const DIGEST_ERROR: u8 = 0x02;
    pub const SNACK_REJECT: u8 = 0x03;
    pub const PROTOCOL_ERROR: u8 = 0x04;
    pub const COMMAND_NOT_SUPPORTED: u8 = 0x05;
    pub const IMMEDIATE_COMMAND_REJECT: u8 = 0x06;
    pub const TASK_IN_PROGRESS: u8 = 0x07;
    pub const INVALID_DATA_ACK: u8 = 0x08;
    pub const INVALID_PDU_FIELD: u8 = 0x09;
    pub const LONG_OPERATION_REJECT: u8 = 0x0a;
    pub const NEGOTIATION_RESET: u8 = 0x0b;
    pub const WAITING_FOR_LOGOUT: u8 = 0x0c;
}

/// Login stages (CSG/NSG, RFC 7143 §11.12.3).
pub mod stage {
    pub const SECURITY: u8 = 0;
    pub const OPERATIONAL: u8 = 1;
    pub const FULL_FEATURE: u8 = 3;
}

/// Login status classes and details (RFC 7143 §11.13.5).
pub mod login_status {
    pub const SUCCESS: (u8, u8) = (0x00, 0x00);
    pub const TARGET_MOVED_TEMPORARILY: (u8, u8) = (0x01, 0x01);
    pub const INITIATOR_ERROR: (u8, u8) = (0x02, 0x00);
    pub const AUTHENTICATION_FAILURE: (u8, u8) = (0x02, 0x01);
    pub const AUTHORIZATION_FAILURE: (u8, u8) = (0x02, 0x02);
    pub const NOT_FOUND: (u8, u8) = (0x02, 0x03);
    pub const TARGET_REMOVED: (u8, u8) = (0x02, 0x04);
    pub const UNSUPPORTED_VERSION: (u8, u8) = (0x02, 0x05);
    pub const TOO_MANY_CONNECTIONS: (u8, u8) = (0x02, 0x06);
    pub const MISSING_PARAMETER: (u8, u8) = (0x02, 0x07);
    pub const CANT_INCLUDE_IN_SESSION: (u8, u8) = (0x02, 0x08);
    pub const SESSION_TYPE_NOT_SUPPORTED: (u8, u8) = (0x02, 0x09);
    pub const SESSION_DOES_NOT_EXIST: (u8, u8) = (0x02, 0x0a);
    pub const INVALID_DURING_LOGIN: (u8, u8) = (0x02, 0x0b);
    pub const TARGET_ERROR: (u8, u8) = (0x03, 0x00);
    pub const SERVICE_UNAVAILABLE: (u8, u8) = (0x03, 0x01);
    pub const OUT_OF_RESOURCES: (u8, u8) = (0x03, 0x02);
}

/// Logout reasons and responses (RFC 7143 §11.14.1, §11.15.1).
pub mod logout {
    pub const CLOSE_SESSION: u8 = 0;
    pub const CLOSE_CONNECTION: u8 = 1;
    pub const REMOVE_CONNECTION_FOR_RECOVERY: u8 = 2;

    pub const SUCCESS: u8 = 0;
    pub const CID_NOT_FOUND: u8 = 1;
    pub const RECOVERY_NOT_SUPPORTED: u8 = 2;
    pub const CLEANUP_FAILED: u8 = 3;
}

/// NOP-Out (RFC 7143 §11.18).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct NopOut {
    pub immediate: bool,
    pub lun: u64,
    pub itt: u32,
    pub ttt: u32,
    pub cmd_sn: u32,
    pub exp_stat_sn: u32,
}

/// SCSI Command (RFC 7143 §11.3).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ScsiCommand {
    pub immediate: bool,
    pub final_: bool,
    pub read: bool,
    pub write: bool,
    pub attr: u8,
    pub lun: u64,
    pub itt: u32,
    pub expected_len: u32,
    pub cmd_sn: u32,
    pub exp_stat_sn: u32,
    pub cdb: [u8; 16],
}

/// Task Management Function Request (RFC 7143 §11.5).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct TaskMgmtRequest {
    pub immediate: bool,
    pub function: u8,
    pub lun: u64,
    pub itt: u32,
    pub referenced_tag: u32,
    pub cmd_sn: u32,
    pub exp_stat_sn: u32,
    pub ref_cmd_sn: u32,
    pub exp_data_sn: u32,
}

/// Login Request (RFC 7143 §11.12).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct LoginRequest {
    pub transit: bool,
    pub cont: bool,
    pub csg: u8,
    pub nsg: u8,
    pub version_max: u8,
    pub version_min: u8,
    pub isid: [u8; 6],
    pub tsih: u16,
    pub itt: u32,
    pub cid: u16,
    pub cmd_sn: u32,
    pub exp_stat_sn: u32,
}

/// Text Request (RFC 7143 §11.10).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct TextRequest {
    pub immediate: bool,
    pub final_: bool,
    pub cont: bool,
    pub lun: u64,
    pub itt: u32,
    pub ttt: u32,
    pub cmd_sn: u32,
    pub exp_stat_sn: u32,
}

/// SCSI Data-Out (RFC 7143 §11.7).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct DataOut {
    pub final_: bool,
    pub lun: u64,
    pub itt: u32,
    pub ttt: u32,
    pub exp_stat_sn: u32,
    pub data_sn: u32,
    pub buffer_offset: u32,
}

/// Logout Request (RFC 7143 §11.14).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct LogoutRequest {
    pub immediate: bool,
    pub reason: u8,
    pub itt: u32,
    pub cid: u16,
    pub cmd_sn: u32,
    pub exp_stat_sn: u32,
}

/// SNACK Request (RFC 7143 §11.16).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SnackRequest {
    pub kind: u8,
    pub lun: u64,
    pub itt: u32,
    pub ttt: u32,
    pub exp_stat_sn: u32,
    pub beg_run: u32,
    pub run_length: u32,
}

/// NOP-In (RFC 7143 §11.19).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct NopIn {
    pub lun: u64,
    pub itt: u32,
    pub ttt: u32,
    pub stat_sn: u32,
    pub exp_cmd_sn: u32,
    pub max_cmd_sn: u32,
}

/// SCSI Response (RFC 7143 §11.4). The data segment carries sense data (see [`sense_segment`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ScsiResponse {
    pub bidi_overflow: bool,
    pub bidi_underflow: bool,
    pub overflow: bool,
    pub underflow: bool,
    pub response: u8,
    pub status: u8,
    pub itt: u32,
    pub snack_tag: u32,
    pub stat_sn: u32,
    pub exp_cmd_sn: u32,
    pub max_cmd_sn: u32,
    pub exp_data_sn: u32,
    pub bidi_residual: u32,
    pub residual: u32,
}

/// Task Management Function Response (RFC 7143 §11.6).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct TaskMgmtResponse {
    pub response: u8,
    pub itt: u32,
    pub stat_sn: u32,
    pub exp_cmd_sn: u32,
    pub max_cmd_sn: u32,
}

/// Login Response (RFC 7143 §11.13).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct LoginResponse {
    pub transit: bool,
    pub cont: bool,
    pub csg: u8,
    pub nsg: u8,
    pub version_max: u8,
    pub version_active: u8,
    pub isid: [u8; 6],
    pub tsih: u16,
    pub itt: u32,
    pub stat_sn: u32,
    pub exp_cmd_sn: u32,
    pub max_cmd_sn: u32,
    pub status_class: u8,
    pub status_detail: u8,
}

/// Text Response (RFC 7143 §11.11).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct TextResponse {
    pub final_: bool,
    pub cont: bool,
    pub lun: u64,
    pub itt: u32,
    pub ttt: u32,
    pub stat_sn: u32,
    pub exp_cmd_sn: u32,
    pub max_cmd_sn: u32,
}

/// SCSI Data-In (RFC 7143 §11.7). With `status_present`, it also ends the command.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct DataIn {
    pub final_: bool,
    pub ack: bool,
    pub overflow: bool,
    pub underflow: bool,
    pub status_present: bool,
    pub status: u8,
    pub lun: u64,
    pub itt: u32,
    pub ttt: u32,
    pub stat_sn: u32,
    pub exp_cmd_sn: u32,
    pub max_cmd_sn: u32,
    pub data_sn: u32,
    pub buffer_offset: u32,
    pub residual: u32,
}

/// Logout Response (RFC 7143 §11.15).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct LogoutResponse {
    pub response: u8,
    pub itt: u32,
    pub stat_sn: u32,
    pub exp_cmd_sn: u32,
    pub max_cmd_sn: u32,
    pub time2wait: u16,
    pub time2retain: u16,
}

/// Ready To Transfer (RFC 7143 §11.8).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct R2t {
    pub lun: u64,
    pub itt: u32,
    pub ttt: u32,
    pub stat_sn: u32,
    pub exp_cmd_sn: u32,
    pub max_cmd_sn: u32,
    pub r2t_sn: u32,
    pub buffer_offset: u32,
    pub desired_len: u32,
}

/// Asynchronous Message (RFC 7143 §11.9).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct AsyncMessage {
    pub lun: u64,
    pub stat_sn: u32,
    pub exp_cmd_sn: u32,
    pub max_cmd_sn: u32,
    pub event: u8,
    pub vcode: u8,
    pub param1: u16,
    pub param2: u16,
    pub param3: u16,
}

/// Reject (RFC 7143 §11.17). The data segment carries the rejected PDU's BHS.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Reject {
    pub reason: u8,
    pub stat_sn: u32,
    pub exp_cmd_sn: u32,
    pub max_cmd_sn: u32,
    pub data_sn: u32,
}

/// A decoded BHS.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Header {
    NopOut(NopOut),
    ScsiCommand(ScsiCommand),
    TaskMgmtRequest(TaskMgmtRequest),
    LoginRequest(LoginRequest),
    TextRequest(TextRequest),
    DataOut(DataOut),
    LogoutRequest(LogoutRequest),
    SnackRequest(SnackRequest),
    NopIn(NopIn),
    ScsiResponse(ScsiResponse),
    TaskMgmtResponse(TaskMgmtResponse),
    LoginResponse(LoginResponse),
    TextResponse(TextResponse),
    DataIn(DataIn),
    LogoutResponse(LogoutResponse),
    R2t(R2t),
    AsyncMessage(AsyncMessage),
    Reject(Reject),
}

/// A whole PDU: header, Additional Header Segments (raw) and data segment (unpadded).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pdu {
    pub header: Header,
    pub ahs: Bytes,
    pub data: Bytes,
}

impl Pdu {
    /// A PDU with no AHS.
    pub fn new(header: impl Into<Header>, data: Bytes) -> Pdu {
        Pdu { header: header.into(), ahs: Bytes::new(), data }
    }
}

macro_rules! into_header {
    ($($t:ident),*) => {$(
        impl From<$t> for Header {
            fn from(h: $t) -> Header { Header::$t(h) }
        }
    )*};
}
into_header!(
    NopOut,
    ScsiCommand,
    TaskMgmtRequest,
    LoginRequest,
    TextRequest,
    DataOut,
    LogoutRequest,
    SnackRequest,
    NopIn,
    ScsiResponse,
    TaskMgmtResponse,
    LoginResponse,
    TextResponse,
    DataIn,
    LogoutResponse,
    R2t,
    AsyncMessage,
    Reject
);

/// Fixed-offset accessors over a BHS. Offsets are constants below 48, so the slices are in range.
#[expect(clippy::indexing_slicing, reason = "every offset is a constant that fits in the 48-byte BHS")]
mod field {
    use super::Bhs;

    pub fn u16_at(b: &Bhs, o: usize) -> u16 {
        u16::from_be_bytes([b[o], b[o + 1]])
    }
    pub fn u32_at(b: &Bhs, o: usize) -> u32 {
        u32::from_be_bytes([b[o], b[o + 1], b[o + 2], b[o + 3]])
    }
    pub fn u64_at(b: &Bhs, o: usize) -> u64 {
        let mut a = [0u8; 8];
        a.copy_from_slice(&b[o..o + 8]);
        u64::from_be_bytes(a)
    }
    pub fn isid(b: &Bhs) -> [u8; 6] {
        let mut a = [0u8; 6];
        a.copy_from_slice(&b[8..14]);
        a
    }
    pub fn cdb(b: &Bhs) -> [u8; 16] {
        let mut a = [0u8; 16];
        a.copy_from_slice(&b[32..48]);
        a
    }
    pub fn put_u16(b: &mut Bhs, o: usize, v: u16) {
        b[o..o + 2].copy_from_slice(&v.to_be_bytes());
    }
    pub fn put_u32(b: &mut Bhs, o: usize, v: u32) {
        b[o..o + 4].copy_from_slice(&v.to_be_bytes());
    }
    pub fn put_u64(b: &mut Bhs, o: usize, v: u64) {
        b[o..o + 8].copy_from_slice(&v.to_be_bytes());
    }
    pub fn put_bytes(b: &mut Bhs, o: usize, v: &[u8]) {
        b[o..o + v.len()].copy_from_slice(v);
    }
}
use field::{cdb, isid, put_bytes, put_u16, put_u32, put_u64, u16_at, u32_at, u64_at};

const F: u8 = 0x80;

fn bit(b: u8, mask: u8) -> bool {
    b & mask != 0
}

fn flag(on: bool, mask: u8) -> u8 {
    if on {
        mask
    } else {
        0
    }
}

/// Why a BHS could not be decoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum HeaderError {
    /// Byte 0 names an opcode RFC 7143 does not define.
    #[error("unknown opcode {0:#04x}")]
    UnknownOpcode(u8),
}

impl Header {
    /// The PDU's opcode.
    pub fn opcode(&self) -> Opcode {
        match self {
            Header::NopOut(_) => Opcode::NopOut,
            Header::ScsiCommand(_) => Opcode::ScsiCommand,
            Header::TaskMgmtRequest(_) => Opcode::TaskMgmtRequest,
            Header::LoginRequest(_) => Opcode::LoginRequest,
            Header::TextRequest(_) => Opcode::TextRequest,
            Header::DataOut(_) => Opcode::DataOut,
            Header::LogoutRequest(_) => Opcode::LogoutRequest,
            Header::SnackRequest(_) => Opcode::SnackRequest,
            Header::NopIn(_) => Opcode::NopIn,
            Header::ScsiResponse(_) => Opcode::ScsiResponse,
            Header::TaskMgmtResponse(_) => Opcode::TaskMgmtResponse,
            Header::LoginResponse(_) => Opcode::LoginResponse,
            Header::TextResponse(_) => Opcode::TextResponse,
            Header::DataIn(_) => Opcode::DataIn,
            Header::LogoutResponse(_) => Opcode::LogoutResponse,
            Header::R2t(_) => Opcode::R2t,
            Header::AsyncMessage(_) => Opcode::AsyncMessage,
            Header::Reject(_) => Opcode::Reject,
        }
    }

    /// The Initiator Task Tag (0xffffffff for PDUs that carry none).
    pub fn itt(&self) -> u32 {
        match self {
            Header::NopOut(h) => h.itt,
            Header::ScsiCommand(h) => h.itt,
            Header::TaskMgmtRequest(h) => h.itt,
            Header::LoginRequest(h) => h.itt,
            Header::TextRequest(h) => h.itt,
            Header::DataOut(h) => h.itt,
            Header::LogoutRequest(h) => h.itt,
            Header::SnackRequest(h) => h.itt,
            Header::NopIn(h) => h.itt,
            Header::ScsiResponse(h) => h.itt,
            Header::TaskMgmtResponse(h) => h.itt,
            Header::LoginResponse(h) => h.itt,
            Header::TextResponse(h) => h.itt,
            Header::DataIn(h) => h.itt,
            Header::LogoutResponse(h) => h.itt,
            Header::R2t(h) => h.itt,
            Header::AsyncMessage(_) | Header::Reject(_) => RESERVED_TAG,
        }
    }

    /// Encodes the header into a BHS. TotalAHSLength and DataSegmentLength are left zero; the
    /// framing step ([`crate::frame::encode`]) fills them in.
    pub fn encode(&self) -> Bhs {
        let mut b = [0u8; BHS_LEN];
        let op = self.opcode() as u8;
        match self {
            Header::NopOut(h) => {
                b[0] = op | flag(h.immediate, 0x40);
                b[1] = F;
                put_u64(&mut b, 8, h.lun);
                put_u32(&mut b, 16, h.itt);
                put_u32(&mut b, 20, h.ttt);
                put_u32(&mut b, 24, h.cmd_sn);
                put_u32(&mut b, 28, h.exp_stat_sn);
            }
            Header::ScsiCommand(h) => {
                b[0] = op | flag(h.immediate, 0x40);
                b[1] = flag(h.final_, F) | flag(h.read, 0x40) | flag(h.write, 0x20) | (h.attr & 0x07);
                put_u64(&mut b, 8, h.lun);
                put_u32(&mut b, 16, h.itt);
                put_u32(&mut b, 20, h.expected_len);
                put_u32(&mut b, 24, h.cmd_sn);
                put_u32(&mut b, 28, h.exp_stat_sn);
                put_bytes(&mut b, 32, &h.cdb);
            }
            Header::TaskMgmtRequest(h) => {
                b[0] = op | flag(h.immediate, 0x40);
                b[1] = F | (h.function & 0x7f);
                put_u64(&mut b, 8, h.lun);
                put_u32(&mut b, 16, h.itt);
                put_u32(&mut b, 20, h.referenced_tag);
                put_u32(&mut b, 24, h.cmd_sn);
                put_u32(&mut b, 28, h.exp_stat_sn);
                put_u32(&mut b, 32, h.ref_cmd_sn);
                put_u32(&mut b, 36, h.exp_data_sn);
            }
            Header::LoginRequest(h) => {
                b[0] = op | 0x40;
                b[1] = flag(h.transit, F) | flag(h.cont, 0x40) | ((h.csg & 3) << 2) | (h.nsg & 3);
                b[2] = h.version_max;
                b[3] = h.version_min;
                put_bytes(&mut b, 8, &h.isid);
                put_u16(&mut b, 14, h.tsih);
                put_u32(&mut b, 16, h.itt);
                put_u16(&mut b, 20, h.cid);
                put_u32(&mut b, 24, h.cmd_sn);
                put_u32(&mut b, 28, h.exp_stat_sn);
            }
            Header::TextRequest(h) => {
                b[0] = op | flag(h.immediate, 0x40);
                b[1] = flag(h.final_, F) | flag(h.cont, 0x40);
                put_u64(&mut b, 8, h.lun);
                put_u32(&mut b, 16, h.itt);
                put_u32(&mut b, 20, h.ttt);
                put_u32(&mut b, 24, h.cmd_sn);
                put_u32(&mut b, 28, h.exp_stat_sn);
            }
            Header::DataOut(h) => {
                b[0] = op;
                b[1] = flag(h.final_, F);
                put_u64(&mut b, 8, h.lun);
                put_u32(&mut b, 16, h.itt);
                put_u32(&mut b, 20, h.ttt);
                put_u32(&mut b, 28, h.exp_stat_sn);
                put_u32(&mut b, 36, h.data_sn);
                put_u32(&mut b, 40, h.buffer_offset);
            }
            Header::LogoutRequest(h) => {
                b[0] = op | flag(h.immediate, 0x40);
                b[1] = F | (h.reason & 0x7f);
                put_u32(&mut b, 16, h.itt);
                put_u16(&mut b, 20, h.cid);
                put_u32(&mut b, 24, h.cmd_sn);
                put_u32(&mut b, 28, h.exp_stat_sn);
            }
            Header::SnackRequest(h) => {
                b[0] = op;
                b[1] = F | (h.kind & 0x0f);
                put_u64(&mut b, 8, h.lun);
                put_u32(&mut b, 16, h.itt);
                put_u32(&mut b, 20, h.ttt);
                put_u32(&mut b, 28, h.exp_stat_sn);
                put_u32(&mut b, 40, h.beg_run);
                put_u32(&mut b, 44, h.run_length);
            }
            Header::NopIn(h) => {
                b[0] = op;
                b[1] = F;
                put_u64(&mut b, 8, h.lun);
                put_u32(&mut b, 16, h.itt);
                put_u32(&mut b, 20, h.ttt);
                put_u32(&mut b, 24, h.stat_sn);
                put_u32(&mut b, 28, h.exp_cmd_sn);
                put_u32(&mut b, 32, h.max_cmd_sn);
            }
            Header::ScsiResponse(h) => {
                b[0] = op;
                b[1] = F
                    | flag(h.bidi_overflow, 0x10)
                    | flag(h.bidi_underflow, 0x08)
                    | flag(h.overflow, 0x04)
                    | flag(h.underflow, 0x02);
                b[2] = h.response;
                b[3] = h.status;
                put_u32(&mut b, 16, h.itt);
                put_u32(&mut b, 20, h.snack_tag);
                put_u32(&mut b, 24, h.stat_sn);
                put_u32(&mut b, 28, h.exp_cmd_sn);
                put_u32(&mut b, 32, h.max_cmd_sn);
                put_u32(&mut b, 36, h.exp_data_sn);
                put_u32(&mut b, 40, h.bidi_residual);
                put_u32(&mut b, 44, h.residual);
            }
            Header::TaskMgmtResponse(h) => {
                b[0] = op;
                b[1] = F;
                b[2] = h.response;
                put_u32(&mut b, 16, h.itt);
                put_u32(&mut b, 24, h.stat_sn);
                put_u32(&mut b, 28, h.exp_cmd_sn);
                put_u32(&mut b, 32, h.max_cmd_sn);
            }
            Header::LoginResponse(h) => {
                b[0] = op;
                b[1] = flag(h.transit, F) | flag(h.cont, 0x40) | ((h.csg & 3) << 2) | (h.nsg & 3);
                b[2] = h.version_max;
                b[3] = h.version_active;
                put_bytes(&mut b, 8, &h.isid);
                put_u16(&mut b, 14, h.tsih);
                put_u32(&mut b, 16, h.itt);
                put_u32(&mut b, 24, h.stat_sn);
                put_u32(&mut b, 28, h.exp_cmd_sn);
                put_u32(&mut b, 32, h.max_cmd_sn);
                b[36] = h.status_class;
                b[37] = h.status_detail;
            }
            Header::TextResponse(h) => {
                b[0] = op;
                b[1] = flag(h.final_, F) | flag(h.cont, 0x40);
                put_u64(&mut b, 8, h.lun);
                put_u32(&mut b, 16, h.itt);
                put_u32(&mut b, 20, h.ttt);
                put_u32(&mut b, 24, h.stat_sn);
                put_u32(&mut b, 28, h.exp_cmd_sn);
                put_u32(&mut b, 32, h.max_cmd_sn);
            }
            Header::DataIn(h) => {
                b[0] = op;
                b[1] = flag(h.final_, F)
                    | flag(h.ack, 0x40)
                    | flag(h.overflow, 0x04)
                    | flag(h.underflow, 0x02)
                    | flag(h.status_present, 0x01);
                b[3] = h.status;
                put_u64(&mut b, 8, h.lun);
                put_u32(&mut b, 16, h.itt);
                put_u32(&mut b, 20, h.ttt);
                put_u32(&mut b, 24, h.stat_sn);
                put_u32(&mut b, 28, h.exp_cmd_sn);
                put_u32(&mut b, 32, h.max_cmd_sn);
                put_u32(&mut b, 36, h.data_sn);
                put_u32(&mut b, 40, h.buffer_offset);
                put_u32(&mut b, 44, h.residual);
            }
            Header::LogoutResponse(h) => {
                b[0] = op;
                b[1] = F;
                b[2] = h.response;
                put_u32(&mut b, 16, h.itt);
                put_u32(&mut b, 24, h.stat_sn);
                put_u32(&mut b, 28, h.exp_cmd_sn);
                put_u32(&mut b, 32, h.max_cmd_sn);
                put_u16(&mut b, 40, h.time2wait);
                put_u16(&mut b, 42, h.time2retain);
            }
            Header::R2t(h) => {
                b[0] = op;
                b[1] = F;
                put_u64(&mut b, 8, h.lun);
                put_u32(&mut b, 16, h.itt);
                put_u32(&mut b, 20, h.ttt);
                put_u32(&mut b, 24, h.stat_sn);
                put_u32(&mut b, 28, h.exp_cmd_sn);
                put_u32(&mut b, 32, h.max_cmd_sn);
                put_u32(&mut b, 36, h.r2t_sn);
                put_u32(&mut b, 40, h.buffer_offset);
                put_u32(&mut b, 44, h.desired_len);
            }
            Header::AsyncMessage(h) => {
                b[0] = op;
                b[1] = F;
                put_u64(&mut b, 8, h.lun);
                put_u32(&mut b, 16, RESERVED_TAG);
                put_u32(&mut b, 24, h.stat_sn);
                put_u32(&mut b, 28, h.exp_cmd_sn);
                put_u32(&mut b, 32, h.max_cmd_sn);
                b[36] = h.event;
                b[37] = h.vcode;
                put_u16(&mut b, 38, h.param1);
                put_u16(&mut b, 40, h.param2);
                put_u16(&mut b, 42, h.param3);
            }
            Header::Reject(h) => {
                b[0] = op;
                b[1] = F;
                b[2] = h.reason;
                put_u32(&mut b, 16, RESERVED_TAG);
                put_u32(&mut b, 24, h.stat_sn);
                put_u32(&mut b, 28, h.exp_cmd_sn);
                put_u32(&mut b, 32, h.max_cmd_sn);
                put_u32(&mut b, 36, h.data_sn);
            }
        }
        b
    }

    /// Decodes a BHS. Reserved fields are ignored, as RFC 7143 §11.2 asks of receivers.
    pub fn decode(b: &Bhs) -> Result<Header, HeaderError> {
        let op = Opcode::from_u8(b[0]).ok_or(HeaderError::UnknownOpcode(b[0] & 0x3f))?;
        let imm = bit(b[0], 0x40);
        let f = bit(b[1], F);
        let lun = u64_at(b, 8);
        let itt = u32_at(b, 16);
        Ok(match op {
            Opcode::NopOut => Header::NopOut(NopOut {
                immediate: imm,
                lun,
                itt,
                ttt: u32_at(b, 20),
                cmd_sn: u32_at(b, 24),
                exp_stat_sn: u32_at(b, 28),
            }),
            Opcode::ScsiCommand => Header::ScsiCommand(ScsiCommand {
                immediate: imm,
                final_: f,
                read: bit(b[1], 0x40),
                write: bit(b[1], 0x20),
                attr: b[1] & 0x07,
                lun,
                itt,
                expected_len: u32_at(b, 20),
                cmd_sn: u32_at(b, 24),
                exp_stat_sn: u32_at(b, 28),
                cdb: cdb(b),
            }),
            Opcode::TaskMgmtRequest => Header::TaskMgmtRequest(TaskMgmtRequest {
                immediate: imm,
                function: b[1] & 0x7f,
                lun,
                itt,
                referenced_tag: u32_at(b, 20),
                cmd_sn: u32_at(b, 24),
                exp_stat_sn: u32_at(b, 28),
                ref_cmd_sn: u32_at(b, 32),
                exp_data_sn: u32_at(b, 36),
            }),
            Opcode::LoginRequest => Header::LoginRequest(LoginRequest {
                transit: f,
                cont: bit(b[1], 0x40),
                csg: (b[1] >> 2) & 3,
                nsg: b[1] & 3,
                version_max: b[2],
                version_min: b[3],
                isid: isid(b),
                tsih: u16_at(b, 14),
                itt,
                cid: u16_at(b, 20),
                cmd_sn: u32_at(b, 24),
                exp_stat_sn: u32_at(b, 28),
            }),
            Opcode::TextRequest => Header::TextRequest(TextRequest {
                immediate: imm,
                final_: f,
                cont: bit(b[1], 0x40),
                lun,
                itt,
                ttt: u32_at(b, 20),
                cmd_sn: u32_at(b, 24),
                exp_stat_sn: u32_at(b, 28),
            }),
            Opcode::DataOut => Header::DataOut(DataOut {
                final_: f,
                lun,
                itt,
                ttt: u32_at(b, 20),
                exp_stat_sn: u32_at(b, 28),
                data_sn: u32_at(b, 36),
                buffer_offset: u32_at(b, 40),
            }),
            Opcode::LogoutRequest => Header::LogoutRequest(LogoutRequest {
                immediate: imm,
                reason: b[1] & 0x7f,
                itt,
                cid: u16_at(b, 20),
                cmd_sn: u32_at(b, 24),
                exp_stat_sn: u32_at(b, 28),
            }),
            Opcode::SnackRequest => Header::SnackRequest(SnackRequest {
                kind: b[1] & 0x0f,
                lun,
                itt,
                ttt: u32_at(b, 20),
                exp_stat_sn: u32_at(b, 28),
                beg_run: u32_at(b, 40),
                run_length: u32_at(b, 44),
            }),
            Opcode::NopIn => Header::NopIn(NopIn {
                lun,
                itt,
                ttt: u32_at(b, 20),
                stat_sn: u32_at(b, 24),
                exp_cmd_sn: u32_at(b, 28),
                max_cmd_sn: u32_at(b, 32),
            }),
            Opcode::ScsiResponse => Header::ScsiResponse(ScsiResponse {
                bidi_overflow: bit(b[1], 0x10),
                bidi_underflow: bit(b[1], 0x08),
                overflow: bit(b[1], 0x04),
                underflow: bit(b[1], 0x02),
                response: b[2],
                status: b[3],
                itt,
                snack_tag: u32_at(b, 20),
                stat_sn: u32_at(b, 24),
                exp_cmd_sn: u32_at(b, 28),
                max_cmd_sn: u32_at(b, 32),
                exp_data_sn: u32_at(b, 36),
                bidi_residual: u32_at(b, 40),
                residual: u32_at(b, 44),
            }),
            Opcode::TaskMgmtResponse => Header::TaskMgmtResponse(TaskMgmtResponse {
                response: b[2],
                itt,
                stat_sn: u32_at(b, 24),
                exp_cmd_sn: u32_at(b, 28),
                max_cmd_sn: u32_at(b, 32),
            }),
            Opcode::LoginResponse => Header::LoginResponse(LoginResponse {
                transit: f,
                cont: bit(b[1], 0x40),
                csg: (b[1] >> 2) & 3,
                nsg: b[1] & 3,
                version_max: b[2],
                version_active: b[3],
                isid: isid(b),
                tsih: u16_at(b, 14),
                itt,
                stat_sn: u32_at(b, 24),
                exp_cmd_sn: u32_at(b, 28),
                max_cmd_sn: u32_at(b, 32),
                status_class: b[36],
                status_detail: b[37],
            }),
            Opcode::TextResponse => Header::TextResponse(TextResponse {
                final_: f,
                cont: bit(b[1], 0x40),
                lun,
                itt,
                ttt: u32_at(b, 20),
                stat_sn: u32_at(b, 24),
                exp_cmd_sn: u32_at(b, 28),
                max_cmd_sn: u32_at(b, 32),
            }),
            Opcode::DataIn => Header::DataIn(DataIn {
                final_: f,
                ack: bit(b[1], 0x40),
                overflow: bit(b[1], 0x04),
                underflow: bit(b[1], 0x02),
                status_present: bit(b[1], 0x01),
                status: b[3],
                lun,
                itt,
                ttt: u32_at(b, 20),
                stat_sn: u32_at(b, 24),
                exp_cmd_sn: u32_at(b, 28),
                max_cmd_sn: u32_at(b, 32),
                data_sn: u32_at(b, 36),
                buffer_offset: u32_at(b, 40),
                residual: u32_at(b, 44),
            }),
            Opcode::LogoutResponse => Header::LogoutResponse(LogoutResponse {
                response: b[2],
                itt,
                stat_sn: u32_at(b, 24),
                exp_cmd_sn: u32_at(b, 28),
                max_cmd_sn: u32_at(b, 32),
                time2wait: u16_at(b, 40),
                time2retain: u16_at(b, 42),
            }),
            Opcode::R2t => Header::R2t(R2t {
                lun,
                itt,
                ttt: u32_at(b, 20),
                stat_sn: u32_at(b, 24),
                exp_cmd_sn: u32_at(b, 28),
                max_cmd_sn: u32_at(b, 32),
                r2t_sn: u32_at(b, 36),
                buffer_offset: u32_at(b, 40),
                desired_len: u32_at(b, 44),
            }),
            Opcode::AsyncMessage => Header::AsyncMessage(AsyncMessage {
                lun,
                stat_sn: u32_at(b, 24),
                exp_cmd_sn: u32_at(b, 28),
                max_cmd_sn: u32_at(b, 32),
                event: b[36],
                vcode: b[37],
                param1: u16_at(b, 38),
                param2: u16_at(b, 40),
                param3: u16_at(b, 42),
            }),
            Opcode::Reject => Header::Reject(Reject {
                reason: b[2],
                stat_sn: u32_at(b, 24),
                exp_cmd_sn: u32_at(b, 28),
                max_cmd_sn: u32_at(b, 32),
                data_sn: u32_at(b, 36),
            }),
        })
    }
}

/// Builds the data segment of a SCSI Response that carries sense data (RFC 7143 §11.4.7):
/// a two-byte SenseLength, then the sense bytes.
pub fn sense_segment(sense: &[u8]) -> Bytes {
    let len = sense.len().min(u16::MAX as usize);
    let mut v = Vec::with_capacity(2 + len);
    v.extend_from_slice(&(len as u16).to_be_bytes());
    v.extend_from_slice(sense.get(..len).unwrap_or_default());
    Bytes::from(v)
}

/// Extracts the sense bytes from a SCSI Response data segment; `None` if it is malformed.
pub fn sense_from_segment(data: &Bytes) -> Option<Bytes> {
    let len_bytes = data.get(..2)?;
    let len = u16::from_be_bytes([*len_bytes.first()?, *len_bytes.get(1)?]) as usize;
    if data.len() < 2 + len {
        return None;
    }
    Some(data.slice(2..2 + len))
}

#[cfg(test)]
#[expect(clippy::unwrap_used, reason = "tests")]
mod tests {
    use super::*;

    #[test]
    fn scsi_command_layout_matches_rfc_7143_11_3() {
        let mut cdb = [0u8; 16];
        cdb[0] = 0x28;
        let h = ScsiCommand {
            immediate: false,
            final_: true,
            read: true,
            write: false,
            attr: attr::SIMPLE,
            lun: 0x0001_0000_0000_0000,
            itt: 0x11223344,
            expected_len: 4096,
            cmd_sn: 7,
            exp_stat_sn: 9,
            cdb,
        };
        let b = Header::from(h).encode();
        assert_eq!(b[0], 0x01);
        assert_eq!(b[1], 0xc1);
        assert_eq!(&b[8..16], &[0, 1, 0, 0, 0, 0, 0, 0]);
        assert_eq!(&b[16..20], &[0x11, 0x22, 0x33, 0x44]);
        assert_eq!(&b[20..24], &[0, 0, 0x10, 0]);
        assert_eq!(&b[24..28], &[0, 0, 0, 7]);
        assert_eq!(&b[28..32], &[0, 0, 0, 9]);
        assert_eq!(b[32], 0x28);
        assert_eq!(Header::decode(&b).unwrap(), Header::ScsiCommand(h));
    }

    #[test]
    fn login_request_sets_immediate_bit_and_stages() {
        let h = LoginRequest {
            transit: true,
            csg: stage::SECURITY,
            nsg: stage::OPERATIONAL,
            isid: [0x40, 0, 0x01, 0x37, 0, 0],
            cid: 1,
            ..Default::default()
        };
        let b = Header::from(h).encode();
        assert_eq!(b[0], 0x43);
        assert_eq!(b[1], 0x81);
        assert_eq!(&b[8..14], &[0x40, 0, 0x01, 0x37, 0, 0]);
        assert_eq!(&b[20..22], &[0, 1]);
        assert_eq!(Header::decode(&b).unwrap(), Header::LoginRequest(h));
    }

    #[test]
    fn data_in_with_status_sets_s_and_u_bits() {
        let h = DataIn {
            final_: true,
            status_present: true,
            underflow: true,
            residual: 512,
            itt: 5,
            ttt: RESERVED_TAG,
            ..Default::default()
        };
        let b = Header::from(h).encode();
        assert_eq!(b[0], 0x25);
        assert_eq!(b[1], 0x83);
        assert_eq!(&b[44..48], &[0, 0, 2, 0]);
    }

    #[test]
    fn unknown_opcode_is_an_error() {
        let mut b = [0u8; BHS_LEN];
        b[0] = 0x1c;
        assert_eq!(Header::decode(&b), Err(HeaderError::UnknownOpcode(0x1c)));
    }

    #[test]
    fn sense_segment_round_trips() {
        let s = sense_segment(&[0x70, 0, 5]);
        assert_eq!(&s[..], &[0, 3, 0x70, 0, 5]);
        assert_eq!(&sense_from_segment(&s).unwrap()[..], &[0x70, 0, 5]);
        assert_eq!(sense_from_segment(&Bytes::from_static(&[0, 9, 1])), None);
    }
}
