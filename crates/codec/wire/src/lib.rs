//! The iSCSI wire codec (RFC 7143): typed PDUs, framing with digests, text keys and the
//! negotiation rules for every operational key, plus CHAP arithmetic.
//!
//! **Architecture Invariant:** this crate does no I/O, spawns nothing, logs nothing and knows
//! nothing about SCSI semantics. It turns bytes into values and values into bytes; callers own
//! sockets and state.

#![forbid(unsafe_code)]
#![deny(clippy::unwrap_used, clippy::indexing_slicing)]

pub mod chap;
pub mod digest;
pub mod frame;
pub mod keepalive;
pub mod keys;
pub mod pdu;
pub mod serial;
pub mod text;

/// The 8-byte LUN field; SAM defines it, so it lives with the other SCSI facts.
pub use stics_sam::lun;

pub use frame::{check, encode, parse, DecodeError, Digests, FrameError};
pub use pdu::*;
