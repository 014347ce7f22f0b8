"""The executed notebooks are generated from notebooks/src/*.py (tools/make_notebook.py): a source
edited without regenerating its notebooks would leave the rules running the old code."""
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_every_notebook_matches_its_source():
    r = subprocess.run([sys.executable, "tools/make_notebook.py", "--check"], cwd=ROOT, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stderr
