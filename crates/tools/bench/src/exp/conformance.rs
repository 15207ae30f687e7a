//! `stics bench conformance`: libiscsi's `iscsi-test-cu -d --test=ALL` against `stics target` (and
//! tgt in the same run), counted strictly (see [`crate::cu`]).

use std::process::Command;

use stics_report::{Column, Table};

use crate::cu::{self, Counts};
use crate::peers::{stics_target, tgt};
use crate::{Bench, Report, Result};

/// Options of `stics bench conformance`.
#[derive(Debug, Clone, clap::Args)]
pub struct Args {
    /// The LUN stics serves (a device spec: mem:1GiB:4096 for 4 KiB blocks).
    #[arg(long, default_value = "mem:1GiB")]
    pub lun: String,
    /// Run stics only, not tgt beside it.
    #[arg(long)]
    pub stics_only: bool,
}

/// The LUN's logical block size as READ CAPACITY (16) reports it to libiscsi.
fn block_size(b: &Bench, url: &str) -> Result<f64> {
    b.need(&["iscsi-readcapacity16"])?;
    let out = b.run(Command::new("iscsi-readcapacity16").arg(url))?;
    out.stdout
        .lines()
        .find_map(|l| l.strip_prefix("LOGICAL BLOCK LENGTH IN BYTES:"))
        .and_then(|v| v.trim().parse().ok())
        .ok_or_else(|| crate::Error::Output {
            what: "iscsi-readcapacity16".into(),
            detail: crate::env::tail(&out.stdout),
        })
}

fn suite(b: &Bench, url: &str, log: &str) -> Result<Counts> {
    b.need(&["iscsi-test-cu"])?;
    let mut cmd = Command::new("iscsi-test-cu");
    cmd.args(["-d", "--test=ALL", url]);
    b.record(&cmd);
    // The tool exits non-zero whenever a test fails; its log is what counts.
    let out = cmd.output()?;
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    std::fs::write(b.work().join(log), &text)?;
    Ok(cu::count(&text))
}

pub fn run(b: &Bench, a: &Args) -> Result<Report> {
    let mut results = Vec::new();
    {
        let t = stics_target(b, "stics-target", &[&a.lun])?;
        results.push(("stics", block_size(b, &t.url)?, suite(b, &t.url, "stics-cu.log")?));
    }
    if !a.stics_only {
        let img = b.work().join("tgt-lun.img");
        std::fs::File::create(&img)?.set_len(1 << 30)?;
        let t = tgt(b, "tgt", &img)?;
        results.push(("tgt", block_size(b, &t.url)?, suite(b, &t.url, "tgt-cu.log")?));
        std::fs::remove_file(&img)?;
    }
    let mut table = Table::new(vec![
        Column::new("target", "target", "", 1.0),
        Column::new("block_size", "block", "B", 1.0),
        Column::new("tests", "tests", "", 1.0),
        Column::new("real_passes", "real passes", "", 1.0),
        Column::new("skipped", "skipped", "", 1.0),
        Column::new("failed", "failed", "", 1.0),
        Column::new("by_design", "[FAILED] by design", "", 1.0),
    ])?;
    let mut r = Report::new("conformance", &format!("libiscsi iscsi-test-cu -d --test=ALL, stics over {}", a.lun));
    for (name, block, c) in &results {
        table.push(vec![
            (*name).into(),
            (*block).into(),
            (c.tests as f64).into(),
            (c.real_passes as f64).into(),
            (c.skipped as f64).into(),
            (c.failed.len() as f64).into(),
            (c.by_design.len() as f64).into(),
        ])?;
        for f in &c.failed {
            r.note(format!("{name} FAILED: {f}"));
        }
        for f in &c.by_design {
            r.note(format!("{name} printed [FAILED] by the test's design (its assertions passed): {f}"));
        }
    }
    r.section(
        "Tests counted once each: a test that printed [FAILED] failed, one that printed [SKIPPED] was skipped",
        table,
        None,
    );
    let s = &results[0].2;
    r.check("stics runs the whole suite (over 200 tests)", s.tests > 200);
    r.check("stics fails no test", s.failed.is_empty());
    if let Some((_, _, t)) = results.get(1) {
        r.note(format!("stics − tgt real passes: {:+}", s.real_passes as i64 - t.real_passes as i64));
        r.check("stics passes at least 20 more tests than tgt", s.real_passes >= t.real_passes + 20);
    }
    Ok(r)
}
