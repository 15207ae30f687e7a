//! The disk model as a pure state machine: each request goes in with the time it arrives and
//! comes out with the time it completes. No clock is read and nothing sleeps here; [`crate::DiskDev`]
//! does the waiting.
//!
//! Times are [`Duration`]s since an origin the caller picks (the platter's angle is 0 there);
//! positions are byte offsets into the device. The device's bytes are spread over the full
//! stroke of the arm, so requests uniformly random over the whole device see the disk's average
//! seek, and requests confined to a part of it see the shorter seeks of the curve.
//!
//! # The mechanics of one access
//!
//! An access that starts where the previous one ended, or a little ahead of it on the same
//! track, costs the transfer of the bytes in between and its own: the drive's read-ahead and
//! track skew keep the head in place, so there is no command overhead, seek or rotational wait
//! (seed 000 §4.1: "for sequential I/O Tdisk omits the seek and rotational components").
//! Any other access costs the command overhead, a seek, the rotational wait and the transfer:
//!
//! - **Seek**: `t(d) = t_track + (t_full − t_track)·√(d/D)` for a distance of `d` bytes on a
//!   stroke of `D` bytes, and nothing on the same track. For `x`, `y` uniform on `[0, 1]`,
//!   `E[√|x−y|] = ∫∫ √|x−y| = 2·∫₀¹ (1−u)·√u du = 2·(2/3 − 2/5) = 8/15`, so the mean over random
//!   request pairs is `t_track + (t_full − t_track)·8/15`; `t_full` is chosen to make that the
//!   disk's average seek: `t_full = t_track + (t_avg − t_track)·15/8`.
//! - **Rotation**: the platter turns at the disk's RPM from angle 0 at time 0; a byte's angle is
//!   its offset within its track (a track holds what passes under the head in one revolution at
//!   the media rate). The wait is from the platter's angle when the seek ends to the first
//!   byte's angle: deterministic, and half a revolution on average over random targets.
//! - **Transfer**: bytes over the media rate (one zone: the rate given for the whole disk).
//!
//! # Queue order and the write buffer
//!
//! Requests are served in the order they arrive (FIFO): each starts when the mechanism is free.
//! With a write buffer of N bytes, a write is acknowledged (after the command overhead) as soon
//! as it fits in the buffer, waiting for room while the buffer is full (seed 000 Fig. 3), and
//! the buffer drains to the medium in the background on the same single-server timeline, in
//! arrival order (`Queue::Fifo`) or in an elevator sweep over the offsets (`Queue::Elevator`,
//! LOOK: onwards in the direction of travel, turning where nothing is left ahead). A drain that
//! has started is never undone. Reads, writes with FUA and writes larger than the buffer go to
//! the medium directly, ahead of buffered writes that have not started (the host already has
//! its answer for those); FLUSH completes once the buffer is empty. Reads of data still in the
//! buffer are timed as reads of the medium: the buffer holds writes only.

use std::collections::VecDeque;
use std::time::Duration;

/// The order a write buffer drains in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Queue {
    /// In the order the writes arrived.
    Fifo,
    /// An elevator (LOOK) over the offsets from where the head is.
    Elevator,
}

/// The mechanical parameters of one disk.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Mechanics {
    /// Revolutions per minute.
    pub rpm: f64,
    /// The average seek over random request pairs.
    pub avg_seek: Duration,
    /// The shortest seek (to the next track).
    pub track_seek: Duration,
    /// The media transfer rate, bytes per second.
    pub transfer: f64,
    /// Command processing, paid by every access that is not sequential.
    pub overhead: Duration,
}

impl Mechanics {
    /// One revolution of the platter.
    pub fn revolution(&self) -> Duration {
        Duration::from_secs_f64(60.0 / self.rpm)
    }

    /// The full-stroke seek that makes the mean over random pairs [`Mechanics::avg_seek`].
    pub fn full_seek(&self) -> Duration {
        let (track, avg) = (self.track_seek.as_secs_f64(), self.avg_seek.as_secs_f64());
        Duration::from_secs_f64(track + (avg - track) * 15.0 / 8.0)
    }

    /// The seek across `fraction` of the stroke (0 to 1); zero stays on the track.
    pub fn seek(&self, fraction: f64) -> Duration {
        if fraction <= 0.0 {
            return Duration::ZERO;
        }
        let (track, full) = (self.track_seek.as_secs_f64(), self.full_seek().as_secs_f64());
        Duration::from_secs_f64(track + (full - track) * fraction.min(1.0).sqrt())
    }

    /// Moving `bytes` to or from the medium.
    pub fn transfer_time(&self, bytes: u64) -> Duration {
        Duration::from_secs_f64(bytes as f64 / self.transfer)
    }

    /// Bytes on one track: what passes under the head in a revolution.
    pub fn track_bytes(&self) -> f64 {
        self.transfer * 60.0 / self.rpm
    }

    /// The mean time of a random access of `bytes` (seed 000's Tdisk for random I/O): command
    /// overhead, average seek, half a revolution and the transfer.
    pub fn random_access(&self, bytes: u64) -> Duration {
        self.overhead + self.avg_seek + self.revolution() / 2 + self.transfer_time(bytes)
    }

    /// Checks that the parameters describe a disk that turns and moves data.
    pub fn check(&self) -> Result<(), String> {
        let ok = |v: f64| v.is_finite() && v > 0.0;
        if !ok(self.rpm) {
            return Err(format!("rpm must be positive, not {}", self.rpm));
        }
        if !ok(self.transfer) {
            return Err(format!("the transfer rate must be positive, not {}", self.transfer));
        }
        if self.track_seek > self.avg_seek {
            return Err(format!(
                "the track-to-track seek ({:?}) exceeds the average seek ({:?})",
                self.track_seek, self.avg_seek
            ));
        }
        Ok(())
    }
}

/// The arm and platter of one disk: where the head is and when it is free.
#[derive(Debug, Clone)]
pub struct Head {
    mech: Mechanics,
    /// Bytes across the full stroke.
    stroke: u64,
    /// Where the last access ended.
    pos: u64,
    /// When the mechanism finishes what it has been given.
    free: Duration,
}

impl Head {
    /// A head parked at offset 0 over a stroke of `stroke` bytes, idle since time 0.
    pub fn new(mech: Mechanics, stroke: u64) -> Head {
        Head { mech, stroke: stroke.max(1), pos: 0, free: Duration::ZERO }
    }

    /// The disk's mechanics.
    pub fn mechanics(&self) -> &Mechanics {
        &self.mech
    }

    /// When the mechanism is next free.
    pub fn free(&self) -> Duration {
        self.free
    }

    /// Where the last access ended.
    pub fn position(&self) -> u64 {
        self.pos
    }

    /// Serves `len` bytes at `offset` no earlier than `start`, after what the head has already
    /// been given; returns when the transfer ends.
    pub fn serve(&mut self, start: Duration, offset: u64, len: u64) -> Duration {
        let m = self.mech;
        let t0 = start.max(self.free);
        let track = m.track_bytes();
        let ahead = offset.checked_sub(self.pos).filter(|gap| (*gap as f64) < track);
        let end = match ahead {
            // Read-ahead and track skew: the platter brings the start under the head in place.
            Some(gap) => t0 + m.transfer_time(gap + len),
            None => {
                let same_track = (offset as f64 / track).floor() == (self.pos as f64 / track).floor();
                let seek = if same_track {
                    Duration::ZERO
                } else {
                    m.seek(offset.abs_diff(self.pos) as f64 / self.stroke as f64)
                };
                let arrive = t0 + m.overhead + seek;
                let rev = m.revolution().as_secs_f64();
                let target = (offset as f64 / track).fract();
                let angle = (arrive.as_secs_f64() / rev).fract();
                let wait = (target - angle).rem_euclid(1.0) * rev;
                arrive + Duration::from_secs_f64(wait) + m.transfer_time(len)
            }
        };
        self.pos = offset + len;
        self.free = end;
        end
    }
}

/// A buffered write waiting for the medium.
#[derive(Debug, Clone, Copy)]
struct Pending {
    /// When it entered the buffer (and was acknowledged).
    arrival: Duration,
    offset: u64,
    len: u64,
}

/// One disk with an optional volatile write buffer.
#[derive(Debug, Clone)]
pub struct Disk {
    head: Head,
    /// Buffer bytes; 0 for none.
    buffer: u64,
    queue: Queue,
    pending: VecDeque<Pending>,
    pending_bytes: u64,
    /// The buffered write being written to the medium: when it ends and its bytes.
    in_service: Option<(Duration, u64)>,
    /// The elevator's direction of travel.
    upwards: bool,
    /// The latest time seen: requests never go back in time.
    last: Duration,
}

impl Disk {
    /// A disk over `bytes` of device with `buffer` bytes of write buffer (0: none).
    pub fn new(mech: Mechanics, bytes: u64, buffer: u64, queue: Queue) -> Disk {
        Disk {
            head: Head::new(mech, bytes),
            buffer,
            queue,
            pending: VecDeque::new(),
            pending_bytes: 0,
            in_service: None,
            upwards: true,
            last: Duration::ZERO,
        }
    }

    /// True when completed writes may still be in the volatile buffer.
    pub fn volatile(&self) -> bool {
        self.buffer > 0
    }

    /// Bytes in the buffer at `t` (waiting or being written), as far as drains have been decided.
    pub fn buffered(&self, t: Duration) -> u64 {
        self.pending_bytes + self.in_service.filter(|(end, _)| *end > t).map_or(0, |(_, n)| n)
    }

    fn clock(&mut self, now: Duration) -> Duration {
        self.last = self.last.max(now);
        self.last
    }

    /// Starts every buffered write whose turn on the medium comes by `t`.
    fn advance(&mut self, t: Duration) {
        while let Some(first) = self.pending.iter().map(|p| p.arrival).min() {
            let start = self.head.free().max(first);
            if start > t {
                break;
            }
            let i = self.pick(start);
            let Some(p) = self.pending.remove(i) else { break };
            let end = self.head.serve(start, p.offset, p.len);
            self.pending_bytes -= p.len;
            self.in_service = Some((end, p.len));
        }
    }

    /// The index of the buffered write the medium takes next at `start`.
    fn pick(&mut self, start: Duration) -> usize {
        let here = self.pending.iter().enumerate().filter(|(_, p)| p.arrival <= start);
        match self.queue {
            Queue::Fifo => here.min_by_key(|(_, p)| p.arrival).map_or(0, |(i, _)| i),
            Queue::Elevator => {
                let pos = self.head.position();
                // The nearest write ahead of the head and the nearest behind it: (index, offset).
                let mut up: Option<(usize, u64)> = None;
                let mut down: Option<(usize, u64)> = None;
                for (i, p) in here {
                    if p.offset >= pos {
                        if up.is_none_or(|(_, o)| p.offset < o) {
                            up = Some((i, p.offset));
                        }
                    } else if down.is_none_or(|(_, o)| p.offset > o) {
                        down = Some((i, p.offset));
                    }
                }
                let (ahead, behind) = if self.upwards { (up, down) } else { (down, up) };
                match (ahead, behind) {
                    (Some((i, _)), _) => i,
                    (None, Some((i, _))) => {
                        self.upwards = !self.upwards;
                        i
                    }
                    (None, None) => 0,
                }
            }
        }
    }

    /// A read of `len` bytes at `offset` arriving at `now`: when it completes.
    pub fn read(&mut self, now: Duration, offset: u64, len: u64) -> Duration {
        let now = self.clock(now);
        self.advance(now);
        self.head.serve(now, offset, len)
    }

    /// A write arriving at `now`: when it is acknowledged (in the buffer, or on the medium with
    /// `fua`, without a buffer, or when it is larger than the buffer).
    pub fn write(&mut self, now: Duration, offset: u64, len: u64, fua: bool) -> Duration {
        let now = self.clock(now);
        self.advance(now);
        if fua || self.buffer == 0 || len > self.buffer {
            return self.head.serve(now, offset, len);
        }
        let mut t = now;
        // Each turn either ends the write in service or starts the next one: bounded.
        for _ in 0..=2 * self.pending.len() + 2 {
            if self.buffered(t) + len <= self.buffer {
                break;
            }
            let next = match self.in_service {
                Some((end, _)) if end > t => end,
                _ => match self.pending.iter().map(|p| p.arrival).min() {
                    Some(a) => self.head.free().max(a).max(t),
                    None => break,
                },
            };
            t = next;
            self.advance(t);
        }
        let ack = t + self.head.mechanics().overhead;
        self.pending.push_back(Pending { arrival: ack, offset, len });
        self.pending_bytes += len;
        ack
    }

    /// A FLUSH arriving at `now`: when the buffer is empty and what came before it is done.
    pub fn flush(&mut self, now: Duration) -> Duration {
        let now = self.clock(now);
        self.advance(Duration::MAX);
        self.head.free().max(now)
    }
}

/// A RAID 5 array of identical disks behind a controller with a volatile write cache.
///
/// Chunks rotate over the disks with the parity (left-symmetric): stripe `s` keeps its parity on
/// disk `n − 1 − s mod n` and its data chunks on the disks after it. A read goes to the disks
/// holding its chunks, in parallel. A write is acknowledged (after the command overhead) once it
/// fits in the cache; the controller then writes it at once as a read-modify-write per chunk:
/// it reads the old data and the old parity on their two disks in parallel, then writes both
/// back, so a small write costs two reads and two writes on two disks. The cache hides that
/// until it fills; then writes wait for room as on a single disk.
///
/// Simplifications: every write is a read-modify-write (no full-stripe writes, no coalescing in
/// the cache); each member serves its commands in the order the controller issues them (reads
/// are not put ahead of the cache's writes); members have no caches of their own; reads of data
/// still in the cache are timed as reads of the members.
#[derive(Debug, Clone)]
pub struct Raid5 {
    disks: Vec<Head>,
    chunk: u64,
    cache: u64,
    overhead: Duration,
    /// Writes issued from the cache: when each reaches both disks, and its bytes.
    drains: Vec<(Duration, u64)>,
    drain_bytes: u64,
    last: Duration,
}

impl Raid5 {
    /// `disks` disks of `mech` holding `bytes` of device in chunks of `chunk` bytes, behind a
    /// cache of `cache` bytes (0: none).
    pub fn new(mech: Mechanics, disks: usize, chunk: u64, bytes: u64, cache: u64) -> Raid5 {
        let data = (disks as u64 - 1) * chunk;
        let stroke = bytes.div_ceil(data) * chunk;
        Raid5 {
            disks: (0..disks).map(|_| Head::new(mech, stroke)).collect(),
            chunk,
            cache,
            overhead: mech.overhead,
            drains: Vec::new(),
            drain_bytes: 0,
            last: Duration::ZERO,
        }
    }

    /// True when completed writes may still be in the controller's cache.
    pub fn volatile(&self) -> bool {
        self.cache > 0
    }

    /// The pieces of `len` bytes at `offset`: (data disk, parity disk, offset on the disks, length).
    fn pieces(&self, offset: u64, len: u64) -> Vec<(usize, usize, u64, u64)> {
        let n = self.disks.len() as u64;
        let mut out = Vec::new();
        let (mut at, end) = (offset, offset + len);
        while at < end {
            let c = at / self.chunk;
            let within = at % self.chunk;
            let piece = (self.chunk - within).min(end - at);
            let stripe = c / (n - 1);
            let parity = n - 1 - stripe % n;
            let data = (parity + 1 + c % (n - 1)) % n;
            out.push((data as usize, parity as usize, stripe * self.chunk + within, piece));
            at += piece;
        }
        out
    }

    fn clock(&mut self, now: Duration) -> Duration {
        self.last = self.last.max(now);
        self.last
    }

    /// A read arriving at `now`: when its last piece arrives.
    pub fn read(&mut self, now: Duration, offset: u64, len: u64) -> Duration {
        let now = self.clock(now);
        let mut done = now;
        for (d, _, at, n) in self.pieces(offset, len) {
            done = done.max(self.disks[d].serve(now, at, n));
        }
        done
    }

    /// The read-modify-write of a write issued at `t`: when data and parity are on the disks.
    fn rmw(&mut self, t: Duration, offset: u64, len: u64) -> Duration {
        let mut done = t;
        for (d, p, at, n) in self.pieces(offset, len) {
            let old = self.disks[d].serve(t, at, n).max(self.disks[p].serve(t, at, n));
            done = done.max(self.disks[d].serve(old, at, n)).max(self.disks[p].serve(old, at, n));
        }
        done
    }

    /// A write arriving at `now`: when it is acknowledged.
    pub fn write(&mut self, now: Duration, offset: u64, len: u64, fua: bool) -> Duration {
        let now = self.clock(now);
        self.drains.retain(|(end, _)| *end > now);
        self.drain_bytes = self.drains.iter().map(|(_, n)| n).sum();
        if fua || self.cache == 0 || len > self.cache {
            return self.rmw(now, offset, len);
        }
        let mut t = now;
        if self.drain_bytes + len > self.cache {
            self.drains.sort_by_key(|(end, _)| *end);
            let mut held = self.drain_bytes;
            for (end, n) in &self.drains {
                if held + len <= self.cache {
                    break;
                }
                held -= n;
                t = *end;
            }
        }
        let done = self.rmw(t, offset, len);
        self.drains.push((done, len));
        self.drain_bytes += len;
        t + self.overhead
    }

    /// A FLUSH arriving at `now`: when every cached write is on the disks and what came before
    /// it is done.
    pub fn flush(&mut self, now: Duration) -> Duration {
        let now = self.clock(now);
        self.disks.iter().map(Head::free).fold(now, Duration::max)
    }
}

/// A single disk or an array, as one timeline of requests.
#[derive(Debug, Clone)]
pub enum Model {
    Disk(Disk),
    Raid5(Raid5),
}

impl Model {
    /// True when completed writes may be lost before a FLUSH.
    pub fn volatile(&self) -> bool {
        match self {
            Model::Disk(d) => d.volatile(),
            Model::Raid5(r) => r.volatile(),
        }
    }

    /// A read of `len` bytes at `offset` arriving at `now`: when it completes.
    pub fn read(&mut self, now: Duration, offset: u64, len: u64) -> Duration {
        match self {
            Model::Disk(d) => d.read(now, offset, len),
            Model::Raid5(r) => r.read(now, offset, len),
        }
    }

    /// A write arriving at `now`: when it completes (is acknowledged).
    pub fn write(&mut self, now: Duration, offset: u64, len: u64, fua: bool) -> Duration {
        match self {
            Model::Disk(d) => d.write(now, offset, len, fua),
            Model::Raid5(r) => r.write(now, offset, len, fua),
        }
    }

    /// A FLUSH arriving at `now`: when every write before it is on the medium.
    pub fn flush(&mut self, now: Duration) -> Duration {
        match self {
            Model::Disk(d) => d.flush(now),
            Model::Raid5(r) => r.flush(now),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(v: f64) -> Duration {
        Duration::from_secs_f64(v / 1e3)
    }

    /// How long after `earlier` `later` is; failing if it is not later.
    fn after(later: Duration, earlier: Duration) -> Duration {
        later.checked_sub(earlier).expect("a completion before its request")
    }

    /// The O7N3200's mechanics (seed 004 Table 2) with the crate's overhead and track seek.
    fn mech() -> Mechanics {
        Mechanics { rpm: 10_000.0, avg_seek: ms(4.9), track_seek: ms(0.49), transfer: 29.8e6, overhead: ms(0.1) }
    }

    /// A deterministic stream of numbers in [0, 1) (splitmix64), so the tests need no RNG crate.
    fn uniform(seed: u64) -> impl Iterator<Item = f64> {
        let mut s = seed;
        std::iter::repeat_with(move || {
            s = s.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let mut z = s;
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            (z ^ (z >> 31)) as f64 / (u64::MAX as f64 + 1.0)
        })
    }

    #[test]
    fn the_seek_curve_runs_from_the_track_seek_to_the_full_stroke() {
        let m = mech();
        assert_eq!(m.seek(0.0), Duration::ZERO);
        assert!((m.seek(1e-12).as_secs_f64() - 0.49e-3).abs() < 1e-7);
        // t_full = t_track + (t_avg − t_track)·15/8 = 0.49 + 4.41·1.875 ms.
        assert!((m.full_seek().as_secs_f64() - 8.758_75e-3).abs() < 1e-9, "{:?}", m.full_seek());
        assert_eq!(m.seek(1.0), m.full_seek());
        assert_eq!(m.seek(4.0), m.full_seek());
        assert!(m.seek(0.25) < m.seek(0.5) && m.seek(0.5) < m.seek(0.75));
    }

    #[test]
    fn the_mean_seek_over_random_pairs_is_the_average_seek() {
        let m = mech();
        let mut u = uniform(7);
        let n = 200_000;
        let sum: f64 = (0..n).map(|_| m.seek((u.next().unwrap() - u.next().unwrap()).abs()).as_secs_f64()).sum();
        let mean = sum / f64::from(n);
        assert!((mean / 4.9e-3 - 1.0).abs() < 0.005, "mean seek {mean}");
    }

    #[test]
    fn the_rotational_wait_is_deterministic_and_half_a_revolution_on_average() {
        let m = mech();
        let track = m.track_bytes() as u64;
        let rev = m.revolution().as_secs_f64();
        // The head stays on its track: no seek, only overhead, rotation and transfer.
        let mut u = uniform(11);
        let n = 20_000;
        let mut sum = 0.0;
        let mut h = Head::new(m, 1 << 30);
        for i in 0..n {
            let target = (u.next().unwrap() * (track - 4096) as f64) as u64 / 512 * 512;
            // Behind the head, so the access is not a skip ahead.
            h.pos = track - 1;
            let start = ms(100.0 * f64::from(i));
            let end = h.serve(start, target, 512);
            let wait = after(after(end, start), m.overhead + m.transfer_time(512)).as_secs_f64();
            assert!((0.0..rev).contains(&wait), "{wait}");
            sum += wait;
        }
        let mean = sum / f64::from(n);
        assert!((mean / (rev / 2.0) - 1.0).abs() < 0.02, "mean wait {mean}, half a revolution {}", rev / 2.0);
        let mut a = Head::new(m, 1 << 30);
        let mut b = Head::new(m, 1 << 30);
        assert_eq!(a.serve(ms(3.3), 777 * 512, 8192), b.serve(ms(3.3), 777 * 512, 8192));
    }

    #[test]
    fn a_sequential_access_costs_the_transfer_only() {
        let m = mech();
        let mut d = Disk::new(m, 1 << 30, 0, Queue::Fifo);
        let first = d.read(ms(1.0), 1 << 20, 8192);
        let second = d.read(first, (1 << 20) + 8192, 8192);
        assert_eq!(after(second, first), m.transfer_time(8192));
        // Even after the drive has been idle: its read-ahead kept the head in place.
        let third = d.read(second + ms(50.0), (1 << 20) + 16384, 8192);
        assert_eq!(after(third, second + ms(50.0)), m.transfer_time(8192));
        // A little further on the same track: the gap passes under the head too.
        let fourth = d.read(third, (1 << 20) + 32768, 8192);
        assert_eq!(after(fourth, third), m.transfer_time(8192 + 8192));
        // Writes without a buffer behave alike.
        let w = d.write(fourth, (1 << 20) + 40960, 8192, false);
        assert_eq!(after(w, fourth), m.transfer_time(8192));
    }

    #[test]
    fn random_accesses_average_seed_000s_tdisk() {
        let m = mech();
        let bytes = 1u64 << 30;
        let mut d = Disk::new(m, bytes, 0, Queue::Fifo);
        let mut u = uniform(3);
        let (mut t, n) = (Duration::ZERO, 20_000u32);
        let mut sum = Duration::ZERO;
        for _ in 0..n {
            let at = (u.next().unwrap() * (bytes / 8192) as f64) as u64 * 8192;
            let done = d.read(t, at, 8192);
            sum += after(done, t);
            t = done;
        }
        let mean = sum / n;
        let want = m.random_access(8192);
        assert!((mean.as_secs_f64() / want.as_secs_f64() - 1.0).abs() < 0.02, "{mean:?} against {want:?}");
    }

    #[test]
    fn a_buffered_write_is_acknowledged_at_once_until_the_buffer_is_full() {
        let m = mech();
        let mut d = Disk::new(m, 1 << 30, 4 * 8192, Queue::Fifo);
        let t = ms(10.0);
        // Four fit: each is answered after the command overhead, whatever the medium does.
        for i in 0..4u64 {
            assert_eq!(d.write(t, i * (100 << 20), 8192, false), t + m.overhead);
        }
        assert!(d.volatile());
        // The fifth waits until the first has reached the medium.
        let first_on_medium = Disk::new(m, 1 << 30, 0, Queue::Fifo).write(t + m.overhead, 0, 8192, false);
        assert_eq!(d.write(t, 500 << 20, 8192, false), first_on_medium + m.overhead);
    }

    #[test]
    fn a_flush_waits_until_the_buffer_is_empty() {
        let m = mech();
        let mut d = Disk::new(m, 1 << 30, 1 << 20, Queue::Fifo);
        let t = ms(10.0);
        let mut acks = Vec::new();
        for i in 0..8u64 {
            acks.push(d.write(t, i * (64 << 20), 8192, false));
        }
        // Draining the same writes on a disk without a buffer takes this long.
        let mut bare = Disk::new(m, 1 << 30, 0, Queue::Fifo);
        let mut end = Duration::ZERO;
        for i in 0..8u64 {
            end = bare.write(t + m.overhead, i * (64 << 20), 8192, false);
        }
        let f = d.flush(t);
        assert_eq!(f, end);
        assert!(acks.iter().all(|a| *a < f));
        assert_eq!(d.buffered(f), 0);
        // An empty buffer flushes at once.
        assert_eq!(d.flush(f + ms(1.0)), f + ms(1.0));
    }

    #[test]
    fn a_fua_write_waits_for_the_medium() {
        let m = mech();
        let mut buffered = Disk::new(m, 1 << 30, 1 << 20, Queue::Fifo);
        let mut bare = Disk::new(m, 1 << 30, 0, Queue::Fifo);
        let t = ms(5.0);
        let fua = buffered.write(t, 300 << 20, 8192, true);
        assert_eq!(fua, bare.write(t, 300 << 20, 8192, false));
        assert!(after(fua, t) > m.overhead + m.track_seek);
        assert_eq!(buffered.buffered(t), 0);
    }

    #[test]
    fn reads_go_ahead_of_buffered_writes_that_have_not_started() {
        let m = mech();
        let mut d = Disk::new(m, 1 << 30, 1 << 20, Queue::Fifo);
        let t = ms(5.0);
        for i in 1..=8u64 {
            d.write(t, i * (64 << 20), 8192, false);
        }
        let r = d.read(t + ms(1.0), 0, 8192);
        // Only the write already on its way to the medium is ahead of it.
        let mut bare = Disk::new(m, 1 << 30, 0, Queue::Fifo);
        let first = bare.write(t + m.overhead, 64 << 20, 8192, false);
        assert_eq!(r, bare.read(t + ms(1.0), 0, 8192));
        assert!(r > first);
    }

    /// The offsets the buffer drains in, for writes at `offsets` given while a long read keeps
    /// the head busy.
    fn drain_order(queue: Queue, offsets: &[u64]) -> Vec<u64> {
        let mut d = Disk::new(mech(), 1 << 30, 1 << 20, queue);
        d.read(Duration::ZERO, 500 << 20, 8192);
        for &o in offsets {
            d.write(Duration::ZERO, o, 8192, false);
        }
        let mut order = Vec::new();
        while !d.pending.is_empty() {
            let t = d.head.free();
            d.advance(t);
            order.push(d.head.position() - 8192);
        }
        order
    }

    #[test]
    fn the_buffer_drains_in_arrival_order_or_in_an_elevator_sweep() {
        let m = |n: u64| n << 20;
        let offsets = [m(900), m(100), m(600), m(700), m(200), m(520)];
        assert_eq!(drain_order(Queue::Fifo, &offsets), offsets.to_vec());
        // The head ends the read at 500 MiB + 8 KiB and sweeps up, then turns.
        assert_eq!(drain_order(Queue::Elevator, &offsets), vec![m(520), m(600), m(700), m(900), m(200), m(100)]);
    }

    #[test]
    fn an_elevator_drains_a_scattered_buffer_sooner() {
        let mut u = uniform(5);
        let offsets: Vec<u64> = (0..100).map(|_| (u.next().unwrap() * 100_000.0) as u64 * 8192).collect();
        let flush = |q| {
            let mut d = Disk::new(mech(), 1 << 30, 1 << 20, q);
            for &o in &offsets {
                d.write(Duration::ZERO, o, 8192, false);
            }
            d.flush(Duration::ZERO)
        };
        assert!(flush(Queue::Elevator) < flush(Queue::Fifo));
    }

    #[test]
    fn raid5_reads_go_to_the_disk_holding_the_chunk() {
        let r = Raid5::new(mech(), 8, 16 << 10, 1 << 30, 0);
        // Stripe 0: parity on disk 7, data chunks on disks 0..6; stripe 1: parity on 6.
        assert_eq!(r.pieces(0, 8192), vec![(0, 7, 0, 8192)]);
        assert_eq!(r.pieces(6 * 16384, 16384), vec![(6, 7, 0, 16384)]);
        assert_eq!(r.pieces(7 * 16384, 4096), vec![(7, 6, 16384, 4096)]);
        assert_eq!(r.pieces(8 * 16384 + 8192, 16384), vec![(0, 6, 16384 + 8192, 8192), (1, 6, 16384, 8192)]);
        // Every chunk of a stripe on a different disk, none on the parity's.
        for s in 0..16u64 {
            let mut disks: Vec<usize> = (0..7).map(|c| r.pieces((s * 7 + c) * 16384, 512)[0].0).collect();
            let parity = r.pieces(s * 7 * 16384, 512)[0].1;
            disks.sort_unstable();
            disks.dedup();
            assert_eq!(disks.len(), 7);
            assert!(!disks.contains(&parity));
        }
    }

    #[test]
    fn a_raid5_small_write_reads_and_writes_data_and_parity() {
        let m = mech();
        let mut r = Raid5::new(m, 8, 16 << 10, 1 << 30, 0);
        let t = ms(1.0);
        // Stripe 1000 keeps its parity on disk 7 and its first chunk on disk 0, 16 MB in.
        let at = 7 * 1000 * 16384;
        assert_eq!(r.pieces(at, 8192), vec![(0, 7, 1000 * 16384, 8192)]);
        let done = r.write(t, at, 8192, false);
        // Two reads in parallel, then each disk writes back where it read, a revolution on.
        let mut bare = Head::new(m, r.disks[0].stroke);
        let read = bare.serve(t, 1000 * 16384, 8192);
        assert!(done + m.transfer_time(8192) >= read + m.revolution(), "{:?}", after(done, t));
        assert!(done < read + m.revolution() + m.revolution(), "{:?}", after(done, t));
        let busy: Vec<usize> = (0..8).filter(|&i| r.disks[i].free() > Duration::ZERO).collect();
        assert_eq!(busy, vec![0, 7]);
        // With the cache, the host has its answer after the overhead, and a flush waits for both.
        let mut c = Raid5::new(m, 8, 16 << 10, 1 << 30, 1 << 20);
        assert_eq!(c.write(t, at, 8192, false), t + m.overhead);
        assert_eq!(c.flush(t), done);
    }

    #[test]
    fn a_full_raid5_cache_makes_writes_wait_for_room() {
        let m = mech();
        let mut r = Raid5::new(m, 8, 16 << 10, 1 << 30, 2 * 8192);
        let t = ms(1.0);
        assert_eq!(r.write(t, 0, 8192, false), t + m.overhead);
        assert_eq!(r.write(t, 16384, 8192, false), t + m.overhead);
        let third = r.write(t, 32768, 8192, false);
        let first_done = r.drains.iter().map(|(e, _)| *e).min().unwrap();
        assert_eq!(third, first_done + m.overhead);
    }
}
