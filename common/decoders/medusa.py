"""Decoder ``medusa`` (Cai et al., 2024): the heads' top-k candidates verified as a tree.

The heads, their training and their best sparse trees are :mod:`common.components.medusa_heads`'s; this module
only proposes from them (:class:`MedusaProposer`) and runs the tree loop.
"""
from __future__ import annotations

from pathlib import Path

import torch

from ..checkpoints import load_trained, save_trained
from ..errors import UserError
from ..components.medusa_heads import TREE_SIZES, MedusaHeads, heads_meta, new_heads
from ..components.reduced_head import reduced_readout, write_draft_vocab
from ..engine.tree import TreeBuffers, build_tree, chain_paths, resolve_tree, save_tree
from .base import Option
from .tree_loop import Proposal, Proposer, ProposerState, TreeDecoder, candidates_from_topk, tree_option


class MedusaProposer(Proposer):
    """Candidates: the heads' top-k at each depth below the root, arranged as the tree.

    ``readout``: a :class:`common.components.reduced_head.ReducedHead` (the ``vocab`` option) ranks only its
    kept tokens; ``None`` ranks the whole vocabulary. The loop's propose time is reported as
    ``draft_forward_s`` too: the heads' blocks and their read through the LM head are the draft's work.
    """

    needs_hidden = True

    def __init__(self, heads: MedusaHeads, tree, readout=None, device=None):
        self.heads, self.tree, self.readout = heads, tree, readout
        self.width = int(tree.rank.max()) + 1
        self.device = device if device is not None else next(heads.parameters()).device
        self.draft_forwards = 0
        self._cuts: dict[int, TreeBuffers] = {}

    def propose(self, state: ProposerState) -> Proposal:
        tree = self.tree if self.tree.max_depth < state.remaining else self._cut(state.remaining - 1)
        depth = tree.max_depth
        if depth == 0:  # the step's own token is the last one allowed
            return Proposal(tree, torch.zeros(0, dtype=torch.long, device=self.device))
        h = state.hidden[0, -1]  # [H]: the root's final state
        if self.readout is None:
            topk = self.heads(h)[:depth].topk(self.width, dim=-1).indices  # [depth, width] of [K, V]
        else:  # the kept tokens' scores alone ([depth, k]), mapped back to token ids
            topk = self.readout.topk(self.heads.features(h)[:depth], self.width)[1]
        self.draft_forwards += 1
        return Proposal(tree, candidates_from_topk(tree, topk))

    def _cut(self, depth: int) -> TreeBuffers:
        """The tree without its nodes deeper than ``depth`` (the last steps of a budget), built
        once per depth."""
        if depth not in self._cuts:
            self._cuts[depth] = build_tree([p for p in self.tree.paths if len(p) <= depth]).to(self.device)
        return self._cuts[depth]

    def stats(self) -> dict:
        return {"draft_forwards": self.draft_forwards}

    def propose_fields(self, propose_s: list[float]) -> dict:
        return {"draft_forward_s": sum(propose_s)}


class Medusa(TreeDecoder):
    """Decoder ``medusa``: heads from ``heads`` (a folder written by :func:`train_heads`),
    tree ``tree`` = one of 16/32/63 (the stored best tree) or a tree JSON path."""

    name = "medusa"
    # the heads' top-k tree is fixed before verification (no per-node draws): target_sampling is
    # exact for it; Medusa's own typical acceptance (lossy) is kept by name
    default_sampling = "target_sampling"

    @classmethod
    def options(cls) -> dict:
        return {**super().options(), "heads": Option(None, (str, Path)),
                "tree": tree_option(63, sizes=TREE_SIZES),
                # beyond Medusa-1 (FR-Spec's frequency-ranked draft vocabulary, as EAGLE's option of
                # the same name): shared heads rank only the ``vocab`` most frequent answer tokens
                # of their training data, so each step reads that slice of the LM head, not all of it
                "vocab": Option(None, (int,), lo=1)}

    @classmethod
    def test_configs(cls, model, workdir):
        """Random (untrained) heads: exactness must not depend on what the heads propose."""
        out = []
        for shared in (True, False):
            folder = Path(workdir) / f"medusa_{'shared' if shared else 'own'}"
            heads = new_heads(model, 3, shared)
            with torch.no_grad():
                for b in heads.blocks:  # untrained blocks are the identity; make them propose
                    w = b.linear.weight  # drawn on the CPU: the same heads on every device
                    w.copy_(torch.randn(w.shape, generator=torch.Generator().manual_seed(3)) * 0.5)
            save_trained(heads, folder / "heads.pt", heads_meta(model, 3, shared))
            save_tree(folder / "tree.json", [(0,), (1,), (0, 0), (0, 1), (1, 0), (0, 0, 0), *chain_paths(3)])
            out.append({"heads": str(folder), "tree": str(folder / "tree.json")})
        # a random draft vocabulary: the 20 it keeps need not hold the greedy token
        write_draft_vocab(out[0]["heads"], torch.randperm(model.config.vocab_size,
                                                          generator=torch.Generator().manual_seed(0)))
        return [*out, {**out[0], "vocab": 20}]

    def __init__(self, model, tokenizer=None, **cfg):
        super().__init__(model, tokenizer, **cfg)
        def meta_for(meta):  # labels and train_vocab say how they were trained, not for which model
            if "input_layers" in meta:
                raise UserError(f"heads at {self.cfg['heads']} read layers {meta['input_layers']} (early-exit "
                                "heads), not the last hidden state; valid: heads trained on the last hidden state "
                                "(python -m common.components.medusa_heads without layers)")
            return {**heads_meta(model, int(meta.get("n_heads", 0)), bool(meta.get("share_lm_head", False))),
                    **{k: meta[k] for k in ("labels", "train_vocab") if k in meta}}
        folder, state = self.trained_component("heads", "heads.pt", "python -m common.components.medusa_heads", meta_for)
        meta = state["identity"]["meta"]
        n_heads, shared = int(meta["n_heads"]), bool(meta["share_lm_head"])
        self.heads = new_heads(model, n_heads, shared)
        load_trained(self.heads, state)
        self.heads.for_decoding(model)
        paths = resolve_tree(self.cfg["tree"], n_heads, f"the {n_heads} Medusa heads", stored=folder)
        self.tree = build_tree(paths).to(self.device)
        self.readout = None
        if self.cfg["vocab"] is not None:
            if not shared:
                raise UserError(f"vocab={self.cfg['vocab']} needs heads that share the base model's LM head; "
                                f"those at {folder} have their own; valid: vocab=null")
            self.readout = reduced_readout(model, folder, self.cfg["vocab"])
            width = int(self.tree.rank.max()) + 1
            if self.cfg["vocab"] < width:
                raise UserError(f"vocab={self.cfg['vocab']} is smaller than the tree's {width} candidates "
                                f"a depth; valid: vocab >= {width}")

    def make_proposer(self, input_ids):
        return MedusaProposer(self.heads, self.tree, self.readout, self.device)
