//! The cached experts of one level in lfu's key order, (accesses since insertion, time of last
//! access), without a scan: the constant-time LFU structure of Shah, Mitra and Matani ("An O(1)
//! algorithm for implementing the LFU cache eviction scheme", 2010). A list of count nodes, in
//! increasing count, each holding its experts in increasing time of last access.
//!
//! Every operation is O(1) but the victim's, which skips the experts of the step's set (at most
//! its size). All buffers are allocated by [`FreqList::new`]: at most `cap` distinct counts are
//! cached at once, and one node more exists for a moment while an expert moves.

/// No node / no expert.
const NONE: u32 = u32::MAX;

/// Cached experts grouped by count (see the module doc).
pub(crate) struct FreqList {
    /// `[E]`: the node of a cached expert, and its neighbours in that node (older, newer).
    node_of: Vec<u32>,
    older: Vec<u32>,
    newer: Vec<u32>,
    /// Per node: its count, oldest and newest expert, and the nodes of the next lower and
    /// higher counts.
    count: Vec<u64>,
    oldest: Vec<u32>,
    newest: Vec<u32>,
    lower: Vec<u32>,
    higher: Vec<u32>,
    /// Nodes not in use.
    free: Vec<u32>,
    /// The node of the lowest count.
    first: u32,
}

impl FreqList {
    /// An empty list for `num_experts` experts and a cache of `cap`.
    pub fn new(num_experts: usize, cap: usize) -> FreqList {
        let nodes = cap + 2;
        FreqList {
            node_of: vec![NONE; num_experts],
            older: vec![NONE; num_experts],
            newer: vec![NONE; num_experts],
            count: vec![0; nodes],
            oldest: vec![NONE; nodes],
            newest: vec![NONE; nodes],
            lower: vec![NONE; nodes],
            higher: vec![NONE; nodes],
            free: (0..nodes as u32).rev().collect(),
            first: NONE,
        }
    }

    /// A new node of `count` between `lower` and `higher` (either may be [`NONE`]).
    fn new_node(&mut self, count: u64, lower: u32, higher: u32) -> u32 {
        let n = self.free.pop().expect("at most cap + 2 nodes");
        let i = n as usize;
        (self.count[i], self.oldest[i], self.newest[i], self.lower[i], self.higher[i]) =
            (count, NONE, NONE, lower, higher);
        if lower == NONE {
            self.first = n;
        } else {
            self.higher[lower as usize] = n;
        }
        if higher != NONE {
            self.lower[higher as usize] = n;
        }
        n
    }

    /// Appends `e` as node `n`'s newest expert.
    fn append(&mut self, n: u32, e: usize) {
        let i = n as usize;
        let last = self.newest[i];
        self.node_of[e] = n;
        (self.older[e], self.newer[e]) = (last, NONE);
        if last == NONE {
            self.oldest[i] = e as u32;
        } else {
            self.newer[last as usize] = e as u32;
        }
        self.newest[i] = e as u32;
    }

    /// Takes `e` out of its node, freeing the node when it empties.
    fn detach(&mut self, e: usize) {
        let n = self.node_of[e];
        let i = n as usize;
        let (o, w) = (self.older[e], self.newer[e]);
        if o == NONE {
            self.oldest[i] = w
        } else {
            self.newer[o as usize] = w
        }
        if w == NONE {
            self.newest[i] = o
        } else {
            self.older[w as usize] = o
        }
        self.node_of[e] = NONE;
        if self.oldest[i] == NONE {
            let (l, h) = (self.lower[i], self.higher[i]);
            if l == NONE {
                self.first = h
            } else {
                self.higher[l as usize] = h
            }
            if h != NONE {
                self.lower[h as usize] = l;
            }
            self.free.push(n);
        }
    }

    /// `e` was inserted: count 1, accessed last of all.
    pub fn insert(&mut self, e: usize) {
        let n = if self.first != NONE && self.count[self.first as usize] == 1 {
            self.first
        } else {
            self.new_node(1, NONE, self.first)
        };
        self.append(n, e);
    }

    /// Cached `e` was accessed: its count grows by one, and it is the last accessed.
    pub fn touch(&mut self, e: usize) {
        let n = self.node_of[e];
        let (c, h) = (self.count[n as usize], self.higher[n as usize]);
        let target = if h != NONE && self.count[h as usize] == c + 1 { h } else { self.new_node(c + 1, n, h) };
        self.detach(e);
        self.append(target, e);
    }

    /// `e` left the cache.
    pub fn remove(&mut self, e: usize) {
        self.detach(e);
    }

    /// The cached expert of lowest (count, last access) for which `skip` is false, if any.
    #[inline(always)]
    pub fn lowest_where_not(&self, skip: impl Fn(usize) -> bool) -> Option<usize> {
        let mut n = self.first;
        while n != NONE {
            let mut e = self.oldest[n as usize];
            while e != NONE {
                if !skip(e as usize) {
                    return Some(e as usize);
                }
                e = self.newer[e as usize];
            }
            n = self.higher[n as usize];
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::FreqList;

    /// Random inserts, accesses and removals against the plain definition: the lowest
    /// (count, last access) among cached experts not skipped.
    #[test]
    fn equals_the_minimum_of_count_and_last_access() {
        let (experts, cap) = (12, 5);
        let mut list = FreqList::new(experts, cap);
        let (mut count, mut last, mut cached) = (vec![0u64; experts], vec![0u64; experts], vec![false; experts]);
        let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
        for now in 1..5000u64 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let e = (x % experts as u64) as usize;
            let skip = |c: usize| (c as u64 + x).is_multiple_of(3);
            if cached[e] {
                if x.is_multiple_of(5) {
                    list.remove(e);
                    cached[e] = false;
                } else {
                    list.touch(e);
                    count[e] += 1;
                    last[e] = now;
                }
            } else if cached.iter().filter(|&&c| c).count() < cap {
                list.insert(e);
                (cached[e], count[e], last[e]) = (true, 1, now);
            }
            let expect = (0..experts).filter(|&c| cached[c] && !skip(c)).min_by_key(|&c| (count[c], last[c]));
            assert_eq!(list.lowest_where_not(skip), expect, "at {now}");
        }
    }
}
