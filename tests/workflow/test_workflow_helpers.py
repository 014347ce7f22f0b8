"""The workflow's helpers as modules: the shared benchmark command (common.workflow.commands), the
paper packages' rule arguments (prompt_decoding.workflow, firp.workflow, bild.workflow) and the
missing raw records' summary (common.workflow.artifacts), built from the embedded profile."""
import shlex
from types import SimpleNamespace

import pytest

from common.config import load_profile
from common.errors import UserError
from common.workflow.artifacts import missing_records
from common.workflow.commands import bench_command, section_bench_command, stopping_flags

PROFILE = load_profile(profile="embedded")
COMP = ".cache/components/embedded"


def filled(template: str, **params) -> list[str]:
    """A shell template as Snakemake fills it (``params``, ``wildcards``, ``input``), split into
    arguments, the redirection to the log left out."""
    ns = dict(params=SimpleNamespace(env="", py="python", decoders="vanilla,x@y", dcfg="{}", **params),
              wildcards=SimpleNamespace(ds="mt-bench"), input=SimpleNamespace(prompts="p.jsonl"),
              output="o.jsonl", log="o.log")
    return shlex.split(template.format(**ns).split(">")[0])[1:]  # from "-m" (env is empty)


@pytest.mark.parametrize("template, aa", [
    (section_bench_command("ds"), False),
    (section_bench_command("ds", aa=True), True),
    (bench_command("--prompts {input.prompts} --n {params.n}", "--max-new-tokens 8 --max-prompt-tokens {params.n}",
                   model="{params.n}", truncate="last"), False),
])
def test_the_bench_command_parses_as_the_harness_reads_it(template, aa):
    from common.harness.bench import parse_args

    argv = filled(template, p=PROFILE, n=3, b={"max_new_tokens": 16, "max_prompt_tokens": 64})
    assert argv[:2] == ["-m", "common.harness.bench"]
    args = parse_args(argv[2:])
    assert args.aa is aa and args.resume and args.profile == "embedded" and str(args.out) == "o.jsonl"
    assert args.decoders == "vanilla,x@y" and args.n == 3 and args.dtype == PROFILE.dtype
    assert (args.dataset, args.prompts) in {("mt-bench", None), (None, "p.jsonl")}


def test_stopping_flags_name_the_optional_caps_only_when_set():
    c = {"max_epochs": 2, "eval_every": 10, "patience": 3, "min_delta": 0.0}
    assert "--wall-budget" not in stopping_flags(c) and "--max-steps" not in stopping_flags(c)
    assert stopping_flags({**c, "wall_budget_s": 60, "max_steps": 5}).endswith("--wall-budget 60 --max-steps 5")


def test_missing_records_names_a_few_and_counts_them(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # short relative paths, as the workflow's are
    present = tmp_path / "here.jsonl"
    present.write_text("{}\n")
    absent = [f"raw/r{i}.jsonl" for i in range(5)]
    assert missing_records([str(present)]) == ""
    text = missing_records([str(present), *absent])
    assert text.startswith(absent[0]) and text.endswith("and 2 more (5 of 6)") and str(present) not in text
    # long paths: fewer named, never none
    long = [f"{'x' * 120}/{i}.jsonl" for i in range(3)]
    assert missing_records(long).startswith(long[0] + " and 2 more")


# -- prompt decoding -------------------------------------------------------------------------------
def pd_params(section=None):
    from prompt_decoding.workflow import RuleParams

    files = lambda name=None: [f"model:{name or PROFILE.model}"]
    return RuleParams(section or PROFILE.raw["prompt_decoding"], PROFILE.model, COMP, files,
                      {"shards": "corpus/stats.json"}, PROFILE.name)


def test_prompt_decoding_variants_train_on_their_base_and_start_where_they_say():
    r, w = pd_params(), lambda v: SimpleNamespace(pdv=v)
    assert r.train_model(w("main")) == PROFILE.model and r.train_inputs(w("main")) == {"shards": "corpus/stats.json"}
    assert r.train_model(w("draft")) == f"{COMP}/draft/model"
    assert r.train_inputs(w("draft"))["base"] == [f"{COMP}/draft/model/config.json"]
    assert r.train_inputs(w("head2"))["init"] == f"{COMP}/prompt_tokens/main/prompts.pt"
    assert r.variant_flags(w("head2")) == f"--head --init-from {COMP}/prompt_tokens/main/prompts.pt"
    assert r.variant_flags(w("nokd")) == "--no-distill" and r.variant_flags(w("main")) == ""


def test_pd_spec_drafts_with_the_draft_variant_and_says_so_when_it_is_missing():
    r = pd_params()
    opts = r.spec_options()
    assert opts and all(o["draft"] == f"{COMP}/draft/model" for o in opts.values())
    assert r.spec_decoders().split(",")[0] == "vanilla" and r.spec_inputs()[-1].endswith("prompt_tokens/draft/prompts.pt")
    section = dict(PROFILE.raw["prompt_decoding"])
    section["variants"] = {k: v for k, v in section["variants"].items() if k != "draft"}
    with pytest.raises(UserError, match="pd.spec needs a variant 'draft' with a base"):
        pd_params(section).spec_options()


# -- FIRP ------------------------------------------------------------------------------------------
def test_firp_layer_flags_follow_the_variant():
    from firp.workflow import RuleParams

    r, w = RuleParams(PROFILE.raw["firp"]), lambda v: SimpleNamespace(firpv=v)
    assert r.layer_flags(w("k2l19m")) == "--layers 14,19 --mask-earlier"
    assert r.layer_flags(w("k1l5")) == "--layers 5"
    main = r.config("main")
    assert r.exit_flags().startswith(f"--steps-k {main['steps_k']}")
    assert r.stopping_flags(w("k1l5")).endswith("--wall-budget 2400 --max-steps 1500")


# -- BiLD ------------------------------------------------------------------------------------------
def bild_params(profile_model, answers_as_text=False):
    from bild.config import from_profile
    from bild.workflow import RuleParams

    flags = lambda c, t, heldout=None: f"{t['source']}|{heldout}"
    teachers = {"corpus": {}, "teacher": {"source": "corpus"}, "teacher_text": {"source": "sharegpt"},
                "teacher_answers": {"source": "answers"}}
    return RuleParams(from_profile(PROFILE), COMP, profile_model, answers_as_text=answers_as_text,
                      model_files=lambda name=None: [f"model:{name}"], teacher_flags=flags, teachers=teachers,
                      teacher_inputs={"corpus": "corpus/stats.json"})


@pytest.mark.parametrize("answers_as_text, aligned", [(False, "teacher"), (True, "teacher_answers")])
def test_bild_small_models_learn_from_their_variants_teacher(answers_as_text, aligned):
    r = bild_params(PROFILE.model, answers_as_text)
    assert r.teacher("unaligned") == (f"{COMP}/teacher_text.pt", "sharegpt|None")
    assert r.teacher("aligned")[0] == f"{COMP}/{aligned}.pt"


def test_bild_exit_training_shares_the_teacher_only_for_the_profiles_model():
    w = SimpleNamespace(exitloss="bild")
    from bild.config import from_profile

    shared = bild_params(from_profile(PROFILE).early_exit.model)  # the exit model is the profile's
    assert shared.exit_inputs(w) == {"model": [f"model:{shared.cfg.early_exit.model}"],
                                     "teacher": f"{COMP}/teacher.pt", "corpus": "corpus/stats.json"}
    assert shared.exit_teacher_flags(w) == "corpus|None"
    own = bild_params("another-model")
    assert set(own.exit_inputs(w)) == {"model"}
    assert own.exit_teacher_flags(w) == f"sharegpt|{COMP}/bild_exit_bild/corpus.pt"


def test_eagle3_variants_are_the_recipe_with_their_changes_each_a_component():
    from common.config import load_profile
    from common.errors import UserError
    from common.workflow.artifacts import COMPONENTS, component_names, corpus_folder, eagle3_recipes

    p = load_profile(profile="embedded")
    base, variants = p.raw["components"]["eagle3"], p.raw["components"]["eagle3_variants"]
    recipes = eagle3_recipes(p)
    assert list(recipes) == ["eagle3", *variants]
    for name, change in variants.items():
        assert recipes[name] == {**base, **change}   # everything else is eagle3's
    assert recipes["eagle3_fused_1m"]["ttt_steps"] == 1 and recipes["eagle3_1m"]["ttt_steps"] == base["ttt_steps"]
    assert component_names(p) == (*COMPONENTS, *variants)
    assert corpus_folder(p, recipes["eagle3"]["corpus"]) == "corpus/embedded-turns"
    assert corpus_folder(p, "shards") == "corpus/embedded"
    with pytest.raises(UserError, match="valid: shards, turns"):
        corpus_folder(p, "other")
    # a recipe without a corpus trains on the first turns' shards, as EAGLE-3 did before the larger corpus
    assert eagle3_recipes(load_profile(profile="paper"))["eagle3"]["corpus"] == "shards"
