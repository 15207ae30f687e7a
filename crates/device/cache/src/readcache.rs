//! The DRAM read cache of clean blocks (seed 004's LRU), with a choice of policy: plain LRU, or
//! S3-FIFO (quick_cache), which a single sequential scan cannot flush.

use std::num::NonZeroUsize;

use bytes::Bytes;

/// How the read cache chooses what to evict.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Policy {
    /// Least recently used (seed 004).
    Lru,
    /// S3-FIFO: new blocks pass a small probation queue first, so a scan does not evict the
    /// blocks that are used again and again.
    #[default]
    S3Fifo,
}

impl std::str::FromStr for Policy {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "lru" => Ok(Policy::Lru),
            "s3fifo" | "s3-fifo" => Ok(Policy::S3Fifo),
            _ => Err(format!("unknown read cache policy {s:?}: use lru or s3fifo")),
        }
    }
}

enum Store {
    Off,
    Lru(lru::LruCache<u64, Bytes>),
    S3(quick_cache::unsync::Cache<u64, Bytes>),
}

/// Clean blocks by LBA, one `Bytes` per block.
pub struct ReadCache {
    store: Store,
    hits: u64,
    misses: u64,
}

impl std::fmt::Debug for ReadCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReadCache").field("blocks", &self.len()).field("hits", &self.hits).finish_non_exhaustive()
    }
}

impl ReadCache {
    /// A cache of at most `blocks` blocks (0: no read cache).
    pub fn new(policy: Policy, blocks: usize) -> ReadCache {
        let store = match (NonZeroUsize::new(blocks), policy) {
            (None, _) => Store::Off,
            (Some(n), Policy::Lru) => Store::Lru(lru::LruCache::new(n)),
            (Some(n), Policy::S3Fifo) => Store::S3(quick_cache::unsync::Cache::new(n.get())),
        };
        ReadCache { store, hits: 0, misses: 0 }
    }

    /// The block at `lba`, counting a hit or a miss.
    pub fn get(&mut self, lba: u64) -> Option<Bytes> {
        let v = match &mut self.store {
            Store::Off => None,
            Store::Lru(c) => c.get(&lba).cloned(),
            Store::S3(c) => c.get(&lba).cloned(),
        };
        if v.is_some() {
            self.hits += 1;
        } else {
            self.misses += 1;
        }
        v
    }

    /// Keeps `block` (one block's bytes) for `lba`.
    pub fn insert(&mut self, lba: u64, block: Bytes) {
        match &mut self.store {
            Store::Off => {}
            Store::Lru(c) => {
                c.put(lba, block);
            }
            Store::S3(c) => c.insert(lba, block),
        }
    }

    /// Forgets `lba`.
    pub fn remove(&mut self, lba: u64) {
        match &mut self.store {
            Store::Off => {}
            Store::Lru(c) => {
                c.pop(&lba);
            }
            Store::S3(c) => {
                c.remove(&lba);
            }
        }
    }

    /// Forgets every block in `start..end`: block by block for a short range, by one pass over
    /// what is held for a long one (a discard of a whole LUN).
    pub fn remove_range(&mut self, start: u64, end: u64) {
        if end.saturating_sub(start) <= self.len() as u64 {
            for lba in start..end {
                self.remove(lba);
            }
            return;
        }
        let held: Vec<u64> = match &self.store {
            Store::Off => return,
            Store::Lru(c) => c.iter().map(|(k, _)| *k).filter(|k| (start..end).contains(k)).collect(),
            Store::S3(c) => c.iter().map(|(k, _)| *k).filter(|k| (start..end).contains(k)).collect(),
        };
        for lba in held {
            self.remove(lba);
        }
    }

    /// Most blocks it holds (0: no read cache).
    pub fn capacity(&self) -> usize {
        match &self.store {
            Store::Off => 0,
            Store::Lru(c) => c.cap().get(),
            Store::S3(c) => c.capacity() as usize,
        }
    }

    /// Blocks held.
    pub fn len(&self) -> usize {
        match &self.store {
            Store::Off => 0,
            Store::Lru(c) => c.len(),
            Store::S3(c) => c.len(),
        }
    }

    /// True when no block is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Lookups that found their block, and those that did not.
    pub fn hits_and_misses(&self) -> (u64, u64) {
        (self.hits, self.misses)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn b(v: u8) -> Bytes {
        Bytes::from(vec![v; 512])
    }

    #[test]
    fn both_policies_keep_hold_and_forget_blocks() {
        for p in [Policy::Lru, Policy::S3Fifo] {
            let mut c = ReadCache::new(p, 16);
            c.insert(3, b(3));
            assert_eq!(c.get(3), Some(b(3)));
            assert_eq!(c.get(4), None);
            c.remove(3);
            assert_eq!(c.get(3), None);
            assert_eq!(c.hits_and_misses(), (1, 2));
            for i in 0..100 {
                c.insert(i, b(1));
            }
            assert!(c.len() <= 16, "{p:?} holds {}", c.len());
        }
    }

    #[test]
    fn a_scan_does_not_flush_the_hot_blocks_from_s3fifo() {
        let mut c = ReadCache::new(Policy::S3Fifo, 100);
        for round in 0..5 {
            for hot in 0..20 {
                if c.get(hot).is_none() {
                    c.insert(hot, b(round));
                }
            }
        }
        for cold in 1000..1500 {
            c.insert(cold, b(9));
        }
        let kept = (0..20).filter(|h| c.get(*h).is_some()).count();
        assert!(kept >= 15, "only {kept} of 20 hot blocks survived a scan");
        let mut lru = ReadCache::new(Policy::Lru, 100);
        for hot in 0..20 {
            lru.insert(hot, b(1));
        }
        for cold in 1000..1500 {
            lru.insert(cold, b(9));
        }
        assert_eq!((0..20).filter(|h| lru.get(*h).is_some()).count(), 0, "LRU is flushed by a scan");
    }

    #[test]
    fn a_range_is_forgotten_whether_shorter_or_longer_than_what_is_held() {
        for p in [Policy::Lru, Policy::S3Fifo] {
            let mut c = ReadCache::new(p, 64);
            for i in 0..32 {
                c.insert(i * 10, b(1));
            }
            c.remove_range(0, 25);
            assert_eq!((0..32).filter(|i| c.get(i * 10).is_some()).count(), 29, "{p:?}");
            c.remove_range(100, 1 << 40);
            assert_eq!((0..32).filter(|i| c.get(i * 10).is_some()).count(), 7, "{p:?}");
        }
    }

    #[test]
    fn a_zero_sized_cache_holds_nothing() {
        let mut c = ReadCache::new(Policy::Lru, 0);
        c.insert(1, b(1));
        assert!(c.is_empty());
        assert_eq!(c.get(1), None);
    }
}
