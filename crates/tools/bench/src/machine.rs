//! The facts a result depends on: cores, CPU, memory, kernel, the versions of the peers, and the
//! loopback TCP bandwidth (iperf3) as the ceiling any iSCSI path on this machine lives under.

#![deny(clippy::unwrap_used, clippy::indexing_slicing)]

use std::process::Command;

use serde::Serialize;

/// What a report records about the machine it ran on.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Machine {
    pub cores: usize,
    pub cpu: String,
    pub memory_gib: f64,
    pub kernel: String,
    pub stics_version: String,
    /// Debian package versions of the peers and clients ("" when not installed).
    pub packages: Vec<(String, String)>,
    /// Loopback TCP, one iperf3 stream for 2 s, in bit/s (NaN unless measured).
    pub loopback_bps: Option<f64>,
    /// When the run started, RFC 3339 (UTC).
    pub date: String,
}

/// The peers and clients whose versions matter.
const PACKAGES: &[&str] = &["tgt", "libiscsi-bin", "qemu-utils", "postmark", "iproute2", "iperf3", "e2fsprogs"];

impl Machine {
    /// Gathers the facts; `iperf` also measures loopback TCP (2 s).
    pub fn gather(stics_version: &str, iperf: bool) -> Machine {
        let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        let cpu = cpuinfo
            .lines()
            .find_map(|l| {
                l.strip_prefix("model name").and_then(|r| r.split_once(':')).map(|(_, v)| v.trim().to_owned())
            })
            .unwrap_or_default();
        let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
        let mem_kib: f64 = meminfo
            .lines()
            .find_map(|l| l.strip_prefix("MemTotal:"))
            .and_then(|r| r.split_whitespace().next())
            .and_then(|v| v.parse().ok())
            .unwrap_or(f64::NAN);
        let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default().trim().to_owned();
        let packages = PACKAGES.iter().map(|p| ((*p).to_owned(), package_version(p))).collect();
        Machine {
            cores: std::thread::available_parallelism().map_or(1, std::num::NonZero::get),
            cpu,
            memory_gib: mem_kib / 1_048_576.0,
            kernel,
            stics_version: stics_version.to_owned(),
            packages,
            loopback_bps: if iperf { loopback_iperf3() } else { None },
            date: now_rfc3339(),
        }
    }

    /// The facts as a Markdown list.
    pub fn markdown(&self) -> String {
        let mut s = format!(
            "- {} cores ({}), {:.0} GiB, Linux {}\n- stics {}\n",
            self.cores, self.cpu, self.memory_gib, self.kernel, self.stics_version
        );
        if let Some(bps) = self.loopback_bps {
            s.push_str(&format!("- loopback TCP, one iperf3 stream: {:.1} Gbit/s\n", bps / 1e9));
        }
        let pk: Vec<String> =
            self.packages.iter().filter(|(_, v)| !v.is_empty()).map(|(p, v)| format!("{p} {v}")).collect();
        s.push_str(&format!("- peers: {}\n- run at {}\n", pk.join(", "), self.date));
        s
    }
}

fn package_version(p: &str) -> String {
    Command::new("dpkg-query")
        .args(["-W", "-f=${Version}", p])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .unwrap_or_default()
}

fn now_rfc3339() -> String {
    Command::new("date")
        .args(["-u", "+%Y-%m-%dT%H:%M:%SZ"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .unwrap_or_default()
}

/// One iperf3 stream over 127.0.0.1 for 2 s, in bit/s; None when iperf3 is missing or fails.
pub fn loopback_iperf3() -> Option<f64> {
    let port = stics_procs::free_port().ok()?;
    let mut server = Command::new("iperf3")
        .args(["-s", "-1", "-B", "127.0.0.1", "-p", &port.to_string()])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .ok()?;
    // Not a connect probe: the server serves exactly one client.
    std::thread::sleep(std::time::Duration::from_millis(500));
    let out = Command::new("iperf3").args(["-c", "127.0.0.1", "-p", &port.to_string(), "-t", "2", "-J"]).output().ok();
    let _ = server.kill();
    let _ = server.wait();
    let v: serde_json::Value = serde_json::from_slice(&out?.stdout).ok()?;
    v.pointer("/end/sum_received/bits_per_second")?.as_f64()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gathers_what_the_kernel_says() {
        let m = Machine::gather("0.1.0", false);
        assert!(m.cores >= 1 && !m.kernel.is_empty() && m.memory_gib > 0.0, "{m:?}");
        assert!(m.markdown().contains("stics 0.1.0"));
    }
}
