//! A Ceph RBD image as a [`stics_block::BlockDev`], over librbd's asynchronous C API.
//!
//! Everything lives behind the cargo feature `rbd`, which links librbd and librados (Debian:
//! `librbd-dev`); without it this crate is empty, so the workspace builds on machines without
//! Ceph. [`RbdDev`] is the device and says what happens when two writers open one image; `sys`
//! is the only module with `unsafe`.

#[cfg(feature = "rbd")]
mod dev;
#[cfg(feature = "rbd")]
mod sys;

#[cfg(feature = "rbd")]
pub use dev::{RbdDev, RbdError, RbdOptions};
