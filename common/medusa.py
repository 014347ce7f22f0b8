"""Medusa-1 heads (Cai et al., 2024): the common baseline of prompt decoding and FIRP.

Head ``k`` (0-based) reads the base model's last hidden state at position ``t`` (after the
final norm) and predicts token ``t + k + 2`` (the base LM head predicts ``t + 1``). Each head
is a residual SiLU block (zero-initialized, so it starts as the identity) followed by its own
vocabulary projection initialized from the base LM head. The base model stays frozen;
heads train on the base model's own greedy outputs (:mod:`common.selfdistill`).

    python -m common.medusa --model smollm2-135m-instruct --out .cache/medusa/embedded
        [--heads 4 --prompts 96 --answer-tokens 128 --epochs 2 --lr 1e-3]

writes ``heads.pt`` (checkpoint), ``stats.json`` (top-k accuracy per head and rank on held-out
answers, training wall time, parameter count) and ``tree_16.json``, ``tree_32.json``,
``tree_63.json`` (best sparse trees for those accuracies, :mod:`common.tree_search`).
Decoder ``medusa`` verifies the heads' candidates with the tree loop.
"""
from __future__ import annotations

import json
import time
from pathlib import Path

import torch
from torch import nn

from .decoders.base import Option
from .decoders.tree_loop import Proposal, Proposer, ProposerState, TreeDecoder, candidates_from_topk
from .errors import UserError, check_range, cli_main
from .training import TrainConfig, fingerprint, load_trained, read_trained, save_trained, train
from .tree import chain_paths, load_tree, save_tree
from .tree_search import best_tree, expected_accept_length

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

    def head_logits(self, k: int, h: torch.Tensor) -> torch.Tensor:
        """Head ``k`` alone: ``[..., H] -> [..., V]``."""
        x = self.blocks[k](h)
        return nn.functional.linear(x, self.shared_weight) if self.out is None else self.out[k](x)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        if self.out is None:  # one product for all heads
            return nn.functional.linear(torch.stack([b(h) for b in self.blocks]), self.shared_weight)
        return torch.stack([o(b(h)) for b, o in zip(self.blocks, self.out)])


@torch.inference_mode()
def features(model, corpus: list[dict]) -> list[dict]:
    """Frozen forward over each sequence: final normed hidden states ``[T, H]`` and ids ``[T]``."""
    out = []
    for ex in corpus:
        ids = torch.tensor([ex["ids"]], device=model.device)
        h = model(input_ids=ids, output_hidden_states=True, logits_to_keep=1).hidden_states[-1][0]
        out.append({"h": h.clone(), "ids": ids[0], "start": ex["start"]})
    return out


def _pairs(ex: dict, k: int):
    """(hidden rows, targets) for head k over the answer: position t predicts ids[t + k + 2]."""
    t0, T = ex["start"] - 1, ex["ids"].numel()
    if T - k - 2 <= t0:
        return None
    return ex["h"][t0:T - k - 2], ex["ids"][t0 + k + 2:]


def loss_fn(heads: MedusaHeads, batch: list[dict]) -> torch.Tensor:
    """Sum over heads of 0.8^k-weighted cross-entropy (Medusa's head weighting)."""
    total = 0.0
    for k in range(len(heads.blocks)):
        pairs = [p for p in (_pairs(ex, k) for ex in batch) if p is not None]
        if not pairs:
            continue
        h = torch.cat([p[0] for p in pairs])
        y = torch.cat([p[1] for p in pairs])
        total = total + 0.8 ** k * nn.functional.cross_entropy(heads.head_logits(k, h), y)
    return total


@torch.inference_mode()
def topk_accuracy(heads: MedusaHeads, feats: list[dict], topk: int = TOPK) -> list[list[float]]:
    """``acc[k][r]``: how often head k's rank-r candidate is the base model's token."""
    acc = []
    for k in range(len(heads.blocks)):
        hits, n = torch.zeros(topk, device=heads.blocks[0].linear.weight.device), 0
        for ex in feats:
            p = _pairs(ex, k)
            if p is None:
                continue
            ranks = heads.head_logits(k, p[0]).topk(topk, dim=-1).indices
            hits += (ranks == p[1][:, None]).float().sum(0)
            n += p[1].numel()
        acc.append((hits / max(n, 1)).tolist())
    return acc


def train_heads(model, corpus: list[dict], out_dir: Path, n_heads: int = 4, holdout: int = 16,
                cfg: TrainConfig = TrainConfig(), share_lm_head: bool = False) -> dict:
    """Train heads on ``corpus`` (:mod:`common.selfdistill` format) minus the last ``holdout``
    sequences, measure top-k accuracies on those, build trees; returns and saves stats."""
    out_dir = Path(out_dir)
    check_range("holdout", holdout, 1, len(corpus) - 1)
    t0 = time.perf_counter()
    feats = features(model, corpus)
    train_feats, held = feats[:-holdout], feats[-holdout:]
    heads = new_heads(model, n_heads, share_lm_head)
    meta = heads_meta(model, n_heads, share_lm_head)
    log = train(heads, train_feats, loss_fn, cfg, out_dir / "heads.pt", out_dir / "train_log.jsonl",
                meta=meta, desc="medusa heads")
    acc = topk_accuracy(heads, held)
    stats = {"accuracy": acc, "train_wall_s": time.perf_counter() - t0, "meta": meta,
             "params": sum(p.numel() for p in heads.parameters()), "final_loss": log[-1]["loss"],
             "train_sequences": len(train_feats), "holdout_sequences": len(held), "trees": {}}
    for n in TREE_SIZES:
        paths = best_tree(acc, n)
        stats["trees"][n] = expected_accept_length(paths, acc)
        save_tree(out_dir / f"tree_{n}.json", paths, expected_accept_length=stats["trees"][n],
                  source="medusa top-k accuracy on held-out self-distilled answers")
    (out_dir / "stats.json").write_text(json.dumps(stats, indent=1))
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


class MedusaProposer(Proposer):
    """Candidates: the heads' top-k at each depth below the root, arranged as the tree."""

    needs_hidden = True

    def __init__(self, heads: MedusaHeads, tree):
        self.heads, self.tree = heads, tree
        self.width = int(tree.rank.max()) + 1

    def propose(self, state: ProposerState) -> Proposal:
        logits = self.heads(state.hidden[0, -1])  # [K, V]: depth k+1 below the root
        topk = logits[: self.tree.max_depth].topk(self.width, dim=-1).indices
        return Proposal(self.tree, candidates_from_topk(self.tree, topk))


class Medusa(TreeDecoder):
    """Decoder ``medusa``: heads from ``heads`` (a folder written by :func:`train_heads`),
    tree ``tree`` = one of 16/32/63 (the stored best tree) or a tree JSON path."""

    name = "medusa"
    default_sampling = "typical"

    @classmethod
    def options(cls) -> dict:
        return {**super().options(), "heads": Option(None, (str, Path)),
                "tree": Option(63, (int, str, Path), check=_check_tree)}

    @classmethod
    def test_configs(cls, model, workdir):
        """Random (untrained) heads: exactness must not depend on what the heads propose."""
        out = []
        for shared in (True, False):
            folder = Path(workdir) / f"medusa_{'shared' if shared else 'own'}"
            heads = new_heads(model, 3, shared)
            with torch.no_grad():
                for b in heads.blocks:  # untrained blocks are the identity; make them propose
                    b.linear.weight.normal_(0, 0.5, generator=torch.Generator(device="cpu").manual_seed(3))
            save_trained(heads, folder / "heads.pt", heads_meta(model, 3, shared))
            save_tree(folder / "tree.json", [(0,), (1,), (0, 0), (0, 1), (1, 0), (0, 0, 0), *chain_paths(3)])
            out.append({"heads": str(folder), "tree": str(folder / "tree.json")})
        return out

    def __init__(self, model, tokenizer=None, **cfg):
        super().__init__(model, tokenizer, **cfg)
        folder = self.cfg["heads"]
        if folder is None:
            raise UserError("decoder 'medusa' needs heads=<folder with heads.pt> (train: python -m common.medusa)")
        folder = Path(folder)
        state = read_trained(folder / "heads.pt", hint="train Medusa heads first (python -m common.medusa)")
        meta = state["identity"]["meta"]
        n_heads, shared = int(meta.get("n_heads", 0)), bool(meta.get("share_lm_head", False))
        if meta != heads_meta(model, n_heads, shared):
            raise UserError(f"Medusa heads at {folder} were trained for {meta}, not {heads_meta(model, n_heads, shared)}")
        self.heads = new_heads(model, n_heads, shared)
        load_trained(self.heads, state)
        t = self.cfg["tree"]
        self.tree = load_tree(folder / f"tree_{t}.json" if isinstance(t, int) else t).to(self.device)
        if self.tree.max_depth > n_heads:
            raise UserError(f"tree depth {self.tree.max_depth} exceeds the {n_heads} Medusa heads")

    def make_proposer(self, input_ids):
        return MedusaProposer(self.heads, self.tree)


def _check_tree(value) -> None:
    if isinstance(value, int) and value not in TREE_SIZES:
        raise UserError(f"tree={value} is not a stored tree size; valid: {', '.join(map(str, TREE_SIZES))} "
                        "or a tree JSON file")


def _main(argv=None) -> None:
    from .selfdistill import component_main

    def add_args(ap):
        ap.add_argument("--heads", type=int, default=4)
        ap.add_argument("--holdout", type=int, default=16)
        ap.add_argument("--share-lm-head", action="store_true",
                        help="project every head through the base model's frozen LM head (train the blocks only)")

    def run(a, model, tok, corpus, cfg):
        stats = train_heads(model, corpus, a.out, a.heads, a.holdout, cfg, a.share_lm_head)
        print("top-1 accuracy per head:", [round(r[0], 3) for r in stats["accuracy"]])
        return stats

    component_main("train Medusa-1 heads on self-distilled ShareGPT answers", add_args, run, argv, epochs=2)


if __name__ == "__main__":
    cli_main(_main)
