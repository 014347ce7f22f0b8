"""The sampling rules against exact distributions, and sampling in the decoder contract.

Each lossless rule decodes two tokens many times on a synthetic "model" (a logits table keyed
by prefix, a small vocabulary) through its registered class; the joint distribution of the two
tokens is compared with the exact one (``process`` of the table at each prefix) by a
chi-square test at a fixed significance. A deliberately wrong rule (accepting a draft token
with ``p(x)`` instead of ``min(1, p(x) / q(x))``) must fail the same test, so the test has the
power to catch the mistake it guards against.
"""
from __future__ import annotations

import collections
import functools

import pytest
import torch

from common.decoders import get_decoder
from common.engine import acceptance as acc
from common.engine.tree import build_tree
from common.errors import UserError
from common.harness import bench

V = 6             # vocabulary: 36 two-token outcomes
DRAWS = 20_000
ALPHA = 1e-3      # a correct rule fails one run in a thousand; the wrong one fails every run
T, TOP_K = 0.8, 5  # processed as every rule processes: exercises temperature and truncation

# tiny ops: a second thread only spin-waits (conftest's one_thread)
pytestmark = pytest.mark.usefixtures("one_thread")


def _table(seed: int) -> dict:
    """prefix (tuple) -> ``[V]`` logits, drawn once per prefix from ``seed``."""
    gen, rows = torch.Generator().manual_seed(seed), {}

    def logits(prefix: tuple) -> torch.Tensor:
        if prefix not in rows:
            rows[prefix] = 2.0 * torch.randn(V, generator=gen)
        return rows[prefix]
    return logits


TARGET, DRAFT = _table(1), _table(2)   # the draft disagrees with the target often


@functools.lru_cache(maxsize=None)
def _draft_q(prefix: tuple) -> torch.Tensor:
    """The draft's processed distribution after ``prefix`` (cached: the test draws thousands)."""
    return acc.process(DRAFT(prefix), T, top_k=TOP_K)


def _exact() -> dict:
    """The target's exact distribution of the first two tokens after the empty prefix."""
    p1 = acc.process(TARGET(()), T, top_k=TOP_K)
    return {(a, b): float(p1[a] * acc.process(TARGET((a,)), T, top_k=TOP_K)[b]) for a in range(V) for b in range(V)}


def _p_value(counts: collections.Counter, exact: dict, n: int) -> float:
    """Chi-square goodness of fit; cells expected below 5 are pooled (the approximation's rule)."""
    assert not [k for k in counts if exact.get(k, 0.0) == 0.0], "a token of probability 0 was produced"
    cells = sorted(exact, key=exact.get)
    obs, exp, pool_o, pool_e = [], [], 0.0, 0.0
    for c in cells:
        if exact[c] == 0.0:
            continue
        if exact[c] * n < 5:
            pool_o, pool_e = pool_o + counts[c], pool_e + exact[c] * n
        else:
            obs.append(counts[c])
            exp.append(exact[c] * n)
    if pool_e:
        obs.append(pool_o)
        exp.append(pool_e)
    o, e = torch.tensor(obs, dtype=torch.float64), torch.tensor(exp, dtype=torch.float64)
    stat = float(((o - e) ** 2 / e).sum())
    df = len(obs) - 1
    return float(torch.special.gammaincc(torch.tensor(df / 2, dtype=torch.float64), torch.tensor(stat / 2, dtype=torch.float64)))


# trees below each prefix: a root with three children, the first with two (nodes in rank order)
PATHS = [(0,), (1,), (2,), (0, 0), (0, 1)]
TREES = {"chain": build_tree([(0,)]), "rank": build_tree(PATHS), "drawn": build_tree(PATHS)}


def _tree_step(rule, prefix: tuple, gen, how: str):
    """One verification of a tree below ``prefix``: candidates by rank of the draft (``rank``),
    drawn without replacement from its processed distribution (``drawn``), or a chain of one
    draft token drawn from it (``chain``). Returns the committed tokens."""
    tree = TREES[how]
    tokens, q_rows, logits = {(): None}, {}, {(): TARGET(prefix)}
    for p in tree.paths:      # node order: parents first
        parent = p[:-1]
        seq = prefix + tuple(tokens[u] for u in [parent[:i] for i in range(1, len(parent) + 1)])
        q = _draft_q(seq)
        if how == "rank":
            tokens[p] = int(q.topk(p[-1] + 1).indices[-1])
        else:
            if parent not in q_rows:
                width = sum(1 for s in tree.paths if s[:-1] == parent)
                q_rows[parent] = (q, acc.gumbel_topk(q, width, gen).tolist())
            tokens[p] = q_rows[parent][1][p[-1]]
        logits[p] = TARGET(seq + (tokens[p],))
    order = [()] + list(tree.paths)
    node_tokens = torch.tensor([0] + [tokens[p] for p in tree.paths])
    draft_probs = None if how == "rank" else torch.stack([q_rows[p[:-1]][0] for p in tree.paths])
    path, nxt = rule.evaluate(node_tokens, torch.stack([logits[p] for p in order]), tree.retrieve_indices,
                              node_tokens[1:], draft_probs, gen)
    return [int(node_tokens[i]) for i in path[1:]] + [nxt]


def _two_tokens(rule, how: str, seed: int = 0) -> collections.Counter:
    gen, counts = torch.Generator().manual_seed(seed), collections.Counter()
    for _ in range(DRAWS):
        out: list[int] = []
        while len(out) < 2:
            out += _tree_step(rule, tuple(out), gen, how)
        counts[tuple(out[:2])] += 1
    return counts


class WrongTreeSpeculative(acc.TreeSpeculative):
    """The negative control: keeps a draft token with p(x), not min(1, p(x) / q(x))."""

    def accept_probability(self, p_x, q_x):
        return p_x


@pytest.mark.parametrize("name,how", [("target_sampling", "rank"), ("target_sampling", "drawn"),
                                      ("tree_speculative", "drawn"), ("speculative", "chain")])
def test_rule_is_exact(name, how):
    rule = acc.RULES[name](T, top_k=TOP_K)
    assert rule.lossless
    assert _p_value(_two_tokens(rule, how), _exact(), DRAWS) > ALPHA


def test_the_test_rejects_a_wrong_rule():
    assert _p_value(_two_tokens(WrongTreeSpeculative(T, top_k=TOP_K), "drawn"), _exact(), DRAWS) < ALPHA


def test_typical_is_labelled_lossy_and_is_no_default():
    from common.decoders import DECODERS, decoder_class
    assert not acc.RULES["typical"].lossless
    assert all(getattr(decoder_class(n), "default_sampling", None) != "typical" for n in DECODERS)


def test_target_sampling_lazy_reads_only_the_walked_rows():
    """The lazy variant gives the same tokens from the same generator, reading fewer rows."""
    tree = build_tree(PATHS)
    node_tokens = torch.tensor([0, 1, 2, 3, 4, 5])
    logits = torch.randn(tree.size, V, generator=torch.Generator().manual_seed(5))
    rule, read = acc.RULES["target_sampling"](T), []

    def rows(nodes):
        read.extend(nodes)
        return logits[nodes]
    for seed in range(20):
        full = rule.evaluate(node_tokens, logits, tree.retrieve_indices, None, None, torch.Generator().manual_seed(seed))
        lazy = rule.evaluate_lazy(node_tokens, tree.parents, rows, tree.retrieve_indices,
                                  torch.Generator().manual_seed(seed))
        assert full[0].tolist() == lazy[0].tolist() and full[1] == lazy[1]
    assert len(read) < 20 * tree.size


def test_process_is_transformers_order():
    """temperature, then top-k, then top-p, as generate()'s own processors."""
    from transformers import LogitsProcessorList, TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper
    logits = torch.randn(3, 50, generator=torch.Generator().manual_seed(0)) * 3
    for t, p, k in [(0.7, 0.9, 10), (1.3, 0.5, 0), (1.0, 1.0, 4), (0.5, 0.3, 2)]:
        procs = LogitsProcessorList([TemperatureLogitsWarper(t)] + ([TopKLogitsWarper(k)] if k else [])
                                    + ([TopPLogitsWarper(p)] if p < 1 else []))
        want = torch.softmax(procs(None, logits.clone()), -1)
        torch.testing.assert_close(acc.process(logits, t, p, k), want)
    assert acc.process(logits, 0.0).argmax(-1).tolist() == logits.argmax(-1).tolist()


# -- the decoder contract ----------------------------------------------------------------------
@pytest.fixture(scope="module")
def configs(chaotic_llama, tmp_path_factory):
    from common.decoders import decoder_class
    wd = tmp_path_factory.mktemp("cfg")
    return {"vanilla": {}, "lookahead": decoder_class("lookahead").test_configs(chaotic_llama, wd)[0],
            "eagle": decoder_class("eagle").test_configs(chaotic_llama, wd)[0]}


@pytest.mark.parametrize("name", ["vanilla", "lookahead", "eagle"])
def test_same_seed_same_tokens(name, chaotic_llama, configs):
    ids = torch.tensor([[1, 5, 9, 33]])
    run = lambda seed: get_decoder(name, chaotic_llama, None, **configs[name], temperature=1.0,  # noqa: E731
                                   seed=seed).generate(ids, 16).tokens
    first = run(3)
    assert run(3) == first
    assert any(run(s) != first for s in (4, 5, 6))


def test_eagle_static_uses_tree_speculative_and_dynamic_target_sampling(chaotic_llama, configs):
    static = get_decoder("eagle", chaotic_llama, None, **configs["eagle"], temperature=1.0)
    assert static.rule.name == "tree_speculative"
    dynamic = {**configs["eagle"], "mode": "dynamic"}
    assert get_decoder("eagle", chaotic_llama, None, **dynamic, temperature=1.0).rule.name == "target_sampling"
    with pytest.raises(UserError, match="needs mode='static'"):
        get_decoder("eagle", chaotic_llama, None, **dynamic, temperature=1.0, acceptance="tree_speculative")


@pytest.mark.parametrize("opts,match", [
    ({"temperature": -1.0}, "temperature=-1.0 is invalid"),
    ({"temperature": "hot"}, "temperature='hot' is invalid"),
    ({"top_p": 0.0}, r"top_p=0.0 is out of range; valid: a number in \(0, 1\]"),
    ({"top_p": 1.5}, "top_p=1.5 is invalid"),
    ({"top_k": -1}, "top_k=-1 is invalid"),
    ({"seed": -2}, "seed=-2 is invalid"),
    ({"seed": 1.5}, "seed=1.5 is invalid"),
])
def test_bad_sampling_options(opts, match, chaotic_llama):
    with pytest.raises(UserError, match=match):
        get_decoder("vanilla", chaotic_llama, None, **opts)


def test_a_decoder_that_cannot_sample_says_so(llama_pair):
    large, small = llama_pair
    with pytest.raises(UserError, match="decoder 'bild' cannot sample.*decoders that sample: .*vanilla"):
        get_decoder("bild", large, None, small=small, temperature=1.0)
    get_decoder("bild", large, None, small=small, temperature=0.0)


def test_bench_flags_reach_every_decoder_and_are_checked_first(tmp_path):
    def validate(*extra):
        return bench.validate(bench.parse_args(["--model", "m", "--decoders", "vanilla,lookahead,eagle@s",
                                                "--dataset", "mt-bench", "--out", str(tmp_path / "o.jsonl"),
                                                *extra]))
    _, cfgs = validate("--temperature", "0.7", "--seed", "5", "--decoder-config", '{"eagle@s": {"seed": 9}}')
    assert cfgs["vanilla"] == cfgs["lookahead"] == {"temperature": 0.7, "seed": 5}
    assert cfgs["eagle@s"] == {"temperature": 0.7, "seed": 9}      # the label's own setting wins
    assert validate()[1] == {}                                       # no flag: every decoder's defaults
    with pytest.raises(UserError, match="top_p=0.0 is out of range"):
        validate("--top-p", "0")
    with pytest.raises(UserError, match="decoder 'ppd_pipelined' cannot sample"):
        bench.validate(bench.parse_args(["--model", "m", "--decoders", "vanilla,ppd_pipelined", "--dataset",
                                         "mt-bench", "--out", str(tmp_path / "o.jsonl"), "--temperature", "1"]))
