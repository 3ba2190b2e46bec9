"""Whether two node sets of a DAG may become one region: their union must stay convex (no path leaves it
and comes back), or the contracted graph would have a cycle.

The partitioner used to precompute every node's descendant and ancestor sets and intersect their unions:
quadratic memory (a 5k-node chain took 1.5 GB, 50k nodes ran out of memory). Here each check is a search
that starts at the smaller set only and stays inside the position window the answer can lie in (nodes are
in topological order), so memory is linear and a chain costs O(1) per merge. A work budget proportional to
the graph's size bounds the searches of one checker in total (the partitioner has one for growing regions,
one for merging them): once it is spent, further merges are refused, which is always safe (more regions,
never a cycle) and deterministic (the budget depends on the graph alone). A candidate whose window to the
region holds no node the region cannot take (`PositionCount`) needs no search at all (`partitioner.find_regions`
checks the finished region once instead, `is_convex`): a 440-node GPT-2 export, whose regions grew from a
mask read by every layer, spent the budget before that and ended in 13 regions instead of one.

Why searching from the small set `b` suffices, given that `a` and `b` are each convex: a path that leaves
the union and comes back must leave one and enter the other (leaving and re-entering `a` alone would make
`a` non-convex), so it either starts at `b` (found going forward from `b`'s successors) or ends at `b`
(found going backward from `b`'s predecessors); and no node on it between the two sets can lie outside
the window of positions between them.
"""
from __future__ import annotations

import logging

log = logging.getLogger("dyntvm.partition")

# searches may visit this many nodes (plus edges) per node and edge of the graph, all checks together
WORK_PER_ELEMENT = 16
MIN_BUDGET = 10_000


class ConvexityChecker:
    """Adjacency lists of a graph's nodes (by position, which is a topological order) and the searches."""

    def __init__(self, succ: list[list[int]], pred: list[list[int]]):
        self.succ, self.pred = succ, pred
        size = len(succ) + sum(map(len, succ))
        self.budget = WORK_PER_ELEMENT * size + MIN_BUDGET
        self.exhausted = False

    def union_is_convex(self, a: set, a_lo: int, a_hi: int, b) -> bool:
        """Whether `a` ∪ `b` is convex, `a` and `b` (an iterable of positions) each convex; `a_lo` / `a_hi`:
        the least and greatest position in `a`. False (refused) once the work budget is spent."""
        if self.exhausted:
            return False
        b = set(b)
        self.budget -= len(b)
        # forward from b: a node after a's last one cannot reach a
        if self._reaches(b, self.succ, lambda x: x < a_hi, a):
            return False
        # backward from b: a node before a's first one cannot be reached from a
        return not self._reaches(b, self.pred, lambda x: x > a_lo, a)

    def _reaches(self, b: set, edges, in_window, a: set) -> bool:
        """Whether a path b -> x -> ... -> a (along `edges`) exists whose interior nodes are in neither set;
        True too when the budget runs out (the caller refuses then)."""
        stack = list(dict.fromkeys(y for s in b for y in edges[s] if y not in a and y not in b and in_window(y)))
        seen = set(stack)
        while stack:
            x = stack.pop()
            nxt = edges[x]
            self.budget -= 1 + len(nxt)
            if self.budget < 0:
                if not self.exhausted:
                    log.debug("partition: convexity search budget spent; refusing further merges")
                self.exhausted = True
                return True
            for y in nxt:
                if y in a:
                    return True
                if y not in seen and y not in b and in_window(y):
                    seen.add(y)
                    stack.append(y)
        return False


class PositionCount:
    """How many marked positions lie in a window (a Fenwick tree): the partitioner marks the nodes no region
    may take (not selectable) and those already in a region, and skips the search for a candidate whose
    window between it and the region holds none (`partitioner.find_regions`)."""

    def __init__(self, n: int):
        self.tree = [0] * (n + 1)

    def mark(self, pos: int) -> None:
        i = pos + 1
        while i < len(self.tree):
            self.tree[i] += 1
            i += i & -i

    def _prefix(self, pos: int) -> int:          # marks at positions < pos
        total, i = 0, pos
        while i > 0:
            total += self.tree[i]
            i -= i & -i
        return total

    def count(self, lo: int, hi: int) -> int:
        """Marks at positions lo..hi (inclusive)."""
        return self._prefix(hi + 1) - self._prefix(lo)


def is_convex(members: set, lo: int, hi: int, succ: list[list[int]]) -> bool:
    """Whether no path leaves `members` (positions lo..hi) and comes back: a search forward from the members'
    outside successors, inside the window."""
    stack = [y for m in members for y in succ[m] if y not in members and y < hi]
    seen = set(stack)
    while stack:
        x = stack.pop()
        for y in succ[x]:
            if y in members:
                return False
            if y not in seen and y < hi:
                seen.add(y)
                stack.append(y)
    return True
