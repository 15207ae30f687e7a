//! SCSI command emulation (SPC-4 / SBC-3) over a [`stics_block::BlockDev`]: INQUIRY and VPD
//! pages, mode pages, reservations and unit attentions. No iSCSI, no sockets, no logging. The
//! SCSI facts it speaks (CDB decoding, sense data, opcodes, LUN field) come from [`stics_sam`] and
//! are re-exported here under their former paths.
//!
//! The iSCSI target hands each SCSI command to [`Device::execute`] with the session's [`Nexus`]
//! and gets back status, sense, data-in and the residual to put in the SCSI Response PDU.
//!
//! **Architecture Invariant:** sense bytes are made only by [`Sense::to_bytes`]; every error
//! path builds a [`Sense`] value. READ and WRITE take no global lock: reads take none at all,
//! writes share a per-LU lock that only COMPARE AND WRITE and ORWRITE take exclusively.

#![forbid(unsafe_code)]

use bytes::Bytes;

mod device;
mod link;
mod lu;
pub mod pr;
mod spc;

pub use stics_sam::cdb;
pub use stics_sam::lun::{from_bytes as lun_from_bytes, to_bytes as lun_to_bytes};

/// Sense data and SCSI status codes.
pub mod sense {
    pub use stics_sam::sense::*;
    pub use stics_sam::status;
}

pub use cdb::{decode_cdb, Cdb, CdbError, Rw, RwForm};
pub use device::Device;
pub use lu::{LogicalUnit, LuConfig, MAX_TRANSFER_BYTES};
pub use pr::NexusKey;
pub use sense::Sense;

/// One I_T nexus (an iSCSI session).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Nexus {
    /// Unique per session for the life of the process.
    pub id: u64,
    /// iSCSI initiator name (iqn...).
    pub initiator_name: String,
    pub isid: [u8; 6],
    pub target_name: String,
    pub tpgt: u16,
}

impl Nexus {
    /// The identity reservations use (initiator port and target port; not the session id).
    pub fn key(&self) -> NexusKey {
        NexusKey { initiator: self.initiator_name.to_ascii_lowercase(), isid: self.isid, tpgt: self.tpgt }
    }
}

/// Data direction from the iSCSI R/W flags.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    None,
    Read,
    Write,
    Bidi,
}

/// SAM task attribute.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TaskAttr {
    Untagged,
    Simple,
    Ordered,
    HeadOfQueue,
    Aca,
}

/// One SCSI command as the transport received it.
#[derive(Debug, Clone)]
pub struct Command {
    /// LUN number, already decoded from the 8-byte LUN field.
    pub lun: u64,
    /// 6..=260 bytes (iSCSI passes 16 plus an optional AHS extension).
    pub cdb: Bytes,
    /// iSCSI Expected Data Transfer Length.
    pub expected_len: u32,
    pub direction: Direction,
    /// All write data, exactly what the initiator sent (at most `expected_len`).
    pub data_out: Bytes,
    pub attr: TaskAttr,
}

/// Residual to report in the SCSI Response (RFC 7143 11.4.5.2).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Residual {
    None,
    /// The command transferred this many bytes fewer than the expected length.
    Underflow(u32),
    /// The command wanted this many bytes more than the expected length.
    Overflow(u32),
}

/// The outcome of one command.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Response {
    /// 0x00 GOOD, 0x02 CHECK CONDITION, 0x08 BUSY, 0x18 RESERVATION CONFLICT, 0x28 TASK SET FULL.
    pub status: u8,
    /// Fixed-format sense data (0x70), with CHECK CONDITION.
    pub sense: Option<Bytes>,
    /// Read data, already cut to the expected length.
    pub data_in: Bytes,
    pub residual: Residual,
}

impl Response {
    /// Decodes the sense key, ASC and ASCQ of a CHECK CONDITION (for tests and logs).
    pub fn sense_triple(&self) -> Option<(u8, u8, u8)> {
        let s = Sense::parse(self.sense.as_ref()?)?;
        Some((s.key, s.asc, s.ascq))
    }
}

/// Result of a task management function.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TmfResult {
    Complete,
    LunDoesNotExist,
    NotSupported,
    Rejected,
}

#[cfg(test)]
mod tests;
