//! One tier's cache and the rule by which a step's set of experts goes through it
//! (SEMANTICS.md §11 step 3, which is §5 step 4 with k-way protection when the set fits).

use super::freq::FreqList;
use super::heap::KeyHeap;
use super::prio::{Order, Prio};

/// Position of an expert that is not cached.
const ABSENT: u32 = u32::MAX;

/// The cached experts of one tier of one layer: at most `cap` (0 = no cache).
pub(crate) struct Level {
    pub cap: usize,
    /// `[E]`: index into `members`, or [`ABSENT`].
    pos: Vec<u32>,
    members: Vec<u16>,
    /// `[E + 1]`: the cached experts as a list in key order, for a policy whose keys allow it
    /// ([`Order`]): `next[x]` the expert of the next higher key, `prev[x]` the next lower;
    /// index E is the sentinel (`next[E]` the lowest key, `prev[E]` the highest).
    next: Vec<u32>,
    prev: Vec<u32>,
    /// The cached experts in lfu's key order ([`Order::Frequency`]).
    freq: FreqList,
    /// The cached experts in a heap on their keys ([`Order::Scan`]).
    heap: KeyHeap,
    /// `[E]`: the stamp of the step whose set holds the expert / in which it was processed.
    in_set: Vec<u64>,
    done: Vec<u64>,
    stamp: u64,
    /// The access clock (one tick per cache access, in set order).
    clock: u64,
}

/// What one step did at one level.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct StepOutcome {
    pub hits: u64,
    pub pinned_hits: u64,
    pub misses: u64,
}

impl Level {
    pub fn new(num_experts: usize, cap: usize) -> Level {
        Level {
            cap,
            pos: vec![ABSENT; num_experts],
            members: Vec::with_capacity(cap),
            next: vec![num_experts as u32; num_experts + 1],
            prev: vec![num_experts as u32; num_experts + 1],
            freq: FreqList::new(num_experts, cap),
            heap: KeyHeap::new(num_experts, cap),
            in_set: vec![0; num_experts],
            done: vec![0; num_experts],
            stamp: 0,
            clock: 0,
        }
    }

    /// The heap of a policy whose keys change outside accesses ([`Order::Scan`]), to be told of
    /// every such change; empty under the other orders, where telling it changes nothing.
    #[inline(always)]
    pub fn heap(&mut self) -> &mut KeyHeap {
        &mut self.heap
    }

    /// Whether `e` is cached.
    #[inline(always)]
    pub fn contains(&self, e: usize) -> bool {
        self.pos[e] != ABSENT
    }

    /// Index of the list's sentinel.
    #[inline(always)]
    fn sentinel(&self) -> usize {
        self.pos.len()
    }

    fn unlink(&mut self, e: usize) {
        let (p, n) = (self.prev[e], self.next[e]);
        self.next[p as usize] = n;
        self.prev[n as usize] = p;
    }

    /// Puts `e` (not in the list) at the high end: its key is now above every other.
    fn link_highest(&mut self, e: usize) {
        let z = self.sentinel();
        let top = self.prev[z];
        self.next[top as usize] = e as u32;
        self.prev[e] = top;
        self.next[e] = z as u32;
        self.prev[z] = e as u32;
    }

    fn remove(&mut self, e: usize) {
        let i = self.pos[e] as usize;
        let last = self.members.pop().expect("a cached expert");
        if usize::from(last) != e {
            self.members[i] = last;
            self.pos[usize::from(last)] = i as u32;
        }
        self.pos[e] = ABSENT;
    }

    fn insert(&mut self, e: usize) {
        self.pos[e] = self.members.len() as u32;
        // At most `cap` members: never grows past its capacity.
        self.members.push(e as u16);
    }

    /// The victim of §11 step 3: the lowest-priority cached expert not in the set; if every
    /// cached expert is in it, the lowest-priority one already processed in this step; if none
    /// is, the lowest-priority cached expert (ties: lowest id everywhere).
    fn victim<P: Prio>(&mut self, prio: &P) -> usize {
        if P::ORDER == Order::Scan {
            let (in_set, stamp) = (&self.in_set, self.stamp);
            if let Some(v) = self.heap.lowest_where_not(|c| in_set[c] == stamp) {
                return v;
            }
        }
        if P::ORDER == Order::Frequency
            && let Some(v) = self.freq.lowest_where_not(|c| self.in_set[c] == self.stamp)
        {
            return v;
        }
        if P::ORDER == Order::EveryAccess || P::ORDER == Order::Insertion {
            // The list is in key order and keys are distinct (one clock tick per access): the
            // first expert from the low end that is not in the set is the scan's `outside`.
            let z = self.sentinel();
            let mut c = self.next[z] as usize;
            while c != z {
                if self.in_set[c] != self.stamp {
                    return c;
                }
                c = self.next[c] as usize;
            }
        }
        self.scan_victim(prio)
    }

    /// [`Level::victim`] by a scan of the cached experts (compared with [`Prio::before`]): what
    /// the ordered structures must equal; taken by every order when all cached experts are in the
    /// set, and by [`Order::Clocked`] always.
    #[inline(never)]
    fn scan_victim<P: Prio>(&self, prio: &P) -> usize {
        let (mut outside, mut done, mut any) = (None::<usize>, None::<usize>, None::<usize>);
        let lower = |best: Option<usize>, c: usize| best.is_none_or(|b| prio.before(c, b));
        for &c in &self.members {
            let c = usize::from(c);
            if self.in_set[c] != self.stamp {
                if lower(outside, c) {
                    outside = Some(c);
                }
            } else if self.done[c] == self.stamp && lower(done, c) {
                done = Some(c);
            }
            if lower(any, c) {
                any = Some(c);
            }
        }
        outside.or(done).or(any).expect("a full cache holds an expert")
    }

    /// Runs one step's set `set` (distinct experts, in processing order) through this level:
    /// a pinned expert (`pinned[e]`) is a hit that touches nothing; a cached one a hit; any
    /// other a miss, handed to `on_miss` in order, and inserted (evicting [`Level::victim`] when
    /// full) unless the level has no cache.
    #[inline(always)]
    pub fn step<P: Prio>(
        &mut self,
        prio: &mut P,
        set: &[u16],
        pinned: &[bool],
        mut on_miss: impl FnMut(u16),
    ) -> StepOutcome {
        self.stamp += 1;
        let stamp = self.stamp;
        for &e in set {
            self.in_set[usize::from(e)] = stamp;
        }
        let mut out = StepOutcome::default();
        for &e16 in set {
            let e = usize::from(e16);
            if pinned[e] {
                out.hits += 1;
                out.pinned_hits += 1;
                continue;
            }
            if self.cap == 0 {
                out.misses += 1;
                on_miss(e16);
                continue;
            }
            self.clock += 1;
            let hit = self.contains(e);
            if hit {
                out.hits += 1;
                if P::ORDER == Order::EveryAccess {
                    self.unlink(e);
                    self.link_highest(e);
                }
                if P::ORDER == Order::Frequency {
                    self.freq.touch(e);
                }
            } else {
                out.misses += 1;
                on_miss(e16);
                if self.members.len() >= self.cap {
                    let v = self.victim(prio);
                    #[cfg(test)]
                    assert_eq!(v, self.scan_victim(prio), "the victim of the scan");
                    self.remove(v);
                    match P::ORDER {
                        Order::EveryAccess | Order::Insertion => self.unlink(v),
                        Order::Frequency => self.freq.remove(v),
                        Order::Scan => self.heap.remove(v),
                        Order::Clocked => {}
                    }
                }
                self.insert(e);
                match P::ORDER {
                    Order::EveryAccess | Order::Insertion => self.link_highest(e),
                    Order::Frequency => self.freq.insert(e),
                    Order::Scan | Order::Clocked => {}
                }
            }
            prio.access(e, self.clock, !hit);
            if P::ORDER == Order::Scan {
                if !hit {
                    self.heap.insert(prio.rank(e));
                } else if P::ACCESS_KEYED {
                    self.heap.raise(e, || prio.rank(e));
                }
            }
            self.done[e] = stamp;
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::super::heap::KeyHeap;
    use super::super::prio::Prio;
    use super::Level;

    /// Keys that move in both directions and tie often: an access may raise the key (from the
    /// clock), each step start sets keys from the step's table (telling the heap), as belady's
    /// and the credits' keys move outside accesses.
    struct Shuffled {
        key: Vec<u128>,
        /// Per step: (expert, new key).
        changes: Vec<Vec<(usize, u128)>>,
    }

    impl Prio for Shuffled {
        fn key(&self, e: usize) -> u128 {
            self.key[e]
        }
        fn access(&mut self, e: usize, now: u64, _inserted: bool) {
            // An access never lowers a key (`Prio::ACCESS_KEYED`).
            self.key[e] = self.key[e].max(u128::from(now.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 61));
        }
        fn begin_step(&mut self, s: usize, heap: &mut KeyHeap) {
            for &(e, k) in &self.changes[s] {
                self.key[e] = k;
                heap.update(e, || self.rank(e));
            }
        }
    }

    const EXPERTS: usize = 10;

    /// A step: its set (distinct experts, any order) and its key changes.
    fn step() -> impl Strategy<Value = (Vec<usize>, Vec<(usize, u128)>)> {
        let set = prop::sample::subsequence((0..EXPERTS).collect::<Vec<_>>(), 1..=6).prop_shuffle();
        (set, prop::collection::vec((0..EXPERTS, 0u128..4), 0..5))
    }

    proptest! {
        /// Through `Level::step`, which asserts in test builds that every victim taken from the
        /// heap is the scan's (§11 step 3: outside the set, else done in this step, else any;
        /// ties by lowest id), with sets that fill the cache and pinned experts.
        #[test]
        fn heap_victims_are_the_scan_victims(
            cap in 1usize..6,
            pinned in prop::collection::vec(any::<bool>(), EXPERTS),
            steps in prop::collection::vec(step(), 1..60),
        ) {
            let mut level = Level::new(EXPERTS, cap);
            let changes = steps.iter().map(|s| s.1.clone()).collect();
            let mut prio = Shuffled { key: vec![0; EXPERTS], changes };
            let pinned: Vec<bool> = pinned.iter().enumerate().map(|(e, &p)| p && e % 3 == 0).collect();
            let mut evictions = 0;
            for (s, (set, _)) in steps.iter().enumerate() {
                prio.begin_step(s, level.heap());
                let set: Vec<u16> = set.iter().map(|&e| e as u16).collect();
                let before = level.members.len();
                let out = level.step(&mut prio, &set, &pinned, |_| {});
                evictions += before + out.misses as usize - level.members.len();
                prop_assert_eq!(out.hits + out.misses, set.len() as u64);
                prop_assert_eq!(level.heap().len(), level.members.len());
                prop_assert!(level.members.len() <= cap);
            }
            prop_assert!(evictions <= steps.iter().map(|s| s.0.len()).sum());
        }
    }
}
