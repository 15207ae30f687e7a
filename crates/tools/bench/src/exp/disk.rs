//! `stics bench disk`: the disk model's check. Random and sequential 8 KiB reads and writes at
//! depth 1 on `disk(mem:…, model=X)` for each preset, run by the load generator in its own
//! process, against what the model says for the same requests, and one run through `stics
//! target` over iSCSI on loopback.

use std::time::Duration;

use stics_disk::{Access, Config, Preset};
use stics_report::{Column, Table};

use super::scaled;
use crate::load::{self, Outcome, Pattern};
use crate::peers::stics_target;
use crate::{Bench, Report, Result, Stat};

/// Options of `stics bench disk`.
#[derive(Debug, Clone, clap::Args)]
pub struct Args {
    /// Random requests per run (each a seek and a rotation: 5 to 15 ms).
    #[arg(long, default_value_t = 1000)]
    pub random: u64,
    /// Sequential requests per run (a transfer each: 0.25 to 0.5 ms).
    #[arg(long, default_value_t = 10_000)]
    pub seq: u64,
}

/// Bytes per request (seed 000's microbenchmarks).
const SIZE: u64 = 8192;
/// The device under the model: large enough for full-stroke seeks to mean something, small
/// enough that random writes allocate little of the memory backend.
const LUN: u64 = 256 << 20;
/// How far measured may stray from the model: a share of the model's time, or for the
/// sub-millisecond rows an absolute allowance for the client's own path and the scheduler (a
/// request's software costs a few microseconds, but on a shared two-core machine the thread that
/// waits out a 0.1 ms acknowledgement is now and then preempted for longer).
const TOLERANCE: f64 = 0.10;
const SLACK: f64 = 50e-6;
const SEED: u64 = 1;

/// An access the check runs: its label, kind, the load generator's `--op` and pattern.
type Row = (&'static str, Access, &'static str, Pattern);

const ACCESSES: [Row; 4] = [
    ("seq read", Access::SeqRead, "read", Pattern::Seq),
    ("seq write", Access::SeqWrite, "write", Pattern::Seq),
    ("random read", Access::RandomRead, "read", Pattern::Random),
    ("random write", Access::RandomWrite, "write", Pattern::Random),
];

/// Requests sent before the measured ones, so that a buffered single disk's writes are measured
/// with the buffer full (its steady state): enough to fill it at the acknowledgement rate, and
/// for sequential writes, which drain nearly as fast as they come, four times that. An array's
/// 128 MB cache is not filled: its writes are measured while the cache hides them.
fn warmup(c: &Config, access: Access) -> u64 {
    if c.buffer == 0 || c.array.is_some() {
        return 0;
    }
    match access {
        Access::RandomWrite => c.buffer / SIZE + 32,
        Access::SeqWrite => 4 * c.buffer / SIZE + 32,
        Access::RandomRead | Access::SeqRead => 0,
    }
}

/// The model's mean service time for the requests the load generator sends (the same offsets,
/// warm-up first), one after another with no time between them.
fn modelled(c: &Config, access: Access, pattern: Pattern, warm: u64, count: u64) -> Result<Duration> {
    let mut m = c.model(LUN).map_err(|e| crate::Error::Invalid(e.to_string()))?;
    let write = matches!(access, Access::SeqWrite | Access::RandomWrite);
    let mut now = Duration::ZERO;
    let mut total = Duration::ZERO;
    // The warm-up is a run of its own: it starts from the first slot again, as the measured run does.
    let runs = [(warm, false), (count, true)];
    for (n, measured) in runs {
        for slot in load::worker_slots(pattern, SEED, 0, 1, LUN / SIZE).take(n as usize) {
            let done = if write { m.write(now, slot * SIZE, SIZE, false) } else { m.read(now, slot * SIZE, SIZE) };
            if measured {
                total += done.saturating_sub(now);
            }
            now = done;
        }
    }
    Ok(total / u32::try_from(count.max(1)).unwrap_or(u32::MAX))
}

/// One load-generator run against `device`.
fn measure(b: &Bench, device: &str, op: &str, pattern: Pattern, warm: u64, count: u64) -> Result<Outcome> {
    let pattern = match pattern {
        Pattern::Seq => "seq",
        Pattern::Random => "random",
        Pattern::Same => "same",
    };
    let mut cmd = b.stics_cmd();
    cmd.args(["bench", "load", device, "--json", "--depth", "1", "--size", &SIZE.to_string(), "--op", op])
        .args(["--pattern", pattern, "--count", &count.to_string(), "--warmup", &warm.to_string()])
        .args(["--seed", &SEED.to_string()]);
    Outcome::from_json(&b.run(&mut cmd)?.stdout)
}

pub fn run(b: &Bench, a: &Args) -> Result<Report> {
    let (random, seq) = (scaled(b, a.random, a.random.min(40)), scaled(b, a.seq, a.seq.min(400)));
    let bar = b.bar(((Preset::ALL.len() * ACCESSES.len() + 1) * b.reps()) as u64, "disk");
    let mut t = Table::new(vec![
        Column::new("model", "model", "", 1.0),
        Column::new("access", "8 KiB, depth 1", "", 1.0),
        Column::new("via", "through", "", 1.0),
        Column::new("requests", "requests", "", 1.0),
        Column::new("tdisk", "Tdisk (seed 000)", "ms", 1e3),
        Column::new("expected", "model", "ms", 1e3),
        Column::new("measured", "measured", "ms", 1e3),
        Column::ratio("ratio", "measured/model", "measured", "expected"),
        Column::new("over", "measured − model", "µs", 1e6),
        Column::new("spread", "spread", "%", 100.0),
    ])?;
    let mut outside = Vec::new();
    // Each row: the median of `b.reps()` runs, each on a device of its own.
    let mut row = |t: &mut Table, p: Preset, x: Row, via: &str, warm: u64, n: u64, runs: &[Outcome]| {
        let (label, access, _, pattern) = x;
        let c = p.config();
        let expected = modelled(&c, access, pattern, warm, n)?.as_secs_f64();
        let means: Vec<f64> = runs.iter().map(|o| o.mean).collect();
        let measured = Stat::of(&means);
        let off = (measured.median - expected).abs();
        if off > (TOLERANCE * expected).max(SLACK) {
            outside.push(format!("{p} {label} through {via}"));
        }
        t.push(vec![
            p.name().into(),
            label.into(),
            via.into(),
            (n as f64).into(),
            c.expected(access, SIZE).as_secs_f64().into(),
            expected.into(),
            measured.median.into(),
            (measured.median - expected).into(),
            measured.spread().into(),
        ])?;
        Ok::<(), crate::Error>(())
    };
    for p in Preset::ALL {
        let device = format!("disk(mem:{}MiB, model={p})", LUN >> 20);
        for x @ (_, access, op, pattern) in ACCESSES {
            let n = if pattern == Pattern::Seq { seq } else { random };
            let warm = warmup(&p.config(), access);
            let mut runs = Vec::new();
            for _ in 0..b.reps() {
                runs.push(measure(b, &device, op, pattern, warm, n)?);
                bar.inc(1);
            }
            row(&mut t, p, x, "in process", warm, n, &runs)?;
        }
    }
    // The same disk behind the target: the model's time plus one iSCSI round trip on loopback.
    let target = stics_target(b, "disk-target", &[&format!("disk(mem:{}MiB, model=o7n3200)", LUN >> 20)])?;
    let x = ACCESSES[2];
    let mut runs = Vec::new();
    for _ in 0..b.reps() {
        runs.push(measure(b, &target.url, x.2, x.3, 0, random)?);
        bar.inc(1);
    }
    drop(target);
    row(&mut t, Preset::O7n3200, x, "stics target", 0, random, &runs)?;
    bar.finish_and_clear();

    let mut r = Report::new("disk", "The disk model against what a device wrapped in it measures");
    r.section(
        format!(
            "Mean service time of 8 KiB requests at depth 1 on disk(mem:{} MiB, model=…): the model's for the same \
             requests against the load generator's (median of {} runs)",
            LUN >> 20,
            b.reps()
        ),
        t,
        None,
    );
    r.note(
        "Tdisk is seed 000's formula: for random I/O the command overhead, the average seek, half a revolution and \
         the transfer; for sequential I/O the transfer alone. The model column is the model's own mean for the very \
         offsets the load generator sends (the same seed), so the ratio checks the wrapper's timing, and Tdisk beside \
         it shows how far that sample is from the closed form (the unit tests check the closed forms themselves).",
    );
    r.note(
        "Writes to a buffered single disk are measured after a warm-up that fills the buffer: each then waits for one \
         to reach the medium, so they cost what an unbuffered write does. The RAID 5 array's 128 MB cache is not \
         filled in these runs, so its writes cost the command overhead alone; the read-modify-write behind them \
         happens on the members in the background.",
    );
    r.note(
        "The row through stics target adds the iSCSI round trip on loopback (tens of microseconds) to the model's time.",
    );
    r.note(
        "Lateness only ever adds: a request returns when the model says or after. The sub-millisecond rows \
         (sequential transfers, the array's acknowledgements) show the client's own few microseconds, and on a \
         machine shared with other work the waiting thread's preemptions too, tens of microseconds; the check \
         allows 10 % or 50 µs, whichever is more.",
    );
    // A reading, not a check: the times are wall-clock, and a machine shared with other work
    // adds to them (see above); `stics bench` judges behaviour only.
    r.note(if outside.is_empty() {
        format!(
            "Every measured mean is within {:.0} % of the model's, or within {:.0} µs of it (the goal).",
            TOLERANCE * 100.0,
            SLACK * 1e6
        )
    } else {
        format!(
            "Outside {:.0} % of the model's mean and {:.0} µs of it in this run: {} (the goal is none; a busy \
             machine only adds time).",
            TOLERANCE * 100.0,
            SLACK * 1e6,
            outside.join(", ")
        )
    });
    Ok(r)
}
