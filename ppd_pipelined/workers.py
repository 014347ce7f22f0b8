"""Pipelined-decoding (ppd_pipelined) sub-workers and the two ways to run them: gloo processes, or serially in-process.

A sub-worker (PID 1..k in the paper's Algorithm 2) holds the model and a KV cache of the
committed tokens for layers ``[0, split)`` only. One *step* message from the main worker says:

* ``kv``: the KV of layers ``[0, split)`` for committed positions ``[start, start + n)`` that
  the sub-worker has not seen yet (usually n = 1: the current token x_t; the whole prompt
  plus x_1 on the first step of a sequence; ``start = 0`` begins a new sequence);
* either ``cand``, this sub-worker's early candidate for x_{t+1} (the paper: the main worker
  picks the top-k), or, with ``offload_head``, the exit hidden state ``h_exit`` from which
  the sub-worker computes the top-k itself, reports it, and takes the entry of its own rank.

The sub-worker commits ``kv``, runs its candidate at position ``start + n`` through layers
``[0, split)``, answers with the layer-``split`` hidden state and the candidate's KV, and
drops the candidate from its own cache again: only the main worker knows whether it was
right, and if it was, the main worker sends its KV back with the next step like any committed
token. So sub-worker caches only ever hold committed tokens; no "accept" message is needed.

Transport (:class:`GlooPool`): ``torch.distributed``'s gloo backend, point-to-point
``send``/``recv`` between rank 0 (main) and ranks 1..k, rendezvous through a ``FileStore`` in a
temporary folder, processes started by ``torch.multiprocessing`` (forkserver), the weights
passed in shared memory. Each pool owns a private ``ProcessGroupGloo`` rather than the
process-wide default group, so several decoders (and pools restarted after ``close()``)
coexist in one process. :class:`SerialPool` runs the same :class:`SubWorker` code in-process.

Wire format (float payloads are float32: lossless for fp32, bf16 and fp16 models):

* main -> sub, tag 0: header ``int64 [4] = (cmd, cand, start, n)``, then for a step the
  payload: KV ``[split, 2, kv_heads, n, head_dim]`` flattened, followed by ``h_exit [H]`` when
  ``cmd == SELECT`` (``cand`` is then ignored).
* sub -> main, tag 2 (``SELECT`` only): the top-k ``int64 [k]``, sent before the layers run.
* sub -> main, tag 1: ``[H + split * 2 * kv_heads * head_dim + 1]``: the hidden state, the
  candidate's KV ``[split, 2, kv_heads, 1, head_dim]`` flattened, and the step's busy seconds.
"""
from __future__ import annotations

import datetime
import os
import shutil
import tempfile
import time
import weakref

import torch
import torch.distributed as dist
from torch import nn
from common.engine.fast import accelerate  # importing it registers the fast path's attention
from common.errors import exit_on_sigterm
from common.engine.forward import embed, logits_from_hidden
from common.hardware import device_clock
from common.engine.target import CausalTarget

STOP, STEP, SELECT = 0, 1, 2
TAG_CMD, TAG_RES, TAG_CANDS = 0, 1, 2
START_TIMEOUT_S = 180.0   # the first pool's forkserver imports torch + transformers: ~5-8 s
REPLY_TIMEOUT = datetime.timedelta(seconds=600)   # main waiting for one step's result
IDLE_TIMEOUT = datetime.timedelta(days=7)         # sub-workers idle between generate calls


def kv_dims(model) -> tuple[int, int]:
    """``(kv_heads, head_dim)`` of the model's attention layers."""
    cfg = model.config
    heads = cfg.num_attention_heads
    kv_heads = getattr(cfg, "num_key_value_heads", None) or heads
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // heads
    return kv_heads, head_dim


def early_topk(model, h_exit: torch.Tensor, head, k: int) -> list[int]:
    """Top-k early candidates from the exit hidden state ``[1, 1, H]`` (the paper's line 12/14)."""
    return torch.topk(logits_from_hidden(model, h_exit, head)[0, -1], k).indices.tolist()


class SubWorker:
    """Sub-worker ``index`` (0-based) of ``k``: state and step, shared by both pools."""

    def __init__(self, model, split: int, index: int, k: int, head=None):
        self.model, self.split, self.index, self.k, self.head = model, split, index, k, head
        self.target = CausalTarget(model)  # its own KV cache, filled with KV the main worker sends

    def step(self, cand: int, start: int, kv: torch.Tensor, h_exit: torch.Tensor | None = None,
             report=None) -> torch.Tensor:
        """Commit ``kv`` (``[split, 2, kvh, n, hd]``) at ``[start, start+n)``, run a candidate there.

        With ``h_exit`` (``[1, 1, H]``) the candidate is this worker's entry of the top-k, which
        is handed to ``report`` first. Returns the packed result (module docstring).
        """
        t0 = device_clock(self.model.device)
        if h_exit is not None:
            cands = early_topk(self.model, h_exit.to(self.model.dtype), self.head, self.k)
            report(cands)
            cand = cands[self.index]
        n = kv.shape[3]
        if start == 0 or not self.target.started:
            self.target.fresh()
        else:
            self.target.crop(start)  # no-op normally; drops anything the main did not commit
        self.target.append_kv(kv)
        dev = self.model.device
        pos = torch.tensor([[start + n]], device=dev)
        h = self.target.run_layers(embed(self.model, torch.tensor([[cand]], device=dev)), 0, self.split, pos)
        new_kv = self.target.gather_kv(self.split, start + n, start + n + 1)
        self.target.crop(start + n)  # the candidate is tentative: keep committed tokens only
        busy = device_clock(self.model.device) - t0
        return torch.cat([h.reshape(-1).float(), new_kv.reshape(-1), torch.tensor([busy], device=dev)])


def unpack_result(buf: torch.Tensor, hidden: int, kv_shape) -> tuple[torch.Tensor, torch.Tensor]:
    """Result buffer -> (hidden ``[1, 1, H]`` fp32, KV ``[split, 2, kvh, 1, hd]`` fp32)."""
    return buf[:hidden].view(1, 1, hidden), buf[hidden:-1].view(*kv_shape)


class _Pool:
    """What both pools share: shapes and statistics."""

    def __init__(self, model, split: int, k: int):
        self.k, self.split, self.hidden = k, split, model.config.hidden_size
        kvh, hd = kv_dims(model)
        self.kv_shape = (split, 2, kvh, 1, hd)
        self.reset_stats()

    def reset_stats(self) -> None:
        self.busy_s = [0.0] * self.k   # per sub-worker: seconds spent on steps
        self.wait_s = 0.0              # main blocked on sub-worker messages
        self.inline_s = 0.0            # main-process time inside pool calls that is not main work


class SerialPool(_Pool):
    """The k sub-workers run one after another in the calling process (debugging, tests)."""

    backend = "serial"

    def __init__(self, model, split: int, k: int, head=None):
        super().__init__(model, split, k)
        self.workers = [SubWorker(model, split, i, k, head) for i in range(k)]
        self._results: list = [None] * k
        self._cands: list[int] | None = None

    def dispatch(self, cands: list[int] | None, start: int, kv: torch.Tensor, h_exit=None) -> None:
        for i, w in enumerate(self.workers):
            self._results[i] = w.step(cands[i] if cands else -1, start, kv, h_exit, self._report)
            self.busy_s[i] += float(self._results[i][-1])
            self.inline_s += float(self._results[i][-1])  # sub-worker work done on the main's clock

    def _report(self, cands: list[int]) -> None:
        self._cands = cands

    def candidates(self) -> list[int]:
        return self._cands

    def result(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return unpack_result(self._results[i], self.hidden, self.kv_shape)

    def drain(self) -> None:
        self._results, self._cands = [None] * self.k, None

    def close(self) -> None:
        self.workers = []


# ---------------------------------------------------------------------- gloo processes

def _make_group(store_path: str, rank: int, world: int, timeout) -> dist.ProcessGroupGloo:
    """A private gloo group over loopback (no default process group, no hand-made sockets)."""
    store = dist.FileStore(store_path, world)
    opts = dist.ProcessGroupGloo._Options()
    opts._timeout = timeout
    opts._devices = [dist.ProcessGroupGloo.create_device(hostname="127.0.0.1")]
    return dist.ProcessGroupGloo(store, rank, world, opts)


def model_recipe(model) -> tuple:
    """What a worker needs to rebuild ``model`` on the same (shared-memory) tensors.

    The module itself is not pickled: forward hooks (transformers installs closures on every
    layer after one ``output_hidden_states=True`` call) and other attributes may not pickle.
    Returns ``(class, config, {name: parameter or buffer}, fast)``, non-persistent buffers included;
    ``fast``: the model runs :mod:`common.engine.fast`'s path (each worker packs its own weights).
    """
    tensors = dict(model.named_parameters(remove_duplicate=False))
    tensors.update(model.named_buffers(remove_duplicate=False))
    return type(model), model.config, tensors, bool(getattr(model, "_fast_path", False))


def rebuild_model(recipe) -> nn.Module:
    """Inverse of :func:`model_recipe`: a skeleton on the meta device, then the shared tensors."""
    cls, config, tensors, fast = recipe
    with torch.device("meta"):
        model = cls(config)  # no memory and no init cost: every tensor is replaced below
    for name, t in tensors.items():
        owner, _, attr = name.rpartition(".")
        mod = model.get_submodule(owner)
        if attr in mod._parameters:
            mod._parameters[attr] = t if isinstance(t, nn.Parameter) else nn.Parameter(t, requires_grad=False)
        else:
            mod._buffers[attr] = t
    if fast:  # the fast path's packed weights are per process (oneDNN layouts do not share)
        accelerate(model)
    return model.eval()


def _worker_main(rank: int, world: int, store_path: str, setup, split: int, threads: int, ready) -> None:
    """Entry point of sub-worker process ``rank``: serve steps until STOP or the main is gone."""
    torch.set_num_threads(threads)
    recipe, head = setup.get()
    model = rebuild_model(recipe)
    ready.put(rank)
    pg = _make_group(store_path, rank, world, IDLE_TIMEOUT)
    kvh, hd = kv_dims(model)
    worker = SubWorker(model, split, rank - 1, world - 1, head)
    header = torch.zeros(4, dtype=torch.long)

    def report(cands):
        pg.send([torch.tensor(cands, dtype=torch.long)], 0, TAG_CANDS).wait()

    with torch.inference_mode():
        while True:
            try:
                pg.recv([header], 0, TAG_CMD).wait()
            except RuntimeError:
                return  # the main process went away (connection closed): nothing left to serve
            cmd, cand, start, n = header.tolist()
            if cmd == STOP:
                return
            kv_size = split * 2 * kvh * n * hd
            payload = torch.empty(kv_size + (model.config.hidden_size if cmd == SELECT else 0))
            pg.recv([payload], 0, TAG_CMD).wait()
            kv = payload[:kv_size].view(split, 2, kvh, n, hd)
            h_exit = payload[kv_size:].view(1, 1, -1) if cmd == SELECT else None
            pg.send([worker.step(cand, start, kv, h_exit, report)], 0, TAG_RES).wait()


class GlooPool(_Pool):
    """k sub-worker processes connected to this (main, rank 0) process by gloo."""

    backend = "gloo"

    def __init__(self, model, split: int, k: int, threads: int, head=None):
        super().__init__(model, split, k)
        self._dir = tempfile.mkdtemp(prefix="ppd_gloo_")
        # The rendezvous folder must go however the process ends: close(), garbage
        # collection or interpreter exit (finalize), and SIGTERM, whose default action skips
        # all of those; exit_on_sigterm turns it into SystemExit so they run.
        self._rm_dir = weakref.finalize(self, shutil.rmtree, self._dir, ignore_errors=True)
        exit_on_sigterm()
        self._procs, self._pg = [], None
        self._bufs = [torch.empty(self.hidden + split * self.kv_shape[2] * 2 * self.kv_shape[4] + 1)
                      for _ in range(k)]
        self._cand_bufs = [torch.empty(k, dtype=torch.long) for _ in range(k)]
        self._recvs: list = [None] * k
        self._cand_recvs: list = [None] * k
        self._sends: list = []
        try:
            self._start(model, threads, head)
        except BaseException:
            self.close()
            raise

    def _start(self, model, threads: int, head) -> None:
        model.share_memory()  # workers map the same weights instead of loading their own
        if head is not None:
            head.share_memory()
        # forkserver: a clean server process (no OpenMP threads yet, so forking it is safe)
        # imports torch, transformers and the model code once; every pool after the first
        # then starts in ~0.1 s instead of the ~8 s a spawn costs.
        ctx = torch.multiprocessing.get_context("forkserver")
        ctx.set_forkserver_preload([__name__, type(model).__module__])
        setup, ready = ctx.Queue(), ctx.Queue()
        store = os.path.join(self._dir, "store")
        for r in range(1, self.k + 1):
            p = ctx.Process(target=_worker_main, args=(r, self.k + 1, store, setup, self.split, threads, ready),
                            daemon=True, name=f"ppd-sub-{r}")
            p.start()
            self._procs.append(p)
        # The weights go through a queue, not the process arguments: those carry at most ~250
        # file descriptors (one per shared tensor), fewer than a real model has.
        for _ in range(self.k):
            setup.put((model_recipe(model), head))
        deadline, started = time.monotonic() + START_TIMEOUT_S, 0
        while started < self.k:
            dead = [p for p in self._procs if not p.is_alive()]
            if dead:
                raise RuntimeError(f"ppd_pipelined sub-worker {dead[0].name} exited with code {dead[0].exitcode} while "
                                   "starting; backend='serial' runs the same algorithm without processes")
            if time.monotonic() > deadline:
                raise RuntimeError(f"ppd_pipelined sub-workers did not start within {START_TIMEOUT_S:.0f} s")
            try:
                ready.get(timeout=0.2)
                started += 1
            except Exception:  # queue.Empty: poll liveness again
                pass
        self._pg = _make_group(store, 0, self.k + 1, REPLY_TIMEOUT)

    def dispatch(self, cands: list[int] | None, start: int, kv: torch.Tensor, h_exit=None) -> None:
        """Send each sub-worker its candidate (or ``h_exit`` ``[1, 1, H]`` to choose from) and
        the new committed KV ``[split, 2, kvh, n, hd]``; post the receives for the answers."""
        self.drain()
        payload = kv.reshape(-1) if h_exit is None else torch.cat([kv.reshape(-1), h_exit.reshape(-1).float()])
        for i in range(self.k):
            header = torch.tensor([SELECT if h_exit is not None else STEP, cands[i] if cands else -1,
                                   start, kv.shape[3]], dtype=torch.long)
            self._sends += [(header, self._pg.send([header], i + 1, TAG_CMD)),
                            (payload, self._pg.send([payload], i + 1, TAG_CMD))]
            if h_exit is not None:
                self._cand_recvs[i] = self._pg.recv([self._cand_bufs[i]], i + 1, TAG_CANDS)
            self._recvs[i] = self._pg.recv([self._bufs[i]], i + 1, TAG_RES)

    def candidates(self) -> list[int]:
        """The top-k the sub-workers chose (``SELECT`` steps); every one computes the same."""
        self._wait_cands(0)
        return self._cand_bufs[0].tolist()

    def result(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Wait for sub-worker ``i``'s step: (hidden ``[1, 1, H]``, KV ``[split, 2, kvh, 1, hd]``)."""
        self._wait(i)
        h, kv = unpack_result(self._bufs[i], self.hidden, self.kv_shape)
        return h.clone(), kv.clone()  # the buffer is reused by the next step

    def _timed_wait(self, work) -> None:
        t0 = time.perf_counter()
        work.wait()
        waited = time.perf_counter() - t0
        self.wait_s += waited
        self.inline_s += waited

    def _wait_cands(self, i: int) -> None:
        if self._cand_recvs[i] is not None:
            self._timed_wait(self._cand_recvs[i])
            self._cand_recvs[i] = None

    def _wait(self, i: int) -> None:
        self._wait_cands(i)
        if self._recvs[i] is not None:
            self._timed_wait(self._recvs[i])
            self._recvs[i] = None
            self.busy_s[i] += float(self._bufs[i][-1])

    def drain(self) -> None:
        """Wait for every outstanding message (results nobody needs still count as busy time)."""
        for i in range(self.k):
            self._wait(i)
        for _, work in self._sends:
            work.wait()
        self._sends = []

    def close(self) -> None:
        """Stop the workers (STOP message, then join; terminate if they do not exit)."""
        if self._pg is not None:
            try:
                self.drain()
                stop = torch.tensor([STOP, 0, 0, 0], dtype=torch.long)
                for r in range(1, self.k + 1):
                    if self._procs[r - 1].is_alive():
                        self._pg.send([stop], r, TAG_CMD).wait(datetime.timedelta(seconds=10))
            except RuntimeError:
                pass  # a worker is already gone: terminate below
            self._pg = None
        for p in self._procs:
            p.join(timeout=10)
            if p.is_alive():
                p.terminate()
                p.join(timeout=5)
        self._procs = []
        self._rm_dir()
