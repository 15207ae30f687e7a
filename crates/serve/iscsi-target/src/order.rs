//! Task attributes (SAM-5 §8.6) for one session's task set: a SIMPLE task starts once every
//! older ORDERED and HEAD OF QUEUE task of its LUN has ended, an ORDERED task once every older
//! task of its LUN has ended, a HEAD OF QUEUE task at once. A pure structure: tasks arrive, may
//! be held with a payload until their turn, and end; the session core does the rest.
//!
//! This is what lets an initiator pipeline dependent work over a long path: writes, then an
//! ORDERED SYNCHRONIZE CACHE, then the next writes, all sent at once, run as if each waited
//! for the one before it.

use std::collections::BTreeMap;

/// How a task is ordered against the others.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Simple,
    Ordered,
    HeadOfQueue,
}

#[derive(Debug)]
struct Entry<T> {
    lun: u64,
    kind: Kind,
    held: Option<T>,
}

/// The tasks of a session that have arrived and not ended, in arrival order.
#[derive(Debug)]
pub struct TaskOrder<T> {
    next: u64,
    tasks: BTreeMap<u64, Entry<T>>,
    /// Tasks that hold back later ones (ORDERED, HEAD OF QUEUE): none is the common case, and
    /// then nothing is ever held.
    barriers: usize,
    held: usize,
}

impl<T> Default for TaskOrder<T> {
    fn default() -> Self {
        TaskOrder { next: 1, tasks: BTreeMap::new(), barriers: 0, held: 0 }
    }
}

impl<T> TaskOrder<T> {
    /// A task arrived (in CmdSN order, or at once when immediate); its arrival number.
    pub fn arrive(&mut self, lun: u64, kind: Kind) -> u64 {
        let id = self.next;
        self.next += 1;
        if kind != Kind::Simple {
            self.barriers += 1;
        }
        self.tasks.insert(id, Entry { lun, kind, held: None });
        id
    }

    /// Whether task `id` may start now.
    pub fn may_start(&self, id: u64) -> bool {
        let Some(e) = self.tasks.get(&id) else { return false };
        match e.kind {
            Kind::HeadOfQueue => true,
            Kind::Simple if self.barriers == 0 => true,
            Kind::Simple => !self.tasks.range(..id).any(|(_, o)| o.lun == e.lun && o.kind != Kind::Simple),
            Kind::Ordered => !self.tasks.range(..id).any(|(_, o)| o.lun == e.lun),
        }
    }

    /// Keeps `payload` until task `id` may start (see [`TaskOrder::startable`]).
    pub fn hold(&mut self, id: u64, payload: T) {
        if let Some(e) = self.tasks.get_mut(&id) {
            if e.held.replace(payload).is_none() {
                self.held += 1;
            }
        }
    }

    /// Task `id` ended (completed, failed or aborted); returns its payload if it was held.
    pub fn end(&mut self, id: u64) -> Option<T> {
        let e = self.tasks.remove(&id)?;
        if e.kind != Kind::Simple {
            self.barriers -= 1;
        }
        if e.held.is_some() {
            self.held -= 1;
        }
        e.held
    }

    /// Held tasks that may start now, in arrival order; they stay in the task set (running)
    /// until [`TaskOrder::end`].
    pub fn startable(&mut self) -> Vec<(u64, T)> {
        let mut out = Vec::new();
        if self.held == 0 {
            return out;
        }
        // Per LUN: whether an older task is outstanding, and whether an older barrier is.
        let mut seen: Vec<(u64, bool)> = Vec::new();
        for (&id, e) in &mut self.tasks {
            let older = seen.iter().find(|(l, _)| *l == e.lun).map(|&(_, barrier)| barrier);
            let may = match e.kind {
                Kind::HeadOfQueue => true,
                Kind::Simple => older != Some(true),
                Kind::Ordered => older.is_none(),
            };
            if may {
                if let Some(p) = e.held.take() {
                    self.held -= 1;
                    out.push((id, p));
                }
            }
            let barrier = e.kind != Kind::Simple;
            match seen.iter_mut().find(|(l, _)| *l == e.lun) {
                Some(s) => s.1 |= barrier,
                None => seen.push((e.lun, barrier)),
            }
        }
        out
    }

    /// The held tasks' payloads, for aborts that must find them.
    pub fn held(&self) -> impl Iterator<Item = (u64, &T)> {
        self.tasks.iter().filter_map(|(&id, e)| e.held.as_ref().map(|p| (id, p)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn simple_tasks_never_wait_for_each_other() {
        let mut o = TaskOrder::<u32>::default();
        let a = o.arrive(0, Kind::Simple);
        let b = o.arrive(0, Kind::Simple);
        assert!(o.may_start(a) && o.may_start(b));
    }

    #[test]
    fn an_ordered_task_is_a_barrier_in_both_directions() {
        let mut o = TaskOrder::<u32>::default();
        let w1 = o.arrive(0, Kind::Simple);
        let sync = o.arrive(0, Kind::Ordered);
        let w2 = o.arrive(0, Kind::Simple);
        let other_lun = o.arrive(1, Kind::Simple);
        assert!(o.may_start(w1));
        assert!(!o.may_start(sync), "waits for the older write");
        assert!(!o.may_start(w2), "waits for the older ORDERED task");
        assert!(o.may_start(other_lun), "other LUNs are other task sets");
        o.hold(sync, 10);
        o.hold(w2, 20);
        assert!(o.startable().is_empty());
        assert_eq!(o.end(w1), None);
        assert_eq!(o.startable(), vec![(sync, 10)]);
        assert!(o.startable().is_empty(), "the write still waits for the running barrier");
        o.end(sync);
        assert_eq!(o.startable(), vec![(w2, 20)]);
    }

    #[test]
    fn simple_tasks_wait_for_an_older_head_of_queue_task_which_waits_for_nothing() {
        let mut o = TaskOrder::<u32>::default();
        let w = o.arrive(0, Kind::Simple);
        let hoq = o.arrive(0, Kind::HeadOfQueue);
        let after = o.arrive(0, Kind::Simple);
        assert!(o.may_start(w) && o.may_start(hoq) && !o.may_start(after));
        o.hold(after, 1);
        o.end(hoq);
        assert_eq!(o.startable(), vec![(after, 1)]);
    }

    #[test]
    fn an_aborted_held_task_gives_back_its_payload_and_frees_the_ones_behind() {
        let mut o = TaskOrder::<u32>::default();
        let w = o.arrive(0, Kind::Simple);
        let sync = o.arrive(0, Kind::Ordered);
        let next = o.arrive(0, Kind::Simple);
        o.hold(sync, 1);
        o.hold(next, 2);
        assert_eq!(o.held().map(|(id, p)| (id, *p)).collect::<Vec<_>>(), vec![(sync, 1), (next, 2)]);
        assert_eq!(o.end(sync), Some(1));
        assert_eq!(o.startable(), vec![(next, 2)]);
        o.end(w);
        o.end(next);
        assert!(o.tasks.is_empty() && o.barriers == 0 && o.held == 0);
    }
}
