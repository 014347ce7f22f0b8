"""common.engine.fast: each piece of the fast forward path gives the stock path's numbers (to fp32
rounding), the preallocated cache really avoids reallocation and survives every cache edit,
and the packed weights can never go stale."""
import copy

import pytest
import torch
from transformers import DynamicCache

from common.engine.cache import accept_path, crop_to, keep_positions, seq_length
from common.decoders.speculative import perturbed_copy
from common.engine.fast import ATTENTION, GrowingLayer, PackedLinear, accelerate, new_cache, pack_linears, stock_copy
from common.engine.target import make_target
from common.engine.tree import build_tree

PATHS = [[1], [1, 2], [1, 2, 3], [4], [4, 5], [6]]  # a 7-node tree with branches


@pytest.fixture(scope="module")
def pair(chaotic_llama):
    """(stock model, the same weights accelerated)."""
    return chaotic_llama, accelerate(perturbed_copy(chaotic_llama, 0.0))


def test_accelerate_switches_every_piece(pair):
    stock, fast = pair
    assert fast._fast_path["packed"] == 4 * 7 + 1  # q k v o gate up down per layer, and the head
    assert fast.config._attn_implementation == ATTENTION
    assert all(isinstance(layer, GrowingLayer) for layer in new_cache(fast).layers)
    assert not any(isinstance(layer, GrowingLayer) for layer in new_cache(stock).layers)
    # the dense weights stay parameters: readers (tied embeddings, shared heads) see them unchanged
    assert fast.lm_head.weight is fast.model.embed_tokens.weight


def test_packed_linear_matches_and_never_goes_stale():
    torch.manual_seed(0)
    lin = torch.nn.Linear(32, 48)
    packed = PackedLinear(lin)
    x = torch.randn(5, 32)
    with torch.inference_mode():
        assert torch.allclose(packed(x), lin(x), atol=1e-5)
        assert torch.allclose(packed(x[None]), lin(x[None]), atol=1e-5)  # any leading shape
    with torch.no_grad():
        lin.weight.mul_(2.0)  # an in-place edit of the shared weight
    with torch.inference_mode():
        assert torch.allclose(packed(x), lin(x), atol=1e-5)
    twin = copy.deepcopy(packed)  # oneDNN tensors do not copy: the twin repacks its own weight
    with torch.no_grad():
        twin.weight.add_(1.0)
        assert torch.allclose(twin(x), x @ twin.weight.T + twin.bias, atol=1e-4)
        assert torch.allclose(packed(x), lin(x), atol=1e-5)


def test_few_rows_take_the_kernel_measured_faster_and_keep_it(monkeypatch):
    """An input of r <= FEW_ROWS rows runs the dense kernel exactly where this CPU measured it
    faster for r rows (the choice is cached per shape, so every decoder of a run computes a step
    alike); more rows always run the packed copy; the records name each shape's choices."""
    from common.engine import fast as fast_mod
    torch.manual_seed(0)
    lin = torch.nn.Linear(32, 48)
    packed = PackedLinear(lin)
    key = (48, 32, True, torch.float32, torch.get_num_threads())
    few = fast_mod.FEW_ROWS
    with torch.inference_mode():
        for r in range(1, few + 1):
            x = torch.randn(1, r, 32)
            dense_out = torch.nn.functional.linear(x.reshape(r, 32), lin.weight, lin.bias)
            packed_out = torch.ops.mkldnn._linear_pointwise(x.reshape(r, 32), packed.packed_weight(), lin.bias,
                                                             "none", [], "")
            for dense in (True, False):
                choice = tuple(dense if i == r - 1 else not dense for i in range(few))  # only r's own choice counts
                monkeypatch.setitem(fast_mod._FEW_ROWS, key, choice)
                packed._few_rows = None  # the module keeps its decision: read it again
                assert torch.equal(packed(x).reshape(r, 48), dense_out if dense else packed_out)
                assert fast_mod.few_rows_kernels()["48x32"].split(",")[r - 1] == ("dense" if dense else "packed")
        calls = []
        monkeypatch.setattr(torch.nn.functional, "linear", lambda *a: calls.append(a) or a[0] @ a[1].T + a[2])
        monkeypatch.setitem(fast_mod._FEW_ROWS, key, (True,) * few)
        packed._few_rows = None
        packed(torch.randn(1, few + 1, 32))
        assert calls == []  # more rows: the packed copy, whatever the few rows chose
        packed(torch.randn(1, 1, 32))
        packed(torch.randn(few, 32))
        assert len(calls) == 2
    # measured once: a new shape times every row count on its first small call, then reads the cache
    monkeypatch.setattr(fast_mod, "_FEW_ROWS", {})
    packed._few_rows = None
    timed = []
    real = fast_mod._mean_us
    monkeypatch.setattr(fast_mod, "_mean_us", lambda *a: timed.append(1) or real(*a))
    with torch.inference_mode():
        packed(torch.randn(1, 1, 32))
        n = len(timed)
        packed(torch.randn(1, 2, 32))
        packed(torch.randn(1, 1, 32))
    assert n == 10 * few and len(timed) == n and set(fast_mod.few_rows_kernels()) == {"48x32"}


def test_packed_linear_trains_through_the_dense_path():
    lin = torch.nn.Linear(8, 4)
    packed = PackedLinear(lin)
    x = torch.randn(3, 8, requires_grad=True)
    packed(x).sum().backward()
    assert x.grad is not None and lin.weight.grad is not None


def test_a_bf16_copy_on_a_cpu_without_bf16_units_runs_widened_bf16_arithmetic(monkeypatch):
    """An AMD EPYC of family 25 (AVX2, no AVX-512) cannot reorder a bf16 weight for oneDNN (the
    reorder raises: the smoke DAG's bf16 corpus pass died on it), and PyTorch's dense bf16 GEMM
    there ran ~5x fp32's time. Simulated here on any CPU: the support check says no and the
    reorder raises. The copy's linears must then compute bf16's arithmetic on the fp32 units:
    the exactly widened operands' product, summed in fp32 and rounded to bf16, i.e. the float64
    product rounded to bf16 but for the rare sum whose fp32 rounding crosses a bf16 boundary."""
    from common.engine import fast as fast_mod
    from common.hardware import cpu_supports

    def no_bf16_reorder(w, hint):
        if w.dtype != torch.float32:
            raise RuntimeError("mkldnn_reorder_linear_weight: bf16 path needs the cpu support avx_ne_convert")
        return real(w, hint)

    real = torch.ops.mkldnn._reorder_linear_weight
    monkeypatch.setattr(torch.ops.mkldnn, "_reorder_linear_weight", no_bf16_reorder)
    monkeypatch.setattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", lambda: False)
    cpu_supports.cache_clear()
    try:
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(256, 64), torch.nn.Linear(64, 64, bias=False))
        pack_linears(model)
        bf16 = fast_mod.cast_copy(model, torch.bfloat16)
        assert all(isinstance(m, fast_mod.WidenedLinear) for m in bf16)
        assert bf16[0].weight.dtype == torch.bfloat16 and bf16[0].weight.data_ptr() != model[0].weight.data_ptr()
        x = torch.randn(32, 256).to(torch.bfloat16)
        with torch.inference_mode():
            y = bf16[0](x)
        exact = (x.double() @ bf16[0].weight.double().T + bf16[0].bias.double()).to(torch.bfloat16)
        assert y.dtype == torch.bfloat16
        same = (y == exact).float().mean().item()
        ulp = (exact.float().abs() * 2.0 ** -7).clamp_min(1e-30)  # bf16 keeps 8 significant bits
        assert same > 0.98 and bool(((y.float() - exact.float()).abs() <= ulp).all()), same
        with torch.inference_mode():   # the whole copy runs, in bf16
            assert bf16(x).dtype == torch.bfloat16
        with torch.inference_mode():   # an in-place weight edit is seen (the fp32 copy is remade)
            bf16[0].weight.mul_(2)
            w, b = bf16[0].weight.float(), bf16[0].bias.float()
            assert torch.equal(bf16[0](x), torch.nn.functional.linear(x.float(), w, b).to(torch.bfloat16))
        with torch.inference_mode():  # fp32 still packs
            assert torch.allclose(model(x.float()), model[1](torch.nn.functional.linear(
                x.float(), model[0].weight, model[0].bias)), atol=1e-5)
    finally:
        cpu_supports.cache_clear()


def test_a_bf16_copy_keeps_tied_weights_tied_when_widened(monkeypatch):
    """The embedded model ties its LM head to the embedding: the widened head must read the
    copy's embedding, not a detached duplicate."""
    from common.engine import fast as fast_mod
    from common.hardware import cpu_supports

    monkeypatch.setattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", lambda: False)
    cpu_supports.cache_clear()
    try:
        emb, head = torch.nn.Embedding(50, 16), torch.nn.Linear(16, 50, bias=False)
        head.weight = emb.weight
        bf16 = fast_mod.cast_copy(torch.nn.ModuleDict({"emb": emb, "head": head}), torch.bfloat16)
        assert isinstance(bf16["head"], fast_mod.WidenedLinear)
        assert bf16["head"].weight is bf16["emb"].weight
    finally:
        cpu_supports.cache_clear()


def _verify(model, tree, tokens, past):
    target = make_target(model)
    target.start(past)
    logits, _ = target.verify(tokens, tree)
    return logits, target


def test_tree_verification_matches_the_stock_path(pair):
    """Folded GQA attention under a tree mask (the case transformers answers with repeat_kv)."""
    stock, fast = pair
    tree = build_tree(PATHS)
    g = torch.Generator().manual_seed(1)
    past = torch.randint(3, 96, (1, 37), generator=g)
    tokens = torch.randint(3, 96, (tree.size,), generator=g)
    with torch.inference_mode():
        ref, _ = _verify(stock, tree, tokens, past)
        got, _ = _verify(fast, tree, tokens, past)
    assert torch.allclose(got, ref, atol=1e-4), (got - ref).abs().max()
    assert torch.equal(got.argmax(-1), ref.argmax(-1))


def test_chunked_prefill_after_a_cache_matches(pair):
    """model(...) over several tokens after a cache: transformers builds the mask the folded
    attention needs (an unregistered mask function would silently give no mask)."""
    stock, fast = pair
    ids = torch.randint(3, 96, (1, 20), generator=torch.Generator().manual_seed(2))
    with torch.inference_mode():
        ref = stock(ids).logits[0, -6:]
        cache = new_cache(fast)
        fast(ids[:, :14], past_key_values=cache, use_cache=True)
        got = fast(ids[:, 14:], past_key_values=cache, use_cache=True).logits[0]
    assert torch.allclose(got, ref, atol=1e-4)


def test_growing_cache_writes_in_place_and_survives_every_edit():
    torch.manual_seed(0)
    grow, plain = DynamicCache(), DynamicCache()
    grow.layers = [GrowingLayer()]
    plain.layers = plain.layers[:1] if plain.layers else []

    def step(n):
        k, v = torch.randn(1, 2, n, 8), torch.randn(1, 2, n, 8)
        a = grow.update(k, v, 0)
        b = plain.update(k.clone(), v.clone(), 0)
        assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])

    step(30)
    base = grow.layers[0].keys.data_ptr()
    for n in (1, 1, 5):
        step(n)
    assert grow.layers[0].keys.data_ptr() == base  # appended into spare capacity: no reallocation
    crop_to(grow, 33), crop_to(plain, 33)
    step(4)
    accept_path(grow, 33, torch.tensor([0, 2, 3])), accept_path(plain, 33, torch.tensor([0, 2, 3]))
    keep = torch.tensor([*range(20), 30, 31, 34])
    keep_positions(grow, keep), keep_positions(plain, keep)
    step(300)  # beyond the capacity: the buffer grows, contents kept
    assert seq_length(grow) == seq_length(plain) == 323
    assert torch.equal(grow.layers[0].keys, plain.layers[0].keys)
    assert torch.equal(grow.layers[0].values, plain.layers[0].values)


def test_stock_copy_is_unmodified(pair):
    stock, fast = pair
    ref = stock_copy(fast)
    assert not getattr(ref, "_fast_path", None) and ref.config._attn_implementation == "sdpa"
    assert not any(isinstance(m, PackedLinear) for m in ref.modules())
    assert fast.config._attn_implementation == ATTENTION  # the original keeps its path
    ids = torch.tensor([[1, 5, 9, 33, 7]])
    with torch.inference_mode():
        assert torch.allclose(ref(ids).logits, stock(ids).logits, atol=1e-6)


def test_a_head_beside_a_packed_target_is_packed_too(pair):
    """pack_like: a trained head (EAGLE's layer, a reduced readout) runs on the target's kernels
    when the target is on the packed path, and is left alone beside a stock target."""
    from common.engine.fast import pack_like
    stock, fast = pair
    head = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 4))
    assert pack_like(copy.deepcopy(head), stock) == 0
    packed = copy.deepcopy(head)
    assert pack_like(packed, fast) == 2 and isinstance(packed[0], PackedLinear)
    x = torch.randn(3, 8)
    with torch.no_grad():
        torch.testing.assert_close(packed(x), head(x))
