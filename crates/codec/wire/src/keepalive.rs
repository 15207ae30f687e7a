//! NOP keep-alive of one connection (RFC 7143 §11.18, §11.19), shared by target and initiator:
//! a connection silent for the interval gets a ping; one that stays silent for the timeout
//! after that is dead. Pure: callers pass `now`, send the ping and choose its tag.

use std::time::{Duration, Instant};

/// What to do when the deadline passes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tick {
    /// Nothing yet.
    Wait,
    /// Send a ping that asks for an answer.
    Ping,
    /// The ping went unanswered for the timeout: the connection is dead.
    Dead,
}

/// Liveness of one connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Keepalive {
    interval: Option<Duration>,
    timeout: Duration,
    last_rx: Instant,
    /// When the unanswered ping was sent (or, after traffic, when traffic last arrived).
    ping_sent: Option<Instant>,
}

impl Keepalive {
    /// `interval` of `None` turns pings off.
    pub fn new(interval: Option<Duration>, timeout: Duration, now: Instant) -> Keepalive {
        Keepalive { interval, timeout, last_rx: now, ping_sent: None }
    }

    /// Traffic arrived. It proves the connection alive, so an outstanding ping gets a full
    /// timeout again from now, but it stays outstanding until [`Keepalive::answered`].
    pub fn received(&mut self, now: Instant) {
        self.last_rx = now;
        if let Some(sent) = &mut self.ping_sent {
            *sent = now;
        }
    }

    /// The outstanding ping was answered.
    pub fn answered(&mut self) {
        self.ping_sent = None;
    }

    /// True while a ping waits for its answer.
    pub fn pinging(&self) -> bool {
        self.ping_sent.is_some()
    }

    /// When [`Keepalive::tick`] has something to do next, or `None` with pings off.
    pub fn deadline(&self) -> Option<Instant> {
        match self.ping_sent {
            Some(sent) => Some(sent + self.timeout),
            None => self.interval.map(|i| self.last_rx + i),
        }
    }

    /// Called at or after the deadline; a [`Tick::Ping`] counts as sent at `now`.
    pub fn tick(&mut self, now: Instant) -> Tick {
        match self.deadline() {
            Some(d) if now >= d => {}
            _ => return Tick::Wait,
        }
        if self.ping_sent.is_some() {
            return Tick::Dead;
        }
        self.ping_sent = Some(now);
        Tick::Ping
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Duration = Duration::from_secs(1);

    #[test]
    fn idle_connection_is_pinged_after_the_interval_and_dead_after_the_timeout() {
        let t0 = Instant::now();
        let mut k = Keepalive::new(Some(10 * S), 5 * S, t0);
        assert_eq!(k.deadline(), Some(t0 + 10 * S));
        assert_eq!(k.tick(t0 + 9 * S), Tick::Wait);
        assert_eq!(k.tick(t0 + 10 * S), Tick::Ping);
        assert!(k.pinging());
        assert_eq!(k.deadline(), Some(t0 + 15 * S));
        assert_eq!(k.tick(t0 + 15 * S), Tick::Dead);
    }

    #[test]
    fn an_answer_restarts_the_interval() {
        let t0 = Instant::now();
        let mut k = Keepalive::new(Some(10 * S), 5 * S, t0);
        assert_eq!(k.tick(t0 + 10 * S), Tick::Ping);
        k.received(t0 + 12 * S);
        k.answered();
        assert_eq!(k.deadline(), Some(t0 + 22 * S));
        assert_eq!(k.tick(t0 + 22 * S), Tick::Ping);
    }

    #[test]
    fn traffic_without_an_answer_extends_the_timeout() {
        let t0 = Instant::now();
        let mut k = Keepalive::new(Some(10 * S), 5 * S, t0);
        assert_eq!(k.tick(t0 + 10 * S), Tick::Ping);
        k.received(t0 + 13 * S);
        assert_eq!(k.deadline(), Some(t0 + 18 * S));
        assert_eq!(k.tick(t0 + 17 * S), Tick::Wait);
        assert_eq!(k.tick(t0 + 18 * S), Tick::Dead);
    }

    #[test]
    fn pings_off_means_no_deadline() {
        let t0 = Instant::now();
        let mut k = Keepalive::new(None, 5 * S, t0);
        assert_eq!(k.deadline(), None);
        assert_eq!(k.tick(t0 + 1000 * S), Tick::Wait);
    }
}
