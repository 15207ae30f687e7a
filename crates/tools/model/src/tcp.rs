//! The TCP throughput model of seed 003, section II.C: `B = min(C·MSS/(RTT·√p), W_max/RTT, B_acc)`.

use serde::Serialize;

use crate::{check_min, check_pos, Error, Result};

/// Mathis et al.'s constant of proportionality for random loss and delayed ACKs.
pub const MATHIS_C: f64 = 0.93;
/// Maximum segment size on Ethernet, bytes.
pub const ETHERNET_MSS: f64 = 1460.0;
/// The receiver's maximum advertised window of seed 003 (64 kB), bytes.
pub const RWND_64K: f64 = 65536.0;
/// Gigabit Ethernet, bytes per second.
pub const GIGABIT: f64 = 125e6;

/// A long-lived TCP connection over a path with fixed RTT and random loss.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Tcp {
    /// Round-trip time, seconds.
    pub rtt: f64,
    /// Packet loss probability.
    pub loss: f64,
    /// Maximum segment size `b_MSS`, bytes.
    pub mss: f64,
    /// Maximum advertised receive window `W_max`, bytes.
    pub rwnd: f64,
    /// Bottleneck (access) link rate `B_acc`, bytes per second.
    pub link: f64,
    /// Mathis constant `C`.
    pub c: f64,
}

/// Which term of the `min` binds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Limit {
    /// The bottleneck link, `B_acc`.
    Link,
    /// The receive window, `W_max/RTT`.
    ReceiveWindow,
    /// Congestion avoidance under loss, `C·MSS/(RTT·√p)`.
    CongestionWindow,
}

impl Limit {
    /// The name used in tables and JSON.
    pub fn as_str(self) -> &'static str {
        match self {
            Limit::Link => "link",
            Limit::ReceiveWindow => "receive_window",
            Limit::CongestionWindow => "congestion_window",
        }
    }
}

/// The throughput of a connection and the limit that sets it.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Throughput {
    /// Bytes per second.
    pub bytes_per_s: f64,
    /// The binding limit.
    pub limit: Limit,
}

impl Tcp {
    /// The paper's connection (C = 0.93, MSS 1460 B, W_max 64 KiB, 1 Gbit/s) at the given RTT and loss.
    pub fn paper(rtt: f64, loss: f64) -> Tcp {
        Tcp { rtt, loss, mss: ETHERNET_MSS, rwnd: RWND_64K, link: GIGABIT, c: MATHIS_C }
    }

    /// Checks that every parameter is in the model's domain.
    pub fn validate(&self) -> Result<()> {
        check_min("rtt", self.rtt, 0.0, "a finite, non-negative duration")?;
        if !(0.0..=1.0).contains(&self.loss) {
            return Err(Error::Param { name: "loss", expected: "a probability in [0, 1]", value: self.loss });
        }
        check_pos("mss", self.mss)?;
        check_pos("rwnd", self.rwnd)?;
        check_pos("link", self.link)?;
        check_pos("mathis constant", self.c)?;
        Ok(())
    }

    /// `B_CWnd = C·MSS/(RTT·√p)`; unbounded without loss or delay.
    pub fn cwnd_limit(&self) -> f64 {
        if self.loss == 0.0 || self.rtt == 0.0 {
            f64::INFINITY
        } else {
            self.c * self.mss / (self.rtt * self.loss.sqrt())
        }
    }

    /// `B_RWnd = W_max/RTT`; unbounded without delay.
    pub fn rwnd_limit(&self) -> f64 {
        if self.rtt == 0.0 {
            f64::INFINITY
        } else {
            self.rwnd / self.rtt
        }
    }

    /// `B = min(B_CWnd, B_RWnd, B_acc)` and which one binds (the link wins ties, then the window).
    pub fn throughput(&self) -> Throughput {
        let mut t = Throughput { bytes_per_s: self.link, limit: Limit::Link };
        for (b, limit) in [(self.rwnd_limit(), Limit::ReceiveWindow), (self.cwnd_limit(), Limit::CongestionWindow)] {
            if b < t.bytes_per_s {
                t = Throughput { bytes_per_s: b, limit };
            }
        }
        t
    }

    /// The critical loss `p_c = (C·MSS/W_max)²`: above it congestion avoidance limits, below it the window.
    pub fn critical_loss(&self) -> f64 {
        (self.c * self.mss / self.rwnd).powi(2)
    }

    /// `RTT = W_max/B_acc`: where the window would take over from the link.
    pub fn knee_rtt_rwnd(&self) -> f64 {
        self.rwnd / self.link
    }

    /// `RTT = C·MSS/(B_acc·√p)`: where congestion avoidance would take over from the link.
    pub fn knee_rtt_cwnd(&self) -> f64 {
        if self.loss == 0.0 {
            f64::INFINITY
        } else {
            self.c * self.mss / (self.link * self.loss.sqrt())
        }
    }

    /// The knee of the throughput curve: below this RTT the link is the limit.
    pub fn knee_rtt(&self) -> f64 {
        self.knee_rtt_rwnd().min(self.knee_rtt_cwnd())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_paths_are_link_limited() {
        let t = Tcp::paper(0.1e-3, 1e-6).throughput();
        assert_eq!(t.limit, Limit::Link);
        assert_eq!(t.bytes_per_s, GIGABIT);
    }

    #[test]
    fn zero_rtt_and_zero_loss_do_not_divide_by_zero() {
        assert_eq!(Tcp::paper(0.0, 0.5).throughput().bytes_per_s, GIGABIT);
        let t = Tcp::paper(10e-3, 0.0).throughput();
        assert_eq!(t.limit, Limit::ReceiveWindow);
        assert_eq!(Tcp::paper(1e-3, 0.0).knee_rtt_cwnd(), f64::INFINITY);
    }

    #[test]
    fn below_critical_loss_the_window_binds_above_it_congestion() {
        let pc = Tcp::paper(0.0, 0.0).critical_loss();
        assert_eq!(Tcp::paper(20e-3, pc * 0.9).throughput().limit, Limit::ReceiveWindow);
        assert_eq!(Tcp::paper(20e-3, pc * 1.1).throughput().limit, Limit::CongestionWindow);
    }

    #[test]
    fn throughput_is_continuous_at_the_knee() {
        for p in [1e-2, 1e-3, 1e-6] {
            let knee = Tcp::paper(0.0, p).knee_rtt();
            let below = Tcp::paper(knee * (1.0 - 1e-9), p).throughput().bytes_per_s;
            let above = Tcp::paper(knee * (1.0 + 1e-9), p).throughput().bytes_per_s;
            assert!((below - GIGABIT).abs() / GIGABIT < 1e-6);
            assert!((above - GIGABIT).abs() / GIGABIT < 1e-6);
        }
    }

    #[test]
    fn validate_refuses_out_of_domain_values() {
        assert!(Tcp::paper(-1.0, 0.0).validate().is_err());
        assert!(Tcp::paper(1e-3, 1.5).validate().is_err());
        assert!(Tcp { link: 0.0, ..Tcp::paper(1e-3, 0.0) }.validate().is_err());
        assert!(Tcp::paper(1e-3, 1e-3).validate().is_ok());
    }
}
