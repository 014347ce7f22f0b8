"""Pipelined decoding (ppd_pipelined): match rate: per-token early ranks against a brute-force recomputation; config and bad input."""
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from common.config import load_profile
from common.errors import UserError, cli_main
from common.engine.forward import logits_from_hidden
from ppd_pipelined.config import HeadsConfig, PPDConfig, SamplingConfig, Table3Config, TaskConfig, from_profile
from ppd_pipelined.heads import LayerHeads
from ppd_pipelined.matchrate import choose, decode_with_probes, match_rate, match_record
from ppd_pipelined.templates import build_prompts, render_task
from common.assets.data import Sample

ROOT = Path(__file__).resolve().parents[2]
LAYERS = [1, 2, 3]


pytestmark = pytest.mark.usefixtures("one_thread")


def brute_force(model, prompt, tokens, layer, head=None):
    """Rank of each token in the early logits of a full (cache-free) forward over the prefix."""
    ranks, top5 = [], []
    for t, tok in enumerate(tokens):
        ids = torch.cat([prompt, torch.tensor([tokens[:t]], dtype=torch.long)], dim=1)
        with torch.no_grad():
            hs = model(input_ids=ids, output_hidden_states=True).hidden_states
            logits = logits_from_hidden(model, hs[layer][:, -1:], head)[0, -1]
        ranks.append(int((logits > logits[tok]).sum()))
        top5.append(logits.topk(5).indices.tolist())
    return ranks, top5


@pytest.mark.parametrize("method", ["greedy", "top_k", "top_p"])
def test_ranks_equal_brute_force(tiny, method):
    torch.manual_seed(0)
    prompt = torch.randint(3, 96, (1, 7))
    gen = torch.Generator().manual_seed(1)
    d = decode_with_probes(tiny, prompt, LAYERS, 12, method, top_k=3, top_p=0.9, generator=gen)
    assert len(d["tokens"]) == 12 and d["probes"].shape == (12, len(LAYERS), tiny.config.hidden_size)
    heads = LayerHeads(LAYERS, tiny.config.hidden_size, tiny.config.vocab_size, tiny.lm_head.weight)
    with torch.no_grad():
        for h in heads.heads:  # make Y differ from N
            h.weight.add_(0.5 * torch.randn_like(h.weight))
    rec = match_record(tiny, d["probes"], d["tokens"], LAYERS, ["N", "Y"], heads)
    for c in ("N", "Y"):
        for l in LAYERS:
            ranks, top5 = brute_force(tiny, prompt, d["tokens"], l, heads.head(l) if c == "Y" else None)
            assert rec[c][str(l)]["rank"] == ranks
            assert rec[c][str(l)]["top5"] == top5
            # rank < k <=> the token is in the early top-k (no ties in random fp32 logits)
            for k in (1, 3, 5):
                assert [r < k for r in ranks] == [tok in t5[:k] for tok, t5 in zip(d["tokens"], top5)]
    if method == "greedy":  # greedy picks the final layer's argmax; that equals a last-layer rank of 0
        assert d["tokens"] == d["argmax"]


def test_match_rate_and_sampling_support():
    assert match_rate([0, 1, 2, 7], 1) == 0.25 and match_rate([0, 1, 2, 7], 3) == 0.75
    logits = torch.tensor([5.0, 4.0, 3.0, -10.0, -10.0])
    gen = torch.Generator().manual_seed(0)
    assert {choose(logits, "top_k", top_k=2, generator=gen) for _ in range(200)} <= {0, 1}
    assert {choose(logits, "top_p", top_p=0.5, generator=gen) for _ in range(50)} == {0}
    assert choose(logits, "greedy") == 0


def test_templates_fill_fields():
    s = Sample("q1", "reasoning", ("Who won?",), "Alice won the race.", "mt-bench")
    text = render_task("squad", "ppdp-squad", s)
    assert "Alice won the race." in text and "please answer the question: Who won?" in text
    assert render_task("squad", "ppdp-squad", Sample("q2", "x", ("no ref",))) is None
    hub = Sample("id", "squad", ("Paris is in France.\n\nWhere is Paris?",), "France", "hub")
    assert "please answer the question: Where is Paris?" in render_task("squad", "ppdp-squad", hub)
    assert render_task("wmt", "ppdp-wmt", Sample("w", "wmt14-en-fr", ("Hello.",))).endswith("English: Hello.\nFrench:")
    with pytest.raises(UserError, match="needs field"):
        render_task("wmt", "ppdp-squad", Sample("w", "x", ("Hello.",)))
    with pytest.raises(UserError, match="unknown prompt template"):
        build_prompts("wmt", "mt-bench", "nope", 1)


def _cfg(**kw):
    tasks = {t: TaskConfig(t, "mt-bench", "ppdp-squad", 2, 8) for t in ("squad", "wmt", "cnn_dm")}
    base = dict(model="m", layers=(2, 3), ks=(1, 3, 5), classifiers=("N", "Y"), tasks=tasks, heads=HeadsConfig(),
                sampling=SamplingConfig(model="m"), table3=Table3Config(model="m"))
    return PPDConfig(**{**base, **kw})


def test_config_dataclass_validation():
    assert _cfg().layers == (2, 3)
    for kw, msg in [({"ks": (0,)}, "k=0 is out of range"), ({"layers": (0, 3)}, "layer=0 is outside"),
                    ({"layers": (2, 2)}, "repeat"), ({"classifiers": ("Z",)}, "unknown classifier"),
                    ({"mid_layer": 7}, "mid_layer=7")]:
        with pytest.raises(UserError, match=msg):
            _cfg(**kw)
    with pytest.raises(UserError, match=r"top_p=1.5 is out of range; valid: \[0, 1\]"):
        SamplingConfig(model="m", top_p=1.5)
    with pytest.raises(UserError, match=r"lr=0.0 is out of range; valid: > 0"):
        HeadsConfig(lr=0.0)
    with pytest.raises(UserError, match="unknown task"):
        TaskConfig("xsum", "mt-bench", "plain", 1, 1)
    for name in ("smoke", "embedded", "paper"):  # every profile's YAML builds a valid config
        cfg = from_profile(load_profile(profile=name))
        assert cfg.mid_layer in cfg.layers and set(cfg.tasks) == {"squad", "wmt", "cnn_dm"}


def _main(main, argv, capsys, monkeypatch):
    """Run a CLI main in-process under cli_main: exit status and stderr."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    with pytest.raises(SystemExit) as e:
        cli_main(lambda: main(argv))
    return e.value.code, capsys.readouterr().err


@pytest.mark.parametrize("extra,msg", [
    (["--layers", "15", "--method", "greedy", "--top-p", "1.5"], "top_p=1.5 is out of range"),
    (["--layers", "0,15"], "layer=0 is outside the model's layers"),
    (["--layers", "15", "--top-k", "0", "--method", "top_k"], "top_k=0 is out of range"),
    (["--layers", "15", "--method", "beam"], "unknown method 'beam'"),
    (["--layers", "15", "--classifiers", "N,Y"], "classifier Y needs --heads"),
    (["--layers", "15", "--task", "xsum"], "unknown task 'xsum'"),
    (["--layers", "15", "--model", "no-such-model"], "unknown model 'no-such-model'"),
    (["--layers", "30"], "layer=30 is outside the model's layers; valid: 1..29"),
])
def test_matchrate_bad_input_one_line(tmp_path, capsys, monkeypatch, extra, msg):
    from ppd_pipelined.matchrate import main
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"question_id": "1", "category": "squad", "turns": ["Hi"]}\n')
    out = tmp_path / "o.jsonl"
    # argparse: a later flag wins, so the case's own --task/--model override these
    args = ["--model", "smollm2-135m-instruct", "--task", "squad", "--prompts", str(prompts),
            "--max-new-tokens", "2", "--out", str(out)]
    code, err = _main(main, args + extra, capsys, monkeypatch)
    lines = [l for l in err.splitlines() if l.startswith("error:")]
    assert code == 2 and len(lines) == 1 and msg in lines[0], err[-2000:]
    assert not out.exists() and not list(tmp_path.glob("*.partial"))


@pytest.mark.parametrize("args,msg", [
    (["--task", "squad", "--dataset", "nope", "--template", "ppdp-squad", "--n", "1"], "unknown dataset 'nope'"),
    (["--task", "squad", "--dataset", "squad", "--template", "ppdp-squad", "--n", "1"], "needs the Hugging Face hub"),
    (["--task", "wmt", "--dataset", "mt-bench", "--template", "ppdp-wmt", "--n", "0"], "n=0 is out of range"),
])
def test_templates_bad_input_one_line(tmp_path, capsys, monkeypatch, args, msg):
    from ppd_pipelined.templates import main
    out = tmp_path / "o.jsonl"
    code, err = _main(main, [*args, "--out", str(out)], capsys, monkeypatch)
    assert code == 2 and msg in err and err.count("error:") == 1, err[-2000:]
    assert not out.exists()


def test_cli_exit_status_end_to_end(tmp_path):
    """The real entry point: one error line, exit 2, no output file."""
    out = tmp_path / "o.jsonl"
    r = subprocess.run([sys.executable, "-m", "ppd_pipelined.matchrate", "--model", "smollm2-135m-instruct",
                        "--task", "squad", "--prompts", str(tmp_path / "p.jsonl"), "--layers", "15",
                        "--method", "top_k", "--top-k", "0", "--out", str(out)],
                       cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 2 and r.stderr.strip().splitlines()[-1].startswith("error: top_k=0"), r.stderr
    assert not out.exists()
