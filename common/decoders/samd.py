"""Decoder ``samd``: SAM-Decoding's switch (Hu et al., 2025, arXiv 2411.10666, "SAMD") between
the suffix automata's chain and the EAGLE head's tree, on the shared tree loop.

Each step the automata (:mod:`common.decoders.suffix`) find their longest suffix match; if it
is ``threshold`` tokens or longer the step verifies its continuation, else the EAGLE head's
tree (:mod:`common.decoders.eagle`, static or dynamic), as the authors' ``DraftModel.lookup``
does with its auxiliary drafter. The paper's threshold is 5 (the default here); the authors'
code ships 4 (``samd_config.py``).

The EAGLE head drafts from the target's features of every committed position; steps the
automaton serves do not run it, so their features wait and enter the head's cache together at
its next step (the same positions, fed late: nothing is lost, and a run of retrieval steps costs
no draft forward). Greedy acceptance: exactly vanilla's tokens. Stats: the suffix decoder's,
the EAGLE proposer's and ``samd_eagle`` per step (1 where EAGLE's tree was verified).
"""
from __future__ import annotations

from dataclasses import replace

import torch

from .base import Option
from .eagle import Eagle, EagleProposer
from .suffix import SuffixProposer, static_for, suffix_proposer, suffix_options, suffix_test_datastore
from .tree_loop import Proposal, Proposer, ProposerState


class SamdProposer(Proposer):
    """The automata's continuation when the match is long enough, else the EAGLE tree."""

    needs_hidden = True

    def __init__(self, suffix: SuffixProposer, eagle: EagleProposer, threshold: int):
        self.suffix, self.eagle, self.threshold = suffix, eagle, threshold
        self.pending: torch.Tensor | None = None   # [1, k, H] features the head has not seen
        self.used_eagle: list[int] = []

    def propose(self, state: ProposerState) -> Proposal:
        self.pending = state.hidden if self.pending is None else torch.cat([self.pending, state.hidden], dim=1)
        paths, length = self.suffix.candidates(state)
        if paths and length >= self.threshold:
            self.used_eagle.append(0)
            return self.suffix.proposal(paths)
        # the pending features belong to the last k committed positions: ids[-k:] follow them
        out = self.eagle.propose(replace(state, hidden=self.pending))
        self.pending = None
        self.used_eagle.append(1)
        return out

    def stats(self) -> dict:
        return {**self.suffix.stats(), **self.eagle.stats(), "samd_eagle": self.used_eagle}


class Samd(Eagle):
    """Decoder ``samd``: EAGLE's options (``head``, ``mode``, ``tree`` / ``depth``, ``topk``,
    ``total``, ``vocab``), the suffix decoder's (``draft_len``, ``branches``, ``min_match``,
    ``datastore``, ``static_tokens``, ``len_bias``) and ``threshold``: the shortest match whose
    continuation is verified instead of EAGLE's tree."""

    name = "samd"
    # the retrieved chains carry no draft distribution, so EAGLE's tree_speculative is out;
    # target_sampling is exact for both sources' trees
    acceptance_rules = ("greedy", "target_sampling")
    default_sampling = "target_sampling"

    @classmethod
    def options(cls) -> dict:
        return {**super().options(), **suffix_options(), "threshold": Option(5, (int,), lo=1, hi=256)}

    @classmethod
    def test_configs(cls, model, workdir):
        """EAGLE's random head; thresholds low enough that both sources serve steps."""
        static, dynamic = Eagle.test_configs(model, workdir)[:2]
        return [{**static, "threshold": 2}, {**dynamic, "threshold": 1, "branches": 2},
                {**static, "threshold": 3, "datastore": suffix_test_datastore(model, workdir), "len_bias": 0}]

    def __init__(self, model, tokenizer=None, **cfg):
        super().__init__(model, tokenizer, **cfg)
        self.static = static_for(self)

    def make_proposer(self, input_ids):
        return SamdProposer(suffix_proposer(self, input_ids), super().make_proposer(input_ids), self.cfg["threshold"])
