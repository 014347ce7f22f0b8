"""Prompt decoding inside speculative decoding's draft (section 5.3): decoder ``pd_speculative``.

The target verifies a chain of ``gamma`` draft tokens exactly as ``speculative`` does
(:mod:`common.decoders.speculative`). The draft makes the chain with parallel prompt decoding
on itself: every draft forward carries a candidate tree built from the guesses of the draft's
own prompt tokens (trained on the draft: ``python -m prompt_decoding.train --model <draft>``,
on the draft's own greedy answers), and the draft accepts the candidates that equal its own
argmax, as the target does in ``prompt_decoding``. So the chain is exactly the draft's greedy
chain, the one ``speculative`` proposes, made in fewer draft forwards, and the output is
exactly the target's greedy output.

The draft's cache across target steps (:class:`PromptDraft`). A proposal of ``g`` drafts
leaves the draft cache holding the root (the last committed token) and drafts ``1..g-1``
(the last draft of a draft step is the next step's root, not yet fed). After the target
accepts ``a`` of the ``g`` drafts and commits its own next token ``t``:

* ``a < g``: the draft cache is cropped to the root and drafts ``1..a`` (what was committed),
  as ``speculative`` crops, and again holds every committed token but the new root ``t``.
  ``t`` sits right after the last kept position, so the tree below ``t`` takes its guesses
  from the prompt tokens that position carried in its own draft step: prompt tokens never
  attend to the token after their node, so they guess as well below ``t`` as below the
  rejected draft.
* ``a = g``: draft ``g`` was never fed to the draft, so no prompt tokens guessed below ``t``:
  the next proposal feeds draft ``g`` and ``t`` in one forward, ``t`` carrying all its prompt
  tokens and no candidates; that forward yields the first draft, the following ones guess
  from ``t``'s prompt tokens.

The first proposal of a sequence does the same after prefilling the prompt but its last token
(one forward more than ``speculative``'s one prefill per prompt). Whatever the guesses, each
draft step keeps only tokens the draft itself produces, so the draft cache always holds the
draft's greedy sequence and exactness never depends on the prompt tokens.
"""
from __future__ import annotations

from pathlib import Path

import torch

from common.engine.acceptance import Greedy
from common.decoders.base import Option
from common.decoders.speculative import DRAFT_OPTIONS, perturbed_copy, resolve_draft
from common.decoders.tree_loop import (Proposal, Proposer, ProposerState, StepResult, TreeDecoder, chain_tree,
                                       tree_option, verify_step)
from common.engine.target import Target, make_target
from common.training.loop import save_trained

from .decoding import (SHAPES, PromptProposer, StateTree, load_prompt_tokens, new_prompts, node_prompt_injection,
                       prompts_meta)
from .prompt_tokens import PromptTokens


class PromptDraft(Proposer):
    """Proposes the draft's greedy chain of ``gamma`` tokens, made by prompt decoding on the
    draft (:class:`~prompt_decoding.decoding.PromptProposer` on the draft's
    :class:`~common.engine.target.Target`, verified by the draft's own greedy argmax).

    Args:
        draft: the draft's target adapter (a causal LM).
        prompts, trees: the draft's prompt tokens and its tree per state.
    """

    def __init__(self, draft: Target, prompts: PromptTokens, trees: dict[int, StateTree], gamma: int):
        self.draft, self.gamma = draft, gamma
        self.inner = PromptProposer(draft, prompts, trees, draft.device)
        self.rule = Greedy(0.0)
        self.steps = self.drafted = 0  # draft steps (tree forwards) and tokens proposed to the target
        self._pending = None           # (cached positions before the root, prompt-token rows per chain position)

    def draft_step(self, state: ProposerState) -> tuple[StepResult, torch.Tensor]:
        """One draft forward below the root, the last token of ``state.prompt ++ state.tokens``
        (not yet in the draft cache): the inner proposer's tree, verified greedily against the
        draft's own logits; the accepted path stays in the draft cache and ``next_token`` is
        the next root.

        Args:
            state: what the inner proposer sees; ``remaining``: tokens the step may yield
                (accepted candidates + the next token).
        Returns:
            ``(StepResult, [n] tree tokens, root first)``.
        """
        # the tree loop's four phases on the draft: the draft's own argmax decides (exact: its
        # greedy chain), the LM head only on the nodes the walk reads, the accepted path kept
        root = state.tokens[-1] if state.tokens else int(state.prompt[0, -1])
        result, tree_tokens = verify_step(self.draft, self.rule, self.inner, state, root=root)
        self.steps += 1
        return result, tree_tokens

    def propose(self, state: ProposerState) -> Proposal:
        dev = state.prompt.device
        g = max(0, min(self.gamma, state.remaining - 1))
        self._pending = None
        if not g:
            return Proposal(chain_tree(0, str(dev)), torch.zeros(0, dtype=torch.long, device=dev))
        if self.draft.prompt is None:
            self.draft.begin(state.prompt)
        chain: list[int] = []
        rows: list[torch.Tensor] = []  # rows[i]: prompt-token states of chain position i (0 = root, i = draft i)
        first = self._catch_up(state)
        if first is not None:
            chain, rows = [first[0]], [first[1]]
            self.inner.resume(first[1])
        start = self.draft.length - len(chain)  # cached positions before the root
        while len(chain) < g:
            inner = ProposerState(state.prompt, state.tokens + chain, None, g - len(chain), 0.0, None)
            result, tree_tokens = self.draft_step(inner)
            rows += [self.inner.node_rows(result, node) for node in result.path.tolist()]
            chain += tree_tokens[result.path[1:]].tolist() + [result.next_token]
        self._pending = (start, rows)
        self.drafted += g
        return Proposal(chain_tree(g, str(dev)), torch.tensor(chain, dtype=torch.long, device=dev))

    def _catch_up(self, state: ProposerState) -> tuple[int, torch.Tensor] | None:
        """Feed the committed tokens the draft has not cached (the prompt on the first call,
        the last draft after the target accepted every draft) and the root: the last of them
        and the root in one forward, the root carrying all its prompt tokens (no candidates:
        no prompt tokens guessed below the root).

        Returns:
            None when nothing lags behind the root, else ``(the draft's token after the root,
            [m*n, H] the root's prompt-token states)``.
        """
        lag = state.prompt.shape[1] + len(state.tokens) - 1 - self.draft.length
        if lag <= 0:
            return None
        seq = self.draft.sequence(state.tokens)[:, -lag - 1:]     # [1, lag + 1], the root last
        if lag > 1:
            self.draft.extend(seq[:, :-2])
        tree = chain_tree(1, str(seq.device))                     # the last lagging token -> the root
        prompts = self.inner.prompts
        inj = node_prompt_injection(tree, prompts, [0, prompts.m], self.draft.length)
        prefix = self.draft.length
        _, verified = self.draft.verify(seq[0, -2:], tree, [inj], head=False)
        nxt = int(self.draft.head_rows(verified, [1]).argmax())
        self.draft.accept(prefix, tree.retrieve_indices[0])     # both nodes are committed tokens
        self.steps += 1
        return nxt, verified.extra_hidden

    def update(self, result: StepResult) -> None:
        if self._pending is None:
            return
        start, rows = self._pending
        a = result.accepted
        if a < len(rows):  # draft a+1 rejected: keep the root and drafts 1..a
            self.draft.crop(start + 1 + a)
            self.inner.resume(rows[a])
        # a == g: the draft lacks draft g; the next proposal feeds it (_catch_up)

    def stats(self) -> dict:
        return {"draft_forwards": self.draft.forwards, "draft_forward_s": self.draft.forward_s,
                "draft_steps": self.steps, "draft_tokens": self.drafted,
                "draft_tokens_per_forward": self.drafted / max(self.draft.forwards, 1), **self.inner.stats()}


class PdSpeculative(TreeDecoder):
    """Decoder ``pd_speculative``: speculative decoding (greedy) whose ``draft`` drafts its
    ``gamma`` tokens by prompt decoding with ``prompt_tokens`` (a training's folder, trained on
    that draft); ``tree`` and ``shape``: the draft-side tree, as ``prompt_decoding``'s.

    The chain equals ``speculative``'s with the same draft and ``gamma``, and the output
    equals ``vanilla``'s (exact greedy; causal LMs).
    """

    name = "pd_speculative"
    # the draft's chain is its own greedy prompt decoding, deterministic given the committed
    # tokens: at temperature > 0 the target samples and the walk follows it
    acceptance_rules = ("greedy", "target_sampling")
    default_sampling = "target_sampling"

    @classmethod
    def options(cls) -> dict:
        return {**super().options(), "draft": Option(None, (str, Path, torch.nn.Module)),
                "prompt_tokens": Option(None, (str, Path)), "gamma": DRAFT_OPTIONS["gamma"],
                "tree": tree_option(16, 2, 512, "verified positions"),
                "shape": Option("dynamic", (str,), choices=SHAPES)}

    @classmethod
    def test_configs(cls, model, workdir):
        """A near copy of the model as the draft, with random prompt embeddings scaled up (so
        they sway the guesses): exactness must not depend on them."""
        draft = perturbed_copy(model)
        folder = Path(workdir) / "draft_prompts"
        p = new_prompts(draft, 3, 1, "ensemble", seed=3)
        with torch.no_grad():
            p.embeddings.mul_(50.0)
        save_trained(p, folder / "prompts.pt", prompts_meta(draft, 3, 1, "ensemble"))
        return [{"draft": draft, "prompt_tokens": str(folder), "tree": 12},
                {"draft": draft, "prompt_tokens": str(folder), "gamma": 2, "shape": "static"}]

    def __init__(self, model, tokenizer=None, **cfg):
        super().__init__(model, tokenizer, **cfg)
        self.draft = resolve_draft(self.cfg["draft"], model)
        self.prompts, self.trees = load_prompt_tokens(self, self.draft,
                                                      "python -m prompt_decoding.train --model <the draft>")

    def make_proposer(self, input_ids: torch.Tensor) -> Proposer:
        return PromptDraft(make_target(self.draft), self.prompts, self.trees, self.cfg["gamma"])
