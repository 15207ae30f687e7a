//! The stics iSCSI target (RFC 7143, error recovery level 0) over tokio.
//!
//! Protocol decisions live in pure state machines that take inputs and return actions:
//! [`login`] (security and operational negotiation, CHAP), [`cmdsn`] (the command window),
//! [`dataout`] (R2T and Data-Out tracking), [`datain`] (responses as Data-In and SCSI Response
//! PDUs), [`textreq`] (SendTargets and text continuation) and [`registry`] (TSIH and session
//! reinstatement). Only `conn` touches sockets: one reader and one writer task per connection,
//! SCSI commands executed concurrently, responses stamped with sequence numbers and written in
//! batches.
//!
//! **Architecture Invariant:** memory is bounded by negotiated and configured limits: no buffer
//! is sized from a peer-supplied length before that length is checked against them.

#![deny(clippy::unwrap_used)]

pub mod cmdsn;
pub mod config;
mod conn;
pub mod datain;
pub mod dataout;
pub mod keepalive;
pub mod login;
pub mod registry;
mod server;
pub mod textreq;

pub use config::{Config, ConfigError, Credentials, Limits, TargetConfig};
pub use server::Server;

/// Tunes the C allocator for a storage server; call once at start, before the runtime.
///
/// Large read buffers (a 1 MiB READ allocates 1 MiB) would otherwise be mapped and unmapped on
/// every command, glibc's default for blocks above its mmap threshold, and each fresh mapping
/// costs a page fault per 4 KiB: a fifth of the CPU time of 1 MiB reads. Keeping such blocks on
/// the heap and not trimming it eagerly makes them reusable.
pub fn tune_allocator() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // SAFETY: mallopt only sets allocator parameters; it takes plain integers and is safe
        // to call at any time (glibc serialises it internally).
        unsafe {
            libc::mallopt(libc::M_MMAP_THRESHOLD, 64 << 20);
            libc::mallopt(libc::M_TRIM_THRESHOLD, 256 << 20);
        }
    }
}

impl From<ConfigError> for TargetError {
    fn from(e: ConfigError) -> Self {
        TargetError::Config(e)
    }
}

/// Why the target could not start or stopped.
#[derive(Debug, thiserror::Error)]
pub enum TargetError {
    /// The configuration is unusable.
    #[error("{0}")]
    Config(ConfigError),
    /// A LUN's backing device could not be opened.
    #[error("target {iqn} LUN {lun}: {error}")]
    Device { iqn: String, lun: usize, error: stics_stack::OpenError },
    /// A listen address could not be bound.
    #[error("cannot listen on {addr}: {error}")]
    Bind { addr: std::net::SocketAddr, error: std::io::Error },
}
