"""BiLD's Figure 8 (section 7.3.1): FLOPs, memory operations (MOPs) and arithmetic intensity,
counted analytically over the forwards a run actually made.

A forward of ``q`` new positions after ``c`` cached ones, on a model of ``P`` parameters with
``L`` attention layers, query width ``d_attn`` (heads x head_dim) and key/value width ``d_kv``
(KV heads x head_dim), costs

* FLOPs = ``2 P q`` (every weight multiplies every new position once) ``+ 4 L d_attn q (c + q)``
  (scores ``Q K^T`` and the weighted sum ``A V``, each ``2 q (c + q) d_attn`` per layer);
* MOPs (elements moved to or from memory) = ``P`` (the weights, read once per forward whatever
  ``q``: the reuse BiLD's non-autoregressive large-model pass gains) ``+ 2 L d_kv (c + q)`` (keys
  and values read by attention) ``+ 2 L d_kv q`` (those of the new positions written).

Left out, the same way in every run: activations (``q d_model`` per layer, small beside the
weights at decoding's small ``q``), the causal mask's unused half of the new-positions block,
and that the LM head runs on fewer rows than ``q`` (the prefill's last row; the greedy loop's
accepted path). The embedding table is counted as read once (tied to the LM head in the embedded
models, whose head reads it whole). For encoder-decoders only the decoder's forwards are logged:
the encoder's one pass per prompt and cross-attention are not counted, and ``P`` is the whole
model (an overcount of the weights a decoder step reads, in vanilla and BiLD alike).
Multiply MOPs by the bytes per element for bytes; the ratios to vanilla do not depend on it.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Mapping, Sequence


@dataclass(frozen=True)
class Shape:
    """What the counts need of a model."""
    params: int   # parameters (shared/tied ones once)
    layers: int   # attention layers that hold a KV cache (an encoder-decoder's decoder layers)
    d_attn: int   # heads x head_dim
    d_kv: int     # KV heads x head_dim

    @classmethod
    def from_row(cls, row: Mapping) -> "Shape":
        """From a ``bild.model_configs`` record (``layers`` is ``"enc + dec"`` for encoder-decoders)."""
        layers = int(str(row["layers"]).split("+")[-1])
        head_dim = row.get("head_dim") or row["d_model"] // row["heads"]
        return cls(int(row["params"]), layers, int(row["heads"]) * head_dim,
                   int(row.get("kv_heads") or row["heads"]) * head_dim)


def forward_cost(shape: Shape, cached: int, new: int) -> tuple[float, float]:
    """``(FLOPs, MOPs in elements)`` of one forward of ``new`` positions after ``cached`` ones."""
    ctx = cached + new
    flops = 2.0 * shape.params * new + 4.0 * shape.layers * shape.d_attn * new * ctx
    mops = float(shape.params) + 2.0 * shape.layers * shape.d_kv * ctx + 2.0 * shape.layers * shape.d_kv * new
    return flops, mops


def calls_cost(shape: Shape, calls: Iterable[Sequence[int]]) -> tuple[float, float]:
    """Summed ``(FLOPs, MOPs)`` of forwards ``[[cached, new], ...]`` (a target's ``calls`` log)."""
    f = m = 0.0
    for cached, new in calls:
        a, b = forward_cost(shape, cached, new)
        f, m = f + a, m + b
    return f, m


def vanilla_calls(first: int, new_tokens: int) -> list[list[int]]:
    """The forwards vanilla greedy decoding makes: one over the ``first`` positions (the prompt
    of a causal LM; an encoder-decoder's decoder-start token), then one per further token."""
    return [[0, first]] + [[first + i, 1] for i in range(new_tokens - 1)]


def run_cost(records: Sequence[Mapping], large: Shape, small: Shape | None, seq2seq: bool = False) -> dict:
    """Summed FLOPs and MOPs of one decoder's records (the same prompts as the baseline's).

    ``vanilla`` records are counted with :func:`vanilla_calls`; BiLD's from their logged
    ``extra.large_calls`` / ``extra.small_calls``.
    """
    f = m = 0.0
    for r in records:
        extra = r.get("extra") or {}
        if "large_calls" in extra:
            parts = [(large, extra["large_calls"]), (small, extra["small_calls"])]
        elif r["decoder"] == "vanilla":
            parts = [(large, vanilla_calls(1 if seq2seq else r["prompt_tokens"], r["new_tokens"]))]
        else:
            raise ValueError(f"{r['decoder']} records log no forwards (extra.large_calls)")
        for shape, calls in parts:
            a, b = calls_cost(shape, calls)
            f, m = f + a, m + b
    return {"flops": f, "mops": m, "intensity": f / m if m else float("nan")}


def normalized(records: Sequence[Mapping], decoder: str, large: Shape, small: Shape, seq2seq: bool = False,
               baseline: str = "vanilla") -> dict:
    """``decoder``'s FLOPs, MOPs and arithmetic intensity over the prompts of one run, each
    divided by the baseline's (both summed over the same prompts); ``intensity_abs`` and
    ``intensity_base``: the two arithmetic intensities themselves (FLOPs per element moved)."""
    base = [r for r in records if r["decoder"] == baseline]
    ids = {r["question_id"] for r in base}
    mine = [r for r in records if r["decoder"] == decoder and r["question_id"] in ids]
    if not base or len(mine) != len(base):
        raise ValueError(f"{decoder} has {len(mine)} of the baseline's {len(base)} prompts")
    b, d = run_cost(base, large, None, seq2seq), run_cost(mine, large, small, seq2seq)
    out = {k: d[k] / b[k] for k in ("flops", "mops", "intensity")}
    return {**out, "intensity_abs": d["intensity"], "intensity_base": b["intensity"]}


def model_shapes(rows: Sequence[Mapping], task: str, variant: str) -> tuple[Shape, Shape, bool]:
    """``(large, small, seq2seq)`` of a task and small-model variant from ``bild.model_configs`` records
    (the embedded small model's role is ``small``, the paper's ``small (<variant>)``)."""
    mine = {r["role"]: r for r in rows if r["task"] == task}
    small = mine.get(f"small ({variant})") or mine.get("small")
    if "large" not in mine or small is None:
        raise ValueError(f"bild.model_configs records lack the large or small model of task {task!r} ({variant})")
    return Shape.from_row(mine["large"]), Shape.from_row(small), mine["large"]["kind"] == "encoder-decoder"
