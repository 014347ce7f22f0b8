"""The proposer pool: the merged trie, the calibrated scores, the cut by the cost curve, the
online fit from every candidate's outcome, prompt lookup's n-gram source, and bad input (one
``error:`` line naming the valid source kinds). Exactness against vanilla: the shared lossless
test runs ``Pool.test_configs``."""
import json
import re

import pytest
import torch

from common.decoders import get_decoder
from common.decoders.pool import (SOURCES, Calibration, NgramProposer, PoolProposer, SourceKind, best_size,
                                  length_bin, read_cost, trie_proposal)
from common.decoders.tree_loop import Proposer, ProposerState, StepResult
from common.errors import UserError, cli_main
from common.hardware import describe

VALID = "valid source kinds: eagle, eagle3, suffix, recycling, prompt_lookup"


def _state(tokens, remaining=20, prompt=(1, 2)):
    return ProposerState(torch.tensor([list(prompt)]), list(tokens), None, remaining, 0.0, None)


class Fixed(Proposer):
    """A stub proposer: the same token paths below any root."""

    def __init__(self, paths):
        self.paths = paths

    def stats(self):
        return {}


def _fixed_kind(bin_=0):
    return SourceKind(build=None, draft=lambda p, s: (lambda prop: (prop, [bin_] * (prop.tree.size - 1)))(
        trie_proposal(p.paths, "cpu")), bin_name="stub")


def _pool(sources, cost, prior=(1.0, 1.0)):
    return PoolProposer({n: (_fixed_kind(), Fixed(ps)) for n, ps in sources.items()}, Calibration(prior),
                        cost, "cpu")


def _result(pool, proposal, accepted_tokens, next_token):
    """The step's outcome as the loop reports it: the accepted nodes' path and the next token."""
    tokens = proposal.tokens.tolist()
    parents = proposal.tree.parents.tolist()
    path, node = [0], 0
    for t in accepted_tokens:
        node = next(i for i in range(1, proposal.tree.size) if parents[i] == node and tokens[i - 1] == t)
        path.append(node)
    return StepResult(proposal, torch.tensor(path), None, next_token)


def _kept_paths(proposal):
    toks, parents = proposal.tokens.tolist(), proposal.tree.parents.tolist()
    seqs = [()]
    for i, t in enumerate(toks, start=1):
        seqs.append(seqs[parents[i]] + (t,))
    return set(seqs[1:])


# -- the merge, the cut, the fit --------------------------------------------------------------------
def test_duplicate_prefixes_are_one_node_that_remembers_every_source():
    pool = _pool({"a": [[5, 6, 7]], "b": [[5, 6, 9], [8]]}, cost=[1.0] * 10)
    p = pool.propose(_state([3]))
    assert _kept_paths(p) == {(5,), (5, 6), (5, 6, 7), (5, 6, 9), (8,)}   # 5 nodes, not 6
    assert set(pool.trie[(5,)]) == {"a", "b"} and set(pool.trie[(8,)]) == {"b"}
    assert pool.candidates == [5]


def test_the_cut_is_connected_best_first_and_sized_by_the_cost():
    pool = _pool({"a": [[5, 6, 7, 8]], "b": [[9]]}, cost=[1.0] * 10, prior=(9.0, 1.0))   # p = 0.9 each
    assert pool.propose(_state([3])).tree.size == 6                                      # flat: everything
    steep = _pool({"a": [[5, 6, 7, 8]], "b": [[9]]}, cost=[1.0, 1.9, 2.8, 3.7, 4.6, 5.5], prior=(9.0, 1.0))
    assert steep.propose(_state([3])).tree.size == 1   # every size ties at one token a unit: the root alone
    # E(q)/cost(q): q=1 -> 1, q=2 -> 1.9/1.9, q=3 -> (1.9+.9)/2.8 = 1: a tie keeps the smaller size
    assert best_size([0.9, 0.9, 0.81], [1.0, 1.9, 2.8, 3.7]) == 1
    assert best_size([0.9, 0.9, 0.81], [1.0, 1.2, 1.3, 1.4]) == 4
    assert best_size([0.9, 0.1], [1.0, 1.2, 2.0]) == 2
    assert best_size([], [1.0, 1.1]) == 1
    # connected: a deep node of a likely chain outranks a shallow unlikely one, never its own parent
    pool = _pool({"a": [[5, 6]], "b": [[9]]}, cost=[1.0] * 10)
    for _ in range(20):   # teach the fit: a accepted twice a step, b never
        p = pool.propose(_state([3]))
        pool.update(_result(pool, p, [5, 6], 1))
    trimmed = PoolProposer(pool.sources, pool.cal, [1.0, 1.0, 1.0], "cpu")   # room for two nodes
    assert _kept_paths(trimmed.propose(_state([3]))) == {(5,), (5, 6)}


def test_every_candidate_is_labelled_kept_or_cut_and_tokens_are_credited_per_source():
    pool = _pool({"a": [[5, 6, 7]], "b": [[5, 4], [8, 2]]}, cost=[1.0, 1.0, 1.0])   # keeps 2 of 6 candidates
    p = pool.propose(_state([3]))
    kept = _kept_paths(p)
    assert len(kept) == 2 and (5,) in kept
    pool.update(_result(pool, p, [5], 6))   # the target took 5, then 6
    # tested: depth 1 (5 hit, 8 miss) and depth 2 under 5 (6 hit, 4 miss), whether kept or cut;
    # (8, 2) and (5, 6, 7) are untested: their parents were not accepted
    fine = pool.cal.fine
    assert fine[("a", 1, 0)] == [1, 1] and fine[("b", 1, 0)] == [1, 2]
    assert fine[("a", 2, 0)] == [1, 1] and fine[("b", 2, 0)] == [0, 1]
    assert ("a", 3, 0) not in fine
    assert pool.accepted == {"a": 1, "b": 1}   # the one accepted node, proposed by both
    table = {(r["source"], r["depth"]): r for r in pool.stats()["pool_calibration"]}
    assert table[("b", 1)]["tested"] == 2 and table[("b", 1)]["observed"] == 0.5
    assert table[("a", 1)]["predicted"] == pytest.approx(0.5)   # the prior's mean, before this step's fit


def test_a_node_two_sources_propose_takes_the_likelier_rate():
    pool = _pool({"a": [[5]], "b": [[5]]}, cost=[1.0] * 4)
    for _ in range(3):
        pool.cal.update("a", 1, 0, True)
        pool.cal.update("b", 1, 0, False)
    assert pool.cal.p("a", 1, 0) > 0.5 > pool.cal.p("b", 1, 0)
    assert pool.node_p((5,), {"a": 0, "b": 0}) == pool.cal.p("a", 1, 0)


def test_calibration_backs_off_to_the_depth_rate():
    cal = Calibration((1.0, 1.0))
    assert cal.p("s", 1, 0) == 0.5
    for _ in range(8):
        cal.update("s", 1, 0, True)
    cal.update("s", 1, 0, False)
    assert cal.p("s", 1, 0) == pytest.approx((8 + 2 * (9 / 11)) / (9 + 2))
    assert cal.p("s", 1, 3) == pytest.approx(9 / 11)   # an unseen bin: its depth's pooled rate
    assert cal.p("s", 2, 0) == 0.5 and cal.p("t", 1, 0) == 0.5
    assert [length_bin(n) for n in (0, 1, 2, 3, 4, 7, 8, 16, 500)] == [0, 1, 2, 2, 3, 3, 4, 5, 5]


def test_cost_from_a_list_or_a_cost_curve(tmp_path):
    assert read_cost(None, 4, "cpu") == [1.0] * 4
    assert read_cost([1, 2, 3], 2, "cpu") == [1.0, 2.0]
    curve = tmp_path / "c.jsonl"
    curve.write_text("".join(json.dumps(r) + "\n" for r in [
        {"q": 1, "ms": 10.0, "forward_path": "fast"}, {"q": 4, "ms": 16.0, "forward_path": "fast"},
        {"q": 1, "ms": 99.0, "forward_path": "stock"}, {"q": 8, "ms": 24.0, "forward_path": "fast"}]))
    # T(q) / T(1), interpolated between measured sizes (the cut reads ratios only)
    assert read_cost(str(curve), 6, "cpu") == pytest.approx([1.0, 1.2, 1.4, 1.6, 1.8, 2.0])
    assert len(read_cost(str(curve), 20, "cpu")) == 8   # no size beyond the curve's last measured one
    for bad in ([], [1.0, 0.0], [True], ["1"]):
        with pytest.raises(UserError, match="seconds per verified size"):
            read_cost(bad, 4, "cpu")
    curve.write_text('{"q": 2, "ms": 3.0, "forward_path": "fast"}\n')
    with pytest.raises(UserError, match="no q=1 record"):
        read_cost(str(curve), 4, "cpu")
    with pytest.raises(UserError, match="not a file"):
        read_cost(str(tmp_path / "missing.jsonl"), 4, "cpu")


def test_cost_curve_of_this_host_only(tmp_path):
    """A curve names its host: this host's is read (from the file, else from the copies kept beside
    it), another host's never."""
    here = describe("cpu")

    def write(path, device, slope):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("".join(json.dumps({"q": q, "ms": 10.0 + slope * (q - 1), "forward_path": "fast",
                                            "device": device}) + "\n" for q in (1, 2, 4)))
    main = tmp_path / "cost_curve.jsonl"
    write(main, "cpu: elsewhere", 10.0)
    with pytest.raises(UserError, match="measured on .*elsewhere"):
        read_cost(str(main), 4, "cpu")
    write(tmp_path / "cost_curves" / "here.jsonl", here, 1.0)
    assert read_cost(str(main), 4, "cpu") == pytest.approx([1.0, 1.1, 1.2, 1.3])
    write(main, here, 5.0)   # the rule's latest measurement wins over a kept copy of the same host
    assert read_cost(str(main), 2, "cpu") == pytest.approx([1.0, 1.5])


def test_ngram_source_is_prompt_lookup():
    """The first earlier occurrence of the longest tail n-gram (transformers' order), never the tail itself."""
    ng = NgramProposer([1, 2, 3, 9, 1, 2, 3, 4, 1], "cpu", num_tokens=3, max_ngram=2)
    assert ng.match(_state([2], remaining=20)) == ([3, 9, 1], 2)   # (1, 2) first at 0
    assert ng.match(_state([2, 7], remaining=20)) == ([], 0)       # 7 is new: nothing earlier
    assert ng.match(_state([2, 7, 3], remaining=3)) == ([9, 1], 1)  # (7, 3) unseen, 3 first at 2; depth capped
    assert ng.match(_state([2, 7, 3, 5], remaining=1)) == ([], 0)
    assert ng.propose(_state([2, 7, 3, 5, 2])).tokens.tolist() == [3, 9, 1]


# -- decoder runs -----------------------------------------------------------------------------
def test_a_single_source_pool_credits_it_every_accepted_token(chaotic_llama):
    dec = get_decoder("pool", chaotic_llama, sources=[{"name": "recycling", "tree": 16}], total=8)
    ids = torch.tensor([[1, 77, 3, 3, 3, 12, 60, 61]])
    out = dec.generate(ids, 40)
    assert sum(out.stats["accepted"]) > 0
    assert out.stats["pool_accepted"] == {"recycling": sum(out.stats["accepted"])}
    assert max(out.stats["proposed"]) <= 7 and out.stats["recycling_rows"] > 0
    table = out.stats["pool_calibration"]
    # one depth-1 candidate at most is the target's token; every accepted step had one
    hits = sum(round(r["observed"] * r["tested"]) for r in table if r["depth"] == 1)
    assert sum(a > 0 for a in out.stats["accepted"]) <= hits <= out.stats["steps"] - 1
    assert {r["source"] for r in table} == {"recycling"}
    # hot start: the fit carries over to the next prompt; hot_start=False starts afresh
    fit = dec.calibration
    dec.generate(ids, 5)
    assert dec.calibration is fit and fit.pooled
    cold = get_decoder("pool", chaotic_llama, sources=[{"name": "recycling", "tree": 16}], hot_start=False)
    cold.generate(ids, 10)
    before = cold.calibration
    cold.make_proposer(ids)
    assert cold.calibration is not before and not cold.calibration.pooled


def test_eagle3_reads_its_fused_features_from_the_pools_forwards(chaotic_llama, tmp_path):
    from common.decoders.eagle3 import Eagle3
    e3 = Eagle3.test_configs(chaotic_llama, tmp_path)[1]
    dec = get_decoder("pool", chaotic_llama, sources=[{"name": "eagle3", **e3}, {"name": "suffix"}], total=6)
    ids = torch.tensor([[1, 77, 3, 3, 3, 12, 60, 61]])
    proposer = dec.make_proposer(ids)
    e3_proposer = proposer.sources["eagle3"][1]
    layers = tuple(e3_proposer.head.layers)
    # the pool names its sources' layers, so the loop keeps them from the pool's own forwards
    assert proposer.capture_layers == layers and not proposer.needs_hidden
    seen, forwards = [], []
    propose = e3_proposer.propose
    e3_proposer.propose = lambda state: (seen.append((set(state.captured), len(state.tokens),
                                                      {state.captured[l].shape[0] for l in layers})),
                                         propose(state))[1]
    update = proposer.update
    proposer.update = lambda result: (forwards.append((set(result.verified.captured), result.path.numel())),
                                      update(result))[1]
    dec.make_proposer = lambda input_ids: proposer
    out = dec.generate(ids, 12)
    assert out.tokens == get_decoder("vanilla", chaotic_llama).generate(ids, 12).tokens
    # every forward kept the fused layers; the source saw the prompt's rows first, then each
    # accepted path's (root first: one row per committed position)
    assert forwards and all(got == set(layers) for got, _ in forwards)
    assert seen[0] == (set(layers), 1, {ids.shape[1]})
    assert [rows for _, _, rows in seen[1:]] == [{n} for _, n in forwards[:len(seen) - 1]]
    assert set(out.stats["pool_accepted"]) == {"eagle3", "suffix"}


# -- bad input --------------------------------------------------------------------------------
@pytest.mark.parametrize("cfg,msg", [
    ({}, "needs sources="),
    ({"sources": []}, "non-empty list"),
    ({"sources": [{"name": "medusa_typo"}]}, "pool source 'medusa_typo' is unknown"),
    ({"sources": [{"name": "vanilla"}]}, "pool source 'vanilla' is a decoder that cannot propose into a pool"),
    ({"sources": [{"name": "lookahead"}]}, "cannot propose into a pool"),
    ({"sources": [{"draft_len": 3}]}, "names no proposer"),
    ({"sources": ["suffix"]}, "names no proposer"),
    ({"sources": [{"name": "suffix"}, {"name": "suffix"}]}, "listed twice"),
])
def test_bad_sources_are_one_error_naming_the_valid_kinds(chaotic_llama, cfg, msg, capsys):
    with pytest.raises(SystemExit) as e:
        cli_main(lambda: get_decoder("pool", chaotic_llama, **cfg))
    err = capsys.readouterr().err
    lines = err.splitlines()
    assert e.value.code == 2 and len(lines) == 1 and lines[0].startswith("error: "), err
    assert msg in lines[0] and VALID in lines[0], lines[0]


@pytest.mark.parametrize("cfg,msg", [
    ({"sources": [{"name": "suffix", "temperature": 0.5}]}, "the pool's own option"),
    ({"sources": [{"name": "suffix", "draft_len": 0}]}, "draft_len=0 is invalid"),
    ({"sources": [{"name": "prompt_lookup", "window": 3}]}, "valid: num_tokens, max_ngram"),
    ({"sources": [{"name": "prompt_lookup", "num_tokens": 0}]}, "num_tokens=0 is invalid"),
    ({"sources": [{"name": "eagle"}]}, "needs head="),
    ({"sources": [{"name": "suffix"}], "cost": [0]}, "seconds per verified size"),
    ({"sources": [{"name": "suffix"}], "prior": [1.0]}, "two positive numbers"),
    ({"sources": [{"name": "suffix"}], "total": 1}, "total=1 is invalid"),
])
def test_bad_source_options_are_one_error(chaotic_llama, cfg, msg):
    with pytest.raises(UserError, match=re.escape(msg)):
        get_decoder("pool", chaotic_llama, **cfg)


def test_every_source_kind_is_exercised_by_the_lossless_configs(chaotic_llama, tmp_path):
    from common.decoders.pool import Pool
    named = {s["name"] for cfg in Pool.test_configs(chaotic_llama, tmp_path) for s in cfg["sources"]}
    assert named == set(SOURCES)
