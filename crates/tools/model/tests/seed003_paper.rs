//! Checks the numbers and statements printed in seed 003 (Gauger et al., Broadnets 2005) against the models,
//! with the paper's own parameters: C = 0.93, MSS 1460 B, W_max 64 KB, a 1 Gbit/s link, b_init 64 KB,
//! b_max 256 KB, and "kB" read as 1024 bytes.

use stics_model::queue::{capacity, Bottleneck};
use stics_model::tcp::GIGABIT;
use stics_model::{Limit, SizeDist, Tcp, WriteModel};

const KB: f64 = 1024.0;
const LOSSES: [f64; 3] = [1e-2, 1e-3, 1e-6];

fn rel(a: f64, b: f64) -> f64 {
    (a - b).abs() / b.abs()
}

/// Section II.C: "we obtain p_c = 4.29·10⁻⁴".
#[test]
fn critical_loss_is_4_29e_4() {
    let pc = Tcp::paper(10e-3, 1e-3).critical_loss();
    assert_eq!((pc * 1e6).round() / 100.0, 4.29, "p_c = {pc}");
}

/// Section II.C: the link stops limiting at RTT = W_max/B_acc (window) or C·MSS/(B_acc·√p) (congestion).
#[test]
fn knee_rtts_follow_from_the_paper_parameters() {
    let rwnd_knee = Tcp::paper(0.0, 1e-6).knee_rtt_rwnd();
    assert!(rel(rwnd_knee, 0.524288e-3) < 1e-12, "W_max/B_acc = {rwnd_knee}");
    let expect = [(1e-2, 0.10862e-3), (1e-3, 0.34349e-3)];
    for (p, knee) in expect {
        let t = Tcp::paper(0.0, p);
        assert!(rel(t.knee_rtt_cwnd(), knee) < 1e-4, "p = {p}: {}", t.knee_rtt_cwnd());
        assert_eq!(t.knee_rtt(), t.knee_rtt_cwnd(), "above p_c the congestion knee comes first");
    }
    // Below p_c the window knee comes first: at p = 10⁻⁶ the curve bends at 0.524 ms.
    assert_eq!(Tcp::paper(0.0, 1e-6).knee_rtt(), rwnd_knee);
    // On either side of each knee the limit changes from the link to the window or congestion.
    for p in LOSSES {
        let knee = Tcp::paper(0.0, p).knee_rtt();
        assert_eq!(Tcp::paper(knee * 0.99, p).throughput().limit, Limit::Link);
        assert_ne!(Tcp::paper(knee * 1.01, p).throughput().limit, Limit::Link);
    }
}

/// Section III: "In the former two cases [10⁻², 10⁻³], TCP throughput is limited by the congestion avoidance
/// algorithm, whereas, in the latter case [10⁻⁶] the receiver's advertised window is the limiting factor";
/// section IV.A: in the short-distance scenario (0.2 ms) the link dominates (true for 10⁻³ and 10⁻⁶; at 10⁻²
/// the paper's own knee, 0.109 ms, lies below 0.2 ms).
#[test]
fn scenario_limits_match_section_iii() {
    for rtt in [2e-3, 10e-3] {
        assert_eq!(Tcp::paper(rtt, 1e-2).throughput().limit, Limit::CongestionWindow);
        assert_eq!(Tcp::paper(rtt, 1e-3).throughput().limit, Limit::CongestionWindow);
        assert_eq!(Tcp::paper(rtt, 1e-6).throughput().limit, Limit::ReceiveWindow);
    }
    assert_eq!(Tcp::paper(0.2e-3, 1e-3).throughput().limit, Limit::Link);
    assert_eq!(Tcp::paper(0.2e-3, 1e-6).throughput().limit, Limit::Link);
    assert_eq!(Tcp::paper(0.2e-3, 1e-2).throughput().limit, Limit::CongestionWindow);
}

/// Section III: "A request of size S = 6 kB requires only a single round while S = 264 kB yields two rounds."
#[test]
fn six_kb_takes_one_round_264_kb_two() {
    let m = WriteModel::paper(2e-3, 1e-6, 0.0);
    assert_eq!(m.write(6.0 * KB).rounds, 1.0);
    assert_eq!(m.write(264.0 * KB).rounds, 2.0);
}

/// Eqs. (3) and (4) bound the throughput of eq. (1) for large and small requests.
#[test]
fn eq3_and_eq4_bound_eq1() {
    for rtt in [0.2e-3, 2e-3, 10e-3] {
        for p in LOSSES {
            for proc in [0.0, 1e-3, 5e-3] {
                let m = WriteModel::paper(rtt, p, proc);
                for s in [1.0, 6.0 * KB, 64.0 * KB] {
                    assert!(m.write(s).throughput <= m.small_request_bound() * (1.0 + 1e-12));
                }
                for s in [264.0 * KB, 1024.0 * KB, 100e6] {
                    assert!(m.write(s).throughput < m.large_request_bound());
                }
            }
        }
    }
}

/// Section IV.A: "reducing the loss rate by one order of magnitude from 10⁻² to 10⁻³ ... increases the maximum
/// reachable distance by a factor of three for a throughput of around 75 Mbps" (Fig. 3, infinite requests).
#[test]
fn tenfold_less_loss_triples_the_reach_at_75_mbit() {
    let target = 75e6 / 8.0;
    let reach = |p: f64| {
        let (mut lo, mut hi) = (1e-6_f64, 1.0_f64);
        for _ in 0..200 {
            let mid = (lo * hi).sqrt();
            if WriteModel::paper(mid, p, 0.0).write(f64::INFINITY).throughput > target {
                lo = mid;
            } else {
                hi = mid;
            }
        }
        lo
    };
    let factor = reach(1e-3) / reach(1e-2);
    assert!((2.7..=3.2).contains(&factor), "factor {factor}");
}

/// Section IV.A (Fig. 5, metro scenario): from T_proc = 10 ms to 2 ms, "for large requests, at most a factor of
/// two can be realized" and "in case of a high loss rate, only marginal performance enhancements"; small
/// requests gain more than large ones.
#[test]
fn faster_processing_helps_small_requests_more() {
    let gain = |s: f64, p: f64| {
        WriteModel::paper(2e-3, p, 2e-3).write(s).throughput / WriteModel::paper(2e-3, p, 10e-3).write(s).throughput
    };
    for p in LOSSES {
        let large = gain(264.0 * KB, p);
        let small = gain(6.0 * KB, p);
        assert!(large <= 2.0 && large > 1.0, "p = {p}: large gain {large}");
        assert!(small > large, "p = {p}: small {small} vs large {large}");
        assert!((2.6..3.0).contains(&small), "p = {p}: small gain {small}");
    }
    assert!(gain(264.0 * KB, 1e-2) < 1.4, "high loss: marginal");
}

/// Section IV.A (Fig. 4): below the knee the transmission time does not depend on RTT.
#[test]
fn below_the_knee_transmission_time_ignores_rtt() {
    let a = WriteModel::paper(0.05e-3, 1e-6, 0.0).write(264.0 * KB).trans_time;
    let b = WriteModel::paper(0.5e-3, 1e-6, 0.0).write(264.0 * KB).trans_time;
    assert_eq!(a, b);
    assert_eq!(a, 264.0 * KB / GIGABIT);
}

/// Section IV.B (Fig. 9, RTT 2 ms, p = 10⁻⁶, T_proc = 0): "the asymptotes of the maximal throughput ... for
/// the interleaved (0.26 Erl) and the non-interleaved case (0.022 Erl)".
#[test]
fn offered_load_asymptotes_are_0_26_and_0_022_erlang() {
    let c = capacity(&WriteModel::paper(2e-3, 1e-6, 0.0), &SizeDist::seed003());
    assert_eq!((c.interleaved_erlang * 100.0).round() / 100.0, 0.26, "{c:?}");
    assert_eq!((c.non_interleaved_erlang * 1000.0).round() / 1000.0, 0.022, "{c:?}");
    assert_eq!(c.interleaved_bottleneck, Bottleneck::Transmission);
}

/// Section III: the empirical traffic model's mean request size is 6 kB.
#[test]
fn empirical_sizes_have_mean_6_kb() {
    assert!(rel(SizeDist::seed003().mean(), 6.0 * KB) < 1e-12);
}
