"""EAGLE-3's draft head (:class:`Eagle3Head`, Li et al., 2025, arXiv 2503.01840) and its training
with the training-time test; the decoder that drafts with it is :mod:`common.decoders.eagle3`.

What differs from EAGLE-1/2's head (:mod:`common.components.eagle_head`), as the paper and its
public code (``eagle/traineagle3/cnets.py``) have it:

* **Fused features.** The head reads the inputs of three of the target's decoder layers, a low,
  a middle and a high one (the code takes those entering layers ``2``, ``L // 2`` and ``L - 3`` of an
  ``L``-layer model: 2, 15, 27 of SmolLM2-135M's 30), concatenated and projected by ``fc``
  (``3d -> d``, no bias), instead of the final feature.
* **One decoder layer reading [embedding ; feature].** Both halves are normed separately
  (``emb_norm``, ``hidden_norm``), concatenated (``2d``) and projected by the attention's q/k/v;
  the residual stream is the feature (``d``). The output feeds its own norm and LM head.
* **Training-time test.** The head is unrolled ``steps`` times (the code: 7) on its own outputs:
  step ``j`` at position ``i`` reads the output of step ``j - 1`` at ``i`` with the token
  ``x_{i+j+1}`` at position ``i + j`` and predicts ``x_{i+j+2}``, attending to the real context
  (step 0's keys at positions ``<= i``) and to its own earlier steps at ``i`` (a diagonal per
  earlier step): the pattern a chain drafted below the root ``i`` sees at decode time.
* **Token-level loss only**, no feature regression: at each step the cross-entropy between the
  target's next-token distribution restricted (renormalised) to the draft vocabulary and the
  head's, over answer positions whose target greedy token lies in the draft vocabulary; step
  ``j`` weighted ``decay ** j`` (the code: 0.8).
* **Reduced draft vocabulary.** The head's LM head scores only the ``K`` most frequent answer
  tokens of its training data (the code: 32 k of Llama-3's 128 k). ``keep`` (``[K]``, sorted
  target ids; the code's ``d2t`` is ``keep - arange(K)``, its ``t2d`` ``isin(arange(V), keep)``)
  is a buffer of the head, so the checkpoint carries it.

Beyond the code: the head's final norm and LM head start as the target's (its final norm, its
LM-head rows of ``keep``), so a small corpus starts from the target's own readout.

Data: the sharded corpus (:mod:`common.training.corpus`, the model's own greedy answers). The
three layers' features are never cached (5 M tokens x 3 x 576 values would be 17-35 GB): each
batch runs the frozen target once (:func:`teacher_outputs`) for its layer inputs and its
next-token distributions.

Held-out metrics (the corpus's held-out shard): ``heldout_top1[j]`` is the share of answer
positions where step ``j + 1``'s first draft token is the target's greedy token (given correct
ancestors: what depth ``j + 1`` of a drafted chain gets right; ``heldout_top1[0]`` compares with
EAGLE's ``heldout_top1``), ``heldout_top5`` likewise, ``heldout_loss`` the weighted loss.

CLI: ``python -m common.components.eagle3_head --model M --corpus-dir DIR --out DIR [--corpus-tokens N]
[--layers 2,15,27] [--ttt-steps 7] [--step-decay 0.8] [--draft-vocab 8192] ...``.
"""
from __future__ import annotations

import copy
import hashlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import nn
from transformers import DynamicCache

from ..checkpoints import fingerprint
from ..engine.forward import attention_mask_4d, backbone, causal_allow, embed, num_layers
from ..errors import UserError, check_range
from ..training import corpus as corpus_mod
from .reduced_head import frequency_order

CHECKPOINT = "head.pt"
RANKS = 8  # draft ranks measured per depth (what the static trees are built from)


def default_layers(n_layers: int) -> tuple[int, ...]:
    """The public code's fused layers of an ``n_layers``-layer model: the inputs of layers 2,
    ``n // 2`` and ``n - 3`` (duplicates merged, as its membership test does on small models)."""
    return tuple(sorted({2, n_layers // 2, n_layers - 3}))


def check_layers_of(layers, model) -> tuple[int, ...]:
    """``layers`` as a tuple, or one UserError: at least one, distinct, each a layer input of
    ``model`` (``0..L-1``; 0 is the embeddings)."""
    n = num_layers(model)
    layers = tuple(layers) if isinstance(layers, (list, tuple)) else ()
    bad = [l for l in layers if isinstance(l, bool) or not isinstance(l, int) or not 0 <= l < n]
    if not layers or bad or len(set(layers)) != len(layers):
        why = f"index {bad[0]!r} is outside the model" if bad else "need at least one index, each once"
        raise UserError(f"fused layers {list(layers)}: {why}; valid: distinct layer indices in 0..{n - 1} "
                        f"(the model has {n} layers), default {list(default_layers(n))}")
    return layers


# -- the head ---------------------------------------------------------------------------------
class Eagle3Head(nn.Module):
    """EAGLE-3's head for a LLaMA-style target: ``fc`` (``nd -> d``) over ``n`` fused layers, one
    decoder layer of the target's architecture reading ``[emb ; feature]`` (``2d``), its own
    final norm and an LM head over the draft vocabulary ``keep`` (``[K]`` target ids).

    The target's embedding stays frozen and shared: the caller passes embedded tokens.
    """

    def __init__(self, model, layers, keep: torch.Tensor):
        super().__init__()
        cfg = copy.deepcopy(model.config)
        cfg.num_hidden_layers = 1
        cfg.layer_types = None if not hasattr(cfg, "layer_types") else ["full_attention"]
        self.config = cfg
        self.layers = tuple(layers)
        hidden = cfg.hidden_size
        stack = backbone(model)
        self.fc = nn.Linear(len(self.layers) * hidden, hidden, bias=False)
        block = type(stack.layers[0])(cfg, 0)
        attn = block.self_attn
        for name in ("q_proj", "k_proj", "v_proj"):  # q/k/v read [emb ; feature]: 2d inputs
            old = getattr(attn, name)
            setattr(attn, name, nn.Linear(2 * hidden, old.out_features, bias=old.bias is not None))
        self.attn, self.mlp, self.post_norm = attn, block.mlp, block.post_attention_layernorm
        self.emb_norm, self.hidden_norm = block.input_layernorm, copy.deepcopy(block.input_layernorm)
        self.rotary = type(stack.rotary_emb)(config=cfg)
        self.norm = copy.deepcopy(stack.norm)  # starts as the target's final norm (beyond the code)
        keep = torch.as_tensor(keep, dtype=torch.long)
        self.lm_head = nn.Linear(hidden, keep.numel(), bias=False)
        with torch.no_grad():  # starts as the target's LM-head rows of the draft vocabulary
            self.lm_head.weight.copy_(model.lm_head.weight[keep.to(model.lm_head.weight.device)])
        self.register_buffer("keep", keep.clone())
        self.requires_grad_(True)  # the copies of the frozen target's norm are the head's to train

    def new_cache(self) -> DynamicCache:
        return DynamicCache(config=self.config)

    def fuse(self, states: torch.Tensor) -> torch.Tensor:
        """``[..., n*H]`` the fused layers' inputs, concatenated in ``layers`` order -> ``[..., H]``."""
        return self.fc(states.to(self.fc.weight.dtype))

    def forward(self, feats: torch.Tensor, embeds: torch.Tensor, position_ids: torch.Tensor,
                cache=None, mask: torch.Tensor | None = None) -> torch.Tensor:
        """The head's state after reading ``(feature, token)`` pairs.

        Args:
            feats: ``[B, q, H]`` fused features (:meth:`fuse`) or the head's own earlier outputs.
            embeds: ``[B, q, H]`` embeddings of the tokens that follow them.
            position_ids: ``[B, q]`` positions (a chain's depth-``j`` step sits at root + ``j``).
            cache: the head's KV cache (appended to), or None.
            mask: ``[B|1, 1, q, past + q]`` additive mask; None = causal over ``q`` after the cache.
        Returns:
            ``[B, q, H]`` un-normed state: the next step's feature, and (:meth:`logits`) the draft.
        """
        feats = feats.to(embeds.dtype)
        x = torch.cat([self.emb_norm(embeds), self.hidden_norm(feats)], dim=-1)  # [B, q, 2H]
        if mask is None:
            past = cache.get_seq_length() if cache is not None else 0
            mask = attention_mask_4d(causal_allow(x.shape[1], x.device), past, x.dtype)
        pe = self.rotary(feats, position_ids=position_ids)
        attn, _ = self.attn(x, position_embeddings=pe, attention_mask=mask, past_key_values=cache)
        h = feats + attn
        return h + self.mlp(self.post_norm(h))

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """``[..., H]`` head states -> ``[..., K]`` logits over the draft vocabulary (``keep[k]`` is
        the target id of column ``k``)."""
        return self.lm_head(self.norm(hidden))


def head_meta(model) -> dict:
    """What a head is tied to: the base model's shape and weights (a head for another model is refused)."""
    return {**fingerprint(model), "model_id": corpus_mod.model_identity(model), "kind": "eagle3"}


def new_head(model, layers, keep: torch.Tensor) -> Eagle3Head:
    """A head on the model's device and dtype (built there, whatever the default device)."""
    with torch.device(model.device):
        return Eagle3Head(model, layers, keep.to(model.device)).to(dtype=model.dtype)


# -- the training-time test ----------------------------------------------------------------------
def ttt_allow(q: int, step: int, device) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Attention of unrolled step ``step`` (0-based) over ``q`` positions.

    Returns:
        ``(allow [q, q], past_allow [q, step * q] or None)``: step 0 is causal; step ``j > 0``
        sees step 0's keys causally (the real context up to its root) and, of each step
        ``1..j``, only the key at its own position (its chain's earlier drafts).
    """
    if step == 0:
        return causal_allow(q, device), None
    eye = torch.eye(q, dtype=torch.bool, device=device)
    return eye, torch.cat([causal_allow(q, device)] + [eye] * (step - 1), dim=1)


def unroll(head: Eagle3Head, model, states: torch.Tensor, ids: torch.Tensor, steps: int) -> list[torch.Tensor]:
    """The training-time test: the head run ``steps`` times on its own outputs.

    Args:
        states: ``[B, T, n*H]`` the fused layers' inputs at every position.
        ids: ``[B, T]`` the tokens.
    Returns:
        ``steps`` tensors ``[B, T-1, H]``: row ``i`` of step ``j`` is the head's state after the
        chain rooted at ``i`` read ``x_{i+1} .. x_{i+j+1}``; its :meth:`Eagle3Head.logits` draft
        ``x_{i+j+2}``. Tokens past the sequence's end are clamped (and left out of the loss).
    """
    b, t = ids.shape
    q, dev = t - 1, ids.device
    emb = embed(model, ids)                                   # [B, T, H], frozen
    base = torch.arange(q, device=dev)
    h = head.fuse(states[:, :q])                              # [B, q, H]
    cache = head.new_cache()
    outs = []
    for j in range(steps):
        allow, past_allow = ttt_allow(q, j, dev)
        mask = attention_mask_4d(allow, j * q, h.dtype, past_allow)
        tok = emb[:, (base + j + 1).clamp(max=t - 1)]          # x_{i+j+1}
        h = head(h, tok, (base + j)[None].expand(b, -1), cache, mask)
        outs.append(h)
    return outs


@torch.no_grad()
def teacher_outputs(model, ids: torch.Tensor, layers, keep: torch.Tensor):
    """One frozen forward over ``[B, T]`` right-padded ids (padding is never seen by real positions).

    Returns:
        ``(states [B, T, n*H], greedy [B, T], logp [B, T, K])``: the fused layers' inputs, the
        target's greedy next token at each position, and its next-token log-probabilities
        renormalised over the draft vocabulary ``keep``.
    """
    out = model(input_ids=ids, output_hidden_states=True)
    states = torch.cat([out.hidden_states[l] for l in layers], dim=-1)
    logits = out.logits
    return states, logits.argmax(-1), torch.log_softmax(logits[..., keep].float(), dim=-1)


def step_valid(lengths: torch.Tensor, starts: torch.Tensor, q: int, step: int) -> torch.Tensor:
    """``[B, q]`` bool: rows ``i`` of step ``step`` whose label position ``p = i + step + 1`` lies in the
    sequence (``p <= length - 1``) and predicts an answer token (``p + 1 >= start``)."""
    p = torch.arange(q, device=lengths.device)[None] + step + 1
    return (p <= lengths[:, None] - 1) & (p >= starts[:, None] - 1)


def ttt_loss(head: Eagle3Head, model, ids, lengths, starts, steps: int, decay: float, ranks: int = 0):
    """The weighted token-level loss of the unrolled steps, and per-step counts.

    Returns:
        ``(loss, parts)``: ``loss = sum_j decay**j * CE_j`` (``CE_j`` the mean over step ``j``'s
        answer rows whose target greedy token is a draft token); ``parts[j]``: ``ce`` (sum),
        ``n_ce``, ``n`` (answer rows), ``hits`` (``[ranks]`` rows whose rank-``r`` draft is the
        target's greedy token; with ``ranks`` > 0 only).
    """
    states, greedy, logp = teacher_outputs(model, ids, head.layers, head.keep)
    in_draft = torch.zeros(model.config.vocab_size, dtype=torch.bool, device=ids.device)
    in_draft[head.keep] = True
    q = ids.shape[1] - 1
    total, parts = 0.0, []
    for j, h in enumerate(unroll(head, model, states, ids, steps)):
        p = (torch.arange(q, device=ids.device) + j + 1).clamp(max=q)
        label, target = greedy[:, p], logp[:, p]                 # [B, q], [B, q, K]
        valid = step_valid(lengths, starts, q, j)
        scored = valid & in_draft[label]
        logq = torch.log_softmax(head.logits(h).float(), dim=-1)  # [B, q, K]
        ce = -(target.exp() * logq).sum(-1)[scored]
        part = {"ce": ce.sum(), "n_ce": int(scored.sum()), "n": int(valid.sum())}
        if ce.numel():
            total = total + decay ** j * ce.mean()
        if ranks:
            top = head.keep[logq.topk(min(ranks, logq.shape[-1]), dim=-1).indices]  # [B, q, r]
            part["hits"] = ((top == label[..., None]) & valid[..., None]).sum((0, 1)).float()
        parts.append(part)
    if not torch.is_tensor(total):  # no answer position in the batch: a zero loss that moves nothing
        total = sum(p.sum() for p in head.parameters()) * 0.0
    return total, parts


# -- data: the corpus's token sequences (features come from the target, batch by batch) ----------
@dataclass
class CorpusData:
    """Sequences of some corpus shards (token ids only)."""
    shards: list[corpus_mod.Shard]

    def examples(self) -> list[tuple[int, int]]:
        return [(k, i) for k, s in enumerate(self.shards) for i in range(len(s))]

    def answers(self):
        """Each sequence's answer ids (1-D arrays)."""
        return (s.tokens[s.offsets[i] + s.starts[i]:s.offsets[i + 1]] for s in self.shards for i in range(len(s)))

    def batch(self, items, max_len: int, device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``([B, T] ids right-padded with 0, [B] lengths, [B] answer starts)``, each sequence cut to
        its last ``max_len`` tokens (a long one keeps its answer and drops its prompt's start)."""
        rows = []
        for k, i in items:
            s = self.shards[k]
            a, b = int(s.offsets[i]), int(s.offsets[i + 1])
            lo = a + max(0, (b - a) - max_len)
            rows.append((s.tokens[lo:b], int(s.starts[i]) - (lo - a)))
        width = max(len(r[0]) for r in rows)
        ids = torch.zeros(len(rows), width, dtype=torch.long)
        for r, (tok, _) in enumerate(rows):
            ids[r, :len(tok)] = torch.from_numpy(tok.astype(np.int64))
        lengths = torch.tensor([len(r[0]) for r in rows])
        starts = torch.tensor([r[1] for r in rows])
        return ids.to(device), lengths.to(device), starts.to(device)


def corpus_digest(manifest: dict, shards: int) -> str:
    """The identity of the first ``shards`` training shards and the held-out shard (their SHA-256s):
    a resumed training must read the same data."""
    shas = [s["sha256"] for s in manifest["shards"][:shards]] + [(manifest.get("heldout") or {}).get("sha256", "")]
    return hashlib.sha256("".join(shas).encode()).hexdigest()[:16]


def add_args(ap) -> None:
    ap.add_argument("--corpus-dir", type=Path, required=True,
                    help="the sharded corpus (python -m common.training.corpus): its shards train, its held-out shard evaluates")
    ap.add_argument("--corpus-tokens", type=int, default=None, help="answer tokens of the corpus to train on (default: all)")


def from_args(a, model, tokenizer) -> dict:
    """``{"train", "heldout": CorpusData, "corpus": {...}, "tokenizer_id"}`` of ``--corpus-dir``;
    a corpus of another model or tokenizer is one UserError."""
    if a.corpus_tokens is not None:
        check_range("--corpus-tokens", a.corpus_tokens, 1)
    return load_corpus(a.corpus_dir, model, tokenizer, a.corpus_tokens)


def load_corpus(corpus_dir: Path, model, tokenizer=None, tokens: int | None = None) -> dict:
    manifest = corpus_mod.open_corpus(corpus_dir, model=model, tokenizer=tokenizer)
    shards = list(corpus_mod.iter_shards(corpus_dir, tokens))
    if not shards:
        raise UserError(f"corpus {corpus_dir} has no training shard yet; valid: a corpus with at least one shard")
    train = CorpusData(shards)
    return {"train": train, "heldout": CorpusData([corpus_mod.heldout(corpus_dir)]),
            "tokenizer_id": corpus_mod.tokenizer_identity(tokenizer) if tokenizer is not None else None,
            "corpus": {"dir": str(corpus_dir), "shards": len(shards), "digest": corpus_digest(manifest, len(shards)),
                       "answer_tokens": sum(s.answer_tokens for s in shards)}}


def draft_vocab(data: CorpusData, size: int, vocab: int) -> torch.Tensor:
    """``[size]`` sorted ids: the ``size`` most frequent answer tokens of ``data`` (ties by id)."""
    order, _ = frequency_order(data.answers(), vocab)
    if size > len(order):
        raise UserError(f"--draft-vocab {size} exceeds the {len(order)} distinct answer tokens of the training "
                        f"shards; valid: 1..{len(order)}")
    return torch.as_tensor(np.sort(order[:size]), dtype=torch.long)


# -- evaluation and training -------------------------------------------------------------------
def evaluate(head: Eagle3Head, model, held: CorpusData, max_len: int, steps: int, decay: float,
             batch_size: int = 8) -> tuple[dict, list[list[float]]]:
    """Held-out metrics (see the module docstring) and ``acc[j][r]``: the share of answer rows
    whose rank-``r`` draft at depth ``j + 1`` is the target's greedy token, given correct ancestors
    (what :func:`common.engine.tree_search.best_tree` takes)."""
    items = held.examples()
    ce = [0.0] * steps
    n_ce, n = [0] * steps, [0] * steps
    hits = [torch.zeros(min(RANKS, head.keep.numel())) for _ in range(steps)]
    for b in range(0, len(items), batch_size):
        ids, lengths, starts = held.batch(items[b:b + batch_size], max_len, model.device)
        _, parts = ttt_loss(head, model, ids, lengths, starts, steps, decay, ranks=RANKS)
        for j, p in enumerate(parts):
            ce[j] += float(p["ce"])
            n_ce[j] += p["n_ce"]
            n[j] += p["n"]
            hits[j] += p["hits"].cpu()
    acc = [(h / max(c, 1)).tolist() for h, c in zip(hits, n)]
    metrics = {"heldout_top1": [round(a[0], 6) for a in acc],
               "heldout_top5": [round(sum(a[:5]), 6) for a in acc],
               "heldout_loss": sum(decay ** j * ce[j] / max(n_ce[j], 1) for j in range(steps)),
               "heldout_positions": n}
    return metrics, acc


def train_head(model, data: dict, out_dir: Path, cfg, stop, layers, steps: int = 7, decay: float = 0.8,
               vocab_size: int = 8192, max_len: int = 384) -> dict:
    """Train a head on ``data`` (:func:`load_corpus`); writes ``out_dir/head.pt``, ``curve.jsonl``,
    the static trees ``tree_{n}.json`` and ``stats.json``; returns the stats."""
    from ..checkpoints import read_trained
    from ..records import write_json
    from ..training.loop import chosen_row, train
    from .eagle_head import save_trees

    out_dir = Path(out_dir)
    layers = check_layers_of(layers, model)
    check_range("steps", steps, 1)
    check_range("decay", decay, 0.0, 1.0)
    check_range("max_len", max_len, 3)
    train_data, held = data["train"], data["heldout"]
    keep = draft_vocab(train_data, vocab_size, model.config.vocab_size)
    model.requires_grad_(False)
    torch.manual_seed(cfg.seed)
    head = new_head(model, layers, keep)

    def loss_fn(module, batch):
        ids, lengths, starts = train_data.batch(batch, max_len, model.device)
        return ttt_loss(module, model, ids, lengths, starts, steps, decay)[0]

    meta = {**head_meta(model), "fused_layers": list(layers), "draft_vocab": vocab_size, "ttt_steps": steps,
            "step_decay": decay, "max_len": max_len, "corpus_digest": data["corpus"]["digest"],
            "answer_tokens": data["corpus"]["answer_tokens"], "tokenizer_id": data.get("tokenizer_id")}
    log = train(head, train_data.examples(), loss_fn, cfg, out_dir / CHECKPOINT, out_dir / "train_log.jsonl", meta,
                desc="eagle3 head", evaluate=lambda m: evaluate(m, model, held, max_len, steps, decay)[0],
                stop=stop, curve_path=out_dir / "curve.jsonl")
    state = read_trained(out_dir / CHECKPOINT)
    head.eval()
    with torch.inference_mode():
        final, acc = evaluate(head, model, held, max_len, steps, decay)
    trees = save_trees(out_dir, acc)
    held_answers = np.concatenate(list(held.answers()) or [np.zeros(0, dtype=np.int64)])
    stats = {"component": "eagle3_head", **meta, "corpus": data["corpus"], "sequences": len(train_data.examples()),
             "steps": len(log), "train_wall_s": round(state.get("wall_s", 0.0), 1), "stopped": state.get("stopped"),
             "chosen_step": state.get("chosen_step", state.get("step")), "final": chosen_row(state),
             "params": sum(p.numel() for p in head.parameters()), "depth_acc_top1": [a[0] for a in acc],
             "heldout_draft_vocab_coverage": round(float(np.isin(held_answers, keep.numpy()).mean()), 4)
             if held_answers.size else None,
             "tree_expected_accept_length": trees}
    write_json(out_dir / "stats.json", stats)
    return stats


def _parse_layers(text: str | None) -> tuple[int, ...] | None:
    if text is None:
        return None
    try:
        return tuple(int(x) for x in text.split(","))
    except ValueError:
        raise UserError(f"--layers {text!r} is not a comma-separated list of layer indices; valid: e.g. 2,15,27") from None


def _main(argv=None) -> None:
    from ..training.cli import component_main

    def add_component_args(ap):
        ap.add_argument("--layers", default=None,
                        help="fused layer inputs, comma-separated (default: 2, L//2, L-3 of an L-layer model)")
        ap.add_argument("--ttt-steps", type=int, default=7, help="unrolled training-time-test steps (the code: 7)")
        ap.add_argument("--step-decay", type=float, default=0.8, help="step j's loss weight is decay**j (the code: 0.8)")
        ap.add_argument("--draft-vocab", type=int, default=8192, help="draft vocabulary: the most frequent answer tokens")
        ap.add_argument("--head-max-len", type=int, default=384, help="positions per training sequence (its end kept)")

    def check_args(a):
        _parse_layers(a.layers)
        check_range("--ttt-steps", a.ttt_steps, 1)
        check_range("--step-decay", a.step_decay, 0.0, 1.0)
        check_range("--draft-vocab", a.draft_vocab, RANKS)
        check_range("--head-max-len", a.head_max_len, 3)

    def check_model(a, model):
        check_layers_of(_parse_layers(a.layers) or default_layers(num_layers(model)), model)
        check_range("--draft-vocab", a.draft_vocab, RANKS, model.config.vocab_size)

    def run(a, model, tok, data, cfg, stop):
        layers = _parse_layers(a.layers) or default_layers(num_layers(model))
        stats = train_head(model, data, a.out, cfg, stop, layers, a.ttt_steps, a.step_decay, a.draft_vocab,
                           a.head_max_len)
        stats["threads"] = torch.get_num_threads()
        if a.curve_out:
            import shutil
            Path(a.curve_out).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(Path(a.out) / "curve.jsonl", a.curve_out)
        return stats

    component_main("train EAGLE-3's draft head (fused features, training-time test) on the corpus",
                   add_component_args, run, (add_args, from_args), argv, lr=3e-4, batch_size=4, eval_every=200,
                   check_args=check_args, check_model=check_model)


if __name__ == "__main__":
    from ..errors import cli_main
    cli_main(_main)
