"""Decoder ``pool``: one verified tree merged from the candidates of several proposers, each node
scored by a calibrated acceptance probability, cut to the size the cost curve prefers. Beyond
every anchor (issue #79): SAM-Decoding switches between its retrieval and EAGLE per step, vLLM
takes the n-gram draft first, RASD fuses a retrieval tree into the draft tree by longest prefix;
none scores candidates of different sources on one scale or sizes the tree to the hardware.

**Sources** (option ``sources``: a list of ``{name: <kind>, ...that kind's options}``): the
existing proposers, built by their own decoder classes (so their options are checked there and
their logic is not copied): ``eagle`` (:class:`~common.decoders.eagle.Eagle`, the head's static
or dynamic tree), ``eagle3`` (:class:`~common.decoders.eagle3.Eagle3`: EAGLE-3's head, which reads
the fused layers' inputs of the pool's own prefill and verification forwards: the pool's proposer
names every source's ``capture_layers`` and the tree loop keeps them), ``suffix`` (:class:`~common.decoders.suffix.Suffix`, the suffix automata),
``recycling`` (:class:`~common.decoders.recycling.Recycling`, the successor matrix) and
``prompt_lookup`` (transformers' prompt lookup on the shared loop: the continuation of the first
earlier occurrence of the context's last ``max_ngram`` .. 1 tokens, ``num_tokens`` long, with
:class:`~common.decoders.hf.PromptLookup`'s options).

**The merge.** Every source's tree below the same root becomes token sequences; equal prefixes
are one node of a trie (:func:`~common.decoders.lookahead.token_trie` builds the buffers), which
remembers every source that proposed it and the source's **bin**: the sibling rank for the
tree drafters (eagle, eagle3, recycling: the rank of the draft distribution or of the successor list),
the matched length for the retrieval ones (suffix, prompt lookup; lengths in powers of two).

**Calibration** (online, from this run's own history; ``hot_start`` keeps it across prompts).
A node's acceptance probability given its parent's acceptance, per ``(source, depth, bin)``: a
Beta posterior whose prior is the ``(source, depth)`` pooled rate (itself under the
``prior = [a, b]`` Beta prior) with ``a + b`` pseudo-counts. A node proposed by several sources
takes the largest. After each step the committed tokens ``T`` (the accepted path and the next
token) label **every** candidate of the merged trie, kept or cut: a depth-``d`` candidate was
tested iff its first ``d - 1`` tokens are ``T``'s, accepted iff all ``d`` are (the greedy token
after an accepted prefix is what verification would have accepted), so the fit carries no
selection bias. The product along a path is the node's probability of being accepted.

**The cut.** Nodes are taken best path score first (a child never outscores its parent, so every
prefix of that order is a connected subtree); with ``E(q) = 1 + the q - 1 best scores`` the
expected tokens of verifying ``q`` positions (root included), the step keeps the ``q`` that
maximises ``E(q) / cost(q)``, ``q <= total``. ``cost``: seconds per verified size (a list, entry
``i`` for ``i + 1`` positions), or a cost-curve record (``python -m common.harness.cost_curve``:
this host's ``fast`` forward path, interpolated between measured sizes by :func:`common.cost.cost_of`;
the workflow passes ``"{cost_curve}"``, the rule ``cost_curve``'s file), read once at construction;
default flat up to ``total`` (every step verifies ``total`` positions when it has them).

Greedy acceptance: exactly vanilla's tokens; at temperature > 0 ``target_sampling`` (exact for any
tree; the committed tokens are then the drawn ones, which label the candidates alike). Stats: ``pool_accepted`` (accepted tokens per
source; a token two sources proposed counts for both), ``pool_calibration`` (per source and
depth, this call: nodes tested, mean predicted and observed acceptance rate), ``pool_candidates``
(merged trie size per step, before the cut), and each source's own stats.
"""
from __future__ import annotations

import heapq
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch

from ..cost import cost_of, merge_curves
from ..errors import UserError
from ..hardware import describe
from .base import Option
from .eagle import Eagle
from .eagle3 import Eagle3
from .hf import PromptLookup
from .lookahead import token_trie
from .recycling import Recycling
from .registry import DECODERS
from .suffix import Suffix
from .tree_loop import Proposal, Proposer, ProposerState, StepResult, TreeDecoder

RANK_BINS = 4   # ranks 0, 1, 2 and 3+: deeper ranks are rare enough to share one rate


# -- sources ------------------------------------------------------------------------------------
class NgramProposer(Proposer):
    """transformers' prompt lookup on the shared loop: the continuation of the first earlier
    occurrence of the context's last ``n`` tokens, ``n = max_ngram .. 1`` (the first ``n`` that
    matches). First occurrences are indexed as tokens arrive, so a step costs O(``max_ngram``)."""

    def __init__(self, prompt: list[int], device, num_tokens: int, max_ngram: int):
        self.text: list[int] = []
        self.first: dict[tuple, int] = {}   # n-gram -> start of its first occurrence
        self.dev, self.num_tokens, self.max_ngram = device, num_tokens, max_ngram
        self.fed = 0
        self._add(prompt)

    def _add(self, tokens) -> None:
        for t in tokens:
            self.text.append(int(t))
            end = len(self.text)
            for n in range(1, min(self.max_ngram, end) + 1):
                self.first.setdefault(tuple(self.text[end - n:]), end - n)

    def match(self, state: ProposerState) -> tuple[list[int], int]:
        """The continuation below the root (``[]`` when nothing matches) and the n-gram size."""
        self._add(state.tokens[self.fed:])
        self.fed = len(state.tokens)
        depth = max(0, min(self.num_tokens, state.remaining - 1))
        end = len(self.text)
        for n in range(min(self.max_ngram, end - 1), 0, -1):
            start = self.first.get(tuple(self.text[end - n:]))
            if depth and start is not None and start + n < end:   # not the context's own tail
                return self.text[start + n:start + n + depth], n
        return [], 0

    def propose(self, state: ProposerState) -> Proposal:
        return trie_proposal([self.match(state)[0]], self.dev)


def trie_proposal(paths, device) -> Proposal:
    tree, toks = token_trie(paths)
    return Proposal(tree.to(device), torch.tensor(toks, dtype=torch.long, device=device))


def length_bin(n: int) -> int:
    """A match length's bin: 1, 2-3, 4-7, 8-15, 16+ (bins 1..5; 0 for no match)."""
    return min(int(n).bit_length(), 5)


def rank_bins(p: Proposal) -> list[int]:
    """Each non-root node's sibling rank, ranks past :data:`RANK_BINS` sharing the last bin."""
    return p.tree.rank[1:].clamp(max=RANK_BINS - 1).tolist()


@dataclass
class SourceKind:
    """How a pool builds and reads one kind of proposer.

    Attributes:
        build: ``(model, tokenizer, options) -> (input_ids [1, S] -> a fresh proposer)``.
        draft: ``(proposer, state) -> (proposal, [n-1] bins of its nodes)``.
        learn: ``(proposer, result, [n] merged tree tokens)``: what the source takes from a
            verified step of the pool's tree (default: nothing; it reads ``ProposerState``).
        bin_name: what its bins are, for the calibration table.
    """
    build: Callable
    draft: Callable
    bin_name: str
    learn: Callable = field(default=lambda proposer, result, tree_tokens: None)


def _decoder_source(cls) -> Callable:
    """A source built by a tree decoder class: its options checked there, its ``make_proposer``."""
    def build(model, tokenizer, opts):
        return cls(model, tokenizer, **opts).make_proposer
    return build


def _ranked(proposer, state):
    p = proposer.propose(state)
    return p, rank_bins(p)


def _suffix(proposer, state):
    paths, length = proposer.candidates(state)
    p = proposer.proposal(paths)
    return p, [length_bin(length)] * (p.tree.size - 1)


def _ngram_build(model, tokenizer, opts):
    declared = PromptLookup.options()
    keys = ("num_tokens", "max_ngram")
    extra = sorted(set(opts) - set(keys))
    if extra:
        raise UserError(f"pool source 'prompt_lookup' has no option(s) {extra}; valid: {', '.join(keys)}")
    for k, v in opts.items():
        declared[k].validate("prompt_lookup", k, v)
    cfg = {k: opts.get(k, declared[k].default) for k in keys}
    return lambda ids: NgramProposer(ids[0].tolist(), model.device, cfg["num_tokens"], cfg["max_ngram"])


def _ngram(proposer, state):
    cont, n = proposer.match(state)
    p = trie_proposal([cont], proposer.dev)
    return p, [length_bin(n)] * (p.tree.size - 1)


def _recycle(proposer, result, tree_tokens):
    # the matrix takes the target's top-k at every node the pool verified (the paper's "all
    # verified positions"), not only its own nodes
    proposer.tree_tokens = tree_tokens
    proposer.update(result)


SOURCES: dict[str, SourceKind] = {
    "eagle": SourceKind(_decoder_source(Eagle), _ranked, "rank"),
    "eagle3": SourceKind(_decoder_source(Eagle3), _ranked, "rank"),
    "suffix": SourceKind(_decoder_source(Suffix), _suffix, "match length bin"),
    "recycling": SourceKind(_decoder_source(Recycling), _ranked, "rank", _recycle),
    "prompt_lookup": SourceKind(_ngram_build, _ngram, "n-gram bin"),
}
LOOP_OPTIONS = set(TreeDecoder.options())   # the pool's own: a source does not set them


def check_sources(value) -> None:
    """``sources``: a non-empty list of ``{name: kind, ...options}``, each kind once."""
    valid = f"valid source kinds: {', '.join(SOURCES)}"
    if not isinstance(value, list) or not value:
        raise UserError(f"pool sources must be a non-empty list of {{name: kind, ...options}}; {valid}")
    seen = set()
    for i, src in enumerate(value):
        if not isinstance(src, dict) or "name" not in src:
            raise UserError(f"pool sources[{i}]={src!r} names no proposer; expected {{name: kind, ...options}}; {valid}")
        kind = src["name"]
        if kind not in SOURCES:
            why = "is a decoder that cannot propose into a pool" if kind in DECODERS else "is unknown"
            raise UserError(f"pool source {kind!r} {why}; {valid}")
        if kind in seen:
            raise UserError(f"pool source {kind!r} is listed twice; {valid}, each once")
        seen.add(kind)
        own = sorted(LOOP_OPTIONS & set(src))
        if own:
            raise UserError(f"pool source {kind!r} sets {', '.join(own)}, the pool's own option(s); set them on "
                            "the pool")


# -- calibration and the cut ------------------------------------------------------------------
class Calibration:
    """Acceptance rates per ``(source, depth, bin)``, Beta posteriors with a pooled prior.

    ``p(s, d, b) = (acc + w m) / (tested + w)`` with ``m`` the ``(s, d)`` pooled rate under the
    ``Beta(a, b)`` prior and ``w = a + b`` pseudo-counts: a rare bin starts at its depth's rate.
    """

    def __init__(self, prior: tuple[float, float]):
        self.a, self.b = prior
        self.fine: dict[tuple, list[int]] = {}     # (source, depth, bin) -> [accepted, tested]
        self.pooled: dict[tuple, list[int]] = {}   # (source, depth) -> [accepted, tested]

    def p(self, source: str, depth: int, bin_: int) -> float:
        acc, n = self.pooled.get((source, depth), (0, 0))
        m = (acc + self.a) / (n + self.a + self.b)
        acc, n = self.fine.get((source, depth, bin_), (0, 0))
        w = self.a + self.b
        return (acc + w * m) / (n + w)

    def update(self, source: str, depth: int, bin_: int, accepted: bool) -> None:
        for table, key in ((self.fine, (source, depth, bin_)), (self.pooled, (source, depth))):
            row = table.setdefault(key, [0, 0])
            row[0] += int(accepted)
            row[1] += 1


def best_size(scores: list[float], cost: list[float]) -> int:
    """The verified size ``q`` (root included) maximising ``(1 + sum(scores[:q-1])) / cost[q-1]``.

    Args:
        scores: path scores in the order nodes are taken (non-increasing).
        cost: seconds of a verification of ``1..len(cost)`` positions.
    """
    best, best_q, expected = 1.0 / cost[0], 1, 1.0
    for q in range(2, min(len(scores) + 1, len(cost)) + 1):
        expected += scores[q - 2]
        if expected / cost[q - 1] > best:
            best, best_q = expected / cost[q - 1], q
    return best_q


def read_cost(value, total: int, device) -> list[float]:
    """``T(q) / T(1)`` per verified size ``q = 1..total`` from the ``cost`` option (see the module
    docstring; only ratios matter to :func:`best_size`). A cost-curve file is read with the curves
    kept beside it (``cost_curves/*.jsonl``) and this host's curve taken (``hardware.describe``):
    another host's curve is an error, never applied; a curve that stops short of ``total`` caps
    the size at its last measured one."""
    if value is None:
        return [1.0] * total
    if isinstance(value, list):
        if not value or not all(isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0 for v in value):
            raise UserError(f"pool cost={value!r} is invalid; valid: seconds per verified size 1, 2, .. (positive "
                            "numbers), or a cost-curve record (python -m common.harness.cost_curve)")
        return [float(v) for v in value[:total]]
    path = Path(value)
    if not path.is_file():
        raise UserError(f"pool cost={str(value)!r} is not a file; valid: a cost-curve record (python -m "
                        "common.harness.cost_curve --out FILE), or a list of seconds per verified size")
    curve = merge_curves([path, *sorted((path.parent / "cost_curves").glob("*.jsonl"))])
    host = describe(str(device)) if any("device" in r for r in curve) else None
    fast = [r for r in curve if r.get("forward_path", "stock") == "fast" and r.get("device") == host]
    if not fast:
        hosts = sorted({str(r.get("device")) for r in curve})
        raise UserError(f"pool cost={str(value)!r} holds no fast-path curve measured on {host or 'one host'} "
                        f"(it has {', '.join(hosts) or 'no records'}); valid: a curve measured here, "
                        "python -m common.harness.cost_curve --out FILE on this machine")
    try:
        ratio = cost_of(fast, "fast")
    except ValueError as e:
        raise UserError(f"pool cost={str(value)!r}: {e}; valid: a record of python -m common.harness.cost_curve") from None
    last = max(int(r["q"]) for r in fast)
    return [ratio(q) for q in range(1, min(total, last) + 1)]


class PoolProposer(Proposer):
    """Each step: every source's tree, merged, scored, cut; afterwards the fit takes the outcome."""

    def __init__(self, sources: dict[str, tuple[SourceKind, Proposer]], calibration: Calibration,
                 cost: list[float], device):
        self.sources, self.cal, self.cost, self.dev = sources, calibration, cost, device
        # what any source reads of the committed positions, the loop keeps for all (each picks its own)
        self.needs_hidden = any(p.needs_hidden for _, p in sources.values())
        self.capture_layers = tuple(sorted({layer for _, p in sources.values() for layer in p.capture_layers}))
        self.accepted = {name: 0 for name in sources}
        self.table: dict[tuple, list[float]] = {}   # (source, depth) -> [tested, sum predicted, accepted]
        self.candidates: list[int] = []
        self.trie: dict[tuple, dict[str, int]] = {}   # token sequence -> {source: bin}
        self.kept: list[tuple] = []
        self.root = 0

    def propose(self, state: ProposerState) -> Proposal:
        self.root = state.tokens[-1]
        trie: dict[tuple, dict[str, int]] = {}
        for name, (kind, proposer) in self.sources.items():
            p, bins = kind.draft(proposer, state)
            toks, parents = p.tokens.tolist(), p.tree.parents.tolist()
            seqs = [()]
            for i, (tok, b) in enumerate(zip(toks, bins), start=1):
                seqs.append(seqs[parents[i]] + (tok,))   # parents precede children in tree order
                trie.setdefault(seqs[i], {}).setdefault(name, b)
        self.trie = trie
        self.candidates.append(len(trie))
        self.kept = self._cut(trie)
        return trie_proposal(self.kept, self.dev)

    def node_p(self, seq: tuple, sources: dict[str, int]) -> float:
        return max(self.cal.p(s, len(seq), b) for s, b in sources.items())

    def _cut(self, trie: dict[tuple, dict[str, int]]) -> list[tuple]:
        """The connected best-first order of the trie's nodes, cut at :func:`best_size`."""
        children: dict[tuple, list[tuple]] = {}
        for seq in trie:
            children.setdefault(seq[:-1], []).append(seq)
        heap = [(-self.node_p(c, trie[c]), c) for c in children.get((), [])]
        heapq.heapify(heap)
        order, scores = [], []
        while heap and len(order) < len(self.cost) - 1:
            neg, seq = heapq.heappop(heap)
            order.append(seq)
            scores.append(-neg)
            for c in children.get(seq, []):
                heapq.heappush(heap, (neg * self.node_p(c, trie[c]), c))
        return order[:best_size(scores, self.cost) - 1]

    def update(self, result: StepResult) -> None:
        tree_tokens = torch.cat([result.proposal.tokens.new_tensor([self.root]), result.proposal.tokens])  # [n]
        for kind, proposer in self.sources.values():
            kind.learn(proposer, result, tree_tokens)
        # the committed tokens: the accepted path, then the token the target chose after it
        committed = tuple(tree_tokens[result.path[1:]].tolist()) + (result.next_token,)
        kept = set(self.kept)
        for k in range(1, len(committed)):
            if committed[:k] in kept:
                for s in self.trie[committed[:k]]:
                    self.accepted[s] += 1
        outcomes = []   # every prediction first, then the fit: the step's nodes share one fit
        for seq, srcs in self.trie.items():
            d = len(seq)
            if d > len(committed) or seq[:-1] != committed[:d - 1]:
                continue   # its parent was not accepted: untested
            hit = seq[-1] == committed[d - 1]
            for s, b in srcs.items():
                row = self.table.setdefault((s, d), [0, 0.0, 0])
                row[0], row[1], row[2] = row[0] + 1, row[1] + self.cal.p(s, d, b), row[2] + int(hit)
                outcomes.append((s, d, b, hit))
        for outcome in outcomes:
            self.cal.update(*outcome)

    def stats(self) -> dict:
        table = [{"source": s, "depth": d, "tested": int(n), "predicted": pred / n, "observed": acc / n}
                 for (s, d), (n, pred, acc) in sorted(self.table.items())]
        out = {"pool_accepted": dict(self.accepted), "pool_calibration": table, "pool_candidates": self.candidates}
        for _, proposer in self.sources.values():
            out.update(proposer.stats())
        return out


class Pool(TreeDecoder):
    """Decoder ``pool``: ``sources`` (a list of ``{name: kind, ...options}``, kinds
    :data:`SOURCES`), ``total`` (the most verified positions a step, root included), ``cost``
    (seconds per verified size, or a cost-curve record), ``prior`` (the Beta prior ``[a, b]`` of
    a node's acceptance), ``hot_start`` (keep the calibration across prompts)."""

    name = "pool"
    # a tree built before verification, with no draft distribution: target sampling is exact on it
    acceptance_rules = ("greedy", "target_sampling")
    default_sampling = "target_sampling"

    @classmethod
    def options(cls) -> dict:
        def check_prior(v):
            if len(v) != 2 or not all(isinstance(x, (int, float)) and not isinstance(x, bool) and x > 0 for x in v):
                raise UserError(f"pool prior={v!r} is invalid; valid: [a, b], two positive numbers")
        return {**super().options(), "sources": Option(None, (list,), check=check_sources),
                "total": Option(16, (int,), lo=2, hi=512), "cost": Option(None, (list, str, Path)),
                "prior": Option([1.0, 1.0], (list,), check=check_prior), "hot_start": Option(True, (bool,))}

    @classmethod
    def test_configs(cls, model, workdir):
        """Every kind with EAGLE's random head; a size cut by a cost list and by a cost-curve file;
        EAGLE-3's random head beside EAGLE's (its features come from the pool's forwards)."""
        static, dynamic = Eagle.test_configs(model, workdir)[:2]
        e3_dynamic = Eagle3.test_configs(model, workdir)[1]
        curve = Path(workdir) / "pool_cost_curve.jsonl"
        curve.write_text("".join(f'{{"q": {q}, "ms": {ms}, "forward_path": "fast"}}\n'
                                 for q, ms in ((1, 10.0), (2, 11.0), (4, 14.0), (8, 30.0))))
        every = [{"name": "eagle", **dynamic}, {"name": "suffix", "draft_len": 6},
                 {"name": "recycling", "tree": 16}, {"name": "prompt_lookup", "num_tokens": 5}]
        return [{"sources": every, "total": 8},
                {"sources": [{"name": "suffix", "branches": 2}, {"name": "prompt_lookup", "max_ngram": 3},
                             {"name": "recycling", "tree": 8, "hot_start": False}],
                 "cost": [1.0, 1.05, 1.1, 1.3, 1.6, 2.0], "hot_start": False},
                {"sources": [{"name": "eagle", **static}, {"name": "recycling", "tree": 24}],
                 "cost": str(curve), "prior": [2.0, 8.0]},
                {"sources": [{"name": "eagle3", **e3_dynamic}, {"name": "eagle", **static}, {"name": "suffix"}],
                 "total": 8}]

    def __init__(self, model, tokenizer=None, **cfg):
        super().__init__(model, tokenizer, **cfg)
        if self.cfg["sources"] is None:
            raise UserError(f"decoder 'pool' needs sources=[{{name: kind, ...options}}, ...]; valid source kinds: "
                            f"{', '.join(SOURCES)}")
        self.factories = {s["name"]: (SOURCES[s["name"]], SOURCES[s["name"]].build(
            model, tokenizer, {k: v for k, v in s.items() if k != "name"})) for s in self.cfg["sources"]}
        self.cost = read_cost(self.cfg["cost"], self.cfg["total"], self.device)
        self.calibration = Calibration(tuple(self.cfg["prior"]))

    def make_proposer(self, input_ids):
        if not self.cfg["hot_start"]:
            self.calibration = Calibration(tuple(self.cfg["prior"]))
        sources = {name: (kind, build(input_ids)) for name, (kind, build) in self.factories.items()}
        return PoolProposer(sources, self.calibration, self.cost, self.device)

