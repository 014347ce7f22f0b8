"""Big Little Decoder (Kim et al., 2023): the ``bild`` decoder on the shared tree loop.

The paper's Algorithm 1, step by step, as this loop runs it (greedy, batch 1):

* the large model's prefill gives the first token;
* the small model runs autoregressively until its maximum next-token probability falls
  below ``fallback_threshold`` (alpha_FB; that token is dropped: *fallback*) or it has made
  ``max_small_tokens`` (N) tokens;
* the large model runs one non-autoregressive pass over every pending small token and
  produces one token of its own (the tree loop's verification of a chain);
* *rollback*: at the first pending position m where the cross-entropy of the small token
  under the large model, ``-log p_L(y_m)``, exceeds ``rollback_threshold`` (alpha_RB, nats),
  the small tokens from m on are dropped and the large model's argmax takes position m (Eq. 3
  with the paper's distance, section 4.2: nothing else decides); both caches are cropped (the
  loop's ``update_inputs_and_kv`` and the draft's ``update``).

``rollback_rule``: ``paper`` (the default, as above) or ``argmax_differs``, which also asks that
the large model's argmax differ from ``y_m`` before it rolls back (a position whose small token
already is the large model's choice is kept, however unlikely it is). The second is not the
paper's rule: it is what the committed BiLD records ran (their labels pin it; the paper rule's
rerun is pending, issue #81), kept as a labelled option so both can be measured.

Statistics beside the tree loop's: ``source`` (which model produced each token), ``segments``
(the text in runs of one source, for Figure 10), ``rollbacks``, ``fallbacks``, per-model
forward counts and times, and ``large_calls`` / ``small_calls``: every forward as ``[cached
positions, new positions]`` (Figure 8's analytic counts, :mod:`bild.flops`).

So ``rollback_threshold=0`` and ``fallback_threshold=1`` each give exactly the large model's
greedy tokens (tests).

*Early exit* (section 4.4, Figure 6): with ``exit_layer=k`` instead of ``small`` the small model
is the large model's own first ``k`` layers with its final norm and LM head (the model trained
with the averaged exit loss, :mod:`bild.exits`, carries a head shared by both), and the two
share one KV cache (:mod:`common.decoders.early_exit`): the small model's cache *is* the large
model's first ``k`` layers' cache, and the large model's non-autoregressive pass runs only
layers ``[k, d)`` over the positions the small model already took through the first ``k``. Its
tokens equal those of ``small=<a copy of the first k layers>`` (a test), at less cost. Ablations: ``rollback=False`` keeps every small token (alpha_RB = inf);
``fallback=False`` hands over only every ``max_small_tokens`` tokens.

Where this differs from the official code: after a rollback the official script runs the
large model again from the corrected position, and it never checks the small tokens made
after the last hand-over when generation ends; here every token is verified by the large
model's pass, and the next round starts from the corrected token (the paper's loop). A
threshold of 0 is honoured (the official script silently ignores it).
"""
from __future__ import annotations

from pathlib import Path

import torch

from common.engine.acceptance import AcceptanceRule, register_rule
from common.decoders.base import DecodeOutput, Option
from common.decoders.early_exit import SharedExitTarget
from common.decoders.speculative import AutoregressiveDraft, resolve_draft
from common.decoders.tree_loop import Proposer, TreeDecoder
from common.errors import UserError
from common.engine.target import make_target, model_kind

from .examples import segments


ROLLBACK_RULES = ("paper", "argmax_differs")


@register_rule
class Rollback(AcceptanceRule):
    """BiLD's rollback policy on a chain of small-model tokens (greedy; lossy unless the
    threshold is 0). ``threshold`` is alpha_RB in nats; ``inf`` never rolls back; ``rule`` is
    one of :data:`ROLLBACK_RULES` (the module docstring)."""

    name = "rollback"
    temperatures = ("zero",)
    chain_only = True

    def evaluate(self, tree_tokens, logits, retrieve, draft_tokens, draft_probs, generator):
        path = retrieve[0]
        g = path.numel() - 1
        if g == 0:
            return path, int(logits[path[0]].argmax())
        y = tree_tokens[path[1:]]                                      # [g] small tokens
        logp = torch.log_softmax(logits[path[:-1]].float(), dim=-1)    # [g, V] large model before each
        nll = -logp.gather(-1, y[:, None]).squeeze(-1)                 # cross-entropy of the hard label
        bad = nll > self.options["threshold"]
        if self.options.get("rule", "paper") == "argmax_differs":
            bad &= logp.argmax(-1) != y
        m = int(bad.long().argmax()) if bool(bad.any()) else g          # first rolled-back position
        return path[: m + 1], int(logits[path[m]].argmax())


class BigLittleDecoder(TreeDecoder):
    """Decoder ``bild`` (see the module docstring). Serves causal LMs and encoder-decoders;
    the small model must share the large one's vocabulary and kind."""

    name = "bild"
    lossless = False  # exact only at rollback_threshold=0 or fallback_threshold=1
    model_kinds = ("causal", "seq2seq")
    acceptance_rules = ("rollback",)
    default_greedy = "rollback"

    @classmethod
    def options(cls) -> dict:
        return {"small": Option(None, (str, Path, torch.nn.Module)),
                "exit_layer": Option(None, (int,), lo=1),
                "fallback_threshold": Option(0.5, (float,), lo=0.0, hi=1.0),
                "rollback_threshold": Option(5.0, (float,), lo=0.0),
                # records older than the option ran argmax_differs
                "rollback_rule": Option("paper", (str,), choices=ROLLBACK_RULES, legacy="argmax_differs"),
                "max_small_tokens": Option(10, (int,), lo=1),
                "fallback": True, "rollback": True,
                "temperature": Option(0.0, (float,), lo=0.0, hi=0.0), "seed": 0,
                "acceptance": Option(None, (str,), choices=("rollback",))}

    def __init__(self, model, tokenizer=None, **cfg):
        super().__init__(model, tokenizer, **cfg)
        k = self.cfg["exit_layer"]
        if k is None:
            self.small = resolve_draft(self.cfg["small"], model)
            return
        if self.cfg["small"] is not None:
            raise UserError("decoder 'bild' takes small=<model> or exit_layer=<k> (early exit), not both")
        if model_kind(model) != "causal":
            raise UserError("decoder 'bild' with exit_layer needs a causal LM (the early exit runs the "
                            "model's layer stack, common.engine.forward); encoder-decoders take small=<model>")
        self.small, self.target = None, SharedExitTarget(model, k)

    def rule_options(self) -> dict:
        return {"threshold": self.cfg["rollback_threshold"] if self.cfg["rollback"] else float("inf"),
                "rule": self.cfg["rollback_rule"]}

    def make_proposer(self, input_ids: torch.Tensor) -> Proposer:
        fallback = self.cfg["fallback_threshold"] if self.cfg["fallback"] else 0.0
        small = make_target(self.small) if self.small is not None else self.target.draft()
        small.calls = []  # per-forward log for bild.flops (Figure 8)
        self._small_target = small
        return AutoregressiveDraft(small, self.cfg["max_small_tokens"], fallback=fallback)

    def generate(self, input_ids: torch.Tensor, max_new_tokens: int) -> DecodeOutput:
        out = super().generate(input_ids, max_new_tokens)
        if self.tokenizer is not None:
            # Figure 10's marked text; decoded after the timed call, so wall_time excludes it.
            out.stats["segments"] = segments(self.tokenizer, out.tokens, out.stats["source"])
        return out

    def _generate(self, input_ids: torch.Tensor, max_new_tokens: int) -> DecodeOutput:
        self.target.calls = []  # reset by start(); logged: [cached positions, new positions] per forward
        out = super()._generate(input_ids, max_new_tokens)
        st = out.stats
        st["large_calls"], st["small_calls"] = self.target.calls, self._small_target.calls
        self.target.calls = None
        # Which model produced each committed token: accepted small tokens, then the large
        # model's own token of that step (the prefill's token is the large model's).
        source = ["large"]
        for a in st["accepted"][1:]:
            source += ["small"] * a + ["large"]
        st["source"] = source[: len(out.tokens)]
        st["rollbacks"] = sum(a < p for p, a in zip(st["proposed"], st["accepted"]))
        st["large_forwards"], st["large_forward_s"] = st.pop("target_forwards"), st.pop("target_forward_s")
        st["small_forwards"], st["small_forward_s"] = st.pop("draft_forwards"), st.pop("draft_forward_s")
        st.setdefault("fallbacks", 0)
        return out
