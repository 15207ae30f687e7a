//! The device stack: one spec language and one [`open`] for every stics block device, nested.
//!
//! A [`DeviceSpec`] names a device as text (`mem:1GiB`, `file:/srv/a.img:10G:4096`,
//! `iscsi://host/IQN/0`, `rbd:pool/image` (opened only in a build with the `rbd` feature), and
//! wrappers around any of them, `NAME(SPEC, KEY=VALUE, ...)`); [`open`] builds it, inner devices first, as an `Arc<dyn BlockDev>`. The target serves what it
//! returns over iSCSI and `stics mount` exports it through FUSE; neither knows the backends.
//!
//! **Architecture Invariant:** the only place that turns text into devices: it knows every
//! backend's constructor and nothing about who exports them.

#![forbid(unsafe_code)]

mod open;
mod spec;
mod syntax;

pub use open::{
    log_binding, open, open_remote, CacheLog, OpenContext, OpenError, RbdDefaults, DEFAULT_LOG_BYTES,
    DEFAULT_RBD_TIMEOUT_SECS,
};
pub use spec::{
    CacheSpec, DeviceSpec, DiskSpec, IscsiOptions, JournalAt, JournalSpec, Layer, LayerArgs, RbdSpec, Redacted,
    SpecError, LAYERS, MAX_GROUP, MAX_RBD_TIMEOUT_SECS, MAX_SESSIONS,
};
