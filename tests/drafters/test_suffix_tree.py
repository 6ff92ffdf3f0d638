"""Suffix trees with counts: every count equals a brute-force count of occurrences, after adds, removes and growth
token by token; the tree stays compressed; drafts follow the most frequent continuation while its estimated chance
holds."""

import random

import pytest

from speclane.stages.drafters.suffix_tree import LONG_MATCH, SuffixTree


def strings(tree: SuffixTree) -> dict[tuple, int]:
    """Every node's string -> count, checking the structure on the way: parents, positive counts, counts that
    shrink downwards, and no node a path could be folded through."""
    out = {}

    def visit(node, prefix):
        for child in node.children.values():
            assert child.parent is node and child.count > 0
            assert child.count >= sum(c.count for c in child.children.values())
            only = list(child.children.values())
            assert not (len(only) == 1 and only[0].count == child.count), "a node no path ends at, with one child"
            out[prefix + child.label] = child.count
            visit(child, prefix + child.label)

    visit(tree.root, ())
    return out


def brute(seqs, depth) -> dict[tuple, int]:
    counts = {}
    for seq in seqs:
        for i in range(len(seq)):
            for j in range(i + 1, min(i + depth, len(seq)) + 1):
                counts[tuple(seq[i:j])] = counts.get(tuple(seq[i:j]), 0) + 1
    return counts


def assert_counts(tree, seqs):
    expected = brute(seqs, tree.depth)
    for s, n in strings(tree).items():
        assert expected[s] == n, (s, n, expected[s])
    for s, n in expected.items():
        node, _ = tree.find(list(s))
        assert node.count == n, (s, node.count, n)
    assert tree.held() == sum(len(s) for s in seqs)


@pytest.mark.parametrize("seed", range(40))
def test_counts_after_adds_and_removes_match_brute_force(seed):
    rng = random.Random(seed)
    depth, vocab = rng.randint(2, 7), rng.randint(1, 4)  # tiny vocabularies: many repeats, splits and merges
    seqs = [[rng.randrange(vocab) for _ in range(rng.randint(0, 30))] for _ in range(5)]
    tree = SuffixTree(depth)
    for s in seqs:
        tree.add(s)
    assert_counts(tree, seqs)
    for gone in rng.sample(range(5), 3):
        tree.remove(seqs[gone])
        seqs[gone] = []
        assert_counts(tree, seqs)
    assert tree.find([vocab]) is None


@pytest.mark.parametrize("seed", range(40))
def test_growing_token_by_token_equals_adding_the_whole_sequence(seed):
    # tiny vocabularies repeat (splits, merges); wide ones give contexts seen once, whose edges grow in place
    rng = random.Random(seed)
    depth = rng.randint(2, 7) if seed % 2 else rng.randint(8, 24)
    vocab = rng.randint(1, 4) if seed % 4 < 2 else rng.randint(20, 60)
    seq = [rng.randrange(vocab) for _ in range(40)]
    grown, at = SuffixTree(depth), 0
    while at < len(seq):
        n = rng.randint(1, 5)
        grown.extend(seq[at : at + n])
        at += n
        whole = SuffixTree(depth)
        whole.add(seq[:at])
        assert strings(grown) == strings(whole)
        assert grown.tokens == seq[:at]


@pytest.mark.parametrize("seed", range(40))
def test_growing_by_long_runs_then_token_by_token_equals_adding_the_whole_sequence(seed):
    # runs longer than depth go in as whole paths (a prompt), shorter ones token by token: one tree either way
    rng = random.Random(1000 + seed)
    depth = rng.randint(2, 9)
    seq = [rng.randrange(rng.randint(1, 5)) for _ in range(80)]
    grown, at = SuffixTree(depth), 0
    while at < len(seq):
        n = rng.choice((1, 2, depth, depth + 1, 3 * depth))
        grown.extend(seq[at : at + n])
        at = min(at + n, len(seq))
        whole = SuffixTree(depth)
        whole.add(seq[:at])
        assert strings(grown) == strings(whole) and grown.tokens == seq[:at]
        assert grown.held() == at


def test_removing_every_sequence_leaves_an_empty_tree():
    tree = SuffixTree(5)
    seqs = [[1, 2, 3, 1, 2, 4], [1, 2, 3], [7]]
    for s in seqs:
        tree.add(s)
    for s in seqs:
        tree.remove(s)
    assert tree.held() == 0 and not tree.root.children


@pytest.mark.parametrize(
    "seqs, context, limit, min_prob, expected",
    [
        # 1 2 -> 3 three times, -> 4 once: 3 (3/4), then 9 (3/4 x 1/1)
        ([[1, 2, 3, 9], [1, 2, 3, 9], [1, 2, 3, 9], [1, 2, 4]], [5, 1, 2], 3, 0.1, [3, 9]),
        # the same with a threshold above 3/4: nothing
        ([[1, 2, 3, 9], [1, 2, 3, 9], [1, 2, 3, 9], [1, 2, 4]], [5, 1, 2], 3, 0.8, []),
        # the limit caps it
        ([[1, 2, 3, 4, 5, 6]], [1, 2], 2, 0.1, [3, 4]),
        # a context of m tokens drafts at most m (spec_factor 1): the 1-token match 2 proposes one token
        ([[2, 3, 4, 5]], [8, 2], 7, 0.1, [3]),
        # never seen: nothing
        ([[1, 2, 3]], [4], 3, 0.1, []),
    ],
)
def test_speculate_case_table(seqs, context, limit, min_prob, expected):
    tree = SuffixTree(8)
    for s in seqs:
        tree.add(s)
    found = tree.speculate(context, limit, min_prob, spec_factor=1.0)
    assert list(found.drafts) == expected
    assert found.score <= len(found.drafts) and len(found.chances) == len(found.drafts)
    assert list(found.chances) == sorted(found.chances, reverse=True)  # a chance never rises along the path


def test_a_growing_sequence_never_counts_its_own_end_as_a_continuation():
    tree = SuffixTree(8)
    tree.extend([5, 6, 7, 1, 2])  # every suffix occurs only at the end: nothing follows it yet
    assert tree.speculate(tree.tokens, 3, 0.5, 1.0).drafts == ()
    tree.extend([9, 1, 2])  # 1 2 -> 9 once before: a sure continuation (1/1), not 1/2
    found = tree.speculate(tree.tokens, 3, 0.9, 1.0)
    assert found.drafts == (9, 1) and found.score == 2.0 and found.match == 2  # a 2-token match drafts 2 at most


def test_the_higher_expected_acceptance_wins_over_a_longer_match():
    tree = SuffixTree(8)
    # 7 1 -> 2 once and -> 3 once (chance 1/2 each); 1 -> 4 four more times: the 1-token context is surer
    for s in ([7, 1, 2], [7, 1, 3], [1, 4], [1, 4], [1, 4], [1, 4]):
        tree.add(s)
    found = tree.speculate([7, 1], 2, 0.1, 1.0)
    assert found.drafts == (4,) and found.score == pytest.approx(4 / 6) and found.match == 1


@pytest.mark.parametrize("m", [LONG_MATCH - 1, LONG_MATCH])
def test_a_long_match_drafts_past_its_length_and_a_shorter_one_does_not(m):
    """An echo: a context of LONG_MATCH tokens or more that the tree holds drafts up to the limit, where a shorter
    one drafts at most spec_factor times its length."""
    text = list(range(100, 100 + 3 * LONG_MATCH))
    tree = SuffixTree(4 * LONG_MATCH)
    tree.add(text)
    found = tree.speculate([7] + text[:m], 2 * LONG_MATCH, 0.1, spec_factor=1.0)
    assert list(found.drafts) == text[m : m + (2 * LONG_MATCH if m >= LONG_MATCH else m)]
