"""Predictive Pipelined Decoding (Yang et al., Algorithms 1 and 2): the ``ppd_pipelined`` decoder.

Workers and messages (``d`` layers, exit layer ``d_bar``, ``split = min(d_bar, d - d_bar)``):

* The **main worker** (this process) decodes greedily and owns the full KV cache. For the
  current token x_t it runs layers ``[0, d_bar)``, reads the top-k early candidates for
  x_{t+1} from the exit classifier (``head``; default: the model's own final norm + LM head),
  sends candidate i to sub-worker i together with the committed KV of layers ``[0, split)``
  that sub-worker has not seen (x_t's, or prompt + x_1 on the first step), then finishes
  layers ``[d_bar, d)`` and takes x_{t+1} = argmax of the final logits.
* **Sub-worker i** (see :mod:`ppd_pipelined.workers`) meanwhile runs its candidate at the
  next position through layers ``[0, split)`` and returns the layer-``split`` hidden state and
  the candidate's KV of those layers.
* If x_{t+1} equals candidate j, the main worker takes sub-worker j's KV into its cache and
  continues x_{t+1} from layer ``split`` (``d_bar - split`` layers to the exit, then
  ``d - d_bar``) instead of from layer 0; otherwise it starts x_{t+1} at layer 0 and the
  sub-workers' results are discarded.

``split`` is Algorithm 2's ``d - d_bar`` for ``d_bar >= d/2``: the sub-workers run exactly as
many layers as the main worker needs to finish the current token, so a matched token costs
``d_bar`` layer times (Theorem 4.1: a run of X tokens takes ``d + (X - 1) d_bar``). With
``d_bar = d/2`` this is Algorithm 1. The theorem assumes ``d_bar >= d/2``; smaller exit layers
work too (sub-workers then run ``[0, d_bar)`` and finish before the main worker, so a
matched token costs ``d - d_bar``), they are just outside the theorem.

``offload_head=True`` (not in the paper): the exit classifier is a full vocabulary
projection; on SmolLM2-135M (V = 49152, H = 576) it costs about 6 layer forwards, and in the
paper's order it sits on the main worker's critical path for every token. With the option
the main worker sends the exit hidden state instead of candidates; every sub-worker computes
the same top-k, reports it before running its layers, and runs the entry of its own rank.
Candidates, tokens and stats are unchanged; only who computes the head moves.

Exactness: every token is the argmax of a full ``d``-layer forward over the committed
sequence, as in vanilla greedy. Sub-workers reuse the committed KV tensors (sent losslessly)
and the same layer code as the main worker. Bitwise, hidden states still differ from
vanilla's by ~3e-5 in the logits (embedded model): ``run_layers`` passes an explicit 4D mask,
which sends sdpa's single-token call to another kernel than vanilla's mask-free call, and
sdpa's summation order depends on the thread count (hence one ``threads`` for all workers).
Greedy tokens are equal unless two logits tie that closely; the tests check token for token.

Limits: at most :data:`MAX_K` sub-workers (each gloo sub-worker is a process with a share of
the CPU; beyond 8 the machines this targets have no cores left to give). The gloo backend
starts processes (forkserver), so scripts using it need the usual ``if __name__ == "__main__":``
guard.
"""
from __future__ import annotations

import time
import weakref
from pathlib import Path

import torch
from torch import nn

from common.decoders.base import DecodeOutput, Decoder, Option
from common.errors import UserError, check_range
from common.paths import load_or_error
from common.engine.forward import check_layer, embed, logits_from_hidden, num_layers
from common.hardware import device_clock

from .workers import GlooPool, SerialPool, early_topk

MAX_K = 8
BACKENDS = ("gloo", "serial")


def check_model(model) -> None:
    """Raise UserError unless ``model`` is LLaMA-style (the base class has already refused an
    encoder-decoder: this decoder declares causal models only)."""
    inner = getattr(model, "model", None)
    missing = [a for a in ("layers", "embed_tokens", "norm", "rotary_emb") if not hasattr(inner, a)]
    missing += [] if hasattr(model, "lm_head") else ["lm_head"]
    if missing:
        raise UserError(f"ppd_pipelined needs a LLaMA-style causal LM (model.model.layers/embed_tokens/"
                        f"norm/rotary_emb, model.lm_head); {type(model).__name__} lacks {', '.join(missing)}")


def load_head(head, model) -> nn.Module | None:
    """The exit-layer classifier: None (model's LM head), a module, or a saved Linear state dict.

    The head sees the final-normed exit hidden state ``[1, 1, H]`` and must return ``[1, 1, V]``
    logits over the model's vocabulary.
    """
    if head is None or isinstance(head, nn.Module):
        return head
    if not isinstance(head, (str, Path)):
        raise UserError(f"head must be None, an nn.Module or a path to a saved state dict; got {type(head).__name__}")
    path = Path(head)
    state = load_or_error(path, lambda p: torch.load(p, map_location="cpu", weights_only=True), "head file",
                          "delete it and train the heads again (python -m ppd_pipelined.heads)")
    weights = [key for key in state if key == "weight" or key.endswith(".weight")] if isinstance(state, dict) else []
    if len(weights) != 1:
        raise UserError(f"head file {str(path)!r} must hold one nn.Linear state dict (a 'weight' [V, H], "
                        f"optional 'bias'); found keys {sorted(state)[:6] if isinstance(state, dict) else type(state).__name__}")
    w = state[weights[0]]
    b = state.get(weights[0][: -len("weight")] + "bias")
    vocab, hidden = model.lm_head.out_features, model.config.hidden_size
    if w.dim() != 2 or tuple(w.shape) != (vocab, hidden):
        raise UserError(f"head file {str(path)!r}: weight has shape {list(w.shape)}; valid: [{vocab}, {hidden}]")
    lin = nn.Linear(hidden, vocab, bias=b is not None, dtype=model.dtype)
    lin.load_state_dict({"weight": w, **({"bias": b} if b is not None else {})})
    return lin.eval()


def run_lengths(matches: list[bool]) -> list[int]:
    """Paper Section 4.1 runs: a run starts at the first token and at every missed prediction.

    ``len(matches) == n - 1`` -> run lengths summing to ``n``.
    """
    runs = [1]
    for m in matches:
        if m:
            runs[-1] += 1
        else:
            runs.append(1)
    return runs


class PipelinedDecoder(Decoder):
    """Predictive Pipelined Decoding with ``k`` sub-workers and an early exit at ``exit_layer`` (see module docstring).

    Options: ``k`` (sub-workers, 1..8), ``exit_layer`` (``d_bar``, default ``d // 2``, any of
    ``1..d-1``), ``head`` (exit classifier: None, an ``nn.Linear`` or a path to its saved
    state dict), ``backend`` (``"gloo"``: sub-worker processes; ``"serial"``: the same
    algorithm in this process), ``threads`` (intra-op threads of every worker; default: this
    process's thread count split over the k + 1 workers for gloo, unchanged for serial),
    ``offload_head`` (sub-workers run the exit head; default False, the paper's order).

    The gloo worker pool starts on the first ``generate`` and lives until :meth:`close`, garbage
    collection or interpreter exit. The decoder is also a context manager.
    """

    name = "ppd_pipelined"
    lossless = True

    @classmethod
    def options(cls) -> dict:
        return {"k": Option(1, (int,), lo=1, hi=MAX_K), "exit_layer": Option(None, (int,), lo=1),
                "head": Option(None, (str, Path, nn.Module)), "backend": Option("gloo", (str,), choices=BACKENDS),
                "threads": Option(None, (int,), lo=1), "offload_head": False}

    @classmethod
    def test_configs(cls, model, workdir):
        # serial: the same algorithm in-process (the gloo pool has tests of its own)
        d = num_layers(model)
        return [{"k": 1, "backend": "serial"}, {"k": 3, "exit_layer": d - 1, "backend": "serial"},
                {"k": 2, "exit_layer": 1, "backend": "serial", "offload_head": True}]

    def __init__(self, model, tokenizer=None, **cfg):
        super().__init__(model, tokenizer, **cfg)
        check_model(model)
        self.d = num_layers(model)
        # types and ranges are checked by the option declarations; what depends on the model:
        k, exit_layer, backend, threads = (self.cfg[n] for n in ("k", "exit_layer", "backend", "threads"))
        check_range("k", k, 1, model.lm_head.out_features)
        self.exit_layer = self.d // 2 if exit_layer is None else exit_layer
        check_layer(model, self.exit_layer, "exit_layer")
        self.offload_head = self.cfg["offload_head"]
        self.k, self.backend = k, backend
        self.split = min(self.exit_layer, self.d - self.exit_layer)  # layers a sub-worker runs
        self.head = load_head(self.cfg["head"], model)
        self.threads = threads if threads is not None or backend == "serial" else \
            max(1, torch.get_num_threads() // (k + 1))
        self._pool = self._finalizer = None
        self._pool_start_s = 0.0

    # ------------------------------------------------------------------ pool lifecycle
    def _ensure_pool(self):
        self._pool_start_s = 0.0
        if self._pool is None:
            t0 = time.perf_counter()
            if self.backend == "serial":
                pool = SerialPool(self.model, self.split, self.k, self.head)
            else:
                pool = GlooPool(self.model, self.split, self.k, self.threads, self.head)
            # finalize (not __del__): runs once, on close(), garbage collection or exit, and
            # holds only the pool, so the decoder itself can still be collected.
            self._pool, self._finalizer = pool, weakref.finalize(self, pool.close)
            self._pool_start_s = time.perf_counter() - t0
        return self._pool

    def close(self) -> None:
        """Shut the worker pool down (a later ``generate`` starts a new one)."""
        if self._finalizer is not None:
            self._finalizer()
        self._pool = self._finalizer = None

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ------------------------------------------------------------------ decoding
    def _generate(self, input_ids: torch.Tensor, max_new_tokens: int) -> DecodeOutput:
        pool = self._ensure_pool()
        prev_threads = torch.get_num_threads()
        if self.threads:
            torch.set_num_threads(self.threads)  # same count as the sub-workers (exactness, no oversubscription)
        try:
            return self._decode(pool, input_ids, max_new_tokens)
        except BaseException:
            self.close()  # an interrupted exchange leaves the workers out of step: restart next time
            raise
        finally:
            torch.set_num_threads(prev_threads)

    def _decode(self, pool, input_ids: torch.Tensor, max_new_tokens: int) -> DecodeOutput:
        m, d, d_bar, split, k = self.model, self.d, self.exit_layer, self.split, self.k
        pool.reset_stats()
        clock = lambda: device_clock(m.device)  # noqa: E731  (waits for a GPU's queued work)
        t_start = clock()
        # The prefill is vanilla's own call, so the prompt KV is bitwise vanilla's.
        target = self.target  # its cache: the main worker's full KV cache
        logits, _ = target.start(input_ids)
        tok = int(logits.argmax())
        layer_s, layer_n, head_s, head_n = 0.0, 0, 0.0, 0
        tokens, matches = [tok], []
        pos = input_ids.shape[1]  # position of the current token x_t = tokens[-1]
        synced = 0                # committed positions the sub-workers hold
        h_split = None            # [1, 1, H] layer-`split` output of x_t from a matching sub-worker
        while tok not in self.eos and len(tokens) < max_new_tokens:
            pos_ids = torch.tensor([[pos]], device=m.device)
            t0 = clock()
            if h_split is None:       # no match: x_t from layer 0
                h, n_layers = target.run_layers(embed(m, torch.tensor([[tok]], device=m.device)), 0, d_bar, pos_ids), d_bar
            else:                     # match: continue from the sub-worker's layer `split`
                h = target.run_layers(h_split, split, d_bar, pos_ids) if split < d_bar else h_split
                n_layers = d_bar - split
            t1 = clock()
            last = len(tokens) + 1 >= max_new_tokens  # x_{t+1} is the last token: no successor to start
            if self.offload_head and not last:  # sub-workers run the exit head, each takes its rank
                cands = None
                pool.dispatch(None, synced, target.gather_kv(split, synced, pos + 1), h_exit=h)
            else:                               # the paper: the main worker picks and distributes
                cands = early_topk(m, h, self.head, k)
                head_s, head_n = head_s + clock() - t1, head_n + 1
                if not last:
                    pool.dispatch(cands, synced, target.gather_kv(split, synced, pos + 1))
            if not last:
                synced = pos + 1
            t2 = clock()
            h = target.run_layers(h, d_bar, d, pos_ids)
            t3 = clock()
            tok = int(logits_from_hidden(m, h)[0, -1].argmax())
            if cands is None:
                cands = pool.candidates()  # long arrived: sent before the sub-workers' layers
            layer_s += (t1 - t0) + (t3 - t2)
            layer_n += n_layers + d - d_bar
            matches.append(tok in cands)
            tokens.append(tok)
            pos += 1
            h_split = None
            if matches[-1] and not last and tok not in self.eos:
                h_split, kv = pool.result(cands.index(tok))
                target.append_kv(kv)
                h_split = h_split.to(m.dtype)
        pool.drain()
        main_busy = clock() - t_start - pool.inline_s  # minus waiting (gloo) or sub-worker steps (serial)
        n = len(tokens)
        return DecodeOutput(tokens, {
            "steps": n, "accept_lengths": [1] * n,
            "matches": matches, "runs": run_lengths(matches),
            "p_correct": sum(matches) / len(matches) if matches else None,
            "worker_busy_s": [main_busy, *pool.busy_s],  # main first, then sub-workers 1..k
            "wait_s": pool.wait_s,                        # main blocked on a sub-worker's result
            "layer_time_s": layer_s / layer_n if layer_n else None,  # one decoder layer, main worker
            "main_layer_forwards": layer_n,
            "head_time_s": head_s / head_n if head_n else None,  # exit head + top-k, main worker
            "k": k, "exit_layer": d_bar, "sub_layers": split, "layers": d,
            "backend": self.backend, "threads": self.threads or torch.get_num_threads(),
            "offload_head": self.offload_head, "pool_start_s": self._pool_start_s,
        })
