"""Decoder ``eagle3`` (Li et al., 2025): EAGLE-3's head drafting EAGLE-1's static or EAGLE-2's
dynamic tree, verified on the shared tree loop.

The head (:class:`common.components.eagle3_head.Eagle3Head`, with its trainer) reads the inputs of
three of the target's layers (fused by its ``fc``) where EAGLE reads the final feature, and scores
its own draft vocabulary. The tree machinery is EAGLE's (:class:`common.decoders.eagle.EagleProposer`:
the catch-up on the committed positions, the static and dynamic expansions, each node reading its
parent's output state, as the training-time test trained it); what changes:

* the committed positions' features: the fused layers' inputs, which the proposer names
  (``capture_layers``) and the tree loop keeps from the prefill and from each verification
  forward (``ProposerState.captured``: the prompt's rows, then the accepted path's), wherever the
  proposer runs (its own decoder, or a pool's);
* the readout: the head's own norm and LM head over its draft vocabulary, mapped to target ids.

Verification is the target's, so the output is exactly greedy's whatever the head proposes (the
lossless test runs it with a random head).
"""
from __future__ import annotations

import dataclasses
from pathlib import Path

import torch

from ..checkpoints import load_trained, save_trained
from ..components.eagle3_head import CHECKPOINT, Eagle3Head, check_layers_of, default_layers, head_meta, new_head
from ..engine.fast import pack_like
from ..engine.forward import num_layers
from ..engine.tree import save_tree
from ..errors import UserError
from .eagle import Eagle, EagleProposer, checked_rule, sampling_rule_for, stored_tree
from .tree_loop import Proposal, ProposerState, TreeDecoder

TRAIN_CMD = "python -m common.components.eagle3_head"


class Eagle3Proposer(EagleProposer):
    """EAGLE's tree expansion on EAGLE-3's head: fused-layer features, the head's own readout."""

    needs_hidden = False  # it reads the fused layers' inputs instead of the final states

    def __init__(self, head, model, mode: str, tree=None, depth: int = 5, topk: int = 8, total: int = 48):
        super().__init__(head, model, mode, tree, depth, topk, total)
        self.capture_layers = tuple(head.layers)

    def _top(self, feats: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The ``k`` most likely draft tokens of each ``[q, H]`` head state: (log-probabilities over
        the draft vocabulary, target token ids), each ``[q, k]``."""
        v, i = torch.log_softmax(self.head.logits(feats).float(), dim=-1).topk(k, dim=-1)
        return v, self.head.keep[i]

    def _logits(self, feats: torch.Tensor) -> torch.Tensor:
        """``[q, H]`` head states -> ``[q, V]`` logits: the draft vocabulary's, every other token
        at the dtype's minimum (probability 0)."""
        sub = self.head.logits(feats)                                              # [q, K]
        out = sub.new_full((*sub.shape[:-1], self.model.config.vocab_size), torch.finfo(sub.dtype).min)
        return out.index_copy_(-1, self.head.keep, sub)

    def propose(self, state: ProposerState) -> Proposal:
        # the last committed positions' fused layers' inputs ([k, n*H]: the prompt after the
        # prefill, then the accepted path, root first), in the order the catch-up pairs them with tokens
        fused = self.head.fuse(torch.cat([state.captured[l] for l in self.head.layers], -1))  # [k, H]
        return super().propose(dataclasses.replace(state, hidden=fused[None]))


class Eagle3(TreeDecoder):
    """Decoder ``eagle3``: ``head`` (a folder written by ``python -m common.components.eagle3_head``),
    ``mode`` static (``tree``: a stored size or a tree JSON file) or dynamic (``depth``, ``topk``,
    ``total`` nodes, root included), as :class:`~common.decoders.eagle.Eagle`'s; the draft
    vocabulary is the head's own."""

    name = "eagle3"
    # as eagle's: tree_speculative on the drawn static tree, target_sampling on the dynamic one
    acceptance_rules = Eagle.acceptance_rules
    default_sampling = Eagle.default_sampling

    def sampling_rule(self) -> str:
        return sampling_rule_for(self)

    def make_rule(self):
        return checked_rule(self, super().make_rule())

    @classmethod
    def options(cls) -> dict:
        return {k: v for k, v in Eagle.options().items() if k != "vocab"}

    @classmethod
    def test_configs(cls, model, workdir):
        """A random (untrained) head over a random draft vocabulary: exactness must not depend on
        what it proposes."""
        folder = Path(workdir) / "eagle3"
        torch.manual_seed(0)
        keep = torch.randperm(model.config.vocab_size, generator=torch.Generator().manual_seed(0))[:40].sort().values
        with torch.device("cpu"):  # drawn on the CPU: the same head on every device
            head = Eagle3Head(model, default_layers(num_layers(model)), keep)
        save_trained(head, folder / CHECKPOINT, {**head_meta(model), "fused_layers": list(head.layers)})
        save_tree(folder / "tree.json", [(0,), (1,), (0, 0), (0, 1), (1, 0), (0, 0, 0), (0, 0, 0, 0)])
        return [{"head": str(folder), "mode": "static", "tree": str(folder / "tree.json")},
                {"head": str(folder), "mode": "dynamic", "depth": 3, "topk": 2, "total": 6},
                {"head": str(folder), "mode": "dynamic", "depth": 1, "topk": 2, "total": 2}]

    def __init__(self, model, tokenizer=None, **cfg):
        super().__init__(model, tokenizer, **cfg)
        folder, state = self.trained_component("head", CHECKPOINT, TRAIN_CMD, lambda meta: {**meta, **head_meta(model)})
        meta = state["identity"]["meta"]
        if tokenizer is not None and meta.get("tokenizer_id") is not None:
            from ..training.corpus import tokenizer_identity
            if tokenizer_identity(tokenizer) != meta["tokenizer_id"]:
                raise UserError(f"head at {folder} was trained with another tokenizer (id {meta['tokenizer_id']}, "
                                f"this one {tokenizer_identity(tokenizer)}); valid: a head trained for this model")
        layers = check_layers_of(meta.get("fused_layers", ()), model)
        self.head = new_head(model, layers, torch.zeros(state["module"]["keep"].numel(), dtype=torch.long, device=model.device))
        load_trained(self.head, state)
        self.head.requires_grad_(False)
        pack_like(self.head, model)  # its fc, decoder layer and LM head on the target's kernels
        drafts = self.head.keep.numel()
        self.tree = None
        if self.cfg["mode"] == "static":
            self.tree = stored_tree(folder, self.cfg["tree"], self.device)
            width = 1 + max(p[-1] for p in self.tree.paths)
            if width > drafts:
                raise UserError(f"tree={self.cfg['tree']} drafts rank {width - 1}, beyond the head's {drafts}-token draft "
                                f"vocabulary; valid: trees of ranks below {drafts}")
        elif self.cfg["topk"] > drafts:
            raise UserError(f"topk={self.cfg['topk']} exceeds the head's {drafts}-token draft vocabulary; "
                            f"valid: 1..{drafts}")

    def make_proposer(self, input_ids):
        c = self.cfg
        return Eagle3Proposer(self.head, self.model, c["mode"], self.tree, c["depth"], c["topk"], c["total"])
