"""The fast forward path every decoder runs (vanilla included): the hardware's limit, not the library's.

On the 2-core CPU in fp32 a verification forward over q <= 8 tokens is bound by reading the
weights once, yet the stock path paid ~1.5x a single step for it (``docs/transformers-notes.md``,
"Speed and precision on 2 CPU cores"). Three causes, three fixes, each exact up to fp32 rounding and none forking model code:

* **Prepacked linear layers** (:class:`PackedLinear`): MKL's small-M GEMM repacks the weight
  matrix on every call; oneDNN keeps a packed copy made once. The dense ``weight`` stays as
  the module's parameter (readers such as Medusa's shared head and tied embeddings see it
  unchanged); only the forward uses the packed copy. CPU, fp32 and bf16.
* **Grouped-query attention without KV copies under a mask** (:func:`gqa_sdpa_attention`,
  registered as the attention implementation ``"sdpa_gqa"``): transformers expands every
  layer's cached K/V to all query heads (``repeat_kv``) whenever a mask is passed, i.e. every
  verification forward. Folding the query heads that share a KV head into the query-length
  axis gives the same attention with the cache read in place.
* **A preallocated KV cache** (:class:`GrowingLayer`, :func:`new_cache`): ``DynamicCache``
  concatenates, reallocating every layer's whole cache each step; this layer writes new
  entries into spare capacity (doubling when full) and crops by moving a length.

:func:`accelerate` applies all three to a loaded causal LM; :func:`new_cache` is the cache the
target adapters create (it falls back to a plain ``DynamicCache`` for models it does not know).
On CUDA the packed linears are skipped (cuBLAS needs no repacking).
"""
from __future__ import annotations

import copy
import time

import torch
from torch import nn
from transformers import AttentionInterface, DynamicCache
from transformers.cache_utils import DynamicLayer
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from ..hardware import cpu_supports

ATTENTION = "sdpa_gqa"


# -- prepacked linear layers -----------------------------------------------------------------
class PackedLinear(nn.Module):
    """``nn.Linear`` whose forward uses a oneDNN-prepacked copy of its weight (inference only).

    ``weight`` / ``bias`` remain the original dense tensors (shared, not copied), so code that
    reads them (tied embeddings, heads initialised from the LM head) is unaffected. The packed
    copy is made once (the layout oneDNN's inductor path uses, for a batch hint of ``HINT`` rows:
    measured on the 2-core CPU, any hint >= 2 serves 1..64 rows alike, a hint of 1 is up to
    1.7x slower at 16 rows) and remade if the weight changes. With autograd recording, or in a
    dtype this CPU cannot pack (:func:`common.hardware.cpu_supports`: bf16 on a CPU without bf16
    units), the dense path runs instead; :func:`cast_copy` gives such a copy :class:`WidenedLinear`
    layers instead.
    """

    HINT = 16

    def __init__(self, linear: nn.Linear):
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.weight, self.bias = linear.weight, linear.bias
        self._packed, self._key = None, None
        self._few_rows = None  # ((threads, dtype), dense? per row count 1..FEW_ROWS): decided on first use
        if cpu_supports(self.weight.dtype):
            self.packed_weight()

    def packed_weight(self) -> torch.Tensor:
        """The packed copy, remade whenever the dense weight changed (an in-place edit bumps its
        version; a copied module gets new storage), so it can never be stale."""
        key = (self.weight.data_ptr(), self.weight._version)
        if key != self._key:
            self._packed = torch.ops.mkldnn._reorder_linear_weight(self.weight.detach(), self.HINT)
            self._key = key
        return self._packed

    def __getstate__(self):  # deepcopy / pickle: oneDNN tensors have no storage to copy
        return {**self.__dict__, "_packed": None, "_key": None}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if ((torch.is_grad_enabled() and (x.requires_grad or self.weight.requires_grad)) or x.device.type != "cpu"
                or not cpu_supports(self.weight.dtype)):
            # training (the differentiable path), the module was moved off the CPU after packing,
            # or cast to a dtype this CPU's oneDNN cannot pack
            return nn.functional.linear(x, self.weight, self.bias)
        rows = x.numel() // self.in_features
        if 0 < rows <= FEW_ROWS and self._dense_rows()[rows - 1]:
            # a few rows, where this CPU's dense GEMV/GEMM is faster; nothing else on this path: a
            # step calls ~200 linears, and each microsecond of Python here is a fifth of a millisecond
            return nn.functional.linear(x, self.weight, self.bias)
        shape = x.shape
        flat = x.reshape(-1, shape[-1]).contiguous()
        bias = None if self.bias is None else self.bias.detach()
        y = torch.ops.mkldnn._linear_pointwise(flat, self.packed_weight(), bias, "none", [], "")
        return y.view(*shape[:-1], self.out_features)

    def _dense_rows(self) -> tuple[bool, ...]:
        """:func:`few_rows_dense` for this layer, kept on the module (per thread count and dtype)."""
        key = (torch.get_num_threads(), self.weight.dtype)
        if self._few_rows is None or self._few_rows[0] != key:
            bias = None if self.bias is None else self.bias.detach()
            self._few_rows = (key, few_rows_dense(self.weight.detach(), self.packed_weight(), bias))
        return self._few_rows[1]

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, packed=oneDNN"


# One row (a greedy step, a draft's step) is a matrix-vector product, and a few rows (a short
# speculative block, a pipelined step) nearly one, where the best kernel depends on the CPU: on an
# Intel Xeon of family 6 model 106 (AVX-512) MKL's dense GEMV ran the embedded model's layer
# matrices 2-3x faster than the packed kernel at one row, and the stock path's T(2) was below the
# packed path's (rule cost_curve there), while the packed copy serves many rows best everywhere.
# So each row count up to FEW_ROWS takes whichever kernel measures faster on the machine it runs
# on, all of them measured on a shape's first call of at most FEW_ROWS rows (in a run's warm-up,
# not inside a timed prompt) and kept for the process, so every decoder of a run computes a given
# forward the same way (the lossless contract).
_FEW_ROWS: dict[tuple, tuple[bool, ...]] = {}
FEW_ROWS = 4  # beyond: the packed copy (at 4 rows the two measured even on that Xeon, at 8 packed won)
DENSE_MARGIN = 0.9  # the dense kernel must take under 90% of the packed one's time: near ties stay packed


def _mean_us(fn, calls: int) -> float:
    """Microseconds a call of ``fn``, averaged over ``calls`` calls."""
    t = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - t) / calls * 1e6


def few_rows_dense(weight: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None) -> tuple[bool, ...]:
    """For each row count ``r`` in 1..:data:`FEW_ROWS`, whether an ``[r, in]`` input runs faster
    through the dense ``[out, in]`` weight (``F.linear``: MKL) than through its oneDNN-packed copy
    on this CPU: the two timed interleaved on random rows, the dense one chosen only below
    :data:`DENSE_MARGIN` of the packed one's median. Cached per ``(out, in, bias, dtype,
    threads)`` for the process; element ``r - 1`` is row count ``r``'s choice."""
    key = (*weight.shape, bias is not None, weight.dtype, torch.get_num_threads())
    if key not in _FEW_ROWS:
        calls = max(1, min(20, int(2e6 // weight.numel())))  # ~1-20 calls a round: the LM head is ms
        choice = []
        for r in range(1, FEW_ROWS + 1):
            x = torch.randn(r, weight.shape[1], dtype=weight.dtype, device=weight.device)  # not the default device
            dense = lambda: nn.functional.linear(x, weight, bias)  # noqa: E731
            pk = lambda: torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")  # noqa: E731
            for fn in (dense, pk):
                fn()
            d, p = [], []
            for _ in range(5):  # interleaved, so a drift of the machine hits both
                d.append(_mean_us(dense, calls))
                p.append(_mean_us(pk, calls))
            choice.append(sorted(d)[2] < DENSE_MARGIN * sorted(p)[2])
        _FEW_ROWS[key] = tuple(choice)
    return _FEW_ROWS[key]


def few_rows_kernels() -> dict[str, str]:
    """The kernel each linear shape took in this process per row count up to :data:`FEW_ROWS`
    (``"<out>x<in>": "dense,dense,packed,packed"``, row counts 1, 2, ...; a record states it
    beside ``forward_path``)."""
    return {f"{k[0]}x{k[1]}": ",".join("dense" if d else "packed" for d in v)
            for k, v in sorted(_FEW_ROWS.items(), key=str)}


class WidenedLinear(nn.Module):
    """A linear layer in a dtype this CPU has no kernels for (bf16 on a CPU without bf16 units,
    :func:`common.hardware.cpu_supports`), run on its fp32 units (inference only).

    The bf16 input and weight widen to fp32 exactly, each product of two bf16 numbers is exact in
    fp32, the sums accumulate in fp32 and the result rounds back to bf16: what a bf16 GEMM with
    fp32 accumulation (oneDNN's, on a CPU that has the units) computes, up to summation order.
    PyTorch's own dense bf16 GEMM on such a CPU took ~5x fp32's time (a batch of 8 x 384 tokens
    through the embedded model on an AMD EPYC of family 25: 58 s, against 11 s here). ``weight`` /
    ``bias`` stay the module's bf16 parameters (tied embeddings stay tied); the fp32 copy is made
    on first use and remade when the weight changes. With autograd recording the plain bf16 path
    runs (training keeps the differentiable op).
    """

    def __init__(self, linear: nn.Module):
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.weight, self.bias = linear.weight, linear.bias
        self._wide, self._key = None, None

    def wide_weight(self) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``([out, in] fp32 weight, [out] fp32 bias or None)``, exact widenings of the parameters."""
        key = (self.weight.data_ptr(), self.weight._version, self.weight.dtype)
        if key != self._key:
            self._wide = (self.weight.detach().float(), None if self.bias is None else self.bias.detach().float())
            self._key = key
        return self._wide

    def __getstate__(self):  # a copy widens its own weight
        return {**self.__dict__, "_wide": None, "_key": None}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if (torch.is_grad_enabled() and (x.requires_grad or self.weight.requires_grad)) or x.dtype == torch.float32:
            return nn.functional.linear(x, self.weight, self.bias)
        w, b = self.wide_weight()
        return nn.functional.linear(x.float(), w, b).to(x.dtype)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, widened={self.weight.dtype}->fp32"


def _replace_linears(module: nn.Module, kinds: tuple[type, ...], make) -> int:
    """Replace every child of a type in ``kinds`` under ``module`` by ``make(child)``; returns the count."""
    count = 0
    for name, child in list(module.named_children()):
        if type(child) in kinds:
            setattr(module, name, make(child))
            count += 1
        else:
            count += _replace_linears(child, kinds, make)
    return count


def widen_linears(module: nn.Module) -> int:
    """Replace every linear under ``module`` (``nn.Linear`` or :class:`PackedLinear`) by a
    :class:`WidenedLinear`; returns the count."""
    return _replace_linears(module, (nn.Linear, PackedLinear), WidenedLinear)


def pack_linears(module: nn.Module) -> int:
    """Replace every ``nn.Linear`` under ``module`` by a :class:`PackedLinear`; returns the count."""
    return _replace_linears(module, (nn.Linear,), PackedLinear)


def pack_like(module: nn.Module, model) -> int:
    """Pack ``module``'s linears when ``model`` runs on the packed fast path (a trained head or
    draft layer beside the target runs on the same kernels as the target); returns the count."""
    fast = getattr(model, "_fast_path", None)
    return pack_linears(module) if fast and fast.get("packed") else 0


# -- grouped-query attention under a mask ----------------------------------------------------
def gqa_sdpa_attention(module, query, key, value, attention_mask, dropout=0.0, scaling=None,
                       is_causal=None, **kwargs):
    """SDPA for grouped-query attention that never copies the KV cache.

    Args:
        query: ``[B, H, q, d]``; key, value: ``[B, Hkv, L, d]`` with ``H = g * Hkv``.
        attention_mask: None or ``[B|1, 1, q, L]`` additive/bool mask shared by all heads.
    Returns:
        ``([B, q, H, d] attention output, None)`` as transformers' attention functions do.

    Query head ``h`` reads KV head ``h // g`` (``repeat_kv``'s order), so the ``g`` query heads
    of one KV head are stacked along the query axis: ``[B, Hkv, g*q, d]`` against the cache as
    it is, with the mask repeated ``g`` times along the query axis (``q x L``, tiny next to
    ``L x d`` per head). Anything else (no groups, per-head masks, position bias) goes to
    transformers' own SDPA function.
    """
    groups = getattr(module, "num_key_value_groups", 1)
    B, H, q, d = query.shape
    # no mask: a prefill (transformers' own path uses SDPA's GQA then); q == 1: packed there too
    if (groups == 1 or q == 1 or attention_mask is None or kwargs.get("position_bias") is not None
            or attention_mask.shape[1] != 1 or attention_mask.shape[-2] != q):
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout,
                                      scaling=scaling, is_causal=is_causal, **kwargs)
    hkv = H // groups
    folded = query.reshape(B, hkv, groups * q, d)
    mask = attention_mask.expand(attention_mask.shape[0], 1, q, attention_mask.shape[-1]).repeat(1, 1, groups, 1)
    out = nn.functional.scaled_dot_product_attention(folded, key, value, attn_mask=mask,
                                                     dropout_p=dropout, scale=scaling)
    return out.reshape(B, H, q, d).transpose(1, 2).contiguous(), None


AttentionInterface.register(ATTENTION, gqa_sdpa_attention)
# the masks transformers builds for it are SDPA's (an unregistered name would get no mask at all)
AttentionMaskInterface.register(ATTENTION, sdpa_mask)


# -- a preallocated KV cache ---------------------------------------------------------------
class GrowingLayer(DynamicLayer):
    """A ``DynamicLayer`` backed by a buffer with spare capacity.

    ``keys`` / ``values`` are views ``buf[..., :n, :]``. :meth:`update` writes into the spare
    slots (the buffer doubles when full), :meth:`crop` moves ``n``. Assigning ``keys`` /
    ``values`` (as :mod:`common.engine.cache`'s edits do) keeps working: a prefix view of the buffer
    only moves ``n``, any other tensor is copied in.
    """

    MIN_SPARE = 256

    def __init__(self, **kwargs):
        self._buf = {"keys": None, "values": None}
        self._n = {"keys": 0, "values": 0}
        super().__init__(**kwargs)

    # keys / values as views of the buffers
    def _get(self, name):
        buf = self._buf[name]
        return None if buf is None else buf[..., :self._n[name], :]

    def _set(self, name, t):
        buf = self._buf[name]
        if t is None or t.numel() == 0:
            if t is None:
                self._buf[name] = None
            self._n[name] = 0
            if t is not None and buf is None:
                self._buf[name] = t  # an empty placeholder (lazy initialisation); grown on update
            return
        if (buf is not None and buf.numel() and t.data_ptr() == buf.data_ptr() and t.stride() == buf.stride()
                and t.shape[:-2] == buf.shape[:-2]):
            self._n[name] = t.shape[-2]  # a prefix view of the buffer (a crop): nothing to copy
            return
        self._reserve(name, t, t.shape[-2])
        self._buf[name][..., :t.shape[-2], :].copy_(t)
        self._n[name] = t.shape[-2]

    keys = property(lambda self: self._get("keys"), lambda self, t: self._set("keys", t))
    values = property(lambda self: self._get("values"), lambda self, t: self._set("values", t))

    def _reserve(self, name, like: torch.Tensor, need: int) -> None:
        buf = self._buf[name]
        if buf is not None and buf.numel() and buf.shape[:-2] == like.shape[:-2] and buf.shape[-2] >= need:
            return
        cap = max(need + self.MIN_SPARE, 2 * (buf.shape[-2] if buf is not None and buf.dim() == 4 else 0))
        new = like.new_empty(*like.shape[:-2], cap, like.shape[-1])
        n = self._n[name]
        if n and buf is not None and buf.shape[:-2] == like.shape[:-2]:
            new[..., :n, :].copy_(buf[..., :n, :])
        self._buf[name] = new

    def update(self, key_states, value_states, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        for name, new in (("keys", key_states), ("values", value_states)):
            n, q = self._n[name], new.shape[-2]
            self._reserve(name, new, n + q)
            self._buf[name][..., n:n + q, :].copy_(new)
            self._n[name] = n + q
        return self.keys, self.values

    def crop(self, tokens_to_remove: int) -> None:
        if tokens_to_remove > 0:
            raise ValueError("GrowingLayer.crop takes a negative count of tokens to remove")
        if self.is_initialized and tokens_to_remove:
            for name in self._n:
                self._n[name] = max(0, self._n[name] + tokens_to_remove)


def new_cache(model) -> DynamicCache:
    """An empty cache for one sequence of ``model``: ``DynamicCache`` whose full-attention
    layers are :class:`GrowingLayer` s when the model was :func:`accelerate` d."""
    cache = DynamicCache(config=model.config)
    if getattr(model, "_fast_path", False):
        cache.layers = [GrowingLayer() if type(layer) is DynamicLayer else layer for layer in cache.layers]
    return cache


def stock_copy(model):
    """An unmodified copy of ``model``: the same weights in transformers' stock modules, SDPA
    attention and ``DynamicCache`` (what ``from_pretrained`` gives): the reference the fast
    path is measured against. Returns ``model``'s own copy when it is not accelerated."""
    if not getattr(model, "_fast_path", None):
        return model
    cfg = copy.deepcopy(model.config)
    cfg._attn_implementation = "sdpa"
    with torch.device(model.device):
        stock = type(model)(cfg).to(model.dtype)
    stock.load_state_dict(model.state_dict())
    stock.generation_config = copy.deepcopy(model.generation_config)
    return stock.eval()


# -- all of it ------------------------------------------------------------------------------
def accelerate(model, pack: bool | None = None):
    """Switch a loaded causal LM onto the fast path, in place; returns it.

    Args:
        pack: prepack the linear layers (default: on CPU, when oneDNN is available). Decoder
            layers and the LM head are packed; embeddings and norms are untouched.
    Returns:
        ``model``, with ``model._fast_path = {"packed": n linears, "attention": "sdpa_gqa",
        "cache": "growing"}``. Encoder-decoders are returned unchanged.
    """
    if getattr(model.config, "is_encoder_decoder", False) or getattr(model, "_fast_path", None):
        return model
    if pack is None:
        pack = model.device.type == "cpu" and torch.backends.mkldnn.is_available() \
            and model.dtype in (torch.float32, torch.bfloat16)
    packed = 0
    if pack:
        inner = getattr(model, "model", model)
        packed = pack_linears(inner)
        head = getattr(model, "lm_head", None)
        if type(head) is nn.Linear:
            model.lm_head = PackedLinear(head)
            packed += 1
        elif head is not None:  # a head module holding linears (common.components.reduced_head.ReducedHead)
            packed += pack_linears(head)
    if getattr(model.config, "_attn_implementation", None) in ("sdpa", None):
        model.set_attn_implementation(ATTENTION)
    model._fast_path = {"packed": packed, "attention": model.config._attn_implementation, "cache": "growing"}
    return model


def cast_copy(model: nn.Module, dtype: torch.dtype) -> nn.Module:
    """A copy of ``model`` in ``dtype`` (a batched bf16 pass beside the fp32 model); its packed
    weights are remade from the cast ones on first use, never shared with the original. On a CPU
    without kernels for ``dtype`` its linear layers run widened (:class:`WidenedLinear`): still
    ``dtype``'s arithmetic, at about fp32's speed."""
    m = copy.deepcopy(model).to(dtype)
    if getattr(m, "_fast_path", None):
        for mod in m.modules():
            if isinstance(mod, PackedLinear):
                mod._key = None
    if dtype != torch.float32 and next(m.parameters()).device.type == "cpu" and not cpu_supports(dtype):
        widen_linears(m)
    return m
