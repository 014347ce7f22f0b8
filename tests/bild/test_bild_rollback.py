"""BiLD's rollback rule: the paper's (roll back at the first small token whose cross-entropy
under the large model exceeds alpha_RB) is the default; ``argmax_differs`` (roll back only
where the large model's argmax also differs, what the committed records ran) is an option.
Cases where the two differ, on a hand-made chain and on tiny random models."""
import pytest
import torch

from bild.decoding import Rollback
from common.decoders import get_decoder
from common.decoders.speculative import perturbed_copy
from common.errors import UserError

pytestmark = pytest.mark.usefixtures("one_thread")


def _chain():
    """Root then small tokens 1, 3, 4: token 1 is the large model's argmax but with only half its
    mass (-log p = log 2 ~ 0.69); token 3 is far from the argmax; token 4 is the argmax, peaked."""
    V = 5
    logits = torch.full((4, V), -10.0)
    logits[0, 1] = logits[0, 2] = 10.0                                 # after the root: 1 and 2 tie (argmax 1)
    logits[1, 2], logits[1, 3] = 10.0, 0.0                             # after node 1: 3 is unlikely
    logits[2, 4] = logits[3, 0] = 10.0
    return torch.tensor([0, 1, 3, 4]), logits, torch.tensor([[0, 1, 2, 3]])


@pytest.mark.parametrize("threshold, paper, argmax_differs", [
    (0.5, ([0], 1), ([0, 1], 2)),       # token 1: 0.69 > 0.5 but it is the argmax: only the paper rolls back
    (1.0, ([0, 1], 2), ([0, 1], 2)),    # token 1 kept by both; token 3 (-log p ~ 10) rolled back by both
    (20.0, ([0, 1, 2, 3], 0), ([0, 1, 2, 3], 0)),  # nothing over the threshold: the whole chain stays
])
def test_the_two_rules_on_one_chain(threshold, paper, argmax_differs):
    tokens, logits, retrieve = _chain()
    for rule, (want_path, want_next) in (("paper", paper), ("argmax_differs", argmax_differs)):
        path, nxt = Rollback(0.0, threshold=threshold, rule=rule).evaluate(tokens, logits, retrieve, tokens[1:],
                                                                            None, None)
        assert (path.tolist(), nxt) == (want_path, want_next), (rule, threshold)
    # no rule named: the paper's
    path, nxt = Rollback(0.0, threshold=threshold).evaluate(tokens, logits, retrieve, tokens[1:], None, None)
    assert (path.tolist(), nxt) == paper


def test_decoder_default_is_the_paper_rule_and_the_option_switches_it(chaotic_llama):
    """A close small model agrees with the large one most of the time: at a tiny alpha_RB the
    paper's rule still rolls back at agreeing tokens (their -log p exceeds it), the old rule
    keeps them; both give the large model's greedy tokens (a rolled-back agreeing token is
    replaced by itself), so only what they count as the small model's differs."""
    large, small = chaotic_llama, perturbed_copy(chaotic_llama)
    ids = torch.tensor([[1, 40, 41, 42, 43]])
    ref = get_decoder("vanilla", large).generate(ids, 30).tokens
    runs = {}
    for rule in (None, "paper", "argmax_differs"):
        opts = {} if rule is None else {"rollback_rule": rule}
        dec = get_decoder("bild", large, small=small, rollback_threshold=1e-4, fallback_threshold=0.0,
                          max_small_tokens=4, **opts)
        assert dec.cfg["rollback_rule"] == (rule or "paper")
        out = dec.generate(ids, 30)
        assert out.tokens == ref, rule
        runs[rule] = out.stats
    assert runs[None]["source"] == runs["paper"]["source"]
    kept = {r: runs[r]["source"].count("small") for r in ("paper", "argmax_differs")}
    assert kept["argmax_differs"] > kept["paper"], kept
    assert runs["paper"]["rollbacks"] > runs["argmax_differs"]["rollbacks"]


def test_unknown_rule_is_refused(llama_pair):
    with pytest.raises(UserError, match="rollback_rule=.first. is invalid"):
        get_decoder("bild", llama_pair[0], small=llama_pair[1], rollback_rule="first")


def test_records_older_than_the_rule_read_as_argmax_differs():
    """A BiLD record without ``rollback_rule`` ran the old rule: a config pinning that rule finds
    it current, a config asking for the paper's rule finds it stale."""
    from common.harness.report import stale_settings
    old = [{"decoder": "bild@rb0", "decoder_config": {"rollback_threshold": 0.0}}]
    assert stale_settings(old, {"bild@rb0": {"rollback_threshold": 0.0, "rollback_rule": "argmax_differs"}}) == {}
    stale = stale_settings(old, {"bild@rb0": {"rollback_threshold": 0.0, "rollback_rule": "paper"}})
    assert stale["bild@rb0"][0]["rollback_rule"] == "argmax_differs"
