//! `stics bench tls`: what TLS 1.3 costs. The same `stics target` over a null LUN, plain and
//! with TLS, side by side on loopback; large sequential writes and reads from `stics bench load`:
//! throughput, and CPU per GiB of the target and of the client.

use std::path::Path;
use std::process::Command;

use stics_report::{Column, Table};

use super::{alternate, scaled};
use crate::load::Outcome;
use crate::peers::stics_target_with;
use crate::{Bench, Error, Report, Result, Stat};

/// Options of `stics bench tls`.
#[derive(Debug, Clone, clap::Args)]
pub struct Args {
    /// Bytes per request.
    #[arg(long, default_value = "1MiB", value_parser = stics_units::parse_size)]
    pub size: u64,
    /// Requests in flight.
    #[arg(long, default_value_t = 8)]
    pub depth: usize,
}

/// A throwaway CA in `dir` (`ca.pem`) and a certificate for 127.0.0.1 it signed
/// (`server.pem`, `server.key`).
fn pki(dir: &Path) -> Result<()> {
    let bad = |e: rcgen::Error| Error::Invalid(format!("cannot make the test certificates: {e}"));
    let ca_key = rcgen::KeyPair::generate().map_err(bad)?;
    let mut ca = rcgen::CertificateParams::new(Vec::<String>::new()).map_err(bad)?;
    ca.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    std::fs::write(dir.join("ca.pem"), ca.self_signed(&ca_key).map_err(bad)?.pem())?;
    let issuer = rcgen::Issuer::new(ca, ca_key);
    let key = rcgen::KeyPair::generate().map_err(bad)?;
    let cert = rcgen::CertificateParams::new(vec!["127.0.0.1".to_owned()])
        .map_err(bad)?
        .signed_by(&key, &issuer)
        .map_err(bad)?;
    std::fs::write(dir.join("server.pem"), cert.pem())?;
    std::fs::write(dir.join("server.key"), key.serialize_pem())?;
    Ok(())
}

pub fn run(b: &Bench, a: &Args) -> Result<Report> {
    let dir = b.work().join("tls");
    std::fs::create_dir_all(&dir)?;
    pki(&dir)?;
    let path = |n: &str| dir.join(n).display().to_string();
    let lun = "null:64GiB";
    let plain = stics_target_with(b, "plain", &[lun], &[])?;
    let tls =
        stics_target_with(b, "tls", &[lun], &["--tls-cert", &path("server.pem"), "--tls-key", &path("server.key")])?;
    let urls = [plain.url.clone(), format!("{}?tls=on&tls_ca={}", tls.url, path("ca.pem"))];
    let targets = [&plain, &tls];
    let bytes = scaled(b, 4 << 30, 1 << 30);
    let count = bytes / a.size.max(1);
    let mut per = Table::new(vec![
        Column::new("op", "operation", "", 1.0),
        Column::new("transport", "transport", "", 1.0),
        Column::new("bandwidth", "throughput", "MB/s", 1e-6),
        Column::new("target_cpu", "target CPU", "s/GiB", 1.0),
        Column::new("client_cpu", "client CPU", "s/GiB", 1.0),
        Column::new("spread", "spread", "%", 100.0),
    ])?;
    let mut cmp = Table::new(vec![
        Column::new("op", "operation", "", 1.0),
        Column::new("tls", "TLS", "MB/s", 1e-6),
        Column::new("plain", "plain", "MB/s", 1e-6),
        Column::ratio("ratio", "throughput TLS/plain", "tls", "plain"),
        Column::new("tls_cpu", "TLS CPU", "s/GiB", 1.0),
        Column::new("plain_cpu", "plain CPU", "s/GiB", 1.0),
        Column::ratio("cpu_ratio", "CPU TLS/plain", "tls_cpu", "plain_cpu"),
    ])?;
    let bar = b.bar((2 * b.reps() * 2) as u64, "stics bench load");
    let gib = bytes as f64 / f64::from(1u32 << 30);
    for op in ["write", "read"] {
        let mut rate = [Vec::new(), Vec::new()];
        let mut server = [Vec::new(), Vec::new()];
        let mut client = [Vec::new(), Vec::new()];
        for rep in 0..b.reps() {
            for t in alternate(rep, [0usize, 1]) {
                let c0 = targets[t].cpu_secs();
                let mut cmd = Command::new(b.stics());
                cmd.args(["bench", "load", &urls[t], "--json", "--op", op, "--pattern", "seq"])
                    .args(["--size", &a.size.to_string(), "--depth", &a.depth.to_string()])
                    .args(["--count", &count.to_string()]);
                let o = Outcome::from_json(&b.run(&mut cmd)?.stdout)?;
                server[t].push((targets[t].cpu_secs() - c0) / gib);
                client[t].push(o.cpu_seconds / gib);
                rate[t].push(o.bytes_per_sec);
                bar.inc(1);
            }
        }
        let mut med = [(0.0, 0.0); 2];
        for (t, label) in ["plain", "TLS"].into_iter().enumerate() {
            let r = Stat::of(&rate[t]);
            let (s, c) = (Stat::of(&server[t]).median, Stat::of(&client[t]).median);
            med[t] = (r.median, s + c);
            per.push(vec![op.into(), label.into(), r.median.into(), s.into(), c.into(), r.spread().into()])?;
        }
        cmp.push(vec![op.into(), med[1].0.into(), med[0].0.into(), med[1].1.into(), med[0].1.into()])?;
    }
    bar.finish_and_clear();
    let mut r = Report::new(
        "tls",
        "TLS 1.3 against plain TCP: stics target over a null LUN on loopback, sequential stics bench load",
    );
    r.section(format!("Per transport (medians of {} repetitions, order alternating)", b.reps()), per, None);
    r.section("TLS / plain (CPU: target and client together)", cmp, None);
    r.note(format!(
        "{} MiB requests at depth {}, {:.1} GiB per run; TLS 1.3 with rustls (ring), AES-GCM or ChaCha20 as negotiated.",
        a.size >> 20,
        a.depth,
        gib
    ));
    Ok(r)
}
