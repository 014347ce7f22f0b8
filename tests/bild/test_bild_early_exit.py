"""BiLD's early-exit variant (Figure 6) on tiny random models: the layer-level helpers it rests on,
the shared-cache small model (same tokens as a separate copy of the first k layers, exact limits,
a cache equal to the large model's own), and bad input."""
import pytest
import torch

from common.decoders import get_decoder
from common.decoders.speculative import perturbed_copy
from common.components.draft_model import truncated_copy
from common.errors import UserError
from common.engine.fast import accelerate, new_cache
from common.engine.forward import layer_kv, layer_states, num_layers
from common.assets.models import tiny_t5

pytestmark = pytest.mark.usefixtures("one_thread")
PROMPTS = [[1, 5, 6, 7, 5, 6], [1, 40, 41, 42, 43], [1, 77, 3, 3, 3, 12, 60, 61]]


def test_layer_states_match_the_models_hidden_states(chaotic_llama):
    ids = torch.tensor([PROMPTS[2], PROMPTS[2][::-1]])
    d = num_layers(chaotic_llama)
    with torch.no_grad():
        ref = chaotic_llama(input_ids=ids, output_hidden_states=True).hidden_states
        got = layer_states(chaotic_llama, ids, range(d + 1))
    for i in range(d):  # the model's last entry is after the final norm; ours is the raw output
        torch.testing.assert_close(got[i], ref[i], rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(chaotic_llama.model.norm(got[d]), ref[d], rtol=1e-4, atol=1e-5)
    with pytest.raises(UserError, match="out of range"):
        layer_states(chaotic_llama, ids, [d + 1])


def test_layer_kv_is_what_the_layer_caches(chaotic_llama):
    """Keys/values computed from a layer's input alone equal what its own forward appends."""
    ids = torch.tensor([PROMPTS[0]])
    d = num_layers(chaotic_llama)
    with torch.no_grad():
        cache = new_cache(chaotic_llama)
        chaotic_llama(input_ids=ids, past_key_values=cache, use_cache=True)
        states = layer_states(chaotic_llama, ids, range(d))
        pos = torch.arange(ids.shape[1])[None]
        for i in range(d):
            k, v = layer_kv(chaotic_llama, i, states[i], pos)
            torch.testing.assert_close(k, cache.layers[i].keys, rtol=1e-4, atol=1e-5)
            torch.testing.assert_close(v, cache.layers[i].values, rtol=1e-4, atol=1e-5)


def _bild(model, ids, n=30, **opts):
    return get_decoder("bild", model, **opts).generate(ids, n)


@pytest.fixture(scope="module")
def fast(chaotic_llama):
    """The chaotic tiny LLaMA on the fast path (growing cache, packed linears): what benches run."""
    return accelerate(perturbed_copy(chaotic_llama, 0.0))


@pytest.mark.parametrize("opts", [{"rollback_threshold": 0.0, "fallback_threshold": 0.0},
                                  {"rollback_threshold": 0.0, "fallback_threshold": 0.3, "max_small_tokens": 3},
                                  {"fallback_threshold": 1.0, "rollback_threshold": 50.0}])
def test_exact_limits_equal_large_greedy(chaotic_llama, fast, opts):
    for model in (chaotic_llama, fast):
        for k in (1, 2, 3):
            dec = get_decoder("bild", model, exit_layer=k, **opts)  # one decoder for every prompt, as benches run
            for prompt in PROMPTS:
                ids = torch.tensor([prompt])
                ref = get_decoder("vanilla", model).generate(ids, 30).tokens
                out = dec.generate(ids, 30)
                assert out.tokens == ref, (k, prompt, opts)
                st = out.stats
                assert st["large_forwards"] == st["steps"] and len(st["source"]) == len(out.tokens)


@pytest.mark.parametrize("opts", [{"rollback_threshold": 1.0, "fallback_threshold": 0.2},
                                  {"rollback_threshold": 5.0, "fallback_threshold": 0.0, "max_small_tokens": 4},
                                  {"rollback": False, "fallback_threshold": 0.1},
                                  {"fallback": False, "rollback_threshold": 2.0, "max_small_tokens": 3}])
def test_shared_cache_equals_a_separate_small_model(chaotic_llama, opts):
    """The early exit on the shared cache decodes exactly as BiLD with a separate copy of the
    first k layers (+ final norm + head) as its small model, with the same decisions."""
    for k in (1, 2):
        copy = truncated_copy(chaotic_llama, k)
        for prompt in PROMPTS:
            ids = torch.tensor([prompt])
            shared = _bild(chaotic_llama, ids, exit_layer=k, **opts)
            apart = _bild(chaotic_llama, ids, small=copy, **opts)
            assert shared.tokens == apart.tokens, (k, prompt, opts)
            for key in ("source", "rollbacks", "fallbacks", "accepted", "proposed", "small_forwards"):
                assert shared.stats[key] == apart.stats[key], key


def test_cache_is_the_large_models_own(chaotic_llama):
    """After a lossy run with many rollbacks, every layer of the shared cache holds the same
    positions, and their keys/values are the large model's own over the committed sequence."""
    ids = torch.tensor([PROMPTS[1]])
    # 4.5: under the paper's rule this model's small tokens are either all rolled back (<= 4) or
    # none (>= 5); 4.5 keeps some of each
    dec = get_decoder("bild", chaotic_llama, exit_layer=1, rollback_threshold=4.5, fallback_threshold=0.0,
                      max_small_tokens=4)
    out = dec.generate(ids, 30)
    assert out.stats["rollbacks"] > 0 and out.stats["source"].count("small") > 0
    cache = dec.target.cache
    lengths = {layer.keys.shape[-2] for layer in cache.layers}
    assert len(lengths) == 1 and dec.target.held is None
    n = min(lengths.pop(), ids.shape[1] + len(out.tokens) - 1)
    seq = torch.cat([ids, torch.tensor([out.tokens])], dim=1)[:, :n]
    with torch.no_grad():
        ref = new_cache(chaotic_llama)
        chaotic_llama(input_ids=seq, past_key_values=ref, use_cache=True)
    for mine, theirs in zip(cache.layers, ref.layers):
        torch.testing.assert_close(mine.keys[..., :n, :], theirs.keys, rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(mine.values[..., :n, :], theirs.values, rtol=1e-4, atol=1e-4)


def test_stats_are_sane(chaotic_llama):
    out = _bild(chaotic_llama, torch.tensor([PROMPTS[0]]), exit_layer=2, rollback_threshold=3.0,
                fallback_threshold=0.2)
    st = out.stats
    assert sum(st["accept_lengths"]) == len(out.tokens) == st["new_tokens"]
    assert st["small_forwards"] > 0 and st["large_forwards"] == st["steps"]
    assert st["source"][0] == "large" and set(st["source"]) <= {"large", "small"}
    assert 0 <= st["rollbacks"] <= st["steps"]


def test_bad_input(chaotic_llama):
    d = num_layers(chaotic_llama)
    with pytest.raises(UserError, match="not both"):
        get_decoder("bild", chaotic_llama, exit_layer=1, small=truncated_copy(chaotic_llama, 1))
    with pytest.raises(UserError, match="exit_layer"):
        get_decoder("bild", chaotic_llama, exit_layer=d)
    with pytest.raises(UserError, match="exit_layer=0 is invalid"):
        get_decoder("bild", chaotic_llama, exit_layer=0)
    with pytest.raises(UserError, match="needs a causal LM"):
        get_decoder("bild", tiny_t5(seed=0), exit_layer=1)
