//! Closed forms for the session queues of seed 003, section II.B: capacity in Erlang and the M/G/1 mean.

use serde::Serialize;

use crate::{SizeDist, WriteModel};

/// Which station of the interleaved network saturates first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Bottleneck {
    /// The TCP connection (transmission queue): `λ·S̄/B = 1`.
    Transmission,
    /// The processing queue: `λ·N̄·T_proc = 1`.
    Processing,
}

impl Bottleneck {
    /// The name used in tables and JSON.
    pub fn as_str(self) -> &'static str {
        match self {
            Bottleneck::Transmission => "transmission",
            Bottleneck::Processing => "processing",
        }
    }
}

/// The largest request rate one session carries, and the same as offered traffic.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Capacity {
    /// Requests per second with interleaving.
    pub interleaved_rate: f64,
    /// Offered traffic with interleaving, Erlang of the link rate.
    pub interleaved_erlang: f64,
    /// The station that saturates with interleaving.
    pub interleaved_bottleneck: Bottleneck,
    /// Requests per second without interleaving: `1/T̄_write`.
    pub non_interleaved_rate: f64,
    /// Offered traffic without interleaving, Erlang of the link rate.
    pub non_interleaved_erlang: f64,
}

/// Offered traffic `A = λ·S̄/B_acc`, in Erlang of the link rate (seed 003 measures load against the link,
/// not against what the session can carry).
pub fn offered_erlang(rate: f64, mean_size: f64, link: f64) -> f64 {
    rate * mean_size / link
}

/// The request rate that offers `erlang` of the link.
pub fn rate_for_erlang(erlang: f64, mean_size: f64, link: f64) -> f64 {
    erlang * link / mean_size
}

/// Capacity of both operations: non-interleaved saturates at `1/T̄_write` (eq. 5), interleaved at
/// `min(B/S̄, 1/(N̄·T_proc))`.
pub fn capacity(model: &WriteModel, sizes: &SizeDist) -> Capacity {
    let mean = model.mean_write(sizes);
    let link = model.tcp.link;
    let trans_rate = model.bandwidth() / mean.mean_size;
    let proc_rate = 1.0 / (mean.mean_rounds * model.iscsi.proc);
    let (interleaved_rate, interleaved_bottleneck) = if proc_rate < trans_rate {
        (proc_rate, Bottleneck::Processing)
    } else {
        (trans_rate, Bottleneck::Transmission)
    };
    let non_interleaved_rate = 1.0 / mean.mean_write_time;
    Capacity {
        interleaved_rate,
        interleaved_erlang: offered_erlang(interleaved_rate, mean.mean_size, link),
        interleaved_bottleneck,
        non_interleaved_rate,
        non_interleaved_erlang: offered_erlang(non_interleaved_rate, mean.mean_size, link),
    }
}

/// Pollaczek–Khinchine: the mean time in an M/G/1 system with arrival `rate`, mean service `es` and second
/// moment `es2`: `E[T] = E[X] + λ·E[X²]/(2(1 − ρ))`. `None` when `ρ = λ·E[X] ≥ 1` (no steady state).
pub fn mg1_mean_sojourn(rate: f64, es: f64, es2: f64) -> Option<f64> {
    let rho = rate * es;
    (rho < 1.0).then(|| es + rate * es2 / (2.0 * (1.0 - rho)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn processing_bounds_interleaving_when_it_is_slow() {
        let d = SizeDist::fixed(4096.0).unwrap();
        let c = capacity(&WriteModel::paper(2e-3, 1e-6, 5e-3), &d);
        assert_eq!(c.interleaved_bottleneck, Bottleneck::Processing);
        assert!((c.interleaved_rate - 200.0).abs() < 1e-9);
        let c = capacity(&WriteModel::paper(2e-3, 1e-6, 0.0), &d);
        assert_eq!(c.interleaved_bottleneck, Bottleneck::Transmission);
    }

    #[test]
    fn interleaving_never_carries_less() {
        let d = SizeDist::seed003();
        for rtt in [0.0, 0.2e-3, 2e-3, 10e-3] {
            for proc in [0.0, 1e-3, 5e-3] {
                let c = capacity(&WriteModel::paper(rtt, 1e-3, proc), &d);
                assert!(c.interleaved_rate >= c.non_interleaved_rate);
            }
        }
    }

    #[test]
    fn mg1_reduces_to_md1_and_mm1() {
        // M/M/1: E[X²] = 2/μ², E[T] = 1/(μ − λ).
        let (l, mu) = (3.0, 5.0);
        let t = mg1_mean_sojourn(l, 1.0 / mu, 2.0 / (mu * mu)).unwrap();
        assert!((t - 1.0 / (mu - l)).abs() < 1e-12);
        // M/D/1 at ρ = 0.5: E[T] = X(1 + ρ/(2(1 − ρ))) = 1.5 X.
        assert!((mg1_mean_sojourn(0.5, 1.0, 1.0).unwrap() - 1.5).abs() < 1e-12);
        assert_eq!(mg1_mean_sojourn(1.0, 1.0, 1.0), None);
    }
}
