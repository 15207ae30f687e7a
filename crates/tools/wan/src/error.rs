//! The one error type of the WAN emulator.

use std::io;

/// Everything that can go wrong while parsing parameters, building the emulated link or talking
/// to its daemon.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum WanError {
    /// A size, duration, rate or probability could not be read.
    #[error(transparent)]
    Units(#[from] stics_units::Error),
    /// A parameter could not be parsed or is out of range.
    #[error("invalid {what} {value:?}: {reason}")]
    Param { what: &'static str, value: String, reason: String },
    /// An external command (`ip`, `iptables`, `tc`, `sysctl`) failed.
    #[error("`{cmd}` failed: {detail}")]
    Command { cmd: String, detail: String },
    /// A system call or file operation failed.
    #[error("{op}: {source}")]
    Io {
        op: String,
        #[source]
        source: io::Error,
    },
    /// The kernel answered a netlink request with an error or something unexpected.
    #[error("netlink: {0}")]
    Netlink(String),
    /// No emulator daemon runs under this name.
    #[error("WAN emulator {0:?} is not running (start it with `stics wan up`)")]
    NotRunning(String),
    /// The daemon and the client disagree about the control protocol.
    #[error("control protocol: {0}")]
    Protocol(String),
    /// The daemon did not come up.
    #[error("WAN emulator failed to start: {0}")]
    Start(String),
}

impl WanError {
    /// Wraps an I/O error with the operation that failed.
    pub fn io(op: impl Into<String>, source: io::Error) -> Self {
        WanError::Io { op: op.into(), source }
    }

    /// The error of the last system call, with the operation that failed.
    pub fn last_os(op: impl Into<String>) -> Self {
        WanError::io(op, io::Error::last_os_error())
    }

    pub(crate) fn param(what: &'static str, value: &str, reason: impl Into<String>) -> Self {
        WanError::Param { what, value: value.to_string(), reason: reason.into() }
    }
}
