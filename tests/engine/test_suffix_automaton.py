"""The suffix automaton against brute force, and the suffix proposer's candidates."""
import random

import pytest
import torch

from common.decoders import get_decoder
from common.decoders.suffix import SuffixProposer, match_paths
from common.decoders.tree_loop import ProposerState
from common.engine.suffix_automaton import DynamicMatcher, SuffixAutomaton
from common.errors import UserError


def _texts(seed: int, n: int = 200):
    rng = random.Random(seed)
    for _ in range(n):
        alpha = rng.randint(1, 4)   # small alphabets: many repeats, many clones
        yield [rng.randrange(alpha) for _ in range(rng.randint(1, 50))], alpha


def _occurs(text, sub) -> bool:
    return any(text[i:i + len(sub)] == sub for i in range(len(text) - len(sub) + 1))


def _walk(sam, sub):
    s = 0
    for t in sub:
        if t not in sam.trans[s]:
            return None
        s = sam.trans[s][t]
    return s


def test_automaton_recognises_exactly_the_substrings():
    for text, alpha in _texts(0):
        sam = SuffixAutomaton(text)
        assert sam.states <= max(2, 2 * len(text) - 1)   # the root included
        rng = random.Random(len(text))
        for _ in range(30):
            i = rng.randrange(len(text))
            sub = text[i:i + rng.randint(1, 6)]
            s = _walk(sam, sub)
            assert s is not None
            # the state's first occurrence ends where the substring first ends
            first = min(j + len(sub) - 1 for j in range(len(text)) if text[j:j + len(sub)] == sub)
            assert sam.first[s] == first
            other = [rng.randrange(alpha + 1) for _ in range(rng.randint(1, 6))]
            assert (_walk(sam, other) is not None) == _occurs(text, other)


def _longest_earlier_match(text):
    """Brute force: the longest suffix of ``text`` that also ends before its last token, and
    where it ends first."""
    n = len(text)
    for length in range(n - 1, 0, -1):
        for end in range(length - 1, n - 1):
            if text[end - length + 1:end + 1] == text[n - length:]:
                return length, end
    return 0, -1


def test_dynamic_matcher_equals_brute_force():
    for text, _ in _texts(1):
        m = DynamicMatcher()
        for i, t in enumerate(text):
            m.add([t])
            length, end = _longest_earlier_match(text[:i + 1])
            assert m.length == length, text[:i + 1]
            if length:
                assert m.sam.first[m.state] == end
                assert m.continuation(3) == text[end + 1:min(end + 4, i + 1)]   # at least one token
            else:
                assert m.continuation(3) == []


def test_static_matching_equals_brute_force():
    for text, alpha in _texts(2, 100):
        sam = SuffixAutomaton(text)
        rng = random.Random(len(text) + 7)
        fed = [rng.randrange(alpha + 1) for _ in range(30)]
        s = length = 0
        for i, t in enumerate(fed):
            s, length = sam.step(s, length, t)
            seen = fed[:i + 1]
            want = max((k for k in range(len(seen) + 1) if _occurs(text, seen[len(seen) - k:])), default=0)
            assert length == want


def test_continuation_stops_at_the_separator():
    sep = 99
    sam = SuffixAutomaton([1, 2, 3, sep, 4, 5])
    s, _ = sam.step(*sam.step(0, 0, 1), 2)
    assert sam.continuation(s, 5, stop=sep) == [3]
    assert sam.continuation(s, 5) == [3, sep, 4, 5]


def _state(prompt, tokens, remaining=50):
    return ProposerState(torch.tensor([prompt]), tokens, None, remaining, 0.0, None)


def test_proposer_continues_a_repeated_sequence():
    prompt = [7, 1, 2, 3, 4, 5, 6, 8, 1, 2]
    p = SuffixProposer(prompt, "cpu", draft_len=4, branches=1, min_match=1)
    prop = p.propose(_state(prompt, [3]))                      # text ends "1 2 3": seen before, then 4 5 6 8
    assert prop.tree.is_chain and prop.tokens.tolist() == [4, 5, 6, 8]
    assert p.matches == [3]
    prop = p.propose(_state(prompt, [3, 4, 9]))                # "9" never occurred: no candidates
    assert prop.tree.size == 1 and p.matches[-1] == 0
    prop = p.propose(_state(prompt, [3, 4, 9, 5], remaining=3))  # "5" -> 6 8, cut to remaining - 1 = 2
    assert prop.tokens.tolist() == [6, 8]


def test_branches_add_the_shorter_matches_continuations():
    text = [1, 2, 3, 9, 2, 3, 8, 5, 3, 7, 1, 2, 3]
    m = DynamicMatcher(text)                 # "1 2 3" first ends at 2; "2 3" at 2 too; "3" at 2
    assert m.length == 3
    assert match_paths(m.sam, m.state, 2, 3, 1) == [[9, 2]]   # every ancestor shares the first occurrence
    m = DynamicMatcher([5, 3, 7, 2, 3, 9, 1, 2, 3])
    # "2 3" first ends at 4 (-> 9 1), "3" first ends at 1 (-> 7 2)
    assert match_paths(m.sam, m.state, 2, 3, 1) == [[9, 1], [7, 2]]
    assert match_paths(m.sam, m.state, 2, 3, 2) == [[9, 1]]   # min_match drops the 1-token match
    prop = SuffixProposer([5, 3, 7, 2, 3, 9, 1, 2], "cpu", 2, 2, 1).propose(_state([5, 3, 7, 2, 3, 9, 1, 2], [3]))
    assert sorted(prop.tree.paths) == [(0,), (0, 0), (1,), (1, 0)] and prop.tokens.tolist() == [9, 7, 1, 2]


@pytest.mark.parametrize("name,cfg", [("suffix", {"draft_len": 0}), ("suffix", {"branches": 0}),
                                      ("suffix", {"min_match": "x"}), ("suffix", {"datastore": "/nonexistent"}),
                                      ("samd", {"threshold": 0}), ("samd", {})])
def test_bad_options_are_one_error(chaotic_llama, name, cfg):
    with pytest.raises(UserError):
        get_decoder(name, chaotic_llama, **cfg)
