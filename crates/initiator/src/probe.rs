//! What `stics ls` shows: every target behind a portal, and per LUN its device type, size and
//! block size (like libiscsi's iscsi-ls).

use std::sync::Arc;

use stics_sam::{cdb, data};

use crate::core::{Data, Request};
use crate::counters::{Counters, Snapshot};
use crate::discovery::{discover, TargetEntry};
use crate::driver::{random_isid, Config, Session};
use crate::lun::{execute_retrying, read_capacity};
use crate::url::IscsiUrl;
use crate::Error;

/// One LUN of a target.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LunInfo {
    pub lun: u64,
    pub device_type: u8,
    pub vendor: String,
    pub product: String,
    /// Block size and number of blocks, for disks.
    pub capacity: Option<data::Capacity>,
}

/// A target and its LUNs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TargetInfo {
    pub entry: TargetEntry,
    pub luns: Vec<LunInfo>,
}

/// Lists the LUNs of one logged-in target.
pub async fn luns(s: &Session, c: &Counters) -> Result<Vec<LunInfo>, Error> {
    let rl = execute_retrying(s, Request::new(0, cdb::report_luns(16384), Data::Read(16384)), c).await?;
    let mut out = Vec::new();
    for lun in data::parse_report_luns(&rl.data) {
        let inq = execute_retrying(s, Request::new(lun, cdb::inquiry(96), Data::Read(96)), c).await?;
        let Some(inq) = data::parse_inquiry(&inq.data) else { continue };
        let capacity = if inq.device_type == data::DIRECT_ACCESS { read_capacity(s, lun, c).await.ok() } else { None };
        out.push(LunInfo { lun, device_type: inq.device_type, vendor: inq.vendor, product: inq.product, capacity });
    }
    Ok(out)
}

/// Discovers the targets behind `url`'s portal (or takes the one it names) and lists each one's
/// LUNs. Returns the listing and the traffic it took.
pub async fn probe(url: &IscsiUrl, cfg: &Config) -> Result<(Vec<TargetInfo>, Snapshot), Error> {
    let counters = Arc::new(Counters::default());
    let entries = match &url.target {
        Some(t) => vec![TargetEntry { name: t.clone(), addresses: vec![url.portal()] }],
        None => discover(url, cfg, counters.clone()).await?,
    };
    let mut total = counters.snapshot();
    let mut out = Vec::new();
    for entry in entries {
        let mut u = url.clone();
        u.target = Some(entry.name.clone());
        let s = Session::connect(&u, cfg, random_isid(0)).await?;
        let luns = luns(&s, s.counters_ref()).await;
        s.logout().await;
        total = total + s.counters();
        let mut luns = luns?;
        if let Some(l) = url.lun {
            luns.retain(|x| x.lun == l);
        }
        out.push(TargetInfo { entry, luns });
    }
    Ok((out, total))
}

/// A size in binary units as iscsi-ls prints it (`63M`, `1G`).
pub fn human_size(bytes: u64) -> String {
    const UNITS: [&str; 6] = ["", "k", "M", "G", "T", "P"];
    let mut v = bytes;
    let mut i = 0;
    while v >= 1024 && i + 1 < UNITS.len() {
        v /= 1024;
        i += 1;
    }
    format!("{v}{}", UNITS.get(i).copied().unwrap_or(""))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_print_like_iscsi_ls() {
        assert_eq!(human_size(64 << 20), "64M");
        assert_eq!(human_size((64 << 20) - 512), "63M");
        assert_eq!(human_size(1 << 30), "1G");
        assert_eq!(human_size(100), "100");
    }
}
