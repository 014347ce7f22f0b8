"""Bad input to ``common.harness.bench`` ends in one ``error:`` line, exit 2, nothing at ``--out``;
the checks that need no model run before it loads (the loader is replaced by a tripwire)."""
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from common.harness import bench
from common.errors import cli_main

ROOT = Path(__file__).resolve().parents[2]
EMBEDDED = "smollm2-135m-instruct"


def _cli(main, argv, capsys) -> str:
    """Run an entry point in-process; return its one ``error:`` line (exit status must be 2)."""
    with pytest.raises(SystemExit) as e:
        cli_main(lambda: main(argv))
    err = capsys.readouterr().err
    lines = [l for l in err.splitlines() if l.startswith("error:")]
    assert e.value.code == 2 and len(lines) == 1, err
    return lines[0]


def _run(argv, capsys) -> str:
    return _cli(bench.main, argv, capsys)


def _args(tmp_path, *extra, decoders="vanilla", out=None):
    return ["--model", EMBEDDED, "--decoders", decoders, "--dataset", "mt-bench", "--n", "1",
            "--out", str(out or tmp_path / "o.jsonl"), *extra]


@pytest.fixture
def no_model_load(monkeypatch):
    def tripwire(*a, **k):
        raise AssertionError("the model was loaded before the arguments were checked")
    monkeypatch.setattr(bench, "load_model", tripwire)


@pytest.mark.parametrize("decoders,extra,msg", [
    (",", [], "names no decoder; valid: a comma-separated list of bild, calm, eagle, eagle3, firp, hf_assisted"),
    ("vanilla,nope", [], "unknown decoder 'nope'; valid:"),
    ("vanilla,vanilla", [], "names vanilla more than once"),
    ("ppd_pipelined@k3", ["--decoder-config", '{"ppd_pipelined": {"k": 3}}'],
     "key 'ppd_pipelined' is not one of the --decoders labels; valid: ppd_pipelined@k3"),
    ("vanilla", ["--decoder-config", "[1, 2]"], "must be a JSON object"),
    ("vanilla", ["--decoder-config", '{"vanilla": 3}'], "--decoder-config['vanilla'] must be a JSON object"),
    ("vanilla", ["--decoder-config", "{"], "is not valid JSON"),
    ("vanilla", ["--device", "gpu0"], "invalid device 'gpu0'; valid: cpu, cuda"),
    ("vanilla", ["--threads", "0"], "threads=0 is out of range; valid: an integer >= 1"),
    ("vanilla", ["--n", "0"], "n=0 is out of range"),
    ("vanilla", ["--max-prompt-tokens", "0"], "--max-prompt-tokens '0' is out of range; valid: an integer >= 1"),
    ("vanilla", ["--max-prompt-tokens", "-5"], "--max-prompt-tokens '-5' is out of range"),
    ("vanilla", ["--truncate", "middle"], "unknown --truncate 'middle'; valid: last, left, right"),
])
def test_bad_arguments_fail_before_the_model_loads(tmp_path, capsys, no_model_load, decoders, extra, msg):
    line = _run(_args(tmp_path, *extra, decoders=decoders), capsys)
    assert msg in line
    assert list(tmp_path.iterdir()) == []


def test_cuda_without_cuda(tmp_path, capsys, no_model_load, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert "CUDA is not available on this machine" in _run(_args(tmp_path, "--device", "cuda"), capsys)


def test_out_is_a_folder_or_under_a_file(tmp_path, capsys, no_model_load):
    (tmp_path / "dir").mkdir()
    assert "is a folder; valid: a file path" in _run(_args(tmp_path, out=tmp_path / "dir"), capsys)
    (tmp_path / "file").write_text("x")
    line = _run(_args(tmp_path, out=tmp_path / "file" / "sub" / "o.jsonl"), capsys)
    assert "is a file, not a folder" in line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dir", "file"]


def test_a_folder_that_is_no_model(tmp_path, capsys):
    (tmp_path / "m").mkdir()
    line = _run(["--model", str(tmp_path / "m"), "--decoders", "vanilla", "--dataset", "mt-bench",
                 "--out", str(tmp_path / "o.jsonl")], capsys)
    assert "has no config.json, so it is not a model folder; valid:" in line


def test_the_cli_prints_one_line_and_exits_2(tmp_path):
    out = tmp_path / "o.jsonl"
    r = subprocess.run([sys.executable, "-m", "common.harness.bench", *_args(tmp_path, decoders=",", out=out)],
                       cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 2 and r.stderr.strip().splitlines()[-1].startswith("error: --decoders ','")
    assert [l for l in r.stderr.splitlines() if l.startswith("error:")] == r.stderr.strip().splitlines()[-1:]
    assert not out.exists()


# ---------------------------------------------------------------- prompt length (embedded model)

def _long_prompts(tmp_path, words: int) -> Path:
    p = tmp_path / "long.jsonl"
    p.write_text(json.dumps({"question_id": "long-1", "category": "x",
                             "turns": ["Summarize: " + "the cat sat on the mat. " * words]}) + "\n")
    return p


def _prompt_args(tmp_path, prompts, *extra, new_tokens=2):
    return ["--model", EMBEDDED, "--decoders", "vanilla", "--prompts", str(prompts),
            "--max-new-tokens", str(new_tokens), "--out", str(tmp_path / "o.jsonl"), *extra]


@pytest.mark.model
def test_a_long_prompt_is_an_error_unless_truncation_is_asked(tmp_path, capsys, embedded):
    prompts = _long_prompts(tmp_path, 100)  # ~700 tokens
    line = _run(_prompt_args(tmp_path, prompts, "--max-prompt-tokens", "256"), capsys)
    assert "prompt 'long-1': the prompt has" in line and "more than max_prompt_tokens=256" in line
    assert not (tmp_path / "o.jsonl").exists()

    records = bench.run(bench.parse_args(_prompt_args(tmp_path, prompts, "--max-prompt-tokens", "256",
                                                      "--truncate", "left")))
    err = capsys.readouterr().err
    assert "prompt 'long-1' truncated from" in err and "to 256 tokens (--truncate left)" in err
    rec = records[0]
    assert rec["prompt_tokens"] == 256 and rec["prompt_truncated_from"] > 600
    assert (tmp_path / "o.jsonl").is_file()


@pytest.mark.model
def test_prompt_and_new_tokens_must_fit_the_context(tmp_path, capsys, embedded):
    ctx = embedded[0].config.max_position_embeddings
    prompts = _long_prompts(tmp_path, 10)
    line = _run(_prompt_args(tmp_path, prompts, new_tokens=ctx), capsys)
    assert f"leaves no room for a prompt in the model's context of {ctx} tokens" in line
    big = _long_prompts(tmp_path, ctx // 7 + 50)  # over the context on its own
    line = _run(_prompt_args(tmp_path, big, "--max-prompt-tokens", "none"), capsys)
    assert f"exceeds the model's context of {ctx}" in line
    assert not (tmp_path / "o.jsonl").exists()


# ---------------------------------------------------------------- the other entry points

@pytest.mark.parametrize("extra,msg", [
    (["--layers", "0"], "layer=0 is outside the model's layers; valid: 1..29 (model has 30)"),
    (["--layers", "15", "--threads", "0"], "threads=0 is out of range"),
    (["--layers", "15", "--device", "cuda:x"], "invalid device 'cuda:x'"),
    (["--layers", "15", "--bogus"], "unrecognized arguments: --bogus; usage: python -m ppd_pipelined.matchrate"),
])
def test_matchrate_checks_before_loading(tmp_path, capsys, monkeypatch, embedded, extra, msg):
    import common.assets.models
    from ppd_pipelined import matchrate

    monkeypatch.setattr(common.assets.models, "load_model", lambda *a, **k: pytest.fail("model loaded"))
    out = tmp_path / "o.jsonl"
    argv = ["--model", EMBEDDED, "--task", "squad", "--prompts", str(tmp_path / "p.jsonl"), "--out", str(out)]
    assert msg in _cli(matchrate.main, argv + extra, capsys)
    assert not out.exists()


@pytest.mark.parametrize("module", ["ppd_pipelined.theory", "common.harness.report"])
def test_cli_without_arguments_is_a_usage_error(module, capsys):
    import importlib

    line = _cli(importlib.import_module(module).main, [], capsys)
    assert "the following arguments are required" in line and f"usage: python -m {module}" in line


def test_theory_cli_prints_theorem_4_1(capsys):
    from ppd_pipelined import theory

    theory.main(["--d", "40", "--d-bar", "20", "--k", "5", "--p", "0.7415", "--length", "16"])
    out = capsys.readouterr().out
    assert "0.6524" in out and "0.6292" in out  # the module docstring's 0.652 and the paper's 0.629
    assert "d_bar=10 is out of range" in _cli(theory.main, ["--d", "40", "--d-bar", "10", "--k", "1", "--p", "0.5"],
                                               capsys)


def test_report_cli_summarizes_and_rejects_other_files(tmp_path, capsys):
    from common.harness import report
    from common.records import write_jsonl

    rec = {"question_id": "1", "tokens": [1, 2], "new_tokens": 2, "steps": 2, "accept_lengths": [1, 1],
           "wall_time": 0.5, "peak_mem_bytes": 2**20}
    write_jsonl(tmp_path / "b.jsonl", [{**rec, "decoder": "vanilla"}, {**rec, "decoder": "x", "wall_time": 0.25}])
    report.main([str(tmp_path / "b.jsonl")])
    out = capsys.readouterr().out
    assert "vanilla" in out and "2.000" in out  # x: twice vanilla's tokens/s
    assert "--baseline 'nope' is not a decoder" in _cli(report.main, [str(tmp_path / "b.jsonl"), "--baseline", "nope"],
                                                        capsys)
    (tmp_path / "p.jsonl").write_text('{"question_id": "1", "turns": ["hi"]}\n')
    assert "no common.harness.bench records" in _cli(report.main, [str(tmp_path / "p.jsonl")], capsys)


# ---------------------------------------------------------------- prompt truncation and model paths

@pytest.mark.model
def test_truncation_keeps_the_chat_header_and_generation_prompt(embedded):
    from common.errors import UserError
    from common.assets.prompts import fit_prompt

    _, tok = embedded
    text = "BEGIN " + "alpha beta gamma delta. " * 200 + " END"
    full_ids, full = fit_prompt(tok, text)
    head, tail = tok.decode(full_ids[0, :20]), tok.decode(full_ids[0, -6:])
    for side, kept in [("left", "END"), ("right", "BEGIN")]:
        ids, n = fit_prompt(tok, text, max_prompt_tokens=100, truncate=side)
        s = tok.decode(ids[0])
        assert n == full and 90 <= ids.shape[1] <= 100
        assert s.startswith(head) and s.endswith(tail) and kept in s
    last, _ = fit_prompt(tok, text, max_prompt_tokens=100, truncate="last")
    assert torch.equal(last, full_ids[:, -100:])  # the trained components' data were built so
    with pytest.raises(UserError, match=f"the prompt has {full} tokens, more than max_prompt_tokens=100"):
        fit_prompt(tok, text, max_prompt_tokens=100)
    with pytest.raises(UserError, match="max_prompt_tokens=-1 is out of range"):
        fit_prompt(tok, text, max_prompt_tokens=-1, truncate="last")
    with pytest.raises(UserError, match="leaves no room for the text"):
        fit_prompt(tok, text, max_prompt_tokens=5, truncate="left")


def test_unconverted_model_names_a_real_target(tmp_path, monkeypatch):
    from common.errors import UserError
    from common.assets.models import resolve

    monkeypatch.setenv("REPRO_CACHE_DIR", str(tmp_path))
    with pytest.raises(UserError, match=r"run `snakemake -j1 prepare` or `python -m common.assets.models convert"):
        resolve(EMBEDDED)


def test_model_paths_that_are_no_model_folder(tmp_path):
    from common.errors import UserError
    from common.assets.models import resolve

    (tmp_path / "cfg_only").mkdir()
    (tmp_path / "cfg_only" / "config.json").write_text("{}")
    (tmp_path / "f").write_text("x")
    cases = {tmp_path: "has no config.json", tmp_path / "cfg_only": "has no tokenizer",
             tmp_path / "f": "is not a model folder (a file)", tmp_path / "none": "is not a model folder (missing)"}
    for path, msg in cases.items():
        with pytest.raises(UserError, match=re.escape(msg)):
            resolve(str(path))
    assert resolve("org/name") == "org/name"  # a hub id stays one
