//! Groups of equal access count, each an intrusive list ordered by last access (lfu).

use crate::engine::Protected;

pub(crate) const NIL: u32 = u32::MAX;

/// Per cached expert: neighbours in its group's list and its group (`NIL`: not cached).
#[derive(Clone, Copy)]
pub(crate) struct Item {
    pub(crate) prev: u32,
    pub(crate) next: u32,
    pub(crate) group: u32,
}

/// A group node: key, first and last expert, neighbours in the group list.
#[derive(Clone, Copy)]
pub(crate) struct Group {
    pub(crate) key: u64,
    pub(crate) head: u32,
    pub(crate) tail: u32,
    pub(crate) prev: u32,
    pub(crate) next: u32,
}

/// Cached experts ordered by (group key, last access): a doubly-linked list of groups in
/// increasing key order (sentinel `sentinel`), each holding an intrusive doubly-linked list of
/// its experts, oldest access first (appending the latest access keeps it ordered). Group
/// nodes come from a fixed pool (at most one per cached expert, plus one transiently), so
/// nothing allocates after construction.
pub(crate) struct Groups {
    pub(crate) items: Vec<Item>,
    pub(crate) groups: Vec<Group>,
    pub(crate) free: Vec<u32>,
    pub(crate) sentinel: u32,
}

impl Groups {
    pub(crate) fn new(num_experts: usize, cap: usize) -> Groups {
        let pool = cap.min(num_experts) + 2;
        let s = pool as u32;
        let mut g = Groups {
            items: vec![Item { prev: NIL, next: NIL, group: NIL }; num_experts],
            groups: vec![Group { key: 0, head: NIL, tail: NIL, prev: s, next: s }; pool + 1],
            free: Vec::with_capacity(pool),
            sentinel: s,
        };
        g.clear();
        g
    }

    pub(crate) fn clear(&mut self) {
        let s = self.sentinel as usize;
        let mut g = self.groups[s].next;
        while g != self.sentinel {
            let mut x = self.groups[g as usize].head;
            while x != NIL {
                self.items[x as usize].group = NIL;
                x = self.items[x as usize].next;
            }
            g = self.groups[g as usize].next;
        }
        self.groups[s].next = self.sentinel;
        self.groups[s].prev = self.sentinel;
        self.free.clear();
        self.free.extend((0..self.sentinel).rev());
    }

    #[inline(always)]
    pub(crate) fn first_group(&self) -> u32 {
        self.groups[self.sentinel as usize].next
    }

    /// A new, empty group with `key`, linked after group `after` (the sentinel: at the front).
    #[inline(always)]
    pub(crate) fn new_group_after(&mut self, after: u32, key: u64) -> u32 {
        let g = self.free.pop().expect("the pool holds a group per cached expert plus one");
        let n = self.groups[after as usize].next;
        self.groups[g as usize] = Group { key, head: NIL, tail: NIL, prev: after, next: n };
        self.groups[after as usize].next = g;
        self.groups[n as usize].prev = g;
        g
    }

    /// Appends expert `e` (not in any group) at the end of group `g`.
    #[inline(always)]
    pub(crate) fn push_back(&mut self, g: u32, e: usize) {
        let tail = self.groups[g as usize].tail;
        self.items[e] = Item { prev: tail, next: NIL, group: g };
        if tail == NIL {
            self.groups[g as usize].head = e as u32;
        } else {
            self.items[tail as usize].next = e as u32;
        }
        self.groups[g as usize].tail = e as u32;
    }

    /// Unlinks expert `e` from its group, leaving the group in place even when empty.
    #[inline(always)]
    pub(crate) fn unlink(&mut self, e: usize) -> u32 {
        let Item { prev, next, group } = self.items[e];
        if prev == NIL {
            self.groups[group as usize].head = next;
        } else {
            self.items[prev as usize].next = next;
        }
        if next == NIL {
            self.groups[group as usize].tail = prev;
        } else {
            self.items[next as usize].prev = prev;
        }
        self.items[e].group = NIL;
        group
    }

    /// Frees group `g` when it is empty.
    #[inline(always)]
    pub(crate) fn drop_if_empty(&mut self, g: u32) {
        let Group { head, prev, next, .. } = self.groups[g as usize];
        if head == NIL {
            self.groups[prev as usize].next = next;
            self.groups[next as usize].prev = prev;
            self.free.push(g);
        }
    }

    /// Removes cached expert `e`.
    #[inline(always)]
    pub(crate) fn remove(&mut self, e: usize) {
        let g = self.unlink(e);
        self.drop_if_empty(g);
    }

    /// Moves cached expert `e` to the end of group `to` (not its current group).
    #[inline(always)]
    pub(crate) fn move_to(&mut self, e: usize, to: u32) {
        let g = self.unlink(e);
        self.drop_if_empty(g);
        self.push_back(to, e);
    }

    /// The first unprotected expert in (key, last access) order. Some cached expert is
    /// unprotected.
    #[inline(always)]
    pub(crate) fn first_unprotected(&self, protected: Protected<'_>) -> usize {
        let mut g = self.first_group();
        while g != self.sentinel {
            let mut x = self.groups[g as usize].head;
            while x != NIL {
                if !protected.has(x as usize) {
                    return x as usize;
                }
                x = self.items[x as usize].next;
            }
            g = self.groups[g as usize].next;
        }
        debug_assert!(false, "a full cache always holds an unprotected expert");
        usize::MAX
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// (key, experts oldest first) of every group, in the group list's order.
    fn groups(g: &Groups) -> Vec<(u64, Vec<u32>)> {
        let mut out = Vec::new();
        let mut x = g.first_group();
        while x != g.sentinel {
            let mut experts = Vec::new();
            let mut e = g.groups[x as usize].head;
            while e != NIL {
                experts.push(e);
                e = g.items[e as usize].next;
            }
            out.push((g.groups[x as usize].key, experts));
            x = g.groups[x as usize].next;
        }
        out
    }

    #[test]
    fn groups_stay_ordered_by_key_then_access() {
        let mut g = Groups::new(6, 4);
        let one = g.new_group_after(g.sentinel, 1);
        for e in [2, 0, 5] {
            g.push_back(one, e);
        }
        // 0 is accessed again: it moves to a new group of key 2, after group 1.
        let two = g.new_group_after(one, 2);
        g.move_to(0, two);
        assert_eq!(groups(&g), [(1, vec![2, 5]), (2, vec![0])]);
        let none = vec![0u64; 6];
        assert_eq!(g.first_unprotected(Protected { marks: &none, stamp: 1 }), 2);
        let mut marks = vec![0u64; 6];
        marks[2] = 1;
        marks[5] = 1;
        // The whole first group is protected: the victim comes from the next one.
        assert_eq!(g.first_unprotected(Protected { marks: &marks, stamp: 1 }), 0);
        // Removing the last expert of a group frees the group.
        g.remove(0);
        assert_eq!(groups(&g), [(1, vec![2, 5])]);
        let free = g.free.len();
        g.clear();
        assert_eq!(groups(&g), []);
        assert!(g.free.len() > free);
        assert_eq!(g.items[2].group, NIL);
    }
}
