"""The tree loop times its phases (common.decoders.tree_loop): per step, ``propose_s`` (the
proposer's ``propose``), ``verify_s`` (the target's forward, the rule, the cache update) and
``other_s`` (the rest: the proposer's ``update``, bookkeeping), aligned with ``accept_lengths``;
proposers read no clock themselves."""
import re
import time
from pathlib import Path

import pytest
import torch

from common.assets.models import tiny_llama
from common.decoders.tree_loop import Proposal, Proposer, TreeDecoder, chain_tree

ROOT = Path(__file__).resolve().parents[2]
PROPOSE_SLEEP, UPDATE_SLEEP = 0.05, 0.1


class SlowProposer(Proposer):
    """Proposes token 5 twice (a chain within the budget); sleeps to be seen by the clock."""

    def propose(self, state):
        time.sleep(PROPOSE_SLEEP)
        depth = min(2, state.remaining - 1)
        return Proposal(chain_tree(depth), torch.full((depth,), 5, dtype=torch.long))

    def update(self, result):
        time.sleep(UPDATE_SLEEP)


class Slow(TreeDecoder):
    name = "slow_test"

    def make_proposer(self, input_ids):
        return SlowProposer()


def test_each_step_splits_into_propose_verify_and_other():
    out = Slow(tiny_llama(seed=0)).generate(torch.tensor([[1, 2, 3]]), 6)
    st = out.stats
    p, v, o = st["propose_s"], st["verify_s"], st["other_s"]
    assert len(p) == len(v) == len(o) == len(st["accept_lengths"]) == st["steps"] > 2
    assert p[0] == 0 and v[0] > 0                      # step 0: the prefill, nothing proposed
    assert all(x >= PROPOSE_SLEEP for x in p[1:])      # the proposer's sleep is proposing time ...
    assert all(x >= UPDATE_SLEEP for x in o[1:])       # ... its update's is the step's other time
    assert sum(v) >= st["target_forward_s"]            # the target's forwards are verification time
    # the three parts cover the loop: all of the decode but generate()'s own few lines
    assert 0.9 * st["wall_time"] <= sum(p) + sum(v) + sum(o) <= st["wall_time"]


def test_no_proposer_reads_a_clock():
    """The loop is the one place that times proposing (a draft model's forwards are timed by
    its own Target, as the target's are)."""
    files = [*ROOT.glob("common/decoders/*.py"), *ROOT.glob("*/decoding.py"), *ROOT.glob("*/spec.py")]
    proposers = [f for f in files if re.search(r"^class \w+\((\w+, )*Proposer\)", f.read_text(), re.M)]
    assert len(proposers) >= 6, proposers
    for f in proposers:
        assert not re.search(r"device_clock|perf_counter|time\.time\(", f.read_text()), f


@pytest.mark.parametrize("name", ["medusa", "eagle", "lookahead", "rest"])
def test_a_proposer_keeps_its_record_field(name):
    """Records keep the fields the proposers' own clocks used to fill, now from the loop."""
    import importlib

    mod = importlib.import_module(f"common.decoders.{name}")
    proposer = next(c for c in vars(mod).values()
                    if isinstance(c, type) and issubclass(c, Proposer) and c is not Proposer)
    fields = proposer.propose_fields(object.__new__(proposer), [0.5, 0.25])
    want = {"medusa": {"draft_forward_s": 0.75}, "eagle": {"draft_forward_s": 0.75},
            "lookahead": {"lookahead_build_s": 0.75}, "rest": {"retrieval_s": [0.5, 0.25]}}[name]
    assert fields == want
