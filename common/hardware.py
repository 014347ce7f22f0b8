"""Describe the machine a result came from, and measure peak memory of a call."""
from __future__ import annotations

import platform
import re
import threading
from pathlib import Path

import torch


def describe(device: str = "cpu") -> str:
    """One line naming the hardware, e.g. 'cpu: AMD EPYC 9454P (2 threads), torch 2.13.0+cpu'."""
    if device.startswith("cuda") and torch.cuda.is_available():
        name = torch.cuda.get_device_name(torch.device(device))
        return f"{device}: {name}, torch {torch.__version__}"
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as fh:
            cpu = next(line.split(":", 1)[1].strip() for line in fh if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return f"cpu: {cpu} ({torch.get_num_threads()} threads), torch {torch.__version__}"


_STATUS, _CLEAR_REFS = Path("/proc/self/status"), Path("/proc/self/clear_refs")


def _status_kb(field: str) -> int | None:
    """A ``/proc/self/status`` field (``VmHWM``, ``VmRSS``) in bytes, or None off Linux."""
    try:
        m = re.search(rf"^{field}:\s+(\d+) kB", _STATUS.read_text(), re.M)
    except OSError:
        return None
    return int(m.group(1)) * 1024 if m else None


def _vm_hwm() -> int | None:
    """The kernel's peak resident set size of this process (bytes), or None off Linux."""
    return _status_kb("VmHWM")


def _reset_hwm(slack: int = 8 * 2**20) -> bool:
    """Reset the kernel's peak RSS to the current RSS; True only if the reset took effect.

    Some kernels and sandboxes accept the write to ``clear_refs`` and ignore it (seen on a CI
    machine: the peak stayed at the process's lifetime maximum), so the reset is checked: after
    it, the peak must be the current RSS give or take ``slack``.
    """
    try:
        _CLEAR_REFS.write_text("5")  # "5": reset the peak RSS to the current RSS
    except OSError:
        return False
    hwm, rss = _vm_hwm(), _status_kb("VmRSS")
    return hwm is not None and rss is not None and hwm <= rss + slack


class PeakMemory:
    """Peak memory during a ``with`` block, in bytes.

    CUDA: ``torch.cuda.max_memory_allocated``. CPU on Linux: the kernel's high-water mark of
    the resident set (``VmHWM``), reset on entry through ``/proc/self/clear_refs`` (torch's CPU
    allocations are invisible to tracemalloc); exact, and nothing runs beside the timed code.
    Where that reset is refused or silently ignored: the RSS sampled every ``interval`` seconds
    by a background thread, and once more on exit (a peak shorter than ``interval`` can be
    missed). ``peak`` is this process's memory, model weights included; worker processes are
    not counted.
    """

    def __init__(self, device: str = "cpu", interval: float = 0.002):
        self.device, self.interval, self.peak = device, interval, 0
        self._thread = None

    def __enter__(self):
        if self.device.startswith("cuda"):
            torch.cuda.reset_peak_memory_stats(self.device)
            return self
        if _reset_hwm():
            return self
        import psutil

        self._proc = proc = psutil.Process()
        self._stop = threading.Event()
        self.peak = proc.memory_info().rss

        def sample():
            while not self._stop.is_set():
                self.peak = max(self.peak, proc.memory_info().rss)
                self._stop.wait(self.interval)

        self._thread = threading.Thread(target=sample, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc):
        if self.device.startswith("cuda"):
            self.peak = torch.cuda.max_memory_allocated(self.device)
        elif self._thread is None:
            self.peak = _vm_hwm()
        else:
            self._stop.set()
            self._thread.join()
            self.peak = max(self.peak, self._proc.memory_info().rss)
