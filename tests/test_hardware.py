"""Peak memory of a block: sees an allocation made and freed inside it, and resets between blocks."""
import torch

from common.hardware import PeakMemory, describe


def test_peak_memory_sees_a_freed_allocation_and_resets():
    with PeakMemory("cpu") as big:
        x = torch.ones(64 * 2**20 // 4)  # 64 MiB, touched
        del x
    with PeakMemory("cpu") as small:
        y = torch.ones(16)
        del y
    assert big.peak - small.peak > 48 * 2**20


def test_describe_names_the_cpu_and_torch():
    d = describe("cpu")
    assert d.startswith("cpu: ") and torch.__version__ in d
