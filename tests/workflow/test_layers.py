"""The import layers of common/ (pyproject.toml, [tool.importlinter]), checked by import-linter.

`lint-imports` runs on the repository as CI runs it; then on a copy of the packages with one
import added, to show each contract fails on what it forbids (every contract has such a probe,
checked against pyproject.toml): today's cycle brought back (model loading importing the
reduced-vocabulary tool), a bottom-layer module importing model loading, the workflow's planning
importing model code, one paper package importing another, and common/ importing a paper package.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("common", "ppd_pipelined", "bild", "prompt_decoding", "firp")
LINT = Path(sys.executable).with_name("lint-imports")


def lint(cwd: Path, *contracts: str) -> subprocess.CompletedProcess:
    """``lint-imports`` over the packages found first from ``cwd`` (PYTHONPATH precedes the
    editable install), with ``cwd``'s pyproject.toml."""
    env = {**os.environ, "PYTHONPATH": str(cwd)}
    cmd = [str(LINT), "--no-cache", "--config", str(cwd / "pyproject.toml")]
    for c in contracts:
        cmd += ["--contract", c]
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


def test_the_repository_keeps_every_contract():
    if not LINT.is_file():
        pytest.fail(f"{LINT} is missing: import-linter is pinned in requirements.txt (bash tools/setup.sh)")
    r = lint(ROOT)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "0 broken" in r.stdout


@pytest.fixture(scope="module")
def copy(tmp_path_factory) -> Path:
    """The five packages' Python files and pyproject.toml, copied."""
    dst = tmp_path_factory.mktemp("layers")
    for pkg in PACKAGES:
        shutil.copytree(ROOT / pkg, dst / pkg, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    shutil.copy(ROOT / "pyproject.toml", dst / "pyproject.toml")
    return dst


def _with_line(copy: Path, module: str, line: str):
    """A context manager appending ``line`` to ``module``'s file in the copy, then restoring it."""
    path = copy / (module.replace(".", "/") + ".py")

    class Edit:
        def __enter__(self):
            self.text = path.read_text()
            path.write_text(self.text + "\n\n" + line + "\n")

        def __exit__(self, *exc):
            path.write_text(self.text)
    return Edit()


def test_the_copy_keeps_them_unchanged(copy):
    r = lint(copy)
    assert r.returncode == 0, r.stdout + r.stderr


# (module, line appended to it, the contract that line breaks): one per contract at least
PROBES = [
    # a cycle inside one subpackage, held together by a function-level import (import-linter
    # counts those): the target imports trees, a tree reaching back to the target
    ("common.engine.tree", "def _target():\n    from .target import Target\n    return Target", "common-acyclic"),
    # a base utility reaching up into model loading
    ("common.checkpoints", "from .assets.models import load_model", "common-layers"),
    # model loading reaching up into a trained component (the cycle the layers once removed)
    ("common.assets.models", "def _labels(data, kind):\n    from ..components.reduced_vocab import label_tokens\n"
                             "    return label_tokens(data, kind)", "common-layers"),
    # the cache reaching up into the target adapter
    ("common.engine.cache", "from .target import Target", "engine-layers"),
    # the corpus builder reaching up into the labels made from it
    ("common.training.corpus", "from .teacher import concat", "training-layers"),
    # the decoder contract reaching into the training loop
    ("common.decoders.base", "from ..training.loop import train", "decoder-core"),
    # core importing a paper package
    ("common.engine.target", "import bild.decoding", "common-no-papers"),
    # the registry (the bottom of the decoders) reaching up into the decoder contract
    ("common.decoders.registry", "def _contract():\n    from .base import Decoder\n    return Decoder",
     "decoders-layers"),
    # planning a DAG loading model code: rule resources importing the target adapter
    ("common.workflow.resources", "def _target():\n    from common.engine.target import Target\n    return Target",
     "workflow-plans-torch-free"),
    # one paper package's workflow reaching into another's
    ("firp.workflow", "def _bild():\n    from bild.workflow import RuleParams\n    return RuleParams",
     "papers-independent"),
]


@pytest.mark.parametrize("module, line, contract", PROBES)
def test_each_contract_fails_on_what_it_forbids(copy, module, line, contract):
    with _with_line(copy, module, line):
        r = lint(copy, contract)
    assert r.returncode != 0, f"{contract} kept despite {module}: {line}\n{r.stdout}"
    assert "BROKEN" in r.stdout


def test_every_contract_has_a_probe():
    """A contract added to pyproject.toml without a probe above is a check nobody saw fail."""
    contracts = {c["id"] for c in tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]}
    probed = {contract for _, _, contract in PROBES}
    assert contracts == probed, f"contracts without a probe: {sorted(contracts - probed)}; probes of no contract: " \
                                f"{sorted(probed - contracts)}"
