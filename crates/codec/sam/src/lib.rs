//! SCSI facts both ends of stics share: status codes (SAM-5), sense keys and ASC/ASCQ pairs and
//! sense data (SPC-4), operation codes, the 8-byte LUN field, and the CDB codec with the parsers
//! of the replies an initiator reads.
//!
//! **Architecture Invariant:** no I/O, no async, no state: pure functions over bytes. Sense
//! bytes are made only by [`Sense`]'s encoders; CDBs are decoded only by [`decode_cdb`].

#![forbid(unsafe_code)]
#![deny(clippy::unwrap_used, clippy::indexing_slicing)]

pub mod cdb;
pub mod data;
pub mod lun;
pub mod op;
pub mod sense;

pub use cdb::{decode_cdb, Cdb, CdbError, ModeSense, Rw, RwForm, WriteSame};
pub use sense::{Sense, Sks};

/// SCSI status codes (SAM-5 5.3).
pub mod status {
    /// GOOD
    pub const GOOD: u8 = 0x00;
    /// CHECK CONDITION: sense data describes the error.
    pub const CHECK_CONDITION: u8 = 0x02;
    /// CONDITION MET
    pub const CONDITION_MET: u8 = 0x04;
    /// BUSY: the logical unit cannot accept the command now.
    pub const BUSY: u8 = 0x08;
    /// RESERVATION CONFLICT
    pub const RESERVATION_CONFLICT: u8 = 0x18;
    /// TASK SET FULL
    pub const TASK_SET_FULL: u8 = 0x28;
    /// ACA ACTIVE
    pub const ACA_ACTIVE: u8 = 0x30;
    /// TASK ABORTED
    pub const TASK_ABORTED: u8 = 0x40;
}
