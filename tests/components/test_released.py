"""The papers' released components: synthetic checkpoints written in each author's format on a
tiny random model convert into this repository's folders, compute what the authors' modules
compute, and decode exactly vanilla's tokens; BiLD's fine-tuned checkpoints (standard
transformers folders) load through the paper profile's loader."""
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

from common.decoders import get_decoder
from common.errors import UserError
from common.components.released_heads import convert_eagle, convert_medusa
from common.harness.stand_ins import write_medusa_release, write_prompt_tokens_release
from prompt_decoding.released import convert_prompt_tokens
from decoding_checks import assert_exact_and_accepting

REPO = Path(__file__).resolve().parents[2]


# ---------------------------------------------------------------- Medusa-1
class AuthorsResBlock(nn.Module):
    """Medusa-1's residual block as its authors define it: ``x + SiLU(linear(x))``."""

    def __init__(self, hidden):
        super().__init__()
        self.linear = nn.Linear(hidden, hidden)
        self.act = nn.SiLU()

    def forward(self, x):
        return x + self.act(self.linear(x))


def authors_medusa(model, heads: int, seed: int = 0) -> nn.ModuleList:
    """Medusa-1's ``medusa_head`` module list (one block, then a bias-free projection per head),
    with random weights scaled so the heads' guesses differ from the LM head's."""
    H, V = model.config.hidden_size, model.config.vocab_size
    torch.manual_seed(seed)
    mods = nn.ModuleList(nn.Sequential(AuthorsResBlock(H), nn.Linear(H, V, bias=False)) for _ in range(heads))
    with torch.no_grad():
        for p in mods.parameters():
            p.mul_(5.0)
    return mods


def write_medusa(folder: Path, model, mods: nn.ModuleList, fmt: str = "pt", **cfg) -> Path:
    # the tiny model's name_or_path is empty: a release that names no base
    return write_medusa_release(folder, mods.state_dict(), model.config.name_or_path, fmt, **cfg)


@pytest.mark.parametrize("fmt", ["pt", "safetensors"])
def test_medusa_released_heads_compute_the_authors_logits_and_decode_exactly(chaotic_llama, tmp_path, fmt):
    mods = authors_medusa(chaotic_llama, 3)
    src = write_medusa(tmp_path / "authors", chaotic_llama, mods, fmt)
    stats = convert_medusa(src, chaotic_llama, tmp_path / "heads")
    assert sorted(p.name for p in (tmp_path / "heads").iterdir()) == [
        "heads.pt", "released.json", "stats.json", "tree_16.json", "tree_32.json", "tree_63.json"]
    assert "PRIOR_ACC" in stats["accuracy_source"] and len(stats["accuracy"]) == 3
    med = get_decoder("medusa", chaotic_llama, heads=str(tmp_path / "heads"), tree=16)
    h = torch.randn(5, chaotic_llama.config.hidden_size)
    with torch.no_grad():
        want = torch.stack([m(h) for m in mods.half().float()])  # the authors' module, fp16 weights
        torch.testing.assert_close(med.heads(h), want)
    assert_exact_and_accepting(chaotic_llama, "medusa", heads=str(tmp_path / "heads"), tree=16)


def test_medusa_released_with_measured_accuracies(chaotic_llama, tmp_path):
    from common.training.teacher import teacher_pass
    from test_medusa import greedy_corpus

    teacher = {"heldout": teacher_pass(chaotic_llama, greedy_corpus(chaotic_llama, 2, 100, 12), 8, 2)}
    src = write_medusa(tmp_path / "authors", chaotic_llama, authors_medusa(chaotic_llama, 2))
    stats = convert_medusa(src, chaotic_llama, tmp_path / "heads", teacher)
    assert stats["accuracy_source"].startswith("medusa top-k accuracy of the released heads")
    assert len(stats["accuracy"]) == 2 and all(0.0 <= a <= 1.0 for row in stats["accuracy"] for a in row)
    tree = json.loads((tmp_path / "heads" / "tree_63.json").read_text())
    assert max(len(p) for p in tree["paths"]) <= 2 and tree["source"] == stats["accuracy_source"]


def test_medusa_released_bad_folders(chaotic_llama, tiny, tmp_path):
    mods = authors_medusa(chaotic_llama, 2)
    with pytest.raises(UserError, match="medusa_num_layers=2; valid: 1"):
        convert_medusa(write_medusa(tmp_path / "a", chaotic_llama, mods, medusa_num_layers=2), chaotic_llama, tmp_path / "o")
    with pytest.raises(UserError, match=r"was released for lmsys/vicuna-7b-v1.3, not for this model"):
        convert_medusa(write_medusa(tmp_path / "b", chaotic_llama, mods, base_model_name_or_path="lmsys/vicuna-7b-v1.3"),
                       chaotic_llama, tmp_path / "o")
    small = authors_medusa(tiny, 2)
    folder = write_medusa(tmp_path / "c", chaotic_llama, small)
    state = torch.load(folder / "medusa_lm_head.pt")
    state["0.1.weight"] = state["0.1.weight"][:50]
    torch.save(state, folder / "medusa_lm_head.pt")
    with pytest.raises(UserError, match=r"'0.1.weight' has shape \[50, 64\], not \[96, 64\]"):
        convert_medusa(folder, chaotic_llama, tmp_path / "o")
    folder = write_medusa(tmp_path / "d", chaotic_llama, mods, medusa_num_heads=1)
    with pytest.raises(UserError, match="beyond its 1 heads"):
        convert_medusa(folder, chaotic_llama, tmp_path / "o")
    (folder / "medusa_lm_head.pt").unlink()
    with pytest.raises(UserError, match="holds none of medusa_lm_head.safetensors, medusa_lm_head.pt"):
        convert_medusa(folder, chaotic_llama, tmp_path / "o")
    with pytest.raises(UserError, match="is not a folder"):
        convert_medusa(tmp_path / "nope" / "x", chaotic_llama, tmp_path / "o")


# ---------------------------------------------------------------- parallel prompt decoding
def write_ppd(folder: Path, model, m: int, n: int, seed: int = 0, weights: bool = False, head: bool = False,
              fmt: str = "safetensors", **cfg) -> torch.Tensor:
    """A PEFT prompt-tuning adapter as the authors' PromptDecoder.save_pretrained writes it;
    returns the ``[m*n, H]`` embeddings (as fp16 holds them)."""
    H, V = model.config.hidden_size, model.config.vocab_size
    g = torch.Generator().manual_seed(seed)
    emb = torch.randn(m * n, H, generator=g) * 3.0
    w = {f"{j}.weight": torch.rand(1, n, generator=g) for j in range(m)} if weights else None
    lm = model.lm_head.weight.detach() + 0.1 * torch.randn(V, H, generator=g) if head else None
    write_prompt_tokens_release(folder, emb, m, n, model.config.name_or_path, fmt, weights=w, head=lm, **cfg)
    return emb.half().float()


@pytest.mark.parametrize("m,n,weights,head,fmt", [(3, 1, False, False, "safetensors"), (2, 3, False, False, "bin"),
                                                   (2, 2, True, True, "safetensors")])
def test_prompt_tokens_released_decode_exactly(chaotic_llama, tmp_path, m, n, weights, head, fmt):
    emb = write_ppd(tmp_path / "authors", chaotic_llama, m, n, weights=weights, head=head, fmt=fmt)
    meta = convert_prompt_tokens(tmp_path / "authors", chaotic_llama, tmp_path / "pt")
    assert (meta["m"], meta["n"], meta["mask"]) == (m, n, "ensemble")
    assert meta.get("aggregation", "average") == ("learned" if weights else "average") and meta.get("head", False) == head
    pd = get_decoder("prompt_decoding", chaotic_llama, prompt_tokens=str(tmp_path / "pt"), tree=8)
    # virtual token j*n + i is EPT i of prompt token j
    torch.testing.assert_close(pd.prompts.embeddings.data[1, n - 1], emb[1 * n + n - 1])
    torch.testing.assert_close(pd.prompts.embeddings.data.reshape(m * n, -1), emb)
    # few short prompts: the lossless test (test_core_engine) covers the decoder itself; here the format
    assert_exact_and_accepting(chaotic_llama, "prompt_decoding", prompts=2, new_tokens=16,
                               prompt_tokens=str(tmp_path / "pt"), tree=8)


def test_prompt_tokens_released_guesses_are_the_authors_forward(chaotic_llama, tmp_path):
    """With n = 1 the authors' forward appends the m prompt embeddings after the context at
    positions L..L+m-1 under the causal mask; their LM-head logits are the guesses."""
    m = 3
    emb = write_ppd(tmp_path / "authors", chaotic_llama, m, 1, vt_attention_type="decoder")
    convert_prompt_tokens(tmp_path / "authors", chaotic_llama, tmp_path / "pt")
    pd = get_decoder("prompt_decoding", chaotic_llama, prompt_tokens=str(tmp_path / "pt"), tree=14)
    ids = torch.tensor([[1, 17, 40, 41, 8, 90]])
    with torch.no_grad():
        x = torch.cat([chaotic_llama.model.embed_tokens(ids), emb[None]], 1)
        out = chaotic_llama(inputs_embeds=x, output_hidden_states=True)
        want = out.logits[0, -m:]
        normed = out.hidden_states[-1][0, -m:]  # the final norm's output (transformers' last hidden state)
        got = pd.prompts.readout(normed, chaotic_llama.lm_head)
    torch.testing.assert_close(got, want)


@pytest.mark.parametrize("cfg,problem", [
    ({"vt_attention_type": "encoder"}, "vt_attention_type='encoder' with 2 virtual tokens"),
    ({"vt_attention_type": "decoder"}, "vt_attention_type='decoder' with 2 virtual tokens"),
    ({"aggregation_type": "adaptive_weighted"}, "aggregation_type='adaptive_weighted' is not supported"),
    ({"use_prefix_tuning": True}, "prefix tuning and multi-exit ensembles"),
    ({"num_exits": 2}, "prefix tuning and multi-exit ensembles"),
    ({"base_model_name_or_path": "lmsys/vicuna-13b-v1.3"}, "released for lmsys/vicuna-13b-v1.3"),
    ({"num_special_tokens": 4}, r"'prompt_embeddings' has shape \[4, 64\], not \[8, 64\]"),
])
def test_prompt_tokens_released_refused_settings(chaotic_llama, tmp_path, cfg, problem):
    write_ppd(tmp_path / "authors", chaotic_llama, 2, 2, **cfg)
    with pytest.raises(UserError, match=problem):
        convert_prompt_tokens(tmp_path / "authors", chaotic_llama, tmp_path / "pt")


# ---------------------------------------------------------------- EAGLE, CLI
def write_eagle(folder, model, seed=0, **cfg):
    """A synthetic EAGLE-1/2 head in its authors' format (cnets1.Model's state dict: fc,
    layers.0.* without an input norm, a copy of the embeddings) with random weights."""
    from common.components.eagle_head import EagleHead
    torch.manual_seed(seed)
    ours = EagleHead(model)
    state = {("layers.0." + k[len("layer."):] if k.startswith("layer.") else k): torch.randn(v.shape) * 0.3
             for k, v in ours.state_dict().items()}
    state["embed_tokens.weight"] = model.get_input_embeddings().weight.detach().clone()
    folder.mkdir(parents=True, exist_ok=True)
    torch.save(state, folder / "pytorch_model.bin")
    (folder / "config.json").write_text(json.dumps({"num_hidden_layers": 1, "hidden_size": model.config.hidden_size,
                                                    **cfg}))
    return state


def test_eagle_released_head_loads_and_decodes_exactly(chaotic_llama, tmp_path):
    from common.decoders.eagle import Eagle
    from common.engine.forward import embed
    state = write_eagle(tmp_path / "authors", chaotic_llama)
    meta = convert_eagle(tmp_path / "authors", chaotic_llama, tmp_path / "eagle")
    assert meta["released"] == str(tmp_path / "authors")
    dec = Eagle(chaotic_llama, head=str(tmp_path / "eagle"), mode="dynamic", depth=3, topk=2, total=6)
    # the authors' first step by hand: fc([emb(x); h]) through their layer, read by the base head
    torch.testing.assert_close(dec.head.fc.weight, state["fc.weight"])
    torch.testing.assert_close(dec.head.layer.mlp.down_proj.weight, state["layers.0.mlp.down_proj.weight"])
    h, tok = torch.randn(1, 1, 64), torch.tensor([[7]])
    x = torch.cat([embed(chaotic_llama, tok), h], -1) @ state["fc.weight"].T + state["fc.bias"]
    with torch.no_grad():
        assert torch.allclose(dec.head.fc(torch.cat([embed(chaotic_llama, tok), h], -1)), x, atol=1e-5)
    van = get_decoder("vanilla", chaotic_llama)
    van.eos = dec.eos = set()
    ids = torch.tensor([[1, 5, 9, 33, 7]])
    assert dec.generate(ids, 30).tokens == van.generate(ids, 30).tokens


def test_eagle_released_bad_folders(chaotic_llama, tmp_path):
    write_eagle(tmp_path / "two", chaotic_llama, num_hidden_layers=2)
    with pytest.raises(UserError, match="num_hidden_layers=2"):
        convert_eagle(tmp_path / "two", chaotic_llama, tmp_path / "o")
    state = write_eagle(tmp_path / "narrow", chaotic_llama)
    state["fc.weight"] = state["fc.weight"][:, :64]
    torch.save(state, tmp_path / "narrow" / "pytorch_model.bin")
    with pytest.raises(UserError, match="fc.weight"):
        convert_eagle(tmp_path / "narrow", chaotic_llama, tmp_path / "o")
    write_eagle(tmp_path / "other", chaotic_llama, base_model_name_or_path="lmsys/vicuna-7b-v1.3")
    with pytest.raises(UserError, match="was released for lmsys/vicuna-7b-v1.3"):
        convert_eagle(tmp_path / "other", chaotic_llama, tmp_path / "o")


def test_cli_converts_and_fails_in_one_line(chaotic_llama, tmp_path):
    """``python -m common.components.released_heads`` on a saved tiny model; a bad folder ends in one ``error:`` line."""
    from transformers import PreTrainedTokenizerFast
    from tokenizers import Tokenizer, models

    model_dir = tmp_path / "tiny"
    chaotic_llama.save_pretrained(model_dir)
    vocab = {f"t{i}": i for i in range(chaotic_llama.config.vocab_size)}
    tok = PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.WordLevel(vocab, unk_token="t0")))
    tok.save_pretrained(model_dir)
    src = write_medusa(tmp_path / "authors", chaotic_llama, authors_medusa(chaotic_llama, 2),
                       base_model_name_or_path="x/tiny")
    env = {"PATH": "/usr/bin:/bin", "HF_HUB_OFFLINE": "1", "HOME": str(tmp_path), "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "common.components.released_heads", "medusa", "--src", str(src), "--model", str(model_dir),
           "--out", str(tmp_path / "heads")]
    r = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "heads" / "heads.pt").is_file()
    (src / "config.json").write_text("{")
    r = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True)
    errors = [line for line in r.stderr.strip().splitlines() if line.startswith("error:")]  # the rest: progress bars
    assert r.returncode != 0 and len(errors) == 1 and r.stderr.strip().endswith(errors[0]), r.stderr
    assert "config.json: invalid JSON" in errors[0]


# ---------------------------------------------------------------- BiLD's fine-tuned T5 checkpoints
def test_bild_finetuned_t5_checkpoint_loads_through_the_profile_loader(t5_pair, tmp_path):
    """The paper profile names BiLD's released pairs by hub id (kssteven/T5-large-xsum, ...):
    standard ``save_pretrained`` folders, which ``load_model`` reads; a folder saved that way
    decodes as the model it came from, and BiLD on the pair gives vanilla's tokens at rb=0."""
    from transformers import PreTrainedTokenizerFast
    from tokenizers import Tokenizer, models

    from common.assets.models import load_model

    large, small = t5_pair
    vocab = {f"t{i}": i for i in range(large.config.vocab_size)}
    tok = PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.WordLevel(vocab, unk_token="t2")),
                                  pad_token="t0", eos_token="t1")
    folders = {}
    for name, m in (("large", large), ("small", small)):
        folders[name] = tmp_path / f"T5-{name}-xsum"
        m.save_pretrained(folders[name])
        tok.save_pretrained(folders[name])
    loaded, ltok = load_model(str(folders["large"]))
    small_loaded, _ = load_model(str(folders["small"]))
    assert loaded.config.is_encoder_decoder and ltok.eos_token_id == 1
    ids = torch.tensor([[5, 9, 33, 60, 7, 1]])
    ref = get_decoder("vanilla", large).generate(ids, 12).tokens
    assert get_decoder("vanilla", loaded).generate(ids, 12).tokens == ref
    for small_opt in (small_loaded, str(folders["small"])):  # the profile passes the small model by name
        bild = get_decoder("bild", loaded, small=small_opt, rollback_threshold=0.0)
        assert bild.generate(ids, 12).tokens == ref


def test_benchmark_cli_on_a_dataset_fixture_with_released_heads(chaotic_llama, tmp_path):
    """What the paper profile's pd_bench / firp_bench rules run (python -m common.harness.bench
    --dataset gsm8k), on the GSM8K fixture (DECODING_REPRO_DATA) and a saved tiny model, with
    released Medusa heads converted beside vanilla: every record's tokens equal vanilla's."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    model_dir = tmp_path / "tiny"
    chaotic_llama.save_pretrained(model_dir)
    words = [f"w{i}" for i in range(chaotic_llama.config.vocab_size)]
    words[:3] = ["<unk>", "<s>", "</s>"]
    raw = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    raw.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=raw, unk_token="<unk>", bos_token="<s>",
                            eos_token="</s>").save_pretrained(model_dir)
    src = write_medusa(tmp_path / "authors", chaotic_llama, authors_medusa(chaotic_llama, 3),
                       base_model_name_or_path="lab/tiny")
    env = {"PATH": "/usr/bin:/bin", "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "HOME": str(tmp_path),
           "OMP_NUM_THREADS": "1", "DECODING_REPRO_DATA": str(REPO / "tests" / "fixtures" / "datasets")}
    r = subprocess.run([sys.executable, "-m", "common.components.released_heads", "medusa", "--src", str(src), "--model",
                        str(model_dir), "--out", str(tmp_path / "heads")], cwd=REPO, env=env,
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    out = tmp_path / "bench.jsonl"
    dcfg = json.dumps({"medusa": {"heads": str(tmp_path / "heads"), "tree": 16}})
    r = subprocess.run([sys.executable, "-m", "common.harness.bench", "--model", str(model_dir), "--decoders", "vanilla,medusa",
                        "--dataset", "gsm8k", "--n", "2", "--max-new-tokens", "12", "--decoder-config", dcfg,
                        "--out", str(out)], cwd=REPO, env=env, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-2000:]
    recs = [json.loads(line) for line in out.read_text().splitlines()]
    by = {}
    for rec in recs:
        by.setdefault(rec["question_id"], {})[rec["decoder"]] = rec
    assert sorted(by) == ["gsm8k-0", "gsm8k-1"] and all(set(v) == {"vanilla", "medusa"} for v in by.values())
    for v in by.values():
        assert v["medusa"]["tokens"] == v["vanilla"]["tokens"] and len(v["vanilla"]["tokens"]) > 0
