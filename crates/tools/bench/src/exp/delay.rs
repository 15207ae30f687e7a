//! `stics bench delay`: seed 000 Table 1 on the real stack — blocking 8 KiB sequential and random
//! reads and writes from one thread, on a local file, on the target with no network, and through
//! `stics wan` at one-way delays 0–8 ms on a file LUN and a null LUN, then through the gateway;
//! beside the latency model of seed 000 eq. 1.

use stics_report::plot::{Figure, Series};
use stics_report::{Column, Table};

use super::scaled;
use crate::load::Outcome;
use crate::paper;
use crate::peers::{random_file, stics_target, GatewayOptions, Wan};
use crate::{Bench, Report, Result, Stat};

/// Options of `stics bench delay`.
#[derive(Debug, Clone, clap::Args)]
pub struct Args {
    /// One-way delays, comma-separated (seed 000: 0, 1, 2, 4 and 8 ms).
    #[arg(long, value_delimiter = ',', default_value = "0ms,1ms,2ms,4ms,8ms", value_parser = stics_units::parse_duration)]
    pub delays: Vec<f64>,
    /// Bytes per request (seed 000: 8 KB).
    #[arg(long, default_value = "8KiB", value_parser = stics_units::parse_size)]
    pub size: u64,
    /// Requests per measurement at most …
    #[arg(long, default_value_t = 2000)]
    pub count: u64,
    /// … and seconds at most.
    #[arg(long, default_value_t = 10.0)]
    pub seconds: f64,
    /// TCP congestion control in the namespaces (`stics wan --cc`). Seed 000 ran FreeBSD's NewReno;
    /// BBR, Linux's default here, paces a connection that is idle between requests at its low
    /// bandwidth estimate, which adds about 2 ms to each 8 KiB request at 8 ms one way.
    #[arg(long, default_value = "reno")]
    pub cc: String,
    /// Leave out the runs through the gateway.
    #[arg(long)]
    pub no_gateway: bool,
}

/// The four microbenchmarks, in the paper's column order: (label, --op, --pattern).
const OPS: [(&str, &str, &str); 4] = [
    ("seq read", "read", "seq"),
    ("seq write", "write", "seq"),
    ("random read", "read", "random"),
    ("random write", "write", "random"),
];

/// Where the client runs and what it talks to.
struct Path<'a> {
    device: &'static str,
    at: String,
    delay: f64,
    wan: Option<&'a Wan>,
    url: String,
}

fn load(b: &Bench, p: &Path<'_>, a: &Args, op: &str, pattern: &str, span: u64) -> Result<Outcome> {
    let mut cmd = match p.wan {
        Some(w) => w.exec("host", b.stics()),
        None => b.stics_cmd(),
    };
    let count = scaled(b, a.count, a.count.min(300)).to_string();
    let secs = format!("{}s", if b.quick() { a.seconds.min(2.0) } else { a.seconds });
    let (size, span) = (a.size.to_string(), span.to_string());
    cmd.args(["bench", "load", &p.url, "--json", "--depth", "1", "--size", &size, "--op", op, "--pattern", pattern])
        .args(["--count", &count, "--seconds", &secs, "--span", &span]);
    Outcome::from_json(&b.run(&mut cmd)?.stdout)
}

/// The four benchmarks on one path, `b.reps()` times: throughput and mean response of each.
fn measure(b: &Bench, a: &Args, p: &Path<'_>, span: u64, bar: &indicatif::ProgressBar) -> Result<Row> {
    let (mut bw, mut rt): ([Vec<f64>; 4], [Vec<f64>; 4]) = Default::default();
    for _ in 0..b.reps() {
        for (i, (_, op, pattern)) in OPS.iter().enumerate() {
            let o = load(b, p, a, op, pattern, span)?;
            bw[i].push(o.bytes_per_sec);
            rt[i].push(o.mean);
            bar.inc(1);
        }
    }
    Ok((p.at.clone(), p.device, p.delay, bw.map(|v| Stat::of(&v)), rt.map(|v| Stat::of(&v))))
}

pub fn run(b: &Bench, a: &Args) -> Result<Report> {
    let span: u64 = if b.quick() { 256 << 20 } else { 1 << 30 };
    let delays: Vec<f64> = if b.quick() && a.delays.len() > 3 { vec![0.0, 0.001, 0.008] } else { a.delays.clone() };
    let file = random_file(b, "lun.img", span)?;
    // Local, target and WAN rows alike read the file, or the file behind --remote-disk's model.
    let file_spec = b.remote_medium(&file);
    let steps = (2 + delays.len() * if a.no_gateway { 2 } else { 3 }) * OPS.len() * b.reps();
    let bar = b.bar(steps as u64, "delay");
    let mut rows = Vec::new();
    // Local: the client reads and writes the file itself; target: over loopback, no WAN.
    let local = Path { device: "file", at: "local".into(), delay: f64::NAN, wan: None, url: file_spec.clone() };
    rows.push(measure(b, a, &local, span, &bar)?);
    {
        let t = stics_target(b, "stics-target", &[&file_spec])?;
        let p = Path { device: "file", at: "target".into(), delay: f64::NAN, wan: None, url: t.url.clone() };
        rows.push(measure(b, a, &p, span, &bar)?);
    }
    let wan = Wan::up(b, &format!("sbdelay{}", std::process::id()), &["--delay", "0ms", "--cc", &a.cc])?;
    let target = wan.stics_target(b, "wan-target", "storage", &[&file_spec, &format!("null:{span}")])?;
    let null_url = format!("{}1", target.url.trim_end_matches('0'));
    for &d in &delays {
        let ms = format!("{}ms", d * 1e3);
        wan.set(b, &["--delay", &ms])?;
        let at = format!("{} ms", d * 1e3);
        let p = Path { device: "file", at: at.clone(), delay: d, wan: Some(&wan), url: target.url.clone() };
        rows.push(measure(b, a, &p, span, &bar)?);
        let p = Path { device: "null", at: at.clone(), delay: d, wan: Some(&wan), url: null_url.clone() };
        rows.push(measure(b, a, &p, span, &bar)?);
        if !a.no_gateway {
            let log = b.work().join("gateway-log.img");
            let opts = GatewayOptions::usual("log", &log, "512MiB");
            let g = wan.gateway(b, "gateway", "host", &target.url, &opts)?;
            let p = Path { device: "gateway", at, delay: d, wan: Some(&wan), url: g.url.clone() };
            let row = measure(b, a, &p, span, &bar);
            wan.gateway_stop(b, g, &target.url, &log)?;
            rows.push(row?);
        }
    }
    bar.finish_and_clear();
    drop(target);
    drop(wan);
    report(b, a, &rows)
}

type Row = (String, &'static str, f64, [Stat; 4], [Stat; 4]);

fn report(b: &Bench, a: &Args, rows: &[Row]) -> Result<Report> {
    let mut t = Table::new(vec![
        Column::new("at", "where", "", 1.0),
        Column::new("device", "LUN", "", 1.0),
        Column::new("op", "benchmark", "", 1.0),
        Column::new("throughput", "throughput", "MB/s", 1e-6),
        Column::new("paper_throughput", "paper", "MB/s", 1e-6),
        Column::new("response", "response", "ms", 1e3),
        Column::new("paper_response", "paper", "ms", 1e3),
        Column::new("model", "eq. 1", "ms", 1e3),
        Column::ratio("model_ratio", "eq. 1 / ours", "model", "response"),
        Column::new("spread", "spread", "%", 100.0),
    ])?;
    let mut curves: Vec<(String, Vec<(f64, f64)>)> = Vec::new();
    // Seed 000's DDYS sequential writes, the one curve of Table 1 its text prints.
    let mut paper_pts = Vec::new();
    for (i, (op, _, _)) in OPS.iter().enumerate() {
        for device in ["file", "null", "gateway"] {
            // Eq. 1 with T_disk + T_iSCSI from this LUN's own 0 ms row: the model then predicts
            // what each millisecond of one-way delay adds (two of them per request).
            let base = rows.iter().find(|r| r.1 == device && r.2 == 0.0).map_or(f64::NAN, |r| r.4[i].median);
            let mut pts = Vec::new();
            for r in rows.iter().filter(|r| r.1 == device || (device == "file" && r.2.is_nan())) {
                if device != "file" && r.2.is_nan() {
                    continue;
                }
                // The model describes the uncached path; the gateway is what hides its terms.
                let model = if r.2.is_nan() || device == "gateway" {
                    f64::NAN
                } else {
                    stics_model::latency::IoLatency { disk: 0.0, net_delay: r.2, iscsi: base }.blocking()
                };
                // Seed 000 prints only the DDYS disk's sequential writes in its text.
                let prow = format!("sequential write, ddys, {}", r.0);
                let (pt, pr) = if *op == "seq write" && device == "file" {
                    (
                        paper::base("000", "Table 1", &prow, "throughput"),
                        paper::base("000", "Table 1", &prow, "response time"),
                    )
                } else {
                    (f64::NAN, f64::NAN)
                };
                t.push(vec![
                    r.0.clone().into(),
                    r.1.into(),
                    (*op).into(),
                    r.3[i].median.into(),
                    pt.into(),
                    r.4[i].median.into(),
                    pr.into(),
                    model.into(),
                    r.4[i].spread().max(r.3[i].spread()).into(),
                ])?;
                if !r.2.is_nan() {
                    pts.push((r.2 * 1e3, r.4[i].median * 1e3));
                    if pr.is_finite() {
                        paper_pts.push((r.2 * 1e3, pr * 1e3));
                    }
                }
            }
            if !pts.is_empty() && device != "null" {
                curves.push((format!("{device}, {op}"), pts));
            }
        }
    }
    let mut series: Vec<Series> = curves.into_iter().map(|(l, p)| Series::line(l, p)).collect();
    if let Some(base) = rows.iter().find(|r| r.1 == "file" && r.2 == 0.0).map(|r| r.4[0].median) {
        let pts = rows
            .iter()
            .filter(|r| r.1 == "file" && !r.2.is_nan())
            .map(|r| (r.2 * 1e3, (base + 2.0 * r.2) * 1e3))
            .collect();
        series.push(Series::scatter("eq. 1, file seq read", pts));
    }
    if !paper_pts.is_empty() {
        series.push(Series::scatter("paper: DDYS seq write", paper_pts));
    }
    let fig = Figure {
        title: format!("Blocking {} KiB I/O from one thread against one-way delay", a.size / 1024),
        x_label: "one-way delay [ms]".into(),
        y_label: "response time [ms]".into(),
        log_x: false,
        log_y: false,
        categories: Vec::new(),
        series,
    };
    let mut r = Report::new(
        "delay",
        "Seed 000 Table 1: blocking 8 KiB I/O from one thread against one-way network delay, with eq. 1 beside it",
    );
    r.section(
        format!(
            "Throughput and mean response, {} repetition(s); local = the file itself, target = stics target on loopback, \
             N ms = through stics wan (file LUN, null LUN, and the gateway in log mode in front of the file LUN){}",
            b.reps(),
            super::fs::setup(b)
        ),
        t,
        Some(fig),
    );
    r.note(match b.remote_disk() {
        None => "Seed 000's disks become a page-cached file here, so T_disk is microseconds and the network and \
                 protocol terms dominate from 0 ms on; the paper's 8 KB response at 0 ms (0.77 ms for DDYS sequential \
                 writes) was 0.5 ms of SCSI over IP plus 0.24 ms of disk, where ours is the 0 ms row (--remote-disk \
                 ddys puts the disk back)."
            .to_owned(),
        Some(m) => format!(
            "The file sits behind the {m} disk model in every row (local included), so T_disk is that disk's service \
             time as `stics bench disk` checks it; the paper's 8 KB response at 0 ms (0.77 ms for DDYS sequential \
             writes) was 0.5 ms of SCSI over IP plus 0.24 ms of disk."
        ),
    });
    r.note(
        "Eq. 1 (T = T_disk + 2·T_netDelay + T_iSCSI) is fitted at each LUN's 0 ms row and predicts the rest: \
         eq. 1 / ours near 1 means each millisecond of one-way delay costs two, as the paper found for sequential I/O.",
    );
    r.note(format!(
        "TCP congestion control in the namespaces: {}. Under BBR (this kernel's default) the same 8 KiB reads took \
         18.9 ms at 8 ms one way instead of 16.4 ms: BBR paces a connection that idles between requests at its \
         app-limited bandwidth estimate, a term eq. 1 does not have.",
        a.cc
    ));
    r.note(
        "Through the gateway, writes are acknowledged once in the local log and reads hit its cache or read-ahead, so \
         the delay vanishes where the paper's Fig. 5 says a host-side cache hides it; random reads of blocks never \
         written still cross the WAN.",
    );
    Ok(r)
}
