"""EAGLE's draft head (:class:`EagleHead`) and its training on the corpus; the decoder that
drafts with it is :mod:`common.decoders.eagle`.

Data: the teacher cache (:mod:`common.training.teacher`) of the sharded self-distillation corpus
(:mod:`common.training.corpus`): one teacher-forced pass of the frozen target, the final features
``h_j`` (after the final norm, fp16) at every position of the model's own greedy answers, the
same pass Medusa's heads and the draft train on, resumable by shard.

Loss (EAGLE): at every answer position, the head reads ``(h_j, x_{j+1})`` and predicts
``h_{j+1}``; smooth-L1 between the prediction and ``h_{j+1}`` plus ``w_cls`` (0.1) times the
cross-entropy between the target's next-token distribution ``softmax(lm_head(h_{j+1}))`` and
the head's ``log_softmax(lm_head(prediction))``. The input features get uniform noise
``U(-noise, noise)`` (EAGLE's augmentation; its amplitude there is 0.1 at 512-token
sequences). The target's embedding and LM head stay frozen.

Held-out metrics (the corpus's held-out shard, the same prompts for every component):
``heldout_top1`` = the share of answer positions where the head, given the true features up to
``h_j`` and the token ``x_{j+1}``, puts the target's greedy token ``x_{j+2}`` first (what its
first draft token gets right, comparable with Medusa's head 1), ``heldout_top5`` and the loss.

CLI: ``python -m common.components.eagle_head --model M --teacher CACHE --corpus-dir DIR --out DIR [--corpus-tokens N] ...``.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F
from transformers import DynamicCache
from tqdm import tqdm

from ..training import corpus as corpus_mod
from ..checkpoints import fingerprint
from ..errors import UserError, check_range
from ..engine.forward import attention_mask_4d, backbone, causal_allow
from .reduced_head import frequency_order, write_draft_vocab
from ..training.teacher import TeacherData, cost_fields

CHECKPOINT = "head.pt"


# -- the head ---------------------------------------------------------------------------------
class EagleHead(nn.Module):
    """EAGLE's draft head for a LLaMA-style target: ``fc`` (2d -> d) and one decoder layer.

    The target's embedding and LM head are not parameters of the head (they stay frozen and
    shared); the caller passes the embedded tokens and reads tokens through the target's head.
    """

    def __init__(self, model):
        super().__init__()
        cfg = copy.deepcopy(model.config)
        cfg.num_hidden_layers = 1
        cfg.layer_types = None if not hasattr(cfg, "layer_types") else ["full_attention"]
        self.config = cfg
        hidden = cfg.hidden_size
        stack = backbone(model)
        self.fc = nn.Linear(2 * hidden, hidden, bias=True)
        self.layer = type(stack.layers[0])(cfg, 0)
        # EAGLE drops the first layer's input norm: fc's output is already a feature mixture
        self.layer.input_layernorm = nn.Identity()
        self.rotary = type(stack.rotary_emb)(config=cfg)

    def new_cache(self) -> DynamicCache:
        return DynamicCache(config=self.config)

    def forward(self, feats: torch.Tensor, embeds: torch.Tensor, position_ids: torch.Tensor,
                cache=None, mask: torch.Tensor | None = None) -> torch.Tensor:
        """Predicted next features.

        Args:
            feats: ``[B, q, H]`` target features ``h_j`` (or the head's own predictions).
            embeds: ``[B, q, H]`` embeddings of the tokens ``x_{j+1}`` that follow them.
            position_ids: ``[B, q]`` positions ``j``.
            cache: the head's KV cache (appended to), or None (training on whole sequences).
            mask: ``[B|1, 1, q, past + q]`` additive mask; None = causal over ``q`` (no cache).
        Returns:
            ``[B, q, H]`` predicted features ``h_{j+1}`` (read through the target's LM head).
        """
        x = self.fc(torch.cat([embeds, feats.to(embeds.dtype)], dim=-1))
        if mask is None:
            q = x.shape[1]
            past = cache.get_seq_length() if cache is not None else 0
            mask = attention_mask_4d(causal_allow(q, x.device), past, x.dtype)
        pe = self.rotary(x, position_ids=position_ids)
        return self.layer(x, attention_mask=mask, position_embeddings=pe, position_ids=position_ids,
                          past_key_values=cache, use_cache=cache is not None)


def head_meta(model) -> dict:
    """What a head is tied to: the base model (a head for another model is refused)."""
    return {**fingerprint(model), "kind": "eagle"}


def new_head(model) -> EagleHead:
    """A fresh head on the model's device and dtype (built there, whatever the default device)."""
    with torch.device(model.device):
        return EagleHead(model).to(dtype=model.dtype)


# -- training data ----------------------------------------------------------------------------
@dataclass
class SeqData:
    """Sequences of some shards with their features (memory-mapped; one shard's worth read at a time)."""
    shards: list[corpus_mod.Shard]
    feats: list[np.ndarray]

    def examples(self) -> list[tuple[int, int]]:
        return [(k, i) for k, s in enumerate(self.shards) for i in range(len(s))]

    def batch(self, items, max_len: int, device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``([B, T, H] features, [B, T] ids, [B, T-1] bool loss mask)`` for ``items``, each
        sequence cut to its last ``max_len`` positions; the mask marks the predictions ``j``
        (of ``h_{j+1}``, hence of ``x_{j+2}``) that fall in the answer."""
        rows = []
        for k, i in items:
            s = self.shards[k]
            a, b = int(s.offsets[i]), int(s.offsets[i + 1])
            lo = a + max(0, (b - a) - max_len)  # too long: keep the end (the answer), drop the prompt's start
            rows.append((s.tokens[lo:b], self.feats[k][lo:b], int(s.starts[i]) - (lo - a)))
        width = max(len(r[0]) for r in rows)
        hidden = self.feats[0].shape[1]
        f = torch.zeros(len(rows), width, hidden)
        ids = torch.zeros(len(rows), width, dtype=torch.long)
        mask = torch.zeros(len(rows), max(width - 1, 1), dtype=torch.bool)
        for r, (tok, ft, start) in enumerate(rows):
            n = len(tok)
            f[r, :n] = torch.from_numpy(np.array(ft, dtype=np.float32))  # a copy: memory-mapped rows are read-only
            ids[r, :n] = torch.from_numpy(tok.astype(np.int64))
            # position j predicts h_{j+1}, whose LM head gives x_{j+2}: count j where x_{j+2}
            # is an answer token (j >= start - 2), up to the last prediction (j = n - 2)
            mask[r, max(start - 2, 0):n - 1] = True
        return f.to(device), ids.to(device), mask[:, :width - 1].to(device)


def from_teacher(data: TeacherData) -> SeqData:
    """A teacher cache's sequences (:class:`common.training.teacher.TeacherData`) as one memory-resident
    shard: its ids, prompt lengths and fp16 final features."""
    shard = corpus_mod.Shard(tokens=data.ids.numpy(), offsets=data.offsets.numpy(), starts=data.start.numpy(),
                             prompt_index=np.arange(len(data)))
    return SeqData([shard], [data.hidden.numpy()])


def head_step(head: EagleHead, model, f: torch.Tensor, ids: torch.Tensor, noise: float = 0.0) -> torch.Tensor:
    """``[B, T-1, H]`` predictions of ``h_{j+1}`` from ``(h_j, x_{j+1})`` over whole sequences."""
    inp = f[:, :-1]
    if noise:
        inp = inp + (torch.rand_like(inp) * 2 - 1) * noise
    pos = torch.arange(inp.shape[1], device=f.device)[None].expand(inp.shape[0], -1)
    return head(inp, model.get_input_embeddings()(ids[:, 1:]), pos)


def eagle_loss(head, model, f, ids, mask, w_cls: float = 0.1, noise: float = 0.0) -> tuple[torch.Tensor, dict]:
    pred = head_step(head, model, f, ids, noise)[mask]  # [N, H]
    tgt = f[:, 1:][mask]
    reg = F.smooth_l1_loss(pred, tgt)
    with torch.no_grad():
        p = torch.softmax(model.lm_head(tgt).float(), dim=-1)
    logq = torch.log_softmax(model.lm_head(pred).float(), dim=-1)
    cls = -(p * logq).sum(-1).mean()
    return reg + w_cls * cls, {"reg": reg, "cls": cls, "logq": logq, "p": p}


def evaluate(head, model, held: SeqData, max_len: int, batch_size: int = 8, w_cls: float = 0.1) -> dict:
    items = held.examples()
    hits1 = hits5 = n = 0
    loss = 0.0
    for b in range(0, len(items), batch_size):
        f, ids, mask = held.batch(items[b:b + batch_size], max_len, model.device)
        if not mask.any():
            continue
        l, parts = eagle_loss(head, model, f, ids, mask, w_cls)
        greedy = parts["p"].argmax(-1)
        top = parts["logq"].topk(5, dim=-1).indices
        hits1 += int((top[:, 0] == greedy).sum())
        hits5 += int((top == greedy[:, None]).any(-1).sum())
        cnt = int(mask.sum())
        loss += float(l) * cnt
        n += cnt
    return {"heldout_top1": hits1 / max(n, 1), "heldout_top5": hits5 / max(n, 1), "heldout_loss": loss / max(n, 1),
            "heldout_positions": n}


TREE_SIZES = (8, 16, 32, 63)


def chain_features(head: EagleHead, model, f: torch.Tensor, ids: torch.Tensor, greedy: torch.Tensor,
                   starts: torch.Tensor, depth: int):
    """Yield ``(d, feat)`` for ``d = 1 .. depth``: ``feat`` [q, H] is the head's predicted feature
    whose readout drafts depth ``d`` of a chain rooted at each answer position in ``starts`` [q],
    given correct ancestors.

    ``f`` [1, n, H] are the target's features and ``ids`` [1, n] the tokens of one sequence,
    ``greedy`` [n] the target's greedy token after each position. Depth 1 reads the head over
    the true pairs (h_i, x_{i+1}) up to ``h_j``; depth ``d + 1`` feeds the head the pair
    (predicted h_{j+d}, greedy[j + d]) at position ``j + d``, attending to the true pairs up to
    ``j`` and to its own chain: what the decoder's proposer feeds a depth-``d`` node."""
    from ..engine.forward import attention_mask_4d, embed

    dev, n = f.device, ids.shape[1]
    cache = head.new_cache()
    pos = torch.arange(n - 1, device=dev)
    out = head(f[:, :-1], embed(model, ids[:, 1:]), pos[None], cache)[0]  # [n-1, H]: out[j] ~ h_{j+1}
    feat, past_slots = out[starts], []
    for d in range(1, depth + 1):
        yield d, feat
        if d == depth:
            return
        q, past = starts.numel(), cache.get_seq_length()
        allow_past = torch.zeros(q, past, dtype=torch.bool, device=dev)
        for r, j in enumerate(starts.tolist()):
            allow_past[r, :j + 1] = True
            for slot in past_slots:
                allow_past[r, slot + r] = True
        mask = attention_mask_4d(torch.eye(q, dtype=torch.bool, device=dev), past, feat.dtype, allow_past)
        tok = greedy[(starts + d).clamp(max=n - 1)]
        feat = head(feat[None], embed(model, tok[None]), (starts + d)[None], cache, mask)[0]
        past_slots.append(past)


def depth_accuracy(head: EagleHead, model, held: SeqData, depth: int = 6, topk: int = 8, every: int = 4) -> list[list[float]]:
    """``acc[d][r]``: how often the rank-``r`` draft token at depth ``d + 1`` is the target's
    greedy token, given correct ancestors (what :func:`common.engine.tree_search.best_tree` takes).

    Chains start at every ``every``-th answer position ``j`` of each held-out sequence
    (:func:`chain_features`); depth ``d``'s label is ``greedy[j + d]``.
    """
    hits = torch.zeros(depth, topk)
    counts = torch.zeros(depth)
    dev = model.device
    for k, i in held.examples():
        f, ids, _ = held.batch([(k, i)], 10 ** 9, dev)
        n, start = ids.shape[1], int(held.shards[k].starts[i])
        greedy = model.lm_head(f[0]).argmax(-1)  # [n]: greedy[i] is the target's token at i + 1
        starts = torch.arange(max(start - 2, 0), n - 1, every, device=dev)
        for d, feat in chain_features(head, model, f, ids, greedy, starts, depth):
            label_at = starts + d
            ok = label_at <= n - 1
            if not ok.any():
                break
            top = model.lm_head(feat).topk(topk, dim=-1).indices  # [q, topk]
            lab = greedy[label_at.clamp(max=n - 1)]
            hits[d - 1] += ((top == lab[:, None]) & ok[:, None]).float().sum(0)
            counts[d - 1] += ok.sum()
    return (hits / counts.clamp(min=1)[:, None]).tolist()


def save_trees(out_dir: Path, acc: list[list[float]]) -> dict:
    """The best static tree of each size in :data:`TREE_SIZES` for these accuracies
    (``tree_{n}.json`` beside the head); returns their expected accepted lengths."""
    from ..engine.tree import save_tree
    from ..engine.tree_search import best_tree, expected_accept_length

    out = {}
    for n in TREE_SIZES:
        paths = best_tree(acc, n)
        out[n] = expected_accept_length(paths, acc)
        save_tree(Path(out_dir) / f"tree_{n}.json", paths, expected_accept_length=out[n], acc=acc)
    return out


def train_head(model, teacher: dict, out_dir: Path, cfg, stop, max_len: int = 384, w_cls: float = 0.1,
               noise: float = 0.1) -> dict:
    """Train a head on a teacher cache (``teacher``: what :func:`common.training.teacher.load_or_build`
    returns); writes ``out_dir/head.pt``, ``curve.jsonl`` and returns the stats."""
    from ..records import write_json
    from ..training.loop import chosen_row, train

    out_dir = Path(out_dir)
    train_data, held = from_teacher(teacher["train"]), from_teacher(teacher["heldout"])
    examples = train_data.examples()
    model.requires_grad_(False)
    torch.manual_seed(cfg.seed)
    with torch.device(model.device):
        head = EagleHead(model).to(model.dtype)

    def loss_fn(module, batch):
        f, ids, mask = train_data.batch(batch, max_len, model.device)
        return eagle_loss(module, model, f, ids, mask, w_cls, noise)[0]

    answer_tokens = sum(s.answer_tokens for s in train_data.shards)
    meta = {**head_meta(model), "teacher": teacher["key"], "answer_tokens": answer_tokens, "max_len": max_len,
            "w_cls": w_cls, "noise": noise}
    log = train(head, examples, loss_fn, cfg, out_dir / CHECKPOINT, out_dir / "train_log.jsonl", meta,
                desc="eagle head",
                evaluate=lambda m: evaluate(m, model, held, max_len, w_cls=w_cls), stop=stop,
                curve_path=out_dir / "curve.jsonl")
    from ..checkpoints import read_trained
    state = read_trained(out_dir / CHECKPOINT)
    head.eval()
    with torch.inference_mode():
        acc = depth_accuracy(head, model, held)
    trees = save_trees(out_dir, acc)
    # the draft vocabulary (the ``vocab`` option): answer tokens by frequency in the training shards
    write_draft_vocab(out_dir, *frequency_order((sh.tokens[sh.offsets[i] + sh.starts[i]:sh.offsets[i + 1]]
                                                for sh in train_data.shards for i in range(len(sh))),
                                               model.config.vocab_size))
    stats = {"component": "eagle_head", **meta, "sequences": len(examples), "steps": len(log),
             "train_wall_s": round(state.get("wall_s", 0.0), 1), **cost_fields(teacher),
             "corpus": teacher.get("corpus"),
             "stopped": state.get("stopped"), "chosen_step": state.get("chosen_step", state.get("step")),
             "final": chosen_row(state),
             "params": sum(p.numel() for p in head.parameters()), "depth_acc_top1": [a[0] for a in acc],
             "tree_expected_accept_length": trees}
    write_json(out_dir / "stats.json", stats)
    return stats


def _main(argv=None) -> None:
    from ..training import teacher as teacher_cache
    from ..training.cli import component_main

    def add_args(ap):
        ap.add_argument("--head-max-len", type=int, default=384, help="positions per training sequence (its end kept)")
        ap.add_argument("--w-cls", type=float, default=0.1)
        ap.add_argument("--noise", type=float, default=0.1)

    def check_args(a):
        check_range("--head-max-len", a.head_max_len, 3)

    def run(a, model, tok, data, cfg, stop):
        stats = train_head(model, data, a.out, cfg, stop, a.head_max_len, a.w_cls, a.noise)
        stats["threads"] = torch.get_num_threads()
        if a.curve_out:
            import shutil
            Path(a.curve_out).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(Path(a.out) / "curve.jsonl", a.curve_out)
        return stats

    component_main("train EAGLE's draft head on the teacher cache", add_args, run,
                   (teacher_cache.add_args, teacher_cache.from_args, teacher_cache.check_args), argv, lr=3e-4, batch_size=4, eval_every=200,
                   check_args=check_args)


if __name__ == "__main__":
    from ..errors import cli_main
    cli_main(_main)
