//! The discrete-event simulation against the closed forms where both apply: eq. (5) at light load, the
//! Pollaczek–Khinchine mean for Poisson arrivals without interleaving, and the capacities of section IV.B.
//!
//! Tolerances: every check allows 1 %, and also asserts that three batch-means standard errors fit inside
//! that 1 %, so the tolerance is wider than the run's own statistical noise (about 3σ) and a pass is not luck.

use stics_model::queue::{capacity, mg1_mean_sojourn, rate_for_erlang};
use stics_model::sim::{simulate, Arrivals, Operation, SimConfig, SimResult};
use stics_model::{SizeDist, WriteModel};

const OPS: [Operation; 2] = [Operation::NonInterleaved, Operation::Interleaved];

fn run(model: WriteModel, arrivals: Arrivals, operation: Operation, requests: u64, sizes: &SizeDist) -> SimResult {
    let cfg = SimConfig { model, arrivals, operation, requests, warmup: requests / 50, seed: 2005, batches: 25 };
    simulate(&cfg, sizes, &mut |_| {}).unwrap()
}

fn assert_within_1pct(what: &str, sim: &SimResult, closed: f64) {
    let err = (sim.mean - closed).abs() / closed;
    assert!(3.0 * sim.std_err / closed < 0.01, "{what}: run too short, 3 SE = {:.3} %", 300.0 * sim.std_err / closed);
    assert!(err < 0.01, "{what}: simulated {} s vs closed form {closed} s ({:.3} %)", sim.mean, err * 100.0);
}

#[test]
fn light_load_mean_write_time_matches_eq5() {
    let sizes = SizeDist::seed003();
    for (rtt, loss, proc) in [(0.2e-3, 1e-2, 0.0), (2e-3, 1e-6, 1e-3), (10e-3, 1e-3, 5e-3)] {
        let model = WriteModel::paper(rtt, loss, proc);
        let eq5 = model.mean_write(&sizes).mean_write_time;
        // One request per 10⁴ s on average: requests essentially never meet.
        for arrivals in [Arrivals::Poisson { rate: 1e-4 }, Arrivals::SEED003.with_rate(1e-4)] {
            for op in OPS {
                let r = run(model, arrivals, op, 100_000, &sizes);
                assert_within_1pct(&format!("{op:?} {arrivals:?} rtt {rtt}"), &r, eq5);
            }
        }
    }
}

#[test]
fn single_request_sizes_match_eq1() {
    for size in [6.0 * 1024.0, 264.0 * 1024.0, 1024.0 * 1024.0] {
        let sizes = SizeDist::fixed(size).unwrap();
        let model = WriteModel::paper(10e-3, 1e-3, 1e-3);
        for op in OPS {
            let r = run(model, Arrivals::Poisson { rate: 1e-3 }, op, 1000, &sizes);
            let eq1 = model.write(size).write_time;
            // Only rounding of absolute times near 10⁶ s separates them.
            assert!((r.mean - eq1).abs() / eq1 < 1e-7, "{op:?} size {size}: {} vs {eq1}", r.mean);
        }
    }
}

#[test]
fn poisson_non_interleaved_matches_pollaczek_khinchine() {
    let sizes = SizeDist::seed003();
    for (rtt, loss, proc, rho) in [(2e-3, 1e-3, 1e-3, 0.5), (10e-3, 1e-6, 0.0, 0.3)] {
        let model = WriteModel::paper(rtt, loss, proc);
        let m = model.mean_write(&sizes);
        let rate = rho / m.mean_write_time;
        let pk = mg1_mean_sojourn(rate, m.mean_write_time, m.write_time_second_moment).unwrap();
        let r = run(model, Arrivals::Poisson { rate }, Operation::NonInterleaved, 1_000_000, &sizes);
        assert_within_1pct(&format!("M/G/1 rho {rho}"), &r, pk);
        assert!((r.utilization - rho).abs() < 0.01, "utilization {} vs rho {rho}", r.utilization);
    }
}

#[test]
fn interleaving_carries_load_that_saturates_the_non_interleaved_queue() {
    // Fig. 9's metro scenario: between the two capacities only interleaving keeps up.
    let sizes = SizeDist::seed003();
    let model = WriteModel::paper(2e-3, 1e-6, 0.0);
    let cap = capacity(&model, &sizes);
    let load = 0.5 * cap.interleaved_erlang;
    assert!(load > 2.0 * cap.non_interleaved_erlang);
    let arrivals = Arrivals::Poisson { rate: rate_for_erlang(load, sizes.mean(), model.tcp.link) };
    let inter = run(model, arrivals, Operation::Interleaved, 200_000, &sizes);
    let non = run(model, arrivals, Operation::NonInterleaved, 200_000, &sizes);
    let eq5 = model.mean_write(&sizes).mean_write_time;
    assert!((inter.utilization - 0.5).abs() < 0.01, "transmission busy {}", inter.utilization);
    assert!(inter.mean < 1.5 * eq5, "interleaved stays near eq. 5: {} vs {eq5}", inter.mean);
    assert!(non.utilization > 0.999, "non-interleaved server saturated: {}", non.utilization);
    assert!(non.mean > 100.0 * eq5, "non-interleaved queue grows without bound: {}", non.mean);
}

#[test]
fn interleaving_shortens_bursty_writes() {
    // Fig. 7: with the empirical (lognormal) traffic, interleaving cuts the queueing of the same requests.
    let sizes = SizeDist::seed003();
    let model = WriteModel::paper(10e-3, 1e-3, 0.0);
    let non = run(model, Arrivals::SEED003, Operation::NonInterleaved, 100_000, &sizes);
    let inter = run(model, Arrivals::SEED003, Operation::Interleaved, 100_000, &sizes);
    let eq5 = model.mean_write(&sizes).mean_write_time;
    assert!(inter.mean < non.mean, "{} vs {}", inter.mean, non.mean);
    assert!(inter.mean >= eq5 * 0.99 && non.mean > eq5);
}
