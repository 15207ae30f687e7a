//! What the cache says about its devices: healthy, degraded (failures that may go away by
//! themselves, retried with backoff) or stalled (a lasting failure, reported and retried only
//! to notice a repair), with the error, the block and since when; counts by kind; when to try
//! again; and when a host write that cannot be absorbed must end instead of waiting.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use stics_block::BlockError;

/// What failed, as an operator reads it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorKind {
    /// The remote could not be reached (a lost connection, a timed-out login).
    Unreachable,
    /// The remote was busy or resetting (BUSY, TASK SET FULL, a unit attention, not ready).
    Busy,
    /// The remote's medium failed (MEDIUM ERROR, HARDWARE ERROR, any other error).
    Medium,
    /// The remote has no space for the write (a thin LUN whose pool is full).
    NoSpace,
    /// The remote refuses writes.
    WriteProtected,
    /// The remote refuses our writes under a reservation: another writer holds it, or took it
    /// from us (the initiator makes a claim a target merely forgot again itself).
    Reserved,
    /// The local log device failed.
    Log,
}

impl ErrorKind {
    /// The kind of a remote's error.
    pub fn of(e: &BlockError) -> ErrorKind {
        match e {
            BlockError::Unreachable(_) => ErrorKind::Unreachable,
            BlockError::Busy(_) => ErrorKind::Busy,
            BlockError::Reserved { .. } => ErrorKind::Reserved,
            BlockError::NoSpace(_) => ErrorKind::NoSpace,
            BlockError::WriteProtected(_) => ErrorKind::WriteProtected,
            _ => ErrorKind::Medium,
        }
    }

    /// True for failures that may go away by themselves.
    pub fn transient(self) -> bool {
        matches!(self, ErrorKind::Unreachable | ErrorKind::Busy)
    }

    /// The name in `/status` and `/metrics`.
    pub fn name(self) -> &'static str {
        match self {
            ErrorKind::Unreachable => "unreachable",
            ErrorKind::Busy => "busy",
            ErrorKind::Medium => "medium",
            ErrorKind::NoSpace => "no_space",
            ErrorKind::WriteProtected => "write_protected",
            ErrorKind::Reserved => "reserved",
            ErrorKind::Log => "log",
        }
    }

    /// The error a host write gets when it cannot be absorbed because of this failure: one the
    /// SCSI layer turns into sense data that names the cause.
    pub fn host_error(self, detail: &str) -> BlockError {
        match self {
            ErrorKind::NoSpace => BlockError::NoSpace(format!("the remote is full: {detail}")),
            ErrorKind::WriteProtected => BlockError::WriteProtected(format!("the remote refuses writes: {detail}")),
            ErrorKind::Reserved => BlockError::WriteProtected(format!("another writer holds the remote: {detail}")),
            ErrorKind::Medium => {
                BlockError::Io { lba: 0, source: std::io::Error::other(format!("the remote fails writes: {detail}")) }
            }
            ErrorKind::Log => {
                BlockError::Io { lba: 0, source: std::io::Error::other(format!("the write log fails: {detail}")) }
            }
            ErrorKind::Unreachable | ErrorKind::Busy => {
                BlockError::Stalled(format!("the remote has not answered for too long: {detail}"))
            }
        }
    }
}

/// The cache's state as `/status` names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum State {
    /// Everything works.
    #[default]
    Healthy,
    /// A failure that may go away by itself; retried with backoff.
    Degraded,
    /// A lasting failure; destage cannot go on until it is repaired.
    Stalled,
}

/// The failure in force.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    /// What failed.
    pub kind: ErrorKind,
    /// The error's text.
    pub error: String,
    /// The remote block it concerned, when one did.
    pub lba: Option<u64>,
    /// When this run of failures began.
    pub since: Instant,
}

impl Failure {
    /// The error a host write that cannot be absorbed because of this failure ends with at
    /// `now`, naming the failure and how long it has lasted.
    pub fn host_error(&self, now: Instant) -> BlockError {
        let since = now.saturating_duration_since(self.since).as_secs();
        self.kind.host_error(&format!("{} for {since} s", self.error))
    }
}

/// A change of state, to log once.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    /// Into a failing state, or from one kind of failure to another.
    Failing(State, Failure),
    /// Back to healthy after failing for this long.
    Recovered(Duration),
    /// Destage stopped shipping groups to the SG and goes on with plain writes, for this reason.
    GroupsOff { why: String },
}

/// The health state machine. Pure: callers pass `now`.
#[derive(Debug, Clone, Default)]
pub struct Health {
    failure: Option<Failure>,
    /// Failures in a row since the last success (the backoff's exponent).
    in_row: u32,
    /// Failures so far, by kind.
    counts: BTreeMap<ErrorKind, u64>,
    /// When the last reminder of a lasting failure was logged.
    reminded: Option<Instant>,
}

/// How often a failure in force is logged again.
pub const REMINDER: Duration = Duration::from_secs(60);

impl Health {
    /// The state in force.
    pub fn state(&self) -> State {
        match &self.failure {
            None => State::Healthy,
            Some(f) if f.kind.transient() => State::Degraded,
            Some(_) => State::Stalled,
        }
    }

    /// The failure in force.
    pub fn failure(&self) -> Option<&Failure> {
        self.failure.as_ref()
    }

    /// Failures so far, by kind.
    pub fn counts(&self) -> &BTreeMap<ErrorKind, u64> {
        &self.counts
    }

    /// An operation failed at `now`: counts it, says how long to wait before the next attempt
    /// (exponential backoff from `first` to `max` for transient failures, `max` for lasting
    /// ones) and whether the state changed.
    pub fn failed(
        &mut self,
        kind: ErrorKind,
        error: String,
        lba: Option<u64>,
        now: Instant,
        first: Duration,
        max: Duration,
    ) -> (Duration, Option<Change>) {
        *self.counts.entry(kind).or_default() += 1;
        self.in_row = self.in_row.saturating_add(1);
        let wait = if kind.transient() {
            first.saturating_mul(1 << (self.in_row - 1).min(16)).min(max)
        } else {
            max.max(first)
        };
        (wait, self.record(kind, error, lba, now))
    }

    fn record(&mut self, kind: ErrorKind, error: String, lba: Option<u64>, now: Instant) -> Option<Change> {
        let before = self.state();
        let (since, same_kind) = match &self.failure {
            Some(f) => (f.since, f.kind == kind),
            None => (now, false),
        };
        self.failure = Some(Failure { kind, error, lba, since });
        if same_kind && self.state() == before {
            return None;
        }
        self.reminded = Some(now);
        self.failure.clone().map(|f| Change::Failing(self.state(), f))
    }

    /// The device that failed with `kind` (the log when `log`, else the remote) made progress
    /// at `now`: back to healthy, unless the failure in force is the other device's.
    pub fn succeeded(&mut self, log: bool, now: Instant) -> Option<Change> {
        if self.failure.as_ref().is_some_and(|f| (f.kind == ErrorKind::Log) != log) {
            return None;
        }
        self.in_row = 0;
        self.reminded = None;
        self.failure.take().map(|f| Change::Recovered(now.saturating_duration_since(f.since)))
    }

    /// The failure in force, when it is due to be logged again at `now`.
    pub fn reminder(&mut self, now: Instant) -> Option<Failure> {
        let f = self.failure.as_ref()?;
        if self.reminded.is_some_and(|r| now.saturating_duration_since(r) < REMINDER) {
            return None;
        }
        self.reminded = Some(now);
        Some(f.clone())
    }

    /// The failure that has lasted longer than `bound` at `now`, if one has: a host write that
    /// cannot be absorbed ends with its error instead of waiting longer.
    pub fn past(&self, bound: Duration, now: Instant) -> Option<&Failure> {
        self.failure.as_ref().filter(|f| now.saturating_duration_since(f.since) >= bound)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const FIRST: Duration = Duration::from_millis(200);
    const MAX: Duration = Duration::from_secs(5);

    #[test]
    fn transient_failures_back_off_exponentially_and_change_state_once() {
        let t0 = Instant::now();
        let mut h = Health::default();
        let (first, c) = h.failed(ErrorKind::Unreachable, "cut".into(), None, t0, FIRST, MAX);
        assert_eq!(first, FIRST);
        assert!(matches!(c, Some(Change::Failing(State::Degraded, _))));
        let waits: Vec<Duration> = (0..7)
            .map(|_| {
                let (wait, c) = h.failed(ErrorKind::Unreachable, "cut".into(), None, t0, FIRST, MAX);
                assert_eq!(c, None);
                wait
            })
            .collect();
        assert_eq!(waits[0], Duration::from_millis(400));
        assert_eq!(waits[3], Duration::from_millis(3200));
        assert_eq!(waits[6], MAX);
        assert_eq!(h.counts()[&ErrorKind::Unreachable], 8);
        assert_eq!(h.succeeded(true, t0), None, "the log's progress does not clear the remote's failure");
        assert_eq!(h.succeeded(false, t0 + Duration::from_secs(3)), Some(Change::Recovered(Duration::from_secs(3))));
        assert_eq!(h.state(), State::Healthy);
        assert_eq!(h.succeeded(false, t0), None, "healthy stays healthy silently");
    }

    #[test]
    fn a_lasting_failure_stalls_and_is_retried_slowly_with_a_reminder_a_minute() {
        let t0 = Instant::now();
        let mut h = Health::default();
        let (wait, c) = h.failed(ErrorKind::NoSpace, "pool full".into(), Some(77), t0, FIRST, MAX);
        let Some(Change::Failing(State::Stalled, f)) = c else { panic!("{c:?}") };
        assert_eq!((f.kind, f.lba), (ErrorKind::NoSpace, Some(77)));
        assert_eq!(wait, MAX);
        assert_eq!(h.reminder(t0 + Duration::from_secs(30)), None);
        assert!(h.reminder(t0 + Duration::from_secs(61)).is_some());
        assert!(h.past(Duration::from_secs(60), t0 + Duration::from_secs(59)).is_none());
        assert!(h.past(Duration::from_secs(60), t0 + Duration::from_secs(60)).is_some());
        // Another kind is a change too, but the failure keeps its start.
        let (_, c) = h.failed(ErrorKind::Medium, "bad block".into(), Some(9), t0 + Duration::from_secs(70), FIRST, MAX);
        let Some(Change::Failing(State::Stalled, f)) = c else { panic!("{c:?}") };
        assert_eq!(f.since, t0);
    }

    #[test]
    fn errors_are_classified_by_what_an_operator_can_do_about_them() {
        assert!(ErrorKind::of(&BlockError::Unreachable("x".into())).transient());
        assert!(ErrorKind::of(&BlockError::Busy("x".into())).transient());
        assert_eq!(ErrorKind::of(&BlockError::Reserved { holder: None }), ErrorKind::Reserved);
        assert_eq!(ErrorKind::of(&BlockError::Reserved { holder: Some(3) }), ErrorKind::Reserved);
        assert_eq!(ErrorKind::of(&BlockError::NoSpace("x".into())), ErrorKind::NoSpace);
        let medium = BlockError::Io { lba: 1, source: std::io::Error::other("x") };
        assert_eq!(ErrorKind::of(&medium), ErrorKind::Medium);
        assert!(matches!(ErrorKind::NoSpace.host_error("x"), BlockError::NoSpace(_)));
        assert!(matches!(ErrorKind::Unreachable.host_error("x"), BlockError::Stalled(_)));
        assert!(matches!(ErrorKind::Reserved.host_error("x"), BlockError::WriteProtected(_)));
    }
}
