//! `stics bench wan`: the WAN emulator held to its promises (delay, rate, loss against Mathis'
//! model) and its own overhead against a plain veth pair, since every WAN experiment rests on it.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use stics_report::{Column, Table};

use crate::env::{forget, remember, Undo};
use crate::peers::Wan;
use crate::{Bench, Error, Report, Result};

/// Options of `stics bench wan`.
#[derive(Debug, Clone, clap::Args)]
pub struct Args {
    /// Seconds of each iperf3 run under loss, per congestion control (`--quick`: 5).
    #[arg(long, default_value_t = 20)]
    pub mathis_secs: u64,
    /// Pings per RTT measurement, 20 ms apart (`--quick`: 50).
    #[arg(long, default_value_t = 200)]
    pub pings: u32,
}

/// Mathis' constant for Reno with delayed ACKs, as `stics model` uses it.
const MATHIS_C: f64 = 0.93;
const MSS: f64 = 1448.0;

pub fn run(b: &Bench, a: &Args) -> Result<Report> {
    b.need(&["ping", "iperf3", "ip", "nsenter", "timeout"])?;
    let pings = if b.quick() { a.pings.min(50) } else { a.pings };
    let secs = if b.quick() { 3 } else { 10 };
    let mathis_secs = if b.quick() { a.mathis_secs.min(5) } else { a.mathis_secs };
    let mut rows = Rows::new()?;
    let bar = b.bar(12, "wan");
    let mut port = 5201u16;

    let pair = VethPair::up(b, &format!("sbveth{}", std::process::id()))?;
    let ms = ping_median(b, pair.exec("a", "ping"), "10.202.0.2", pings)?;
    rows.info("plain veth: ping -U median RTT", ms, "ms", "(baseline)")?;
    let mbit = iperf(b, pair.exec("b", "iperf3"), pair.exec("a", "timeout"), "10.202.0.2", secs, &mut port)?;
    rows.info("plain veth: iperf3, one stream", mbit, "Mbit/s", "(baseline)")?;
    drop(pair);
    bar.inc(2);

    let wan = Wan::up(b, &format!("sbwan{}", std::process::id()), &["--delay", "0ms", "--seed", "1"])?;
    let addr = wan.addr(b, "storage")?;
    let host = |p: &str| wan.exec("host", Path::new(p));
    let storage = |p: &str| wan.exec("storage", Path::new(p));
    let ms = ping_median(b, host("ping"), &addr, pings)?;
    rows.info("emulator, no delay: ping -U median RTT", ms, "ms", "(its overhead)")?;
    let mbit = iperf(b, storage("iperf3"), host("timeout"), &addr, secs, &mut port)?;
    rows.info("emulator, no delay: iperf3, one stream", mbit, "Mbit/s", "(its overhead)")?;
    bar.inc(2);

    wan.set(b, &["--delay", "5ms"])?;
    let ms = ping_median(b, host("ping"), &addr, pings)?;
    rows.check("--delay 5ms: ping -U median RTT", ms, "ms", (10.0, 10.5))?;
    bar.inc(1);

    wan.set(b, &["--delay", "1ms", "--rate", "100mbit"])?;
    let mbit = iperf(b, storage("iperf3"), host("timeout"), &addr, secs, &mut port)?;
    rows.check("--delay 1ms --rate 100mbit: iperf3", mbit, "Mbit/s", (85.0, 100.0))?;
    bar.inc(1);
    for load in [30, 60] {
        wan.set(b, &["--background", &format!("{load}%")])?;
        let mbit = iperf(b, storage("iperf3"), host("timeout"), &addr, secs, &mut port)?;
        rows.info(
            &format!("  same, --background {load}%: iperf3"),
            mbit,
            "Mbit/s",
            &format!("about {} or less", 100 - load),
        )?;
        bar.inc(1);
    }
    wan.set(b, &["--background", "0", "--rate", "none"])?;

    // Mathis: B = C · MSS / (RTT · √p), here at 10 ms and p = 1 %.
    wan.set(b, &["--delay", "5ms", "--loss", "1e-2"])?;
    let mathis = MATHIS_C * MSS * 8.0 / (0.010 * 0.01f64.sqrt()) / 1e6;
    for cc in ["reno", "cubic", "bbr"] {
        wan.set(b, &["--cc", cc])?;
        let before = path0(b, &wan)?;
        let mbit = iperf(b, storage("iperf3"), host("timeout"), &addr, mathis_secs, &mut port)?;
        let after = path0(b, &wan)?;
        let ratio = mbit / mathis;
        if cc == "reno" {
            rows.check(&format!("--delay 5ms --loss 1e-2, {cc}: iperf3 / Mathis"), ratio, "×", (0.5, 2.5))?;
        } else {
            rows.info(&format!("--delay 5ms --loss 1e-2, {cc}: iperf3 / Mathis"), ratio, "×", "(reported)")?;
        }
        let n = after.0.saturating_sub(before.0) as f64;
        let lost = after.1.saturating_sub(before.1) as f64;
        let sigma = (n * 0.01 * 0.99).sqrt();
        let bound = (0.01 - (4.0 * sigma + 1.0) / n.max(1.0), 0.01 + (4.0 * sigma + 1.0) / n.max(1.0));
        rows.check(&format!("  {cc}: loss per packet ({lost} of {n})"), lost / n.max(1.0), "", bound)?;
        bar.inc(1);
    }
    bar.finish_and_clear();
    drop(wan);

    let mut r = Report::new("wan", "stics wan against its promises: delay, rate and loss, and its own overhead");
    r.section(
        format!(
            "One stics wan instance (host and storage namespaces), ping -U every 20 ms ({pings} per point), iperf3 \
             one TCP stream ({secs} s; {mathis_secs} s under loss); the plain veth pair is two namespaces joined \
             directly, with nothing emulated"
        ),
        rows.table,
        None,
    );
    for (what, ok) in rows.checks {
        r.check(what, ok);
    }
    r.note(format!(
        "Mathis' model at 10 ms RTT and 1 % loss: {MATHIS_C} × {MSS} B × 8 / (10 ms × √0.01) = {mathis:.2} Mbit/s. \
         Reno follows it within the bound; cubic and BBR are shown beside it (BBR does not back off on random loss, \
         so it runs far above the model)."
    ));
    r.note(
        "The loss check counts the packets the emulator dropped on the host-to-storage path during the run against \
         the packets it carried: it must be 1 % within four standard deviations of a binomial draw.",
    );
    Ok(r)
}

/// The report's one table and the checks it made.
struct Rows {
    table: Table,
    checks: Vec<(String, bool)>,
}

impl Rows {
    fn new() -> Result<Rows> {
        Ok(Rows {
            table: Table::new(vec![
                Column::new("measurement", "measurement", "", 1.0),
                Column::new("value", "value", "", 1.0),
                Column::new("unit", "unit", "", 1.0),
                Column::new("bound", "bound", "", 1.0),
                Column::new("verdict", "verdict", "", 1.0),
            ])?,
            checks: Vec::new(),
        })
    }

    fn info(&mut self, what: &str, value: f64, unit: &str, bound: &str) -> Result<()> {
        self.table.push(vec![what.into(), value.into(), unit.into(), bound.into(), "info".into()])?;
        Ok(())
    }

    fn check(&mut self, what: &str, value: f64, unit: &str, (lo, hi): (f64, f64)) -> Result<()> {
        let ok = (lo..=hi).contains(&value);
        let bound = format!("{} to {}", sig(lo), sig(hi));
        self.table.push(vec![
            what.into(),
            value.into(),
            unit.into(),
            bound.clone().into(),
            if ok { "pass" } else { "FAIL" }.into(),
        ])?;
        self.checks.push((format!("{}: {} {unit} (bound {bound})", what.trim(), sig(value)), ok));
        Ok(())
    }
}

/// `x` with one decimal from 10 up, else up to four, without trailing zeros.
fn sig(x: f64) -> String {
    let s = if x.abs() >= 10.0 { format!("{x:.1}") } else { format!("{x:.4}") };
    s.trim_end_matches('0').trim_end_matches('.').to_owned()
}

/// Two namespaces joined by a veth pair (10.202.0.1 and .2), deleted when dropped.
struct VethPair {
    a: String,
    b: String,
}

impl VethPair {
    fn up(bench: &Bench, name: &str) -> Result<VethPair> {
        let pair = VethPair { a: format!("{name}-a"), b: format!("{name}-b") };
        for ns in [&pair.a, &pair.b] {
            remember(Undo::Netns(ns.clone()));
            bench.run(Command::new("ip").args(["netns", "add", ns]))?;
        }
        bench.run(
            Command::new("ip")
                .args(["link", "add", "eth0", "netns", &pair.a, "type", "veth", "peer", "name"])
                .args(["eth0", "netns", &pair.b]),
        )?;
        for (ns, ip) in [(&pair.a, "10.202.0.1/24"), (&pair.b, "10.202.0.2/24")] {
            bench.run(Command::new("ip").args(["-n", ns, "addr", "add", ip, "dev", "eth0"]))?;
            bench.run(Command::new("ip").args(["-n", ns, "link", "set", "eth0", "up"]))?;
            bench.run(Command::new("ip").args(["-n", ns, "link", "set", "lo", "up"]))?;
        }
        Ok(pair)
    }

    fn exec(&self, side: &str, program: &str) -> Command {
        // The network namespace alone (see `stics wan exec`).
        let mut c = Command::new("nsenter");
        c.arg(format!("--net=/run/netns/{}", if side == "a" { &self.a } else { &self.b })).args(["--", program]);
        c
    }
}

impl Drop for VethPair {
    fn drop(&mut self) {
        for ns in [&self.a, &self.b] {
            let _ = Command::new("ip").args(["netns", "del", ns]).output();
            forget(&Undo::Netns(ns.clone()));
        }
    }
}

/// The median RTT in ms of `count` pings, 20 ms apart, run by `ping` (a `ping` command, perhaps
/// inside a namespace).
fn ping_median(b: &Bench, mut ping: Command, addr: &str, count: u32) -> Result<f64> {
    let out = b.run(ping.args(["-U", "-n", "-i", "0.02", "-c", &count.to_string(), addr]))?;
    let mut rtts: Vec<f64> =
        out.stdout.lines().filter_map(|l| l.split("time=").nth(1)?.split_whitespace().next()?.parse().ok()).collect();
    if rtts.is_empty() {
        return Err(Error::Output { what: "ping".into(), detail: crate::env::tail(&out.stdout) });
    }
    rtts.sort_by(f64::total_cmp);
    Ok(rtts[rtts.len() / 2])
}

/// The rate in Mbit/s one iperf3 stream gets in `secs` from the `timeout` side (a `timeout`
/// command in the client's namespace) to the `server` side (an `iperf3` command).
fn iperf(b: &Bench, mut server: Command, mut client: Command, addr: &str, secs: u64, port: &mut u16) -> Result<f64> {
    let p = port.to_string();
    *port += 1;
    let mut srv = b.spawn(&format!("iperf3-server-{p}"), server.args(["-s", "-1", "-p", &p]))?;
    // iperf3's client has no time limit of its own, and a server that is not listening yet is
    // worth another try, for a while.
    client.arg((secs + 30).to_string()).args(["iperf3", "-c", addr, "-p", &p, "-t", &secs.to_string(), "-J"]);
    let start = Instant::now();
    let mbit = loop {
        // A refused connection comes back as JSON with an "error", sometimes with exit status 0.
        let got = b.run(&mut client).and_then(|out| {
            let v: serde_json::Value = serde_json::from_str(&out.stdout)
                .map_err(|e| Error::Output { what: "iperf3 -J".into(), detail: e.to_string() })?;
            v["end"]["sum_received"]["bits_per_second"].as_f64().map(|bps| bps / 1e6).ok_or_else(|| Error::Output {
                what: "iperf3 -J".into(),
                detail: v["error"].as_str().map_or_else(|| crate::env::tail(&out.stdout), str::to_owned),
            })
        });
        match got {
            Ok(m) => break m,
            Err(e) if start.elapsed() > Duration::from_secs(10) => return Err(e),
            Err(_) => std::thread::sleep(Duration::from_millis(200)),
        }
    };
    srv.stop(libc::SIGTERM, Duration::from_secs(2));
    Ok(mbit)
}

/// Packets carried and dropped so far on the WAN's host-to-storage path.
fn path0(b: &Bench, wan: &Wan) -> Result<(u64, u64)> {
    let v = wan.status(b)?;
    let p = &v["paths"][0];
    Ok((p["packets"].as_u64().unwrap_or(0), p["dropped"].as_u64().unwrap_or(0)))
}
