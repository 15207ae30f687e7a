//! Analytical and queueing models of iSCSI writes over TCP, from seed 003 (Gauger et al., *Modeling and
//! Performance Evaluation of iSCSI SANs over TCP/IP-based MAN and WAN networks*, Broadnets 2005) and
//! seed 000 (Ng et al., *Obtaining High Performance for Storage Outsourcing*, FAST 2002).
//!
//! The crate answers sizing questions before a line is bought (what throughput does a 10 ms, 10⁻³-loss
//! path give a 6 KiB write, how much request traffic can one session carry) and puts a model next to every
//! measurement of stics. Everything is pure: numbers in, numbers out, no I/O; tables and plots of the
//! results are drawn by `stics-report`. The simulation takes a seed and a progress callback, so it is
//! repeatable and prints nothing itself.
//!
//! # Units
//!
//! Every quantity is an `f64` in SI base units: seconds, bytes, bytes per second, probabilities in
//! `[0, 1]`, offered traffic in Erlang of the link rate. [`units`] reads and the `stics` CLI prints human
//! forms (`10ms`, `64KiB`, `1gbit`).
//!
//! # How the papers' equations are read
//!
//! The seed texts are OCR'd; these are the readings implemented here, with the paper's symbols.
//!
//! **Seed 003, eq. (1)** ([`WriteModel::write`]): `T_write = T_trans + N·(T_proc + RTT)`, where
//! `T_trans = S/B` is the time to push the request of `S` bytes through a TCP connection of throughput `B`,
//! `T_proc` is the aggregated initiator + target processing delay, paid once per burst, and `RTT` is the
//! round-trip time, also paid once per burst (one round per burst: the unsolicited burst waits for the
//! first R2T or the response, each solicited burst for the next R2T or the response).
//!
//! **Eq. (2)** ([`Iscsi::rounds`]): `N = 1 + ⌈max(0, (S − b_init)/b_max)⌉`, with `b_init` the
//! FirstBurstLength of unsolicited data (default 64 kB) and `b_max` the MaxBurstLength (default 256 kB).
//! The paper's "kB" is 1024 bytes: its critical loss 4.29·10⁻⁴ only comes out with `W_max = 65536 B`, and
//! the iSCSI defaults are 65536 and 262144 bytes. So 6 kB = 6144 B and 264 kB = 270336 B here; both give the
//! paper's N = 1 and N = 2. On the command line these are `6KiB` and `264KiB`: there `6kB` is 6000 B.
//!
//! **Eq. (3)** ([`WriteModel::large_request_bound`]): `S/T_write < (1/B + (T_proc + RTT)/b_max)⁻¹` for
//! `S ≫ b_max`; it is also the limit of eq. (1) for `S → ∞`, which is how the "infinitely large requests"
//! of Fig. 3 are drawn.
//!
//! **Eq. (4)** ([`WriteModel::small_request_bound`]): `S/T_write < (1/B + (T_proc + RTT)/b_init)⁻¹` for
//! `S ≤ b_init` (equality at `S = b_init`).
//!
//! **Eq. (5)** ([`WriteModel::mean_write`]): `T̄_write = S̄/B + N̄·(T_proc + RTT)`, the mean of eq. (1) over
//! a size distribution; the OCR shows `S/B`, which by linearity is `S̄/B`.
//!
//! **Eq. (6)** ([`SizeDist::mean_rounds`]): `N̄ = 1 + Σ_{i≥1} i·P(x_{i−1} < S ≤ x_i)` with
//! `x_i = b_init + i·b_max`; so `x_0 = b_init` and a size in `(x_{i−1}, x_i]` needs `1 + i` rounds, the
//! same as eq. (2).
//!
//! **TCP model, section II.C** ([`Tcp`]): `B = min(B_CWnd, B_RWnd, B_acc)` with
//! `B_CWnd = C·b_MSS/(RTT·√p)` (Mathis et al., `C = 0.93`, `b_MSS = 1460 B`), `B_RWnd = W_max/RTT`
//! (`W_max = 64 kB = 65536 B`) and `B_acc` the bottleneck link, 1 Gbit/s = 125·10⁶ B/s. The critical loss
//! `p_c = (C·b_MSS/W_max)² = 4.29·10⁻⁴` separates window-limited (`p < p_c`) from congestion-limited paths.
//! The knees where the link stops being the limit are `RTT = W_max/B_acc` (0.524 ms) and
//! `RTT = C·b_MSS/(B_acc·√p)` (0.109 ms at p = 10⁻², 0.343 ms at p = 10⁻³); the lower of the two is the
//! knee of the curve. The paper says the 0.2 ms "short distance" scenario is always link-limited; by its own
//! formulas that holds for p = 10⁻³ and 10⁻⁶ but not for p = 10⁻² (knee 0.109 ms).
//!
//! **Dynamic traffic, section II.B** ([`sim`], [`queue`]). Non-interleaved: a FIFO single server whose
//! service time is the whole eq. (1) write time of the request (Fig. 2a). Interleaved: each request loops
//! once per burst through a FIFO single-server transmission queue (service = burst/B), a FIFO single-server
//! processing queue (service = `T_proc`) and an infinite-server delay of one RTT (Fig. 2b); it leaves after
//! its N-th loop. Bursts are the ones of eq. (2): `min(S, b_init)` first, then up to `b_max` each. Alone in
//! the system, a request sees exactly eq. (1) in both models. Request inter-arrival times are lognormal with
//! `(μ, σ²) = (−4.5, 6.25)` for the underlying normal, in seconds (mean `e^{μ+σ²/2}` = 0.253 s); the
//! "modified" model of Fig. 6 keeps the sizes and makes arrivals Poisson at the same mean rate. Sizes come
//! from an empirical distribution with mean 6 kB ([`SizeDist::seed003`], shipped in
//! `data/seed003-request-sizes.txt`; the paper does not print its table, so ours follows the shape of
//! Hsu and Smith's Fig. 1 and is weighted to a mean of exactly 6144 B).
//!
//! **Offered traffic and capacity, section IV.B** ([`queue::capacity`]): offered traffic is
//! `A = λ·S̄/B_acc` Erlang of the *link* rate. The non-interleaved server saturates at `λ = 1/T̄_write`
//! (eq. 5), the interleaved network at `λ = min(B/S̄, 1/(N̄·T_proc))` (transmission or processing queue).
//! At RTT 2 ms, p = 10⁻⁶, `T_proc = 0` this gives the paper's asymptotes 0.26 Erl (interleaved, `B/B_acc`)
//! and 0.022 Erl (non-interleaved).
//!
//! **Seed 000, eq. (1)** ([`latency`]): `T_IOLatency = T_disk + 2·T_netDelay + T_iSCSI`, `T_netDelay` one
//! way, `T_iSCSI` = 0.408 ms for an 8 KB write (its Fig. 2). The random-write rule of its Fig. 3: a disk with
//! a full write cache acknowledges a write only when the previous one has reached the media, so a blocking
//! writer sees `T_iSCSI + max(T_disk, 2·T_netDelay)`: the round trip is masked while it is shorter than the
//! disk's response time.
//!
//! # What the text claims and the formulas do not give
//!
//! Section IV.A says reducing `T_proc` from 10 ms to 2 ms speeds small (6 kB) metro requests up "by a factor
//! of 4"; eq. (1) at RTT 2 ms gives 2.6–2.9 (a factor of about 4 needs RTT ≈ 0.2 ms). The "at most a factor
//! of two" for 264 kB requests and the "factor of three" in reachable distance at 75 Mbit/s when the loss
//! falls from 10⁻² to 10⁻³ both follow from the formulas and are checked in `tests/seed003_paper.rs`.

#![forbid(unsafe_code)]

pub mod dist;
pub mod iscsi;
pub mod latency;
pub mod queue;
pub mod sim;
pub mod tcp;
pub mod units;

pub use dist::SizeDist;
pub use iscsi::{Iscsi, MeanWrite, Write, WriteModel};
pub use tcp::{Limit, Tcp, Throughput};

/// Errors of the model layer: a parameter outside the model's domain, or input that cannot be read.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A parameter is outside the range where the model is defined.
    #[error("{name} must be {expected}, got {value}")]
    Param {
        /// The parameter, as the user knows it (e.g. `rtt`).
        name: &'static str,
        /// The allowed range in words.
        expected: &'static str,
        /// The value given.
        value: f64,
    },
    /// A quantity with units could not be read.
    #[error("cannot read {what} {input:?}: {reason}")]
    Parse {
        /// What was expected (a duration, a size...).
        what: &'static str,
        /// The text given.
        input: String,
        /// Why it was refused, with an example of a good value.
        reason: String,
    },
    /// A line of a size-distribution file is malformed.
    #[error("size distribution, line {line}: {reason}")]
    Dist {
        /// One-based line number (0 for the file as a whole).
        line: usize,
        /// What is wrong.
        reason: String,
    },
    /// A size, duration, rate or probability could not be read.
    #[error(transparent)]
    Units(#[from] stics_units::Error),
}

/// Result with the model layer's [`Error`].
pub type Result<T> = std::result::Result<T, Error>;

/// Checks that `value` is finite and at least `min`; used by every parameter check.
pub(crate) fn check_min(name: &'static str, value: f64, min: f64, expected: &'static str) -> Result<f64> {
    if value.is_finite() && value >= min {
        Ok(value)
    } else {
        Err(Error::Param { name, expected, value })
    }
}

/// Checks that `value` is finite and strictly positive.
pub(crate) fn check_pos(name: &'static str, value: f64) -> Result<f64> {
    if value.is_finite() && value > 0.0 {
        Ok(value)
    } else {
        Err(Error::Param { name, expected: "a finite value above zero", value })
    }
}
