//! One module per experiment of `stics bench`; each has its clap `Args` and a `run` that returns
//! a [`crate::Report`].

pub mod app;
pub mod cache_location;
pub mod coherence;
pub mod conformance;
pub mod congestion;
pub mod delay;
pub mod disk;
pub mod fs;
pub mod gateway;
pub mod initiator;
pub mod interop;
pub mod messages;
pub mod micro;
pub mod nfs;
pub mod packets;
pub mod postmark;
pub mod rbd;
pub mod surge;
pub mod target;
pub mod tls;
pub mod trace;
pub mod wan;
pub mod write_model;

use std::process::Command;

use crate::{Bench, Error, Result};

/// One `qemu-img bench` run against `url`: seconds and the client's CPU seconds.
pub(crate) fn qemu_bench(b: &Bench, url: &str, args: &[&str]) -> Result<(f64, f64)> {
    b.need(&["qemu-img"])?;
    let out = b.run(Command::new("qemu-img").args(["bench", "-f", "raw", "-t", "none", "-n"]).args(args).arg(url))?;
    let text = format!("{}{}", out.stdout, out.stderr);
    let secs = text
        .lines()
        .find_map(|l| l.strip_prefix("Run completed in "))
        .and_then(|r| r.split_whitespace().next())
        .and_then(|v| v.parse::<f64>().ok())
        .ok_or_else(|| Error::Output { what: "qemu-img bench".into(), detail: crate::env::tail(&text) })?;
    Ok((secs, out.cpu_secs))
}

/// Scales a request count down for `--quick`.
pub(crate) fn scaled(b: &Bench, full: u64, quick: u64) -> u64 {
    if b.quick() {
        quick
    } else {
        full
    }
}

/// The order two peers run in on repetition `rep`: alternating, so neither always goes first.
pub(crate) fn alternate<T: Copy>(rep: usize, pair: [T; 2]) -> [T; 2] {
    if rep.is_multiple_of(2) {
        pair
    } else {
        [pair[1], pair[0]]
    }
}

/// The points of the curve `label` in `curves`, a new one at the end if it has none yet.
pub(crate) fn curve(curves: &mut Vec<(String, Vec<(f64, f64)>)>, label: String) -> &mut Vec<(f64, f64)> {
    let i = match curves.iter().position(|c| c.0 == label) {
        Some(i) => i,
        None => {
            curves.push((label, Vec::new()));
            curves.len() - 1
        }
    };
    &mut curves[i].1
}
