//! Runs of blocks mapped to values, with no two runs overlapping: an index kept in them costs
//! memory per run written, never per block, so a discard of a whole 1 TiB LUN is one entry.

use std::collections::BTreeMap;

/// A value that covers a run of blocks and can be cut into parts.
pub trait Run: Clone {
    /// The part of a run that starts `from` blocks into it and ends `to` blocks into it
    /// (`0 <= from < to <=` its length), for blocks of `block_size` bytes.
    #[must_use]
    fn cut(&self, from: u64, to: u64, block_size: u64) -> Self;
}

impl Run for u64 {
    fn cut(&self, _: u64, _: u64, _: u64) -> u64 {
        *self
    }
}

/// Non-overlapping runs `[start, end)` of blocks, each with a value.
#[derive(Debug, Clone)]
pub struct ExtentMap<V> {
    /// Start of each run → (end, value).
    map: BTreeMap<u64, (u64, V)>,
    blocks: u64,
    block_size: u64,
}

/// One run: first block, end (exclusive), value.
pub type Extent<V> = (u64, u64, V);

impl<V: Run> ExtentMap<V> {
    /// An empty map for blocks of `block_size` bytes.
    pub fn new(block_size: u32) -> ExtentMap<V> {
        ExtentMap { map: BTreeMap::new(), blocks: 0, block_size: u64::from(block_size) }
    }

    /// Runs held.
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// True when no run is held.
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// Blocks covered by all runs together.
    pub fn blocks(&self) -> u64 {
        self.blocks
    }

    /// Every run, in block order.
    pub fn iter(&self) -> impl Iterator<Item = (u64, u64, &V)> + '_ {
        self.map.iter().map(|(&s, (e, v))| (s, *e, v))
    }

    /// The runs that overlap `[start, end)`, in block order, whole (not clipped to the range).
    pub fn overlapping(&self, start: u64, end: u64) -> impl Iterator<Item = (u64, u64, &V)> + '_ {
        let before = self.map.range(..start).next_back().filter(|(_, (e, _))| *e > start);
        let within = self.map.range(start..end.max(start));
        before.into_iter().chain(within).map(|(&s, (e, v))| (s, *e, v))
    }

    /// True when some run overlaps `[start, end)`.
    pub fn overlaps(&self, start: u64, end: u64) -> bool {
        self.overlapping(start, end).next().is_some()
    }

    /// The value at `block`, with its run's bounds.
    pub fn get(&self, block: u64) -> Option<(u64, u64, &V)> {
        self.overlapping(block, block + 1).next()
    }

    /// Takes `[start, end)` out of the map; returns what was there, clipped to the range.
    pub fn remove(&mut self, start: u64, end: u64) -> Vec<Extent<V>> {
        self.remove_where(start, end, |_| true)
    }

    /// Takes out the parts of `[start, end)` whose value passes `pred`; returns them, clipped.
    pub fn remove_where(&mut self, start: u64, end: u64, mut pred: impl FnMut(&V) -> bool) -> Vec<Extent<V>> {
        if start >= end {
            return Vec::new();
        }
        let keys: Vec<u64> = self.overlapping(start, end).filter(|(_, _, v)| pred(v)).map(|(s, _, _)| s).collect();
        let bs = self.block_size;
        let mut out = Vec::with_capacity(keys.len());
        for s in keys {
            let Some((e, v)) = self.map.remove(&s) else { continue };
            let (from, to) = (s.max(start), e.min(end));
            if s < from {
                self.map.insert(s, (from, v.cut(0, from - s, bs)));
            }
            if to < e {
                self.map.insert(to, (e, v.cut(to - s, e - s, bs)));
            }
            self.blocks -= to - from;
            out.push((from, to, if s == from && e == to { v } else { v.cut(from - s, to - s, bs) }));
        }
        out
    }

    /// Maps `[start, end)` to `v`; returns what it replaced there, clipped.
    pub fn insert(&mut self, start: u64, end: u64, v: V) -> Vec<Extent<V>> {
        if start >= end {
            return Vec::new();
        }
        let replaced = self.remove(start, end);
        self.map.insert(start, (end, v));
        self.blocks += end - start;
        replaced
    }

    /// Calls `f` on each run that overlaps `[start, end)`, whole, with its bounds; `f` may
    /// change the value but not what it covers.
    pub fn update(&mut self, start: u64, end: u64, mut f: impl FnMut(u64, u64, &mut V)) {
        let keys: Vec<u64> = self.overlapping(start, end).map(|(s, _, _)| s).collect();
        for s in keys {
            if let Some((e, v)) = self.map.get_mut(&s) {
                f(s, *e, v);
            }
        }
    }

    /// Forgets every run.
    pub fn clear(&mut self) {
        self.map.clear();
        self.blocks = 0;
    }

    /// Keeps only the runs whose value passes `pred`.
    pub fn retain(&mut self, mut pred: impl FnMut(&V) -> bool) {
        let mut removed = 0;
        self.map.retain(|s, (e, v)| {
            let keep = pred(v);
            if !keep {
                removed += *e - *s;
            }
            keep
        });
        self.blocks -= removed;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// A value that remembers which block of the original run each block is.
    #[derive(Debug, Clone, PartialEq, Eq)]
    struct Tag {
        id: u64,
        first: u64,
    }

    impl Run for Tag {
        fn cut(&self, from: u64, _to: u64, _bs: u64) -> Tag {
            Tag { id: self.id, first: self.first + from }
        }
    }

    /// Per block: (id, offset in its write) as the map says.
    fn expand(m: &ExtentMap<Tag>, blocks: u64) -> Vec<Option<(u64, u64)>> {
        let mut out = vec![None; blocks as usize];
        for (s, e, v) in m.iter() {
            for b in s..e {
                assert!(out[b as usize].is_none(), "runs overlap at block {b}");
                out[b as usize] = Some((v.id, v.first + (b - s)));
            }
        }
        out
    }

    #[derive(Debug, Clone)]
    enum Op {
        Insert(u64, u64),
        Remove(u64, u64),
        RemoveOdd(u64, u64),
    }

    fn op() -> impl Strategy<Value = Op> {
        (0u64..64, 1u64..20, 0u8..3).prop_map(|(s, n, k)| match k {
            0 => Op::Insert(s, s + n),
            1 => Op::Remove(s, s + n),
            _ => Op::RemoveOdd(s, s + n),
        })
    }

    proptest! {
        #[test]
        fn the_map_agrees_with_a_per_block_model(ops in prop::collection::vec(op(), 1..60)) {
            const N: u64 = 90;
            let mut m: ExtentMap<Tag> = ExtentMap::new(512);
            let mut model: Vec<Option<(u64, u64)>> = vec![None; N as usize];
            for (id, op) in ops.iter().enumerate() {
                let id = id as u64;
                match *op {
                    Op::Insert(s, e) => {
                        let old: Vec<_> = model[s as usize..e as usize].to_vec();
                        let replaced = m.insert(s, e, Tag { id, first: 0 });
                        let got: usize = replaced.iter().map(|(a, b, _)| (b - a) as usize).sum();
                        prop_assert_eq!(got, old.iter().flatten().count());
                        for (a, b, v) in replaced {
                            for x in a..b {
                                prop_assert_eq!(model[x as usize], Some((v.id, v.first + (x - a))));
                            }
                        }
                        for b in s..e {
                            model[b as usize] = Some((id, b - s));
                        }
                    }
                    Op::Remove(s, e) => {
                        m.remove(s, e);
                        model[s as usize..e as usize].fill(None);
                    }
                    Op::RemoveOdd(s, e) => {
                        m.remove_where(s, e, |v| v.id % 2 == 1);
                        for b in s..e {
                            if model[b as usize].is_some_and(|(i, _)| i % 2 == 1) {
                                model[b as usize] = None;
                            }
                        }
                    }
                }
                prop_assert_eq!(expand(&m, N), model.clone());
                prop_assert_eq!(m.blocks(), model.iter().flatten().count() as u64);
            }
            for s in 0..N {
                for e in s + 1..(s + 12).min(N) {
                    let want = model[s as usize..e as usize].iter().any(Option::is_some);
                    prop_assert_eq!(m.overlaps(s, e), want);
                }
            }
        }
    }

    #[test]
    fn a_run_of_a_billion_blocks_is_one_entry() {
        let mut m: ExtentMap<u64> = ExtentMap::new(512);
        m.insert(0, 1 << 31, 1);
        m.insert(1000, 1001, 2);
        assert_eq!(m.len(), 3);
        assert_eq!(m.blocks(), 1 << 31);
        assert_eq!(m.get(1000), Some((1000, 1001, &2)));
        assert_eq!(m.get(5_000_000), Some((1001, 1 << 31, &1)));
        m.remove(0, 1 << 31);
        assert!(m.is_empty());
        assert_eq!(m.blocks(), 0);
    }
}
