"""Tree verification and speculative decoders on tiny random LLaMAs.

Lossless at temperature 0 (token for token equal to ``vanilla``), the tree loop against an
oracle proposer with known accepted lengths, speculative sampling against the target's exact
next-token distribution (chi-square), and bad input.
"""

import pytest
import torch

from common.engine import acceptance as acc
from common.decoders import DECODERS, get_decoder, tree_loop
from common.decoders.tree_loop import (Proposal, Proposer, TreeDecoder, candidates_from_topk,
                                       chain_tree)
from common.errors import UserError
from common.assets.models import tiny_llama
from common.engine.tree import build_tree
from decoding_checks import SPEC_PROMPTS

PROMPTS = SPEC_PROMPTS
LENGTHS = [1, 7, 30]


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def target(chaotic_llama):
    """4 layers, vocab 96, varied greedy output."""
    return chaotic_llama


@pytest.fixture(scope="module")
def drafts(spec_drafts):
    return spec_drafts


CONFIGS = [  # (decoder, options; draft names refer to the ``drafts`` fixture)
    ("speculative", {"draft": "random"}),
    ("speculative", {"draft": "near", "gamma": 3}),
    ("speculative", {"draft": "self", "gamma": 5}),
    ("self_speculative", {}),
    ("self_speculative", {"draft_layers": [0, 1, 3], "gamma": 3}),
    ("self_speculative", {"draft_layers": [3], "gamma": 2}),
    ("hf_assisted", {"draft": "near"}),
    ("speculative", {"draft": "near", "schedule": "heuristic", "confidence": 0.5}),
    ("self_speculative", {"gamma": 2, "schedule": "heuristic", "confidence": 0.3}),
]


def _make(name, opts, model, drafts):
    opts = {**opts, **({"draft": drafts[opts["draft"]]} if "draft" in opts else {})}
    return get_decoder(name, model, **opts)


@pytest.mark.parametrize("name,opts", CONFIGS, ids=[f"{n}-{o}" for n, o in CONFIGS])
def test_lossless_at_temperature_0(target, drafts, name, opts):
    dec, vanilla = _make(name, opts, target, drafts), get_decoder("vanilla", target)
    gamma = opts.get("gamma", 4)
    for prompt in PROMPTS:
        ids = torch.tensor([prompt])
        for n in LENGTHS:
            ref, out = vanilla.generate(ids, n), dec.generate(ids, n)
            assert out.tokens == ref.tokens, (prompt, n)
            acc_len = out.stats["accept_lengths"]
            assert sum(acc_len) == len(out.tokens) and out.stats["steps"] == len(acc_len)
            # transformers and the heuristic schedule adapt the draft length themselves
            if name != "hf_assisted" and opts.get("schedule", "constant") == "constant":
                assert acc_len[0] == 1 and all(1 <= a <= gamma + 1 for a in acc_len)


def test_acceptance_really_varies(target, drafts):
    """The equality above covers both branches: drafts that are partly rejected, and a
    draft equal to the target, which is always fully accepted."""
    seen = set()
    dec = _make("speculative", {"draft": "near"}, target, drafts)
    for prompt in PROMPTS:
        seen |= set(dec.generate(torch.tensor([prompt]), 30).stats["accept_lengths"][1:-1])
    assert {1, 2, 3, 4, 5} <= seen, seen
    dec = _make("speculative", {"draft": "self", "gamma": 3}, target, drafts)
    out = dec.generate(torch.tensor([PROMPTS[1]]), 30)
    assert out.stats["accept_lengths"] == [1] + [4] * 7 + [1]


def test_heuristic_schedule_grows_after_full_acceptance_and_shrinks_after_a_miss(target, drafts):
    ids = torch.tensor([PROMPTS[1]])
    out = _make("speculative", {"draft": "self", "gamma": 2, "schedule": "heuristic"}, target, drafts)
    # The target drafting for itself accepts every draft: 2, 4, 6, 8 drafts, then what is left.
    assert out.generate(ids, 30).stats["accept_lengths"] == [1, 3, 5, 7, 9, 5]
    const = _make("speculative", {"draft": "self", "gamma": 2}, target, drafts)
    assert const.generate(ids, 30).stats["accept_lengths"] == [1] + [3] * 9 + [2]
    # A random draft is almost never right: the length falls to 1 and stays near it.
    rnd = _make("speculative", {"draft": "random", "gamma": 4, "schedule": "heuristic"}, target, drafts)
    lengths = rnd.generate(ids, 30).stats["accept_lengths"]
    assert max(lengths[4:]) <= 2, lengths


def test_confidence_cuts_the_chain_after_an_unsure_draft(target, drafts):
    ids = torch.tensor([PROMPTS[1]])
    ref = get_decoder("vanilla", target).generate(ids, 30).tokens
    sure = _make("speculative", {"draft": "self", "gamma": 4}, target, drafts).generate(ids, 30)
    assert max(sure.stats["accept_lengths"]) == 5
    # No draft token has probability 1, so a threshold of 1 stops every chain after one draft.
    unsure = _make("speculative", {"draft": "self", "gamma": 4, "confidence": 1.0}, target, drafts)
    out = unsure.generate(ids, 30)
    assert out.tokens == ref and out.stats["accept_lengths"] == [1] + [2] * 14 + [1]


def test_eos_inside_an_accepted_chain_stops_there(target, drafts):
    ids = torch.tensor([PROMPTS[1]])
    ref = get_decoder("vanilla", target).generate(ids, 30).tokens
    stop = next(t for i, t in enumerate(ref) if i >= 3 and t not in ref[:i])  # first seen mid-run
    for name, opts in CONFIGS[2:4]:
        dec = _make(name, opts, target, drafts)
        dec.eos = {stop}
        out = dec.generate(ids, 30)
        assert out.tokens == ref[: ref.index(stop) + 1], name
        assert sum(out.stats["accept_lengths"]) == len(out.tokens)


# -- the tree loop with an oracle proposer -----------------------------------------------------
PATHS = [(0,), (1,), (2,), (0, 0), (0, 1), (1, 0), (0, 0, 0), (0, 1, 0), (0, 1, 1)]
# Per step, the rank at which each depth's top-k list holds the true next token (None: absent).
SCHEDULE = [(0, 0, 0), (0, 1, 0), (1, 0, None), (2, None, 1), (0, 1, 1), (None, 0, 0),
            (1, 1, 0), (0, 2, 0), (0, 0, 2)]
EXPECTED = [3, 3, 2, 1, 3, 0, 1, 1, 2]  # longest prefix of each schedule row that is a tree path


class OracleProposer(Proposer):
    """Knows vanilla's continuation ``ref``; builds Medusa-style per-depth top-3 lists with the
    true token at the scheduled rank (or nowhere) and wrong tokens elsewhere. ``strict``
    (greedy runs) also checks what the verifier hands back."""

    def __init__(self, model, ref, prompt_len, strict):
        self.model, self.ref, self.prompt_len = model, ref, prompt_len
        self.tree, self.step, self.last = build_tree(PATHS), 0, None
        self.strict = self.needs_hidden = strict

    def propose(self, state):
        g = state.ids.shape[1] - self.prompt_len  # tokens generated so far; the root is ref[g-1]
        if self.strict:
            assert state.ids[0, -1] == self.ref[g - 1]
            # The hidden states handed back are the accepted path's (the prompt's after the
            # prefill), and the last one is the state whose LM head output is the root.
            assert state.hidden.shape[1] == (self.prompt_len if self.last is None else self.last + 1)
            assert self.model.lm_head(state.hidden[0, -1]).argmax() == self.ref[g - 1]
        ranks = SCHEDULE[self.step % len(SCHEDULE)]
        vocab = self.model.config.vocab_size
        topk = []
        for depth, r in enumerate(ranks, start=1):
            truth = self.ref[g - 1 + depth] if g - 1 + depth < len(self.ref) else 0
            row = [(truth + 1 + k) % vocab for k in range(3)]  # never the true token
            if r is not None:
                row[r] = truth
            topk.append(row)
        return Proposal(self.tree, candidates_from_topk(self.tree, torch.tensor(topk)))

    def update(self, result):
        self.step, self.last = self.step + 1, result.accepted


class OracleDecoder(TreeDecoder):
    name = "oracle"

    def make_proposer(self, input_ids):
        return OracleProposer(self.model, self.ref, input_ids.shape[1], self.cfg["temperature"] == 0)


def test_candidates_from_topk_follow_the_ranks():
    tree = build_tree(PATHS)
    topk = torch.tensor([[10, 11, 12], [20, 21, 22], [30, 31, 32]])
    tokens = candidates_from_topk(tree, topk).tolist()
    assert tokens == [10 * len(p) + p[-1] for p in tree.paths]


@pytest.mark.parametrize("prompt", PROMPTS[:3])
def test_tree_loop_with_oracle_equals_vanilla_and_accepts_expected(target, prompt):
    ids, n = torch.tensor([prompt]), 40
    ref = get_decoder("vanilla", target).generate(ids, n).tokens
    dec = OracleDecoder(target)
    dec.ref = ref
    out = dec.generate(ids, n)
    assert out.tokens == ref
    expected, done, step = [1], 1, 0
    while done < len(ref):
        commit = min(EXPECTED[step % len(EXPECTED)] + 1, len(ref) - done)
        expected.append(commit)
        done, step = done + commit, step + 1
    assert out.stats["accept_lengths"] == expected


def test_typical_acceptance_runs_and_is_seeded(target):
    """Temperature > 0 with a tree: Medusa's typical acceptance; same seed, same output."""
    ids = torch.tensor([PROMPTS[0]])
    ref = get_decoder("vanilla", target).generate(ids, 40).tokens
    runs = []
    for seed in (0, 0, 1):
        dec = OracleDecoder(target, temperature=0.7, seed=seed)
        dec.ref = ref
        out = dec.generate(ids, 20)
        assert sum(out.stats["accept_lengths"]) == len(out.tokens) <= 20
        runs.append(out.tokens)
    assert runs[0] == runs[1] != runs[2]


@pytest.mark.parametrize("name,opts", [CONFIGS[1], CONFIGS[4]], ids=["speculative", "self_speculative"])
def test_sampling_decoders_are_seeded(target, drafts, name, opts):
    ids = torch.tensor([PROMPTS[0]])
    runs = [_make(name, {**opts, "temperature": 0.8, "seed": seed}, target, drafts).generate(ids, 20)
            for seed in (3, 3, 4)]
    assert runs[0].tokens == runs[1].tokens != runs[2].tokens
    assert all(sum(r.stats["accept_lengths"]) == len(r.tokens) for r in runs)


# -- acceptance rules as pure functions ------------------------------------------------------
def test_greedy_accept_picks_the_longest_matching_path():
    tree = build_tree([(0,), (1,), (1, 0)])
    tokens = torch.tensor([5, 7, 8, 9])  # root, (0,), (1,), (1, 0)
    logits = torch.zeros(4, 12)
    logits[0, 8] = logits[2, 9] = logits[3, 4] = 1.0  # argmax: root->8, node (1,)->9
    row, a = acc.greedy_accept(tokens, logits, tree.retrieve_indices)
    assert tree.retrieve_indices[row, : a + 1].tolist() == [0, 2, 3] and a == 2
    row, a = acc.greedy_accept(tokens[:2], logits[:2], chain_tree(1).retrieve_indices)
    assert a == 0


def test_speculative_accept_edge_cases():
    p = torch.tensor([[0.5, 0.5, 0.0], [0.2, 0.3, 0.5]])
    g = torch.Generator().manual_seed(0)
    for _ in range(50):  # p == q: always accepted, bonus drawn from p[1]
        a, nxt = acc.speculative_accept(torch.tensor([1]), p, p[:1].clone(), g)
        assert a == 1 and nxt in (0, 1, 2)
    q = torch.tensor([[0.0, 0.0, 1.0]])  # the draft proposes a token the target never would
    for _ in range(50):
        a, nxt = acc.speculative_accept(torch.tensor([2]), p, q, g)
        assert a == 0 and nxt in (0, 1)


def test_typical_accept_uses_the_entropy_bar():
    # Rows: root, node 1, node 2 (whose children are not in the tree).
    logits = torch.log(torch.tensor([[0.7, 0.25, 0.05], [0.34, 0.33, 0.33], [1.0, 0.0, 0.0]]))
    row, a = acc.typical_accept(torch.tensor([0, 1, 2]), logits, chain_tree(2).retrieve_indices, 1.0)
    assert a == 2  # 0.25 > min(0.09, 0.3 e^-H) and 0.33 > the bar of a flat distribution
    row, a = acc.typical_accept(torch.tensor([0, 2, 0]), logits, chain_tree(2).retrieve_indices, 1.0)
    assert a == 0  # 0.05 < 0.09 and 0.05 < 0.3 e^-H(0.7, 0.25, 0.05) = 0.14


# -- speculative sampling reproduces the target's distribution ----------------------------------
# Upper 0.1% points of chi-square by degrees of freedom (standard table, e.g. NIST/SEMATECH
# e-Handbook 1.3.6.7.4); 16 categories give at most df = 15. alpha = 0.001 keeps a correct
# rule's false alarms rare; the runs are seeded, so the outcome is fixed anyway.
CHI2_CRITICAL_001 = {1: 10.828, 2: 13.816, 3: 16.266, 4: 18.467, 5: 20.515, 6: 22.458, 7: 24.322,
                     8: 26.124, 9: 27.877, 10: 29.588, 11: 31.264, 12: 32.909, 13: 34.528,
                     14: 36.123, 15: 37.697}


def chi2_statistic(counts: torch.Tensor, p: torch.Tensor) -> tuple[float, int]:
    """Goodness-of-fit statistic and degrees of freedom; cells with expected count < 5 are
    pooled into one (the chi-square approximation needs expected counts >= 5)."""
    n = counts.sum()
    exp = n * p.double()
    small = exp < 5
    obs, exp = counts.double()[~small].tolist(), exp[~small].tolist()
    if small.any():
        obs.append(float(counts[small].sum()))
        exp.append(float(n * p.double()[small].sum()))
    stat = sum((o - e) ** 2 / e for o, e in zip(obs, exp))
    return stat, len(obs) - 1


def _sharpen(model, k):
    # Random init gives near-uniform next-token distributions; scaling the final norm scales
    # the logits, so the target is peaked and the draft (scaled more) clearly differs from it.
    with torch.no_grad():
        model.model.norm.weight.mul_(k)
    return model


@pytest.fixture(scope="module")
def vocab16():
    """Target, draft, prompt and the target's exact distributions of generated tokens 1 and 2."""
    target = _sharpen(tiny_llama(seed=11, vocab=16, layers=2), 2.5)
    draft = _sharpen(tiny_llama(seed=12, vocab=16, layers=1), 6.0)
    prompt = torch.tensor([[1, 5, 9, 3]])
    with torch.inference_mode():
        p1 = torch.softmax(target(input_ids=prompt).logits[0, -1], -1)  # [16]
        after = torch.cat([prompt.repeat(16, 1), torch.arange(16)[:, None]], 1)  # every first token
        p2 = p1 @ torch.softmax(target(input_ids=after).logits[:, -1], -1)  # marginal of token 2
    return target, draft, prompt, p1, p2


def _sample_first_two(vocab16, draws):
    """Counts of generated tokens 1 and 2 over ``draws`` seeded runs at temperature 1.

    Token 1 comes from the prefill; token 2 is the first speculated one (gamma 2 with 3 tokens
    left: one draft token, accepted or resampled), so it is what the acceptance rule decides.
    """
    target, draft, prompt, _, _ = vocab16
    counts = torch.zeros(2, 16, dtype=torch.long)
    for seed in range(draws):
        dec = get_decoder("speculative", target, draft=draft, gamma=2, temperature=1.0, seed=seed)
        dec.eos = set()  # an EOS as token 1 would end the run before token 2
        t1, t2 = dec.generate(prompt, 3).tokens[:2]
        counts[0, t1] += 1
        counts[1, t2] += 1
    return counts


def test_speculative_sampling_matches_target_distribution(vocab16):
    *_, p1, p2 = vocab16
    counts = _sample_first_two(vocab16, 4000)
    for i, p in enumerate((p1, p2)):
        stat, df = chi2_statistic(counts[i], p)
        print(f"token {i + 1}: chi2={stat:.1f} df={df} critical(0.1%)={CHI2_CRITICAL_001[df]:.1f}")
        assert stat < CHI2_CRITICAL_001[df], (i + 1, stat, df)


def always_accept(draft_tokens, p, q, generator=None):
    """Wrong: keeps every draft token, so token 2 follows the draft's distribution."""
    g = draft_tokens.numel()
    return g, acc.sample(p[g], generator)


def resample_from_p(draft_tokens, p, q, generator=None):
    """Wrong: the right acceptance test, but a rejection resamples from ``p`` instead of
    ``norm(max(0, p - q))``, which over-weights the tokens the draft already favours."""
    for i, x in enumerate(draft_tokens.tolist()):
        if torch.rand(1, generator=generator).item() >= p[i, x] / q[i, x]:
            return i, acc.sample(p[i], generator)
    return draft_tokens.numel(), acc.sample(p[-1], generator)


@pytest.mark.parametrize("rule", [always_accept, resample_from_p], ids=lambda r: r.__name__)
def test_wrong_acceptance_rule_fails_the_same_test(vocab16, monkeypatch, rule):
    """The test above can fail: wrong rules give token 2 a different distribution."""
    monkeypatch.setattr(tree_loop.acc, "speculative_accept", rule)
    *_, p2 = vocab16
    counts = _sample_first_two(vocab16, 1000)  # a quarter of the draws already suffices
    stat, df = chi2_statistic(counts[1], p2)
    print(f"{rule.__name__}, token 2: chi2={stat:.1f} df={df} critical(0.1%)={CHI2_CRITICAL_001[df]:.1f}")
    assert stat > CHI2_CRITICAL_001[df]


# -- bad input -----------------------------------------------------------------------------
def test_bad_input(target, drafts):
    for name in ("speculative", "self_speculative", "hf_assisted"):
        assert name in DECODERS
    with pytest.raises(UserError, match="option gamma=0 is invalid; valid: an integer >= 1"):
        get_decoder("speculative", target, draft=drafts["random"], gamma=0)
    with pytest.raises(UserError, match="option gamma=0 is invalid"):
        get_decoder("self_speculative", target, gamma=0)
    other_vocab = tiny_llama(seed=2, layers=1, vocab=50)
    for name in ("speculative", "hf_assisted"):
        with pytest.raises(UserError, match="draft vocabulary size 50 differs from the target's 96"):
            get_decoder(name, target, draft=other_vocab)
        with pytest.raises(UserError, match="needs a draft model"):
            get_decoder(name, target)
        with pytest.raises(UserError, match="unknown model 'no-such-draft'"):
            get_decoder(name, target, draft="no-such-draft")
    with pytest.raises(UserError, match="temperature=-1"):
        get_decoder("speculative", target, draft=drafts["random"], temperature=-1)
    with pytest.raises(UserError, match=r"draft_layers=\[0, 4\] is invalid; valid: .* 0\.\.3"):
        get_decoder("self_speculative", target, draft_layers=[0, 4])
    with pytest.raises(UserError, match="draft_layers"):
        get_decoder("self_speculative", target, draft_layers=[])
    with pytest.raises(UserError, match="no option"):
        get_decoder("self_speculative", target, draft="x")
    for name, extra in (("speculative", {"draft": drafts["random"]}), ("self_speculative", {})):
        with pytest.raises(UserError, match="schedule='adaptive' is invalid; valid: one of 'constant', 'heuristic'"):
            get_decoder(name, target, schedule="adaptive", **extra)
        with pytest.raises(UserError, match=r"confidence=1.5 is invalid; valid: a number in \[0.0, 1.0\]"):
            get_decoder(name, target, confidence=1.5, **extra)
