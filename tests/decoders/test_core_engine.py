"""Core v2 on tiny random models: every registered lossless decoder equals vanilla (also with
no tensor created off the model's device), encoder-decoder targets, proposers that act inside
the verification forward, pluggable acceptance rules and typed options."""
import re
from pathlib import Path

import pytest
import torch

from common.engine import acceptance as acc
from common.decoders import DECODERS, decoder_class, get_decoder
from common.decoders.speculative import perturbed_copy
from common.decoders.tree_loop import Proposal, Proposer, TreeDecoder, candidates_from_topk
from common.errors import UserError
from common.engine.fast import accelerate
from common.engine.forward import Injection, embed, num_layers
from common.assets.models import tiny_t5
from common.engine.target import make_target
from common.engine.tree import build_tree

PROMPTS = [[1, 5, 6, 7, 5, 6], [1, 40, 41, 42, 43], [1, 77, 3, 3, 3, 12, 60, 61]]
LOSSLESS = sorted(n for n in DECODERS if decoder_class(n).lossless)
CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
# "cpu-fast": the same model on common.engine.fast's path (packed linears, folded GQA attention, growing cache)
DEVICES = ["cpu", "cpu-fast", pytest.param("cuda", marks=[pytest.mark.cuda, CUDA])]


def _vanilla(model, ids, n=30):
    return get_decoder("vanilla", model).generate(ids, n).tokens


@pytest.fixture(scope="module")
def target_on(chaotic_llama):
    cache = {}

    def on(device):
        if device not in cache:
            if device == "cpu":
                cache[device] = chaotic_llama
            elif device == "cpu-fast":
                cache[device] = accelerate(perturbed_copy(chaotic_llama, 0.0))
            else:
                cache[device] = perturbed_copy(chaotic_llama, 0.0).to(device)
        return cache[device]
    return on


# -- the registry and the lossless contract ---------------------------------------------------
def test_decoder_registry_is_installed():
    """The lossless test below is parametrized by the registry: in a copy of the tree that is
    not installed (no entry points) it would collect nothing and pass by skipping."""
    assert LOSSLESS and "vanilla" in DECODERS, "no decoder registered: install the repository (pip install --no-deps -e .)"


def test_common_names_no_paper_package():
    """common/ imports and names no paper package: they register through entry points."""
    pat = re.compile(r"\b(ppd_pipelined|prompt_decoding|firp|bild)\b")
    hits = [f"{p}:{i}" for p in Path("common").rglob("*.py")
            for i, line in enumerate(p.read_text().splitlines(), 1) if pat.search(line)]
    assert not hits, hits
    assert "ppd_pipelined" in DECODERS  # yet the registry knows the paper package's decoder


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", LOSSLESS)
def test_every_lossless_decoder_equals_vanilla(name, device, target_on, tmp_path, one_thread):
    """Each option set the decoder declares for tests, constructed and run with the default
    device set to 'meta': a tensor created without the model's device breaks the run."""
    model = target_on(device)
    for cfg in decoder_class(name).test_configs(model, tmp_path):
        for prompt in PROMPTS:
            ids = torch.tensor([prompt], device=model.device)
            ref = _vanilla(model, ids)
            with torch.device("meta"):
                dec = get_decoder(name, model, **cfg)
                out = dec.generate(ids, 30)
            dec.close()
            assert out.tokens == ref, (name, cfg, prompt)
            assert sum(out.stats["accept_lengths"]) == len(out.tokens)


def test_meta_default_device_catches_a_stray_buffer(chaotic_llama, monkeypatch):
    """The check above can fail: a tree buffer built without the model's device breaks a run."""
    from common.decoders import tree_loop

    real = tree_loop.chain_tree.__wrapped__
    monkeypatch.setattr(tree_loop, "chain_tree", lambda length, device="cpu": real(length, "meta"))
    import common.decoders.speculative as spec
    monkeypatch.setattr(spec, "chain_tree", tree_loop.chain_tree)
    with pytest.raises((RuntimeError, NotImplementedError, ValueError)):
        get_decoder("self_speculative", chaotic_llama).generate(torch.tensor([PROMPTS[0]]), 10)


# -- encoder-decoder targets ------------------------------------------------------------------
@pytest.fixture(scope="module")
def t5():
    return tiny_t5(seed=0)


@pytest.mark.parametrize("prompt", [[5, 6, 7, 8, 9, 10], [40, 41, 42], [22, 23]])
def test_t5_decoders_equal_its_own_generate(t5, prompt, one_thread):
    ids = torch.tensor([prompt])
    ref = t5.generate(ids, do_sample=False, max_new_tokens=30)[0, 1:].tolist()  # drop the start token
    assert len(set(ref)) > 5  # the tiny T5 really depends on its prefix
    outs = {"vanilla": get_decoder("vanilla", t5).generate(ids, 30),
            "hf_generate": get_decoder("hf_generate", t5).generate(ids, 30),
            "speculative/near": get_decoder("speculative", t5, draft=perturbed_copy(t5, 0.01), gamma=3).generate(ids, 30),
            "speculative/t5": get_decoder("speculative", t5, draft=tiny_t5(seed=1), gamma=2).generate(ids, 30)}
    for name, o in outs.items():
        assert o.tokens == ref, name
        assert sum(o.stats["accept_lengths"]) == len(o.tokens)
    assert max(outs["speculative/near"].stats["accept_lengths"]) > 1  # chains were really accepted


def test_seq2seq_cache_crop_keeps_cross_attention(t5):
    tgt = make_target(t5)
    tgt.start(torch.tensor([[5, 6, 7]]))
    tgt.extend(torch.tensor([[9, 10, 11]]))
    cross = [l.keys.clone() for l in tgt.cache.cross_attention_cache.layers]
    tgt.crop(2)
    assert tgt.length == 2
    assert all(torch.equal(a, l.keys) for a, l in zip(cross, tgt.cache.cross_attention_cache.layers))


def test_model_kind_errors(t5, chaotic_llama):
    for name in ("medusa", "self_speculative", "prompt_lookup", "ppd_pipelined", "hf_assisted"):
        with pytest.raises(UserError, match=rf"decoder '{name}' needs a causal LM; got T5ForConditionalGeneration"):
            get_decoder(name, t5)
    with pytest.raises(UserError, match="the draft is a causal model but the target is seq2seq"):
        get_decoder("speculative", t5, draft=chaotic_llama)
    with pytest.raises(UserError, match="verifies chains only"):
        make_target(t5).verify(torch.tensor([1, 2, 3]), build_tree([(0,), (1,)]))


# -- proposers inside the verification forward ----------------------------------------------
def _injections(model, tree, tokens, past, seed=0):
    """A layer-0 injection (random embeddings, one per node, like a prompt token attached to
    it) and a layer-2 injection mapping each node's state to a pseudo state (like FIRP)."""
    n, H = tree.size, model.config.hidden_size
    g = torch.Generator().manual_seed(seed)
    anc = tree.ancestor_mask
    allow0 = torch.cat([anc, torch.eye(n, dtype=torch.bool)], dim=1)              # node's ancestors + itself
    pos0 = past + tree.depth + 1
    W = torch.randn(H, H, generator=g) * 0.3
    allow2 = torch.cat([anc, torch.eye(n, dtype=torch.bool), torch.eye(n, dtype=torch.bool)], dim=1)
    return [Injection(0, torch.randn(n, H, generator=g), pos0, allow0),
            Injection(2, lambda h: h[:n] @ W, past + tree.depth + 2, allow2)]


def test_injected_positions_never_change_the_nodes_logits(chaotic_llama, one_thread):
    model = chaotic_llama
    tree = build_tree([(0,), (1,), (0, 0), (0, 1), (1, 0), (0, 0, 0)])
    tokens = torch.tensor([5, 11, 12, 21, 22, 23, 31])
    outs = []
    for inj in ((), _injections(model, tree, tokens, 6)):
        tgt = make_target(model)
        tgt.start(torch.tensor([PROMPTS[0]]))
        logits, v = tgt.verify(tokens, tree, inj, capture=(2,))
        tgt.accept(6, torch.tensor([0, 1, 3, 6]))  # root -> (0,) -> (0, 0) -> (0, 0, 0)
        outs.append((logits, v, tgt.cache))
    (plain, vp, c_plain), (extra, ve, c_extra) = outs
    torch.testing.assert_close(extra, plain, atol=2e-5, rtol=0)
    assert torch.equal(extra.argmax(-1), plain.argmax(-1))
    assert ve.extra_hidden.shape == (2 * tree.size, model.config.hidden_size) and vp.extra_hidden.numel() == 0
    assert ve.captured[2].shape[0] == 3 * tree.size  # nodes + both injections are layer 2's input
    for a, b in zip(c_plain.layers, c_extra.layers):  # no injected position stays in the cache
        assert a.keys.shape == b.keys.shape == (1, 2, 10, 16)
        torch.testing.assert_close(b.keys, a.keys, atol=2e-5, rtol=0)


class InForwardProposer(Proposer):
    """Next step's candidates come from the extra positions' outputs of the accepted node:
    layer-0 embeddings attached to every node (random when ``random_embeddings``, else the
    node token's own embedding) and, with ``layer`` > 0, pseudo states injected there."""

    needs_hidden = False

    def __init__(self, model, width=2, depth=2, layer=0, random_embeddings=True):
        self.model, self.layer, self.random = model, layer, random_embeddings
        self.tree = build_tree([p for d in range(1, depth + 1) for p in _all_paths(width, d)])
        self.next = None
        self.g = torch.Generator().manual_seed(0)
        self.W = torch.randn(model.config.hidden_size, model.config.hidden_size, generator=self.g) * 0.2

    def propose(self, state):
        root_guess = self.next
        if root_guess is None:
            root_guess = torch.tensor([[state.tokens[-1]] * 2] * self.tree.max_depth)
        tokens = candidates_from_topk(self.tree, root_guess)
        n = self.tree.size
        past = state.prompt.shape[1] + len(state.tokens) - 1
        pos = past + self.tree.depth + 1
        self_cols = torch.eye(n, dtype=torch.bool)
        if self.layer == 0:
            states = torch.randn(n, self.model.config.hidden_size, generator=self.g) if self.random else \
                embed(self.model, torch.cat([torch.tensor([state.tokens[-1]]), tokens]))
            inj = Injection(0, states, pos, torch.cat([self.tree.ancestor_mask, self_cols], dim=1))
        else:
            inj = Injection(self.layer, lambda h: h[:n] @ self.W, pos, torch.cat([self.tree.ancestor_mask, self_cols], dim=1))
        return Proposal(self.tree, tokens, injections=[inj])

    def update(self, result):
        # read back the accepted node's extra position: its top-2 guesses the next depth-1 tokens
        last = int(result.path[-1])
        logits = self.model.lm_head(result.verified.extra_hidden[last])
        top = logits.topk(2).indices
        self.next = top.repeat(self.tree.max_depth, 1)


def _all_paths(width, depth):
    if depth == 0:
        return [()]
    return [p + (r,) for p in _all_paths(width, depth - 1) for r in range(width)]


class InForwardDecoder(TreeDecoder):
    name = "in_forward_test"

    @classmethod
    def options(cls):
        return {**super().options(), "layer": 0, "random_embeddings": True}

    def make_proposer(self, input_ids):
        return InForwardProposer(self.model, layer=self.cfg["layer"], random_embeddings=self.cfg["random_embeddings"])


@pytest.mark.parametrize("layer,random_embeddings", [(0, True), (0, False), (2, True)],
                         ids=["prompt-tokens-random", "prompt-tokens-own-embedding", "layer-2-injection"])
def test_in_forward_proposers_decode_exactly_vanilla(chaotic_llama, layer, random_embeddings, one_thread):
    for prompt in PROMPTS:
        ids = torch.tensor([prompt])
        out = InForwardDecoder(chaotic_llama, layer=layer, random_embeddings=random_embeddings).generate(ids, 30)
        assert out.tokens == _vanilla(chaotic_llama, ids), prompt


def test_injection_bad_input(chaotic_llama):
    tree = build_tree([(0,)])
    tgt = make_target(chaotic_llama)
    tgt.start(torch.tensor([PROMPTS[0]]))
    H = chaotic_llama.config.hidden_size
    with pytest.raises(UserError, match=r"allow has shape \[1, 2\]; valid: \[1, 3\]"):
        tgt.verify(torch.tensor([5, 6]), tree, [Injection(0, torch.zeros(1, H), torch.tensor([9]),
                                                          torch.ones(1, 2, dtype=torch.bool))])
    with pytest.raises(UserError, match="beyond the model's context of 512"):
        tgt.verify(torch.tensor([5, 6]), tree, [Injection(0, torch.zeros(1, H), torch.tensor([600]),
                                                          torch.ones(1, 3, dtype=torch.bool))])
    with pytest.raises(UserError, match="injection layer=4 is outside"):
        tgt.verify(torch.tensor([5, 6]), tree, [Injection(num_layers(chaotic_llama), torch.zeros(1, H),
                                                          torch.tensor([9]), torch.ones(1, 3, dtype=torch.bool))])


def test_verify_forward_matches_full_forward_on_a_chain(chaotic_llama):
    """The layer loop with a chain mask equals model() over the whole sequence."""
    ids = torch.tensor(PROMPTS[2])
    full = chaotic_llama(input_ids=ids[None]).logits[0]
    tgt = make_target(chaotic_llama)
    tgt.start(ids[None, :4])
    logits, _ = tgt.verify(ids[4:], build_tree([(0,) * d for d in range(1, 4)]))
    torch.testing.assert_close(logits, full[4:], atol=2e-5, rtol=0)


# -- acceptance rules and options ----------------------------------------------------------------
def test_acceptance_rules_are_chosen_by_configuration(chaotic_llama, tmp_path):
    cfg = decoder_class("medusa").test_configs(chaotic_llama, tmp_path)[0]
    with pytest.raises(UserError, match="cannot use acceptance='speculative'; valid: greedy, target_sampling, typical"):
        get_decoder("medusa", chaotic_llama, acceptance="speculative", temperature=1.0, **cfg)
    with pytest.raises(UserError, match="acceptance='typical' needs temperature > 0"):
        get_decoder("medusa", chaotic_llama, acceptance="typical", **cfg)
    with pytest.raises(UserError, match="unknown acceptance rule 'nope'"):
        get_decoder("speculative", chaotic_llama, draft=chaotic_llama, acceptance="nope")
    with pytest.raises(UserError, match="needs temperature 0"):
        get_decoder("speculative", chaotic_llama, draft=chaotic_llama, acceptance="greedy", temperature=0.5)
    dec = get_decoder("speculative", chaotic_llama, draft=chaotic_llama, temperature=0.7, acceptance="typical")
    assert isinstance(dec.rule, acc.Typical)


def test_a_registered_rule_plugs_in(chaotic_llama, monkeypatch):
    """A package's own rule (here: accept nothing, take the target's argmax) runs in the loop."""
    class NoneAccepted(acc.AcceptanceRule):
        name = "none_accepted"
        temperatures = ("zero",)

        def evaluate(self, tree_tokens, logits, retrieve, draft_tokens, draft_probs, generator):
            return retrieve[0, :1], int(logits[0].argmax())

    monkeypatch.setitem(acc.RULES, NoneAccepted.name, NoneAccepted)
    monkeypatch.setattr(decoder_class("speculative"), "acceptance_rules", ("greedy", "none_accepted"))
    ids = torch.tensor([PROMPTS[0]])
    out = get_decoder("speculative", chaotic_llama, draft=chaotic_llama, acceptance="none_accepted").generate(ids, 12)
    assert out.tokens == _vanilla(chaotic_llama, ids, 12)
    assert set(out.stats["accept_lengths"]) == {1}


@pytest.mark.parametrize("name,opts,msg", [
    ("speculative", {"gamma": "4"}, "option gamma='4' is invalid; valid: an integer >= 1"),
    ("speculative", {"gamma": 2.5}, "option gamma=2.5 is invalid"),
    ("speculative", {"gamma": True}, "option gamma=True is invalid"),
    ("speculative", {"temperature": "hot"}, "option temperature='hot' is invalid; valid: a number >= 0.0"),
    ("speculative", {"schedule": "fast"}, "valid: one of 'constant', 'heuristic'"),
    ("medusa", {"tree": 16.0}, "option tree=16.0 is invalid"),
    ("medusa", {"tree": None}, "option tree=None is invalid"),
    ("medusa", {"tree": 17}, "tree=17 is not a stored tree size; valid: 16, 32, 63"),
    ("ppd_pipelined", {"k": 9}, r"option k=9 is invalid; valid: an integer in \[1, 8\]"),
    ("prompt_lookup", {"num_tokens": 0}, "option num_tokens=0 is invalid"),
    ("vanilla", {"gamma": 3}, "has no option"),
])
def test_options_are_typed(chaotic_llama, name, opts, msg):
    base = {"draft": chaotic_llama} if name == "speculative" else {}
    with pytest.raises(UserError, match=msg):
        get_decoder(name, chaotic_llama, **base, **opts)


def test_greedy_walk_equals_the_full_search_and_reads_few_rows():
    """The lazy head's walk picks the path and next token the full greedy rule picks, computing
    head rows only along it; a tree with duplicate sibling tokens falls back to the full search."""
    g = torch.Generator().manual_seed(0)
    tree = build_tree([(0,), (1,), (2,), (0, 0), (0, 1), (1, 0), (0, 0, 0), (0, 0, 1), (0, 1, 0), (0, 0, 0, 0)])
    parents, n = tree.parents.tolist(), tree.size
    read = []
    for trial in range(200):
        logits = torch.randn(n, 12, generator=g)
        tokens = torch.randint(0, 12, (n,), generator=g)
        # make acceptance likely: each node's first child often carries its parent's argmax
        for i in range(1, n):
            if torch.rand(1, generator=g) < 0.6:
                tokens[i] = logits[parents[i]].argmax()
        rows = []

        def head(nodes):
            rows.extend(nodes)
            return logits[nodes]
        walked = acc.greedy_walk(tokens.tolist(), parents, head)
        row, a = acc.greedy_accept(tokens, logits, tree.retrieve_indices)
        full = tree.retrieve_indices[row, :a + 1].tolist()
        sibs = {}
        dup = any(sibs.setdefault((parents[i], int(tokens[i])), i) != i for i in range(1, n))
        if walked is None:
            assert dup
            continue
        if not dup:
            assert walked == (full, int(logits[full[-1]].argmax())), trial
        assert len(rows) == len(set(rows))  # no row computed twice
        read.append(len(rows))
    assert sum(read) / len(read) < n  # fewer rows than the whole tree on average


def test_lazy_head_off_gives_the_same_tokens(chaotic_llama, tmp_path, one_thread):
    cfg = decoder_class("medusa").test_configs(chaotic_llama, tmp_path)[0]
    ids = torch.tensor([PROMPTS[2]])
    lazy = get_decoder("medusa", chaotic_llama, **cfg)
    full = get_decoder("medusa", chaotic_llama, lazy_head=False, **cfg)
    assert lazy.lazy_head and not full.lazy_head
    assert lazy.generate(ids, 30).tokens == full.generate(ids, 30).tokens == _vanilla(chaotic_llama, ids)
