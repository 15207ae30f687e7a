//! The control protocol between `stics wan` commands and the running daemon: one JSON request
//! line over a unix socket, one JSON reply line.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::params::{Params, Update};
use crate::{Result, WanError};

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "cmd", rename_all = "lowercase")]
pub enum Request {
    Status,
    Set { update: Update },
    Stop,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Reply {
    pub ok: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<Status>,
}

/// Counters of one direction's delay path.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct PathStatus {
    pub direction: String,
    /// Packets and IP bytes that entered the router in this direction.
    pub packets: u64,
    pub bytes: u64,
    /// Packets the loss model dropped.
    pub dropped: u64,
    /// Packets released after their delay.
    pub released: u64,
    /// Packets held in the delay line now, and the most held at once.
    pub held: u64,
    pub held_bytes: u64,
    pub max_held: u64,
    /// Packets the kernel dropped because the netfilter queue overflowed.
    pub queue_overflow: u64,
    /// Packets by Ethernet frame length (IP length + 14), in the buckets of [`SIZE_BUCKETS`]
    /// (seed 004 Table 3).
    #[serde(default)]
    pub sizes: Vec<u64>,
}

/// The packet-length buckets of [`PathStatus::sizes`]: the upper bound of each (inclusive), the
/// last one open.
pub const SIZE_BUCKETS: [(&str, u64); 6] =
    [("<=64", 64), ("65-127", 127), ("128-255", 255), ("256-511", 511), ("512-1023", 1023), (">=1024", u64::MAX)];

/// The bucket of [`SIZE_BUCKETS`] a packet of `len` bytes falls in.
pub fn size_bucket(len: u64) -> usize {
    SIZE_BUCKETS.iter().position(|&(_, top)| len <= top).unwrap_or(SIZE_BUCKETS.len() - 1)
}

/// Counters of one direction's bottleneck queue (the `tbf` qdisc).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct LinkStatus {
    pub direction: String,
    pub qdisc: String,
    pub sent_bytes: u64,
    pub sent_packets: u64,
    pub drops: u64,
    pub overlimits: u64,
    pub backlog_bytes: u64,
    pub backlog_packets: u64,
}

/// Counters of one direction's background load.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct BackgroundStatus {
    pub direction: String,
    pub packets: u64,
    pub bytes: u64,
    /// Frames refused by the full bottleneck queue.
    pub dropped: u64,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Status {
    pub name: String,
    pub pid: u32,
    pub uptime_s: f64,
    pub params: Params,
    /// The congestion control in force in the end namespaces.
    pub cc: String,
    pub paths: Vec<PathStatus>,
    pub links: Vec<LinkStatus>,
    pub background: Vec<BackgroundStatus>,
}

/// Sends one request to the daemon listening on `sock` and returns its reply.
pub fn call(sock: &Path, name: &str, req: &Request) -> Result<Reply> {
    let mut s = UnixStream::connect(sock).map_err(|_| WanError::NotRunning(name.to_string()))?;
    let io = |e| WanError::io(format!("control socket {}", sock.display()), e);
    s.set_read_timeout(Some(Duration::from_secs(20))).map_err(io)?;
    let mut line = serde_json::to_string(req).map_err(|e| WanError::Protocol(e.to_string()))?;
    line.push('\n');
    s.write_all(line.as_bytes()).map_err(io)?;
    let mut reply = String::new();
    BufReader::new(s).read_line(&mut reply).map_err(io)?;
    let reply: Reply = serde_json::from_str(&reply).map_err(|e| WanError::Protocol(format!("bad reply: {e}")))?;
    if !reply.ok {
        return Err(WanError::Protocol(reply.error.unwrap_or_else(|| "request refused".into())));
    }
    Ok(reply)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_round_trip_through_json() {
        let u = Update { delay_ns: Some(5_000_000), ..Default::default() };
        let text = serde_json::to_string(&Request::Set { update: u.clone() }).unwrap();
        match serde_json::from_str::<Request>(&text).unwrap() {
            Request::Set { update } => assert_eq!(update, u),
            other => panic!("{other:?}"),
        }
        assert!(serde_json::to_string(&Request::Stop).unwrap().contains("\"stop\""));
    }
}

#[cfg(test)]
mod size_tests {
    use super::*;

    #[test]
    fn packet_lengths_fall_in_the_papers_buckets() {
        let b: Vec<usize> = [0, 64, 65, 127, 128, 511, 512, 1023, 1024, 1500, 65535].map(size_bucket).to_vec();
        assert_eq!(b, vec![0, 0, 1, 1, 2, 3, 4, 4, 5, 5, 5]);
    }
}
