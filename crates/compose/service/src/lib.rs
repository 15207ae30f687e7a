//! What `stics target` and `stics gateway` run, composed from the layers beneath: the
//! configuration file ([`config`]), its devices opened and closed ([`service`]; cached LUNs as
//! typed caches in [`cached`]), the target over them, and the HTTP endpoint with the metrics and
//! the caches' status ([`http`], [`metrics`]).
//!
//! **Architecture Invariant:** the target (stics-target) gets devices and typed values only; all
//! text (TOML, device specs) is read here or in the device stack, and whatever this opens it
//! also closes.

#![forbid(unsafe_code)]
#![deny(clippy::unwrap_used)]

pub mod cached;
pub mod config;
pub mod http;
pub mod metrics;
pub mod service;

pub use cached::{CachedError, CachedLun, Opened};
pub use config::{CachedLunConfig, Config, ConfigError, LunConfig, RbdConfig, TargetConfig, TlsConfig};
pub use http::Endpoint;
pub use service::{ServedCache, Service, ServiceError};
