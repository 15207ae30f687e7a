//! When to try reconnecting after a lost connection, and when to give up: exponential backoff
//! within a recovery window. Pure: it takes `now` and returns decisions.

use std::time::{Duration, Instant};

/// Reconnection limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecoveryPolicy {
    /// How long the session keeps trying before failing the waiting commands.
    pub timeout: Duration,
    /// First wait between attempts; doubles each time up to `max_backoff`.
    pub min_backoff: Duration,
    pub max_backoff: Duration,
}

impl Default for RecoveryPolicy {
    fn default() -> Self {
        RecoveryPolicy {
            timeout: Duration::from_secs(60),
            min_backoff: Duration::from_millis(50),
            max_backoff: Duration::from_secs(2),
        }
    }
}

/// What to do next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// Try to log in again at this time.
    RetryAt(Instant),
    /// The recovery window is over: fail the commands that wait.
    GiveUp,
}

/// Reconnection state of one session.
#[derive(Debug, Clone)]
pub struct Recovery {
    policy: RecoveryPolicy,
    /// When the session lost its connection; `None` while connected.
    lost_at: Option<Instant>,
    attempts: u32,
}

impl Recovery {
    pub fn new(policy: RecoveryPolicy) -> Recovery {
        Recovery { policy, lost_at: None, attempts: 0 }
    }

    pub fn policy(&self) -> RecoveryPolicy {
        self.policy
    }

    /// The connection was lost (or a reconnection is wanted) at `now`. The first attempt is
    /// immediate: a target that restarts or a connection that was cut is usually back at once.
    pub fn on_lost(&mut self, now: Instant) -> Decision {
        if self.lost_at.is_none() {
            self.lost_at = Some(now);
            self.attempts = 0;
        }
        self.next(now)
    }

    /// A reconnection attempt failed at `now`; `permanent` failures (bad credentials) end the
    /// recovery at once instead of retrying.
    pub fn on_attempt_failed(&mut self, now: Instant, permanent: bool) -> Decision {
        if permanent {
            self.lost_at = None;
            return Decision::GiveUp;
        }
        self.attempts = self.attempts.saturating_add(1);
        self.next(now)
    }

    fn next(&mut self, now: Instant) -> Decision {
        let lost = *self.lost_at.get_or_insert(now);
        if now.saturating_duration_since(lost) >= self.policy.timeout {
            self.lost_at = None;
            return Decision::GiveUp;
        }
        let wait = if self.attempts == 0 {
            Duration::ZERO
        } else {
            let factor = 1u32 << (self.attempts - 1).min(16);
            self.policy.min_backoff.saturating_mul(factor).min(self.policy.max_backoff)
        };
        let deadline = lost + self.policy.timeout;
        Decision::RetryAt((now + wait).min(deadline))
    }

    /// When the window closes, if recovering.
    pub fn deadline(&self) -> Option<Instant> {
        self.lost_at.map(|l| l + self.policy.timeout)
    }

    /// A login succeeded.
    pub fn on_success(&mut self) {
        self.lost_at = None;
        self.attempts = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy() -> RecoveryPolicy {
        RecoveryPolicy {
            timeout: Duration::from_secs(10),
            min_backoff: Duration::from_millis(100),
            max_backoff: Duration::from_secs(1),
        }
    }

    #[test]
    fn first_retry_is_immediate_then_backoff_doubles_up_to_the_cap() {
        let t0 = Instant::now();
        let mut r = Recovery::new(policy());
        assert_eq!(r.on_lost(t0), Decision::RetryAt(t0));
        let waits: Vec<u128> = (0..6)
            .map(|_| match r.on_attempt_failed(t0, false) {
                Decision::RetryAt(t) => (t - t0).as_millis(),
                Decision::GiveUp => 0,
            })
            .collect();
        assert_eq!(waits, vec![100, 200, 400, 800, 1000, 1000]);
    }

    #[test]
    fn gives_up_when_the_window_closes() {
        let t0 = Instant::now();
        let mut r = Recovery::new(policy());
        r.on_lost(t0);
        assert!(matches!(r.on_attempt_failed(t0 + Duration::from_secs(9), false), Decision::RetryAt(_)));
        assert_eq!(r.on_attempt_failed(t0 + Duration::from_secs(10), false), Decision::GiveUp);
        // A new loss opens a new window.
        assert_eq!(r.on_lost(t0 + Duration::from_secs(11)), Decision::RetryAt(t0 + Duration::from_secs(11)));
    }

    #[test]
    fn permanent_failure_gives_up_without_retrying() {
        let t0 = Instant::now();
        let mut r = Recovery::new(policy());
        r.on_lost(t0);
        assert_eq!(r.on_attempt_failed(t0, true), Decision::GiveUp);
        assert_eq!(r.deadline(), None);
    }

    #[test]
    fn success_resets_the_window() {
        let t0 = Instant::now();
        let mut r = Recovery::new(policy());
        r.on_lost(t0);
        r.on_attempt_failed(t0, false);
        r.on_success();
        assert_eq!(r.deadline(), None);
        assert_eq!(r.on_lost(t0 + Duration::from_secs(60)), Decision::RetryAt(t0 + Duration::from_secs(60)));
    }
}
