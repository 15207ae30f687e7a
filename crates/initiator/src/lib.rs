//! The stics iSCSI initiator: a pipelined, self-healing client whose remote LUN is a
//! [`stics_block::BlockDev`].
//!
//! - [`url`]: libiscsi-style `iscsi://[user[%secret]@]host[:port]/IQN/LUN` URLs.
//! - [`login`]: the login state machine (CHAP one-way and mutual, operational negotiation).
//! - [`core`]: the full-feature session core (CmdSN window, write planning, Data-In
//!   reassembly, keep-alive, reissue after reconnection), pure and unit-tested with PDUs.
//! - [`recovery`]: when to reconnect and when to give up.
//! - [`driver`] and [`conn`]: the thin tokio driver of a session; only `conn` touches sockets.
//! - [`lun`]: the LUN as a block device, over one or several sessions.
//! - [`discovery`], [`probe`]: SendTargets and per-LUN facts for `stics ls`.
//! - [`counters`]: commands, PDUs, bytes and round trips each way.
//!
//! Scope: error recovery level 0 (a lost connection means session reinstatement and reissue of
//! every unfinished command, save those sent once), one connection per session (several sessions
//! spread the load), no redirection, no bidirectional commands.

#![forbid(unsafe_code)]

pub mod conn;
pub mod core;
pub mod counters;
pub mod discovery;
pub mod driver;
pub mod link;
pub mod login;
pub mod lun;
pub mod probe;
pub mod recovery;
pub mod scsi;
pub mod url;

pub use crate::core::{Data, Request, TaskError, Timers};
pub use counters::{Counters, Snapshot};
pub use discovery::{discover, TargetEntry};
pub use driver::{Config, Session};
pub use link::LinkInfo;
pub use login::{LoginError, Offer};
pub use lun::{Lun, LunOptions};
pub use recovery::RecoveryPolicy;
pub use url::{Chap, IscsiUrl, UrlError};

/// Errors of the initiator.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The URL is malformed or lacks a part.
    #[error(transparent)]
    Url(#[from] UrlError),
    /// TCP connect failed.
    #[error("cannot connect to {addr}: {source}")]
    Connect {
        addr: String,
        #[source]
        source: std::io::Error,
    },
    /// TLS could not be set up or its handshake failed.
    #[error(transparent)]
    Tls(#[from] stics_tls::TlsError),
    /// The connection failed after it was open.
    #[error("connection to {addr} failed: {source}")]
    Io {
        addr: String,
        #[source]
        source: std::io::Error,
    },
    /// A step took longer than its limit.
    #[error("{during} with {addr} timed out")]
    Timeout { addr: String, during: &'static str },
    /// Login failed (credentials, unknown target, negotiation).
    #[error(transparent)]
    Login(#[from] LoginError),
    /// The target broke the protocol.
    #[error("protocol error: {0}")]
    Protocol(String),
    /// A command could not finish.
    #[error(transparent)]
    Task(#[from] TaskError),
    /// A command finished with a SCSI status other than GOOD.
    #[error("SCSI command {opcode:#04x} failed: status {status:#04x}{}", sense_text(sense.as_ref()))]
    Scsi { opcode: u8, status: u8, sense: Option<stics_sam::Sense> },
    /// Another initiator holds the LUN's persistent reservation under this key.
    #[error("the LUN is reserved by another writer under reservation key {holder:#018x}")]
    Reserved { holder: u64 },
    /// The LUN is not a direct-access block device.
    #[error("LUN {lun} is a {device_type}, not a disk")]
    NotADisk { lun: u64, device_type: &'static str },
}

fn sense_text(s: Option<&stics_sam::Sense>) -> String {
    s.map(|s| format!(", sense key {:#x} asc {:#04x} ascq {:#04x}", s.key, s.asc, s.ascq)).unwrap_or_default()
}

impl Error {
    pub(crate) fn scsi(opcode: u8, o: &scsi::ScsiOutcome) -> Error {
        Error::Scsi { opcode, status: o.status, sense: o.sense() }
    }

    /// True when retrying cannot help (bad credentials, unknown target, malformed URL).
    pub fn is_permanent(&self) -> bool {
        match self {
            Error::Login(e) => e.is_permanent(),
            Error::Url(_) | Error::NotADisk { .. } => true,
            _ => false,
        }
    }

    /// True when reinstating a session that was logged in before cannot succeed by trying
    /// again ([`login::LoginError::is_permanent_on_reinstatement`]).
    pub fn is_permanent_on_reinstatement(&self) -> bool {
        match self {
            Error::Login(e) => e.is_permanent_on_reinstatement(),
            e => e.is_permanent(),
        }
    }
}
