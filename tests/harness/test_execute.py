"""common.harness.execute: notebooks run on kernels that listen on Unix sockets, several at once."""
import json
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[2]


def _notebook(path: Path, body: str) -> Path:
    nb = nbformat.v4.new_notebook()
    params = nbformat.v4.new_code_cell("tag = None\ninputs = []")
    params.metadata["tags"] = ["parameters"]
    nb.cells = [params, nbformat.v4.new_code_cell(body)]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, str(path))
    return path


def _run(*args):
    return subprocess.run([sys.executable, "-m", "common.harness.execute", *map(str, args)], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)


# The kernel reports its own connection: the transport it listens on and the parameters it got.
REPORT = ("import json\nfrom ipykernel import get_connection_info\n"
          "info = json.loads(get_connection_info())\n"
          "print(json.dumps({'transport': info['transport'], 'tag': tag, 'inputs': inputs}))")


def _report(out: Path) -> dict:
    nb = nbformat.read(str(out), as_version=4)
    return json.loads(nb.cells[-1].outputs[0]["text"])


def test_parallel_kernels_listen_on_unix_sockets(tmp_path):
    """Four notebooks started together: each runs, on an ipc kernel, with its own parameters."""
    src = _notebook(tmp_path / "nb.ipynb", REPORT)
    with ThreadPoolExecutor(4) as pool:
        runs = list(pool.map(lambda i: (i, _run(src, tmp_path / f"out{i}.ipynb", "-p", "tag", f"t{i}",
                                                 "-y", json.dumps({"inputs": [f"a{i}", "b"]}))), range(4)))
    for i, r in runs:
        assert r.returncode == 0, r.stderr[-2000:]
        assert _report(tmp_path / f"out{i}.ipynb") == {"transport": "ipc", "tag": f"t{i}", "inputs": [f"a{i}", "b"]}
        assert "running over TCP" not in r.stderr


def test_failing_cell_is_one_error_line(tmp_path):
    src = _notebook(tmp_path / "nb.ipynb", "raise ValueError('no records')")
    out = tmp_path / "out.ipynb"
    r = _run(src, out)
    assert r.returncode == 1
    lines = [l for l in r.stderr.splitlines() if l.startswith("error:")]
    assert lines == [f"error: {src} failed in cell 2 of {out}: ValueError: no records"], r.stderr[-2000:]


@pytest.mark.parametrize("args,msg", [
    (["-y", "[1, 2]"], "is not a YAML mapping"),
    (["-y", "{a: [1"], "error: "),
])
def test_bad_parameters_are_one_error_line(tmp_path, args, msg):
    src = _notebook(tmp_path / "nb.ipynb", "print(1)")
    r = _run(src, tmp_path / "out.ipynb", *args)
    lines = [l for l in r.stderr.splitlines() if l.startswith("error:")]
    assert r.returncode == 2 and len(lines) == 1 and msg in lines[0], r.stderr
    assert not (tmp_path / "out.ipynb").exists()


def test_missing_notebook_is_one_error_line(tmp_path):
    r = _run(tmp_path / "nope.ipynb", tmp_path / "out.ipynb")
    assert r.returncode == 2 and r.stderr.strip().startswith("error: no notebook")
