"""FIRP on the shared tree loop: decoder ``firp``.

Each step is one target forward (:meth:`common.engine.target.Target.verify`) over the candidate tree
(the root and the candidates the previous step's pseudo states guessed) and, for every tree
node, ``K`` pseudo states: step ``i`` enters at layer ``t_i`` as an
:class:`common.engine.forward.Injection` whose states are computed inside the forward from the node's
own real state there (``W_i h + b_i``). Node ``c``'s step-``i`` pseudo state sits at ``c``'s
position + ``i`` and attends to ``c``, its ancestors, its own earlier pseudo states (unless
``mask_earlier``) and itself; tree nodes never attend to pseudo states, so greedy acceptance is
exact. The accepted node's pseudo states give the next step's guesses (the LM head is applied
to those ``K`` rows only); every pseudo position leaves the cache with the rejected nodes.
"""
from __future__ import annotations

from pathlib import Path

import torch

from common.decoders.base import Option
from common.decoders.tree_loop import (Proposal, Proposer, ProposerState, StepResult, TreeDecoder,
                                       candidates_from_topk, tree_option)
from common.errors import UserError
from common.engine.forward import Injection, num_layers
from common.training.loop import fingerprint, load_trained, save_trained
from common.engine.tree import TreeBuffers, build_tree, resolve_tree
from common.engine.tree_search import PRIOR_ACC, best_tree

from .maps import FirpMaps



def maps_meta(model, layers: list[int]) -> dict:
    return {**fingerprint(model), "layers": list(layers)}


def trained_meta(model, meta: dict) -> dict:
    """The meta a checkpoint's maps must carry to belong to ``model`` (``meta``: the stored
    one; its ``mask_earlier`` says how the maps were trained (Figure 7), not which model)."""
    return {**maps_meta(model, list(meta.get("layers", []))),
            **({"mask_earlier": meta["mask_earlier"]} if "mask_earlier" in meta else {})}


def new_maps(model, layers: list[int]) -> FirpMaps:
    with torch.device("cpu"):
        maps = FirpMaps(model.config.hidden_size, layers, num_layers(model))
    return maps.to(model.device, model.dtype)


def default_layers(model, steps: int = 3) -> list[int]:
    """The paper's prediction layers at the same fractions of depth (15/20/25 of 32 for the 7B
    model: 14/19/23 of SmolLM2's 30), rounded and kept strictly increasing."""
    d = num_layers(model)
    out = []
    for i in range(steps):
        layer = min(d - 1, max(1, round(d * (15 + 5 * i) / 32)))
        out.append(max(layer, out[-1] + 1) if out else layer)
    if out[-1] >= d:  # a shallow model: the last layers below the top, one per step
        if d - steps < 1:
            raise UserError(f"{steps} prediction steps do not fit a {d}-layer model; valid: steps <= {d - 1}")
        out = list(range(d - steps, d))
    return out


def pseudo_injections(tree: TreeBuffers, maps: FirpMaps, past: int, mask_earlier: bool = False) -> list[Injection]:
    """The ``K`` pseudo-state injections of every tree node (one per step, ``N`` positions each,
    in node order): see the module docstring. ``mask_earlier`` hides each step's earlier
    pseudo states from it (Figure 7's masked variant)."""
    N, dev = tree.size, tree.device
    out = []
    for i, layer in enumerate(maps.layers):
        present = N * (i + 1)                                   # nodes + earlier steps' blocks, at layer t_i
        allow = torch.zeros(N, present + N, dtype=torch.bool, device=dev)
        allow[:, :N] = tree.ancestor_mask                       # the real context up to the anchor
        if not mask_earlier:
            for j in range(i):                                  # its own earlier pseudo states
                allow[:, N * (j + 1):N * (j + 2)] = torch.eye(N, dtype=torch.bool, device=dev)
        allow[:, present:] = torch.eye(N, dtype=torch.bool, device=dev)
        out.append(Injection(layer, lambda h, i=i: maps(i, h[:N]), past + tree.depth + 1 + i, allow))
    return out


class FirpProposer(Proposer):
    """Candidates from the accepted node's pseudo states of the previous step."""

    def __init__(self, target, maps: FirpMaps, paths: tuple, device, mask_earlier: bool):
        self.target, self.maps, self.device, self.mask_earlier = target, maps, device, mask_earlier
        self.trees = {k: build_tree([p for p in paths if len(p) <= k]).to(device) for k in range(maps.steps + 1)}
        self.width = max((r for p in paths for r in p), default=0) + 1
        self.guesses: torch.Tensor | None = None
        self.size = 0

    def propose(self, state: ProposerState) -> Proposal:
        depth = 0 if self.guesses is None else min(self.guesses.shape[0], max(state.remaining - 1, 0))
        tree = self.trees[depth]
        tokens = (candidates_from_topk(tree, self.guesses[:, :self.width]) if tree.size > 1
                  else torch.zeros(0, dtype=torch.long, device=self.device))
        self.size = tree.size
        return Proposal(tree, tokens, injections=pseudo_injections(tree, self.maps, self.target.length, self.mask_earlier))

    def update(self, result: StepResult) -> None:
        last, N = int(result.path[-1]), self.size
        rows = [last + N * i for i in range(self.maps.steps)]
        logits = self.target.model.lm_head(result.verified.extra_hidden[rows])   # [K, V]
        self.guesses = logits.topk(self.width, dim=-1).indices


class Firp(TreeDecoder):
    """Decoder ``firp``: maps from ``maps`` (a folder written by the training, ``maps.pt``),
    tree ``tree`` (nodes, the best static tree for the checkpoint's measured step accuracies,
    a prior when it has none; or a tree file)."""

    name = "firp"
    # the predicted states' top-k tree is fixed before verification: target_sampling is exact;
    # typical (lossy) by name only
    default_sampling = "target_sampling"

    @classmethod
    def options(cls) -> dict:
        return {**super().options(), "maps": Option(None, (str, Path)),
                "tree": tree_option(16, 1, 256, "nodes (16, 32, 63 as in the paper)"),
                # None: as the maps were trained (their checkpoint says; unmasked if it does not)
                "mask_earlier": Option(None, (bool,))}

    @classmethod
    def test_configs(cls, model, workdir):
        """Random maps (identity plus noise, so they sway the guesses): exactness must not
        depend on what the pseudo states propose."""
        out = []
        for steps in (3, 1):
            folder = Path(workdir) / f"firp_{steps}"
            layers = default_layers(model, steps)
            maps = new_maps(model, layers)
            with torch.no_grad():
                for lin in maps.maps:
                    noise = torch.randn(lin.weight.shape, generator=torch.Generator().manual_seed(steps)) * 0.5
                    lin.weight.add_(noise.to(lin.weight))  # drawn on the CPU: the same maps on every device
            save_trained(maps, folder / "maps.pt", maps_meta(model, layers))
            out.append({"maps": str(folder), "tree": 12})
        out.append({**out[0], "mask_earlier": True})
        return out

    def __init__(self, model, tokenizer=None, **cfg):
        super().__init__(model, tokenizer, **cfg)
        _, state = self.trained_component("maps", "maps.pt", "python -m firp.train",
                                          lambda meta: trained_meta(model, meta))
        meta = state["identity"]["meta"]
        self.maps = new_maps(model, meta["layers"])
        self.mask_earlier = bool(meta.get("mask_earlier", False) if self.cfg["mask_earlier"] is None
                                 else self.cfg["mask_earlier"])
        load_trained(self.maps, state)
        tree = resolve_tree(self.cfg["tree"], self.maps.steps, f"the {self.maps.steps} prediction steps")
        if isinstance(tree, int):  # a size: the best tree for the measured step accuracies
            acc = state.get("acc") or PRIOR_ACC
            tree = tuple(best_tree(acc[:self.maps.steps], tree))
        self.paths = tree

    def make_proposer(self, input_ids):
        return FirpProposer(self.target, self.maps, self.paths, self.device, self.mask_earlier)
