//! `stics bench trace`: seed 004 Figs. 8–9, an EMC-tel-like trace (or a user's) replayed open loop
//! across an emulated WAN through plain iSCSI and through the STICS gateway in both of its modes.

use std::path::PathBuf;

use stics_report::plot::{self, Figure, Series};
use stics_report::{Column, Table};

use crate::paper;
use crate::peers::{GatewayOptions, Wan};
use crate::replay::{Outcome, Response, SLOW};
use crate::trace::Format;
use crate::{Bench, Error, Report, Result, Stat};

/// Options of `stics bench trace`.
#[derive(Debug, Clone, clap::Args)]
pub struct Args {
    /// Requests replayed per path (default: 230,370 generated as seed 004's trace, 3,000 with
    /// --quick; with --trace, the whole file).
    #[arg(long)]
    pub requests: Option<u64>,
    /// One-way delay of the emulated WAN between the host and the storage.
    #[arg(long, default_value = "8ms", value_parser = stics_units::parse_duration)]
    pub delay: f64,
    /// Replay this block trace (SNIA/MSR Cambridge CSV or blkparse text) instead of the
    /// EMC-tel-like one; offsets past 1 GiB fold into the LUN.
    #[arg(long, value_name = "FILE")]
    pub trace: Option<PathBuf>,
    /// The trace's format (default: told from its first line).
    #[arg(long, value_enum, requires = "trace")]
    pub format: Option<Format>,
}

/// The paths compared: their label, the gateway mode (none: plain iSCSI) and the paper's row.
const PATHS: [(&str, Option<&str>, &str); 3] = [
    ("plain iSCSI", None, "emc-tel, iscsi"),
    ("gateway, log", Some("log"), "emc-tel, stics report after complete"),
    ("gateway, immediate", Some("immediate"), "emc-tel, stics immediate report"),
];

/// The paper's iSCSI/STICS ratio rows, by path.
const PAPER_RATIOS: [&str; 3] =
    ["", "emc-tel, iscsi vs stics report after complete", "emc-tel, iscsi vs stics immediate report"];

/// Response-time buckets of the distribution table, in seconds (upper bounds).
const BUCKETS: [(f64, &str); 7] = [
    (0.001, "< 1 ms"),
    (0.002, "1–2 ms"),
    (0.005, "2–5 ms"),
    (0.010, "5–10 ms"),
    (0.020, "10–20 ms"),
    (SLOW, "20–50 ms"),
    (f64::INFINITY, "> 50 ms"),
];

/// The size of the storage LUN: room for the 900 MB data set of seed 004.
const LUN: &str = "1GiB";

pub fn run(b: &Bench, a: &Args) -> Result<Report> {
    if !(a.delay.is_finite() && a.delay >= 0.0) {
        return Err(Error::Invalid(format!("the delay must be a duration, not {}", a.delay)));
    }
    let requests = match (a.requests, &a.trace) {
        (Some(n), _) => Some(if b.quick() { n.min(3_000) } else { n }),
        (None, None) => Some(if b.quick() { 3_000 } else { 230_370 }),
        (None, Some(_)) => b.quick().then_some(3_000),
    };
    let delay = format!("{}us", (a.delay * 1e6).round());
    let wan = Wan::up(b, &format!("sbtrace{}", std::process::id()), &["--delay", &delay])?;
    let img = b.work().join("trace-lun.img");
    let lun_bytes = stics_units::parse_size(LUN).map_err(|e| crate::Error::Invalid(e.to_string()))?;
    std::fs::File::create(&img)?.set_len(lun_bytes)?;
    let target = wan.stics_target(b, "trace-target", "storage", &[&b.remote_medium(&img)])?;
    let log = b.work().join("trace-gateway-log.img");
    let mut replay_args = vec!["--json".to_owned()];
    match &a.trace {
        Some(t) => {
            replay_args.extend(["--trace".to_owned(), t.display().to_string()]);
            if let Some(f) = a.format {
                replay_args.extend(["--format".to_owned(), format_name(f).to_owned()]);
            }
        }
        None => replay_args.push("--emc-tel".to_owned()),
    }
    if let Some(n) = requests {
        replay_args.extend(["--requests".to_owned(), n.to_string()]);
    }
    let replay = |url: &str| -> Result<Outcome> {
        let mut cmd = wan.exec("host", b.stics());
        cmd.args(["bench", "replay", url]).args(&replay_args);
        let out = b.run(&mut cmd)?;
        serde_json::from_str(&out.stdout)
            .map_err(|e| Error::Output { what: "stics bench replay --json".into(), detail: e.to_string() })
    };
    let bar = b.bar((b.reps() * PATHS.len()) as u64, "trace replay");
    let mut runs: [Vec<Outcome>; 3] = Default::default();
    for rep in 0..b.reps() {
        // Each path goes first once in three repetitions, so that none always meets a fresh target.
        for k in 0..PATHS.len() {
            let i = (rep + k) % PATHS.len();
            let outcome = match PATHS[i].1 {
                None => replay(&target.url)?,
                Some(mode) => {
                    let opts = GatewayOptions::usual(mode, &log, "512MiB");
                    let g = wan.gateway(b, &format!("trace-gateway-{mode}"), "host", &target.url, &opts)?;
                    let o = replay(&g.url);
                    wan.gateway_stop(b, g, &target.url, &log)?;
                    o?
                }
            };
            runs[i].push(outcome);
            bar.inc(1);
        }
    }
    bar.finish_and_clear();
    drop(target);
    drop(wan);
    report(b, a, &runs)
}

fn format_name(f: Format) -> &'static str {
    match f {
        Format::Msr => "msr",
        Format::Blkparse => "blkparse",
    }
}

/// The mean response of the requests in one direction.
fn mean_of(o: &Outcome, write: bool) -> f64 {
    let (sum, n) =
        o.responses.iter().filter(|r| r.write == write).fold((0.0, 0u64), |(s, n), r| (s + f64::from(r.rt), n + 1));
    if n == 0 {
        f64::NAN
    } else {
        sum / n as f64
    }
}

fn report(b: &Bench, a: &Args, runs: &[Vec<Outcome>; 3]) -> Result<Report> {
    let generated = a.trace.is_none();
    let med = |i: usize, f: &dyn Fn(&Outcome) -> f64| Stat::of(&runs[i].iter().map(f).collect::<Vec<_>>()).median;
    let mut t = Table::new(vec![
        Column::new("path", "path", "", 1.0),
        Column::new("requests", "requests", "", 1.0),
        Column::new("writes", "writes", "%", 100.0),
        Column::new("paper_mean", "paper mean", "ms", 1e3),
        Column::new("mean", "mean", "ms", 1e3),
        Column::new("p50", "p50", "ms", 1e3),
        Column::new("p99", "p99", "ms", 1e3),
        Column::new("max", "max", "ms", 1e3),
        Column::new("write_mean", "write mean", "ms", 1e3),
        Column::new("read_mean", "read mean", "ms", 1e3),
        Column::new("over_50ms", "> 50 ms", "", 1.0),
        Column::new("paper_speedup", "paper plain/this", "", 1.0),
        Column::new("speedup", "plain/this", "", 1.0),
        Column::new("spread", "spread of mean", "%", 100.0),
    ])?;
    let plain_mean = med(0, &|o| o.mean);
    let mut means = [0.0; 3];
    for (i, (label, _, row)) in PATHS.iter().enumerate() {
        let mean = med(i, &|o| o.mean);
        means[i] = mean;
        let paper_mean = if generated { paper::base("004", "§4.3.2", row, "average response time") } else { f64::NAN };
        let paper_speedup = if generated && i > 0 {
            paper::base("004", "§4.3.2", PAPER_RATIOS[i], "response time ratio")
        } else {
            f64::NAN
        };
        t.push(vec![
            (*label).into(),
            med(i, &|o| o.requests as f64).into(),
            med(i, &|o| o.writes as f64 / o.requests.max(1) as f64).into(),
            paper_mean.into(),
            mean.into(),
            med(i, &|o| o.p50).into(),
            med(i, &|o| o.p99).into(),
            med(i, &|o| o.max).into(),
            med(i, &|o| mean_of(o, true)).into(),
            med(i, &|o| mean_of(o, false)).into(),
            med(i, &|o| o.over_50ms as f64).into(),
            paper_speedup.into(),
            (plain_mean / mean).into(),
            Stat::of(&runs[i].iter().map(|o| o.mean).collect::<Vec<_>>()).spread().into(),
        ])?;
    }
    let last: Vec<&Outcome> = runs.iter().filter_map(|r| r.last()).collect();
    let mut dist = Table::new(vec![
        Column::new("bucket", "response time", "", 1.0),
        Column::new("plain", "plain iSCSI", "%", 100.0),
        Column::new("log", "gateway, log", "%", 100.0),
        Column::new("immediate", "gateway, immediate", "%", 100.0),
    ])?;
    let mut lo = 0.0;
    for (hi, name) in BUCKETS {
        let mut cells = vec![name.into()];
        for o in &last {
            let n = o.responses.iter().filter(|r| f64::from(r.rt) >= lo && f64::from(r.rt) < hi).count();
            cells.push((n as f64 / o.responses.len().max(1) as f64).into());
        }
        dist.push(cells)?;
        lo = hi;
    }

    let what = if generated {
        "the EMC-tel-like trace (Poisson arrivals at 333/s, 4 × 512 B, 89 % writes, uniform over 900 MB, seed 4)"
            .to_owned()
    } else {
        format!("the trace {}", a.trace.as_ref().map(|p| p.display().to_string()).unwrap_or_default())
    };
    let delay_ms = a.delay * 1e3;
    let mut r = Report::new(
        "trace",
        "Seed 004 Figs. 8–9: response times of a block trace replayed open loop, plain iSCSI against the STICS gateway",
    );
    let reps = if b.reps() > 1 { format!(", medians of {} repetitions", b.reps()) } else { String::new() };
    r.section(
        format!(
            "Response times of {what}, replayed open loop across {delay_ms} ms one way; gateway log 512 MiB, RAM \
             64 MiB, read cache 256 MiB{reps}{} (seed 004 §4.3.2, Fig. 8)",
            super::fs::setup(b)
        ),
        t,
        Some(scatter(&last, delay_ms, generated)),
    );
    r.section(
        "Share of requests by response time, last repetition (seed 004 Fig. 9)".to_owned(),
        dist,
        Some(histogram_figure(
            &format!("Response-time histogram, {delay_ms} ms one way"),
            &PATHS.iter().map(|p| p.0).zip(last.iter().copied()).collect::<Vec<_>>(),
        )),
    );
    notes(&mut r, generated, &last, &means, delay_ms, b.remote_disk());
    Ok(r)
}

fn notes(
    r: &mut Report,
    generated: bool,
    last: &[&Outcome],
    means: &[f64; 3],
    delay_ms: f64,
    disk: Option<stics_disk::Preset>,
) {
    let ms = |s: f64| s * 1e3;
    if generated {
        let here = match disk {
            Some(m) => format!(
                "Here the remote's medium sits behind the {m} disk model {delay_ms} ms away: plain iSCSI took {:.2} ms \
                 on average. Where that is far above the model's service time, the arrivals outrun the disk and the \
                 queue grows for the whole replay: this trace spreads its requests uniformly over 900 MB, so every one \
                 seeks, where the real trace's locality let the paper's disk keep up.",
                ms(means[0])
            ),
            None => format!(
                "Here the remote is a page-cached file {delay_ms} ms away, so plain iSCSI pays the round trip on every \
                 request: {:.2} ms mean, near the paper's by coincidence of two different causes.",
                ms(means[0])
            ),
        };
        r.note(format!(
            "Seed 004 measured 16.73 ms for iSCSI, 5.71 ms for STICS with report after complete (2.9×) and 2.7 ms \
             with immediate report (6.2×) on a Gigabit LAN whose round trip was about 0.1 ms: its iSCSI time was the \
             remote disk's. {here}"
        ));
    }
    if let (Some(o), Some(p)) = (last.get(1), last.first()) {
        let reads = 1.0 - o.writes as f64 / o.requests.max(1) as f64;
        let rm = mean_of(o, false);
        r.note(format!(
            "Through the gateway writes complete locally (log mode: {:.2} ms mean, against {:.2} ms plain), but the \
             {:.0} % reads fall uniformly over the data set and mostly miss the 256 MiB read cache and the blocks \
             written so far: each pays the round trip ({:.2} ms mean), which alone adds {:.2} ms to the mean of all \
             requests and sets the p99. Seed 004's remote was 0.1 ms away, so its misses cost a disk access, not a WAN \
             round trip; that is why our plain/gateway ratios ({:.1}× log, {:.1}× immediate) are bounded by about \
             1 / read share.",
            ms(mean_of(o, true)),
            ms(mean_of(p, true)),
            reads * 100.0,
            ms(rm),
            ms(reads * rm),
            means[0] / means[1],
            means[0] / means[2],
        ));
    }
    if let (Some(l), Some(i)) = (last.get(1), last.get(2)) {
        r.note(format!(
            "Log mode acknowledges a write once it is in the local log (the paper's report after complete), immediate \
             once it is in RAM. Seed 004 saw 4 requests of up to 300 ms in log mode, its destage holding new \
             requests until a log segment was empty; our destage runs beside the host's requests: {} over 50 ms in \
             log mode (worst {:.1} ms), {} in immediate mode (worst {:.1} ms).",
            l.over_50ms,
            ms(l.max),
            i.over_50ms,
            ms(i.max)
        ));
    }
    let lag = last.iter().map(|o| o.max_issue_lag).fold(0.0, f64::max);
    let folded: u64 = last.iter().map(|o| o.folded).sum();
    r.note(format!(
        "Open loop: each request is issued at its time whatever is in flight, and its response counts from then; \
         the client issued at most {:.2} ms late{}.",
        ms(lag),
        if folded > 0 {
            format!(", and {folded} requests past the LUN's end were folded into it")
        } else {
            String::new()
        }
    ));
}

/// Points to draw of one replay: every response slower than its p99, and an even sample of the rest,
/// so that a run of hundreds of thousands stays drawable and keeps its outliers.
fn thinned(o: &Outcome) -> Vec<(f64, f64)> {
    const KEEP: usize = 20_000;
    let step = o.responses.len().div_ceil(KEEP).max(1);
    o.responses
        .iter()
        .enumerate()
        .filter(|(k, r)| k % step == 0 || f64::from(r.rt) > o.p99)
        .map(|(_, r)| (f64::from(r.at), f64::from(r.rt) * 1e3))
        .collect()
}

/// Fig. 8: each request's response time against when it was issued, with the paper's mean for
/// each path (when the trace is the generated one) as a level line across the replay.
fn scatter(last: &[&Outcome], delay_ms: f64, generated: bool) -> Figure {
    let end = last.iter().filter_map(|o| o.responses.last()).map(|r| f64::from(r.at)).fold(0.0, f64::max);
    let paper = PATHS.iter().filter(|_| generated).map(|(label, _, row)| {
        let mean = paper::base("004", "§4.3.2", row, "average response time") * 1e3;
        Series::line(format!("paper mean: {label}"), vec![(0.0, mean), (end, mean)])
    });
    Figure {
        title: format!("Response time of each request, {delay_ms} ms one way"),
        x_label: "issued at [s]".into(),
        y_label: "response time [ms]".into(),
        log_x: false,
        log_y: true,
        categories: Vec::new(),
        series: PATHS.iter().zip(last).map(|(p, o)| Series::scatter(p.0, thinned(o))).chain(paper).collect(),
    }
}

/// Fig. 9: requests by response time, in the same bins for every replay, even on a logarithmic
/// axis so that 0.1 ms and 300 ms responses are both seen.
pub fn histogram_figure(title: &str, outcomes: &[(&str, &Outcome)]) -> Figure {
    const BINS: usize = 60;
    let logs: Vec<Vec<f64>> = outcomes
        .iter()
        .map(|(_, o)| o.responses.iter().map(|r: &Response| (f64::from(r.rt) * 1e3).log10()).collect())
        .collect();
    // plot::histogram bins each sample set between its own extremes; the pooled one gives the
    // bins all replays share, so that their bars line up.
    let pooled: Vec<f64> = logs.iter().flatten().copied().collect();
    let centres: Vec<f64> = plot::histogram(&pooled, BINS).into_iter().map(|(c, _)| c).collect();
    let width = match centres.as_slice() {
        [a, b, ..] => b - a,
        _ => 1.0,
    };
    let series = outcomes
        .iter()
        .zip(&logs)
        .map(|((label, o), logs)| {
            let mut counts = vec![0.0; centres.len()];
            for v in logs.iter().filter(|v| v.is_finite()) {
                let k = centres.first().map_or(0.0, |c0| ((v - (c0 - width / 2.0)) / width).floor());
                let k = (k.max(0.0) as usize).min(counts.len().saturating_sub(1));
                if let Some(n) = counts.get_mut(k) {
                    *n += 1.0;
                }
            }
            let bars = centres.iter().zip(counts).map(|(c, n)| (10f64.powf(*c), n)).collect();
            Series::bars(format!("{label}: mean {:.2} ms", o.mean * 1e3), bars)
        })
        .collect();
    Figure {
        title: title.to_owned(),
        x_label: "response time [ms]".into(),
        y_label: "requests".into(),
        log_x: true,
        log_y: true,
        categories: Vec::new(),
        series,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn outcome(rts: &[f32], writes: &[bool]) -> Outcome {
        let responses: Vec<Response> = rts
            .iter()
            .zip(writes)
            .enumerate()
            .map(|(k, (&rt, &write))| Response { at: k as f32 * 0.003, rt, write })
            .collect();
        Outcome {
            requests: rts.len() as u64,
            writes: writes.iter().filter(|w| **w).count() as u64,
            seconds: 1.0,
            mean: rts.iter().map(|&r| f64::from(r)).sum::<f64>() / rts.len() as f64,
            p50: 0.002,
            p99: 0.05,
            max: 0.3,
            over_50ms: 1,
            folded: 0,
            max_issue_lag: 0.0,
            responses,
        }
    }

    #[test]
    fn the_report_has_the_paper_beside_ours_and_both_figures() {
        let plain = outcome(&[0.017, 0.016, 0.018, 0.017], &[true, true, true, false]);
        let log = outcome(&[0.002, 0.003, 0.3, 0.016], &[true, true, true, false]);
        let imm = outcome(&[0.0005, 0.0006, 0.0007, 0.016], &[true, true, true, false]);
        let b = Bench::new(crate::Options { stics: "stics".into(), quick: true, reps: 1, ..crate::Options::default() })
            .unwrap();
        let a = Args { requests: None, delay: 0.008, trace: None, format: None };
        let r = report(&b, &a, &[vec![plain], vec![log], vec![imm]]).unwrap();
        let rows = r.sections[0].table.rows_json();
        assert!((rows[0]["paper_mean"].as_f64().unwrap() - 0.016_73).abs() < 1e-9);
        assert!((rows[2]["paper_speedup"].as_f64().unwrap() - 6.2).abs() < 1e-9);
        assert!((rows[0]["write_mean"].as_f64().unwrap() - 0.017).abs() < 1e-6);
        assert!((rows[1]["read_mean"].as_f64().unwrap() - 0.016).abs() < 1e-6);
        let dist = r.sections[1].table.rows_json();
        assert_eq!(dist[6]["log"], 0.25);
        assert!(r.sections.iter().all(|s| s.figure.is_some()));
        let (a, b) = (outcome(&[0.001, 0.01, 0.1], &[true; 3]), outcome(&[0.0011, 0.002], &[true; 2]));
        let h = histogram_figure("h", &[("a", &a), ("b", &b)]);
        let xs = |k: usize| h.series[k].points.iter().map(|p| p.0).collect::<Vec<f64>>();
        assert_eq!(xs(0), xs(1));
        assert!((xs(0)[0] - 1.0).abs() < 0.1 && (xs(0)[59] - 100.0).abs() < 10.0, "{:?}", xs(0));
        let total = |k: usize| h.series[k].points.iter().map(|p| p.1).sum::<f64>();
        assert_eq!((total(0), total(1)), (3.0, 2.0));
    }
}
