//! The blocking-I/O latency model of seed 000: eq. (1) and the random-write masking rule of its Fig. 3.

use serde::Serialize;

use crate::{check_min, Result};

/// `T_iSCSI` measured in seed 000 (Fig. 2) for an 8 KB write with a 64 B acknowledgement, seconds.
pub const ISCSI_8K: f64 = 0.408e-3;
/// Response time of seed 000's DDYS disk for writes its cache acknowledges at once (section 4.1), seconds.
pub const DISK_CACHED: f64 = 0.24e-3;

/// One blocking I/O from a host through the gateways to a remote disk.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct IoLatency {
    /// `T_disk`: access plus transfer time at the disk, seconds.
    pub disk: f64,
    /// `T_netDelay`: one-way network delay, seconds.
    pub net_delay: f64,
    /// `T_iSCSI`: protocol processing on both gateways, seconds.
    pub iscsi: f64,
}

impl IoLatency {
    /// Checks that every time is finite and non-negative.
    pub fn validate(&self) -> Result<()> {
        check_min("disk time", self.disk, 0.0, "a finite, non-negative duration")?;
        check_min("network delay", self.net_delay, 0.0, "a finite, non-negative duration")?;
        check_min("iSCSI time", self.iscsi, 0.0, "a finite, non-negative duration")?;
        Ok(())
    }

    /// Eq. (1): `T_IOLatency = T_disk + 2·T_netDelay + T_iSCSI`.
    pub fn blocking(&self) -> f64 {
        self.disk + 2.0 * self.net_delay + self.iscsi
    }

    /// Fig. 3: back-to-back random writes to a disk whose write cache is full complete every
    /// `T_iSCSI + max(T_disk, 2·T_netDelay)`: the disk acknowledges a write as soon as the previous one has
    /// reached the media, so the round trip overlaps the previous write's flush.
    pub fn random_write_busy_disk(&self) -> f64 {
        self.iscsi + self.disk.max(2.0 * self.net_delay)
    }

    /// Whether the round trip hides behind the disk (`2·T_netDelay ≤ T_disk`).
    pub fn network_masked(&self) -> bool {
        2.0 * self.net_delay <= self.disk
    }
}

/// Throughput of one blocking thread doing `block`-byte I/Os that each take `latency` seconds.
pub fn single_thread_throughput(block: f64, latency: f64) -> f64 {
    block / latency
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn masking_switches_at_the_disk_time() {
        let io = IoLatency { disk: 4e-3, net_delay: 1e-3, iscsi: ISCSI_8K };
        assert!(io.network_masked());
        assert_eq!(io.random_write_busy_disk(), ISCSI_8K + 4e-3);
        let io = IoLatency { net_delay: 3e-3, ..io };
        assert!(!io.network_masked());
        assert_eq!(io.random_write_busy_disk(), ISCSI_8K + 6e-3);
        assert!(io.random_write_busy_disk() < io.blocking());
    }
}
