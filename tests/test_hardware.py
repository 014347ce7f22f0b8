"""Peak memory of a block: sees an allocation made and freed inside it, and resets between blocks,
whether the kernel's peak-RSS reset works (exact path) or is ignored (sampling fallback)."""
import time

import pytest
import torch

from common import hardware
from common.hardware import PeakMemory, describe


def _big_then_small():
    with PeakMemory("cpu") as big:
        x = torch.ones(64 * 2**20 // 4)  # 64 MiB, touched
        time.sleep(0.05)  # long enough for the sampling fallback (2 ms period) to see it
        del x
    with PeakMemory("cpu") as small:
        y = torch.ones(16)
        del y
    return big.peak, small.peak


@pytest.mark.parametrize("kernel_reset", [True, False], ids=["kernel-hwm", "sampling"])
def test_peak_memory_sees_a_freed_allocation_and_resets(monkeypatch, kernel_reset):
    if kernel_reset and not hardware._reset_hwm():
        pytest.skip("this kernel ignores the peak-RSS reset; the sampling case covers it")
    if not kernel_reset:
        monkeypatch.setattr(hardware, "_reset_hwm", lambda: False)
    big, small = _big_then_small()
    assert big - small > 48 * 2**20


def test_an_ignored_peak_reset_is_detected(monkeypatch, tmp_path):
    # A sandbox that accepts the clear_refs write but keeps the lifetime peak must not be trusted.
    monkeypatch.setattr(hardware, "_CLEAR_REFS", tmp_path / "clear_refs")
    fake = {"VmHWM": 2 * 2**30, "VmRSS": 2**30}
    monkeypatch.setattr(hardware, "_status_kb", fake.get)
    assert hardware._reset_hwm() is False
    fake["VmHWM"] = 2**30 + 2**20
    assert hardware._reset_hwm() is True


def test_describe_names_the_cpu_and_torch():
    d = describe("cpu")
    assert d.startswith("cpu: ") and torch.__version__ in d
