"""CALM, BiLD's early-exit baseline (Figure 7), on tiny random models: the decaying threshold, the
no-exit limit, forced exits against an independent reference (the first e layers alone, and the
skipped layers' caches computed from the exited states), statistics and bad input."""
import math

import pytest
import torch

from bild.calm import Calm, decaying_threshold, saturation
from common.decoders import get_decoder
from common.decoders.speculative import perturbed_copy
from common.components.draft_model import truncated_copy
from common.errors import UserError
from common.engine.fast import accelerate
from common.engine.forward import layer_kv, layer_states, num_layers
from common.assets.models import tiny_t5

pytestmark = pytest.mark.usefixtures("one_thread")
PROMPTS = [[1, 5, 6, 7, 5, 6], [1, 40, 41, 42, 43], [1, 77, 3, 3, 3, 12, 60, 61]]


def test_decaying_threshold_is_calms():
    assert decaying_threshold(0.9, 4.0, 0, 100) == pytest.approx(0.91)
    assert decaying_threshold(0.9, 4.0, 50, 100) == pytest.approx(0.81 + 0.1 * math.exp(-2.0))
    assert decaying_threshold(0.7, 0.0, 77, 100) == pytest.approx(0.73)       # tau 0: constant
    assert decaying_threshold(1.0, 0.0, 5, 10) == 1.0
    values = [decaying_threshold(0.8, 8.0, t, 64) for t in range(64)]
    assert values == sorted(values, reverse=True) and 0.72 <= values[-1] < values[0] <= 1.0


def test_saturation_is_the_cosine():
    a, b = torch.tensor([[[1.0, 0.0]]]), torch.tensor([[[1.0, 1.0]]])
    assert saturation(a, b) == pytest.approx(1 / math.sqrt(2))
    assert saturation(b, 3 * b) == 1.0


@pytest.fixture(scope="module")
def fast(chaotic_llama):
    return accelerate(perturbed_copy(chaotic_llama, 0.0))


def test_threshold_one_never_exits_and_equals_greedy(chaotic_llama, fast):
    for model in (chaotic_llama, fast):
        for prompt in PROMPTS:
            ids = torch.tensor([prompt])
            ref = get_decoder("vanilla", model).generate(ids, 30).tokens
            out = Calm(model, threshold=1.0, tau=0.0).generate(ids, 30)
            assert out.tokens == ref
            assert out.stats["early_exits"] == 0 and out.stats["layer_share"] == 1.0


class ForcedExit(Calm):
    """Every token leaves after ``EXIT`` layers (the reference's setting)."""
    EXIT = 2

    def exits(self, depth, before, after, lam):
        return depth == self.EXIT


@pytest.mark.parametrize("e,on_fast", [(1, False), (2, False), (3, False), (2, True)])
def test_forced_exit_matches_an_independent_reference(chaotic_llama, fast, e, on_fast):
    """With every token exiting after e layers, layers [0, e) only ever see real states, so the
    tokens after the prefill's are the first e layers' greedy output (+ final norm + head); the
    skipped layers cache, at each generated position, the keys/values of its layer-e state
    (also on the fast path's growing cache and packed linears)."""
    d = num_layers(chaotic_llama)
    ForcedExit.EXIT = e
    for prompt in PROMPTS:
        ids = torch.tensor([prompt])
        dec = ForcedExit(fast if on_fast else chaotic_llama)
        out = dec.generate(ids, 20)
        assert out.stats["exit_layers"] == [d] + [e] * (len(out.tokens) - 1)
        seq = torch.cat([ids, torch.tensor([out.tokens[:1]])], dim=1)
        ref = get_decoder("vanilla", truncated_copy(chaotic_llama, e)).generate(seq, 19).tokens
        assert out.tokens[1:] == ref
        full = torch.cat([ids, torch.tensor([out.tokens[:-1]])], dim=1)          # what the cache holds
        S, n = ids.shape[1], full.shape[1]
        cache = dec.target.cache
        assert {layer.keys.shape[-2] for layer in cache.layers} == {n}
        with torch.no_grad():
            states = layer_states(chaotic_llama, full, [e])[e]
            pos = torch.arange(n)[None]
            for j in range(e, d):
                k, v = layer_kv(chaotic_llama, j, states, pos)
                # generated positions (from S on): propagated; the prompt: the full model's own
                torch.testing.assert_close(cache.layers[j].keys[..., S:, :], k[..., S:, :], rtol=1e-4, atol=1e-4)
                torch.testing.assert_close(cache.layers[j].values[..., S:, :], v[..., S:, :], rtol=1e-4, atol=1e-4)


def test_thresholds_exit_early_and_stats_are_sane(chaotic_llama):
    d = num_layers(chaotic_llama)
    ids = torch.tensor([PROMPTS[2]])
    seen = []
    for lam in (0.0, 0.5, 1.0):
        out = Calm(chaotic_llama, threshold=lam, tau=8.0).generate(ids, 30)
        st = out.stats
        assert len(st["exit_layers"]) == len(out.tokens) == st["new_tokens"] == st["steps"]
        assert all(1 <= x <= d for x in st["exit_layers"]) and st["exit_layers"][0] == d
        assert st["early_exits"] == sum(x < d for x in st["exit_layers"])
        assert st["mean_exit_layer"] == pytest.approx(sum(st["exit_layers"]) / len(out.tokens))
        seen.append(st["mean_exit_layer"])
    assert seen[0] < d and seen[-1] <= d


def test_bad_input(chaotic_llama):
    d = num_layers(chaotic_llama)
    with pytest.raises(UserError, match="min_exit=4 is out of range"):
        Calm(chaotic_llama, min_exit=d)
    with pytest.raises(UserError, match="threshold=1.5 is invalid"):
        Calm(chaotic_llama, threshold=1.5)
    with pytest.raises(UserError, match="tau=-1 is invalid"):
        Calm(chaotic_llama, tau=-1)
    with pytest.raises(UserError, match="needs a causal LM"):
        Calm(tiny_t5(seed=0))
