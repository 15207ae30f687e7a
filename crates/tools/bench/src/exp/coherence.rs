//! `stics bench coherence`: gateways that share one SG LUN (seed 004 §3.4) across `stics wan`:
//! what a token costs to get and what the single-owner fast path costs against a gateway that
//! shares nothing, what one segment written alternately by two gateways costs per transfer, what
//! a read of a segment another gateway writes costs with the blocks sent with its grant and
//! without, and how three gateways' writes go as their spans overlap more.

use std::time::Duration;

use stics_report::plot::{Figure, Series};
use stics_report::{Column, Table};

use super::fs::{sg_lun, SG_METRICS, SG_PORT};
use crate::load::Outcome;
use crate::peers::{Gateway, GatewayOptions, Wan};
use crate::{Bench, Report, Result};

/// Options of `stics bench coherence`.
#[derive(Debug, Clone, clap::Args)]
pub struct Args {
    /// One-way delays of the WAN.
    #[arg(long, value_delimiter = ',', default_value = "2ms,8ms")]
    pub delays: Vec<String>,
    /// Seconds of each timed run (`--quick`: 3).
    #[arg(long, default_value_t = 10)]
    pub seconds: u64,
    /// 64 KiB writes in the acquisition runs, each to a segment of its own (`--quick`: 64).
    #[arg(long, default_value_t = 512)]
    pub writes: u64,
    /// How much of each of the three gateways' spans the others' cover too, as fractions.
    #[arg(long, value_delimiter = ',', default_value = "0,0.25,0.5,1")]
    pub shares: Vec<f64>,
    /// TCP congestion control in the namespaces (`stics wan --cc`): reno, cubic or bbr. BBR,
    /// Linux's default here, paces a connection that idles between bursts at its low bandwidth
    /// estimate, so a surrender's group of dirty blocks leaves slower than the path allows.
    #[arg(long, default_value = "bbr")]
    pub cc: String,
}

const LUN_BYTES: u64 = 4 << 30;
/// The SG's segment (its default).
const SEGMENT: u64 = 64 << 10;
/// Each gateway's span in the overlap runs.
const SPAN: u64 = 16 << 20;

fn options(b: &Bench, name: &str, shared: bool) -> GatewayOptions {
    let path = b.work().join(format!("{name}-log.img"));
    let _ = std::fs::remove_file(&path);
    let mut o = GatewayOptions::usual("log", &path, "256MiB");
    o.ram = "16MiB".into();
    o.read_cache = "64MiB".into();
    if shared {
        o.extra.push("--shared".into());
    }
    o
}

/// Stops the shared gateway `name` and removes its log.
fn stop(b: &Bench, mut g: Gateway, name: &str) {
    g.proc.stop(libc::SIGTERM, Duration::from_secs(60));
    let _ = std::fs::remove_file(b.work().join(format!("{name}-log.img")));
}

/// `stics bench load --json` from the host namespace through `g` (writes, unless `args` say
/// `--op`).
fn load(b: &Bench, wan: &Wan, g: &Gateway, args: &[String]) -> Result<Outcome> {
    let mut cmd = wan.exec("host", b.stics());
    cmd.args(["bench", "load", &g.url, "--json"]).args(args);
    if !args.iter().any(|a| a == "--op") {
        cmd.args(["--op", "write"]);
    }
    Outcome::from_json(&b.run(&mut cmd)?.stdout)
}

/// Several loads at once, one per gateway.
fn loads(b: &Bench, wan: &Wan, runs: &[(&Gateway, Vec<String>)]) -> Result<Vec<Outcome>> {
    std::thread::scope(|s| {
        let handles: Vec<_> = runs.iter().map(|(g, args)| s.spawn(move || load(b, wan, g, args))).collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(crate::Error::Output { what: "load".into(), detail: "panicked".into() }))
            })
            .collect()
    })
}

/// A counter of the gateway's tokens (`/status`'s `tokens`).
fn tokens(b: &Bench, wan: &Wan, g: &Gateway, key: &str) -> Result<f64> {
    Ok(wan.gateway_status(b, g)?["tokens"][key].as_f64().unwrap_or(0.0))
}

fn strings(args: &[&str]) -> Vec<String> {
    args.iter().map(|s| (*s).to_owned()).collect()
}

fn ms(delay: &str) -> f64 {
    stics_units::parse_duration(delay).map_or(f64::NAN, |d| d * 1e3)
}

/// One line per named series of `(one-way delay [ms], y)` points.
fn delay_figure(title: &str, y_label: &str, curves: std::collections::BTreeMap<&str, Vec<(f64, f64)>>) -> Figure {
    Figure {
        title: title.into(),
        x_label: "one-way delay [ms]".into(),
        y_label: y_label.into(),
        log_x: false,
        log_y: false,
        categories: Vec::new(),
        series: curves.into_iter().map(|(name, points)| Series::line(name, points)).collect(),
    }
}

pub fn run(b: &Bench, a: &Args) -> Result<Report> {
    b.need(&["curl"])?;
    let secs = if b.quick() { a.seconds.min(3) } else { a.seconds };
    let writes = super::scaled(b, a.writes, a.writes.min(64));
    let mut r = Report::new(
        "coherence",
        "Gateways that share one SG LUN: token acquisition, the fast path, a segment written alternately, a read after the other's writes, overlap",
    );
    let mut acquire = Table::new(vec![
        Column::new("delay", "one way", "", 1.0),
        Column::new("path", "gateway", "", 1.0),
        Column::new("iops", "writes/s", "", 1.0),
        Column::new("mean", "mean", "ms", 1e3),
        Column::new("p99", "p99", "ms", 1e3),
    ])?;
    let mut pingpong = Table::new(vec![
        Column::new("delay", "one way", "", 1.0),
        Column::new("transfers", "transfers", "", 1.0),
        Column::new("iops", "writes/s, both", "", 1.0),
        Column::new("writes_per_hold", "writes per hold", "", 1.0),
        Column::new("answer", "revoke to release", "ms", 1.0),
        Column::new("rtts", "revoke to release [round trips]", "", 1.0),
        Column::new("durable", "of it, the revoke's record", "ms", 1.0),
        Column::new("polled", "of it, waiting for the holder's poll", "ms", 1.0),
        Column::new("wait", "a waiting write's wait", "ms", 1.0),
        Column::new("wait_rtts", "wait [round trips]", "", 1.0),
        Column::new("early", "early releases", "", 1.0),
        Column::new("overlapped", "groups sent behind another", "", 1.0),
    ])?;
    let mut reads = Table::new(vec![
        Column::new("delay", "one way", "", 1.0),
        Column::new("reader", "reader", "", 1.0),
        Column::new("iops", "reads/s", "", 1.0),
        Column::new("mean", "a read's mean", "ms", 1e3),
        Column::new("waited", "reads that waited for a token", "", 1.0),
        Column::new("with_data", "grants with the blocks", "", 1.0),
        Column::new("writes", "the writer's writes/s", "", 1.0),
    ])?;
    let mut read_notes = Vec::new();
    let mut acquire_curves: std::collections::BTreeMap<&str, Vec<(f64, f64)>> = std::collections::BTreeMap::new();
    let mut read_curves: std::collections::BTreeMap<&str, Vec<(f64, f64)>> = std::collections::BTreeMap::new();
    let mut overlap = Table::new(vec![
        Column::new("delay", "one way", "", 1.0),
        Column::new("share", "overlap", "", 1.0),
        Column::new("iops", "writes/s, all three", "", 1.0),
        Column::new("mean", "mean", "ms", 1e3),
        Column::new("transfers", "tokens given up", "", 1.0),
    ])?;
    let mut curves = Vec::new();
    let mut notes = Vec::new();
    let mut pp_notes = Vec::new();
    let bar = b.bar(a.delays.len() as u64, "coherence");
    for delay in &a.delays {
        let rtt = 2.0 * ms(delay);
        let wan = Wan::up(b, &format!("sbco{}", std::process::id()), &["--delay", delay, "--cc", &a.cc])?;
        let sg = wan.stics_target_on_with(
            b,
            "sg",
            "storage",
            SG_PORT,
            &[&sg_lun(b, "sg", LUN_BYTES)?],
            &["--metrics", SG_METRICS],
        )?;
        let seq64 = |from: u64| {
            let span = writes * SEGMENT;
            strings(&["--pattern", "seq", "--size", "64KiB", "--depth", "1"])
                .into_iter()
                .chain([format!("--from={from}"), format!("--span={span}"), format!("--count={writes}")])
                .collect::<Vec<_>>()
        };

        // 1. A gateway that shares nothing, then a shared one on segments it touches first, then
        //    on segments it holds.
        let o = options(b, "alone", false);
        let alone = wan.gateway_n(b, "alone", "host", 0, &sg.url, &o)?;
        let by_itself = load(b, &wan, &alone, &seq64(0))?;
        // The same writes again once the first pass is on the SG: the like-for-like control of
        // the fast path, which also writes over blocks its cache holds clean, with nothing left
        // to destage.
        wan.gateway_drain(b, &alone)?;
        let again = load(b, &wan, &alone, &seq64(0))?;
        let log = b.work().join("alone-log.img");
        wan.gateway_stop(b, alone, &sg.url, &log)?;
        let g0 = wan.gateway_n(b, "g0", "host", 1, &sg.url, &options(b, "g0", true))?;
        let first = load(b, &wan, &g0, &seq64(1 << 30))?;
        wan.gateway_drain(b, &g0)?;
        let held = load(b, &wan, &g0, &seq64(1 << 30))?;
        for (path, o) in [
            ("alone (no tokens)", &by_itself),
            ("alone, same segments again (control)", &again),
            ("shared, first touch (a token per write)", &first),
            ("shared, tokens held (fast path)", &held),
        ] {
            acquire.push(vec![delay.as_str().into(), path.into(), o.iops.into(), o.mean.into(), o.p99.into()])?;
            acquire_curves.entry(path).or_default().push((ms(delay), o.mean * 1e3));
        }
        notes.push(format!(
            "At {delay} one way ({rtt:.0} ms round trip): a token took {:.1} ms to get (first touch's mean less the \
             fast path's, {:.2} round trips); with its tokens held a shared gateway's writes took {:.2}× as long as \
             those of a gateway that shares nothing when it writes the same segments again ({:.2}× its first pass).",
            (first.mean - held.mean) * 1e3,
            (first.mean - held.mean) * 1e3 / rtt,
            held.mean / again.mean,
            held.mean / by_itself.mean
        ));

        // 2. One segment, written by two gateways at once: it goes back and forth.
        let g1 = wan.gateway_n(b, "g1", "host", 2, &sg.url, &options(b, "g1", true))?;
        let hot = format!("--from={}", 2u64 << 30);
        let one = strings(&["--size", "4KiB", "--depth", "1", "--span", "64KiB", "--seconds"])
            .into_iter()
            .chain([format!("{secs}s"), hot])
            .collect::<Vec<_>>();
        // The counters of both gateways' tokens and of the SG's, read once before and once after.
        let counters = || -> Result<[serde_json::Value; 3]> {
            Ok([
                wan.gateway_status(b, &g0)?["tokens"].take(),
                wan.gateway_status(b, &g1)?["tokens"].take(),
                wan.target_status(b, "storage", SG_METRICS)?["journals"][0]["tokens"].take(),
            ])
        };
        // Groups a gateway sent while its last one was still out (a surrender's, mostly).
        let overlapped = || -> Result<f64> {
            let mut n = 0.0;
            for g in [&g0, &g1] {
                n += wan.gateway_status(b, g)?["groups"]["overlapped"].as_f64().unwrap_or(0.0);
            }
            Ok(n)
        };
        let (before, overlapped_before) = (counters()?, overlapped()?);
        let outs = loads(b, &wan, &[(&g0, one.clone()), (&g1, one)])?;
        let (after, overlapped_after) = (counters()?, overlapped()?);
        let grew = |who: std::ops::Range<usize>, key: &str| -> f64 {
            who.map(|i| after[i][key].as_f64().unwrap_or(0.0) - before[i][key].as_f64().unwrap_or(0.0)).sum()
        };
        let transfers = grew(0..2, "surrenders");
        let wait_ms = grew(0..2, "wait_secs") * 1e3 / grew(0..2, "waits").max(1.0);
        let answer_ms = grew(2..3, "revoke_answer_secs") * 1e3 / grew(2..3, "revokes_answered").max(1.0);
        let durable_ms = grew(2..3, "revoke_durable_secs") * 1e3 / grew(2..3, "revokes_queued").max(1.0);
        let polled_ms = grew(2..3, "revoke_poll_secs") * 1e3 / grew(2..3, "revokes_polled").max(1.0);
        let done: f64 = outs.iter().map(|o| o.requests as f64).sum();
        let elapsed = outs.iter().map(|o| o.seconds).fold(0.0, f64::max);
        pingpong.push(vec![
            delay.as_str().into(),
            transfers.into(),
            (done / elapsed.max(1e-9)).into(),
            (done / transfers.max(1.0)).into(),
            answer_ms.into(),
            (answer_ms / rtt).into(),
            durable_ms.into(),
            polled_ms.into(),
            wait_ms.into(),
            (wait_ms / rtt).into(),
            grew(2..3, "early_releases").into(),
            (overlapped_after - overlapped_before).into(),
        ])?;
        pp_notes.push(format!(
            "{:.2} round trips at {delay} one way ({answer_ms:.1} ms, of which {durable_ms:.1} ms the revoke's record \
             and {polled_ms:.1} ms its wait for the holder's poll; a waiting write waited {:.1} round trips, \
             {:.0} writes/s, {:.1} per hold)",
            answer_ms / rtt,
            wait_ms / rtt,
            done / elapsed.max(1e-9),
            done / transfers.max(1.0)
        ));

        // 3. One gateway writes a segment while another reads it: the reader's token comes with
        //    the blocks it waits for, or (a reader started with --no-grant-data) without them.
        let mut plain_o = options(b, "g3", true);
        plain_o.extra.push("--no-grant-data".into());
        let g3 = wan.gateway_n(b, "g3", "host", 4, &sg.url, &plain_o)?;
        let span_of = |k: u64| format!("--from={}", (2u64 << 30) + (k + 1) * SEGMENT);
        let mut means = Vec::new();
        for (k, (reader, name)) in
            [(&g1, "blocks with the grant"), (&g3, "blocks after the grant (--no-grant-data)")].into_iter().enumerate()
        {
            let base = strings(&["--size", "4KiB", "--depth", "1", "--span", "64KiB"])
                .into_iter()
                .chain([format!("--seconds={secs}s"), span_of(k as u64)])
                .collect::<Vec<_>>();
            let read_args: Vec<String> = base.iter().cloned().chain(strings(&["--op", "read"])).collect();
            let stat = |key: &str| tokens(b, &wan, reader, key);
            let (waits, filled) = (stat("waits")?, stat("grants_with_data")?);
            let outs = loads(b, &wan, &[(&g0, base), (reader, read_args)])?;
            let (waited, with) = (stat("waits")? - waits, stat("grants_with_data")? - filled);
            let (w, r) = (&outs[0], &outs[1]);
            reads.push(vec![
                delay.as_str().into(),
                name.into(),
                r.iops.into(),
                r.mean.into(),
                waited.into(),
                with.into(),
                w.iops.into(),
            ])?;
            means.push((r.mean, waited / (r.requests as f64).max(1.0), r.iops));
            read_curves.entry(name).or_default().push((ms(delay), r.mean * 1e3));
        }
        if let [with, without] = means[..] {
            read_notes.push(format!(
                "At {delay} one way ({rtt:.0} ms round trip): a read took {:.2} ms on average with the blocks sent \
                 with its grant and {:.2} ms without ({:.2} round trips less; {:.0} % and {:.0} % of reads waited for \
                 a token), {:.2}× the reads/s",
                with.0 * 1e3,
                without.0 * 1e3,
                (without.0 - with.0) * 1e3 / rtt,
                with.1 * 100.0,
                without.1 * 100.0,
                with.2 / without.2.max(1e-9)
            ));
        }
        stop(b, g3, "g3");

        // 4. Three gateways, their spans overlapping more and more.
        let g2 = wan.gateway_n(b, "g2", "host", 3, &sg.url, &options(b, "g2", true))?;
        let gws = [&g0, &g1, &g2];
        let mut points = Vec::new();
        for (k, &share) in a.shares.iter().enumerate() {
            let base = (3u64 << 30) + k as u64 * 64 * SPAN / 16;
            let step = ((SPAN as f64 * (1.0 - share.clamp(0.0, 1.0))) as u64 / SEGMENT) * SEGMENT;
            let runs: Vec<(&Gateway, Vec<String>)> = gws
                .iter()
                .enumerate()
                .map(|(i, g)| {
                    let args = strings(&["--size", "4KiB", "--depth", "4"])
                        .into_iter()
                        .chain([
                            format!("--from={}", base + i as u64 * step),
                            format!("--span={SPAN}"),
                            format!("--seconds={secs}s"),
                            format!("--seed={}", i + 1),
                        ])
                        .collect();
                    (*g, args)
                })
                .collect();
            let mut before = 0.0;
            for g in gws {
                before += tokens(b, &wan, g, "surrenders")?;
            }
            let outs = loads(b, &wan, &runs)?;
            let mut after = 0.0;
            for g in gws {
                after += tokens(b, &wan, g, "surrenders")?;
            }
            let iops: f64 = outs.iter().map(|o| o.iops).sum();
            let mean = outs.iter().map(|o| o.mean).sum::<f64>() / outs.len() as f64;
            overlap.push(vec![
                delay.as_str().into(),
                format!("{:.0} %", share * 100.0).into(),
                iops.into(),
                mean.into(),
                (after - before).into(),
            ])?;
            points.push((share * 100.0, iops));
        }
        curves.push(Series::line(format!("{delay} one way"), points));
        for (g, name) in [(g0, "g0"), (g1, "g1"), (g2, "g2")] {
            stop(b, g, name);
        }
        drop(sg);
        drop(wan);
        bar.inc(1);
    }
    bar.finish_and_clear();
    r.section(
        format!(
            "Token acquisition and the fast path: {writes} sequential 64 KiB writes at depth 1, each to a segment \
             (64 KiB) of its own, in log mode, through a gateway that shares nothing (twice over the same \
             segments, the second time once the first pass is on the SG), through a shared one on segments it does not hold yet, and through it again on the same segments once those are on the SG"
        ),
        acquire,
        Some(delay_figure("A write's mean against the delay, by gateway", "a write's mean [ms]", acquire_curves)),
    );
    for n in notes {
        r.note(n);
    }
    r.section(
        format!(
            "One segment written by two shared gateways at once: random 4 KiB writes at depth 1 within one 64 KiB \
             segment from each, for {secs} s; a transfer is a token given up by one for the other (its writes \
             shipped to the SG as a group, its release beside it), the wait is a waiting write's, from its command \
             to its token"
        ),
        pingpong,
        None,
    );
    r.note(format!(
        "From the SG's revoke to the holder's release taking effect, a transfer took {}. That is the revoke out \
         (half a round trip, on the poll the holder keeps waiting at the SG; the table has the revoke's wait for \
         that poll and for the token table's record written before it goes out), the holder's writes back as a \
         group with its release beside it (half, and the journal's writes of the group and of the token table: \
         the release takes effect once the group is committed; its pieces and \
         its commit go together, the commit waiting at the SG for any piece still on its way): one round trip \
         and the data, as the goal has it. The rest grows with the dirty data a hold leaves (writes per hold × \
         4 KiB): only epochs already durable in the holder's log are shipped, so the surrender's group waits for \
         the log write, the journal writes the group and then the token table's record before the release takes \
         effect, and TCP sends the group at the pace its congestion control allows ({cc} here; BBR paces a \
         connection idle between bursts at its low bandwidth estimate, and Reno sends the group at once: \
         `--cc`). The surrender's group leaves behind the group still out rather than after its answer (groups \
         sent behind another, in the table; the SG takes them in sequence). The waiting side adds its request \
         and the grant, half a round trip each, and asks only once its own last surrender is answered, so the \
         other writes several times per hold.",
        pp_notes.join(", "),
        cc = a.cc
    ));
    r.section(
        format!(
            "A segment one gateway writes while another reads it: random 4 KiB at depth 1 within one 64 KiB \
             segment from each, for {secs} s; the reader takes the blocks it waits for with its shared grant \
             (an SG that sends them, and a gateway that asks), or reads them after it"
        ),
        reads,
        Some(delay_figure(
            "A read's mean against the delay, with its blocks sent with its grant and after it",
            "a read's mean [ms]",
            read_curves,
        )),
    );
    for n in read_notes {
        r.note(n);
    }
    r.note(
        "A read of a segment the other gateway holds exclusive waits for its token: the writer ships its \
         writes and gives the token up (downgraded, so it keeps its clean copy), then the grant comes. Sent with \
         the grant, the blocks the read waits for save it the round trip of a READ after it (seed 004 §3.4: the \
         SG passes the current data with the grant).",
    );
    r.section(
        format!(
            "Three shared gateways writing random 4 KiB at depth 4 for {secs} s, each over a span of {} MiB that \
             covers this share of the others' (0 %: disjoint; 100 %: the same blocks)",
            SPAN >> 20
        ),
        overlap,
        Some(Figure {
            title: "Three gateways' writes against the overlap of their spans".into(),
            x_label: "overlap [%]".into(),
            y_label: "writes/s, all three".into(),
            log_x: false,
            log_y: false,
            categories: Vec::new(),
            series: curves,
        }),
    );
    Ok(r)
}
