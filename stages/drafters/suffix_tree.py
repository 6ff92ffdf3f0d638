"""Suffix trees with occurrence counts: the structure the `suffix` drafter reads, and the walk that drafts from it.

A `SuffixTree` holds token sequences as the trie of their suffixes, each cut at `depth` tokens, path-compressed (an
edge carries a run of tokens). A node's `count` is the number of sequence positions whose suffix runs through it:
the occurrences of the string that ends there, so `count(s + t) / count(s)` is how often `t` followed `s`. Every
inserted path ends at a node (never inside an edge), so a count holds along its whole edge; a node no path ends at
with one child is merged into it, so the tree holds at most two nodes per position.

Whole sequences are added and removed (the cache of earlier requests); one sequence may instead grow token by token
(`extend`: a lane's prompt and answer), its last `depth - 1` suffixes kept open as the nodes they end at. Removing a
sequence that was never added, or extending a tree that also holds added sequences, is not supported.
`speculate` finds the context's suffixes in the tree and drafts along the most frequent continuation.
Not here: which trees a lane reads, the cache's token budget, the backend interface (`stages/drafters/suffix.py`).
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs

# A match of at least this many tokens drafts up to the limit, not only `spec_factor` drafts a matched token: a context
# that long is an echo (an agent's file, an answer repeated from the last turn), whose continuation runs on past the
# match; `spec_factor` keeps guarding the short matches, which prose is full of
LONG_MATCH = 16
# A resume (suffix.py, `_resume`) whose own context matches fewer tokens than this drafts whatever followed a token or
# two the lane wrote anywhere, not the echo it resumes: in the agent replay's traces such resumes were refused at once
RESUME_MATCH = 4
# A path the target left after a match of at least this many tokens is resumed as an edit (suffix_cache.py, `Outcomes`):
# not only an echo's (LONG_MATCH). A conversation's turn repeats its last answer after the same user-message tail, which
# matches fewer tokens than an echo; where the answer changes one token (`# 4.` for `# 3.`), the match left after that
# token is a few tokens long, and without the resume the lane rebuilt it over several rounds of short drafts. Shorter
# matches stay out: after them the target leaves a path for good (new text) far more often than it edits one token
EDIT_MATCH = 8


class Node:
    __slots__ = ("children", "count", "label", "parent")

    def __init__(self, label: tuple[int, ...], count: int, parent: Node | None):
        self.label = label  # the edge's tokens from `parent` (the root's is empty)
        self.count = count  # paths through this node: occurrences of the string ending here
        self.children: dict[int, Node] = {}  # first token of the child's edge -> child
        self.parent = parent


def _count(node: Node) -> int:
    return node.count


@attrs.frozen
class Draft:
    """Drafts after a matched context, with the estimated chance that every draft up to each one is accepted."""

    drafts: tuple[int, ...] = ()
    chances: tuple[float, ...] = ()  # non-increasing, one a draft
    match: int = 0  # tokens of context matched (0: none)
    resume: bool = False  # drafted as if the path the target's newest token left had been taken (suffix.py, `_resume`)

    @property
    def score(self) -> float:
        """The expected accepted drafts: the sum of the chances."""
        return sum(self.chances)

    def cut(self, k: int) -> Draft:
        """The first k drafts (a smaller limit)."""
        return self if k >= len(self.drafts) else attrs.evolve(self, drafts=self.drafts[:k], chances=self.chances[:k])


NO_DRAFT = Draft()


class SuffixTree:
    def __init__(self, depth: int):
        assert depth >= 2, depth
        self.depth = depth
        self.root = Node((), 0, None)  # root.count: the positions held
        self.tokens: list[int] = []  # the growing sequence (`extend`); empty for a tree of added sequences
        self._open: list[Node] = []  # end nodes of its suffixes shorter than depth, oldest first

    # -- structure -------------------------------------------------------------------------------------------
    def _split(self, node: Node, n: int) -> Node:
        """Cut `node`'s edge after n tokens; the new upper node is returned, `node` keeps its identity (and the
        paths that end at it) below it."""
        label = node.label
        upper = Node(label[:n], node.count, node.parent)
        upper.children[label[n]] = node
        node.parent.children[label[0]] = upper
        node.label, node.parent = label[n:], upper
        return upper

    def _merge(self, node: Node) -> None:
        """Fold `node` into its only child when no path ends at it (its count is the child's)."""
        if node.parent is None or len(node.children) != 1:
            return
        (child,) = node.children.values()
        if child.count != node.count:
            return
        child.label = node.label + child.label
        child.parent = node.parent
        node.parent.children[node.label[0]] = child

    def _add_path(self, path: tuple[int, ...]) -> None:
        node, pos = self.root, 0
        node.count += 1
        while pos < len(path):
            child = node.children.get(path[pos])
            if child is None:
                node.children[path[pos]] = Node(path[pos:], 1, node)
                return
            label = child.label
            n = len(label)
            if path[pos : pos + n] != label:
                n = 1
                while n < len(label) and pos + n < len(path) and label[n] == path[pos + n]:
                    n += 1
                child = self._split(child, n)
            child.count += 1
            node, pos = child, pos + n

    def _remove_path(self, path: tuple[int, ...]) -> None:
        node, pos = self.root, 0
        node.count -= 1
        while pos < len(path):
            child = node.children[path[pos]]
            child.count -= 1
            if child.count == 0:  # counts shrink downwards: the whole subtree held only this path
                del node.children[path[pos]]
                break
            node, pos = child, pos + len(child.label)
        self._merge(node)

    def add(self, seq: Sequence[int]) -> None:
        """Count every suffix of `seq` (cut at depth tokens)."""
        seq = tuple(seq)
        for i in range(len(seq)):
            self._add_path(seq[i : i + self.depth])

    def remove(self, seq: Sequence[int]) -> None:
        """Undo `add(seq)`: nodes left with no path are dropped."""
        seq = tuple(seq)
        for i in range(len(seq)):
            self._remove_path(seq[i : i + self.depth])

    def _step(self, node: Node, token: int) -> Node:
        """The path ending at `node` grows by `token`; returns the node it ends at now."""
        if node.count == 1 and not node.children and node.parent is not None:
            # this path alone ends here (a context seen once: most open suffixes past the shortest few): its edge
            # grows in place, what a new child merged back into it would give
            node.label += (token,)
            return node
        child = node.children.get(token)
        if child is None:
            child = node.children[token] = Node((token,), 1, node)
        else:
            if len(child.label) > 1:
                child = self._split(child, 1)
            child.count += 1
        self._merge(node)
        return child

    def extend(self, tokens: Sequence[int]) -> None:
        """Append `tokens` to the growing sequence: each of its open suffixes, and a new one per token, grows by it.
        Many tokens at once (a prompt) are taken in as whole paths (`_extend_paths`): the same tree, built faster."""
        if len(tokens) > self.depth:
            self._extend_paths(tokens)
            return
        for token in tokens:
            self.tokens.append(token)
            self.root.count += 1
            grown = [self._step(node, token) for node in (*self._open, self.root)]
            self._open = grown[1:] if len(grown) >= self.depth else grown

    def _extend_paths(self, tokens: Sequence[int]) -> None:
        """`extend` by whole paths: each open suffix's path is taken out and put back grown, each new position's
        path is added (cut at depth), then the open suffixes' end nodes are found again."""
        seq, depth = self.tokens, self.depth
        start = len(seq)
        first = max(0, start - (depth - 1))  # the open suffixes' positions: shorter than depth
        for p in range(first, start):
            self._remove_path(tuple(seq[p:start]))
        seq.extend(tokens)
        end = len(seq)
        for p in range(first, end):
            self._add_path(tuple(seq[p : min(p + depth, end)]))
        self._open = [self.find(seq[p:])[0] for p in range(max(0, end - (depth - 1)), end)]

    # -- reading -----------------------------------------------------------------------------------------------
    def find(self, s: Sequence[int]) -> tuple[Node, int] | None:
        """Where `s` ends (its last node, and how many tokens of that node's edge it takes); None when absent."""
        node, off, pos = self.root, 0, 0
        while pos < len(s):
            if off == len(node.label):
                child = node.children.get(s[pos])
                if child is None:
                    return None
                node, off = child, 0
            n = min(len(node.label) - off, len(s) - pos)
            if tuple(s[pos : pos + n]) != node.label[off : off + n]:
                return None
            off, pos = off + n, pos + n
        return node, off

    def _open_ends(self, s: list[int]) -> int:
        """1 when `s` ends the growing sequence (that occurrence has no continuation yet), else 0."""
        return int(bool(self.tokens) and len(s) <= len(self.tokens) and self.tokens[len(self.tokens) - len(s) :] == s)

    def occurrences(self, s: list[int]) -> int:
        """Occurrences of `s` that a token follows."""
        point = self.find(s)
        if point is None:
            return 0
        node, off = point
        return node.count - (self._open_ends(s) if off == len(node.label) else 0)

    def walk(self, s: list[int], limit: int, min_prob: float) -> Draft:
        """Draft up to `limit` tokens after `s` (present in the tree), each the most frequent continuation, while the
        estimated chance that every draft so far is accepted (the product of continuation count / context count)
        stays >= min_prob."""
        node, off = self.find(s)
        u, out, chances, prob = list(s), [], [], 1.0
        while len(out) < limit:
            if off < len(node.label):  # inside an edge every occurrence goes on: the chance does not move
                token = node.label[off]
                off += 1
            else:
                if not node.children:
                    break
                child = max(node.children.values(), key=_count)
                held = node.count - self._open_ends(u)
                if held <= 0 or prob * child.count / held < min_prob:
                    break
                prob *= child.count / held
                node, off, token = child, 1, child.label[0]
            u.append(token)
            out.append(token)
            chances.append(prob)
        return Draft(tuple(out), tuple(chances), len(s))

    def speculate(
        self, context: Sequence[int], limit: int, min_prob: float, spec_factor: float, better_than: float = 0.0
    ) -> Draft:
        """The best draft after `context` over its suffixes (the longest first) found in the tree with a
        continuation: a suffix of m tokens drafts at most floor(m * spec_factor) tokens (and `limit`; up to `limit`
        where m >= LONG_MATCH). The draft with the highest score wins, a longer match on ties; an empty draft when
        none scores above `better_than`."""
        context = list(context[-(self.depth - 1) :])
        lo, hi = 0, len(context)  # binary search for the longest suffix with a continuation: presence is monotone
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if self.occurrences(context[-mid:]) > 0:
                lo = mid
            else:
                hi = mid - 1
        best = NO_DRAFT
        for m in range(lo, 0, -1):
            cap = limit if m >= LONG_MATCH else min(limit, int(m * spec_factor + 1e-6))
            if cap <= max(best.score, better_than):  # a score is at most its draft count; caps only shrink
                break
            found = self.walk(context[-m:], cap, min_prob)
            if found.score > max(best.score, better_than):
                best = found
        return best

    def held(self) -> int:
        """Positions counted in the tree (every sequence token is one suffix's start)."""
        return self.root.count
