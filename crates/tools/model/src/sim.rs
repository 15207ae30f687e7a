//! Discrete-event simulation of the two session queues of seed 003 (Fig. 2): non-interleaved (a FIFO
//! server whose service is the whole write) and interleaved (per-burst loops through transmission and
//! processing queues and an RTT delay).
//!
//! Inter-arrival times and sizes come from two separate ChaCha8 streams of one seed, so a run repeats
//! exactly and both operations see the same requests at the same times.

use std::cmp::Ordering;
use std::collections::BinaryHeap;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use rand_distr::{Distribution, Exp, LogNormal};
use serde::Serialize;

use crate::{check_pos, Error, Result, SizeDist, WriteModel};

/// The request arrival process.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Arrivals {
    /// Lognormal inter-arrival times, seconds: `ln X ~ N(μ, σ²)`.
    LogNormal {
        /// `μ` of the underlying normal.
        mu: f64,
        /// `σ²` of the underlying normal.
        sigma2: f64,
    },
    /// Exponential inter-arrival times (a Poisson process).
    Poisson {
        /// Requests per second.
        rate: f64,
    },
}

impl Arrivals {
    /// Seed 003's empirical model: `(μ, σ²) = (−4.5, 6.25)`, a mean inter-arrival time of 0.253 s.
    pub const SEED003: Arrivals = Arrivals::LogNormal { mu: -4.5, sigma2: 6.25 };

    /// Mean requests per second.
    pub fn rate(&self) -> f64 {
        match *self {
            Arrivals::LogNormal { mu, sigma2 } => (-(mu + sigma2 / 2.0)).exp(),
            Arrivals::Poisson { rate } => rate,
        }
    }

    /// The same kind of process at another mean rate; a lognormal keeps its `σ²` (its burstiness) and
    /// moves `μ`.
    pub fn with_rate(self, rate: f64) -> Arrivals {
        match self {
            Arrivals::LogNormal { sigma2, .. } => Arrivals::LogNormal { mu: -rate.ln() - sigma2 / 2.0, sigma2 },
            Arrivals::Poisson { .. } => Arrivals::Poisson { rate },
        }
    }

    /// `lognormal` or `poisson`.
    pub fn name(&self) -> &'static str {
        match self {
            Arrivals::LogNormal { .. } => "lognormal",
            Arrivals::Poisson { .. } => "poisson",
        }
    }
}

/// How requests share the session.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Operation {
    /// One request at a time, FIFO (Fig. 2a).
    NonInterleaved,
    /// Bursts of different requests interleave on the connection (Fig. 2b).
    Interleaved,
}

impl Operation {
    /// `non-interleaved` or `interleaved`.
    pub fn name(&self) -> &'static str {
        match self {
            Operation::NonInterleaved => "non-interleaved",
            Operation::Interleaved => "interleaved",
        }
    }
}

/// One simulation run.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct SimConfig {
    /// Path and session.
    pub model: WriteModel,
    /// Arrival process.
    pub arrivals: Arrivals,
    /// Operation.
    pub operation: Operation,
    /// Requests measured (after the warm-up).
    pub requests: u64,
    /// Requests simulated first and not measured.
    pub warmup: u64,
    /// Seed of the random streams.
    pub seed: u64,
    /// Batches for the batch-means standard error (at least 2).
    pub batches: u64,
}

/// Write-time statistics of the measured requests, seconds.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SimResult {
    /// Requests measured.
    pub requests: u64,
    /// Mean write time.
    pub mean: f64,
    /// Standard error of the mean, from batch means (NaN with fewer than two full batches).
    pub std_err: f64,
    /// Median.
    pub p50: f64,
    /// 90th percentile.
    pub p90: f64,
    /// 99th percentile.
    pub p99: f64,
    /// 99.9th percentile.
    pub p999: f64,
    /// Largest write time.
    pub max: f64,
    /// Offered traffic realised by the sample path, Erlang of the link rate.
    pub offered_erlang: f64,
    /// Busy fraction of the non-interleaved server, or of the interleaved transmission queue.
    pub utilization: f64,
}

/// Inter-arrival sampler.
enum Gap {
    LogNormal(LogNormal<f64>),
    Exp(Exp<f64>),
}

impl Gap {
    fn new(a: &Arrivals) -> Result<Gap> {
        match *a {
            Arrivals::LogNormal { mu, sigma2 } => {
                let bad = |name, value| Error::Param { name, expected: "a finite number (σ² ≥ 0)", value };
                if !mu.is_finite() {
                    return Err(bad("lognormal mu", mu));
                }
                if !(sigma2.is_finite() && sigma2 >= 0.0) {
                    return Err(bad("lognormal sigma2", sigma2));
                }
                LogNormal::new(mu, sigma2.sqrt()).map(Gap::LogNormal).map_err(|_| bad("lognormal sigma2", sigma2))
            }
            Arrivals::Poisson { rate } => {
                check_pos("poisson rate", rate)?;
                Exp::new(rate).map(Gap::Exp).map_err(|_| Error::Param {
                    name: "poisson rate",
                    expected: "a finite rate above zero",
                    value: rate,
                })
            }
        }
    }

    fn sample(&self, rng: &mut ChaCha8Rng) -> f64 {
        match self {
            Gap::LogNormal(d) => d.sample(rng),
            Gap::Exp(d) => d.sample(rng),
        }
    }
}

/// Arrival times and sizes of the requests, in order.
struct Source<'a> {
    gap: Gap,
    sizes: &'a SizeDist,
    gap_rng: ChaCha8Rng,
    size_rng: ChaCha8Rng,
    now: f64,
    bytes: f64,
}

impl Source<'_> {
    fn next(&mut self) -> (f64, f64) {
        self.now += self.gap.sample(&mut self.gap_rng);
        let size = self.sizes.quantile(self.size_rng.gen::<f64>());
        self.bytes += size;
        (self.now, size)
    }
}

/// The most requests one run measures: their write times are kept in memory for the percentiles.
pub const MAX_REQUESTS: u64 = 50_000_000;

/// How often the progress callback is told, in completed requests.
const PROGRESS_STEP: u64 = 1 << 13;

/// Runs one simulation; `progress` is called with the number of requests completed since its last call.
pub fn simulate(cfg: &SimConfig, sizes: &SizeDist, progress: &mut dyn FnMut(u64)) -> Result<SimResult> {
    cfg.model.validate()?;
    if cfg.requests == 0 || cfg.requests > MAX_REQUESTS {
        return Err(Error::Param {
            name: "requests",
            expected: "between 1 and 50 000 000",
            value: cfg.requests as f64,
        });
    }
    if cfg.batches < 2 {
        return Err(Error::Param { name: "batches", expected: "at least 2", value: cfg.batches as f64 });
    }
    let mut gap_rng = ChaCha8Rng::seed_from_u64(cfg.seed);
    gap_rng.set_stream(1);
    let mut size_rng = ChaCha8Rng::seed_from_u64(cfg.seed);
    size_rng.set_stream(2);
    let mut src = Source { gap: Gap::new(&cfg.arrivals)?, sizes, gap_rng, size_rng, now: 0.0, bytes: 0.0 };
    let total = cfg.warmup.saturating_add(cfg.requests);
    let mut times = vec![0.0; usize::try_from(cfg.requests).unwrap_or(usize::MAX)];
    let (busy, end) = match cfg.operation {
        Operation::NonInterleaved => non_interleaved(cfg, &mut src, total, &mut times, progress),
        Operation::Interleaved => interleaved(cfg, &mut src, total, &mut times, progress),
    };
    let offered = if src.now > 0.0 { src.bytes / src.now / cfg.model.tcp.link } else { f64::NAN };
    Ok(summarise(cfg, times, offered, busy / end))
}

/// Records the write time of request `id` if it is past the warm-up.
fn record(times: &mut [f64], warmup: u64, id: u64, t: f64) {
    if let Some(slot) = id.checked_sub(warmup).and_then(|i| usize::try_from(i).ok()).and_then(|i| times.get_mut(i)) {
        *slot = t;
    }
}

/// Fig. 2a by Lindley's recursion: each request starts when it has arrived and the previous one is done.
fn non_interleaved(
    cfg: &SimConfig,
    src: &mut Source<'_>,
    total: u64,
    times: &mut [f64],
    progress: &mut dyn FnMut(u64),
) -> (f64, f64) {
    let b = cfg.model.bandwidth();
    let round = cfg.model.round_time();
    let (mut free, mut busy) = (0.0_f64, 0.0);
    for id in 0..total {
        let (arrival, size) = src.next();
        let service = size / b + cfg.model.iscsi.rounds(size) * round;
        free = free.max(arrival) + service;
        busy += service;
        record(times, cfg.warmup, id, free - arrival);
        if (id + 1) % PROGRESS_STEP == 0 {
            progress(PROGRESS_STEP);
        }
    }
    progress(total % PROGRESS_STEP);
    (busy, free)
}

/// A pending end of a round (the RTT delay releases a request at `t`).
#[derive(Debug, Clone, Copy)]
struct Event {
    t: f64,
    seq: u64,
    slot: usize,
}

impl PartialEq for Event {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}
impl Eq for Event {}
impl PartialOrd for Event {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Event {
    /// Reversed, so that `BinaryHeap` pops the earliest event (ties in scheduling order).
    fn cmp(&self, other: &Self) -> Ordering {
        other.t.total_cmp(&self.t).then(other.seq.cmp(&self.seq))
    }
}

/// A request in the interleaved network.
#[derive(Debug, Clone, Copy)]
struct Req {
    id: u64,
    arrival: f64,
    size: f64,
    next_burst: u64,
    rounds: u64,
}

/// Fig. 2b. Both queues are FIFO single servers fed in time order and the processing queue is fed only by
/// the transmission queue, in its order; so a burst's departure from both can be computed when it joins the
/// transmission queue, and the only events are arrivals and the ends of RTT delays.
fn interleaved(
    cfg: &SimConfig,
    src: &mut Source<'_>,
    total: u64,
    times: &mut [f64],
    progress: &mut dyn FnMut(u64),
) -> (f64, f64) {
    let b = cfg.model.bandwidth();
    let iscsi = cfg.model.iscsi;
    let rtt = cfg.model.tcp.rtt;
    let mut heap: BinaryHeap<Event> = BinaryHeap::new();
    let mut reqs: Vec<Req> = Vec::new();
    let mut free_slots: Vec<usize> = Vec::new();
    let (mut trans_free, mut proc_free, mut busy, mut seq) = (0.0_f64, 0.0_f64, 0.0, 0_u64);
    let (mut generated, mut done, mut end) = (0_u64, 0_u64, 0.0_f64);
    let mut next = (generated < total).then(|| src.next());

    // Sends the next burst of the request in `slot`, which joins the transmission queue at `t`.
    let mut send = |slot: usize, t: f64, reqs: &mut Vec<Req>, heap: &mut BinaryHeap<Event>| {
        let Some(r) = reqs.get_mut(slot) else { return };
        let service = iscsi.burst(r.size, r.next_burst) / b;
        r.next_burst += 1;
        trans_free = trans_free.max(t) + service;
        busy += service;
        proc_free = proc_free.max(trans_free) + iscsi.proc;
        seq += 1;
        heap.push(Event { t: proc_free + rtt, seq, slot });
    };

    while done < total {
        let arrival_first = match (next, heap.peek()) {
            (Some((a, _)), Some(e)) => a <= e.t,
            (Some(_), None) => true,
            (None, Some(_)) => false,
            (None, None) => break,
        };
        if arrival_first {
            let Some((arrival, size)) = next else { break };
            let req = Req { id: generated, arrival, size, next_burst: 0, rounds: iscsi.rounds(size) as u64 };
            let slot = if let Some(s) = free_slots.pop() {
                if let Some(r) = reqs.get_mut(s) {
                    *r = req;
                }
                s
            } else {
                reqs.push(req);
                reqs.len() - 1
            };
            send(slot, arrival, &mut reqs, &mut heap);
            generated += 1;
            next = (generated < total).then(|| src.next());
        } else if let Some(ev) = heap.pop() {
            let Some(r) = reqs.get(ev.slot).copied() else { continue };
            if r.next_burst < r.rounds {
                send(ev.slot, ev.t, &mut reqs, &mut heap);
            } else {
                record(times, cfg.warmup, r.id, ev.t - r.arrival);
                free_slots.push(ev.slot);
                end = end.max(ev.t);
                done += 1;
                if done % PROGRESS_STEP == 0 {
                    progress(PROGRESS_STEP);
                }
            }
        }
    }
    progress(done % PROGRESS_STEP);
    (busy, end)
}

fn summarise(cfg: &SimConfig, mut times: Vec<f64>, offered: f64, utilization: f64) -> SimResult {
    let n = times.len();
    let mean = times.iter().sum::<f64>() / n as f64;
    let per = n as u64 / cfg.batches;
    let std_err = if per == 0 {
        f64::NAN
    } else {
        let k = cfg.batches as f64;
        let means: Vec<f64> = times
            .chunks_exact(per as usize)
            .take(cfg.batches as usize)
            .map(|c| c.iter().sum::<f64>() / per as f64)
            .collect();
        let m = means.iter().sum::<f64>() / k;
        let var = means.iter().map(|x| (x - m).powi(2)).sum::<f64>() / (k - 1.0);
        (var / k).sqrt()
    };
    times.sort_unstable_by(f64::total_cmp);
    let pct = |q: f64| {
        let rank = ((q * n as f64).ceil() as usize).clamp(1, n);
        times.get(rank - 1).copied().unwrap_or(f64::NAN)
    };
    SimResult {
        requests: n as u64,
        mean,
        std_err,
        p50: pct(0.5),
        p90: pct(0.9),
        p99: pct(0.99),
        p999: pct(0.999),
        max: times.last().copied().unwrap_or(f64::NAN),
        offered_erlang: offered,
        utilization,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(operation: Operation, arrivals: Arrivals, requests: u64) -> SimConfig {
        SimConfig {
            model: WriteModel::paper(2e-3, 1e-6, 1e-3),
            arrivals,
            operation,
            requests,
            warmup: 0,
            seed: 7,
            batches: 10,
        }
    }

    #[test]
    fn same_seed_same_result() {
        let d = SizeDist::seed003();
        for op in [Operation::NonInterleaved, Operation::Interleaved] {
            let c = cfg(op, Arrivals::SEED003, 5000);
            let a = simulate(&c, &d, &mut |_| {}).unwrap();
            let b = simulate(&c, &d, &mut |_| {}).unwrap();
            assert_eq!(a, b);
            let other = simulate(&SimConfig { seed: 8, ..c }, &d, &mut |_| {}).unwrap();
            assert_ne!(a.mean, other.mean);
        }
    }

    #[test]
    fn progress_counts_every_request() {
        let d = SizeDist::seed003();
        for op in [Operation::NonInterleaved, Operation::Interleaved] {
            let c = SimConfig { warmup: 1000, ..cfg(op, Arrivals::SEED003, 20_000) };
            let mut seen = 0;
            simulate(&c, &d, &mut |n| seen += n).unwrap();
            assert_eq!(seen, 21_000);
        }
    }

    #[test]
    fn lonely_requests_take_exactly_eq1() {
        // At one request per 1000 s nothing ever queues, so every write takes eq. (1) in both models.
        let d = SizeDist::fixed(270336.0).unwrap();
        for op in [Operation::NonInterleaved, Operation::Interleaved] {
            let c = cfg(op, Arrivals::Poisson { rate: 1e-3 }, 200);
            let r = simulate(&c, &d, &mut |_| {}).unwrap();
            let eq1 = c.model.write(270336.0).write_time;
            assert!((r.max - eq1).abs() < 1e-9 && (r.p50 - eq1).abs() < 1e-9, "{op:?}: {r:?} vs {eq1}");
        }
    }

    #[test]
    fn with_rate_keeps_sigma_and_sets_the_mean() {
        let a = Arrivals::SEED003.with_rate(100.0);
        assert!((a.rate() - 100.0).abs() < 1e-9);
        assert!(matches!(a, Arrivals::LogNormal { sigma2, .. } if sigma2 == 6.25));
        assert!((Arrivals::SEED003.rate() - (1.375_f64).exp()).abs() < 1e-12);
    }

    #[test]
    fn bad_parameters_are_refused() {
        let d = SizeDist::seed003();
        let c = cfg(Operation::Interleaved, Arrivals::Poisson { rate: 0.0 }, 10);
        assert!(simulate(&c, &d, &mut |_| {}).is_err());
        let c = cfg(Operation::Interleaved, Arrivals::LogNormal { mu: 0.0, sigma2: -1.0 }, 10);
        assert!(simulate(&c, &d, &mut |_| {}).is_err());
        let c = SimConfig { requests: 0, ..cfg(Operation::Interleaved, Arrivals::SEED003, 10) };
        assert!(simulate(&c, &d, &mut |_| {}).is_err());
    }
}
