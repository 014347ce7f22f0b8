"""Decoder ``eagle`` (Li et al., 2024): a one-layer draft head that extrapolates the target's
features, verified on the shared tree loop; EAGLE-1's static tree and EAGLE-2's dynamic tree.

The draft head (:class:`common.components.eagle_head.EagleHead`, with its trainer) reads, at position ``j``, the target's final feature
``h_j`` (after the final norm: the LM head's input) and the embedding of token ``x_{j+1}``:
``fc([emb(x_{j+1}); h_j])`` (2d -> d) goes through one decoder layer of the target's own
architecture (its input norm dropped, as in EAGLE) and predicts ``h_{j+1}``; tokens are read
through the target's frozen LM head. The head keeps its own small KV cache of the committed
sequence; drafting appends tree nodes to it and is cropped back after each step.

Each step, the proposer first catches up on the features the last target forward produced
(the prompt after the prefill, the accepted path after a step: ``ProposerState.hidden``) paired
with the tokens that follow them, then expands a tree below the root, one draft forward per
depth over that depth's nodes (each attends to the committed sequence and its own ancestors):

* ``mode=static`` (EAGLE-1): a fixed tree of top-k ranks (``tree``: a stored size or a tree
  JSON file), the node at path ``(r_1, .., r_d)`` taking the ``r_d``-th token of its parent's
  draft distribution.
* ``mode=dynamic`` (EAGLE-2): at each of ``depth`` steps, the ``topk`` frontier nodes with the
  highest path probability (the product of draft probabilities along the path) are expanded
  by their ``topk`` children; all candidates are then reranked by path probability and the
  best ``total`` kept (ancestors always rank above their descendants, so the kept set is a
  tree).

Verification is the target's, so the output is exactly greedy's whatever the head proposes
(the lossless test runs it with a random head). At temperature > 0 the static tree is drawn
instead: each node's children are drawn without replacement (Gumbel-top-k, the decoder's
generator) from the head's processed distribution, reported as the proposal's
``draft_probs``, and verified by ``tree_speculative`` (EAGLE's multi-round rejection sampling,
exact). The dynamic tree's shape depends on the scores it reranks, which the rule's
without-replacement argument does not cover, so it is verified by ``target_sampling`` (exact
for any tree).
"""
from __future__ import annotations

from pathlib import Path

import torch

from ..engine import acceptance as acc
from ..engine.cache import crop_to
from ..checkpoints import load_trained, save_trained
from ..components.eagle_head import CHECKPOINT, EagleHead, head_meta, new_head
from ..errors import UserError
from ..engine.fast import pack_like
from ..engine.forward import attention_mask_4d, causal_allow, embed
from ..components.reduced_head import ReducedHead, reduced_readout, write_draft_vocab
from ..engine.tree import build_tree, load_tree, save_tree
from .base import Option
from .tree_loop import Proposal, Proposer, ProposerState, TreeDecoder, chain_tree, tree_option




def stored_tree(folder: Path, tree, device):
    """A static tree option: a size (the head folder's ``tree_<size>.json``) or a tree file;
    a size the folder does not store is one error naming the stored ones."""
    path = folder / f"tree_{tree}.json" if isinstance(tree, int) else Path(tree)
    if isinstance(tree, int) and not path.is_file():
        stored = sorted(p.stem.split("_")[1] for p in folder.glob("tree_*.json"))
        raise UserError(f"tree={tree}: {folder} has no stored tree of that size; valid: "
                        f"{', '.join(stored) or 'none stored'}, or a tree JSON file")
    return load_tree(path).to(device)

class EagleProposer(Proposer):
    """EAGLE's drafting: catch up on the committed features, then expand a static or dynamic tree."""

    needs_hidden = True

    def __init__(self, head: EagleHead, model, mode: str, tree=None, depth: int = 5, topk: int = 8,
                 total: int = 48, readout=None):
        self.head, self.model, self.mode = head, model, mode
        self.readout = readout if readout is not None else model.lm_head
        self.tree, self.depth, self.topk, self.total = tree, depth, topk, total
        self.cache = head.new_cache()
        self.length = 0  # committed pairs (h_j, x_{j+1}) in the head's cache
        self.draft_forwards = 0
        self.device = model.device

    # one draft forward over q nodes; ``past_allow``: [q, past] which cached slots each sees
    def _draft(self, feats, tokens, positions, past_allow=None, allow=None):
        q = tokens.numel()
        past = self.cache.get_seq_length()
        mask = attention_mask_4d(causal_allow(q, self.device) if allow is None else allow, past,
                                 feats.dtype, past_allow)
        out = self.head(feats[None], embed(self.model, tokens[None]), positions[None], self.cache, mask)[0]
        self.draft_forwards += 1
        return out  # [q, H]

    def _top(self, feats: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The ``k`` most likely next tokens of each feature row: (log-probabilities, token ids),
        each [q, k]. A reduced readout normalizes over its kept tokens only: every other logit is
        the dtype's minimum, whose exponential is exactly 0, so the values and ids are those of the
        full-vocabulary log-softmax, for about a sixth of its work at 8,192 of 49,152 tokens.
        Its time counts as proposing (it runs inside ``propose``, which the loop times): reading
        draft tokens through the target's LM head is the draft's work, not the target's."""
        if isinstance(self.readout, ReducedHead) and k <= self.readout.keep.numel():
            v, i = self.readout.topk(feats, k, log_softmax=True)  # [q, k]
        else:
            v, i = torch.log_softmax(self.readout(feats).float(), dim=-1).topk(k, dim=-1)  # over [q, V]
        return v, i

    def _logits(self, feats: torch.Tensor) -> torch.Tensor:
        """``[q, H]`` head states -> ``[q, V]`` draft logits over the target's vocabulary (a
        reduced readout's other tokens at the dtype's minimum: probability 0)."""
        return self.readout(feats)

    def _draw(self, feats: torch.Tensor, widths: list[int], state: ProposerState) -> tuple[list[list[int]], torch.Tensor]:
        """Children drawn without replacement from each row's processed draft distribution.

        Args:
            feats: ``[q, H]`` parent states; ``widths``: children to draw for each parent.
        Returns:
            ``(tokens per parent in draw order, [q, V] the distributions they were drawn from)``.
        """
        q = state.process(self._logits(feats))                                  # [q, V]
        drawn = acc.gumbel_topk(q, max(widths), state.generator).tolist()      # [q, max width]
        return [d[:w] for d, w in zip(drawn, widths)], q

    def propose(self, state: ProposerState) -> Proposal:
        if state.remaining <= 1:  # the step's own token is the last one allowed: nothing to draft
            return Proposal(chain_tree(0, str(self.device)), torch.zeros(0, dtype=torch.long, device=self.device))
        hid = state.hidden[0]  # [k, H]: features of the last k committed positions
        k = hid.shape[0]
        follow = state.ids[0, -k:]  # the tokens after them (the last one is the root)
        crop_to(self.cache, self.length)
        pos = torch.arange(self.length, self.length + k, device=self.device)
        out = self._draft(hid, follow, pos)
        self.length += k
        root_feat = out[-1:]  # [1, H]: the root position's predicted feature
        max_depth = state.remaining - 1
        if self.mode == "static":
            return self._static(root_feat, max_depth, state if state.sample_tree else None)
        return self._dynamic(root_feat, max_depth)

    def _expand(self, frontier: list[tuple], feats: torch.Tensor, slots: dict, anc: dict, base: int):
        """Feed ``frontier`` nodes (path, token) whose parents' features are ``feats`` [q, H];
        returns their output features [q, H] and records their cache slots."""
        q = len(frontier)
        past = self.cache.get_seq_length()
        past_allow = torch.zeros(q, past, dtype=torch.bool, device=self.device)
        past_allow[:, :self.length] = True
        for i, (path, _) in enumerate(frontier):
            for a in anc[path[:-1]]:
                past_allow[i, slots[a]] = True
        tokens = torch.tensor([t for _, t in frontier], dtype=torch.long, device=self.device)
        positions = torch.tensor([base + len(p) for p, _ in frontier], device=self.device)
        out = self._draft(feats, tokens, positions, past_allow, torch.eye(q, dtype=torch.bool, device=self.device))
        for i, (path, _) in enumerate(frontier):
            slots[path] = past + i
            anc[path] = anc[path[:-1]] + [path]
        return out

    def _static(self, root_feat: torch.Tensor, max_depth: int, sampling: ProposerState | None = None) -> Proposal:
        """The static tree below the root: by rank (the ``r``-th most likely token), or with
        ``sampling`` each parent's children drawn without replacement, its ``i``-th child by
        rank taking the ``i``-th draw, and their distributions returned as ``draft_probs``."""
        tree = self.tree
        paths = [p for p in tree.paths if len(p) <= max_depth]
        by_depth: dict[int, list] = {}
        for p in paths:
            by_depth.setdefault(len(p), []).append(p)
        has_children = {p[:-1] for p in paths}
        width = {}
        for p in paths:
            width[p[:-1]] = max(width.get(p[:-1], 0), p[-1] + 1)
        token, dist = {}, {}
        feat = {(): root_feat[0]}
        slots, anc = {}, {(): []}
        base = self.length - 1  # the root's position: children at base + depth
        for d in range(1, max(by_depth) + 1):
            parents = sorted({p[:-1] for p in by_depth[d]})
            feats = torch.stack([feat[u] for u in parents])
            if sampling is None:
                tops = self._top(feats, max(width[u] for u in parents))[1].tolist()
                for u, top in zip(parents, tops):
                    for r in range(width[u]):
                        token[u + (r,)] = top[r]
            else:
                kids = {u: sorted(p for p in by_depth[d] if p[:-1] == u) for u in parents}
                drawn, q = self._draw(feats, [len(kids[u]) for u in parents], sampling)
                for u, toks, q_u in zip(parents, drawn, q):
                    for p, t in zip(kids[u], toks):
                        token[p], dist[p] = t, q_u
            grow = [p for p in by_depth[d] if p in has_children]
            if grow:
                out = self._expand([(p, token[p]) for p in grow], torch.stack([feat[p[:-1]] for p in grow]),
                                   slots, anc, base)
                for p, f in zip(grow, out):
                    feat[p] = f
        buffers = tree if len(paths) == len(tree.paths) else build_tree(paths).to(self.device)
        tokens = torch.tensor([token[p] for p in buffers.paths], dtype=torch.long, device=self.device)
        draft_probs = torch.stack([dist[p] for p in buffers.paths]) if sampling is not None else None
        return Proposal(buffers, tokens, draft_probs)

    def _dynamic(self, root_feat: torch.Tensor, max_depth: int) -> Proposal:
        k = self.topk
        val, idx = (t[0] for t in self._top(root_feat, k))
        # candidates: path -> (score, token); the frontier is expanded next
        cand = {(r,): (float(val[r]), int(idx[r])) for r in range(k)}
        frontier = [(r,) for r in range(k)]
        feat = {(): root_feat[0]}
        slots, anc = {}, {(): []}
        base = self.length - 1
        for _ in range(1, min(self.depth, max_depth)):
            out = self._expand([(p, cand[p][1]) for p in frontier], torch.stack([feat[p[:-1]] for p in frontier]),
                               slots, anc, base)
            for p, f in zip(frontier, out):
                feat[p] = f
            v, i = self._top(out, k)  # [k, k]
            scores = torch.tensor([cand[p][0] for p in frontier], device=v.device)[:, None] + v  # [k, k]
            for a, p in enumerate(frontier):
                for r in range(k):
                    cand[p + (r,)] = (float(scores[a, r]), int(i[a, r]))
            best = scores.flatten().topk(k).indices.tolist()
            frontier = [frontier[b // k] + (b % k,) for b in best]
        # rerank: a child's score never exceeds its parent's, and ties go to the shallower node,
        # so the first ``total`` candidates always include each kept node's parent
        order = sorted(cand, key=lambda p: (-cand[p][0], len(p), p))[: self.total - 1]
        buffers = build_tree(order).to(self.device)
        tokens = torch.tensor([cand[p][1] for p in buffers.paths], dtype=torch.long, device=self.device)
        return Proposal(buffers, tokens)

    def stats(self) -> dict:
        return {"draft_forwards": self.draft_forwards}

    def propose_fields(self, propose_s: list[float]) -> dict:
        # the whole propose: the head's forwards, its readout and building the tree
        return {"draft_forward_s": sum(propose_s)}


def sampling_rule_for(decoder: TreeDecoder) -> str:
    """An EAGLE decoder's rule at temperature > 0. The static tree is drawn without replacement
    from the head's distribution, which ``tree_speculative`` needs. EAGLE-2's dynamic tree keeps
    the best-scoring of its candidates, so which children a node has depends on the draws'
    scores: that rule's exactness argument does not hold for it, and ``target_sampling`` (exact
    for any tree) verifies it."""
    if decoder.cfg["mode"] == "static" and "tree_speculative" in decoder.acceptance_rules:
        return "tree_speculative"
    return decoder.default_sampling


def checked_rule(decoder: TreeDecoder, rule):
    """``rule``, refused when it is ``tree_speculative`` on a dynamic tree (see :func:`sampling_rule_for`)."""
    if rule.name == "tree_speculative" and decoder.cfg["mode"] != "static":
        raise UserError(f"decoder {decoder.name!r} with acceptance='tree_speculative' needs mode='static' (the "
                        "dynamic tree's shape depends on the drawn scores); valid: mode='static', or "
                        "acceptance='target_sampling'")
    return rule


class Eagle(TreeDecoder):
    """Decoder ``eagle``: ``head`` (a folder written by ``python -m common.components.eagle_head``), ``mode``
    static (``tree``: a stored size or a tree JSON file) or dynamic (``depth``, ``topk``,
    ``total`` nodes, root included)."""

    name = "eagle"
    acceptance_rules = ("greedy", "target_sampling", "tree_speculative", "typical")
    default_sampling = "target_sampling"  # the dynamic tree's (see sampling_rule)

    @classmethod
    def options(cls) -> dict:
        return {**super().options(), "head": Option(None, (str, Path)),
                "mode": Option("dynamic", (str,), choices=("static", "dynamic")),
                "tree": tree_option(16), "depth": Option(5, (int,), lo=1, hi=32),
                "topk": Option(8, (int,), lo=1, hi=64), "total": Option(48, (int,), lo=2, hi=512),
                # draft tokens only from the head's ``vocab`` most frequent training tokens
                # (FR-Spec / EAGLE-3's draft vocabulary; beyond EAGLE-1/2): the readout over the
                # full vocabulary is most of a drafting step's cost on a small model
                "vocab": Option(None, (int,), lo=1)}

    @classmethod
    def test_configs(cls, model, workdir):
        """A random (untrained) head: exactness must not depend on what it proposes."""
        folder = Path(workdir) / "eagle"
        torch.manual_seed(0)
        with torch.device("cpu"):  # drawn on the CPU: the same head on every device
            head = EagleHead(model)
        save_trained(head, folder / CHECKPOINT, head_meta(model))
        save_tree(folder / "tree.json", [(0,), (1,), (0, 0), (0, 1), (1, 0), (0, 0, 0), (0, 0, 0, 0)])
        write_draft_vocab(folder, torch.randperm(model.config.vocab_size, generator=torch.Generator().manual_seed(0)))
        return [{"head": str(folder), "mode": "static", "tree": str(folder / "tree.json")},
                {"head": str(folder), "mode": "dynamic", "depth": 3, "topk": 2, "total": 6, "vocab": 20},
                {"head": str(folder), "mode": "dynamic", "depth": 4, "topk": 3, "total": 9},
                {"head": str(folder), "mode": "dynamic", "depth": 1, "topk": 2, "total": 2}]

    def sampling_rule(self) -> str:
        return sampling_rule_for(self)

    def make_rule(self):
        return checked_rule(self, super().make_rule())

    def __init__(self, model, tokenizer=None, **cfg):
        super().__init__(model, tokenizer, **cfg)
        # the stored meta also says what the head was trained on; only the base model must match
        folder, state = self.trained_component("head", CHECKPOINT, "python -m common.components.eagle_head",
                                               lambda meta: {**meta, **head_meta(model)})
        self.head = new_head(model)
        load_trained(self.head, state)
        self.head.requires_grad_(False)
        pack_like(self.head, model)  # its fc and decoder layer on the target's kernels
        self.tree = None
        if self.cfg["mode"] == "static":
            self.tree = stored_tree(folder, self.cfg["tree"], self.device)

        self.readout = None
        if self.cfg["vocab"] is not None:
            self.readout = reduced_readout(self.model, folder, self.cfg["vocab"])

    def make_proposer(self, input_ids):
        c = self.cfg
        return EagleProposer(self.head, self.model, c["mode"], self.tree, c["depth"], c["topk"], c["total"],
                             self.readout)

