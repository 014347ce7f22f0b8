# Helpers shared by the rule files (named functions, no lambdas in rules).
import json
import os
from pathlib import Path

from common.config import bench_decoders, group_config, labels_config, rule_resources as _rule_resources
from common.assets.models import MODELS, checkpoint_dir


def artifact_inputs(aid):
    """Raw records artifact ``aid`` reads (common.config.artifact_inputs: the notebooks read the same list)."""
    return _inputs(P, aid, ARTIFACTS)


def artifact_outputs(aid):
    """Files artifact ``aid`` writes under the profile's results root, executed notebook first."""
    return _outputs(P, aid, ARTIFACTS)


def pending():
    """Artifacts registered with ``pending:`` (their rules and notebook exist, their raw
    records are not committed yet): built only by a rerun."""
    return [aid for aid, spec in ARTIFACTS.items() if spec.get("pending")]


def all_targets():
    """The final target list: every registered artifact of the active profile (pending ones
    only when rerunning, since only a rerun can make their records)."""
    return [f for aid in ARTIFACTS if RERUN or aid not in pending() for f in artifact_outputs(aid)]


def check_raw_records():
    """Without rerun, end with one error line when a declared raw record is missing; name the
    pending artifacts `all` leaves out."""
    if pending():
        print(f"note: pending artifacts (no committed raw records yet; built with --config rerun=true): "
              f"{', '.join(pending())}", file=sys.stderr)
    missing = sorted({f for aid in ARTIFACTS if aid not in pending() for f in artifact_inputs(aid)
                      if not os.path.isfile(f)})
    if missing:
        print(f"error: raw records missing for profile {P.name!r}: {', '.join(missing)} "
              "(add --config rerun=true to run the experiments that write them)", file=sys.stderr)
        sys.exit(2)


def resources_of(key):
    """Rule ``key``'s entry of the profile's ``resources`` (common.config.RuleResources); a
    missing entry ends the plan with one error line."""
    try:
        return _rule_resources(P, key)
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)


def rule_threads(key):
    """Threads of rule ``key``. An exclusive (timing) rule run with a core budget (local
    execution, -j N) takes all of it, so no other job shares the machine; on a cluster (no core
    budget, --jobs N) it asks for its configured threads and a node of its own."""
    spec = resources_of(key)
    if spec.exclusive and workflow.resource_settings.cores is not None:
        return workflow.cores
    return spec.threads


def rule_resources(key):
    """``resources:`` of rule ``key`` (mem_mb, runtime, cpus_per_task, gpu, --exclusive)."""
    return resources_of(key).snakemake()


# A profile with tiny stand-ins of its hub models (paper-tiny) writes them all in one job (rule stand_ins).
STAND_INS_DONE = f"{P.raw['model_root']}/stand_ins.json" if P.raw.get("stand_ins") else None


def model_files(name=None):
    """What model ``name`` (default: the profile's) needs on disk before it loads: the converted
    checkpoint of an embedded model; for a hub model nothing, or the profile's stand-ins."""
    spec = MODELS.get(name or P.model)
    if spec is not None and spec.package:
        return [str(checkpoint_dir(name or P.model) / "model.safetensors")]
    return [STAND_INS_DONE] if STAND_INS_DONE else []


def results_root_of(wildcards, output):
    """The results root, read back from an artifact's notebook path (<root>/<pkg>/notebooks/x)."""
    return str(Path(output.notebook).parents[2])


def group_decoders(wildcards):
    """Comma-separated decoders of one cross-benchmark group."""
    return ",".join(P.cross.groups[wildcards.group])


# Placeholders decoder options may name (config decoder_config) -> the trained component's file
# (what the rule waits for) and folder (what the decoder is given), under .cache/components/<profile>/.
COMPONENT_FILES = {"{medusa}": "medusa/heads.pt", "{eagle}": "eagle/head.pt", "{draft}": "draft/model/config.json",
                   "{prompt_tokens}": "prompt_tokens/main/prompts.pt", "{firp}": "firp_maps/main/maps.pt",
                   "{bild_small_aligned}": "bild_small_aligned/model/config.json",
                   "{rest_datastore}": "rest_datastore/datastore.json",
                   "{medusa_released}": "medusa_released/heads.pt",
                   "{prompt_tokens_released}": "prompt_tokens_released/prompts.pt"}
COMPONENT_DIRS = {"{medusa}": "medusa", "{eagle}": "eagle", "{draft}": "draft/model", "{prompt_tokens}": "prompt_tokens/main",
                  "{firp}": "firp_maps/main", "{bild_small_aligned}": "bild_small_aligned/model",
                  "{rest_datastore}": "rest_datastore", "{medusa_released}": "medusa_released",
                  "{prompt_tokens_released}": "prompt_tokens_released"}


def components_of(options):
    """The model plus every trained component some decoder options name."""
    text = json.dumps(options)
    comps = [f".cache/components/{P.name}/{f}" for key, f in COMPONENT_FILES.items() if key in text]
    return [*model_files(), *comps]


def with_components(options):
    """Decoder options as JSON, component placeholders replaced by their folders."""
    text = json.dumps(options)
    for key, folder in COMPONENT_DIRS.items():
        text = text.replace(key, f".cache/components/{P.name}/{folder}")
    return text


def datastore_folder(wildcards, output):
    """REST's datastore folder (rule rest_datastore), read back from its meta file's path."""
    return str(Path(output.meta).parent)


def datastore_flags(wildcards):
    """--n when the profile's components.rest_datastore caps the conversations (null: all)."""
    n = P.raw["components"].get("rest_datastore", {}).get("conversations")
    return "" if n is None else f"--n {n}"


def group_inputs(wildcards):
    """The model plus every trained component the group's decoders name."""
    return components_of(group_config(P, wildcards.group))


def group_decoder_config(wildcards):
    """The group's decoder options as JSON, component placeholders replaced by their folders."""
    return with_components(group_config(P, wildcards.group))


def _section_bench(section, wildcard, what, name):
    """A wildcards function of a paper section's benchmark rule: ``what`` applied to the decoder
    labels it runs on the dataset of ``wildcard`` (``bench/decoders_by_dataset`` may narrow
    them per dataset)."""
    def fn(wildcards):
        return what(bench_decoders(P.raw[section]["bench"], wildcards[wildcard]))
    fn.__name__ = f"{section}_bench_{name}"
    return fn


def section_bench_inputs(section, wildcard):
    """Input function: the model and the components those decoders name."""
    return _section_bench(section, wildcard, lambda ls: components_of(labels_config(P, ls)), "inputs")


def section_bench_decoders(section, wildcard):
    """Param function: the decoder labels, comma-separated."""
    return _section_bench(section, wildcard, ",".join, "decoders")


def section_bench_config(section, wildcard):
    """Param function: the decoders' options as JSON (component placeholders replaced)."""
    return _section_bench(section, wildcard, lambda ls: with_components(labels_config(P, ls)), "config")


def section_bench_prompts(section, wildcard):
    """Param function: the prompts the section's benchmark runs on the dataset of ``wildcard``."""
    def fn(wildcards):
        return P.raw[section]["bench"]["datasets"][wildcards[wildcard]]
    fn.__name__ = f"{section}_bench_prompts"
    return fn


def parent_of_heads(wildcards, output):
    """The Medusa output folder, read from its heads file."""
    return str(Path(output.heads).parent)


def parent_of_draft(wildcards, output):
    """The draft's output folder (the saved model sits in its model/ subfolder)."""
    return str(Path(output.model).parent.parent)


def stopping_flags(c):
    """The early-stopping flags of a component's config (common.training.loop.Stopping)."""
    flags = f"--max-epochs {c['max_epochs']} --eval-every {c['eval_every']} --patience {c['patience']}" \
            f" --min-delta {c['min_delta']}"
    flags += f" --wall-budget {c['wall_budget_s']}" if c.get("wall_budget_s") else ""
    # a step cap also sets the length of the learning-rate schedule (common.training.loop)
    return flags + (f" --max-steps {c['max_steps']}" if c.get("max_steps") else "")


def teacher_flags(c, t, heldout=None):
    """What the teacher cache reads and how it was made (it is rebuilt if these change): the
    sharded corpus (``t["source"] == "corpus"``: its shards train, its held-out shard
    evaluates), ShareGPT text evaluated on that held-out shard (``t["heldout"] == "corpus"``),
    or ShareGPT text with the held-out greedy corpus cache ``heldout`` (default: the
    components' ``corpus.pt``)."""
    if t["source"] == "corpus":
        tokens = "" if t["corpus_tokens"] is None else f" --corpus-tokens {t['corpus_tokens']}"
        return (f"--corpus-dir {ROOT}/corpus/{P.name}{tokens} --pass-dtype {t['pass_dtype']}"
                f" --max-prompt-tokens {t['max_prompt_tokens']} --topk {t['topk']}")
    if t.get("heldout") == "corpus":  # ShareGPT text evaluated on the corpus's held-out shard
        return (f"--corpus-dir {ROOT}/corpus/{P.name} --text-sequences {t['sequences']}"
                f" --max-len {t['max_len']} --max-prompt-tokens {t['max_prompt_tokens']} --topk {t['topk']}")
    return (f"--heldout-corpus {heldout or f'.cache/components/{P.name}/corpus.pt'}"
            f" --heldout-prompts {c['prompts']} --answer-tokens {c['answer_tokens']} --sequences {t['sequences']}"
            f" --max-len {t['max_len']} --max-prompt-tokens {t['max_prompt_tokens']} --topk {t['topk']}")


def bild_small_teacher(wildcards):
    """``(cache, flags)`` of a BiLD small model's training (:func:`bild_teacher` of its variant)."""
    return bild_teacher(wildcards.variant)


def bild_teacher(variant):
    """``(cache, flags)`` of a BiLD small model of ``variant``: the reference text for the
    unaligned one (rule teacher_text), the corpus's answers as text for the aligned one where the
    profile sets components.teacher_answers (rule teacher_answers), the shared cache otherwise."""
    if variant == "aligned" and BILDR.answers_as_text:
        return f".cache/components/{P.name}/teacher_answers.pt", teacher_flags(C["corpus"], TEACHER_ANSWERS)
    if BILDR.LABELS[variant] == "text":
        return f".cache/components/{P.name}/teacher_text.pt", teacher_flags(C["corpus"], TEACHER_TEXT)
    return f".cache/components/{P.name}/teacher.pt", teacher_flags(C["corpus"], C["teacher"])


def corpus_inputs(wildcards):
    """The converted model, where the corpus is still to be made. The corpus is committed
    (results/corpus/), and a fresh clone converts the model after its checkout: a job that makes
    an input replans its consumers whatever ancient() says ("updated by another job"), so a plan
    that converts the model would replan hours of generation. A corpus of another model or recipe
    is refused by the shards' manifest (common.training.corpus), not by file times; a forced rerun in a
    clone without the converted model is one error line naming rule prepare."""
    return [] if Path(f"{ROOT}/corpus/{P.name}/stats.json").is_file() else ancient(model_files())


def teacher_inputs(t):
    """The files a teacher cache is built from (:func:`teacher_flags`)."""
    if t["source"] == "corpus" or t.get("heldout") == "corpus":
        return {"corpus": f"{ROOT}/corpus/{P.name}/stats.json"}
    return {"corpus": f".cache/components/{P.name}/corpus.pt"}


def seq_inputs():
    """The in-forward trainers' data files of the profile's model (:func:`seq_data_flags`)."""
    if C["seqcorpus"]["source"] == "corpus":
        return {"shards": f"{ROOT}/corpus/{P.name}/stats.json"}
    return {"corpus": f".cache/components/{P.name}/corpus.pt", "seqcorpus": f".cache/components/{P.name}/seqcorpus.pt"}


def heldout_inputs():
    """The held-out greedy answers analyses measure on, those the in-forward trainers' curves
    measured (:func:`seq_inputs` without the training set): the sharded corpus's held-out
    shard, or the greedy corpus cache."""
    return {k: v for k, v in seq_inputs().items() if k != "seqcorpus"}


def heldout_flags(wildcards, input):
    """``firp.analysis`` flags for :func:`heldout_inputs`."""
    if hasattr(input, "shards"):
        return f"--corpus-dir {Path(input.shards).parent}"
    c = C["corpus"]
    return f"--heldout-corpus {input.corpus} --heldout-prompts {c['prompts']} --answer-tokens {c['answer_tokens']}"


def seq_data_flags(wildcards, input):
    """``common.training.seqtrain`` flags: the greedy corpus caches among the inputs (a variant with its own
    base model, or source greedy), else the sharded corpus."""
    c, s = C["corpus"], C["seqcorpus"]
    rest = (f"--prompts {s['prompts']} --max-prompt-tokens {s['max_prompt_tokens']}"
            f" --heldout-prompts {c['prompts']} --answer-tokens {c['answer_tokens']}")
    if hasattr(input, "seqcorpus"):
        return f"--corpus {input.seqcorpus} --heldout-corpus {input.corpus} {rest}"
    tokens = "" if s.get("corpus_tokens") is None else f" --corpus-tokens {s['corpus_tokens']}"
    return f"--corpus-dir {Path(input.shards).parent}{tokens} {rest}"


def parent_of_ckpt(wildcards, output):
    """A trainer's output folder, read from its checkpoint path."""
    return str(Path(output.ckpt).parent)


def parent_of_maps(wildcards, input):
    """The FIRP maps folder, read from its checkpoint path."""
    return str(Path(input.maps).parent)


def variant_config(section, variant):
    """A paper section's training settings with one variant's overrides (``variants:`` in config)."""
    return {**P.raw[section]["train"], **P.raw[section]["variants"][variant]}


def pd_train_config(wildcards):
    return variant_config("prompt_decoding", wildcards.pdv)


def pd_stopping_flags(wildcards):
    return stopping_flags(pd_train_config(wildcards))


def pd_base(variant):
    """The model a prompt-token variant trains on (its ``base``): the profile's model by default,
    the distilled draft (rule distill_draft) for ``draft``, else the model name or hub id given."""
    base = variant_config("prompt_decoding", variant).get("base")
    if base is None:
        return P.model
    return f"{COMP}/draft/model" if base == "draft" else base


def pd_base_files(variant):
    """What a variant's base model needs on disk before it loads (none for a hub model)."""
    base = variant_config("prompt_decoding", variant).get("base")
    return [f"{COMP}/draft/model/config.json"] if base == "draft" else model_files(base)


def pd_train_model(wildcards):
    return pd_base(wildcards.pdv)


def pd_base_corpora_inputs(wildcards):
    return pd_base_files(wildcards.pdv)


def pd_train_inputs(wildcards):
    """The corpora (for a variant with a ``base``, that model's own greedy answers, rule
    pd_base_corpora, and the model itself), and the finished training a variant with
    ``init_from`` starts from."""
    if pd_train_config(wildcards).get("base"):
        own = f"{COMP}/prompt_tokens/{wildcards.pdv}"
        ins = {"corpus": f"{own}/corpus.pt", "seqcorpus": f"{own}/seqcorpus.pt", "base": pd_base_files(wildcards.pdv)}
    else:
        ins = seq_inputs()
    src = pd_train_config(wildcards).get("init_from")
    if src:
        ins["init"] = f"{COMP}/prompt_tokens/{src}/prompts.pt"
    return ins


def pd_variant_flags(wildcards):
    """A variant's appendix options (prompt_decoding.train's flags), only where they differ from
    the paper's method."""
    c = pd_train_config(wildcards)
    flags = [] if c.get("distill", True) else ["--no-distill"]
    if c.get("aggregation", "average") != "average":
        flags.append(f"--aggregation {c['aggregation']}")
    if c.get("head"):
        flags.append("--head")
    if c.get("prefix"):
        flags.append(f"--prefix {c['prefix']}")
    if c.get("exits", 1) != 1:
        flags.append(f"--exits {c['exits']}")
    if c.get("init_from"):
        flags.append(f"--init-from {pd_train_inputs(wildcards)['init']}")
    return " ".join(flags)


PD_SPEC_VARIANT = "draft"  # pd.spec's prompt tokens: the variant whose base is the draft


def pd_spec_options():
    """pd.spec's benchmark: ``{label: options}``, ``speculative@g<gamma>`` and
    ``pd_speculative@g<gamma>`` (config prompt_decoding.spec), both drafting with the base of
    variant ``draft`` (pd_speculative with that variant's prompt tokens); vanilla has none."""
    sec = P.raw["prompt_decoding"]
    if not (sec["variants"].get(PD_SPEC_VARIANT) or {}).get("base"):
        print(f"error: config profiles/{P.name}/prompt_decoding/variants: pd.spec needs a variant "
              f"{PD_SPEC_VARIANT!r} with a base (its draft), e.g. {PD_SPEC_VARIANT}: {{base: draft}}", file=sys.stderr)
        sys.exit(2)
    spec, draft = sec["spec"], pd_base(PD_SPEC_VARIANT)
    opts = {f"speculative@g{g}": {"draft": draft, "gamma": g} for g in spec["gamma"]}
    opts.update({f"pd_speculative@g{g}": {"draft": draft, "prompt_tokens": f"{COMP}/prompt_tokens/{PD_SPEC_VARIANT}",
                                          "gamma": g, "tree": spec["tree"]} for g in spec["pd_gamma"]})
    return opts


def pd_spec_inputs():
    """The model, the draft and the draft's prompt tokens."""
    return [*model_files(), *pd_base_files(PD_SPEC_VARIANT), f"{COMP}/prompt_tokens/{PD_SPEC_VARIANT}/prompts.pt"]


def pd_spec_decoders():
    return ",".join(["vanilla", *pd_spec_options()])


def pd_spec_config():
    return json.dumps(pd_spec_options())


def pd_spec_prompts(wildcards):
    return P.raw["prompt_decoding"]["spec"]["datasets"][wildcards.pdspec]


def firp_train_config(wildcards):
    return variant_config("firp", wildcards.firpv)


def firp_stopping_flags(wildcards):
    return stopping_flags(firp_train_config(wildcards))


def firp_layer_flags(c):
    """``--layers a,b,c`` when a FIRP training config ``c`` fixes them (none: the paper's
    fractions of depth), and ``--mask-earlier`` for a masked one (Figure 7)."""
    flags = [f"--layers {','.join(map(str, c['layers']))}"] if c.get("layers") else []
    return " ".join(flags + (["--mask-earlier"] if c.get("mask_earlier") else []))


def firp_layer_flag(wildcards):
    return firp_layer_flags(firp_train_config(wildcards))


def firp_input_folder(key):
    """Param function: the folder of the rule's input ``key`` (a trained component's checkpoint)."""
    def fn(wildcards, input):
        return str(Path(input[key]).parent)
    fn.__name__ = f"firp_{key}_folder"
    return fn


def head_train_flags(h):
    """``common.components.medusa_heads`` trainer flags of a head recipe (components.medusa, or a section's override of it)."""
    share = " --share-lm-head" if h.get("share_lm_head") else ""
    return (f"--heads {h['heads']}{share} --labels {h['labels']} --train-vocab {h['train_vocab']} {stopping_flags(h)}"
            f" --lr {h['lr']} --batch-size {h['batch_size']}")


def firp_medusa_flags(wildcards, input):
    """``--medusa`` once per Medusa component the Figure 3 scoring reads (shared head; own heads)."""
    return " ".join(f"--medusa {Path(input[k]).parent}" for k in ("medusa", "medusa_own") if k in input.keys())


def firp_exit_flags():
    """The early-exit heads' steps and input layers: the main maps' (``--steps-k K [--layers ...]``)."""
    c = variant_config("firp", "main")
    return f"--steps-k {c['steps_k']}" + (f" --layers {','.join(map(str, c['layers']))}" if c.get("layers") else "")


def bild_exit_inputs(wildcards):
    """An exit training's model and, when it is the profile's model, the shared teacher and
    held-out corpus caches (otherwise the trainer builds its own; BILD, BILDR: rules/bild.smk)."""
    shared = ({"teacher": BILDR.exit_teacher(wildcards)["teacher"], **teacher_inputs(C["teacher"])}
              if BILDR.exit_shares_teacher() else {})
    return {"model": model_files(BILD.early_exit.model), **shared}


def bild_exit_teacher_flags(wildcards):
    """The exit training's teacher flags: the shared cache's when it trains the profile's model,
    else ShareGPT text with its own held-out corpus cache (BILDR: rules/bild.smk)."""
    if BILDR.exit_shares_teacher():
        return teacher_flags(C["corpus"], C["teacher"])
    return teacher_flags(C["corpus"], {**C["teacher"], "source": "sharegpt"}, BILDR.exit_teacher(wildcards)["corpus"])


def bild_sweep_inputs(wildcards):
    """A BiLD sweep's large model and, in the embedded profile, the trained small model of the
    variant (BILD, BILDR: rules/bild.smk)."""
    small = [] if BILD.small_layers is None else [f".cache/components/{P.name}/bild_small_{wildcards.variant}/model/config.json"]
    return [*model_files(BILDR.large(wildcards)), *small]


def eagle_flags(c):
    """``common.components.eagle_head`` flags of the profile's recipe (components.eagle)."""
    flags = [stopping_flags(c), f"--lr {c['lr']} --batch-size {c['batch_size']}",
             f"--head-max-len {c['max_len']}", f"--noise {c['noise']}"]
    return " ".join(flags)


def parent_of_head(wildcards, output):
    """EAGLE's output folder, read from its head file."""
    return str(Path(output.head).parent)


def parent_of_prompts(wildcards, output):
    """The converted prompt tokens' folder, read from its checkpoint file."""
    return str(Path(output.prompts).parent)


def parent_of_stats(wildcards, output):
    """The corpus folder, read from its summary file."""
    return str(Path(output.stats).parent)
