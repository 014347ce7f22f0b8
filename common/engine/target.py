"""Target adapters: the one owner of a model's forwards and KV cache during decoding.

No decoder calls ``model(...)`` or builds a cache itself; it asks a :class:`Target` for

* :meth:`~Target.start` - a new sequence: the prompt's prefill, logits of the first new token;
* :meth:`~Target.extend` - committed tokens appended (a decoding step, or a draft's catch-up);
* :meth:`~Target.verify` - one forward over a token tree (and any positions a proposer
  injects), logits of every node;
* :meth:`~Target.accept` / :meth:`~Target.crop` - the cache reduced to what was accepted.

Methods that split the layer stack (pipelined decoding, CALM, early exits, layer skipping) use
:class:`CausalTarget`'s layer-level methods instead of the cache: :meth:`~CausalTarget.run_layers`
(a layer range over given states), :meth:`~CausalTarget.append_layer_kv` (state propagation to
skipped layers), :meth:`~CausalTarget.gather_kv` / :meth:`~CausalTarget.append_kv` (committed KV
moved between processes), :meth:`~CausalTarget.layer_length`, and :meth:`~CausalTarget.fresh` (an
empty cache for a worker that receives its prefix as KV). :class:`SharedCacheTarget` is a
target on another target's cache (an early exit drafting for its own model).

Every clock around a forward synchronizes a CUDA device first (kernels run asynchronously: an
unsynchronized clock would time the launch, not the forward).

:class:`CausalTarget` serves decoder-only LMs (every method). :class:`Seq2SeqTarget` serves
encoder-decoders (BiLD's T5/mT5): the encoder runs once per prompt, the decoder starts from
the decoder-start token, and only the decoder's self-attention cache is ever cropped (the
cross-attention cache depends on the encoder output alone). It verifies chains only: T5's
relative position bias has no position ids to give tree nodes their depths.

``length`` counts the positions in the (decoder self-attention) cache; a tree loop crops to
``prefix + accepted`` in those units, whatever the model kind.
"""
from __future__ import annotations

from typing import Sequence

import torch
from transformers import DynamicCache, EncoderDecoderCache

from .cache import accept_path, append_kv, crop_to, gather_kv, seq_length
from ..errors import UserError, check_layers
from .fast import new_cache
from .forward import Injection, Verified, append_layer_kv, num_layers, run_layers, verify_forward
from ..hardware import device_clock
from .tree import TreeBuffers

KINDS = ("causal", "seq2seq")


def model_kind(model) -> str:
    """``"seq2seq"`` for encoder-decoders, ``"causal"`` otherwise."""
    return "seq2seq" if getattr(getattr(model, "config", None), "is_encoder_decoder", False) else "causal"


def make_target(model) -> "Target":
    """The adapter for ``model``'s kind."""
    return Seq2SeqTarget(model) if model_kind(model) == "seq2seq" else CausalTarget(model)


class Target:
    """A model and the cache of the one sequence it decodes (reset by :meth:`start`)."""

    kind = "base"
    # Set to a list to log every forward as ``[cached positions before it, new positions]``
    # (analytic FLOP and memory counts); None (the default, also for subclasses that skip
    # this __init__) logs nothing.
    calls: list[list[int]] | None = None

    def __init__(self, model):
        self.model = model
        self.cache = None
        self.prompt: torch.Tensor | None = None
        self.forwards, self.forward_s = 0, 0.0  # model forwards and their wall time, this sequence

    def _timed(self, fn, *args):
        if self.calls is not None:
            # args[0]: the ``[1, q]`` ids of a forward or the ``[q]`` nodes of a verification
            self.calls.append([self.length, int(args[0].shape[-1])])
        t0 = self._clock()
        out = fn(*args)
        self.forwards, self.forward_s = self.forwards + 1, self.forward_s + self._clock() - t0
        return out

    def _clock(self) -> float:
        """The clock once the target's device has finished its queued work (:func:`device_clock`)."""
        return device_clock(self.device)

    @property
    def device(self) -> torch.device:
        return self.model.device

    @property
    def length(self) -> int:
        """Positions held by the (self-attention) cache."""
        return 0 if self.cache is None else seq_length(self.cache)

    @property
    def started(self) -> bool:
        """Whether a cache exists (after :meth:`start`, :meth:`begin` or ``fresh``)."""
        return self.cache is not None

    def sequence(self, tokens: Sequence[int]) -> torch.Tensor:
        """``[1, L]`` ids the cache holds once ``tokens`` (new tokens, in order) are committed."""
        raise NotImplementedError

    def start(self, prompt: torch.Tensor, want_hidden: bool = False, capture: Sequence[int] = ()):
        """Begin a sequence: prefill ``prompt`` (``[1, S]``).

        Args:
            capture: decoder layers whose inputs this sequence's prefill and extensions keep in
                ``captured`` (``{layer: [q, H]}``, the last forward's positions): a proposer that
                reads intermediate states of the committed positions (EAGLE-3's fused features)
                names them (``Proposer.capture_layers``) and the tree loop asks here.
        Returns:
            ``([V] logits of the first new token, [1, k, H] final normed states or None)``.
        """
        self.set_capture(capture)
        self.begin(prompt)
        self.forwards, self.forward_s = 0, 0.0
        if self.calls is not None:
            self.calls = []
        logits, hidden = self._timed(self._forward, self.sequence([]), 1, want_hidden)
        return logits[-1], hidden

    capture: tuple[int, ...] = ()  # layers whose inputs the forwards keep (set by :meth:`start`)

    def set_capture(self, capture: Sequence[int]) -> None:
        """Keep the inputs of decoder layers ``capture`` in this sequence's forwards (``captured``)."""
        if capture:
            raise UserError(f"a {self.kind} target keeps no layer inputs; valid: proposers that read none "
                            "(capture_layers empty)")

    def sync(self, tokens: Sequence[int]) -> torch.Tensor:
        """Feed whatever of the sequence holding ``tokens`` the cache lacks; ``[V]`` logits of
        the last position. Only the missing tail is built (no copy of the whole sequence)."""
        n, before = self.length, self.sequence([]).shape[1]  # cached, and positions before the new tokens
        if n < before:
            new = self.sequence(tokens)[:, n:]
        else:
            new = torch.as_tensor([list(tokens[n - before:])], dtype=torch.long, device=self.prompt.device)
        return self._timed(self._forward, new, 1, False)[0][-1]

    def extend(self, ids: torch.Tensor, keep: int = 1, want_hidden: bool = False):
        """Append ``[1, q]`` ids; returns ``([keep, V] logits of the last positions, hidden)``."""
        return self._timed(self._forward, ids, keep, want_hidden)

    def verify(self, tree_tokens: torch.Tensor, tree: TreeBuffers, injections: Sequence[Injection] = (),
               capture: Sequence[int] = (), head: bool = True) -> tuple[torch.Tensor | None, Verified]:
        """One forward over ``[n]`` tree tokens (node 0 = root, not yet cached).

        Args:
            head: apply the LM head to every node; False leaves it to the caller (greedy
                acceptance needs it only along the accepted path: :meth:`head_rows`).
        Returns:
            ``([n, V] logits or None, Verified)``; the cache gains every node (see :meth:`accept`).
        """
        return self._timed(self._verify, tree_tokens, tree, tuple(injections), tuple(capture), head)

    lazy_head = False  # whether verify(head=False) is supported

    def head_rows(self, verified: Verified, rows) -> torch.Tensor:
        """``[k, V]`` logits of the nodes ``rows`` from a ``verify(head=False)``."""
        return self.model.lm_head(verified.hidden[rows])

    def _verify(self, tree_tokens, tree, injections, capture, head):
        raise NotImplementedError

    def accept(self, prefix_len: int, path: torch.Tensor) -> None:
        """Keep the first ``prefix_len`` positions and the accepted nodes ``path`` (root first)."""
        if torch.equal(path.cpu(), torch.arange(path.numel(), device="cpu")):
            crop_to(self.cache, prefix_len + path.numel())  # a prefix of the node order: no copy
        else:
            accept_path(self.cache, prefix_len, path)

    def crop(self, length: int) -> None:
        crop_to(self.cache, length)

    def begin(self, prompt: torch.Tensor) -> None:
        """A new sequence with an empty (decoder) cache; nothing is computed yet except, for an
        encoder-decoder, the encoder."""
        raise NotImplementedError

    # -- implementation -----------------------------------------------------------------------
    def _forward(self, ids: torch.Tensor, keep: int, want_hidden: bool):
        raise NotImplementedError


class CausalTarget(Target):
    """Decoder-only LMs: the sequence is prompt ++ new tokens."""

    kind = "causal"

    def __init__(self, model):
        super().__init__(model)
        self.captured: dict[int, torch.Tensor] = {}  # {layer: [q, H]} of the last prefill/extension

    def set_capture(self, capture: Sequence[int]) -> None:
        # the prefill's and extensions' layer inputs (a verification forward returns its own:
        # ``Verified.captured``)
        if capture:
            check_layers(list(capture), num_layers(self.model), "captured layer", lo=0)
        self.capture, self.captured = tuple(capture), {}

    def begin(self, prompt):
        self.prompt = prompt
        self.cache = new_cache(self.model)

    def sequence(self, tokens):
        if not len(tokens):
            return self.prompt
        return torch.cat([self.prompt, torch.as_tensor([list(tokens)], device=self.prompt.device)], dim=1)

    def _forward(self, ids, keep, want_hidden):
        # model() itself: the strongest single-step path (and bitwise what vanilla always ran).
        out = self.model(input_ids=ids, past_key_values=self.cache, use_cache=True, logits_to_keep=keep,
                         output_hidden_states=want_hidden or bool(self.capture))
        if self.capture:
            # hidden_states[l], l < d: the input of layer l (0: the embeddings), as verify_forward captures it
            self.captured = {layer: out.hidden_states[layer][0] for layer in self.capture}
        return out.logits[0], (out.hidden_states[-1] if want_hidden else None)

    lazy_head = True

    # -- layer-level access (methods that split the layer stack) --------------------------------
    def fresh(self) -> None:
        """An empty cache and no prompt: for a worker that receives its prefix as KV
        (:meth:`append_kv`) instead of prefilling it."""
        self.prompt = None
        self.cache = new_cache(self.model)

    def layer_length(self, layer: int) -> int:
        """Positions the cache holds at decoder layer ``layer`` (layers may differ: a draft on
        the first layers runs ahead of the rest, a skipped layer holds none)."""
        return 0 if self.cache is None else self.cache.get_seq_length(layer_idx=layer)

    def run_layers(self, hidden: torch.Tensor, start: int, end: int, position_ids: torch.Tensor,
                   position_embeddings=None) -> torch.Tensor:
        """Decoder layers ``[start, end)`` over ``hidden`` (``[1, q, H]``, the input of layer
        ``start``) at ``position_ids`` (``[1, q]``), causally after what those layers cache,
        appending to them; returns ``[1, q, H]`` (:func:`common.engine.forward.run_layers`). Positions
        are not checked against the context here (:func:`common.engine.forward.check_context`, once per
        step, is the caller's: a check per layer call would synchronize a GPU each time)."""
        return run_layers(self.model, hidden, self.cache, start, end, position_ids,
                          position_embeddings=position_embeddings)

    def append_layer_kv(self, layers, hidden: torch.Tensor, position_ids: torch.Tensor,
                        position_embeddings=None) -> None:
        """Give each of ``layers`` (skipped by an early exit) the keys/values of input ``hidden``
        (``[1, q, H]``) at ``position_ids``, as if it had entered them
        (:func:`common.engine.forward.append_layer_kv`)."""
        append_layer_kv(self.model, self.cache, layers, hidden, position_ids, position_embeddings)

    def gather_kv(self, layers: int, start: int, end: int) -> torch.Tensor:
        """KV of positions ``[start, end)`` of layers ``[0, layers)``: ``[layers, 2, kvh, n, hd]``
        fp32 (:func:`common.engine.cache.gather_kv`: what pipelined decoding sends between workers)."""
        return gather_kv(self.cache, layers, start, end)

    def append_kv(self, kv: torch.Tensor) -> None:
        """Append ``kv`` (``[layers, 2, kvh, n, hd]``, from :meth:`gather_kv`) to layers
        ``[0, layers)``, in the model's dtype."""
        append_kv(self.cache, kv, self.model.dtype)

    def _verify(self, tree_tokens, tree, injections, capture, head):
        past = self.length
        tree = tree.to(tree_tokens.device)
        v = verify_forward(self.model, self.cache, tree_tokens, tree.ancestor_mask, past + tree.depth,
                           injections, capture)
        return (self.model.lm_head(v.hidden) if head else None), v


class SharedCacheTarget(CausalTarget):
    """A causal target on ``owner``'s model and cache, never a cache of its own (an early exit
    drafting for its own model: both append to one cache, at different layers). The owner
    starts and ends each sequence; this target only extends it."""

    def __init__(self, owner: Target):
        self.owner, self.model = owner, owner.model
        self.forwards, self.forward_s = 0, 0.0

    cache = property(lambda self: self.owner.cache)
    prompt = property(lambda self: self.owner.prompt)

    def begin(self, prompt):
        raise AssertionError("a target on a shared cache starts with its owner's sequence (owner.start first)")

    def fresh(self) -> None:
        raise AssertionError("a target on a shared cache has no cache of its own")


class Seq2SeqTarget(Target):
    """Encoder-decoders: encoder once per prompt, decoder from the decoder-start token."""

    kind = "seq2seq"

    def begin(self, prompt):
        self.prompt = prompt
        self.mask = torch.ones_like(prompt)
        self.encoded = self.model.get_encoder()(input_ids=prompt, attention_mask=self.mask)
        self.cache = EncoderDecoderCache(DynamicCache(), DynamicCache())
        start = self.model.config.decoder_start_token_id
        if start is None:
            raise UserError(f"{type(self.model).__name__} has no decoder_start_token_id in its config")
        self.start_ids = torch.tensor([[start]], device=prompt.device)

    def sequence(self, tokens):
        if not len(tokens):
            return self.start_ids
        return torch.cat([self.start_ids, torch.as_tensor([list(tokens)], device=self.prompt.device)], dim=1)

    def _forward(self, ids, keep, want_hidden):
        out = self.model(encoder_outputs=self.encoded, attention_mask=self.mask, decoder_input_ids=ids,
                         past_key_values=self.cache, use_cache=True, output_hidden_states=want_hidden)
        return out.logits[0, -keep:], (out.decoder_hidden_states[-1] if want_hidden else None)

    def _verify(self, tree_tokens, tree, injections, capture, head):
        if injections or capture:
            raise UserError("an encoder-decoder target takes no injected positions or captured layers; "
                            "valid: proposers without in-forward positions (chain drafts)")
        if not tree.is_chain:
            raise UserError(f"an encoder-decoder target verifies chains only (T5's relative position bias "
                            f"gives tree nodes no depth); got a {tree.size}-node tree with branches")
        # Proposers that read target states (Medusa heads) serve causal LMs only: no hidden
        # states are gathered here.
        logits, _ = self._forward(tree_tokens[None], keep=tree_tokens.numel(), want_hidden=False)
        return logits, Verified(None, logits.new_zeros(0, 0), {})
