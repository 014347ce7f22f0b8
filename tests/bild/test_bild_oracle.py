"""BiLD's oracle study (Figure 2) on tiny random models: the one-pass, prefix-sharing decode
equals a direct recomputation per threshold; its ends are the two models alone; analysis and
bad input."""
import math

import pytest
import torch

from bild.oracle import main, oracle_decode, parse_thresholds, setting
from common.decoders import get_decoder
from common.errors import UserError

pytestmark = pytest.mark.usefixtures("one_thread")
# where each pair's p_L(y_small) lies (the random LLaMA pair's near 1/V, the T5 pair's spread out),
# so thresholds split the paths
THRESHOLDS = {"llama": [0.0, 0.008, 0.009, 0.0095, 0.01, 0.0105, 0.011, 0.012, 1.0, math.inf],
              "t5": [0.0, 0.001, 0.005, 0.01, 0.05, 0.1, 0.2, 0.5, 0.7, 0.9, 1.0, math.inf]}


@torch.no_grad()
def _next_logits(model, prompt, tokens):
    """``[V]`` logits after ``prompt ++ tokens``: a full forward, no cache (the reference)."""
    if model.config.is_encoder_decoder:
        dec = torch.tensor([[model.config.decoder_start_token_id, *tokens]])
        return model(input_ids=prompt, decoder_input_ids=dec).logits[0, -1]
    ids = torch.cat([prompt, torch.tensor([tokens], dtype=torch.long)], dim=1)
    return model(input_ids=ids).logits[0, -1]


def _reference(large, small, prompt, t, n, eos):
    """One threshold on its own, step by step, every step recomputed from scratch."""
    tokens, engaged, changed = [], 0, 0
    while len(tokens) < n and not (tokens and tokens[-1] in eos):
        ll, ls = _next_logits(large, prompt, tokens), _next_logits(small, prompt, tokens)
        ys, yl = int(ls.argmax()), int(ll.argmax())
        p = float(torch.softmax(ll.float(), -1)[ys])
        if p < t:
            engaged += 1
            changed += yl != ys
            tokens.append(yl)
        else:
            tokens.append(ys)
    return {"tokens": tokens, "engaged": engaged, "changed": changed}


CASES = [("llama", [1, 5, 6, 7, 5, 6]), ("llama", [1, 40, 41, 42, 43]), ("llama", [1, 77, 3, 3, 3, 12, 60, 61]),
         ("t5", [5, 6, 7, 8, 9, 10]), ("t5", [40, 41, 42])]


@pytest.mark.parametrize("kind,prompt", CASES)
def test_one_pass_equals_each_threshold_alone(llama_pair, t5_pair, kind, prompt):
    large, small = llama_pair if kind == "llama" else t5_pair
    ids, n, eos = torch.tensor([prompt]), 20, {2} if kind == "llama" else {1}
    got = oracle_decode(large, small, ids, THRESHOLDS[kind], n, eos)
    assert sorted(got) == THRESHOLDS[kind]
    for t in THRESHOLDS[kind]:
        assert got[t] == _reference(large, small, ids, t, n, eos), (kind, prompt, t)
    # the ends: the small model alone, the large model alone (vanilla greedy, token for token)
    assert got[0.0]["tokens"] == get_decoder("vanilla", small).generate(ids, n).tokens
    assert got[math.inf]["tokens"] == get_decoder("vanilla", large).generate(ids, n).tokens
    assert got[0.0]["engaged"] == 0 and got[math.inf]["engaged"] == len(got[math.inf]["tokens"])


@pytest.mark.parametrize("kind,prompt", [CASES[1], CASES[4]])
def test_thresholds_split_the_paths(llama_pair, t5_pair, kind, prompt):
    """The test above means something only if thresholds lead to different outputs."""
    large, small = llama_pair if kind == "llama" else t5_pair
    got = oracle_decode(large, small, torch.tensor([prompt]), THRESHOLDS[kind], 20, {2} if kind == "llama" else {1})
    assert len({tuple(r["tokens"]) for r in got.values()}) >= 4
    engaged = [got[t]["engaged"] / len(got[t]["tokens"]) for t in THRESHOLDS[kind]]
    assert engaged[0] == 0 and engaged[-1] == 1 and 0 < engaged[len(engaged) // 2] < 1


def test_settings_and_threshold_parsing():
    assert [setting(t) for t in (0.0, 0.3, math.inf)] == ["small", "oracle", "large"]
    assert parse_thresholds("0.5, 0.1,0.5") == [0.1, 0.5]
    for bad, msg in (("1.5", r"value 1.5 is out of range; valid: \[0, 1\]"), ("", "names no threshold"),
                     ("a,b", "must be comma-separated numbers")):
        with pytest.raises(UserError, match=msg):
            parse_thresholds(bad)


def test_bad_input_is_one_error_line_before_any_model_loads(tmp_path, capsys):
    from common.errors import cli_main

    base = ["--large", "no-such-model", "--small", "x", "--dataset", "sharegpt-summarize", "--out",
            str(tmp_path / "o.jsonl")]
    for extra, msg in ((["--thresholds", "2"], "error: --thresholds value 2.0 is out of range"),
                       (["--thresholds", "0.5", "--max-new-tokens", "0"], "error: max_new_tokens=0 is out of range"),
                       (["--thresholds", "0.5", "--device", "warp"], "error: invalid device 'warp'"),
                       (["--thresholds", "0.5", "--template", "nope"], "error: unknown prompt template 'nope'")):
        with pytest.raises(SystemExit) as e:
            cli_main(lambda: main(base + extra))
        assert e.value.code == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith(msg) and "\n" not in err, err


def test_oracle_points_by_hand():
    from bild.analysis import oracle_points

    def rec(q, t, s, text, ref, n, engaged, changed):
        return {"question_id": q, "threshold": t, "setting": s, "text": text, "reference": ref,
                "new_tokens": n, "engaged": engaged, "changed": changed}

    refs = {"a": "the cat sat", "b": "a dog ran"}
    recs = [rec("a", 0.0, "small", "a cow", refs["a"], 2, 0, 0), rec("b", 0.0, "small", "a dog ran", refs["b"], 3, 0, 0),
            rec("a", 0.5, "oracle", "the cat sat", refs["a"], 3, 1, 1), rec("b", 0.5, "oracle", "a dog ran", refs["b"], 3, 2, 0),
            rec("a", None, "large", "the cat sat", refs["a"], 3, 3, 2), rec("b", None, "large", "a dog ran", refs["b"], 3, 3, 0)]
    p = oracle_points(recs, "rouge_l")
    assert list(p.setting) == ["small", "oracle", "large"] and math.isnan(p.threshold.iloc[-1])
    assert list(p.engaged) == [0.0, pytest.approx(3 / 6), 1.0] and list(p.changed) == [0.0, pytest.approx(1 / 6), pytest.approx(2 / 6)]
    assert p.quality.iloc[1] == pytest.approx(p.quality.iloc[2]) and p.quality.iloc[0] < p.quality.iloc[1]
    with pytest.raises(ValueError, match="different prompt counts"):
        oracle_points(recs[:-1], "rouge_l")


@pytest.mark.parametrize("profile", ["smoke", "embedded", "paper"])
def test_every_profile_configures_the_oracle(profile):
    from types import SimpleNamespace

    from bild.config import from_profile
    from bild.workflow import RuleParams
    from common.config import load_profile

    cfg = from_profile(load_profile(None, profile))
    params = RuleParams(cfg, ".cache/components/x")
    for task in cfg.tasks:
        wc = SimpleNamespace(btask=task, variant=cfg.variants[0])
        assert parse_thresholds(params.oracle_thresholds(wc)) == list(cfg.oracle.thresholds)
        assert 1 <= params.oracle_n(wc) <= cfg.task(task).n


def test_oracle_config_checks():
    from bild.config import OracleConfig

    with pytest.raises(UserError, match=r"bild.oracle.thresholds value 1.5 is out of range"):
        OracleConfig((0.5, 1.5))
    with pytest.raises(UserError, match="bild.oracle.n=0 is out of range"):
        OracleConfig((0.5,), n=0)


@pytest.mark.model
def test_interrupted_oracle_resumes_from_its_finished_prompts(tmp_path, monkeypatch, embedded):
    """With --resume, a run that dies on its second prompt leaves the first in the log (nothing
    at the final path); the rerun decodes only the second, and its records equal a fresh run's."""
    import json

    import bild.oracle as oracle
    from common.assets import models
    from common.decoders import speculative

    model, tok = embedded
    (tmp_path / "cache").mkdir()
    (tmp_path / "cache" / "models").symlink_to(models.cache_root() / "models")
    monkeypatch.setenv("REPRO_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(models, "load_model", lambda *a, **k: (model, tok))
    monkeypatch.setattr(speculative, "resolve_draft", lambda small, large: large)  # the model as its own small
    out = tmp_path / "oracle.jsonl"
    args = ["--large", "x", "--small", "x", "--dataset", "sharegpt-summarize", "--n", "2", "--max-new-tokens", "3",
            "--truncate", "left", "--max-prompt-tokens", "64", "--thresholds", "0.5", "--threads", "2"]
    decode, calls = oracle.oracle_decode, []

    class Killed(Exception):
        pass

    def dies_on_the_second(*a, **k):
        calls.append(1)
        if len(calls) == 2:
            raise Killed
        return decode(*a, **k)

    monkeypatch.setattr(oracle, "oracle_decode", dies_on_the_second)
    with pytest.raises(Killed):
        main(args + ["--resume", "--out", str(out)])
    assert not out.exists()
    log, = (tmp_path / "cache" / "resume").glob("*_oracle.jsonl")
    assert len(log.read_text().splitlines()) == 2  # the identity and the first prompt

    calls.clear()
    main(args + ["--resume", "--out", str(out)])
    assert len(calls) == 1 and not log.exists()
    monkeypatch.setattr(oracle, "oracle_decode", decode)
    main(args + ["--out", str(tmp_path / "fresh.jsonl")])
    strip = lambda p: [{k: v for k, v in json.loads(l).items() if k != "code_version"}  # noqa: E731
                       for l in p.read_text().splitlines()]
    got, fresh = strip(out), strip(tmp_path / "fresh.jsonl")
    assert len(got) == 2 * 3 and got == fresh  # 2 prompts x (small, 0.5, large)
    # another setting does not mix into the log: refused with one line naming it
    monkeypatch.setattr(oracle, "oracle_decode", dies_on_the_second)
    calls.clear()
    with pytest.raises(Killed):
        main(args + ["--resume", "--out", str(out)])
    with pytest.raises(UserError, match="partial run with other settings"):
        main([*args[:-3], "0.7", "--threads", "2", "--resume", "--out", str(out)])
