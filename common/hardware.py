"""Describe the machine a result came from, measure peak memory of a call, and read a clock that
waits for the device."""
from __future__ import annotations

import ctypes
import ctypes.util
import functools
import gc
import os
import platform
import subprocess
import threading
import time
from pathlib import Path

import torch


def device_clock(device) -> float:
    """``time.perf_counter()`` once ``device`` has finished its queued work: CUDA kernels run
    asynchronously, so an unsynchronized clock around GPU work times its launch, not the work.
    Every clock that times a forward or a decode reads this one."""
    device = torch.device(device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()


def describe(device: str = "cpu") -> str:
    """One line naming the hardware, e.g. 'cpu: AMD EPYC 9454P (2 threads), torch 2.13.0+cpu'."""
    if device.startswith("cuda") and torch.cuda.is_available():
        name = torch.cuda.get_device_name(torch.device(device))
        return f"{device}: {name}, torch {torch.__version__}"
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as fh:
            cpu = cpu_name(fh.read()) or cpu
    except OSError:
        pass
    return f"cpu: {cpu} ({torch.get_num_threads()} threads), torch {torch.__version__}"


def cpu_name(cpuinfo: str) -> str | None:
    """The processor's name from ``/proc/cpuinfo``'s text, with its family and model numbers
    when the name carries no model number: a virtual machine may show only "AMD EPYC", and two
    machines named so ran the same fp32 forward at 20 and 40 tokens/s (families 25 and 26), so
    records from both must not read as one machine's."""
    fields: dict[str, str] = {}
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if not line.strip():
            break  # the first processor's block is enough
        fields.setdefault(key.strip(), value.strip())
    name = fields.get("model name")
    if name and not any(c.isdigit() for c in name) and "cpu family" in fields and "model" in fields:
        return f"{name} (family {fields['cpu family']} model {fields['model']})"
    return name


@functools.lru_cache(maxsize=None)
def cpu_supports(dtype: torch.dtype) -> bool:
    """Whether this CPU's oneDNN has kernels for ``dtype``: fp32 always; bf16 and fp16 only where
    the CPU has the instructions (torch's own check, ``torch.ops.mkldnn._is_mkldnn_bf16_supported``
    / ``_fp16_``). Without them oneDNN refuses to prepack such a weight (``common.engine.fast``), and
    PyTorch's dense bf16 GEMM ran ~5x slower than fp32 on an AMD EPYC of family 25 (AVX2, no
    AVX-512), so a bf16 copy runs its linears widened there (``common.engine.fast.WidenedLinear``;
    docs/operations.md)."""
    if dtype == torch.float32:
        return True
    if dtype == torch.bfloat16:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    if dtype == torch.float16:
        return bool(torch.ops.mkldnn._is_mkldnn_fp16_supported())
    return False


def bf16_note(dtype: str, device: str = "cpu") -> str | None:
    """A ``note:`` line when a CPU pass in ``dtype`` = bfloat16 will run without bf16 kernels."""
    if dtype != "bfloat16" or not str(device).startswith("cpu") or cpu_supports(torch.bfloat16):
        return None
    return ("note: this CPU has no bf16 kernels (torch.ops.mkldnn._is_mkldnn_bf16_supported() is False): the "
            "bfloat16 pass runs its linear layers on the fp32 units (bf16 operands widened exactly, fp32 sums, bf16 "
            "results: common.engine.fast.WidenedLinear), at about float32's speed; the recipe's dtype is kept")


try:
    _PAGE = os.sysconf("SC_PAGE_SIZE")
except (ValueError, OSError, AttributeError):  # not a POSIX system: psutil is used instead
    _PAGE = 4096


def code_version() -> str:
    """The commit of this repository that produced a record, ``+dirty`` when tracked code
    files (anything outside ``results/``) differ from it; ``unknown`` outside a git checkout.
    The environment variable ``CODE_VERSION``, when set, names the commit instead: a copy of the
    tree sent elsewhere (the lent GPU machine) may carry no git folder, or a stale one."""
    if os.environ.get("CODE_VERSION"):
        return os.environ["CODE_VERSION"]
    root = Path(__file__).resolve().parent.parent
    try:
        rev = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=root, capture_output=True,
                             text=True, timeout=10)
        if rev.returncode != 0:
            return "unknown"
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", "--", ".", ":!results"],
                               cwd=root, capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return rev.stdout.strip() + ("+dirty" if dirty else "")


def _rss() -> int:
    """This process's resident set size in bytes (``/proc/self/statm`` on Linux: no psutil
    object, no allocation worth noticing, ~10 us; psutil elsewhere)."""
    try:
        with open("/proc/self/statm", "rb") as fh:
            return int(fh.read().split()[1]) * _PAGE
    except OSError:
        import psutil  # only off Linux (no /proc): not imported where it is never needed

        return psutil.Process().memory_info().rss


def available_memory() -> int | None:
    """Bytes the OS can still give this process without swapping (``MemAvailable`` of
    ``/proc/meminfo``; psutil elsewhere); None where neither says."""
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        import psutil  # only off Linux (no /proc)

        return int(psutil.virtual_memory().available)
    except ImportError:
        return None


# Left free beside a large allocation: what the rest of a run (a training step, an evaluation)
# still allocates after it.
MEMORY_MARGIN = 1 << 30


def check_fits(nbytes: int, what: str, hint: str, available: int | None = None) -> None:
    """UserError before allocating ``nbytes`` for ``what`` when this machine cannot hold them
    (beside :data:`MEMORY_MARGIN`): a run that would fill the memory after half an hour of work
    is killed by the OS with nothing said; this says it at once, and ``hint`` how to make it
    smaller. ``available``: bytes free (default :func:`available_memory`; unknown: not checked)."""
    from .errors import UserError  # here: this module also loads on its own, outside the package

    free = available_memory() if available is None else available
    if free is not None and nbytes + MEMORY_MARGIN > free:
        gib = 1 << 30
        raise UserError(f"{what} need {nbytes / gib:.1f} GiB and this machine has {free / gib:.1f} GiB available "
                        f"(keeping {MEMORY_MARGIN / gib:.0f} GiB free beside them); valid: {hint}")


@functools.lru_cache(maxsize=1)
def _malloc_trim():
    """glibc's ``malloc_trim``, or None where the C library is not glibc (musl, macOS)."""
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim
    except (OSError, AttributeError):
        return None


def release_free_memory() -> bool:
    """Hand the pages the C allocator holds free back to the OS (``malloc_trim(0)``), so that the
    resident set counts live memory again; False where that is not possible (no glibc).

    Why: a freed torch CPU tensor stays resident in the allocator's heap until something trims
    it, so without this the resident set hardly ever shrinks, and a call's peak would include
    whatever any earlier call left behind."""
    trim = _malloc_trim()
    if trim is None:
        return False
    trim(0)
    return True


_frozen = False


def collect_garbage() -> None:
    """A full garbage collection, cheap after the first: the first call moves every object then
    alive (the imports, the model, the decoders: ~410 k objects once the embedded model is loaded)
    into the collector's permanent generation (``gc.freeze``), so later calls scan only what was
    made since. A full collection over that heap took 0.4 s on the 2-core CPU, once per decoder
    call (it runs outside every clock, but a study dataset makes ~500 calls). Garbage made after
    the first call is still collected; what was alive at it is freed by its reference counts as
    before, and only a reference cycle among those objects that becomes garbage later would stay."""
    global _frozen
    gc.collect()
    if not _frozen:
        gc.freeze()
        _frozen = True


class PeakMemory:
    """Peak memory during a ``with`` block, in bytes, and how far it rose above the entry.

    CUDA: ``torch.cuda.max_memory_allocated`` (reset on entry); ``base`` is
    ``memory_allocated`` at entry. CPU: the resident set sampled every ``interval`` seconds by
    a background thread, on entry, and once more on exit (torch's CPU allocations are invisible
    to tracemalloc). On entry a CPU block first collects garbage (:func:`collect_garbage`) and
    returns the allocator's free pages to the OS (:func:`release_free_memory`), so ``base`` is the memory live at entry; left
    alone, the resident set hardly ever shrank between calls, so a call's peak was nearly always
    the process's high-water mark so far (a ``vanilla`` call after a lookahead call reported
    lookahead's memory). ``growth``
    (``peak - base``) is what the block itself added: its transient tensors, and whatever
    native caches it grew that outlive it (oneDNN keeps compiled kernels per input shape, so a
    decoder whose step shapes vary grows them in the calls that meet new shapes). The
    kernel's own high-water mark (``VmHWM`` reset through ``/proc/self/clear_refs``) is not used:
    on one machine the reset was accepted, looked effective, and the peak still stayed at the
    process's lifetime maximum, which no check inside the process can tell apart from a real
    peak. Sampling cannot be fooled that way; a peak held for less than ``interval`` can be
    missed. ``samples`` counts the samples taken. ``peak`` is this process's memory, model
    weights included; worker processes are not counted. The entry's collection and trim run
    before the block, outside any clock the block reads.
    """

    def __init__(self, device: str = "cpu", interval: float = 0.002):
        self.device, self.interval, self.peak, self.samples, self.base = device, interval, 0, 0, 0
        self._thread = None

    @property
    def growth(self) -> int:
        """Bytes the block rose above its entry (``peak - base``, never negative)."""
        return max(0, self.peak - self.base)

    def __enter__(self):
        if self.device.startswith("cuda"):
            self.base = torch.cuda.memory_allocated(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            return self
        collect_garbage()
        release_free_memory()
        self._stop = threading.Event()
        self._sample()
        self.base = self.peak
        self._thread = threading.Thread(target=self._run, daemon=True, name="peak-memory")
        self._thread.start()
        return self

    def _sample(self) -> None:
        self.peak = max(self.peak, _rss())
        self.samples += 1

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self._sample()

    def __exit__(self, *exc):
        if self.device.startswith("cuda"):
            self.peak = torch.cuda.max_memory_allocated(self.device)
            return
        self._stop.set()
        self._thread.join()
        self._sample()


def provenance(model_name: str, device: str, version: str) -> dict:
    """What a stats file says about where it was made (read by the components notebook).
    ``version``: :func:`code_version` read when the run started (a commit made while a
    training ran is not the code that trained)."""
    return {"model": model_name, "hardware": describe(device), "code_version": version}
