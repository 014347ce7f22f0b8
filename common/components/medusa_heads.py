"""Medusa-1 heads (Cai et al., 2024): the common baseline of prompt decoding and FIRP.

Head ``k`` (0-based) reads the base model's last hidden state at position ``t`` (after the
final norm) and predicts token ``t + k + 2`` (the base LM head predicts ``t + 1``). Each head
is a residual SiLU block (zero-initialized, so it starts as the identity) followed by its own
vocabulary projection initialized from the base LM head. The base model stays frozen;
heads train on its own next-token predictions over the teacher cache's text
(:mod:`common.training.teacher`; in the embedded profile the sharded corpus of its own greedy answers)
until the held-out top-1 of head 1 flattens, and are measured on the cache's held-out greedy
answers.

    python -m common.components.medusa_heads --model smollm2-135m-instruct --out .cache/components/embedded/medusa \
        --teacher .cache/components/embedded/teacher.pt --corpus-dir results/corpus/embedded \
        [--heads 4 --share-lm-head --batch-size 256 --eval-every 50 --wall-budget 900]

writes ``heads.pt`` (checkpoint), ``curve.jsonl`` (held-out loss and top-1 per head by step),
``stats.json`` (top-k accuracy per head and rank on held-out answers, wall times, parameter
count) and ``tree_16.json``, ``tree_32.json``, ``tree_63.json`` (best sparse trees for those
accuracies, :mod:`common.engine.tree_search`).
Decoder ``medusa`` (:mod:`common.decoders.medusa`) verifies the heads' candidates with the tree loop.
"""
from __future__ import annotations

import time
from dataclasses import asdict
from enum import Enum
from pathlib import Path

import torch
from torch import nn
from tqdm import tqdm

from ..training import teacher as teacher_cache
from ..checkpoints import fingerprint, read_trained
from ..errors import UserError, check_layers, check_range, cli_main
from ..engine.fast import PackedLinear, pack_linears
from ..engine.forward import final_norm, layer_states, num_layers
from ..hardware import check_fits
from ..records import read_jsonl, write_json, write_jsonl
from .reduced_head import frequency_order, write_draft_vocab
from ..training.teacher import TeacherData
from ..training.cli import component_main
from ..training.loop import Stopping, TrainConfig, train
from ..engine.tree import save_tree
from ..engine.tree_search import best_tree, expected_accept_length

TREE_SIZES = (16, 32, 63)
TOPK = 10


class ResBlock(nn.Module):
    def __init__(self, hidden: int):
        super().__init__()
        self.linear = nn.Linear(hidden, hidden)
        nn.init.zeros_(self.linear.weight)  # start as the identity: the head starts as the LM head
        nn.init.zeros_(self.linear.bias)

    def forward(self, x):
        return x + nn.functional.silu(self.linear(x))


class MedusaHeads(nn.Module):
    """``n_heads`` heads; ``forward(h [..., H]) -> [n_heads, ..., V]`` logits.

    Medusa-1 gives every head its own vocabulary projection, a trained copy of the LM head.
    With ``share_lm_head`` every head projects through the base model's frozen LM head
    instead (only the residual blocks train). On a small model with a large vocabulary this
    matters: SmolLM2-135M's head is 28 M of its 135 M parameters, so four copies add 113 M
    parameters and read 450 MB of weights per decoding step; shared, the heads add 1.3 M
    parameters and one ``[K, H] x [H, V]`` product.
    """

    def __init__(self, hidden: int, vocab: int, n_heads: int, lm_head_weight: torch.Tensor | None = None,
                 share_lm_head: bool = False):
        super().__init__()
        check_range("n_heads", n_heads, 1)
        self.blocks = nn.ModuleList(ResBlock(hidden) for _ in range(n_heads))
        self._lm_head: tuple = ()  # set by for_decoding
        if share_lm_head:
            if lm_head_weight is None:
                raise UserError("share_lm_head needs the base model's LM head weight")
            # a plain tensor attribute: neither a parameter nor in the state dict (the base owns it)
            self.shared_weight = lm_head_weight.detach()
            self.out = None
        else:
            self.out = nn.ModuleList(nn.Linear(hidden, vocab, bias=False) for _ in range(n_heads))
            if lm_head_weight is not None:
                for o in self.out:
                    o.weight.data.copy_(lm_head_weight)

    def head_logits(self, k: int, h: torch.Tensor, vocab: torch.Tensor | None = None) -> torch.Tensor:
        """Head ``k`` alone: ``[..., H] -> [..., V]`` (or ``[..., len(vocab)]``: the scores of
        those token ids only, for training over a vocabulary subset)."""
        x = self.blocks[k](h)
        if vocab is not None:
            w = self.shared_weight if self.out is None else self.out[k].weight
            return nn.functional.linear(x, w[vocab.to(w.device)])
        return self._project(x) if self.out is None else self.out[k](x)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        if self.out is None:  # one product for all heads
            return self._project(self.features(h))
        return torch.stack([o(b(h)) for b, o in zip(self.blocks, self.out)])

    def features(self, h: torch.Tensor) -> torch.Tensor:
        """``[..., H] -> [n_heads, ..., H]``: what each head feeds its vocabulary projection (the
        shared LM head's input, for a caller that projects onto a token subset itself)."""
        return torch.stack([b(h) for b in self.blocks])

    def _project(self, x: torch.Tensor) -> torch.Tensor:
        if self._lm_head:  # the base model's (packed) LM head module: same weight, faster
            return self._lm_head[0](x)
        return nn.functional.linear(x, self.shared_weight)

    def for_decoding(self, model) -> "MedusaHeads":
        """Make proposals cheap on the fast path (:func:`common.engine.fast.accelerate`): shared heads
        project through ``model.lm_head`` (a prepacked ``PackedLinear`` there, the same weight),
        own heads get their linears packed. Call after loading the weights; training is
        unaffected either way (packed linears run the dense path under autograd)."""
        fast = getattr(model, "_fast_path", None)
        if not fast or not fast.get("packed"):
            return self
        if self.out is None:
            if isinstance(model.lm_head, PackedLinear) and model.lm_head.weight is not None \
                    and model.lm_head.weight.data_ptr() == self.shared_weight.data_ptr():
                self._lm_head = (model.lm_head,)  # a tuple: not a submodule, not in the state dict
        else:
            pack_linears(self)
        return self


def head_labels(data: TeacherData, positions: torch.Tensor, n_heads: int, source: str) -> torch.Tensor:
    """``[n_heads, P]`` targets of head ``k`` at flat positions ``t`` (-100: none).

    Decoding asks head ``k`` at ``h_t`` for the token the model will say at ``t + k + 2`` after
    its own greedy tokens at ``t + 1 .. t + k + 1``. Teacher-forced text gives:

    * ``"teacher"``: the model's own greedy token ``argmax[t + k + 1]`` (its prediction of token
      ``t + k + 2`` after the *real* tokens up to ``t + k + 1``), at every position;
    * ``"greedy"``: the same label, kept only where the real text followed the model's greedy
      path from ``t + 1`` to ``t + k + 1`` (``ids[t + j + 1] == argmax[t + j]``): there it is
      exactly what decoding needs, at the price of fewer positions for deeper heads;
    * ``"text"``: the real token ``ids[t + k + 2]`` (Medusa-1 on ShareGPT).

    On the greedy held-out corpus the three coincide up to rounding.
    """
    kind = HeadLabels.parse(source)
    seq = torch.searchsorted(data.offsets, positions, right=True) - 1
    end = data.offsets[seq + 1]  # [P] one past each position's sequence
    out = torch.full((n_heads, positions.numel()), -100, dtype=torch.long)
    on_path = torch.ones(positions.numel(), dtype=torch.bool)
    follows = torch.zeros(data.n_tokens + 1, dtype=torch.bool)  # follows[j]: ids[j + 1] == argmax[j]
    follows[:-2] = data.ids[1:] == data.argmax[:-1]
    for k in range(n_heads):
        j = positions + k + kind.offset
        ok = j < end
        if kind.on_greedy_path:
            on_path &= follows[(positions + k).clamp(max=data.n_tokens)] & ok
            ok = on_path
        out[k, ok] = kind.tokens(data)[j[ok]].long()
    return out


class HeadLabels(str, Enum):
    """Where head ``k``'s label at position ``t`` comes from (:func:`head_labels`; a ``str``
    enum: its values are the ``--labels`` choices stored in stats and checkpoints)."""
    TEACHER = "teacher"  # the model's greedy token argmax[t + k + 1], everywhere
    GREEDY = "greedy"    # the same, only where the text followed the model's greedy path
    TEXT = "text"        # the text's token ids[t + k + 2]

    @classmethod
    def parse(cls, value) -> "HeadLabels":
        try:
            return cls(value)
        except ValueError:
            raise UserError(f"labels={value!r} is unknown; valid: {', '.join(m.value for m in cls)}") from None

    @property
    def offset(self) -> int:
        """``j - t - k``: the text's token sits one further than the model's prediction of it."""
        return 2 if self is HeadLabels.TEXT else 1

    @property
    def on_greedy_path(self) -> bool:
        return self is HeadLabels.GREEDY

    def tokens(self, data: TeacherData) -> torch.Tensor:
        """``[N]`` what index ``j`` reads: the text's ids or the model's greedy tokens."""
        return data.ids if self is HeadLabels.TEXT else data.argmax


LABELS = tuple(m.value for m in HeadLabels)


class HeadData:
    """Positions, hidden states and per-head targets drawn from a :class:`TeacherData`.

    Training items are single positions (indices into ``positions``): a head reads one hidden
    state, so batches mix positions of many sequences.

    ``states``: ``[K, N, H]`` the state each head reads at every position of ``data``
    (:func:`layer_inputs`: early-exit heads on intermediate layers); None: every head reads
    ``data.hidden``, the final normed state (Medusa).
    """

    def __init__(self, data: TeacherData, positions: torch.Tensor, n_heads: int, source: str,
                 states: torch.Tensor | None = None):
        self.labels = head_labels(data, positions, n_heads, source)  # [K, P]
        keep = self.labels[0] >= 0
        self.positions, self.labels = positions[keep], self.labels[:, keep]
        # [1 or K, P, H] fp16: one shared copy when every head reads the same state
        self.hidden = data.hidden[self.positions][None] if states is None else states[:, self.positions]

    def head_states(self, k: int, rows) -> torch.Tensor:
        """``[len(rows), H]``: what head ``k`` reads at items ``rows`` (an index tensor or a slice)."""
        return self.hidden[k if self.hidden.shape[0] > 1 else 0, rows]

    def __len__(self) -> int:
        return self.positions.numel()


@torch.no_grad()
def layer_inputs(model, data: TeacherData, layers: list[int], batch_size: int = 8, positions: torch.Tensor | None = None,
                 normed: bool = True, dtype: torch.dtype = torch.float16) -> torch.Tensor:
    """What an early-exit head at each of ``layers`` reads: the model's final norm applied to
    the state entering that layer (the output of the first ``layer`` layers).

    Args:
        data: its sequences run through the frozen model again (the cache keeps only final
            states), sorted by length and right-padded as the teacher pass does them, up to the
            deepest layer asked.
        positions: ``[P]`` flat positions of ``data`` to keep (None: every position), so a
            many-layer cache holds only the positions a trainer reads.
        normed: False keeps the raw residual states (a head that trains its own norm).
    Returns:
        ``[len(layers), P, H]`` in ``dtype`` (P = ``data.n_tokens`` when ``positions`` is None),
        rows in the order of ``positions``.
    """
    keep = torch.arange(data.n_tokens) if positions is None else positions.long()
    row = torch.full((data.n_tokens,), -1, dtype=torch.long)
    row[keep] = torch.arange(keep.numel())
    shape = (len(layers), keep.numel(), model.config.hidden_size)
    # before the pass, not half an hour into it: torch.empty commits no pages, so an allocation
    # too large for the machine only fails (the OS kills the run) once the pass has filled most
    check_fits(shape[0] * shape[1] * shape[2] * dtype.itemsize,
               f"the layer states ({len(layers)} layers x {shape[1]:,} positions x {shape[2]} x {dtype.itemsize} bytes)",
               "fewer positions (a trainer's per_sequence, or a smaller corpus) or fewer layers")
    out = torch.empty(*shape, dtype=dtype)
    order = [s for s in sorted(range(len(data)), key=lambda s: data.span(s)[1] - data.span(s)[0])
             if bool((row[slice(*data.span(s))] >= 0).any())]
    for i in tqdm(range(0, len(order), batch_size), desc=f"layer states {list(layers)}"[:60], unit="batch",
                  leave=False, disable=len(order) <= batch_size):
        spans = [data.span(s) for s in order[i:i + batch_size]]
        ids = torch.zeros(len(spans), max(b - a for a, b in spans), dtype=torch.long, device=model.device)
        for r, (a, b) in enumerate(spans):
            ids[r, :b - a] = data.ids[a:b].to(ids)
        states = layer_states(model, ids, layers)  # {layer: [B, T, H]} raw
        for j, layer in enumerate(layers):
            h = (final_norm(model, states[layer]) if normed else states[layer]).to(dtype).cpu()
            for r, (a, b) in enumerate(spans):
                dst = row[a:b]
                sel = dst >= 0
                out[j, dst[sel]] = h[r, :b - a][sel]
    return out


def make_loss(data: HeadData, vocab: torch.Tensor | None = None):
    """``(heads, batch of item indices) -> loss``: sum over heads of 0.8^k-weighted cross-entropy
    (Medusa's head weighting) against ``data.labels``.

    ``vocab``: train the softmax over these token ids only (sorted; every label must be in it).
    With the shared LM head the projection onto SmolLM2's 49 k-token vocabulary is almost all of
    a step's cost; the tokens the base model ever predicts greedily on the training text (the
    teacher labels) are a few thousand, so a step over them is several times cheaper. Tokens
    outside get no gradient (they keep the LM head's own scores); held-out accuracy is always
    measured over the full vocabulary.
    """
    remap = None
    if vocab is not None:
        remap = torch.full((int(vocab.max()) + 2,), -100, dtype=torch.long)
        remap[vocab] = torch.arange(vocab.numel())

    def loss(heads: MedusaHeads, batch: list[int]) -> torch.Tensor:
        idx = torch.tensor(batch)
        dev, dt = heads.blocks[0].linear.weight.device, heads.blocks[0].linear.weight.dtype
        total = 0.0
        for k in range(len(heads.blocks)):
            y = data.labels[k, idx]
            ok = y >= 0
            if not ok.any():
                continue
            h = data.head_states(k, idx).to(dev, dt)
            if vocab is None:
                logits, y = heads.head_logits(k, h[ok]), y[ok]
            else:
                logits, y = heads.head_logits(k, h[ok], vocab), remap[y[ok]]
            total = total + 0.8 ** k * nn.functional.cross_entropy(logits, y.to(dev))
        return total
    return loss


@torch.inference_mode()
def evaluate(heads: MedusaHeads, data: HeadData, topk: int = TOPK, chunk: int = 1024) -> dict:
    """Held-out metrics over the full vocabulary: per head cross-entropy, top-1 and the rank-r
    hit rates ``topk[k][r]`` (how often head k's rank-r candidate is the target)."""
    dev, dt = heads.blocks[0].linear.weight.device, heads.blocks[0].linear.weight.dtype
    K = len(heads.blocks)
    hits, nll, n = torch.zeros(K, topk), torch.zeros(K), torch.zeros(K)
    for i in range(0, len(data), chunk):
        for k in range(K):
            y = data.labels[k, i:i + chunk].to(dev)
            ok = y >= 0
            if not ok.any():
                continue
            h = data.head_states(k, slice(i, i + chunk)).to(dev, dt)
            logits = heads.head_logits(k, h[ok]).float()
            nll[k] += nn.functional.cross_entropy(logits, y[ok], reduction="sum").cpu()
            ranks = logits.topk(topk, dim=-1).indices
            hits[k] += (ranks == y[ok][:, None]).float().sum(0).cpu()
            n[k] += int(ok.sum())
    n = n.clamp(min=1)
    acc = (hits / n[:, None])
    return {"heldout_loss": [round(float(x), 4) for x in nll / n],
            "heldout_top1": [round(float(x), 4) for x in acc[:, 0]],
            "heldout_topk": acc.tolist()}


def train_heads(model, teacher: dict, out_dir: Path, n_heads: int = 4, cfg: TrainConfig = TrainConfig(),
                share_lm_head: bool = False, stop: Stopping | None = None, labels: str = "teacher",
                train_vocab: str = "labels", curve_path: Path | None = None, layers: list[int] | None = None) -> dict:
    """Train heads on the teacher cache (:mod:`common.training.teacher`), stop when the held-out curve
    flattens, measure top-k accuracies on the held-out greedy answers, build trees.

    Labels are the base model's own greedy tokens (``labels="teacher"``): the heads must guess
    what the model will say, which on real text differs from what the text says next, and
    decoding accepts a head's token only when it equals the model's greedy one. Every position
    of the training text trains (prompt and reply); held-out positions are the answers only.

    Args:
        teacher: the dict :func:`common.training.teacher.load_or_build` returns.
        stop: evaluation period and early stopping (default: every 50 steps, patience 3,
            tolerance 0.005 on head-1 top-1).
        train_vocab: ``"labels"`` (softmax over the teacher labels' tokens, see
            :func:`make_loss`) or ``"full"``.
        layers: early exit (FIRP's Figure 3 baseline): head ``k`` reads the final norm of the
            state entering layer ``layers[k]`` (:func:`layer_inputs`) instead of the last
            layer's; one layer per head, each in ``1..d-1``. The checkpoint's meta then holds
            ``input_layers``, which the ``medusa`` decoder refuses.
    Returns:
        stats (also ``out_dir/stats.json``); the learning curve goes to ``curve_path`` and
        ``out_dir/curve.jsonl``.
    """
    out_dir = Path(out_dir)
    if train_vocab not in ("labels", "full"):
        raise UserError(f"train_vocab={train_vocab!r} is unknown; valid: labels, full")
    stop = stop or Stopping(eval_every=50)
    if layers is not None:
        if len(layers) != n_heads:
            raise UserError(f"{len(layers)} input layers for {n_heads} heads; valid: one layer per head")
        check_layers(layers, num_layers(model), "early-exit layer")
    t0 = time.perf_counter()
    tr, held = teacher["train"], teacher["heldout"]
    states = (None, None) if layers is None else (layer_inputs(model, tr, layers), layer_inputs(model, held, layers))
    states_wall = time.perf_counter() - t0
    train_data = HeadData(tr, torch.arange(tr.n_tokens), n_heads, labels, states[0])
    held_data = HeadData(held, held.answer_positions(), n_heads, "text", states[1])
    del states
    vocab = None
    if train_vocab == "labels":
        vocab = torch.unique(train_data.labels[train_data.labels >= 0])
    heads = new_heads(model, n_heads, share_lm_head)
    meta = {**heads_meta(model, n_heads, share_lm_head), **({} if layers is None else {"input_layers": list(layers)})}
    curve_file = out_dir / "curve.jsonl"
    log = train(heads, list(range(len(train_data))), make_loss(train_data, vocab), cfg, out_dir / "heads.pt",
                out_dir / "train_log.jsonl", meta={**meta, "labels": labels, "train_vocab": train_vocab},
                desc="medusa heads", stop=stop, curve_path=curve_file,
                evaluate=lambda m: {k: v for k, v in evaluate(m, held_data).items() if k != "heldout_topk"})
    state = read_trained(out_dir / "heads.pt")  # mapped: only its curve and counters are read
    final = evaluate(heads, held_data)
    acc = final["heldout_topk"]
    curve = state["curve"]
    stats = {"accuracy": acc, "heldout_top1": final["heldout_top1"], "heldout_loss": final["heldout_loss"],
             "untrained_top1": curve[0]["heldout_top1"],
             # as every trainer reports it (common.training.loop.run_summary): the loop's own time
             # (steps and evaluations) over every resumed run; this session's, layer states and
             # final evaluation included, beside it
             "train_wall_s": state["wall_s"], "session_wall_s": time.perf_counter() - t0,
             "stopped": state["stopped"], "steps": state["step"],
             "meta": meta, "labels": labels, "train_vocab": train_vocab,
             "train_vocab_size": None if vocab is None else int(vocab.numel()),
             "params": sum(p.numel() for p in heads.parameters()), "final_loss": log[-1]["loss"] if log else None,
             "train_positions": len(train_data), "train_sequences": len(tr), "train_tokens": tr.n_tokens,
             "heldout_sequences": len(held), "heldout_positions": len(held_data),
             "stopping": asdict(stop), "config": asdict(cfg), "teacher": teacher["key"],
             **teacher_cache.cost_fields(teacher), "threads": torch.get_num_threads(), "trees": {}}
    if layers is not None:
        stats.update(input_layers=list(layers), layer_inputs_wall_s=states_wall)
    for n in TREE_SIZES:
        paths = best_tree(acc, n)
        stats["trees"][n] = expected_accept_length(paths, acc)
        save_tree(out_dir / f"tree_{n}.json", paths, expected_accept_length=stats["trees"][n],
                  source="medusa top-k accuracy on held-out self-distilled answers")
    if share_lm_head:  # the decoder's ``vocab`` option: answer tokens by frequency, as EAGLE's trainer counts them
        answers = tr.ids[tr.answer_positions() + 1].numpy()
        write_draft_vocab(out_dir, *frequency_order([answers], model.config.vocab_size))
    write_json(out_dir / "stats.json", stats)
    if curve_path is not None and Path(curve_path) != curve_file:
        write_jsonl(curve_path, read_jsonl(curve_file))
    return stats


def new_heads(model, n_heads: int, share_lm_head: bool) -> MedusaHeads:
    """Untrained heads for ``model`` (on its device and dtype), as training starts them."""
    with torch.device(model.device):  # created where the model lives, whatever the default device
        heads = MedusaHeads(model.config.hidden_size, model.config.vocab_size, n_heads,
                            model.lm_head.weight.detach(), share_lm_head)
    return heads.to(dtype=model.dtype)


def heads_meta(model, n_heads: int, share_lm_head: bool) -> dict:
    """The checkpoint identity of heads: the base model and the heads' shape."""
    return {**fingerprint(model), "n_heads": n_heads, "share_lm_head": share_lm_head}


def _main(argv=None) -> None:
    def add_args(ap):
        ap.add_argument("--heads", type=int, default=4)
        ap.add_argument("--share-lm-head", action="store_true",
                        help="project every head through the base model's frozen LM head (train the blocks only)")
        ap.add_argument("--labels", choices=LABELS, default="teacher")
        ap.add_argument("--train-vocab", choices=("labels", "full"), default="labels")

    def run(a, model, tok, data, cfg, stop):
        stats = train_heads(model, data, a.out, a.heads, cfg, a.share_lm_head, stop, a.labels,
                            a.train_vocab, a.curve_out)
        print("held-out top-1 per head:", stats["heldout_top1"])
        return stats

    component_main("train Medusa-1 heads on the teacher cache", add_args, run, (teacher_cache.add_args, teacher_cache.from_args, teacher_cache.check_args),
                   argv, batch_size=256)


if __name__ == "__main__":
    cli_main(_main)
