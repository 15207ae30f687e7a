//! What the stics tests stand on: process guards and peers (tgt, `stics target`, a throwaway
//! Ceph cluster), free ports and a cutting proxy, `stics wan` links and code run inside their
//! namespaces, nfs-ganesha and `stics nfs-mount` clients of it, one raw iSCSI client, data patterns that a
//! checker can verify, fsx-style file checks, a fault-injecting block device and a remote LUN over it that fails on
//! demand, the stamped-block ledger, and a verified workload through the initiator.
//!
//! A dev-dependency only: no library or binary of the workspace may depend on it.

#![forbid(unsafe_code)]

pub mod ceph;
pub mod client;
pub mod coherence;
pub mod faults;
pub mod fsx;
pub mod ledger;
pub mod net;
pub mod netns;
pub mod nfs;
pub mod pattern;
pub mod peers;
pub mod proc;
pub mod remote;
pub mod workload;

/// The target name the test peers serve unless told otherwise.
pub const IQN: &str = "iqn.2024-01.org.stics.test:disk";

/// The initiator name the raw client logs in with.
pub const INITIATOR: &str = "iqn.2024-01.org.stics.test:initiator";
