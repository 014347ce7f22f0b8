"""The target adapter owns the model's KV cache, and times forwards honestly on CUDA.

* No decoder, proposer or worker outside the adapter modules touches a target's ``.cache``:
  they go through :class:`common.engine.target.CausalTarget`'s methods (``run_layers``,
  ``append_layer_kv``, ``gather_kv``, ``append_kv``, ``fresh``, ``layer_length``). A proposer's
  cache of its own model (EAGLE's draft head) is not a target's and is not looked at.
* ``Target._timed`` synchronizes a CUDA device before each clock reading (no GPU needed: the
  device type is faked and ``torch.cuda.synchronize`` counted).
"""
from __future__ import annotations

import ast
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

import common.engine.target as target_mod
from common.engine.target import CausalTarget

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("common", "ppd_pipelined", "bild", "prompt_decoding", "firp")
# The adapter and the cache mechanics it drives.
OWNERS = {"common/engine/target.py", "common/engine/cache.py", "common/engine/fast.py"}


def _target_cache_uses(tree: ast.AST) -> list[int]:
    """Lines of ``<...target>.cache`` (any name or attribute ending in ``target``, e.g.
    ``self.target.cache``, ``draft_target.cache``) and of ``self.cache`` inside a class deriving
    from a ``...Target`` class."""
    lines = []

    def visit(node, in_target_class: bool):
        if isinstance(node, ast.ClassDef):
            bases = [ast.unparse(b) for b in node.bases]
            in_target_class = any(b.split(".")[-1].endswith("Target") for b in bases)
        if isinstance(node, ast.Attribute) and node.attr == "cache":
            owner = ast.unparse(node.value)
            last = owner.split(".")[-1].lower()
            if last.endswith("target") or (owner == "self" and in_target_class):
                lines.append(node.lineno)
        for child in ast.iter_child_nodes(node):
            visit(child, in_target_class)
    visit(tree, False)
    return lines


def test_nothing_outside_the_adapter_touches_a_targets_cache():
    hits = []
    for pkg in PACKAGES:
        for f in sorted((ROOT / pkg).rglob("*.py")):
            rel = f.relative_to(ROOT).as_posix()
            if rel in OWNERS:
                continue
            hits += [f"{rel}:{n}" for n in _target_cache_uses(ast.parse(f.read_text()))]
    assert not hits, f"a target's cache used outside common/engine/target.py (add an adapter method): {hits}"


@pytest.mark.parametrize("source, found", [
    ("def f(self):\n    c = self.target.cache\n", True),
    ("class D(CausalTarget):\n    def f(self):\n        return self.cache.get_seq_length()\n", True),
    ("class P:\n    def f(self):\n        return self.cache.get_seq_length()\n", False),  # a proposer's own cache
    ("def f(self):\n    return self.target.run_layers(h, 0, 1, pos)\n", False),
])
def test_the_check_finds_what_it_forbids(source, found):
    assert bool(_target_cache_uses(ast.parse(source))) is found


class _Fake(CausalTarget):
    """A causal target whose forward returns zeros: no model, no device work."""

    def begin(self, prompt):
        self.prompt, self.cache = prompt, None

    def _forward(self, ids, keep, want_hidden):
        return torch.zeros(keep, 4), None


@pytest.mark.parametrize("device, syncs_per_forward", [("cuda", 2), ("cpu", 0)])
def test_every_forward_clock_synchronizes_a_cuda_device(monkeypatch, device, syncs_per_forward):
    calls = []
    monkeypatch.setattr(target_mod.torch.cuda, "synchronize", lambda d=None: calls.append(d))
    t = _Fake(SimpleNamespace(device=torch.device(device)))
    t.start(torch.tensor([[1, 2, 3]]))
    t.extend(torch.tensor([[4]]))
    t.sync([4, 5])
    assert t.forwards == 3
    assert len(calls) == 3 * syncs_per_forward
    assert all(d == torch.device(device) for d in calls)
