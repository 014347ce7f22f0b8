"""Fault tests: a run killed mid-way leaves nothing at its final path, and a rerun gives the
result an uninterrupted run gives (training resumes from its checkpoint)."""
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from common.training.loop import run_path

ROOT = Path(__file__).resolve().parents[2]
DEADLINE_S = 120  # only turns a hung subprocess into a failure; no test asserts on timing


def _env(tmp_path) -> dict:
    (tmp_path / "tmp").mkdir(exist_ok=True)
    # TMPDIR: temporary folders the child makes (gloo rendezvous) land where the test can see them
    return {**os.environ, "HF_HUB_OFFLINE": "1", "TMPDIR": str(tmp_path / "tmp"),
            "PYTHONPATH": str(ROOT)}


def _wait_for(cond, proc, what: str) -> None:
    """Poll until ``cond()``; fail if ``proc`` ends first (the kill would not be mid-run)."""
    end = time.monotonic() + DEADLINE_S
    while not cond():
        assert proc.poll() is None, f"the run ended before {what}: {proc.stderr.read()[-2000:]}"
        assert time.monotonic() < end, f"no {what} within {DEADLINE_S} s"
        time.sleep(0.01)


def _lines(paths) -> int:
    return sum(p.read_text().count("\n") for p in paths if p.exists())


# ---------------------------------------------------------------- benchmark rule

BENCH = ["--model", "smollm2-135m-instruct", "--decoders", "vanilla", "--dataset", "mt-bench",
         "--n", "4", "--max-new-tokens", "4", "--threads", "1"]


@pytest.mark.model
@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM], ids=["SIGKILL", "SIGTERM"])
def test_killed_benchmark_leaves_no_result_and_reruns(tmp_path, embedded, sig):
    out = tmp_path / "bench.jsonl"
    cmd = [sys.executable, "-m", "common.harness.bench", *BENCH, "--out", str(out)]
    proc = subprocess.Popen(cmd, cwd=ROOT, env=_env(tmp_path), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    partials = lambda: list(tmp_path.glob("bench.jsonl.*.partial"))  # noqa: E731
    _wait_for(lambda: _lines(partials()) >= 1, proc, "the first record")  # mid-run: 1 of 4 written
    proc.send_signal(sig)
    proc.communicate(timeout=DEADLINE_S)
    assert not out.exists()
    if sig == signal.SIGTERM:  # a catchable signal also removes the temporary file
        assert proc.returncode == 128 + sig and partials() == []
    else:
        assert proc.returncode == -sig
    left = [json.loads(l) for p in partials() for l in p.read_text().splitlines()]

    r = subprocess.run(cmd, cwd=ROOT, env=_env(tmp_path), capture_output=True, text=True, timeout=DEADLINE_S)
    assert r.returncode == 0, r.stderr[-2000:]
    rerun = [json.loads(l) for l in out.read_text().splitlines()]
    assert [x["question_id"] for x in rerun] == ["81", "82", "83", "84"]
    # The same greedy outputs as the interrupted run had produced before it died.
    assert [x["tokens"] for x in left] == [x["tokens"] for x in rerun[:len(left)]]


@pytest.mark.model
def test_killed_benchmark_resumes_from_its_completed_prompts(tmp_path, embedded):
    """With --resume, a rerun after SIGKILL decodes only the prompts the killed run had not
    finished, and the result equals an uninterrupted run's tokens."""
    out = tmp_path / "bench.jsonl"
    from common.assets.models import cache_root

    (tmp_path / "cache").mkdir()
    (tmp_path / "cache" / "models").symlink_to(cache_root() / "models")  # the converted model, shared
    env = {**_env(tmp_path), "REPRO_CACHE_DIR": str(tmp_path / "cache")}
    cmd = [sys.executable, "-m", "common.harness.bench", *BENCH, "--resume", "--out", str(out)]
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    logs = lambda: list((tmp_path / "cache" / "resume").glob("*bench.jsonl"))  # noqa: E731
    _wait_for(lambda: _lines(logs()) >= 3, proc, "two completed prompts")  # header + 2 of 4 prompts
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=DEADLINE_S)
    assert not out.exists()
    done = [json.loads(l)["key"] for l in logs()[0].read_text().splitlines()[1:] if l.endswith("}")]
    assert len(done) >= 2

    r = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=DEADLINE_S)
    assert r.returncode == 0, r.stderr[-2000:]
    assert f"{len(done)} of 4 prompts done" in r.stderr
    assert logs() == []  # removed once the result is in place
    resumed = [json.loads(l) for l in out.read_text().splitlines()]
    fresh_out = tmp_path / "fresh.jsonl"
    subprocess.run([sys.executable, "-m", "common.harness.bench", *BENCH, "--out", str(fresh_out)], cwd=ROOT, env=env,
                   check=True, capture_output=True, timeout=DEADLINE_S)
    fresh = [json.loads(l) for l in fresh_out.read_text().splitlines()]
    assert [(x["question_id"], x["tokens"]) for x in resumed] == [(x["question_id"], x["tokens"]) for x in fresh]


# ---------------------------------------------------------------- training rule

TRAIN_SCRIPT = '''
import sys, time
from pathlib import Path
import torch
from common.training.loop import TrainConfig, train

ckpt, pause = Path(sys.argv[1]), float(sys.argv[2])
torch.manual_seed(0)
module = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
examples = [(torch.randn(8), torch.randn(1)) for _ in range(96)]
calls = 0

def loss_fn(m, batch):
    global calls
    calls += 1
    time.sleep(pause)  # slows the run so that it can be killed between checkpoints
    x, y = torch.stack([a for a, _ in batch]), torch.stack([b for _, b in batch])
    return ((m(x) - y) ** 2).mean()

train(module, examples, loss_fn, TrainConfig(lr=1e-2, epochs=2, batch_size=4, checkpoint_every=1), ckpt)
torch.save({"params": module.state_dict(), "steps_run": calls}, str(ckpt) + ".result")
'''
TOTAL_STEPS = 2 * 96 // 4


def _train(tmp_path, ckpt: Path, pause: float, **kw):
    script = tmp_path / "train_script.py"
    script.write_text(TRAIN_SCRIPT)
    return subprocess.Popen([sys.executable, str(script), str(ckpt), str(pause)], cwd=ROOT, env=_env(tmp_path),
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, **kw)


def _ckpt_step(ckpt: Path) -> int:
    """The step of a run's latest state (common.training.loop.run_path: the final checkpoint is
    published only when the run ends)."""
    state = run_path(ckpt)
    return torch.load(state, weights_only=False)["step"] if state.is_file() else 0


def test_killed_training_resumes_to_the_uninterrupted_parameters(tmp_path):
    ref = tmp_path / "ref" / "ckpt.pt"
    assert _train(tmp_path, ref, 0.0).wait(DEADLINE_S) == 0
    expected = torch.load(str(ref) + ".result")

    ckpt = tmp_path / "run" / "ckpt.pt"
    proc = _train(tmp_path, ckpt, 0.05)
    _wait_for(lambda: _ckpt_step(ckpt) >= 3, proc, "the third checkpoint")
    proc.kill()
    proc.wait(DEADLINE_S)
    done = _ckpt_step(ckpt)  # the last checkpoint the killed run wrote (atomic: never half a file)
    assert 3 <= done < TOTAL_STEPS and not Path(str(ckpt) + ".result").exists()
    assert not ckpt.exists()  # nothing at the final path: a rerun job's output deletion loses no state

    proc = _train(tmp_path, ckpt, 0.0)
    assert proc.wait(DEADLINE_S) == 0, proc.stderr.read()[-2000:]
    got = torch.load(str(ckpt) + ".result")
    assert got["steps_run"] == TOTAL_STEPS - done  # resumed from the checkpoint, not from scratch
    assert expected["steps_run"] == TOTAL_STEPS
    for name, value in expected["params"].items():
        assert torch.equal(got["params"][name], value), name


# ---------------------------------------------------------------- PPD worker pool

POOL_SCRIPT = '''
import time
from common.assets.models import tiny_llama
from ppd_pipelined.workers import GlooPool

if __name__ == "__main__":  # the sub-workers' forkserver must not rerun this
    pool = GlooPool(tiny_llama(), split=2, k=1, threads=1)
    print(pool._dir, flush=True)
    time.sleep(600)
'''


def test_sigterm_removes_the_gloo_rendezvous_folder(tmp_path):
    script = tmp_path / "pool_script.py"
    script.write_text(POOL_SCRIPT)
    proc = subprocess.Popen([sys.executable, str(script)], cwd=ROOT, env=_env(tmp_path), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    folder = Path(proc.stdout.readline().strip())  # printed once the sub-worker has started
    assert folder.name.startswith("ppd_gloo_") and folder.is_dir(), proc.stderr.read()[-2000:]
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=DEADLINE_S)
    assert proc.returncode == 128 + signal.SIGTERM
    assert not folder.exists() and list((tmp_path / "tmp").glob("ppd_gloo_*")) == []
