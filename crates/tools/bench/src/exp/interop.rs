//! `stics bench interop`: stics target (and tgt beside it) with clients nobody here wrote:
//! libiscsi's tools, `qemu-img convert` both ways, and ext4 + PostMark over qemu-storage-daemon's
//! FUSE export (libiscsi as the initiator), checked with e2fsck.

use std::process::Command;

use stics_report::{Column, Table};

use super::fs::Export;
use crate::peers::{self, STICS_IQN, TGT_IQN};
use crate::{Bench, Report, Result};

/// Options of `stics bench interop`.
#[derive(Debug, Clone, clap::Args)]
pub struct Args {
    /// Which targets to check: stics, tgt or both.
    #[arg(long, default_value = "both", value_parser = ["stics", "tgt", "both"])]
    pub target: String,
    /// PostMark files (`--quick`: 100).
    #[arg(long, default_value_t = 300)]
    pub files: u64,
    /// PostMark transactions (`--quick`: 500).
    #[arg(long, default_value_t = 3_000)]
    pub transactions: u64,
}

const LUN_BYTES: u64 = 256 << 20;
const IMAGE_BYTES: u64 = 64 << 20;

pub fn run(b: &Bench, a: &Args) -> Result<Report> {
    b.need(&["iscsi-ls", "iscsi-inq", "iscsi-readcapacity16", "qemu-img", "qemu-storage-daemon", "postmark"])?;
    b.need(&["mkfs.ext4", "e2fsck", "mount", "umount"])?;
    let names: Vec<&str> = match a.target.as_str() {
        "stics" => vec!["stics"],
        "tgt" => vec!["tgt"],
        _ => vec!["stics", "tgt"],
    };
    let (files, transactions) =
        if b.quick() { (a.files.min(100), a.transactions.min(500)) } else { (a.files, a.transactions) };
    let image = peers::random_file(b, "random.img", IMAGE_BYTES)?;
    let mut t = Table::new(vec![
        Column::new("target", "target", "", 1.0),
        Column::new("check", "check", "", 1.0),
        Column::new("verdict", "verdict", "", 1.0),
        Column::new("detail", "detail", "", 1.0),
    ])?;
    let mut checks = Vec::new();
    let bar = b.bar(names.len() as u64 * 5, "interop");
    for name in &names {
        let lun = b.work().join(format!("{name}-lun.img"));
        std::fs::File::create(&lun)?.set_len(LUN_BYTES)?;
        let (target, iqn, lun_no, vendor) = if *name == "stics" {
            (peers::stics_target(b, "stics-target", &[&format!("file:{}", lun.display())])?, STICS_IQN, 0, "STICS")
        } else {
            (peers::tgt(b, "tgt", &lun)?, TGT_IQN, 1, "IET")
        };
        let portal = target.portal();
        let mut record = |check: &str, ok: bool, detail: String| -> Result<()> {
            let detail = detail.split_whitespace().collect::<Vec<_>>().join(" ");
            t.push(vec![(*name).into(), check.into(), if ok { "ok" } else { "FAIL" }.into(), detail.clone().into()])?;
            checks.push((format!("{name} {check}: {detail}"), ok));
            bar.inc(1);
            Ok(())
        };

        let out = text(b, Command::new("iscsi-ls").args(["-s", &format!("iscsi://{portal}")]));
        let lun_line = out.lines().find(|l| l.contains(&format!("Lun:{lun_no} "))).unwrap_or("").trim().to_owned();
        record("iscsi-ls", out.contains(&format!("Target:{iqn}")) && !lun_line.is_empty(), lun_line)?;

        let out = text(b, Command::new("iscsi-inq").arg(&target.url));
        let ok = out.contains(&format!("Vendor:{vendor}")) && out.contains("Peripheral Device Type:DIRECT_ACCESS");
        let ids: Vec<&str> = out
            .lines()
            .filter(|l| l.starts_with("Vendor:") || l.starts_with("Product:") || l.starts_with("Revision:"))
            .collect();
        record("iscsi-inq", ok, ids.join(" "))?;

        let out = text(b, Command::new("iscsi-readcapacity16").arg(&target.url));
        let ok = out.contains("LOGICAL BLOCK LENGTH IN BYTES:512") && out.contains(&format!("Total size:{LUN_BYTES}"));
        let size = out.lines().filter(|l| l.contains("Total size") || l.contains("BLOCK LENGTH")).collect::<Vec<_>>();
        record("iscsi-readcapacity16", ok, size.join(" "))?;

        let (ok, detail) = convert(b, &image, &target.url)?;
        record("qemu-img convert", ok, detail)?;

        let (ok, detail) = postmark(b, name, portal, iqn, lun_no, files, transactions)?;
        record("ext4 + PostMark + e2fsck", ok, detail)?;
        drop(target);
        std::fs::remove_file(&lun)?;
    }
    bar.finish_and_clear();
    let mut r =
        Report::new("interop", "stics target with peers nobody here wrote: libiscsi, qemu, ext4 over a FUSE export");
    r.section(
        format!(
            "Each target serves a {} MiB file LUN on loopback; qemu-img converts a {} MiB random image to the LUN \
             and back; qemu-storage-daemon exports the LUN through libiscsi as a file, ext4 is made on it, mounted \
             -o sync, PostMark runs ({files} files, {transactions} transactions), and e2fsck -fn checks it",
            LUN_BYTES >> 20,
            IMAGE_BYTES >> 20
        ),
        t,
        None,
    );
    for (what, ok) in checks {
        // tgt is the reference; only stics' checks decide the exit status.
        if what.starts_with("stics ") {
            r.check(what, ok);
        } else if !ok {
            r.note(format!("tgt did not pass: {what}"));
        }
    }
    Ok(r)
}

/// What a check command printed (stdout and stderr), or why it failed; a failure is the check's
/// verdict, not the run's.
fn text(b: &Bench, cmd: &mut Command) -> String {
    match b.run(cmd) {
        Ok(o) => format!("{}{}", o.stdout, o.stderr),
        Err(e) => e.to_string(),
    }
}

/// `qemu-img convert` of `image` onto the LUN and back: equal bytes, and the seconds taken.
fn convert(b: &Bench, image: &std::path::Path, url: &str) -> Result<(bool, String)> {
    let back = b.work().join("back.img");
    let there = b.run(Command::new("qemu-img").args(["convert", "-n", "-f", "raw", "-O", "raw"]).arg(image).arg(url));
    let again = there.and_then(|o| {
        let r = b.run(Command::new("qemu-img").args(["convert", "-f", "raw", "-O", "raw", url]).arg(&back))?;
        Ok(o.secs + r.secs)
    });
    let secs = match again {
        Ok(s) => s,
        Err(e) => return Ok((false, e.to_string())),
    };
    let sent = std::fs::read(image)?;
    let got = std::fs::read(&back)?;
    let _ = std::fs::remove_file(&back);
    let same = got.len() >= sent.len() && got[..sent.len()] == sent[..];
    Ok((
        same,
        format!("{} MiB there and back in {secs:.1} s, {}", sent.len() >> 20, if same { "equal" } else { "DIFFERENT" }),
    ))
}

/// ext4 on qemu-storage-daemon's FUSE export of the LUN (libiscsi inside qemu), mounted -o sync,
/// PostMark on it, then e2fsck -fn.
fn postmark(
    b: &Bench,
    name: &str,
    portal: &str,
    iqn: &str,
    lun: u32,
    files: u64,
    transactions: u64,
) -> Result<(bool, String)> {
    let export = b.work().join(format!("{name}-export"));
    let fs = b.work().join(format!("{name}-fs"));
    let e = Export::qsd(b, &format!("{name}-qsd"), portal, iqn, lun, export, fs)?;
    let steps = || -> Result<f64> {
        let secs = e.postmark(b, LUN_BYTES >> 20, files, transactions)?;
        b.run(Command::new("e2fsck").arg("-fn").arg(&e.lun))?;
        Ok(secs)
    };
    Ok(match steps() {
        Ok(secs) => {
            (true, format!("PostMark {files} files / {transactions} transactions in {secs:.1} s, e2fsck -fn clean"))
        }
        Err(err) => (false, err.to_string()),
    })
}
