//! A packet-level WAN emulator: two network namespaces (`host`, `storage`) joined through a router
//! namespace whose forwarding path adds delay, jitter, loss, a rate limit and background load.
//!
//! Real kernel TCP runs on both ends and reacts with its own congestion control. Packets entering
//! the router are handed to user space through NFQUEUE (`--queue-bypass`, so a dead emulator never
//! black-holes traffic); a thread per direction drops them by a seeded loss model or holds them in
//! a release queue and hands them back in batches when their delay is over. A packet's delay
//! counts from the kernel's arrival stamp, and the thread wakes a learnt wake-up latency before
//! each departure and polls for the rest, so packets leave within about a microsecond of their
//! time (`ping -U` at 5 ms each way: about 10.1 ms; the rest is the stack's own path). The rate
//! limit and the bottleneck queue are a `tbf` qdisc on the router's egress; background frames are
//! written into that same qdisc from a packet socket, so they compete with the measured traffic.
//!
//! The crate is split into pure parts (no I/O, unit-tested with a fake clock and seeded RNG):
//! [`params`], [`rng`], [`loss`], [`sched`], [`background`], [`nfq`] (netlink codec) and [`topo`]
//! (the command plan), and I/O parts: [`sys`] (raw syscalls), [`engine`] (the daemon's threads),
//! [`control`] (the unix-socket protocol) and [`instance`] (runtime directory, start and teardown).

pub mod background;
pub mod control;
pub mod engine;
pub mod error;
pub mod instance;
pub mod loss;
pub mod nfq;
pub mod params;
pub mod rng;
pub mod sched;
pub mod sys;
pub mod topo;

pub use error::WanError;
pub use params::{Params, Update};

/// Result type of this crate.
pub type Result<T> = std::result::Result<T, WanError>;
