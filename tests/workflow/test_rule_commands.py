"""The commands the rules share, written once in common.workflow.commands: the teacher cache's
(three rules) and the small answer sets' (three rules, through ``common.training.corpus
answers``) parse as their entry points read them. Each entry point runs in-process up to the
model load, which raises here: everything before it (the flags, the cheap checks) has passed."""
import shlex
from types import SimpleNamespace

import pytest

from common.workflow.commands import answer_set_command, corpus_command, corpus_flags, teacher_command


class Loaded(Exception):
    """Raised where the entry point would load the model: its arguments were accepted."""


def argv(template: str, tmp_path, **params) -> list[str]:
    """``template`` filled as Snakemake fills it, split, from the module name on; the log
    redirection left out."""
    ns = dict(params=SimpleNamespace(env="", py="python", m="smollm2-135m-instruct", dev="cpu", t=1, **params),
              output=SimpleNamespace(cache=str(tmp_path / "teacher.pt"), stats=str(tmp_path / "stats.json"),
                                     corpus=str(tmp_path / "corpus.pt"), seqcorpus=str(tmp_path / "seq.pt")),
              log=str(tmp_path / "x.log"))
    words = shlex.split(template.format(**ns).split(">")[0])
    return words[words.index("-m") + 1:]


def test_the_teacher_command_parses_as_the_teacher_reads_it(tmp_path, monkeypatch):
    from common.training import teacher

    seen = {}

    def load(name, device):
        seen.update(name=name, device=device)
        raise Loaded
    monkeypatch.setattr(teacher, "load_model", load)
    words = argv(teacher_command(), tmp_path, flags=f"--corpus-dir {tmp_path} --pass-dtype none --topk 4")
    assert words[0] == "common.training.teacher"
    with pytest.raises(Loaded):
        teacher._main(words[1:])
    assert seen == {"name": "smollm2-135m-instruct", "device": "cpu"}


@pytest.mark.parametrize("kw, want", [
    ({}, {"n_prompts": 32, "max_new_tokens": 128, "skip": 0, "max_prompt_tokens": None}),
    ({"skip": "{params.c[prompts]}", "max_prompt_tokens": "{params.s[max_prompt_tokens]}"},
     {"n_prompts": 32, "max_new_tokens": 128, "skip": 32, "max_prompt_tokens": 96}),
])
def test_the_answer_set_command_parses_as_the_corpus_reads_it(tmp_path, monkeypatch, kw, want):
    from common.assets import models
    from common.training import corpus

    def load(*a, **k):
        raise Loaded
    monkeypatch.setattr(models, "load_model", load)
    seen = {}
    monkeypatch.setattr(corpus, "cached_set", lambda path, **k: seen.update(path=path, **k))
    words = argv(answer_set_command("{output.corpus}", "{params.c[prompts]}", **kw), tmp_path,
                 c={"prompts": 32, "answer_tokens": 128}, s={"max_prompt_tokens": 96})
    assert words[:2] == ["common.training.corpus", "answers"]
    with pytest.raises(Loaded):
        corpus._main(words[1:])
    assert seen == {"path": tmp_path / "corpus.pt", **want}


def test_a_chained_answer_set_command_leaves_the_log_to_its_rule():
    one = answer_set_command("{output}", "{params.c[prompts]}", log=False)
    assert "{log}" not in one and answer_set_command("{output}", "3").endswith(" > {log} 2>&1")


@pytest.mark.parametrize("profile, rule", [("embedded", "corpus_shards"), ("embedded", "corpus_turns"),
                                           ("smoke", "corpus_turns")])
def test_the_corpus_command_parses_as_the_builder_reads_it(tmp_path, monkeypatch, profile, rule):
    """Each sharded corpus's recipe reaches the builder whole: its dataset and answer caps too."""
    from common.assets import models
    from common.config import load_profile
    from common.training import corpus

    recipe = load_profile(profile=profile).raw["components"][rule]

    def load(name, **kw):
        raise Loaded
    monkeypatch.setattr(models, "load_model", load)
    words = argv(corpus_command(), tmp_path, flags=corpus_flags(recipe), out=str(tmp_path / "c"))
    assert words[0] == "common.training.corpus"
    parsed = dict(zip(words[1::2], words[2::2]))
    assert parsed.get("--dataset") == recipe.get("dataset")
    for key in ("tokens", "heldout", "shard_prompts", "answer_tokens", "max_prompt_tokens", "batch_size"):
        assert int(parsed["--" + key.replace("_", "-")]) == recipe[key], key
    if "heldout_answer_tokens" in recipe:
        assert int(parsed["--heldout-answer-tokens"]) == recipe["heldout_answer_tokens"]
    with pytest.raises(Loaded):
        corpus._main(words[1:])
