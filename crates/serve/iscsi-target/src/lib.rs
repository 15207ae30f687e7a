//! The stics iSCSI target (RFC 7143, error recovery level 0) over tokio.
//!
//! Protocol decisions live in pure state machines that take inputs and return actions:
//! [`login`] (security and operational negotiation, CHAP), [`core`] (the full-feature
//! session core: task table, task management, logout, NOP, keep-alive, StatSN stamping rules)
//! over [`cmdsn`] (the command window), [`order`] (task attributes), [`dataout`] (R2T and Data-Out tracking), [`datain`]
//! (responses as Data-In and SCSI Response PDUs) and [`textreq`] (SendTargets and text
//! continuation), and [`registry`] (TSIH and session reinstatement). Only `conn` touches
//! sockets: one reader and one writer task per connection, SCSI commands executed concurrently,
//! responses stamped with sequence numbers and written in batches.
//!
//! **Architecture Invariant:** memory is bounded by negotiated and configured limits: no buffer
//! is sized from a peer-supplied length before that length is checked against them.

#![forbid(unsafe_code)]
#![deny(clippy::unwrap_used)]

pub mod cmdsn;
pub mod config;
mod conn;
pub mod core;
pub mod datain;
pub mod dataout;
pub mod login;
pub mod order;
pub mod registry;
mod server;
pub mod textreq;
pub mod warn;

pub use config::{Config, ConfigError, Credentials, DiscoveryConfig, Limits, RbdConfig, TargetConfig, TlsConfig};
pub use server::Server;

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
    /// The TLS certificate, key or client CA cannot be used.
    #[error("TLS: {0}")]
    Tls(#[from] stics_tls::TlsError),
}
