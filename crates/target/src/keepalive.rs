//! Target-initiated NOP-In pings (RFC 7143 §11.19): a connection whose initiator has been silent
//! for the ping interval gets a ping asking for an answer; one that stays silent for the timeout
//! after that is dropped. A pure state machine: the driver passes `now` and does the sending.

use std::time::Duration;

use tokio::time::Instant;

/// What the driver should do when the deadline passes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tick {
    /// Nothing yet (the initiator spoke in the meantime).
    Wait,
    /// Send a NOP-In with ITT 0xffffffff and this Target Transfer Tag, which asks for a NOP-Out.
    Ping(u32),
    /// The initiator did not answer in time: drop the connection.
    Dead,
}

/// Liveness of one connection.
#[derive(Debug)]
pub struct Keepalive {
    interval: Option<Duration>,
    timeout: Duration,
    last_rx: Instant,
    /// When the unanswered ping was sent.
    ping_sent: Option<Instant>,
    next_ttt: u32,
}

impl Keepalive {
    /// `interval` of `None` turns pings off.
    pub fn new(interval: Option<Duration>, timeout: Duration, now: Instant) -> Keepalive {
        Keepalive { interval, timeout, last_rx: now, ping_sent: None, next_ttt: 1 }
    }

    /// Anything arrived from the initiator: it is alive, whatever it sent.
    pub fn received(&mut self, now: Instant) {
        self.last_rx = now;
        self.ping_sent = None;
    }

    /// When [`Keepalive::tick`] has something to do next, or `None` with pings off.
    pub fn deadline(&self) -> Option<Instant> {
        match self.ping_sent {
            Some(sent) => Some(sent + self.timeout),
            None => self.interval.map(|i| self.last_rx + i),
        }
    }

    /// Called at or after the deadline.
    pub fn tick(&mut self, now: Instant) -> Tick {
        match self.deadline() {
            Some(d) if now >= d => {}
            _ => return Tick::Wait,
        }
        if self.ping_sent.is_some() {
            return Tick::Dead;
        }
        self.ping_sent = Some(now);
        let ttt = self.next_ttt;
        // 0xffffffff would mean "no answer wanted".
        self.next_ttt = match self.next_ttt.wrapping_add(1) {
            u32::MAX => 1,
            n => n,
        };
        Tick::Ping(ttt)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Duration = Duration::from_secs(1);

    #[test]
    fn idle_connection_is_pinged_after_the_interval_and_dropped_after_the_timeout() {
        let t0 = Instant::now();
        let mut k = Keepalive::new(Some(10 * S), 5 * S, t0);
        assert_eq!(k.deadline(), Some(t0 + 10 * S));
        assert_eq!(k.tick(t0 + 9 * S), Tick::Wait);
        assert_eq!(k.tick(t0 + 10 * S), Tick::Ping(1));
        assert_eq!(k.deadline(), Some(t0 + 15 * S));
        assert_eq!(k.tick(t0 + 15 * S), Tick::Dead);
    }

    #[test]
    fn an_answer_or_any_pdu_resets_the_timer() {
        let t0 = Instant::now();
        let mut k = Keepalive::new(Some(10 * S), 5 * S, t0);
        assert_eq!(k.tick(t0 + 10 * S), Tick::Ping(1));
        k.received(t0 + 12 * S);
        assert_eq!(k.deadline(), Some(t0 + 22 * S));
        assert_eq!(k.tick(t0 + 22 * S), Tick::Ping(2));
    }

    #[test]
    fn pings_off_means_no_deadline() {
        let mut k = Keepalive::new(None, 5 * S, Instant::now());
        assert_eq!(k.deadline(), None);
        assert_eq!(k.tick(Instant::now() + 1000 * S), Tick::Wait);
    }
}
