//! `stics model`: the analytical and queueing models of seeds 003 and 000 from the command line, as tables,
//! CSV or JSON, with one-parameter sweeps that can be drawn as PNG curves.

use std::path::PathBuf;

use anyhow::{bail, Context};
use clap::{Subcommand, ValueEnum};
use indicatif::{ProgressBar, ProgressStyle};
use stics_model::latency::{single_thread_throughput, IoLatency};
use stics_model::queue::{capacity, offered_erlang, rate_for_erlang};
use stics_model::sim::{simulate, Arrivals, Operation, SimConfig};
use stics_model::units::{parse_duration, parse_erlang, parse_probability, parse_rate, parse_size, parse_size_or_inf};
use stics_model::{Iscsi, SizeDist, Tcp, WriteModel};
use stics_report::{fmt, Axis, Cell, Chart, Column, Curve, Format, Grid, Point, Table};

/// Analytical and queueing models of iSCSI over TCP (seeds 000 and 003).
#[derive(clap::Args)]
#[command(
    long_about = "Analytical and queueing models of iSCSI over TCP, for sizing a deployment before buying a line \
and for drawing every measurement next to its model.\n\n\
Seed 003 (Gauger et al., Broadnets 2005): TCP throughput, single-write time (eqs. 1-6), session capacity and a \
simulation of non-interleaved and interleaved sessions under bursty traffic. Seed 000 (Ng et al., FAST 2002): \
blocking I/O latency T = T_disk + 2 T_netDelay + T_iSCSI.\n\n\
Defaults are the papers' parameters. Options that take a comma list (--rtt 0.2ms,2ms,10ms) give one result per \
value; --sweep NAME=FROM..TO varies one parameter, and --plot FILE.png draws the curves. Units, as every stics \
command reads them: durations 10ms, 500us; sizes 64KiB (= 64k, powers of 1024 for KiB, MiB, GiB, TiB and k, M, G, \
T), 6kB (= 6KB = 6000 B, powers of 1000 for kB, MB, GB, TB in any case); rates 1gbit, 100mbit, 125MB/s; \
probabilities 1e-3 or 0.1%."
)]
pub struct Args {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// TCP throughput B = min(C·MSS/(RTT·√p), W_max/RTT, B_acc), its limit, p_c and the knee RTTs.
    #[command(long_about = "TCP throughput of a long-lived connection (seed 003, section II.C):\n\n  \
B = min(B_CWnd, B_RWnd, B_acc),  B_CWnd = C·MSS/(RTT·√p),  B_RWnd = W_max/RTT\n\n\
and which term binds. Also the critical loss p_c = (C·MSS/W_max)² (above it congestion avoidance limits, below \
it the receive window) and the knee RTTs W_max/B_acc and C·MSS/(B_acc·√p) where the link stops being the limit. \
Sweep rtt or loss; --plot draws B (Fig. 3's TCP curve).")]
    Tcp(TcpArgs),
    /// Single write: rounds N, T_write = S/B + N·(T_proc + RTT) and throughput (eqs. 1-6).
    #[command(long_about = "Time and throughput of one iSCSI write of S bytes (seed 003, section II.A):\n\n  \
N = 1 + ceil(max(0, (S - b_init)/b_max))          (eq. 2)\n  \
T_write = S/B + N·(T_proc + RTT)                  (eq. 1)\n\n\
with B from the TCP model (see `stics model tcp`), b_init = FirstBurstLength, b_max = MaxBurstLength. --size inf \
gives the limit for very large requests (eq. 3). With --size-dist, the mean over a size distribution: \
T̄ = S̄/B + N̄·(T_proc + RTT) (eqs. 5-6). Also printed: the eq. 3 and eq. 4 throughput bounds. Sweep size, rtt, \
loss or proc; --plot draws throughput (Figs. 3, 5) or, with --y time, the write time (Fig. 4).")]
    Write(WriteArgs),
    /// Largest offered traffic, in Erlang of the link rate, with and without interleaving.
    #[command(long_about = "Capacity of one iSCSI session under dynamic traffic (seed 003, sections II.B, IV.B). \
Offered traffic A = λ·S̄/B_acc is measured against the link rate. Without interleaving the session is one FIFO \
server whose service is the whole write, so it saturates at λ = 1/T̄_write (eq. 5); with interleaving the \
transmission queue (λ·S̄ = B) or the processing queue (λ·N̄·T_proc = 1) saturates first. At RTT 2 ms, p = 1e-6, \
T_proc = 0 this gives the paper's 0.26 and 0.022 Erl. Sizes: --size S, --size-dist FILE, or by default the \
shipped seed-003 distribution (mean 6 KiB). Sweep rtt, loss or proc.")]
    Capacity(CapacityArgs),
    /// Discrete-event simulation of non-interleaved and interleaved sessions: mean and percentile write times.
    #[command(long_about = "Discrete-event simulation of the two queueing models of seed 003 (Fig. 2). \
Non-interleaved: a FIFO single server whose service is the write time of eq. 1. Interleaved: each request loops \
once per burst through a FIFO transmission queue (burst/B), a FIFO processing queue (T_proc) and an \
infinite-server RTT delay. Arrivals: lognormal inter-arrival times, ln X ~ N(μ, σ²) in seconds with \
(μ, σ²) = (-4.5, 6.25) as in the paper, or Poisson at the same mean rate; --load A rescales either to offer A \
Erlang of the link rate (the lognormal keeps σ²). Sizes: the shipped empirical distribution (mean 6 KiB), \
--size-dist FILE or --size S. The same --seed repeats a run exactly, and both modes see the same requests. \
Prints mean, standard error (batch means) and percentiles of the write time, next to eq. 5 and the capacity. \
Sweep rtt (Figs. 6-8), proc, loss or load (Fig. 9); progress is shown on a terminal.")]
    Simulate(SimArgs),
    /// Seed 000: blocking I/O latency T = T_disk + 2·T_netDelay + T_iSCSI and the random-write masking rule.
    #[command(long_about = "Latency of one blocking I/O through the gateways (seed 000, eq. 1):\n\n  \
T = T_disk + 2·T_netDelay + T_iSCSI\n\n\
with T_netDelay the one-way delay, and the single-thread throughput block/T. Random writes to a busy disk \
(seed 000, Fig. 3): the disk acknowledges a write only when the previous one has reached the media, so the round \
trip overlaps the flush and a writer sees T_iSCSI + max(T_disk, 2·T_netDelay): the network is masked while \
2·T_netDelay <= T_disk. Defaults: the delays of its Table 1 (0-8 ms one way), T_iSCSI = 0.408 ms (8 KB, Fig. 2), \
T_disk = 0.24 ms (a write the disk cache acknowledges at once). Sweep delay or disk.")]
    Latency(LatencyArgs),
}

/// The network path (seed 003, section II.C).
#[derive(clap::Args)]
struct NetArgs {
    /// Round-trip time; a comma list gives one result per value (paper: 0.2ms, 2ms, 10ms).
    #[arg(long, value_delimiter = ',', value_parser = parse_duration, default_value = "2ms")]
    rtt: Vec<f64>,
    /// Packet loss probability p, e.g. 1e-3 or 0.1%; comma list allowed (paper: 1e-2, 1e-3, 1e-6).
    #[arg(long, value_delimiter = ',', value_parser = parse_probability, default_value = "1e-6")]
    loss: Vec<f64>,
    /// Maximum segment size b_MSS (Ethernet).
    #[arg(long, value_parser = parse_size, default_value = "1460B")]
    mss: f64,
    /// Maximum advertised receive window W_max.
    #[arg(long, value_parser = parse_size, default_value = "64KiB")]
    rwnd: f64,
    /// Bottleneck (access) link rate B_acc.
    #[arg(long, value_parser = parse_rate, default_value = "1gbit")]
    link: f64,
    /// Mathis constant C (random loss, delayed ACKs).
    #[arg(long = "mathis-c", default_value_t = 0.93)]
    mathis_c: f64,
}

impl NetArgs {
    fn tcp(&self, rtt: f64, loss: f64) -> Tcp {
        Tcp { rtt, loss, mss: self.mss, rwnd: self.rwnd, link: self.link, c: self.mathis_c }
    }
}

/// The iSCSI session (seed 003, section II.A).
#[derive(clap::Args)]
struct SessionArgs {
    /// Processing delay T_proc per burst (initiator + target); comma list allowed (paper: 0ms, 1ms, 5ms).
    #[arg(long, value_delimiter = ',', value_parser = parse_duration, default_value = "0ms")]
    proc: Vec<f64>,
    /// FirstBurstLength b_init: unsolicited data sent with the command.
    #[arg(long = "first-burst", value_parser = parse_size, default_value = "64KiB")]
    first_burst: f64,
    /// MaxBurstLength b_max: data sent per R2T.
    #[arg(long = "max-burst", value_parser = parse_size, default_value = "256KiB")]
    max_burst: f64,
}

impl SessionArgs {
    fn model(&self, net: &NetArgs, rtt: f64, loss: f64, proc: f64) -> anyhow::Result<WriteModel> {
        let m = WriteModel {
            tcp: net.tcp(rtt, loss),
            iscsi: Iscsi { first_burst: self.first_burst, max_burst: self.max_burst, proc },
        };
        m.validate()?;
        Ok(m)
    }
}

/// Output format, sweep and plot.
#[derive(clap::Args)]
struct OutArgs {
    /// Vary one parameter: NAME=FROM..TO, e.g. rtt=0.1ms..100ms; NAME is one of the parameters named under
    /// "Sweep" in this command's --help.
    #[arg(long)]
    sweep: Option<String>,
    /// Number of points of a sweep.
    #[arg(long, default_value_t = 25)]
    points: usize,
    /// Space sweep points logarithmically (both ends above zero) and draw log axes.
    #[arg(long)]
    log: bool,
    /// Print JSON in SI base units (seconds, bytes, bit/s): one object for one result, else an array.
    #[arg(long, conflicts_with = "csv")]
    json: bool,
    /// Print CSV with a header row, in the units of --json.
    #[arg(long)]
    csv: bool,
    /// Draw the sweep's curves into this PNG file (needs --sweep and a TrueType font, e.g. fonts-dejavu-core).
    #[arg(long, requires = "sweep")]
    plot: Option<PathBuf>,
}

#[derive(clap::Args)]
struct TcpArgs {
    #[command(flatten)]
    net: NetArgs,
    #[command(flatten)]
    out: OutArgs,
}

/// Request sizes: one or more fixed sizes or a distribution.
#[derive(clap::Args)]
struct SizeArgs {
    /// Request size S, e.g. 6KiB (= 6k = 6144 B; 6kB is 6000 B), 264KiB or inf (write only); comma list allowed.
    /// Default: 6KiB for write, the shipped seed-003 distribution (mean 6 KiB) for capacity and simulate.
    #[arg(long, value_delimiter = ',', value_parser = parse_size_or_inf, conflicts_with = "size_dist")]
    size: Vec<f64>,
    /// File of "size weight" lines (e.g. "4KiB 0.45"; # comments); `seed003` names the shipped distribution.
    #[arg(long = "size-dist", value_name = "FILE")]
    size_dist: Option<String>,
}

impl SizeArgs {
    fn dist(&self) -> anyhow::Result<Option<SizeDist>> {
        let Some(name) = &self.size_dist else { return Ok(None) };
        if name == "seed003" {
            return Ok(Some(SizeDist::seed003()));
        }
        let text = std::fs::read_to_string(name).with_context(|| format!("reading size distribution {name}"))?;
        Ok(Some(SizeDist::parse(&text).with_context(|| format!("in {name}"))?))
    }

    /// The distributions to use when the model needs one: fixed sizes, the file, or the shipped one.
    fn dists(&self) -> anyhow::Result<Vec<f64>> {
        if let Some(s) = self.size.iter().find(|s| !s.is_finite()) {
            bail!("--size {s} is not allowed here: the queueing models need finite requests");
        }
        Ok(self.size.clone())
    }
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum YAxis {
    /// Throughput S/T_write.
    Throughput,
    /// Write time T_write.
    Time,
}

#[derive(clap::Args)]
struct WriteArgs {
    #[command(flatten)]
    sizes: SizeArgs,
    #[command(flatten)]
    net: NetArgs,
    #[command(flatten)]
    session: SessionArgs,
    /// What --plot draws against the swept parameter.
    #[arg(long, value_enum, default_value_t = YAxis::Throughput)]
    y: YAxis,
    #[command(flatten)]
    out: OutArgs,
}

#[derive(clap::Args)]
struct CapacityArgs {
    #[command(flatten)]
    sizes: SizeArgs,
    #[command(flatten)]
    net: NetArgs,
    #[command(flatten)]
    session: SessionArgs,
    #[command(flatten)]
    out: OutArgs,
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum ModeArg {
    /// One request at a time (Fig. 2a).
    NonInterleaved,
    /// Bursts of several requests share the connection (Fig. 2b).
    Interleaved,
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum ArrivalArg {
    /// Lognormal inter-arrival times (--mu, --sigma2): seed 003's bursty empirical model.
    Lognormal,
    /// Exponential inter-arrival times at the same mean rate.
    Poisson,
}

#[derive(clap::Args)]
struct SimArgs {
    /// Session operation(s) to simulate; comma list.
    #[arg(long, value_enum, value_delimiter = ',', default_values = ["non-interleaved", "interleaved"])]
    mode: Vec<ModeArg>,
    /// Arrival process(es); comma list.
    #[arg(long, value_enum, value_delimiter = ',', default_value = "lognormal")]
    arrivals: Vec<ArrivalArg>,
    /// μ of the lognormal inter-arrival time (ln of seconds); sets the rate unless --load is given.
    #[arg(long, default_value_t = -4.5, allow_hyphen_values = true)]
    mu: f64,
    /// σ² of the lognormal inter-arrival time: its burstiness.
    #[arg(long, default_value_t = 6.25)]
    sigma2: f64,
    /// Offered traffic in Erlang of the link rate (λ·S̄/B_acc); comma list. Default: the rate of --mu/--sigma2.
    #[arg(long, value_delimiter = ',', value_parser = parse_erlang)]
    load: Vec<f64>,
    #[command(flatten)]
    sizes: SizeArgs,
    #[command(flatten)]
    net: NetArgs,
    #[command(flatten)]
    session: SessionArgs,
    /// Requests measured per run.
    #[arg(long, default_value_t = 200_000)]
    requests: u64,
    /// Requests simulated before measuring.
    #[arg(long, default_value_t = 5_000)]
    warmup: u64,
    /// Seed of the random streams; the same seed repeats a run exactly.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    #[command(flatten)]
    out: OutArgs,
}

#[derive(clap::Args)]
struct LatencyArgs {
    /// One-way network delay T_netDelay; comma list (default: seed 000 Table 1's delays).
    #[arg(long, value_delimiter = ',', value_parser = parse_duration, default_value = "0ms,1ms,2ms,4ms,8ms")]
    delay: Vec<f64>,
    /// Disk time T_disk (access + transfer); comma list allowed.
    #[arg(long, value_delimiter = ',', value_parser = parse_duration, default_value = "0.24ms")]
    disk: Vec<f64>,
    /// SCSI-over-IP processing T_iSCSI (0.408 ms for 8 KB in seed 000, Fig. 2).
    #[arg(long, value_parser = parse_duration, default_value = "0.408ms")]
    iscsi: f64,
    /// I/O size, for the single-thread throughput.
    #[arg(long, value_parser = parse_size, default_value = "8KiB")]
    block: f64,
    #[command(flatten)]
    out: OutArgs,
}

pub fn run(args: Args) -> anyhow::Result<()> {
    match args.cmd {
        Cmd::Tcp(a) => tcp(a),
        Cmd::Write(a) => write(a),
        Cmd::Capacity(a) => capacity_cmd(a),
        Cmd::Simulate(a) => simulate_cmd(a),
        Cmd::Latency(a) => latency(a),
    }
}

// ---------------------------------------------------------------------------------------------------------
// Parameters, output and plots, through stics-report.

/// Applies `--sweep` to the parameters and expands them into points, one result row each. Returns the
/// swept parameter.
fn expand(axes: Vec<Axis>, out: &OutArgs) -> anyhow::Result<(Vec<Point>, Option<String>)> {
    let mut grid = Grid::new(axes);
    if let Some(spec) = &out.sweep {
        grid.sweep(spec, out.points, out.log)?;
    }
    Ok((grid.points()?, grid.swept().map(str::to_string)))
}

/// A parameter that `--sweep` can vary, read with `parse` and shown in legends with `show`.
fn knob(
    name: &'static str,
    values: Vec<f64>,
    parse: fn(&str) -> stics_model::Result<f64>,
    show: fn(f64) -> String,
) -> Axis {
    Axis::new(name, values, show).sweepable(parse)
}

fn fmt_ms(v: f64) -> String {
    fmt::scaled(v, 1e3, "ms")
}

fn fmt_kib(v: f64) -> String {
    if v.is_infinite() {
        "inf".into()
    } else {
        fmt::scaled(v, 1.0 / 1024.0, "KiB")
    }
}

/// What `--plot` draws: the y columns as curves against the swept parameter's column.
struct PlotSpec {
    title: &'static str,
    /// The y axis label; empty for the first curve's column.
    y_label: &'static str,
    /// Sweepable parameter name → its column key.
    x_keys: &'static [(&'static str, &'static str)],
    curves: Vec<Curve>,
    log_y: bool,
}

/// Prints the table in the chosen format and draws the plot if asked.
fn emit(t: &Table, out: &OutArgs, swept: Option<String>, spec: PlotSpec) -> anyhow::Result<()> {
    let format = if out.json {
        Format::Json
    } else if out.csv {
        Format::Csv
    } else {
        Format::Text
    };
    print!("{}", t.render(format)?);
    if let Some(path) = &out.plot {
        let x_name = swept.context("--plot needs --sweep")?;
        let x = spec.x_keys.iter().find(|(n, _)| *n == x_name).map(|x| x.1).context("no x column for the sweep")?;
        let chart = Chart {
            title: spec.title.into(),
            x: x.into(),
            curves: spec.curves,
            y_label: (!spec.y_label.is_empty()).then(|| spec.y_label.into()),
            default_label: "model".into(),
            log_x: out.log,
            log_y: out.log && spec.log_y,
        };
        chart.draw(t, path)?;
        eprintln!("stics model: wrote {}", path.display());
    }
    Ok(())
}

// Columns shared by several subcommands.
const RTT: Column = Column::new("rtt_s", "RTT", "ms", 1e3);
const LOSS: Column = Column::new("loss", "loss", "", 1.0);
const PROC: Column = Column::new("proc_s", "T_proc", "ms", 1e3);
const B: Column = Column::new("tcp_throughput_bps", "B", "Mbit/s", 1e-6);
const LIMIT: Column = Column::new("limit", "limit", "", 1.0);
const MBIT: f64 = 1e-6;

/// Shorthand for the many columns below.
const fn col(key: &'static str, head: &'static str, unit: &'static str, scale: f64) -> Column {
    Column::new(key, head, unit, scale)
}

fn bits(bytes_per_s: f64) -> f64 {
    bytes_per_s * 8.0
}

fn show_loss(v: f64) -> String {
    format!("{v:e}")
}

// ---------------------------------------------------------------------------------------------------------
// Subcommands.

fn tcp(a: TcpArgs) -> anyhow::Result<()> {
    let knobs = vec![
        knob("rtt", a.net.rtt.clone(), parse_duration, fmt_ms),
        knob("loss", a.net.loss.clone(), parse_probability, show_loss),
    ];
    let (points, swept) = expand(knobs, &a.out)?;
    let mut t = Table::new(vec![
        RTT,
        LOSS,
        col("throughput_bps", "B", "Mbit/s", MBIT),
        col("limit", "limit", "", 1.0),
        col("cwnd_limit_bps", "B_CWnd", "Mbit/s", MBIT),
        col("rwnd_limit_bps", "B_RWnd", "Mbit/s", MBIT),
        col("link_bps", "B_acc", "Mbit/s", MBIT),
        col("critical_loss", "p_c", "", 1.0),
        col("knee_rtt_s", "knee RTT", "ms", 1e3),
        col("knee_rtt_rwnd_s", "W_max/B_acc", "ms", 1e3),
        col("knee_rtt_cwnd_s", "C·MSS/(B_acc·√p)", "ms", 1e3),
    ])?;
    for p in points {
        let tcp = a.net.tcp(p.get("rtt"), p.get("loss"));
        tcp.validate()?;
        let b = tcp.throughput();
        let row = vec![
            Cell::Num(tcp.rtt),
            Cell::Num(tcp.loss),
            Cell::Num(bits(b.bytes_per_s)),
            Cell::Text(b.limit.as_str().into()),
            Cell::Num(bits(tcp.cwnd_limit())),
            Cell::Num(bits(tcp.rwnd_limit())),
            Cell::Num(bits(tcp.link)),
            Cell::Num(tcp.critical_loss()),
            Cell::Num(tcp.knee_rtt()),
            Cell::Num(tcp.knee_rtt_rwnd()),
            Cell::Num(tcp.knee_rtt_cwnd()),
        ];
        t.push_at(&p, row)?;
    }
    let spec = PlotSpec {
        title: "TCP throughput (seed 003, II.C)",
        y_label: "",
        x_keys: &[("rtt", "rtt_s"), ("loss", "loss")],
        curves: vec![Curve::new("throughput_bps")],
        log_y: true,
    };
    emit(&t, &a.out, swept, spec)
}

fn write(a: WriteArgs) -> anyhow::Result<()> {
    let dist = a.sizes.dist()?;
    let sizes = if a.sizes.size.is_empty() { vec![6.0 * 1024.0] } else { a.sizes.size.clone() };
    let mut knobs = vec![
        knob("rtt", a.net.rtt.clone(), parse_duration, fmt_ms),
        knob("loss", a.net.loss.clone(), parse_probability, show_loss),
        knob("proc", a.session.proc.clone(), parse_duration, fmt_ms),
    ];
    if dist.is_none() {
        knobs.insert(0, knob("size", sizes, parse_size_or_inf, fmt_kib));
    }
    let (points, swept) = expand(knobs, &a.out)?;
    let mut cols = vec![RTT, LOSS, PROC, B, LIMIT];
    if dist.is_some() {
        cols.insert(0, col("mean_size_bytes", "mean S", "KiB", 1.0 / 1024.0));
        cols.extend([
            col("mean_rounds", "mean N", "", 1.0),
            col("mean_write_time_s", "mean T_write", "ms", 1e3),
            col("throughput_bps", "throughput", "Mbit/s", MBIT),
        ]);
    } else {
        cols.insert(0, col("size_bytes", "S", "KiB", 1.0 / 1024.0));
        cols.extend([
            col("rounds", "N", "", 1.0),
            col("trans_time_s", "T_trans", "ms", 1e3),
            col("write_time_s", "T_write", "ms", 1e3),
            col("throughput_bps", "throughput", "Mbit/s", MBIT),
        ]);
    }
    cols.extend([
        col("eq3_bound_bps", "eq.3 bound", "Mbit/s", MBIT),
        col("eq4_bound_bps", "eq.4 bound", "Mbit/s", MBIT),
    ]);
    let mut t = Table::new(cols)?;
    for p in points {
        let m = a.session.model(&a.net, p.get("rtt"), p.get("loss"), p.get("proc"))?;
        let b = m.tcp.throughput();
        let mut row = vec![
            Cell::Num(m.tcp.rtt),
            Cell::Num(m.tcp.loss),
            Cell::Num(m.iscsi.proc),
            Cell::Num(bits(b.bytes_per_s)),
            Cell::Text(b.limit.as_str().into()),
        ];
        if let Some(d) = &dist {
            let w = m.mean_write(d);
            row.insert(0, Cell::Num(w.mean_size));
            row.extend([Cell::Num(w.mean_rounds), Cell::Num(w.mean_write_time), Cell::Num(bits(w.throughput))]);
        } else {
            let w = m.write(p.get("size"));
            row.insert(0, Cell::Num(w.size));
            row.extend([
                Cell::Num(w.rounds),
                Cell::Num(w.trans_time),
                Cell::Num(w.write_time),
                Cell::Num(bits(w.throughput)),
            ]);
        }
        row.extend([Cell::Num(bits(m.large_request_bound())), Cell::Num(bits(m.small_request_bound()))]);
        t.push_at(&p, row)?;
    }
    let y = match (a.y, dist.is_some()) {
        (YAxis::Throughput, _) => "throughput_bps",
        (YAxis::Time, true) => "mean_write_time_s",
        (YAxis::Time, false) => "write_time_s",
    };
    let spec = PlotSpec {
        title: if a.y == YAxis::Time {
            "iSCSI write time (seed 003, eq. 1)"
        } else {
            "iSCSI throughput (seed 003, eq. 1)"
        },
        y_label: "",
        x_keys: &[("rtt", "rtt_s"), ("loss", "loss"), ("proc", "proc_s"), ("size", "size_bytes")],
        curves: vec![Curve::new(y)],
        log_y: true,
    };
    emit(&t, &a.out, swept, spec)
}

/// The size distribution a queueing model uses: `--size`, `--size-dist` or the shipped one.
fn queue_dist(sizes: &SizeArgs) -> anyhow::Result<(Vec<f64>, Option<SizeDist>)> {
    let fixed = sizes.dists()?;
    let dist = match sizes.dist()? {
        Some(d) => Some(d),
        None if fixed.is_empty() => Some(SizeDist::seed003()),
        None => None,
    };
    Ok((fixed, dist))
}

fn dist_for(point: &Point, dist: Option<&SizeDist>) -> anyhow::Result<SizeDist> {
    match dist {
        Some(d) => Ok(d.clone()),
        None => Ok(SizeDist::fixed(point.get("size"))?),
    }
}

fn capacity_cmd(a: CapacityArgs) -> anyhow::Result<()> {
    let (fixed, dist) = queue_dist(&a.sizes)?;
    let mut knobs = vec![
        knob("rtt", a.net.rtt.clone(), parse_duration, fmt_ms),
        knob("loss", a.net.loss.clone(), parse_probability, show_loss),
        knob("proc", a.session.proc.clone(), parse_duration, fmt_ms),
    ];
    if dist.is_none() {
        knobs.push(knob("size", fixed, parse_size, fmt_kib));
    }
    let (points, swept) = expand(knobs, &a.out)?;
    let mut t = Table::new(vec![
        RTT,
        LOSS,
        PROC,
        col("mean_size_bytes", "mean S", "KiB", 1.0 / 1024.0),
        col("mean_rounds", "mean N", "", 1.0),
        B,
        LIMIT,
        col("interleaved_erlang", "interleaved", "Erl", 1.0),
        col("interleaved_bottleneck", "bottleneck", "", 1.0),
        col("interleaved_rate_per_s", "interleaved", "req/s", 1.0),
        col("non_interleaved_erlang", "non-interleaved", "Erl", 1.0),
        col("non_interleaved_rate_per_s", "non-interleaved", "req/s", 1.0),
    ])?;
    for p in points {
        let m = a.session.model(&a.net, p.get("rtt"), p.get("loss"), p.get("proc"))?;
        let d = dist_for(&p, dist.as_ref())?;
        if d.mean() <= 0.0 {
            bail!("the mean request size is zero: offered traffic is undefined");
        }
        let c = capacity(&m, &d);
        let b = m.tcp.throughput();
        let row = vec![
            Cell::Num(m.tcp.rtt),
            Cell::Num(m.tcp.loss),
            Cell::Num(m.iscsi.proc),
            Cell::Num(d.mean()),
            Cell::Num(d.mean_rounds(&m.iscsi)),
            Cell::Num(bits(b.bytes_per_s)),
            Cell::Text(b.limit.as_str().into()),
            Cell::Num(c.interleaved_erlang),
            Cell::Text(c.interleaved_bottleneck.as_str().into()),
            Cell::Num(c.interleaved_rate),
            Cell::Num(c.non_interleaved_erlang),
            Cell::Num(c.non_interleaved_rate),
        ];
        t.push_at(&p, row)?;
    }
    let spec = PlotSpec {
        title: "Session capacity (seed 003, IV.B)",
        y_label: "max offered traffic [Erl]",
        x_keys: &[("rtt", "rtt_s"), ("loss", "loss"), ("proc", "proc_s"), ("size", "mean_size_bytes")],
        curves: vec![
            Curve::new("interleaved_erlang").prefix("interleaved"),
            Curve::new("non_interleaved_erlang").prefix("non-interleaved"),
        ],
        log_y: true,
    };
    emit(&t, &a.out, swept, spec)
}

fn simulate_cmd(a: SimArgs) -> anyhow::Result<()> {
    let (fixed, dist) = queue_dist(&a.sizes)?;
    let show_mode = |v: f64| if v == 0.0 { "non-interleaved".to_string() } else { "interleaved".to_string() };
    let show_arr = |v: f64| if v == 0.0 { "lognormal".to_string() } else { "poisson".to_string() };
    let lognormal = Arrivals::LogNormal { mu: a.mu, sigma2: a.sigma2 };
    if !(a.mu.is_finite() && a.sigma2.is_finite() && a.sigma2 >= 0.0) {
        bail!("--mu must be finite and --sigma2 finite and non-negative");
    }
    // Without --load the offered traffic is the one of the lognormal's own rate, NaN marks "use --mu".
    let load = if a.load.is_empty() { vec![f64::NAN] } else { a.load.clone() };
    let mut knobs = vec![
        Axis::new("mode", a.mode.iter().map(|m| f64::from(u8::from(*m == ModeArg::Interleaved))).collect(), show_mode),
        Axis::new(
            "arrivals",
            a.arrivals.iter().map(|m| f64::from(u8::from(*m == ArrivalArg::Poisson))).collect(),
            show_arr,
        ),
        knob("rtt", a.net.rtt.clone(), parse_duration, fmt_ms),
        knob("loss", a.net.loss.clone(), parse_probability, show_loss),
        knob("proc", a.session.proc.clone(), parse_duration, fmt_ms),
        knob("load", load, parse_erlang, |v| fmt::scaled(v, 1.0, "Erl")),
    ];
    if dist.is_none() {
        knobs.push(knob("size", fixed, parse_size, fmt_kib));
    }
    let (points, swept) = expand(knobs, &a.out)?;
    let mut t = Table::new(vec![
        col("mode", "mode", "", 1.0),
        col("arrivals", "arrivals", "", 1.0),
        RTT,
        LOSS,
        PROC,
        col("offered_erlang", "load", "Erl", 1.0),
        col("mean_write_time_s", "mean", "ms", 1e3),
        col("std_err_s", "±SE", "ms", 1e3),
        col("p50_s", "p50", "ms", 1e3),
        col("p90_s", "p90", "ms", 1e3),
        col("p99_s", "p99", "ms", 1e3),
        col("p999_s", "p99.9", "ms", 1e3),
        col("max_s", "max", "ms", 1e3),
        col("eq5_write_time_s", "eq.5", "ms", 1e3),
        col("capacity_erlang", "capacity", "Erl", 1.0),
        col("utilization", "busy", "", 1.0),
        col("requests", "requests", "", 1.0),
    ])?;
    let per_run = a.requests.saturating_add(a.warmup);
    let bar = ProgressBar::new(per_run.saturating_mul(points.len() as u64));
    bar.set_style(
        ProgressStyle::with_template("{spinner} simulating [{bar:40}] {human_pos}/{human_len} requests, ETA {eta}")
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> "),
    );
    for p in points {
        let m = a.session.model(&a.net, p.get("rtt"), p.get("loss"), p.get("proc"))?;
        let d = dist_for(&p, dist.as_ref())?;
        if d.mean() <= 0.0 {
            bail!("the mean request size is zero: offered traffic is undefined");
        }
        let load = p.get("load");
        let kind = if p.get("arrivals") == 0.0 { lognormal } else { Arrivals::Poisson { rate: lognormal.rate() } };
        let arrivals = if load.is_nan() { kind } else { kind.with_rate(rate_for_erlang(load, d.mean(), m.tcp.link)) };
        if !(arrivals.rate() > 0.0 && arrivals.rate().is_finite()) {
            bail!("offered traffic must be above zero");
        }
        let operation = if p.get("mode") == 0.0 { Operation::NonInterleaved } else { Operation::Interleaved };
        let cfg = SimConfig {
            model: m,
            arrivals,
            operation,
            requests: a.requests,
            warmup: a.warmup,
            seed: a.seed,
            batches: 20,
        };
        let r = simulate(&cfg, &d, &mut |n| bar.inc(n))?;
        let cap = capacity(&m, &d);
        let cap = if operation == Operation::Interleaved { cap.interleaved_erlang } else { cap.non_interleaved_erlang };
        let row = vec![
            Cell::Text(operation.name().into()),
            Cell::Text(arrivals.name().into()),
            Cell::Num(m.tcp.rtt),
            Cell::Num(m.tcp.loss),
            Cell::Num(m.iscsi.proc),
            Cell::Num(offered_erlang(arrivals.rate(), d.mean(), m.tcp.link)),
            Cell::Num(r.mean),
            Cell::Num(r.std_err),
            Cell::Num(r.p50),
            Cell::Num(r.p90),
            Cell::Num(r.p99),
            Cell::Num(r.p999),
            Cell::Num(r.max),
            Cell::Num(m.mean_write(&d).mean_write_time),
            Cell::Num(cap),
            Cell::Num(r.utilization),
            Cell::Num(r.requests as f64),
        ];
        t.push_at(&p, row)?;
    }
    bar.finish_and_clear();
    let spec = PlotSpec {
        title: "Mean iSCSI write time under dynamic traffic (seed 003, IV.B)",
        y_label: "mean write time [ms]",
        x_keys: &[("rtt", "rtt_s"), ("loss", "loss"), ("proc", "proc_s"), ("load", "offered_erlang")],
        curves: vec![
            Curve::new("mean_write_time_s"),
            Curve::new("eq5_write_time_s").prefix("single request (eq. 5)").skip(&["mode", "arrivals"]),
        ],
        log_y: true,
    };
    emit(&t, &a.out, swept, spec)
}

fn latency(a: LatencyArgs) -> anyhow::Result<()> {
    let knobs = vec![
        knob("delay", a.delay.clone(), parse_duration, fmt_ms),
        knob("disk", a.disk.clone(), parse_duration, fmt_ms),
    ];
    let (points, swept) = expand(knobs, &a.out)?;
    if !(a.block.is_finite() && a.block > 0.0) {
        bail!("--block must be above zero");
    }
    let mut t = Table::new(vec![
        col("net_delay_s", "one-way delay", "ms", 1e3),
        col("disk_s", "T_disk", "ms", 1e3),
        col("iscsi_s", "T_iSCSI", "ms", 1e3),
        col("latency_s", "T (eq.1)", "ms", 1e3),
        col("throughput_bytes_per_s", "1 thread", "MB/s", 1e-6),
        col("random_write_s", "busy-disk write", "ms", 1e3),
        col("random_write_bytes_per_s", "busy-disk write", "MB/s", 1e-6),
        col("network_masked", "masked", "", 1.0),
    ])?;
    for p in points {
        let io = IoLatency { disk: p.get("disk"), net_delay: p.get("delay"), iscsi: a.iscsi };
        io.validate()?;
        let row = vec![
            Cell::Num(io.net_delay),
            Cell::Num(io.disk),
            Cell::Num(io.iscsi),
            Cell::Num(io.blocking()),
            Cell::Num(single_thread_throughput(a.block, io.blocking())),
            Cell::Num(io.random_write_busy_disk()),
            Cell::Num(single_thread_throughput(a.block, io.random_write_busy_disk())),
            Cell::Text(if io.network_masked() { "yes".into() } else { "no".into() }),
        ];
        t.push_at(&p, row)?;
    }
    let spec = PlotSpec {
        title: "Blocking I/O latency (seed 000, eq. 1 and Fig. 3)",
        y_label: "response time [ms]",
        x_keys: &[("delay", "net_delay_s"), ("disk", "disk_s")],
        curves: vec![
            Curve::new("latency_s").prefix("eq. 1"),
            Curve::new("random_write_s").prefix("busy-disk random write"),
        ],
        log_y: false,
    };
    emit(&t, &a.out, swept, spec)
}
