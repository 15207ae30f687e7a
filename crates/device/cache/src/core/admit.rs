//! Whether a host write may come in now: at once while RAM, the log and the index have room;
//! slowed on a smooth curve as the log fills (so that writes follow the destage rate instead of
//! stopping at a cliff); held while something is full; refused with the cause once something is
//! full and the remote or the log has been failing for longer than the full timeout.

use std::time::{Duration, Instant};

use stics_block::BlockError;

use super::Core;

/// Log fill from which the log counts as full.
const FULL: f64 = 0.98;
/// Slowed writes go in at multiples of this after the first admission: let in one by one, each
/// would be acknowledged alone, and in `log` mode each would then make an epoch of its own,
/// which destage sends with a flush of its own: the remote's flushes, not the path, would set
/// the pace.
pub const TICK: Duration = Duration::from_millis(2);
/// Longest slowdown, at a full log.
const MAX_DELAY: Duration = Duration::from_millis(20);

/// What a host write of some bytes must do before it comes in.
#[derive(Debug)]
pub enum Admit {
    /// Come in now.
    Now,
    /// Come in at this time, or earlier when destage frees log space.
    At(Instant),
    /// Wait until RAM, the log or the index has room, then ask again.
    Full,
    /// End with this error: something is full and the failure behind it has lasted too long.
    Refuse(BlockError),
}

/// The admission clock.
#[derive(Debug, Default)]
pub(crate) struct AdmitState {
    /// When the first write asked: the grid of [`TICK`]s starts there.
    origin: Option<Instant>,
}

impl Core {
    /// Whether a host write of `bytes` may come in at `now`.
    pub fn admit(&mut self, bytes: u64, now: Instant) -> Admit {
        let origin = *self.admit.origin.get_or_insert(now);
        if self.direct_writes() {
            // It goes to the remote directly and takes nothing here.
            return Admit::Now;
        }
        self.tick(now);
        let fill = self.log_fill();
        let full = !self.ram_has_room(bytes)
            || fill >= FULL
            || self.index_extents() >= self.cfg.max_extents()
            || self.over_lag(bytes, now);
        if full {
            if let Some(f) = self.health.past(self.cfg.full_timeout, now) {
                return Admit::Refuse(f.host_error(now));
            }
            return Admit::Full;
        }
        let from = self.cfg.throttle_from;
        if fill < from {
            return Admit::Now;
        }
        let over = ((fill - from) / (1.0 - from).max(1e-3)).clamp(0.0, 1.0);
        let delay = MAX_DELAY.mul_f64(over * over);
        let tick = TICK.as_nanos();
        let since = (now + delay).saturating_duration_since(origin).as_nanos();
        Admit::At(origin + Duration::from_nanos((since.div_ceil(tick) * tick) as u64))
    }

    /// The error a request waiting for its acknowledgement gets at `now` (a write waiting for
    /// its record, a flush waiting for the log, a write-through write waiting for destage when
    /// `for_remote`), when the failure in force has lasted longer than the full timeout and the
    /// wait cannot end without the device that fails. The request may still take effect later:
    /// a write that ended with an error may or may not have been applied.
    pub fn stalled(&self, for_remote: bool, now: Instant) -> Option<BlockError> {
        let f = self.health.past(self.cfg.full_timeout, now)?;
        let log_failing = f.kind == super::ErrorKind::Log;
        // Writes wait in RAM with no record being written: the ring has no room for one, and
        // only destage (the remote) can make it.
        let ring_full = self.log.waiting_for_room();
        (log_failing || ring_full || for_remote).then(|| f.host_error(now))
    }
}
