"""Peak memory of a block: sees an allocation made and freed inside it, and resets between blocks.

Deterministic: the test holds its allocation until the sampler has provably read the resident
set after the allocation was touched (two more samples), so no timing can make it miss. The
allocations are anonymous memory maps, touched page by page and unmapped on release: a freed
torch tensor may stay resident in the allocator's heap (seen on a CI machine), and a later one
may reuse resident pages, so neither would move the resident set reliably."""
import ctypes
import ctypes.util
import mmap
import time

import pytest

import torch

from common import hardware
from common.hardware import PeakMemory, describe

MIB = 2**20


def _hold_until_sampled(mem: PeakMemory, deadline_s: float = 60.0) -> None:
    """Return once the sampler has started a sample after this call began.

    Sample ``n + 1`` may have read the RSS before the caller's allocation; sample ``n + 2``
    starts after ``n + 1`` finished, so after this call began. The deadline only turns a dead
    sampler thread into a failure instead of a hang.
    """
    target, end = mem.samples + 2, time.monotonic() + deadline_s
    while mem.samples < target:
        assert time.monotonic() < end, "the sampling thread stopped sampling"
        time.sleep(0.0005)


def _resident(nbytes: int) -> mmap.mmap:
    """``nbytes`` of fresh anonymous memory, every page written (resident until ``close``)."""
    m = mmap.mmap(-1, nbytes)
    for i in range(0, nbytes, mmap.PAGESIZE):
        m[i] = 1
    return m


def test_peak_memory_sees_a_freed_allocation_and_resets():
    with PeakMemory("cpu") as big:
        x = _resident(200 * MIB)
        _hold_until_sampled(big)
        x.close()
    with PeakMemory("cpu") as small:
        y = _resident(MIB)
        y.close()
    assert big.peak - small.peak > 150 * MIB, (big.peak, small.peak)
    assert big.growth > 150 * MIB and small.growth < 32 * MIB, (big.growth, small.growth)


@pytest.mark.skipif(hardware._malloc_trim() is None, reason="no glibc: nothing returns a heap's free pages")
def test_a_block_starts_from_live_memory_not_from_pages_freed_before_it():
    """What made every bench record's peak the run's high-water mark: the C heap keeps freed
    pages resident. 200 MiB of 64 KiB chunks (below glibc's mmap threshold, so from the heap),
    written; every other one freed, so each free chunk lies between live ones and the heap's
    automatic trim of its top cannot return it: the block must start from what is live (100 MiB
    fewer), not from what the heap holds."""
    libc = ctypes.CDLL(ctypes.util.find_library("c"))
    libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]
    chunks = [libc.malloc(64 * 1024) for _ in range(3200)]
    for c in chunks:
        ctypes.memset(c, 1, 64 * 1024)
    for c in chunks[::2]:
        libc.free(c)
    held = hardware._rss()
    with PeakMemory("cpu", interval=3600) as mem:
        pass
    for c in chunks[1::2]:
        libc.free(c)
    assert held - mem.base > 80 * MIB, (held, mem.base)
    assert mem.growth < 16 * MIB


def test_an_allocation_alive_at_exit_is_counted_without_waiting():
    with PeakMemory("cpu", interval=3600) as mem:  # the thread never samples: entry and exit only
        x = _resident(100 * MIB)
    before = hardware._rss()
    x.close()
    assert mem.samples == 2 and mem.peak >= before - 8 * MIB
    assert mem.peak - hardware._rss() > 80 * MIB


def test_rss_reads_this_process():
    import psutil

    assert abs(hardware._rss() - psutil.Process().memory_info().rss) < 64 * MIB


def test_describe_names_the_cpu_and_torch():
    d = describe("cpu")
    assert d.startswith("cpu: ") and torch.__version__ in d


def test_cpu_name_adds_family_and_model_only_when_the_name_has_no_number():
    block = "processor\t: {}\nvendor_id\t: AuthenticAMD\ncpu family\t: 26\nmodel\t\t: 2\nmodel name\t: {}\n"
    bare = block.format(0, "AMD EPYC") + "\n" + block.format(1, "something else")
    assert hardware.cpu_name(bare) == "AMD EPYC (family 26 model 2)"
    assert hardware.cpu_name(block.format(0, "AMD EPYC 9454P 48-Core Processor")) == "AMD EPYC 9454P 48-Core Processor"
    assert hardware.cpu_name("processor\t: 0\n") is None


def test_code_version_names_the_commit():
    import re
    import subprocess

    from common.hardware import code_version

    head = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], capture_output=True, text=True).stdout.strip()
    v = code_version()
    assert re.fullmatch(r"[0-9a-f]{12}(\+dirty)?", v) and v.startswith(head)


def test_code_version_of_a_copy_without_git(tmp_path, monkeypatch):
    """A tree copied without .git reports unknown; CODE_VERSION, when set, names the commit
    (also inside a checkout: the GPU machine's copy carried a stale git folder)."""
    import importlib.util
    import shutil
    from pathlib import Path

    import common.hardware

    (tmp_path / "common").mkdir()
    shutil.copy(Path(common.hardware.__file__), tmp_path / "common" / "hardware.py")
    spec = importlib.util.spec_from_file_location("hardware_copy", tmp_path / "common" / "hardware.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    monkeypatch.delenv("CODE_VERSION", raising=False)
    assert mod.code_version() == "unknown"
    monkeypatch.setenv("CODE_VERSION", "0123456789ab")
    assert mod.code_version() == "0123456789ab"
    from common.hardware import code_version
    assert code_version() == "0123456789ab"


def test_device_clock_synchronizes_only_a_cuda_device(monkeypatch):
    """The clock every forward and decode time reads waits for a CUDA device's queued kernels
    (no GPU needed: ``torch.cuda.synchronize`` is counted)."""
    calls = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda d=None: calls.append(d))
    hardware.device_clock("cpu")
    assert calls == []
    hardware.device_clock(torch.device("cuda", 0))
    assert calls == [torch.device("cuda", 0)]


def test_a_decode_wall_time_reads_the_device_clock_at_both_ends(monkeypatch, tiny):
    import common.decoders.base as base
    from common.decoders import get_decoder

    seen = []
    monkeypatch.setattr(base, "device_clock", lambda d: seen.append(torch.device(d)) or float(len(seen)))
    out = get_decoder("vanilla", tiny).generate(torch.tensor([[1, 2, 3]]), 4)
    assert seen == [torch.device("cpu")] * 2 and out.stats["wall_time"] == 1.0


def test_check_fits_refuses_what_the_machine_cannot_hold():
    from common.errors import UserError

    gib = 1 << 30
    hardware.check_fits(2 * gib, "states", "fewer", available=4 * gib)   # fits beside the margin
    with pytest.raises(UserError, match=r"states need 3\.5 GiB and this machine has 4\.0 GiB available.*valid: fewer"):
        hardware.check_fits(int(3.5 * gib), "states", "fewer", available=4 * gib)
    avail = hardware.available_memory()
    assert avail is None or 0 < avail <= 1 << 50


def test_bf16_note_only_where_the_cpu_has_no_bf16_kernels(monkeypatch):
    from common.hardware import bf16_note, cpu_supports

    for supported in (False, True):
        monkeypatch.setattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", lambda: supported)
        cpu_supports.cache_clear()
        try:
            assert cpu_supports(torch.float32) and cpu_supports(torch.bfloat16) is supported
            note = bf16_note("bfloat16", "cpu")
            if supported:
                assert note is None                                  # native: nothing to say
            else:
                assert note.startswith("note: ") and "\n" not in note
            assert bf16_note("float32", "cpu") is None               # not a bf16 pass
            assert bf16_note("bfloat16", "cuda:0") is None           # the GPU computes it
        finally:
            cpu_supports.cache_clear()


def test_collect_garbage_freezes_once_and_still_collects_cycles_made_after():
    import gc
    import weakref

    hardware.collect_garbage()
    assert gc.get_freeze_count() > 0  # the heap alive at the first call is out of the collector's view

    class Node:
        pass

    a, b = Node(), Node()
    a.other, b.other = b, a  # a cycle: only the collector frees it
    gone = weakref.ref(a)
    del a, b
    with PeakMemory():  # the block's entry collects
        pass
    assert gone() is None
