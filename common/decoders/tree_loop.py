"""Generic tree verification: Medusa's four phases around a pluggable proposer and rule.

Each step: ``generate_candidates`` (the proposer builds a token tree below the root, the last
committed token, and may add positions of its own to the coming forward) -> ``tree_decoding``
(one target forward over the tree with its ancestor mask and positions, plus the proposer's
:class:`~common.engine.forward.Injection`\\ s) -> ``evaluate_posterior`` (the acceptance rule picks
the accepted path and the next token) -> ``update_inputs_and_kv`` (keep the accepted path in
the KV cache, append the next token). :func:`verify_step` runs the four phases, once for every
caller: :class:`TreeDecoder`'s loop, and any draft that verifies its own trees (prompt
decoding inside speculative decoding's draft).

Proposers are separate from the verifier (transformers' candidate-generator split): a draft
model, the target skipping layers and Medusa heads hand a :class:`Proposal` to the same loop;
prompt decoding's prompt tokens and FIRP's predicted hidden states ride along inside the
verification forward as injected positions, and the proposer reads what it needs back from
:class:`StepResult` (their final states, the accepted path). A proposer that reads the committed
positions' states names them once (``needs_hidden``: the final states; ``capture_layers``: the
inputs of some decoder layers, EAGLE-3's fused features): the loop keeps them from the prefill and
from every verification forward (the accepted path's rows) and hands them over in
:class:`ProposerState`, so no proposer builds a target of its own to see them.

Acceptance is a rule object (:mod:`common.engine.acceptance`) chosen by the ``acceptance`` option:
by default ``greedy`` at temperature 0 (exact: the output is the target's greedy tokens) and
the decoder's :meth:`TreeDecoder.sampling_rule` at temperature > 0, always lossless:
``target_sampling`` (the target draws, the walk follows the tree: exact for any tree),
``tree_speculative`` (a tree drawn without replacement from the draft's reported distribution)
or ``speculative`` (a draft's chain). ``typical`` (Medusa's, not exact) is only ever chosen by
name. Sampling draws only from the decoder's generator seeded by ``seed``.

Cache invariant: the target cache holds every committed token except the newest one, which
is the next tree's root (node 0) and is processed by the next tree forward.

Timing: the loop, not the proposers, reads the clock (:func:`common.hardware.device_clock`, which
waits for a GPU's queued work). :func:`verify_step` times its phases (``StepResult.propose_s``:
``generate_candidates``; ``verify_s``: the other three) and :class:`TreeDecoder` records them
per step, aligned with ``accept_lengths`` (step 0 is the prefill: ``verify_s`` its forward,
``propose_s`` 0): ``propose_s``, ``verify_s`` and ``other_s`` (the rest of the step: the
proposer's ``update``, set-up before the prefill, bookkeeping), so the three sum to the loop's
time. A proposer reports the same propose time under the record field it has always had
(:meth:`Proposer.propose_fields`: Medusa's and EAGLE's ``draft_forward_s``, REST's
``retrieval_s``, lookahead's ``lookahead_build_s``). The one sub-phase timed elsewhere is a draft
model's own forwards (speculative decoding's ``draft_forward_s``, prompt decoding's draft): the
draft's :class:`~common.engine.target.Target` times every forward it runs, as the target's do
(``target_forward_s``).
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Sequence

import torch

from ..engine import acceptance as acc
from ..errors import UserError, unknown
from ..hardware import device_clock
from ..engine.forward import Injection, Verified, num_layers
from ..engine.target import Target
from ..engine.tree import TreeBuffers, build_tree, chain_paths
from .base import SAMPLING_OPTIONS, DecodeOutput, Decoder, Option


@dataclass
class ProposerState:
    """What a proposer sees before each step.

    Attributes:
        prompt: ``[1, S]`` prompt ids (the encoder input for encoder-decoders).
        tokens: committed new tokens; ``tokens[-1]`` is the next tree's root.
        hidden: ``[1, k, H]`` target final states (after the final norm, the LM head's input)
            at the ``k`` positions the last target forward committed: the prompt after the
            prefill, the accepted path (root first) after a step. ``hidden[:, -1]`` produced
            the root. ``None`` unless the proposer sets ``needs_hidden``.
        remaining: new tokens still allowed, the root's successors included. A proposer keeps
            its tree's depth within ``remaining - 1`` (the step adds one token of its own):
            deeper nodes can never be kept, yet the target verifies them and ``proposed``
            counts them.
        temperature: the decoder's sampling temperature (0 = greedy).
        generator: the decoder's seeded RNG; proposers that sample must draw from it.
        top_p, top_k: the decoder's truncation; a proposer reporting draft distributions
            makes them with :meth:`process`, as the rule processes the target's.
        sample_tree: the rule needs each node's children drawn without replacement from the
            draft distribution the proposal reports (``tree_speculative``); a proposer that
            builds trees can then draw them (EAGLE's static tree), others ignore it.
        captured: ``{layer: [k, H]}`` inputs of the decoder layers the proposer names in
            ``capture_layers``, at the same ``k`` committed positions as ``hidden``; ``None``
            when it names none.
    """
    prompt: torch.Tensor
    tokens: list[int]
    hidden: torch.Tensor | None
    remaining: int
    temperature: float
    generator: torch.Generator | None
    top_p: float = 1.0
    top_k: int = 0
    sample_tree: bool = False
    captured: dict[int, torch.Tensor] | None = None

    def process(self, logits: torch.Tensor) -> torch.Tensor:
        """``[..., V]`` draft logits -> the probabilities to draw from (the decoder's
        temperature, top-k, top-p: :func:`common.engine.acceptance.process`)."""
        return acc.process(logits, self.temperature, self.top_p, self.top_k)

    @property
    def ids(self) -> torch.Tensor:
        """``[1, S + t]`` prompt ++ committed tokens (a causal LM's whole sequence)."""
        new = torch.as_tensor([self.tokens], dtype=torch.long, device=self.prompt.device)
        return torch.cat([self.prompt, new], dim=1)


@dataclass
class Proposal:
    """A candidate tree below the root, and what the proposer adds to its forward.

    Attributes:
        tree: the tree's buffers (node 0 = root).
        tokens: ``[n-1]`` long, tokens of nodes ``1..n-1`` in tree order (the root is known).
        draft_probs: ``[n-1, V]`` distribution each node's token was drawn from; required by
            rules with ``needs_draft_probs`` (speculative sampling), ignored otherwise.
        injections: extra positions for the verification forward (prompt tokens, pseudo
            states); their final states come back in ``StepResult.verified.extra_hidden``.
    """
    tree: TreeBuffers
    tokens: torch.Tensor
    draft_probs: torch.Tensor | None = None
    injections: Sequence[Injection] = ()


@dataclass
class StepResult:
    """What the proposer is told after a step.

    Attributes:
        proposal: its proposal; ``path``: ``[a+1]`` accepted node indices, root first;
        verified: the forward's states (nodes, injected positions, captured layers).
        propose_s: seconds in ``generate_candidates`` (the proposer's ``propose``);
        verify_s: seconds in the target's forward, the rule and the cache update.
    """
    proposal: Proposal
    path: torch.Tensor
    verified: Verified
    next_token: int
    propose_s: float = 0.0
    verify_s: float = 0.0

    @property
    def accepted(self) -> int:
        """Proposed tokens (root excluded) the rule accepted."""
        return self.path.numel() - 1


class Proposer:
    """Interface of a candidate source. One instance serves one ``generate`` call."""

    needs_hidden = False  # ask the verifier for target final states (Medusa heads, early-exit heads)
    # decoder layers whose inputs it reads at the committed positions (``ProposerState.captured``)
    capture_layers: tuple[int, ...] = ()

    def propose(self, state: ProposerState) -> Proposal:
        """The tree below ``state.tokens[-1]``, at most ``state.remaining - 1`` deep. The loop
        times this call (``propose_s``); a proposer reads no clock itself."""
        raise NotImplementedError

    def update(self, result: StepResult) -> None:
        """Told after each step what was accepted (and what the forward computed)."""

    def stats(self) -> dict:
        """Run statistics of the proposer, added to the decoder's (e.g. draft forwards)."""
        return {}

    def propose_fields(self, propose_s: list[float]) -> dict:
        """The loop's propose times (seconds, one a step after the prefill) under the record
        fields this method has always reported them in (e.g. ``draft_forward_s``); none by
        default: ``propose_s`` itself is in every tree decoder's record."""
        return {}


class StepTimes:
    """Per-step seconds of the loop's phases, each list aligned with ``accept_lengths``.

    The clock starts on construction; :meth:`close` ends a step: its ``other`` is the step's
    time not spent proposing or verifying, so a step's three parts sum to its wall time.
    """

    def __init__(self, device):
        self.device = device
        self.propose: list[float] = []
        self.verify: list[float] = []
        self.other: list[float] = []
        self._start = device_clock(device)

    def close(self, propose_s: float, verify_s: float) -> None:
        now = device_clock(self.device)
        self.propose.append(propose_s)
        self.verify.append(verify_s)
        # the two phases lie inside [start, now]; max() only absorbs float rounding
        self.other.append(max(0.0, now - self._start - propose_s - verify_s))
        self._start = now

    def stats(self) -> dict:
        return {"propose_s": self.propose, "verify_s": self.verify, "other_s": self.other}


@lru_cache(maxsize=256)
def chain_tree(length: int, device: str = "cpu") -> TreeBuffers:
    """Buffers of the chain of ``length`` nodes below the root, built once per length/device."""
    return build_tree(chain_paths(length)).to(device)


def candidates_from_topk(tree: TreeBuffers, topk: torch.Tensor) -> torch.Tensor:
    """Node tokens of a rank tree from per-depth top-k lists (Medusa heads, prompt tokens).

    Args:
        topk: ``[D, K]`` long, ``topk[d-1]`` the candidates for depth ``d`` in rank order.
    Returns:
        ``[n-1]`` tokens of nodes ``1..n-1``: node ``(r_1, .., r_d)`` gets ``topk[d-1, r_d]``.
    """
    return topk[tree.depth[1:] - 1, tree.rank[1:]]


def tree_option(default: int, lo: int = 1, hi: int = 512, unit: str = "nodes", sizes: tuple | None = None) -> Option:
    """A tree-decoder's ``tree`` option: a size (``sizes`` when only stored trees exist, else
    ``lo..hi`` ``unit``) or a tree file."""
    def check(value) -> None:
        if not isinstance(value, int):
            return
        if sizes is not None and value not in sizes:
            raise UserError(f"tree={value} is not a stored tree size; valid: {', '.join(map(str, sizes))} "
                            "or a tree JSON file")
        if sizes is None and not lo <= value <= hi:
            raise UserError(f"tree={value} is out of range; valid: {lo}..{hi} {unit}, or a tree file")
    return Option(default, (int, str, Path), check=check)


class TreeDecoder(Decoder):
    """Base class of tree-verified decoders; subclasses implement :meth:`make_proposer`."""

    name = "tree"
    lossless = True  # greedy output equals vanilla's; sampled output has the target's distribution
    # rules its proposals can feed: target_sampling is exact for any tree built before verification
    acceptance_rules: tuple[str, ...] = ("greedy", "target_sampling", "typical")
    default_greedy = "greedy"              # rule at temperature 0 unless ``acceptance`` says otherwise
    default_sampling = "target_sampling"   # rule at temperature > 0 unless ``acceptance`` says otherwise

    @classmethod
    def options(cls) -> dict:
        # lazy_head: under a lazy rule, the LM head only on the nodes the walk reads (same tokens;
        # false computes every node's logits, as the stock loop does)
        return {**super().options(), "acceptance": Option(None, (str,)), "lazy_head": True}

    @classmethod
    def can_sample(cls) -> bool:
        """A tree decoder samples when one of its rules serves temperature > 0."""
        return any("positive" in acc.RULES[r].temperatures for r in cls.acceptance_rules if r in acc.RULES)

    def sampling_rule(self) -> str:
        """The rule at temperature > 0 unless ``acceptance`` names one (a lossless one)."""
        return self.default_sampling

    def __init__(self, model, tokenizer=None, **cfg):
        check_loop_options(type(self))
        super().__init__(model, tokenizer, **cfg)
        self.rule = self.make_rule()

    def make_rule(self) -> acc.AcceptanceRule:
        """The configured acceptance rule, checked against this decoder and the temperature."""
        t = self.cfg["temperature"]
        name = self.cfg["acceptance"] or (self.default_greedy if t == 0 else self.sampling_rule())
        if name not in acc.RULES:
            raise unknown("acceptance rule", name, acc.RULES)
        if name not in self.acceptance_rules:
            raise UserError(f"decoder {self.name!r} cannot use acceptance={name!r}; valid: "
                            f"{', '.join(self.acceptance_rules)}")
        cls = acc.RULES[name]
        if ("zero" if t == 0 else "positive") not in cls.temperatures:
            raise UserError(f"acceptance={name!r} needs temperature {'0' if 'zero' in cls.temperatures else '> 0'}"
                            f"; got temperature={t}")
        return cls(t, top_p=self.cfg["top_p"], top_k=self.cfg["top_k"], **self.rule_options())

    def rule_options(self) -> dict:
        """Keyword options of the acceptance rule (e.g. a threshold); none by default."""
        return {}

    def make_proposer(self, input_ids: torch.Tensor) -> Proposer:
        raise NotImplementedError

    @property
    def lazy_head(self) -> bool:
        """Whether the LM head runs only on the nodes the rule reads (greedy: the accepted path
        and its children), where the target supports it."""
        return bool(self.rule.lazy and self.target.lazy_head and self.cfg.get("lazy_head", True))

    # -- the loop ----------------------------------------------------------------------------
    def _generate(self, input_ids: torch.Tensor, max_new_tokens: int) -> DecodeOutput:
        times = StepTimes(self.device)  # step 0: the proposer's set-up and the prefill
        gen = self.generator()
        proposer = self.make_proposer(input_ids)
        want_hidden, capture = proposer.needs_hidden, tuple(proposer.capture_layers)
        t0 = device_clock(self.device)
        logits, hidden = self.target.start(input_ids, want_hidden=want_hidden, capture=capture)
        prefill_s = device_clock(self.device) - t0
        captured = self.target.captured if capture else None
        tokens = [self.rule.next_token(logits, gen)]
        accept_lengths = [1]  # the prefill is step 1 (Spec-Bench)
        proposed, accepted = [0], [0]  # proposed tokens and accepted proposed tokens per step
        # extra positions per step in full-forward equivalents (an injection at layer l runs d - l
        # of the d layers): what the limit column adds to the step's verified positions
        injected = [0.0]
        tokens, done = self.truncate(tokens, max_new_tokens)
        times.close(0.0, prefill_s)
        while not done:
            state = ProposerState(input_ids, tokens, hidden, max_new_tokens - len(tokens),
                                  self.cfg["temperature"], gen, self.cfg["top_p"], self.cfg["top_k"],
                                  self.rule.needs_draft_probs and not self.rule.chain_only, captured)
            step, tree_tokens = verify_step(self.target, self.rule, proposer, state, gen, self.lazy_head)
            proposal, path, verified, nxt = step.proposal, step.path, step.verified, step.next_token
            new = tree_tokens[path[1:]].tolist() + [nxt]
            proposed.append(proposal.tree.size - 1)
            injected.append(_full_positions(proposal.injections, self.target.model))
            accepted.append(path.numel() - 1)
            hidden = verified.hidden[path][None] if want_hidden else None
            captured = {layer: verified.captured[layer][path] for layer in capture} if capture else None
            before = len(tokens)
            tokens, done = self.truncate(tokens + new, max_new_tokens)
            accept_lengths.append(len(tokens) - before)
            times.close(step.propose_s, step.verify_s)
        return DecodeOutput(tokens, {"steps": len(accept_lengths), "accept_lengths": accept_lengths,
                                     "proposed": proposed, "accepted": accepted, "injected": injected,
                                     "target_forwards": self.target.forwards,
                                     "target_forward_s": self.target.forward_s, **times.stats(),
                                     **proposer.propose_fields(times.propose[1:]), **proposer.stats()})


def check_loop_options(cls: type[TreeDecoder]) -> None:
    """A subclass's ``options()`` must keep the loop's own (``acceptance``, ...): one ``error:``
    line naming the missing ones, not a ``KeyError`` from inside the loop."""
    # lazy_head is read with a default (a decoder may leave it out and get the lazy readout); the
    # base class merges the sampling options into every decoder's, so only the loop's own ones
    # decide, but the message names everything the merge would have brought
    missing = [k for k in TreeDecoder.options() if k != "lazy_head" and k not in cls.options()]
    if any(k not in SAMPLING_OPTIONS for k in missing):
        raise UserError(f"decoder {cls.name!r} ({cls.__module__}.{cls.__qualname__}) declares options() without "
                        f"the tree loop's {', '.join(missing)}; valid: merge the base class's options, "
                        "return {**super().options(), ...}")


# -- the four phases (Medusa's names), once for every tree-verified decoder and draft ----------
def generate_candidates(proposer: Proposer, state: ProposerState, rule: acc.AcceptanceRule,
                        root: int, device) -> tuple[Proposal, torch.Tensor]:
    """Ask the proposer for a tree below ``root``; returns it and its ``[n]`` node tokens, root
    first, on ``device``."""
    p = proposer.propose(state)
    if p.tokens.numel() != p.tree.size - 1:
        raise AssertionError("a proposal has one token per non-root node")
    if rule.chain_only and not p.tree.is_chain:
        raise UserError(f"acceptance={rule.name!r} verifies chains only; the proposer made a tree")
    root_t = torch.tensor([root], dtype=torch.long, device=device)
    return p, torch.cat([root_t, p.tokens.to(device)])


def tree_decoding(target: Target, tree_tokens: torch.Tensor, proposal: Proposal,
                  lazy_head: bool, capture: Sequence[int] = ()) -> tuple[torch.Tensor | None, Verified]:
    """One target forward over the ``[n]`` tree tokens and the proposal's injected positions;
    returns ``[n, V]`` node logits (None with ``lazy_head``: the rule computes the rows it
    reads) and the forward's states (with the inputs of layers ``capture`` at every node)."""
    return target.verify(tree_tokens, proposal.tree, proposal.injections, capture, head=not lazy_head)


def evaluate_posterior(target: Target, rule: acc.AcceptanceRule, proposal: Proposal, tree_tokens: torch.Tensor,
                       logits: torch.Tensor | None, verified: Verified,
                       gen: torch.Generator | None) -> tuple[torch.Tensor, int]:
    """The rule picks the accepted path (``[a+1]`` node indices, root first) and the next token."""
    tree = proposal.tree.to(target.device)
    if logits is None:
        rows = lambda nodes: target.head_rows(verified, nodes)  # noqa: E731
        return rule.evaluate_lazy(tree_tokens, tree.parents, rows, tree.retrieve_indices, gen)
    return rule.evaluate(tree_tokens, logits, tree.retrieve_indices, tree_tokens[1:], proposal.draft_probs, gen)


def update_inputs_and_kv(target: Target, prefix_len: int, path: torch.Tensor) -> None:
    """Keep the first ``prefix_len`` cached positions and the accepted path (injected positions
    and rejected nodes leave the cache)."""
    target.accept(prefix_len, path)


def verify_step(target: Target, rule: acc.AcceptanceRule, proposer: Proposer, state: ProposerState,
                gen: torch.Generator | None = None, lazy_head: bool = True,
                root: int | None = None) -> tuple[StepResult, torch.Tensor]:
    """One step of tree verification on ``target``: the four phases, then ``proposer.update``.

    Args:
        target: the verifying model's adapter; its cache holds every committed token but the
            root (the step's node 0).
        rule: the acceptance rule; ``gen`` its RNG (sampling rules).
        lazy_head: run the LM head only on the nodes a lazy rule reads, where the target
            supports it (same tokens).
        root: the tree's root token; default ``state.tokens[-1]``.
    Returns:
        ``(StepResult, [n] tree tokens, root first)``; the new committed tokens are
        ``tree_tokens[result.path[1:]] + [result.next_token]``; the result carries the phases'
        times (``propose_s``, ``verify_s``).
    """
    root = state.tokens[-1] if root is None else root
    lazy = bool(lazy_head and rule.lazy and target.lazy_head)
    t0 = device_clock(target.device)
    proposal, tree_tokens = generate_candidates(proposer, state, rule, root, target.device)
    t1 = device_clock(target.device)
    prefix_len = target.length
    logits, verified = tree_decoding(target, tree_tokens, proposal, lazy, proposer.capture_layers)
    path, nxt = evaluate_posterior(target, rule, proposal, tree_tokens, logits, verified, gen)
    update_inputs_and_kv(target, prefix_len, path)
    result = StepResult(proposal, path, verified, nxt, propose_s=t1 - t0, verify_s=device_clock(target.device) - t1)
    proposer.update(result)
    return result, tree_tokens


def _full_positions(injections: Sequence[Injection], model) -> float:
    """Injected positions in full-forward equivalents: one entering at layer ``l`` of ``d``
    runs ``(d - l) / d`` of a real position's layers."""
    if not injections:
        return 0.0
    d = num_layers(model)
    return sum(int(inj.position_ids.numel()) * (d - inj.layer) / d for inj in injections)
