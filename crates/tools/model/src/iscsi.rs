//! The single-request iSCSI write model of seed 003, eqs. (1)–(6): bursts, rounds and write time.

use serde::Serialize;

use crate::{check_min, check_pos, tcp::Tcp, Result, SizeDist};

/// iSCSI's default FirstBurstLength (unsolicited data with the command), bytes.
pub const FIRST_BURST: f64 = 65536.0;
/// iSCSI's default MaxBurstLength (data per R2T), bytes.
pub const MAX_BURST: f64 = 262144.0;

/// The iSCSI session parameters that shape a write.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Iscsi {
    /// `b_init`, the unsolicited first burst, bytes.
    pub first_burst: f64,
    /// `b_max`, the largest solicited burst, bytes.
    pub max_burst: f64,
    /// `T_proc`, initiator plus target processing per burst, seconds.
    pub proc: f64,
}

impl Default for Iscsi {
    fn default() -> Self {
        Iscsi { first_burst: FIRST_BURST, max_burst: MAX_BURST, proc: 0.0 }
    }
}

impl Iscsi {
    /// Checks that every parameter is in the model's domain.
    pub fn validate(&self) -> Result<()> {
        check_min("first burst", self.first_burst, 0.0, "a finite, non-negative size")?;
        check_pos("max burst", self.max_burst)?;
        check_min("proc", self.proc, 0.0, "a finite, non-negative duration")?;
        Ok(())
    }

    /// Eq. (2): `N = 1 + ⌈max(0, (S − b_init)/b_max)⌉`; infinite for an infinite request.
    pub fn rounds(&self, size: f64) -> f64 {
        1.0 + ((size - self.first_burst).max(0.0) / self.max_burst).ceil()
    }

    /// The size of burst `k` (0-based) of a request of `size` bytes: `min(S, b_init)` first, then up to
    /// `b_max` each, so that there are exactly [`Iscsi::rounds`] bursts.
    pub fn burst(&self, size: f64, k: u64) -> f64 {
        if k == 0 {
            size.min(self.first_burst)
        } else {
            let sent = self.first_burst + (k - 1) as f64 * self.max_burst;
            (size - sent).clamp(0.0, self.max_burst)
        }
    }
}

/// The TCP path and the iSCSI session together: everything eq. (1) needs.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct WriteModel {
    /// The connection.
    pub tcp: Tcp,
    /// The session.
    pub iscsi: Iscsi,
}

/// One write of a given size, by eqs. (1)–(2).
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Write {
    /// `S`, bytes.
    pub size: f64,
    /// `N`, rounds (bursts).
    pub rounds: f64,
    /// `T_trans = S/B`, seconds.
    pub trans_time: f64,
    /// `T_write`, seconds.
    pub write_time: f64,
    /// `S/T_write`, bytes per second; for `S = ∞` the limit, eq. (3).
    pub throughput: f64,
}

/// The mean write over a size distribution, by eqs. (5)–(6).
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct MeanWrite {
    /// `S̄`, bytes.
    pub mean_size: f64,
    /// `N̄`, eq. (6).
    pub mean_rounds: f64,
    /// `T̄_write`, eq. (5), seconds.
    pub mean_write_time: f64,
    /// `E[T_write²]`, seconds squared (for the M/G/1 queue).
    pub write_time_second_moment: f64,
    /// `S̄/T̄_write`, bytes per second.
    pub throughput: f64,
}

impl WriteModel {
    /// The paper's connection and session defaults at the given RTT, loss and processing time.
    pub fn paper(rtt: f64, loss: f64, proc: f64) -> WriteModel {
        WriteModel { tcp: Tcp::paper(rtt, loss), iscsi: Iscsi { proc, ..Iscsi::default() } }
    }

    /// Checks both halves.
    pub fn validate(&self) -> Result<()> {
        self.tcp.validate()?;
        self.iscsi.validate()
    }

    /// `B`, the TCP throughput, bytes per second.
    pub fn bandwidth(&self) -> f64 {
        self.tcp.throughput().bytes_per_s
    }

    /// `T_proc + RTT`, the fixed cost of one round.
    pub fn round_time(&self) -> f64 {
        self.iscsi.proc + self.tcp.rtt
    }

    /// Eq. (1) for a request of `size` bytes (`f64::INFINITY` for the limit of large requests).
    pub fn write(&self, size: f64) -> Write {
        let b = self.bandwidth();
        let rounds = self.iscsi.rounds(size);
        let trans_time = size / b;
        let write_time = trans_time + rounds * self.round_time();
        let throughput = if size.is_infinite() { self.large_request_bound() } else { size / write_time };
        Write { size, rounds, trans_time, write_time, throughput }
    }

    /// Eq. (3): `(1/B + (T_proc + RTT)/b_max)⁻¹`, the throughput of very large requests.
    pub fn large_request_bound(&self) -> f64 {
        1.0 / (1.0 / self.bandwidth() + self.round_time() / self.iscsi.max_burst)
    }

    /// Eq. (4): `(1/B + (T_proc + RTT)/b_init)⁻¹`, the best throughput of requests that fit the first burst.
    pub fn small_request_bound(&self) -> f64 {
        1.0 / (1.0 / self.bandwidth() + self.round_time() / self.iscsi.first_burst)
    }

    /// Eqs. (5)–(6) over a size distribution.
    pub fn mean_write(&self, sizes: &SizeDist) -> MeanWrite {
        let mean_size = sizes.mean();
        let mean_rounds = sizes.mean_rounds(&self.iscsi);
        let mean_write_time = mean_size / self.bandwidth() + mean_rounds * self.round_time();
        let write_time_second_moment = sizes.expect(|s| self.write(s).write_time.powi(2));
        MeanWrite {
            mean_size,
            mean_rounds,
            mean_write_time,
            write_time_second_moment,
            throughput: mean_size / mean_write_time,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rounds_follow_eq2_at_the_burst_boundaries() {
        let i = Iscsi::default();
        assert_eq!(i.rounds(0.0), 1.0);
        assert_eq!(i.rounds(65536.0), 1.0);
        assert_eq!(i.rounds(65537.0), 2.0);
        assert_eq!(i.rounds(65536.0 + 262144.0), 2.0);
        assert_eq!(i.rounds(65537.0 + 262144.0), 3.0);
        assert_eq!(i.rounds(f64::INFINITY), f64::INFINITY);
    }

    #[test]
    fn bursts_add_up_to_the_request_in_n_rounds() {
        let i = Iscsi::default();
        for size in [0.0, 1.0, 4096.0, 65536.0, 70000.0, 270336.0, 1e6, 3e6 + 7.0] {
            let n = i.rounds(size) as u64;
            let total: f64 = (0..n).map(|k| i.burst(size, k)).sum();
            assert_eq!(total, size, "size {size}");
            assert!((1..n).all(|k| i.burst(size, k) > 0.0), "no empty solicited burst for {size}");
            assert_eq!(i.burst(size, n), 0.0);
        }
    }

    #[test]
    fn write_time_is_transmission_plus_n_rounds() {
        let m = WriteModel::paper(2e-3, 1e-6, 1e-3);
        let w = m.write(270336.0);
        assert_eq!(w.rounds, 2.0);
        let b = 65536.0 / 2e-3;
        assert!((w.write_time - (270336.0 / b + 2.0 * 3e-3)).abs() < 1e-12);
    }

    #[test]
    fn infinite_requests_reach_the_eq3_limit() {
        let m = WriteModel::paper(10e-3, 1e-3, 1e-3);
        let big = m.write(1e12).throughput;
        let inf = m.write(f64::INFINITY).throughput;
        assert!((big - inf).abs() / inf < 1e-3);
        assert!(big < inf);
    }

    #[test]
    fn eq4_is_met_with_equality_at_the_first_burst() {
        let m = WriteModel::paper(2e-3, 1e-3, 0.5e-3);
        let w = m.write(FIRST_BURST);
        assert!((w.throughput - m.small_request_bound()).abs() / w.throughput < 1e-12);
        assert!(m.write(4096.0).throughput < m.small_request_bound());
    }
}
