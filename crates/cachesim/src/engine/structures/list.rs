//! An intrusive doubly-linked list over expert ids (lru, fifo).

use crate::engine::simd::pick_if;
use crate::engine::{ABSENT, Cache, Protected};

/// Intrusive doubly-linked list over expert ids with a sentinel at index E; front = oldest.
/// Index E + 1 is a spare entry, linked to itself whenever it is not in the list: unlinking it
/// changes nothing, so the branch-free steps of lru and fifo unlink it (and fifo appends it)
/// when they have nothing else to change. Both links of an entry sit side by side ([`Link`]), so
/// that one bounds check covers both.
pub(crate) struct List {
    /// `[E + 2]`: the links of every expert, the sentinel and the spare.
    pub(crate) links: Vec<Link>,
    pub(crate) sentinel: usize,
    pub(crate) spare: usize,
}

/// An entry's neighbours in a [`List`]: towards the front (older) and the back (newer).
#[derive(Clone, Copy)]
pub(crate) struct Link {
    pub(crate) prev: u32,
    pub(crate) next: u32,
}

impl List {
    pub(crate) fn new(num_experts: usize) -> List {
        let (s, spare) = (num_experts as u32, num_experts as u32 + 1);
        let mut links = vec![Link { prev: s, next: s }; num_experts + 2];
        links[num_experts + 1] = Link { prev: spare, next: spare };
        List { links, sentinel: num_experts, spare: num_experts + 1 }
    }

    #[inline(always)]
    pub(crate) fn push_back(&mut self, e: usize) {
        let s = self.sentinel;
        let tail = self.links[s].prev as usize;
        self.links[tail].next = e as u32;
        self.links[e].prev = tail as u32;
        self.links[e].next = s as u32;
        self.links[s].prev = e as u32;
    }

    #[inline(always)]
    pub(crate) fn unlink(&mut self, e: usize) {
        let Link { prev, next } = self.links[e];
        self.links[prev as usize].next = next;
        self.links[next as usize].prev = prev;
    }

    /// The oldest unprotected entry, or the sentinel if there is none. Entries in the list are
    /// distinct experts, so unique insertion/access times: no ties to break.
    #[inline(always)]
    pub(crate) fn first_unprotected(&self, protected: Protected<'_>) -> usize {
        let mut x = self.links[self.sentinel].next as usize;
        while x != self.sentinel && protected.has(x) {
            x = self.links[x].next as usize;
        }
        x
    }

    pub(crate) fn clear(&mut self) {
        let s = self.sentinel;
        self.links[s] = Link { prev: s as u32, next: s as u32 };
    }

    /// The victim of a full cache: its oldest unprotected entry.
    #[inline(always)]
    pub(crate) fn victim(&self, protected: Protected<'_>) -> usize {
        let v = self.first_unprotected(protected);
        debug_assert!(v != self.sentinel, "a full cache always holds an unprotected expert");
        v
    }

    /// The branch-free step 4 of lru and fifo for expert `e`: `relink(list, hit, evict, v)`
    /// updates the list, with `v` the oldest unprotected entry (a real expert whenever `evict`:
    /// a full cache holds an unprotected one); then the victim leaves the cache (on an
    /// eviction) and `e` is in it. Returns whether `e` hit.
    #[inline(always)]
    pub(crate) fn step(
        &mut self,
        e: usize,
        cap: usize,
        protected: Protected<'_>,
        cache: &mut Cache<()>,
        relink: impl FnOnce(&mut List, bool, bool, usize),
    ) -> bool {
        let hit = cache.contains(e);
        let full = cache.len >= cap;
        let evict = !hit & full;
        let v = self.first_unprotected(protected);
        relink(self, hit, evict, v);
        cache.pos[pick_if(evict, v, e)] = ABSENT;
        cache.pos[e] = 0;
        cache.len += usize::from(!hit & !full);
        hit
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The experts of `list` from the oldest, by walking the links.
    fn order(list: &List) -> Vec<usize> {
        let mut out = Vec::new();
        let mut x = list.links[list.sentinel].next as usize;
        while x != list.sentinel {
            out.push(x);
            x = list.links[x].next as usize;
        }
        out
    }

    #[test]
    fn push_unlink_and_victims() {
        let mut list = List::new(5);
        for e in [3, 1, 4] {
            list.push_back(e);
        }
        assert_eq!(order(&list), [3, 1, 4]);
        // An access moves 3 to the back.
        list.unlink(3);
        list.push_back(3);
        assert_eq!(order(&list), [1, 4, 3]);
        // 1 is protected (chosen for the token of stamp 7): the victim is the next oldest.
        let mut marks = vec![0u64; 5];
        marks[1] = 7;
        assert_eq!(list.victim(Protected { marks: &marks, stamp: 7 }), 4);
        // A stale mark (another stamp) protects nothing.
        assert_eq!(list.victim(Protected { marks: &marks, stamp: 8 }), 1);
        // Every entry protected: the walk ends at the sentinel.
        marks.fill(7);
        assert_eq!(list.first_unprotected(Protected { marks: &marks, stamp: 7 }), list.sentinel);
        // The spare unlinks to itself: nothing changes.
        list.unlink(list.spare);
        assert_eq!(order(&list), [1, 4, 3]);
        list.clear();
        assert_eq!(order(&list), Vec::<usize>::new());
    }
}
