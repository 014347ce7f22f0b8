"""Decoder ``suffix``: SAM-Decoding's retrieval (Hu et al., 2025, "SAM Decoding: Speculative
Decoding via Suffix Automaton", arXiv 2411.10666) on the shared tree loop. Training-free.

Written from the paper and the authors' public code (hyx1999/SAM-Decoding: ``samd/sam/dyn_sam.py``,
``samd/draft.py``, ``samd/samd_config.py``).

**Dynamic automaton.** A suffix automaton over prompt + committed tokens
(:class:`~common.engine.suffix_automaton.DynamicMatcher`), extended by each committed token
in O(1) amortised time; it tracks the longest suffix of the text that also occurs earlier,
and its first occurrence's continuation is the draft (the authors' ``min_endpos``).

**Static automaton** (optional, ``datastore``): an automaton over the token text of REST's
datastore (:mod:`common.components.rest_datastore`), its first ``static_tokens`` tokens only (a
Python automaton holds a few hundred bytes a token: the whole 22 M-token ShareGPT datastore would
not fit; say so where it is used). The decoded text is matched against it token by token;
continuations stop at the datastore's sequence separator. As the authors' ``DraftModel.lookup``:
the static match is taken only when it beats the dynamic one by more than ``len_bias`` tokens.

**Candidates.** The chosen match's continuation (``draft_len`` tokens) as a chain; with
``branches`` > 1 also the continuations of its shorter suffixes (the suffix-link ancestors,
each a different first occurrence), merged into one trie with the chain (beyond the paper, which
drafts one chain). No match of ``min_match`` tokens or more: a root-only step.

Greedy acceptance: exactly vanilla's tokens. Stats per step: ``suffix_match`` (the chosen
match's length, 0 for none) and ``suffix_static`` (1 where the static automaton's was taken).
"""
from __future__ import annotations

from functools import lru_cache
from pathlib import Path

import numpy as np
import torch

from ..components.rest_datastore import build_datastore, open_datastore
from ..engine.suffix_automaton import DynamicMatcher, SuffixAutomaton
from ..errors import UserError
from .base import Option
from .greedy import Vanilla
from .lookahead import token_trie
from .tree_loop import Proposal, Proposer, ProposerState, TreeDecoder


@lru_cache(maxsize=4)
def static_automaton(folder: str, tokens: int) -> tuple[SuffixAutomaton, int]:
    """The automaton of the first ``tokens`` tokens of the datastore at ``folder`` (built once a
    process) and the datastore's separator id."""
    store = open_datastore(folder)
    text = np.asarray(store.tokens[:tokens]).tolist()
    return SuffixAutomaton(text), store.sep


def match_paths(sam: SuffixAutomaton, state: int, n: int, branches: int, min_match: int,
                stop: int | None = None) -> list[list[int]]:
    """Continuations of the match ``state`` and of up to ``branches - 1`` of its suffix-link
    ancestors of at least ``min_match`` tokens, longest match first, empty ones dropped."""
    paths: list[list[int]] = []
    while state > 0 and len(paths) < branches and sam.length[state] >= min_match:
        cont = sam.continuation(state, n, stop)
        if cont and cont not in paths:
            paths.append(cont)
        state = sam.link[state]
    return paths



def suffix_proposer(decoder, input_ids) -> "SuffixProposer":
    """The automaton proposer of a decoder with the suffix options (``suffix`` and ``samd``):
    over ``input_ids`` ``[1, S]``, with the decoder's static automaton if it has one."""
    check_context(decoder, input_ids, decoder.cfg["draft_len"], "draft_len")
    c = decoder.cfg
    return SuffixProposer(input_ids[0].tolist(), decoder.device, c["draft_len"], c["branches"], c["min_match"],
                          decoder.static, c["len_bias"])

class SuffixProposer(Proposer):
    """The dynamic (and static) automata of one ``generate`` call."""

    def __init__(self, prompt: list[int], device, draft_len: int, branches: int, min_match: int,
                 static: tuple[SuffixAutomaton, int] | None = None, len_bias: int = 4):
        self.dyn = DynamicMatcher(prompt)
        self.static, self.len_bias = static, len_bias
        self.s_state = self.s_len = 0
        if static is not None:
            self._feed_static(prompt)
        self.dev, self.args = device, (draft_len, branches, min_match)
        self.fed = 0   # committed new tokens the automata have seen
        self.matches: list[int] = []
        self.from_static: list[int] = []

    def _feed_static(self, tokens) -> None:
        sam = self.static[0]
        for t in tokens:
            self.s_state, self.s_len = sam.step(self.s_state, self.s_len, int(t))

    def candidates(self, state: ProposerState) -> tuple[list[list[int]], int]:
        """The continuations to verify below the root and the match length they come from."""
        new = state.tokens[self.fed:]
        self.dyn.add(new)
        if self.static is not None:
            self._feed_static(new)
        self.fed = len(state.tokens)
        draft_len, branches, min_match = self.args
        depth = max(0, min(draft_len, state.remaining - 1))
        use_static = self.static is not None and self.s_len - self.len_bias > self.dyn.length
        if use_static:
            sam, st, length, stop = self.static[0], self.s_state, self.s_len, self.static[1]
        else:
            sam, st, length, stop = self.dyn.sam, self.dyn.state, self.dyn.length, None
        paths = match_paths(sam, st, depth, branches, min_match, stop) if depth else []
        self.matches.append(length if paths else 0)
        self.from_static.append(int(use_static and bool(paths)))
        return paths, (length if paths else 0)

    def propose(self, state: ProposerState) -> Proposal:
        paths, _ = self.candidates(state)
        return self.proposal(paths)

    def proposal(self, paths: list[list[int]]) -> Proposal:
        tree, toks = token_trie(paths)
        return Proposal(tree.to(self.dev), torch.tensor(toks, dtype=torch.long, device=self.dev))

    def stats(self) -> dict:
        return {"suffix_match": self.matches, "suffix_static": self.from_static,
                "suffix_states": self.dyn.sam.states}


def suffix_options() -> dict:
    """The retrieval's options (shared with ``samd``)."""
    return {"draft_len": Option(10, (int,), lo=1, hi=64), "branches": Option(1, (int,), lo=1, hi=64),
            "min_match": Option(1, (int,), lo=1, hi=256), "datastore": Option(None, (str, Path)),
            "static_tokens": Option(1_000_000, (int,), lo=1), "len_bias": Option(4, (int,), lo=0, hi=256)}


def suffix_test_datastore(model, workdir) -> str:
    """A tiny datastore of random sequences and the tiny model's own greedy continuations."""
    folder = Path(workdir) / "suffix_datastore"
    if not (folder / "datastore.json").is_file():
        vocab = int(model.config.vocab_size)
        gen = torch.Generator().manual_seed(1)
        seqs = [torch.randint(3, vocab, (30,), generator=gen).tolist() for _ in range(10)]
        v = Vanilla(model)
        for prompt in ([1, 5, 6, 7, 5, 6], [1, 40, 41, 42, 43]):
            ids = torch.tensor([prompt], device=model.device)
            seqs.append(prompt + v.generate(ids, 20).tokens)
        build_datastore(seqs, folder, vocab, "tiny-random", "tiny_llama", "test sequences")
    return str(folder)


def static_for(decoder) -> tuple[SuffixAutomaton, int] | None:
    """The static automaton a decoder's ``datastore`` option names, checked against its tokenizer."""
    if decoder.cfg["datastore"] is None:
        return None
    tok_id = None
    if decoder.tokenizer is not None:
        from ..training.corpus import tokenizer_identity   # as rest: only with a real tokenizer
        tok_id = tokenizer_identity(decoder.tokenizer)
    open_datastore(decoder.cfg["datastore"], tok_id, int(decoder.model.config.vocab_size))  # the checks
    return static_automaton(str(Path(decoder.cfg["datastore"]).resolve()), decoder.cfg["static_tokens"])


def check_context(decoder, input_ids, reach: int, option: str) -> None:
    limit = getattr(decoder.model.config, "max_position_embeddings", None)
    if limit is not None and input_ids.shape[1] + reach > limit:
        raise UserError(f"{decoder.name} {option}={reach} reaches position {input_ids.shape[1] + reach} after a "
                        f"{input_ids.shape[1]}-token prompt, beyond the model's context of {limit}; valid: "
                        f"{option} <= {limit - input_ids.shape[1]} for this prompt")


class Suffix(TreeDecoder):
    """Decoder ``suffix``: ``draft_len`` tokens after the longest suffix match, ``branches``
    continuations (1: a chain), matches of ``min_match`` tokens or more; optionally the static
    automaton of a REST datastore (``datastore``, its first ``static_tokens`` tokens, ``len_bias``).
    Defaults: the authors' ``n_predicts=10`` and ``len_bias=4`` (``samd/samd_config.py``)."""

    name = "suffix"
    acceptance_rules = ("greedy", "target_sampling")   # retrieved continuations, no draft distribution
    default_sampling = "target_sampling"

    @classmethod
    def options(cls) -> dict:
        return {**super().options(), **suffix_options()}

    @classmethod
    def test_configs(cls, model, workdir):
        return [{}, {"draft_len": 4, "branches": 3},
                {"datastore": suffix_test_datastore(model, workdir), "len_bias": 0, "branches": 2, "draft_len": 6}]

    def __init__(self, model, tokenizer=None, **cfg):
        super().__init__(model, tokenizer, **cfg)
        self.static = static_for(self)

    def make_proposer(self, input_ids):
        return suffix_proposer(self, input_ids)
