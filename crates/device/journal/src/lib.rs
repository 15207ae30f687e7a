//! The storage side of STICS (seed 000's SG, seed 004's STICS that takes "write requests from
//! another STICS"): a block device over a medium that takes groups of whole epochs from a
//! gateway, makes each durable in its journal before it answers, and applies it to the medium
//! whole in the background. What it serves is the medium with every committed group over it, so
//! after a crash, which replays the journal's groups, it is always a gateway host's view at the
//! end of some epoch.
//!
//! [`format`] is the journal's on-disk format, [`core`] its decisions (pure), [`dev`] the tokio
//! driver ([`JournalDev`]: a `BlockDev` that is also a [`stics_block::GroupSink`]), [`tokens`] the
//! lock server of the gateways that share the LUN (seed 004 §3.4), served over the link.
//!
//! **Architecture Invariant:** a group is durable before its commit is answered and reaches the
//! medium whole or is replayed whole; plain writes to a block wait until no committed group
//! still has to write it, so no group ever lands over a later write.

#![forbid(unsafe_code)]

pub mod core;
pub mod dev;
pub mod format;
pub mod tokens;

pub use dev::{JournalConfig, JournalDev, JournalStatus};

/// Why a journal cannot open, or refuses a group.
#[derive(Debug, thiserror::Error)]
pub enum JournalError {
    /// Not a journal (never written, or another program's data).
    #[error("bad magic")]
    Magic,
    /// A field of the superblock or a record is invalid.
    #[error("journal field {field} is invalid: {why}")]
    Format { field: &'static str, why: String },
    /// The journal belongs to another medium.
    #[error("this journal belongs to a medium of {found_blocks} blocks of {found_bs} bytes, not this one ({blocks} of {bs}); give it the medium it was made for, or a fresh journal")]
    WrongMedium { found_blocks: u64, found_bs: u32, blocks: u64, bs: u32 },
    /// A group is malformed.
    #[error("group: {0}")]
    Group(#[from] stics_link::LinkError),
    /// A group does not fit this journal or its medium.
    #[error("group refused: {0}")]
    Refused(String),
    /// A group came before the one ahead of it in its source's sequence was taken (a gateway
    /// with two out): it may wait for it.
    #[error("group {seq} came before this source's group {missing}")]
    Ahead { seq: u64, missing: u64 },
    /// The journal or the medium failed.
    #[error("{what}: {source}")]
    Device {
        what: &'static str,
        #[source]
        source: stics_block::BlockError,
    },
}

/// The journal's result.
pub type Result<T> = std::result::Result<T, JournalError>;
