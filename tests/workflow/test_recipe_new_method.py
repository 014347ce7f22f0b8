"""README Recipe 2, followed step by step: a new decoding method reaches ``cross.table``.

In a copy of the workflow (code, rules, config, notebooks), the method is added as the README
says: step 1's module is the proposer ``docs/core.md`` gives ("The smallest proposer"), run as
written; step 2's entry point is the README's own line, its package added to
``packages.find``; step 3's reinstall publishes the entry points (the equivalent of
``pip install -e .``, kept out of the shared venv); step 4 puts a variant into ``decoder_config``
and a group ``mine`` into ``config/profiles/smoke.yaml``; step 6 runs the README's own smoke
commands, so the record lands at the smoke profile's path. What a test must change: the smoke
profile decodes a tiny random LLaMA and its cross section holds only ``mine`` (no joined runs).
Before the entry point exists the plan must stop with one ``error:`` line, and before the
reinstall the benchmark must stop on the unknown decoder: neither step can be skipped.

The two rules a proposer's author can miss are tested without the workflow: a ``TreeDecoder``
whose ``options()`` drops the loop's own stops with one clear error, and the example keeps its
proposals within ``state.remaining - 1``.

Cost: one tiny-model benchmark (2 prompts x 16 tokens), the cost curve on the tiny model and one
notebook render; about a minute on 2 cores.
"""
import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path

import pytest
import torch
import yaml

ROOT = Path(__file__).resolve().parents[2]
# What the workflow reads at plan and run time; results/ and .cache/ stay behind (the copy
# writes its own under results_root).
TREE_DIRS = ["common", "ppd_pipelined", "bild", "prompt_decoding", "firp", "rules", "config", "notebooks"]
TREE_FILES = ["Snakefile", "pyproject.toml", "env.yml"]



def docs_example() -> str:
    """The code block of docs/core.md's "The smallest proposer" section."""
    text = (ROOT / "docs" / "core.md").read_text().split("## The smallest proposer", 1)[1]
    return re.search(r"```python\n(.*?)```", text, re.S).group(1)


def readme_recipe() -> str:
    """README's Recipe 2, its whitespace runs as single spaces (commands wrap across lines)."""
    text = (ROOT / "README.md").read_text().split("## Recipe 2", 1)[1].split("\n## ", 1)[0]
    return " ".join(text.split())


def copy_tree(dst: Path) -> None:
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for d in TREE_DIRS:
        shutil.copytree(ROOT / d, dst / d, ignore=ignore)
    for f in TREE_FILES:
        shutil.copy2(ROOT / f, dst / f)


def add_entry_point(repo: Path, line: str, package: str) -> None:
    """Step 2: the entry point, under the decoders' group of pyproject.toml, and the new
    top-level package in ``packages.find``."""
    text = (repo / "pyproject.toml").read_text()
    head = '[project.entry-points."decoding_repro.decoders"]\n'
    include = '[tool.setuptools.packages.find]\ninclude = ['
    assert head in text and include in text
    text = text.replace(head, head + line + "\n").replace(include, f'{include}"{package}*", ')
    (repo / "pyproject.toml").write_text(text)


def reinstall(repo: Path, site: Path) -> None:
    """Step 3, what ``pip install -e .`` (tools/setup.sh) does for the registry: publish the
    distribution's entry points from pyproject.toml, after setuptools' own package discovery
    finds every package they name. Written by hand into a folder put first on PYTHONPATH, so
    the test leaves the shared venv alone and takes seconds."""
    from setuptools import find_packages

    pyproject = tomllib.loads((repo / "pyproject.toml").read_text())
    project = pyproject["project"]
    found = set(find_packages(repo, include=pyproject["tool"]["setuptools"]["packages"]["find"]["include"]))
    for eps in project["entry-points"].values():
        for target in eps.values():
            assert target.split(":")[0].split(".")[0] in found, f"{target}: its package is not in packages.find"
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


def add_to_config(repo: Path, model: Path) -> None:
    """Step 4: the variant's options (decoder_config) and the group ``mine`` in the smoke
    profile. The test's two changes to that profile: the tiny model, and ``mine`` as its only
    cross group (its own cross section, none of the joined runs smoke inherits)."""
    path = repo / "config" / "config.yaml"
    cfg = yaml.safe_load(path.read_text())
    cfg["decoder_config"]["my_method@d1"] = {"depth": 1}
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    path = repo / "config" / "profiles" / "smoke.yaml"
    p = yaml.safe_load(path.read_text())
    p["model"] = str(model)
    inherited = yaml.safe_load((repo / "config" / "profiles" / "embedded.yaml").read_text())["cross"]
    p["cross"] = {**{k: v for k, v in {**inherited, **p["cross"]}.items() if k not in ("groups", "joins")},
                  "groups": {"mine": ["vanilla", "my_method", "my_method@d1"]}}
    p["replace"] = [*p.get("replace", []), "cross"]
    path.write_text(yaml.safe_dump(p, sort_keys=False))


def step6(recipe: str) -> tuple[list[str], list[str]]:
    """README step 6's smoke commands: (benchmark, render) as argument lists."""
    bench = re.search(r"`\.venv/bin/snakemake (-j2 \.cache/smoke/\S+ --config profile=smoke rerun=true)`", recipe)
    render = re.search(r"`\.venv/bin/snakemake (-j1 -f cross_table)` \(same `--config`\)", recipe)
    assert bench and render, "README step 6 names the smoke profile's benchmark and render commands"
    config = bench.group(1).split(" --config ")[1].split()
    return bench.group(1).split(), [*render.group(1).split(), "--config", *config]


def snakemake(repo: Path, env: dict, args: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "snakemake", "--nolock", *args],
                          cwd=repo, env=env, capture_output=True, text=True, timeout=900)


@pytest.mark.dag
@pytest.mark.model
def test_new_method_reaches_cross_table(tmp_path, embedded):
    repo, site = tmp_path / "repo", tmp_path / "site"
    recipe = readme_recipe()
    module = re.search(r"e\.g\. `(\w+)/decoding\.py`", recipe).group(1)
    entry_point = re.search(r'`(my_method = "\w+\.decoding:\w+")`', recipe).group(1)
    bench, render = step6(recipe)
    copy_tree(repo)
    (repo / module).mkdir()
    (repo / module / "__init__.py").write_text("")
    (repo / module / "decoding.py").write_text(docs_example())
    tiny_model(tmp_path / "tiny-llama", embedded[1])
    add_to_config(repo, tmp_path / "tiny-llama")
    # The copy's packages (and the published entry points) come before the venv's editable install.
    env = {**os.environ, "PYTHONPATH": f"{repo}{os.pathsep}{site}", "HF_HUB_OFFLINE": "1",
           "HF_DATASETS_OFFLINE": "1", "OMP_NUM_THREADS": "1"}

    # Without the entry point the plan stops at the config check, in one line.
    r = snakemake(repo, env, ["-n", *bench])
    errors = [l for l in (r.stdout + r.stderr).splitlines() if l.startswith("error:")]
    assert r.returncode == 2 and len(errors) == 1 and "unknown decoder 'my_method'" in errors[0], r.stderr[-2000:]

    add_entry_point(repo, entry_point, module)
    # With the entry point but before the reinstall the plan passes and the benchmark stops: the
    # registry reads the installed distribution's entry points, which do not list it yet.
    r = snakemake(repo, env, bench)
    log = repo / ".cache" / "logs" / "smoke" / "bench_cross_mine.log"
    assert r.returncode != 0 and "unknown decoder 'my_method'" in log.read_text(), r.stderr[-2000:]
    reinstall(repo, site)
    for args in (bench, render):
        r = snakemake(repo, env, args)
        assert r.returncode == 0, textwrap.shorten(r.stdout[-3000:] + r.stderr[-3000:], 6000)

    results = repo / ".cache" / "smoke" / "results" / "cross"   # the smoke profile's results_root
    recs = [json.loads(l) for l in (results / "raw" / "bench_mine.jsonl").read_text().splitlines()]
    assert {r["decoder"] for r in recs} == {"vanilla", "my_method", "my_method@d1"}
    vanilla = {r["question_id"]: r["tokens"] for r in recs if r["decoder"] == "vanilla"}
    for r in recs:
        assert r["tokens"] == vanilla[r["question_id"]]           # verified by the tree loop: greedy's
        if r["decoder"] == "my_method@d1":                        # the option reached the proposer
            assert max(r["extra"]["proposed"]) == 1
    md = (results / "tables" / "cross.table.md").read_text()
    assert "| my_method " in md and "| my_method@d1 " in md, md
    assert (results / "notebooks" / "cross.table.ipynb").is_file()


def example_module():
    """docs/core.md's example, imported as a module of its own."""
    import types

    mod = types.ModuleType("docs_smallest_proposer")
    exec(compile(docs_example(), "docs/core.md", "exec"), mod.__dict__)
    return mod


def test_the_docs_example_decodes_greedy_within_the_budget():
    from common.assets.models import tiny_llama
    from common.decoders import get_decoder

    model, ids = tiny_llama(seed=0, scale=10.0), torch.tensor([[1, 5, 9, 5, 9]])
    mod = example_module()
    for n in (1, 2, 7):
        out = mod.MyMethod(model, depth=3).generate(ids, n)
        assert out.tokens == get_decoder("vanilla", model).generate(ids, n).tokens
        st = out.stats
        for i in range(1, st["steps"]):   # before step i, ``remaining`` tokens were still allowed
            assert st["proposed"][i] <= n - sum(st["accept_lengths"][:i]) - 1
        assert len(st["propose_s"]) == st["steps"]


def test_a_tree_decoder_without_the_loop_options_is_one_clear_error():
    from common.assets.models import tiny_llama
    from common.errors import UserError

    mod = example_module()

    class Forgot(mod.MyMethod):
        name = "forgot"

        @classmethod
        def options(cls):
            return {"depth": 3}   # super().options() not merged

    with pytest.raises(UserError) as e:
        Forgot(tiny_llama(seed=0))
    msg = str(e.value)
    assert "decoder 'forgot'" in msg and "Forgot" in msg and "super().options()" in msg
    assert all(k in msg for k in ("temperature", "seed", "acceptance")) and "lazy_head" not in msg and "\n" not in msg
    mod.MyMethod(tiny_llama(seed=0))   # the example merges them
