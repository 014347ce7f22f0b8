"""README recipe (b), followed step by step: a new decoding method reaches ``cross.table``.

In a copy of the workflow (code, rules, config, notebooks), a tiny method is added exactly as
the README says: its module in a new package, its entry point in ``pyproject.toml``, the
"reinstall" that publishes the entry point, a variant's options in ``config.yaml``'s
``decoder_config`` and a profile (``config/profiles/recipe.yaml``) with a ``cross.groups`` group
that runs it. Then Snakemake plans and runs the
group's benchmark and the cost curve on a tiny random LLaMA and renders ``cross.table`` from
them. Before the entry point exists the plan must stop with one ``error:`` line, and before
the reinstall the benchmark must stop on the unknown decoder: neither step can be skipped.

Cost: one tiny-model benchmark (2 prompts x 16 tokens), the cost curve on the tiny model and one
notebook render; about a minute on 2 cores.
"""
import json
import os
import shutil
import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
# What the workflow reads at plan and run time; results/ and .cache/ stay behind (the copy
# writes its own under results_root).
TREE_DIRS = ["common", "ppd_pipelined", "bild", "prompt_decoding", "firp", "rules", "config", "notebooks"]
TREE_FILES = ["Snakefile", "pyproject.toml", "env.yml"]

# Step 1 of the recipe: the decoder, one class under the contract of common/decoders/base.py.
METHOD = '''\
"""tiny_greedy: greedy decoding with an optional cap on new tokens (the README's recipe test)."""
from common.decoders.base import DecodeOutput, Decoder, Option


class TinyGreedy(Decoder):
    name = "tiny_greedy"
    lossless = True            # with cap unset its tokens are vanilla's
    model_kinds = ("causal",)

    @classmethod
    def options(cls):
        return {"cap": Option(None, (int,), lo=1)}

    def _generate(self, input_ids, max_new_tokens):
        budget = min(max_new_tokens, self.cfg["cap"] or max_new_tokens)
        logits, _ = self.target.start(input_ids)
        tokens = []
        nxt = logits.argmax(-1).view(1, 1)  # [1, 1]
        while True:
            tokens.append(int(nxt))
            if tokens[-1] in self.eos or len(tokens) >= budget:
                break
            logits, _ = self.target.extend(nxt)
            nxt = logits[-1].argmax(-1).view(1, 1)
        return DecodeOutput(tokens, {"steps": len(tokens), "accept_lengths": [1] * len(tokens)})
'''


def copy_tree(dst: Path) -> None:
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for d in TREE_DIRS:
        shutil.copytree(ROOT / d, dst / d, ignore=ignore)
    for f in TREE_FILES:
        shutil.copy2(ROOT / f, dst / f)


def add_entry_point(repo: Path, line: str) -> None:
    """Step 2: the entry point, under the decoders' group of pyproject.toml."""
    text = (repo / "pyproject.toml").read_text()
    head = '[project.entry-points."decoding_repro.decoders"]\n'
    assert head in text
    (repo / "pyproject.toml").write_text(text.replace(head, head + line + "\n"))


def reinstall(repo: Path, site: Path) -> None:
    """Step 3, what ``pip install -e .`` (tools/setup.sh) does for the registry: publish the
    distribution's entry points from pyproject.toml. Written by hand into a folder put first
    on PYTHONPATH, so the test leaves the shared venv alone and takes seconds."""
    project = tomllib.loads((repo / "pyproject.toml").read_text())["project"]
    info = site / f"decoding_repro-{project['version']}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: decoding_repro\nVersion: {project['version']}\n")
    lines = []
    for group, eps in project["entry-points"].items():
        lines += [f"[{group}]", *(f"{k} = {v}" for k, v in eps.items()), ""]
    (info / "entry_points.txt").write_text("\n".join(lines))


def tiny_model(folder: Path, tok) -> None:
    """A tiny random LLaMA with the embedded model's tokenizer (so MT-Bench prompts encode)."""
    from common.assets.models import tiny_llama

    model = tiny_llama(seed=0, layers=2, vocab=len(tok), scale=10.0)
    model.config.max_position_embeddings = 512
    model.save_pretrained(folder)
    tok.save_pretrained(folder)


def add_profile(repo: Path, model: Path) -> None:
    """Steps 4-5: the variant's options (decoder_config) and a cross group that runs it, in a
    profile of its own (the smoke profile with the tiny model)."""
    path = repo / "config" / "config.yaml"
    cfg = yaml.safe_load(path.read_text())
    cfg["decoder_config"]["tiny_greedy@cap8"] = {"cap": 8}
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    p = yaml.safe_load((repo / "config" / "profiles" / "smoke.yaml").read_text())
    p.update(results_root="recipe_results", model=str(model))
    p["cross"] = {"dataset": "mt-bench", "n": 2, "max_new_tokens": 16, "max_prompt_tokens": 400,
                  "groups": {"tiny": ["vanilla", "tiny_greedy", "tiny_greedy@cap8"]}}
    p["replace"] = [*p.get("replace", []), "cross"]  # its own cross section, none of the joined runs smoke inherits
    (repo / "config" / "profiles" / "recipe.yaml").write_text(yaml.safe_dump(p, sort_keys=False))


def snakemake(repo: Path, env: dict, *args: str, target: str = "cross_table") -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "snakemake", "--nolock", *args, target,
                           "--config", "profile=recipe", "rerun=true"],
                          cwd=repo, env=env, capture_output=True, text=True, timeout=900)


@pytest.mark.dag
@pytest.mark.model
def test_new_method_reaches_cross_table(tmp_path, embedded):
    repo, site = tmp_path / "repo", tmp_path / "site"
    copy_tree(repo)
    (repo / "tinymethod").mkdir()
    (repo / "tinymethod" / "__init__.py").write_text("")
    (repo / "tinymethod" / "decoding.py").write_text(METHOD)
    tiny_model(tmp_path / "tiny-llama", embedded[1])
    add_profile(repo, tmp_path / "tiny-llama")
    # The copy's packages (and the published entry points) come before the venv's editable install.
    env = {**os.environ, "PYTHONPATH": f"{repo}{os.pathsep}{site}", "HF_HUB_OFFLINE": "1",
           "HF_DATASETS_OFFLINE": "1", "OMP_NUM_THREADS": "1"}

    # Without the entry point the plan stops at the config check, in one line.
    r = snakemake(repo, env, "-n")
    errors = [l for l in (r.stdout + r.stderr).splitlines() if l.startswith("error:")]
    assert r.returncode == 2 and len(errors) == 1 and "unknown decoder 'tiny_greedy'" in errors[0], r.stderr[-2000:]

    add_entry_point(repo, 'tiny_greedy = "tinymethod.decoding:TinyGreedy"')
    # With the entry point but before the reinstall the plan passes and the benchmark stops: the
    # registry reads the installed distribution's entry points, which do not list it yet.
    r = snakemake(repo, env, "-j1", target="recipe_results/cross/raw/bench_tiny.jsonl")
    log = repo / ".cache" / "logs" / "recipe" / "bench_cross_tiny.log"
    assert r.returncode != 0 and "unknown decoder 'tiny_greedy'" in log.read_text(), r.stderr[-2000:]
    reinstall(repo, site)
    r = snakemake(repo, env, "-j2")
    assert r.returncode == 0, textwrap.shorten(r.stdout[-3000:] + r.stderr[-3000:], 6000)

    results = repo / "recipe_results" / "cross"
    recs = [json.loads(l) for l in (results / "raw" / "bench_tiny.jsonl").read_text().splitlines()]
    assert {r["decoder"] for r in recs} == {"vanilla", "tiny_greedy", "tiny_greedy@cap8"}
    vanilla = {r["question_id"]: r["tokens"] for r in recs if r["decoder"] == "vanilla"}
    for r in recs:
        if r["decoder"] == "tiny_greedy":  # uncapped: greedy's tokens
            assert r["tokens"] == vanilla[r["question_id"]]
        if r["decoder"] == "tiny_greedy@cap8":  # the option reached the decoder
            assert r["new_tokens"] <= 8 and r["tokens"] == vanilla[r["question_id"]][:r["new_tokens"]]
    md = (results / "tables" / "cross.table.md").read_text()
    assert "| tiny_greedy " in md and "| tiny_greedy@cap8 " in md, md
    assert (results / "notebooks" / "cross.table.ipynb").is_file()
