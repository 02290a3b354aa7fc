//! The cached experts of one layer: O(1) lookup, insert and remove through a position index,
//! and, for the policies that scan the cache, every expert's first priority key beside it.

use super::simd::pick_if;

pub(crate) const ABSENT: u32 = u32::MAX;

/// The cached experts of one layer. For the policies that scan the cache (`slots` true): every
/// expert in one array, the cached ones first (`order[..len]`), with the policy's first priority
/// key of each expert alongside (`keys`, in the same order), so that a scan reads two contiguous
/// arrays the compiler vectorizes and an insertion or eviction is one swap that carries the key
/// along. For the others (`K = ()`): membership and the count only.
pub(crate) struct Cache<K> {
    /// With slots: every expert, cached ones first, and the experts the keep set prunes (never
    /// cached) last, from `kept` on; `[E]`.
    pub(crate) order: Vec<u16>,
    /// With slots: `keys[i]` is the first key of `order[i]`; `[E]`.
    pub(crate) keys: Vec<K>,
    /// With slots: the entry of each expert in `order`; without: 0 when cached, `ABSENT` when
    /// not. Either way `pos[e] < len` exactly when `e` is cached.
    pub(crate) pos: Vec<u32>,
    pub(crate) len: usize,
    /// How many experts the keep set keeps.
    pub(crate) kept: usize,
    pub(crate) keep_slots: bool,
}

impl<K: Copy + Default> Cache<K> {
    /// An empty cache over the experts of `keep` (`[E]`, true: kept).
    pub(crate) fn new(keep: &[bool], keep_slots: bool) -> Cache<K> {
        let num_experts = keep.len();
        let kept = keep.iter().filter(|&&k| k).count();
        if keep_slots {
            let order: Vec<u16> = (0..num_experts)
                .filter(|&e| keep[e])
                .chain((0..num_experts).filter(|&e| !keep[e]))
                .map(|e| e as u16)
                .collect();
            let mut pos = vec![0; num_experts];
            for (i, &e) in order.iter().enumerate() {
                pos[usize::from(e)] = i as u32;
            }
            Cache { order, keys: vec![K::default(); num_experts], pos, len: 0, kept, keep_slots }
        } else {
            Cache { order: Vec::new(), keys: Vec::new(), pos: vec![ABSENT; num_experts], len: 0, kept, keep_slots }
        }
    }

    #[inline(always)]
    pub(crate) fn contains(&self, e: usize) -> bool {
        (self.pos[e] as usize) < self.len
    }

    /// Swaps entries `i` and `j` of `order` (with their keys).
    #[inline(always)]
    pub(crate) fn swap(&mut self, i: usize, j: usize) {
        self.order.swap(i, j);
        self.keys.swap(i, j);
        self.pos[usize::from(self.order[i])] = i as u32;
        self.pos[usize::from(self.order[j])] = j as u32;
    }

    /// Inserts expert `e` if `miss` (`e` is then not cached; its key comes along) and changes
    /// nothing otherwise, without a branch on `miss`.
    #[inline(always)]
    pub(crate) fn admit(&mut self, e: usize, miss: bool) {
        if self.keep_slots {
            let p = self.pos[e] as usize;
            // A swap of p with itself changes nothing.
            self.swap(p, pick_if(miss, self.len, p));
        } else {
            self.pos[e] = 0;
        }
        self.len += usize::from(miss);
    }

    /// Removes cached expert `e`; its key stays with it.
    #[inline(always)]
    pub(crate) fn remove(&mut self, e: usize) {
        self.len -= 1;
        if self.keep_slots {
            self.swap(self.pos[e] as usize, self.len);
        } else {
            self.pos[e] = ABSENT;
        }
    }

    /// The keys of the cached experts, in the order of `order[..len]`.
    #[inline(always)]
    pub(crate) fn live_keys(&self) -> &[K] {
        &self.keys[..self.len]
    }

    /// The key of expert `e` (cached or not).
    #[inline(always)]
    pub(crate) fn key(&self, e: usize) -> K {
        self.keys[self.pos[e] as usize]
    }

    /// The key of expert `e` (cached or not), to change.
    #[inline(always)]
    pub(crate) fn key_mut(&mut self, e: usize) -> &mut K {
        &mut self.keys[self.pos[e] as usize]
    }

    /// Empties the cache (keys stay with their experts).
    pub(crate) fn clear(&mut self) {
        if !self.keep_slots {
            self.pos.fill(ABSENT);
        }
        self.len = 0;
    }
}
