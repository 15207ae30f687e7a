//! Traffic counters of a session: commands, PDUs, bytes and round trips each way, reconnections,
//! retries and the unit attentions a LUN watches. Updated by the I/O driver (the protocol core
//! neither counts nor logs).

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// Live counters, shared between a session's tasks and its callers.
#[derive(Debug, Default)]
pub struct Counters {
    pub commands: AtomicU64,
    pub pdus_sent: AtomicU64,
    pub pdus_received: AtomicU64,
    pub bytes_sent: AtomicU64,
    pub bytes_received: AtomicU64,
    /// Exchanges where the initiator waits for the target before it can go on: each command,
    /// each R2T (a solicited burst), each login, text or NOP-Out ping request.
    pub round_trips: AtomicU64,
    pub reconnects: AtomicU64,
    /// Commands the LUN layer sent again after a unit attention, busy status or similar.
    pub retries: AtomicU64,
    /// Largest number of commands on the wire at once.
    pub max_in_flight: AtomicU64,
    /// UNIT ATTENTIONs of a power on or reset (ASC 29h) received.
    pub reset_attentions: AtomicU64,
    /// UNIT ATTENTIONs saying another nexus preempted this one's reservation or registration.
    pub preemptions: AtomicU64,
}

impl Counters {
    pub(crate) fn add(c: &AtomicU64, n: u64) {
        c.fetch_add(n, Relaxed);
    }

    /// A consistent-enough copy for printing.
    pub fn snapshot(&self) -> Snapshot {
        Snapshot {
            commands: self.commands.load(Relaxed),
            pdus_sent: self.pdus_sent.load(Relaxed),
            pdus_received: self.pdus_received.load(Relaxed),
            bytes_sent: self.bytes_sent.load(Relaxed),
            bytes_received: self.bytes_received.load(Relaxed),
            round_trips: self.round_trips.load(Relaxed),
            reconnects: self.reconnects.load(Relaxed),
            retries: self.retries.load(Relaxed),
            max_in_flight: self.max_in_flight.load(Relaxed),
            reset_attentions: self.reset_attentions.load(Relaxed),
            preemptions: self.preemptions.load(Relaxed),
        }
    }
}

/// Counter values at one moment.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Snapshot {
    pub commands: u64,
    pub pdus_sent: u64,
    pub pdus_received: u64,
    pub bytes_sent: u64,
    pub bytes_received: u64,
    pub round_trips: u64,
    pub reconnects: u64,
    pub retries: u64,
    pub max_in_flight: u64,
    pub reset_attentions: u64,
    pub preemptions: u64,
}

impl std::ops::Add for Snapshot {
    type Output = Snapshot;
    fn add(self, o: Snapshot) -> Snapshot {
        Snapshot {
            commands: self.commands + o.commands,
            pdus_sent: self.pdus_sent + o.pdus_sent,
            pdus_received: self.pdus_received + o.pdus_received,
            bytes_sent: self.bytes_sent + o.bytes_sent,
            bytes_received: self.bytes_received + o.bytes_received,
            round_trips: self.round_trips + o.round_trips,
            reconnects: self.reconnects + o.reconnects,
            retries: self.retries + o.retries,
            max_in_flight: self.max_in_flight.max(o.max_in_flight),
            reset_attentions: self.reset_attentions + o.reset_attentions,
            preemptions: self.preemptions + o.preemptions,
        }
    }
}

impl fmt::Display for Snapshot {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "commands        {:>14}", self.commands)?;
        writeln!(f, "pdus sent       {:>14}", self.pdus_sent)?;
        writeln!(f, "pdus received   {:>14}", self.pdus_received)?;
        writeln!(f, "bytes sent      {:>14}", self.bytes_sent)?;
        writeln!(f, "bytes received  {:>14}", self.bytes_received)?;
        writeln!(f, "round trips     {:>14}", self.round_trips)?;
        writeln!(f, "max in flight   {:>14}", self.max_in_flight)?;
        writeln!(f, "reconnects      {:>14}", self.reconnects)?;
        writeln!(f, "retries         {:>14}", self.retries)?;
        writeln!(f, "reset attentions{:>14}", self.reset_attentions)?;
        write!(f, "preemptions     {:>14}", self.preemptions)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn snapshots_add_and_keep_the_largest_depth() {
        let a = Snapshot { commands: 2, max_in_flight: 5, ..Default::default() };
        let b = Snapshot { commands: 3, max_in_flight: 7, ..Default::default() };
        let s = a + b;
        assert_eq!((s.commands, s.max_in_flight), (5, 7));
        assert!(s.to_string().contains("round trips"));
    }
}
