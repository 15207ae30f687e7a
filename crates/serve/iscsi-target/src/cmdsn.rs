//! The CmdSN window of a session (RFC 7143 §4.2.2.1 and §3.2.2.1): commands are delivered in
//! CmdSN order, out-of-order arrivals wait inside the window, anything outside it is dropped.
//! A pure state machine; MaxCmdSN is an input because command completions raise it elsewhere.

use std::collections::BTreeMap;

use stics_wire::serial;

/// What became of an offered command.
#[derive(Debug, PartialEq, Eq)]
pub enum Verdict<T> {
    /// Deliver now (it is immediate, or its CmdSN is the expected one). More may now be ready:
    /// call [`Window::next_ready`] until it returns `None`.
    Deliver(T),
    /// Held until the commands before it arrive.
    Queued,
    /// Outside the window (too old or beyond MaxCmdSN), or a duplicate: silently ignored.
    Dropped(T),
}

/// Commands received but not yet delivered, keyed by CmdSN.
#[derive(Debug)]
pub struct Window<T> {
    exp: u32,
    held: BTreeMap<u32, T>,
}

impl<T> Window<T> {
    /// A window whose first expected CmdSN is `exp`.
    pub fn new(exp: u32) -> Self {
        Window { exp, held: BTreeMap::new() }
    }

    /// ExpCmdSN: the next CmdSN the session expects.
    pub fn exp_cmd_sn(&self) -> u32 {
        self.exp
    }

    /// Commands held for want of earlier ones.
    pub fn held(&self) -> usize {
        self.held.len()
    }

    /// Offers a command. `max` is the MaxCmdSN in force; it bounds how many can be held.
    pub fn offer(&mut self, cmd_sn: u32, immediate: bool, max: u32, item: T) -> Verdict<T> {
        if immediate {
            return Verdict::Deliver(item);
        }
        if serial::lt(cmd_sn, self.exp) || serial::lt(max, cmd_sn) {
            return Verdict::Dropped(item);
        }
        if cmd_sn == self.exp {
            self.exp = self.exp.wrapping_add(1);
            return Verdict::Deliver(item);
        }
        if self.held.contains_key(&cmd_sn) {
            return Verdict::Dropped(item);
        }
        self.held.insert(cmd_sn, item);
        Verdict::Queued
    }

    /// The commands held, by CmdSN, to find or replace one (an ABORT TASK of a command that
    /// waits for earlier ones).
    pub fn held_mut(&mut self) -> impl Iterator<Item = (u32, &mut T)> {
        self.held.iter_mut().map(|(sn, t)| (*sn, t))
    }

    /// The next held command that is now in order.
    pub fn next_ready(&mut self) -> Option<T> {
        let item = self.held.remove(&self.exp)?;
        self.exp = self.exp.wrapping_add(1);
        Some(item)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn in_order_commands_are_delivered_and_advance_exp() {
        let mut w = Window::new(10);
        assert_eq!(w.offer(10, false, 20, 'a'), Verdict::Deliver('a'));
        assert_eq!(w.offer(11, false, 20, 'b'), Verdict::Deliver('b'));
        assert_eq!(w.exp_cmd_sn(), 12);
    }

    #[test]
    fn out_of_order_commands_wait_until_the_gap_fills() {
        let mut w = Window::new(10);
        assert_eq!(w.offer(12, false, 20, 'c'), Verdict::Queued);
        assert_eq!(w.offer(11, false, 20, 'b'), Verdict::Queued);
        assert_eq!(w.next_ready(), None);
        assert_eq!(w.offer(10, false, 20, 'a'), Verdict::Deliver('a'));
        assert_eq!(w.next_ready(), Some('b'));
        assert_eq!(w.next_ready(), Some('c'));
        assert_eq!(w.next_ready(), None);
        assert_eq!(w.exp_cmd_sn(), 13);
    }

    #[test]
    fn cmdsn_beyond_max_or_before_exp_is_dropped() {
        let mut w = Window::new(10);
        assert_eq!(w.offer(21, false, 20, 'x'), Verdict::Dropped('x'));
        assert_eq!(w.offer(9, false, 20, 'y'), Verdict::Dropped('y'));
        assert_eq!(w.exp_cmd_sn(), 10);
        assert_eq!(w.offer(20, false, 20, 'z'), Verdict::Queued);
        assert_eq!(w.offer(20, false, 20, 'd'), Verdict::Dropped('d'));
    }

    #[test]
    fn immediate_commands_bypass_the_window() {
        let mut w = Window::new(10);
        assert_eq!(w.offer(10, true, 20, 'i'), Verdict::Deliver('i'));
        assert_eq!(w.offer(99, true, 20, 'j'), Verdict::Deliver('j'));
        assert_eq!(w.exp_cmd_sn(), 10);
    }

    #[test]
    fn window_wraps_around_zero() {
        let mut w = Window::new(u32::MAX);
        assert_eq!(w.offer(0, false, 5, 'b'), Verdict::Queued);
        assert_eq!(w.offer(u32::MAX, false, 5, 'a'), Verdict::Deliver('a'));
        assert_eq!(w.next_ready(), Some('b'));
        assert_eq!(w.exp_cmd_sn(), 1);
    }

    #[test]
    fn a_held_command_can_be_replaced_in_place() {
        let mut w = Window::new(10);
        assert_eq!(w.offer(12, false, 20, 'c'), Verdict::Queued);
        for (sn, item) in w.held_mut() {
            assert_eq!(sn, 12);
            *item = 'x';
        }
        assert_eq!(w.offer(10, false, 20, 'a'), Verdict::Deliver('a'));
        assert_eq!(w.offer(11, false, 20, 'b'), Verdict::Deliver('b'));
        assert_eq!(w.next_ready(), Some('x'));
    }

    #[test]
    fn held_commands_never_exceed_the_window() {
        let mut w = Window::new(0);
        for sn in 1..1000u32 {
            let _ = w.offer(sn, false, 31, sn);
        }
        assert_eq!(w.held(), 31);
    }
}
