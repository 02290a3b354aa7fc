//! The cached experts of one level in key order for the policies whose keys change outside
//! accesses ([`super::prio::Order::Scan`]: belady's next uses, the credits of near_pick,
//! near_pick_ema and inv_router): an indexed binary min-heap on (key, expert id), with the
//! position of every expert, so that a key change of one expert is one sift, O(log cap).
//!
//! An entry is a rank ([`super::prio::Prio::rank`]): one `u128` in the order of (key, id) with
//! the id in its low 16 bits, so that a comparison is one of integers. The heap holds a copy of
//! each cached expert's rank: whoever changes a key tells the heap ([`KeyHeap::update`], which
//! ignores experts that are not cached; [`KeyHeap::rekey`] after a change of every key). The victim ([`KeyHeap::lowest_where_not`]) walks the heap from the root
//! and stops below every expert that qualifies: it reads at most twice the skipped experts plus
//! one. All buffers are allocated by [`KeyHeap::new`].

/// Position of an expert that is not in the heap.
const ABSENT: u32 = u32::MAX;

/// The expert of a rank (its low 16 bits).
#[inline(always)]
fn expert(rank: u128) -> usize {
    usize::from(rank as u16)
}

/// Cached experts in a min-heap on (key, id) (see the module doc).
pub(crate) struct KeyHeap {
    /// `[E]`: index into `heap`, or [`ABSENT`].
    pos: Vec<u32>,
    /// Ranks in heap order: every entry is below its children.
    heap: Vec<u128>,
    /// The walk of [`KeyHeap::lowest_where_not`]: at most one entry per heap entry.
    stack: Vec<u32>,
}

impl KeyHeap {
    /// An empty heap for `num_experts` experts and at most `cap` of them at once.
    pub fn new(num_experts: usize, cap: usize) -> KeyHeap {
        let cap = cap.min(num_experts);
        KeyHeap { pos: vec![ABSENT; num_experts], heap: Vec::with_capacity(cap), stack: Vec::with_capacity(cap) }
    }

    /// Number of experts in the heap.
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.heap.len()
    }

    /// Moves entry `i` up while it is below its parent.
    #[inline(always)]
    fn sift_up(&mut self, mut i: usize) {
        let x = self.heap[i];
        while i > 0 {
            let p = (i - 1) / 2;
            let up = self.heap[p];
            if up <= x {
                break;
            }
            self.heap[i] = up;
            self.pos[expert(up)] = i as u32;
            i = p;
        }
        self.heap[i] = x;
        self.pos[expert(x)] = i as u32;
    }

    /// Moves entry `i` down while a child is below it.
    #[inline(always)]
    fn sift_down(&mut self, mut i: usize) {
        let len = self.heap.len();
        let x = self.heap[i];
        loop {
            let l = 2 * i + 1;
            if l >= len {
                break;
            }
            let r = l + 1;
            let c = if r < len && self.heap[r] < self.heap[l] { r } else { l };
            let down = self.heap[c];
            if x <= down {
                break;
            }
            self.heap[i] = down;
            self.pos[expert(down)] = i as u32;
            i = c;
        }
        self.heap[i] = x;
        self.pos[expert(x)] = i as u32;
    }

    /// Moves entry `i` to its place after a change of its key in either direction.
    #[inline(always)]
    fn sift(&mut self, i: usize) {
        if i > 0 && self.heap[i] < self.heap[(i - 1) / 2] {
            self.sift_up(i);
        } else {
            self.sift_down(i);
        }
    }

    /// An expert (not in the heap) enters with `rank` (its id in the low 16 bits); at most
    /// `cap` experts are in the heap.
    #[inline(always)]
    pub fn insert(&mut self, rank: u128) {
        debug_assert!(self.pos[expert(rank)] == ABSENT, "expert {} is in the heap already", expert(rank));
        let i = self.heap.len();
        // At most `cap` entries: never grows past its capacity.
        self.heap.push(rank);
        self.sift_up(i);
    }

    /// Expert `e` (in the heap) leaves it.
    #[inline(always)]
    pub fn remove(&mut self, e: usize) {
        let i = self.pos[e] as usize;
        self.pos[e] = ABSENT;
        let last = self.heap.pop().expect("a cached expert");
        if i < self.heap.len() {
            self.heap[i] = last;
            self.sift(i);
        }
    }

    /// The rank of `e` is now `rank()` (nothing, and no call, when `e` is not in the heap).
    #[inline(always)]
    pub fn update(&mut self, e: usize, rank: impl FnOnce() -> u128) {
        let i = self.pos[e];
        if i != ABSENT {
            let i = i as usize;
            self.heap[i] = rank();
            self.sift(i);
        }
    }

    /// [`KeyHeap::update`] for a rank that did not fall (only a move down).
    #[inline(always)]
    pub fn raise(&mut self, e: usize, rank: impl FnOnce() -> u128) {
        let i = self.pos[e];
        if i != ABSENT {
            let i = i as usize;
            let r = rank();
            debug_assert!(r >= self.heap[i], "a rank that fell");
            self.heap[i] = r;
            self.sift_down(i);
        }
    }

    /// Every key changed: each entry's rank is now `rank(expert)`, and the heap is rebuilt.
    pub fn rekey(&mut self, rank: impl Fn(usize) -> u128) {
        for entry in self.heap.iter_mut() {
            *entry = rank(expert(*entry));
        }
        for i in (0..self.heap.len() / 2).rev() {
            self.sift_down(i);
        }
    }

    /// The expert of lowest (key, id) for which `skip` is false, if any. The lowest such
    /// expert has only skipped experts above it (any other would be lower), so the walk goes
    /// below skipped experts only, and not below an expert at or above the best found.
    #[inline(always)]
    pub fn lowest_where_not(&mut self, skip: impl Fn(usize) -> bool) -> Option<usize> {
        let len = self.heap.len();
        if len == 0 {
            return None;
        }
        let top = self.heap[0];
        if !skip(expert(top)) {
            return Some(expert(top));
        }
        let mut best: Option<u128> = None;
        self.stack.clear();
        // Each entry is pushed at most once (by its parent), so the stack stays within its
        // capacity.
        self.stack.push(0);
        while let Some(i) = self.stack.pop() {
            let i = i as usize;
            let x = self.heap[i];
            if best.is_some_and(|b| b <= x) {
                continue;
            }
            if !skip(expert(x)) {
                best = Some(x);
                continue;
            }
            let l = 2 * i + 1;
            if l < len {
                self.stack.push(l as u32);
                if l + 1 < len {
                    self.stack.push(l as u32 + 1);
                }
            }
        }
        best.map(expert)
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::KeyHeap;

    /// One operation on a heap of 16 experts: (what, expert, key, skip pattern).
    fn op() -> impl Strategy<Value = (u8, usize, u128, u16)> {
        // Keys from a small range, so that ties (broken by id) are frequent.
        (0u8..4, 0usize..16, 0u128..6, any::<u16>())
    }

    proptest! {
        /// Random inserts, removals, key changes and rekeys against the plain definition: the
        /// lowest (key, id) among the experts in the heap that are not skipped.
        #[test]
        fn yields_the_minimum_of_key_and_id(ops in prop::collection::vec(op(), 1..300), cap in 1usize..17) {
            let mut heap = KeyHeap::new(16, cap);
            let mut key: Vec<Option<u128>> = vec![None; 16];
            for (what, e, k, pattern) in ops {
                let cached = key.iter().filter(|k| k.is_some()).count();
                match (what, key[e]) {
                    (0, None) if cached < cap => {
                        heap.insert(k << 16 | e as u128);
                        key[e] = Some(k);
                    }
                    (1, Some(_)) => {
                        heap.remove(e);
                        key[e] = None;
                    }
                    (3, _) => {
                        for (x, kx) in key.iter_mut().enumerate() {
                            *kx = kx.map(|v| (v + x as u128 * k) % 7);
                        }
                        heap.rekey(|x| key[x].expect("in the heap") << 16 | x as u128);
                    }
                    _ => {
                        // A change of e's key (nothing when e is not in the heap).
                        if what == 2 && key[e].is_some_and(|old| old <= k) {
                            heap.raise(e, || k << 16 | e as u128);
                        } else {
                            heap.update(e, || k << 16 | e as u128);
                        }
                        if key[e].is_some() {
                            key[e] = Some(k);
                        }
                    }
                }
                prop_assert_eq!(heap.len(), key.iter().filter(|k| k.is_some()).count());
                let skip = |x: usize| pattern & (1 << x) != 0;
                let expect = (0..16).filter(|&x| !skip(x)).filter_map(|x| key[x].map(|k| (k, x))).min().map(|m| m.1);
                prop_assert_eq!(heap.lowest_where_not(skip), expect);
            }
        }
    }
}
