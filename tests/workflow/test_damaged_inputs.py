"""Damaged inputs end in one ``error:`` line, never a traceback: every reader of a file this
repository writes (trained checkpoints, the REST datastore, corpus shards, records, draft
vocabularies, released heads) turns a truncated or garbage file into one UserError naming the
file and what to do; the CLIs that read them exit 2 with that one short line and write nothing.
Tiny files and tiny random models only."""
import dataclasses
import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from common.checkpoints import check_meta, load_trained, read_trained, save_trained
from common.checks import differences
from common.errors import UserError, cli_main
from common.paths import REASON_CHARS, load_or_error, short_reason

ROOT = Path(__file__).resolve().parents[2]
MAX_LINE = 300  # an error line a user reads at a glance (the issue measured 1,751 characters)
DAMAGE = ["truncated", "garbage"]


def damage(path: Path, how: str) -> None:
    """Cut ``path`` to 40 % of its bytes (a kill or a full disk mid-copy; not a half, which would
    end a file of equal lines on a line's end) or replace them with bytes no loader accepts
    (another file copied over it)."""
    data = path.read_bytes()
    path.write_bytes(data[:len(data) * 2 // 5] if how == "truncated" else b"\x80\x03garbage\x00\xff" * 8)


def one_error(fn, path: Path, *must: str) -> str:
    """``fn()`` raises one UserError naming ``path`` and each of ``must``; returns its text."""
    with pytest.raises(UserError) as e:
        fn()
    msg = str(e.value)
    assert str(path) in msg and "\n" not in msg and len(f"error: {msg}") < MAX_LINE, msg
    for m in must:
        assert m in msg, msg
    return msg


def cli(main, argv, capsys) -> str:
    """Run an entry point in-process under cli_main: exit 2, exactly one stderr line, starting
    with ``error:`` and under :data:`MAX_LINE` characters; returns it."""
    with pytest.raises(SystemExit) as e:
        cli_main(lambda: main(argv))
    err = capsys.readouterr().err.strip().splitlines()
    assert e.value.code == 2 and len(err) == 1 and err[0].startswith("error: "), err
    assert len(err[0]) < MAX_LINE, err[0]
    return err[0]


# ---------------------------------------------------------------- the shared helper

def test_load_or_error_names_the_file_and_the_fix(tmp_path):
    f = tmp_path / "x.bin"
    one_error(lambda: load_or_error(f, Path.read_bytes, "blob", "make one"), f, "does not exist; make one")
    f.write_bytes(b"{")
    msg = one_error(lambda: load_or_error(f, lambda p: json.loads(p.read_text()), "blob", "make one"), f,
                    "blob", "is damaged or unreadable (JSONDecodeError: ", "; make one")
    assert msg.endswith("; make one")

    def own_check(p):
        raise UserError("the loader's own words")
    with pytest.raises(UserError, match="^the loader's own words$"):  # passed through unchanged
        load_or_error(f, own_check, "blob", "make one")


def test_short_reason_is_one_short_line():
    r = short_reason(RuntimeError("first line " + "x" * 500 + "\nsecond line"))
    assert r.startswith("RuntimeError: first line") and len(r) == REASON_CHARS and "\n" not in r
    assert short_reason(ValueError("")) == "ValueError: "


def test_differences_name_keys_not_whole_dicts():
    big = {"base": "a", "hidden": 64, "teacher": {"prompts": list(range(500))}}
    text = differences(big, {**big, "hidden": 32, "teacher": {"prompts": [1]}, "vocab": 96})
    assert text.startswith("hidden: 64 there, 32 here; teacher: {'prompts': [0, 1, 2")
    assert "vocab: absent there, 96 here" in text and "base" not in text and len(text) < 200
    assert differences({"a": 1}, {"a": 1}) == ""
    assert differences({f"k{i}": i for i in range(6)}, {}, limit=2).endswith("and 4 more")


# ---------------------------------------------------------------- trained checkpoints

@pytest.fixture
def ckpt(tmp_path):
    path = tmp_path / "heads.pt"
    save_trained(torch.nn.Linear(4, 3), path, {"base": "tiny", "hidden": 4})
    return path


@pytest.mark.parametrize("how", DAMAGE)
def test_a_damaged_checkpoint_is_one_error(ckpt, how):
    damage(ckpt, how)
    one_error(lambda: read_trained(ckpt, hint="train it first (rule x)"), ckpt,
              "is damaged or unreadable", "delete it, then train it first (rule x)")
    one_error(lambda: load_trained(torch.nn.Linear(4, 3), ckpt), ckpt, "delete it")


def test_a_pickle_that_is_no_checkpoint(tmp_path):
    path = tmp_path / "heads.pt"
    torch.save({"weight": torch.zeros(3)}, path)
    one_error(lambda: read_trained(path), path, "is not a checkpoint written by common.training.loop")


def test_a_checkpoint_for_another_model_names_the_differing_keys(ckpt):
    state = read_trained(ckpt)
    want = {"base": "tiny", "hidden": 8, "teacher": {"key": "x" * 2000}}
    with pytest.raises(UserError) as e:
        check_meta(state, want, f"heads at {ckpt.parent}")
    msg = str(e.value)
    assert "hidden: 4 there, 8 here" in msg and "teacher: absent there" in msg and len(msg) < MAX_LINE, msg
    with pytest.raises(UserError, match="trained for another model") as e:
        load_trained(torch.nn.Linear(4, 3), ckpt, meta=want)
    assert len(str(e.value)) < MAX_LINE


def test_weights_of_another_shape_are_one_error(ckpt):
    one_error(lambda: load_trained(torch.nn.Linear(5, 3), ckpt), ckpt, "do not fit this Linear",
              "'weight' is [3, 4], not [3, 5]")
    one_error(lambda: load_trained(torch.nn.Linear(4, 3, bias=False), ckpt), ckpt, "unexpected tensor 'bias'")


@pytest.mark.parametrize("how", DAMAGE)
def test_the_eagle_decoder_refuses_a_damaged_head(tmp_path, how):
    from common.assets.models import tiny_llama
    from common.components.eagle_head import CHECKPOINT, EagleHead, head_meta
    from common.decoders.eagle import Eagle

    model = tiny_llama(seed=1)
    save_trained(EagleHead(model), tmp_path / CHECKPOINT, head_meta(model))
    damage(tmp_path / CHECKPOINT, how)
    one_error(lambda: Eagle(model, head=str(tmp_path)), tmp_path / CHECKPOINT,
              "python -m common.components.eagle_head")


@pytest.mark.parametrize("how", DAMAGE)
def test_content_digest_of_a_damaged_checkpoint(ckpt, how):
    from common.records import content_digest

    damage(ckpt, how)
    one_error(lambda: content_digest(ckpt.parent), ckpt, "train it again")


# ---------------------------------------------------------------- REST datastore

@pytest.fixture
def store(tmp_path):
    from common.components.rest_datastore import build_datastore

    build_datastore([[1, 7, 8, 9, 50], [2, 8, 9, 60, 61]], tmp_path / "ds", 96, "tok", "tiny", "test")
    return tmp_path / "ds"


@pytest.mark.parametrize("how", DAMAGE)
@pytest.mark.parametrize("name", ["tokens.npy", "suffixes.npy", "datastore.json"])
def test_a_damaged_datastore_is_one_error(store, name, how):
    from common.components.rest_datastore import open_datastore

    damage(store / name, how)
    one_error(lambda: open_datastore(store), store / name, "rebuild it: python -m common.components.rest_datastore")


def test_datastore_arrays_of_two_builds(store, tmp_path):
    from common.components.rest_datastore import open_datastore

    np.save(store / "tokens.npy", np.arange(3, dtype=np.int32))  # a valid array, of another length
    one_error(lambda: open_datastore(store), store, "holds 3 positions", "rebuild it")
    (store / "datastore.json").write_text(json.dumps({"tokenizer_id": "tok"}))
    one_error(lambda: open_datastore(store), store / "datastore.json", "no integer vocab_size")


def test_the_rest_decoder_refuses_a_damaged_datastore(store, tiny):
    from common.decoders import get_decoder

    damage(store / "tokens.npy", "truncated")
    one_error(lambda: get_decoder("rest", tiny, datastore=str(store)), store / "tokens.npy", "rebuild it")


# ---------------------------------------------------------------- corpus shards and manifest

@pytest.mark.parametrize("how", DAMAGE)
def test_a_damaged_shard_is_one_error(tmp_path, how):
    from common.training.corpus import Shard, read_shard, write_shard

    path = tmp_path / "shard-00000.npz"
    write_shard(path, Shard(np.arange(6, dtype=np.int32), np.array([0, 3, 6]), np.array([1, 1]), np.array([0, 1])))
    damage(path, how)
    one_error(lambda: read_shard(path), path, "run the corpus build again")


@pytest.mark.parametrize("how", DAMAGE)
def test_the_corpus_cli_on_a_damaged_manifest(tmp_path, capsys, how):
    from common.training import corpus

    (tmp_path / corpus.MANIFEST).write_text(json.dumps({"version": 1, "recipe": {}, "shards": [], "heldout": None}))
    damage(tmp_path / corpus.MANIFEST, how)
    line = cli(corpus._main, ["--model", "m", "--out", str(tmp_path), "--summary"], capsys)
    assert str(tmp_path / corpus.MANIFEST) in line


@pytest.mark.parametrize("extra,msg", [
    (["--tokens", "0"], "--tokens=0 is out of range; valid: an integer >= 1"),
    (["--tokens", "-5"], "--tokens=-5 is out of range"),
    (["--max-shards", "0"], "--max-shards=0 is out of range"),
    (["--threads", "0"], "--threads=0 is out of range"),
    (["--device", "gpu0"], "invalid device 'gpu0'"),
    (["--tokens", "many"], "invalid int value: 'many'; usage: python -m common.training.corpus ... (--help"),
])
def test_corpus_checks_its_arguments_before_the_model_loads(tmp_path, capsys, monkeypatch, extra, msg):
    from common.assets import models

    def tripwire(*a, **k):
        raise AssertionError("the model was loaded before the arguments were checked")
    monkeypatch.setattr(models, "load_model", tripwire)
    from common.training import corpus
    line = cli(corpus._main, ["--model", "smollm2-135m-instruct", "--out", str(tmp_path / "c"), *extra], capsys)
    assert msg in line
    assert list(tmp_path.iterdir()) == []


# ---------------------------------------------------------------- records and the Spec-Bench export

RECORD = {"question_id": "1", "decoder": "vanilla", "tokens": [1, 2], "new_tokens": 2, "wall_time": 0.1,
          "accept_lengths": [1, 1], "text": "hi", "model": "m", "category": "writing"}


def _records(path: Path, how: str | None = None) -> Path:
    path.write_text("".join(json.dumps({**RECORD, "question_id": str(i)}) + "\n" for i in range(4)))
    if how is not None:
        damage(path, how)
    return path


@pytest.mark.parametrize("how", DAMAGE)
def test_read_jsonl_of_a_damaged_file(tmp_path, how):
    from common.records import read_jsonl

    path = _records(tmp_path / "r.jsonl", how)
    one_error(lambda: read_jsonl(path), path, "records file", "line ")


def test_read_jsonl_lines_must_be_objects(tmp_path):
    from common.records import read_jsonl

    (tmp_path / "r.jsonl").write_text('{"a": 1}\n\n[1, 2]\n')
    one_error(lambda: read_jsonl(tmp_path / "r.jsonl"), tmp_path / "r.jsonl", "line 3 is a list, not a JSON object")
    one_error(lambda: read_jsonl(tmp_path / "none.jsonl"), tmp_path / "none.jsonl", "does not exist")


@pytest.mark.parametrize("how", DAMAGE)
def test_specbench_export_of_damaged_records(tmp_path, capsys, how):
    from common.harness import specbench

    good, bad = _records(tmp_path / "a.jsonl"), _records(tmp_path / "b.jsonl", how)
    out = tmp_path / "out"
    line = cli(specbench._main, [str(good), str(bad), "--out", str(out)], capsys)
    assert str(bad) in line and "common.harness.bench" in line
    assert not out.exists()


def test_specbench_refuses_incomplete_records_before_writing_any(tmp_path, capsys):
    from common.harness import specbench

    good = _records(tmp_path / "a.jsonl")
    (tmp_path / "c.jsonl").write_text(json.dumps({"question_id": "9", "model": "other"}) + "\n")
    out = tmp_path / "out"
    line = cli(specbench._main, [str(good), str(tmp_path / "c.jsonl"), "--out", str(out)], capsys)
    assert "record of question '9' lacks decoder" in line and not out.exists()
    (tmp_path / "f").write_text("")
    assert "is a file; valid: a folder" in cli(specbench._main, [str(good), "--out", str(tmp_path / "f")], capsys)


def test_specbench_cli_process_exits_2_with_one_line(tmp_path):
    bad, out = _records(tmp_path / "b.jsonl", "garbage"), tmp_path / "out"
    r = subprocess.run([sys.executable, "-m", "common.harness.specbench", str(bad), "--out", str(out)],
                       cwd=ROOT, capture_output=True, text=True, timeout=300)
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1 and lines[0].startswith("error: records file "), r.stderr[-2000:]
    assert len(lines[0]) < MAX_LINE and not out.exists()


# ---------------------------------------------------------------- vocabularies and released heads

@pytest.mark.parametrize("how", DAMAGE)
def test_a_damaged_draft_vocabulary(tmp_path, tiny, how):
    from common.components.reduced_head import DRAFT_VOCAB, SIDECAR, apply_sidecar, reduced_readout, write_draft_vocab

    write_draft_vocab(tmp_path, list(range(20)))
    damage(tmp_path / DRAFT_VOCAB, how)
    one_error(lambda: reduced_readout(tiny, tmp_path, 8), tmp_path / DRAFT_VOCAB, "python -m common.components.reduced_head")
    (tmp_path / SIDECAR).write_text(json.dumps({"keep": [1, 2, 3]}))
    damage(tmp_path / SIDECAR, how)
    one_error(lambda: apply_sidecar(tiny, tmp_path), tmp_path / SIDECAR, "python -m common.components.reduced_vocab")


@pytest.mark.parametrize("how", DAMAGE)
@pytest.mark.filterwarnings("ignore:Detected pickle protocol")  # the garbage bytes start like a pickle
@pytest.mark.parametrize("name", ["medusa_lm_head.safetensors", "medusa_lm_head.pt"])
def test_a_damaged_released_checkpoint(tmp_path, name, how):
    from safetensors.torch import save_file

    from common.components.released_heads import MEDUSA_FILES, read_tensors

    state = {"w": torch.zeros(8, 8)}
    save_file(state, str(tmp_path / name)) if name.endswith(".safetensors") else torch.save(state, tmp_path / name)
    damage(tmp_path / name, how)
    one_error(lambda: read_tensors(tmp_path, MEDUSA_FILES), tmp_path / name, "download the authors' folder again")


def test_the_corpus_recipe_refusal_names_only_the_differing_fields(tmp_path):
    from common.training.corpus import Recipe, check_recipe

    want = Recipe(model="m", model_id="a" * 16, tokenizer_id="t" * 16)
    found = {**dataclasses.asdict(want), "model_id": "b" * 16, "answer_tokens": 64}
    msg = one_error(lambda: check_recipe(found, want, tmp_path), tmp_path, "another recipe")
    assert "answer_tokens: 64 there, 128 here" in msg and "tokenizer_id" not in msg


# ---------------------------------------------------------------- small answer sets (corpus answers)

@pytest.mark.parametrize("extra,msg", [
    (["--prompts", "0"], "--prompts=0 is out of range"),
    (["--answer-tokens", "0"], "--answer-tokens=0 is out of range"),
    (["--max-prompt-tokens", "0"], "--max-prompt-tokens=0 is out of range"),
    (["--skip", "-1"], "--skip=-1 is out of range"),
    (["--threads", "0"], "--threads=0 is out of range"),
    (["--device", "gpu0"], "invalid device 'gpu0'"),
])
def test_the_answers_subcommand_checks_its_arguments_before_the_model_loads(tmp_path, capsys, monkeypatch, extra, msg):
    from common.assets import models
    from common.training import corpus

    def tripwire(*a, **k):
        raise AssertionError("the model was loaded before the arguments were checked")
    monkeypatch.setattr(models, "load_model", tripwire)
    line = cli(corpus._main, ["answers", "--model", "m", "--out", str(tmp_path / "set.pt"), *extra], capsys)
    assert msg in line and list(tmp_path.iterdir()) == []
    folder = tmp_path / "a_folder"
    folder.mkdir()
    assert "is a folder" in cli(corpus._main, ["answers", "--model", "m", "--out", str(folder)], capsys)


@pytest.mark.filterwarnings("ignore:Detected pickle protocol")  # the garbage bytes start like a pickle
@pytest.mark.parametrize("how", DAMAGE)
def test_a_damaged_answer_set_is_one_error_before_the_model_loads(tmp_path, capsys, monkeypatch, how):
    from common.assets import models
    from common.training import corpus

    path = tmp_path / "corpus.pt"
    torch.save({"kw": {"n_prompts": 2}, "corpus": [{"ids": [1, 2, 3], "start": 1}] * 2}, path)
    damage(path, how)
    one_error(lambda: corpus.cached_set(path, n_prompts=2, max_new_tokens=128), path, "delete it")

    def tripwire(*a, **k):
        raise AssertionError("the model was loaded for a damaged answer set")
    monkeypatch.setattr(models, "load_model", tripwire)
    line = cli(corpus._main, ["answers", "--model", "m", "--out", str(path), "--prompts", "2"], capsys)
    assert str(path) in line and "rebuilt on the next run" in line


# ---------------------------------------------------------------- the training loop's run state

def _finished_run(tmp_path) -> Path:
    from common.training.loop import TrainConfig, train

    ckpt = tmp_path / "c.pt"
    data = [(torch.randn(4), i % 3) for i in range(8)]
    train(torch.nn.Linear(4, 3), data, lambda m, b: m(torch.stack([x for x, _ in b])).sum(),
          TrainConfig(epochs=1, batch_size=4), ckpt)
    return ckpt


@pytest.mark.filterwarnings("ignore:Detected pickle protocol")  # the garbage bytes start like a pickle
@pytest.mark.parametrize("how", DAMAGE)
def test_a_damaged_run_state_is_one_error(tmp_path, how):
    from common.checkpoints import run_path
    from common.training.loop import Stopping, TrainConfig, finish_with_accuracy, run_summary, train

    ckpt = _finished_run(tmp_path)
    run = run_path(ckpt)
    run.unlink(missing_ok=True)  # the published checkpoint may be a hard link of the run file
    damage(ckpt, how)
    one_error(lambda: train(torch.nn.Linear(4, 3), [(torch.randn(4), 0)], lambda m, b: m(b[0][0]).sum(),
                            TrainConfig(epochs=1, batch_size=1), ckpt), ckpt, "train again")
    one_error(lambda: run_summary(ckpt, [], Stopping(eval_every=2), TrainConfig(), time.perf_counter(), tmp_path / "curve.jsonl"),
              ckpt, "training checkpoint")
    one_error(lambda: finish_with_accuracy(ckpt, torch.nn.Linear(4, 3), torch.nn.Linear(4, 3), [[1.0]], tmp_path / "o",
                                           None, time.perf_counter()), ckpt, "train again")
    assert not (tmp_path / "curve.jsonl").exists() and not (tmp_path / "o").exists()


def test_a_run_state_of_another_recipe_names_the_differing_keys(tmp_path):
    from common.training.loop import TrainConfig, train

    ckpt = _finished_run(tmp_path)
    with pytest.raises(UserError) as e:
        train(torch.nn.Linear(4, 3), [(torch.randn(4), 0)] * 8, lambda m, b: m(b[0][0]).sum(),
              TrainConfig(epochs=1, batch_size=4), ckpt, meta={"teacher": "x" * 2000})
    msg = str(e.value)
    assert "another config/data (meta: {} there" in msg and len(msg) < MAX_LINE, msg


# ---------------------------------------------------------------- the teacher cache

def _teacher_cache(tmp_path) -> Path:
    from common.training import teacher

    data = teacher.text_only([{"ids": [1, 2, 3, 4], "start": 1}, {"ids": [5, 6], "start": 1}])
    path = tmp_path / "teacher.pt"
    teacher._save(path, {"key": {"version": 1}, "train": data, "heldout": data})
    return path


@pytest.mark.filterwarnings("ignore:Detected pickle protocol")  # the garbage bytes start like a pickle
@pytest.mark.parametrize("how", DAMAGE)
def test_a_damaged_teacher_cache_is_one_error(tmp_path, how):
    from common.training import teacher

    path = _teacher_cache(tmp_path)
    assert len(teacher.read_cache(path)["train"]) == 2
    damage(path, how)
    one_error(lambda: teacher.read_cache(path), path, "python -m common.training.teacher")
    one_error(lambda: teacher._read_if_key(path, {"version": 1}), path, "rebuild it")


@pytest.mark.parametrize("how", DAMAGE)
def test_a_damaged_teacher_key_file_is_one_error(tmp_path, how):
    from common.training import teacher

    path = _teacher_cache(tmp_path)
    key = teacher._key_file(path)
    damage(key, how)
    one_error(lambda: teacher._read_if_key(path, {"version": 1}), key, "teacher cache key", "delete it")


@pytest.mark.filterwarnings("ignore:Detected pickle protocol")  # the garbage bytes start like a pickle
@pytest.mark.parametrize("how", DAMAGE)
def test_a_damaged_teacher_pass_part_is_one_error(tmp_path, how):
    from common.training import teacher

    meta = {"file": "shard-00000.npz", "sha256": "0" * 64}
    part = tmp_path / f"shard-00000.{'0' * 12}.k32.float32.pt"
    torch.save({**vars(teacher.text_only([{"ids": [1, 2], "start": 1}])), "wall_s": 1.0}, part)
    damage(part, how)
    one_error(lambda: teacher._shard_pass(None, meta, tmp_path, tmp_path, "k32.float32", 32, 8, None, "pass"), part,
              "teacher pass part", "passes that shard again")


# ---------------------------------------------------------------- trees, PPD's exit head, kept models

@pytest.mark.parametrize("how", DAMAGE)
def test_a_damaged_tree_file_is_one_error(tmp_path, how):
    from common.engine.tree import load_tree, save_tree

    path = tmp_path / "tree_8.json"
    save_tree(path, [(0,), (1,), (0, 0)], accept_rate=0.5)
    damage(path, how)
    one_error(lambda: load_tree(path), path, "tree file", "train again")
    path.write_text(json.dumps({"paths": [[0, 1]]}))  # JSON, but no tree: the parent [0] is missing
    one_error(lambda: load_tree(path), path, "has no parent [0]")


@pytest.mark.filterwarnings("ignore:Detected pickle protocol")  # the garbage bytes start like a pickle
@pytest.mark.parametrize("how", DAMAGE)
def test_a_damaged_ppd_exit_head_is_one_error(tmp_path, how):
    from ppd_pipelined.decoding import load_head

    path = tmp_path / "head_l2.pt"
    torch.save(torch.nn.Linear(4, 8, bias=False).state_dict(), path)
    damage(path, how)
    one_error(lambda: load_head(str(path), None), path, "python -m ppd_pipelined.heads")


@pytest.mark.parametrize("how", DAMAGE)
def test_a_damaged_kept_model_is_one_error(tmp_path, how):
    from safetensors.torch import save_file

    from common.weights_delta import DELTA, FIX, kept_digest, layout, manifest_path

    model = tmp_path / "model.safetensors"
    save_file({"w": torch.zeros(4, 4)}, str(model))
    damage(model, how)
    one_error(lambda: layout(model), model, FIX)
    kept = tmp_path / "kept"
    kept.mkdir()
    man = manifest_path(kept / DELTA)
    man.write_text(json.dumps({"format": 1, "header": "{}", "folder_digest": "abc"}))
    assert kept_digest(kept) == "abc"
    damage(man, how)
    one_error(lambda: kept_digest(kept), man, "kept-model manifest", FIX)


@pytest.mark.parametrize("how", DAMAGE)
def test_damaged_training_stats_beside_firp_heads(tmp_path, how):
    from firp.accuracy import _trained

    (tmp_path / "stats.json").write_text(json.dumps({"steps": 3}))
    assert _trained(tmp_path)["steps"] == 3
    damage(tmp_path / "stats.json", how)
    one_error(lambda: _trained(tmp_path), tmp_path / "stats.json", "train the component again")


# ---------------------------------------------------------------- refusals of another model's component

def test_heads_for_another_model_name_the_differing_keys(tmp_path, tiny):
    """PPD's layer heads, FIRP's Figure 3 heads and a first stage of prompt tokens trained for
    another model: each refusal names the keys that differ, in one short line."""
    from types import SimpleNamespace

    from common.checkpoints import fingerprint
    from firp.accuracy import load_heads as firp_heads
    from ppd_pipelined.heads import LayerHeads, load_heads as ppd_heads
    from prompt_decoding.train import init_from_stage1

    other = {**fingerprint(tiny), "base": "another-model-" + "x" * 300, "hidden": 4096}
    save_trained(LayerHeads([1], 4, 8), tmp_path / "ppd.pt", {"model": other, "layers": [1]})
    msg = one_error(lambda: ppd_heads(tiny, tmp_path / "ppd.pt"), tmp_path / "ppd.pt", "trained for another model")
    assert "hidden: 4096 there" in msg
    (tmp_path / "firp").mkdir()
    save_trained(torch.nn.Linear(4, 3), tmp_path / "firp" / "heads.pt", {**other, "n_heads": 1, "share_lm_head": False})
    msg = one_error(lambda: firp_heads(tiny, tmp_path / "firp"), tmp_path / "firp", "trained for another model")
    assert "hidden: 4096 there" in msg
    save_trained(torch.nn.Linear(4, 3), tmp_path / "pd.pt", {"m": 2, "n": 1, "mask": "x", **other})
    prompts = SimpleNamespace(m=3, n=1, mask="x")
    msg = one_error(lambda: init_from_stage1(prompts, tmp_path / "pd.pt", tiny), tmp_path / "pd.pt",
                    "of another shape or model")
    assert "m: 2 there, 3 here" in msg


@pytest.mark.parametrize("extra,msg", [
    ([], "needs --heldout-corpus (ShareGPT text) or --corpus-dir"),
    (["--corpus-dir", "c", "--corpus-tokens", "0"], "--corpus-tokens=0 is out of range"),
    (["--corpus-dir", "c", "--topk", "0"], "--topk=0 is out of range"),
    (["--heldout-corpus", "h", "--text-sequences", "3"], "--text-sequences needs --corpus-dir"),
    (["--corpus-dir", "c", "--device", "gpu0"], "invalid device 'gpu0'"),
])
def test_the_teacher_checks_its_arguments_before_the_model_loads(tmp_path, capsys, monkeypatch, extra, msg):
    from common.training import teacher

    def tripwire(*a, **k):
        raise AssertionError("the model was loaded before the arguments were checked")
    monkeypatch.setattr(teacher, "load_model", tripwire)
    line = cli(teacher._main, ["--model", "m", "--teacher", str(tmp_path / "t.pt"), *extra], capsys)
    assert msg in line and list(tmp_path.iterdir()) == []
