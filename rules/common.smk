# Helpers shared by the rule files (named functions, no lambdas in rules).
import json
import os
from pathlib import Path

from common.assets.models import MODELS, checkpoint_dir
from common.config import RESULT_PLACEHOLDERS, bench_decoders, group_config, labels_config
from common.workflow.artifacts import eagle3_recipes, missing_records, sampling_parts
from common.workflow.commands import (answer_set_command, bench_command, eagle_flags, head_train_flags,
                                     sampling_flags, section_bench_command, stopping_flags, teacher_command)
from common.workflow.resources import rule_resources as _rule_resources


def artifact_inputs(aid):
    """Raw records artifact ``aid`` reads (common.workflow.artifacts.artifact_inputs: the notebooks read the same list)."""
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


def note_pending():
    """Without rerun, name the pending artifacts `all` leaves out."""
    if pending():
        print(f"note: pending artifacts (no committed raw records yet; built with --config rerun=true): "
              f"{', '.join(pending())}", file=sys.stderr)


def raw_records(aid):
    """Input of artifact ``aid``'s rule: its raw records. Without rerun no rule makes them, so
    a function, called only for the artifacts the targets need, ends the plan with one error
    line when some are missing (the first few and their count): the records of artifacts not
    built may be missing."""
    files = artifact_inputs(aid)
    if RERUN:
        return files

    def committed(wildcards):
        missing = missing_records(files)
        if missing:
            print(f"error: raw records missing for profile {P.name!r}, artifact {aid}: {missing} "
                  "(add --config rerun=true to run the experiments that write them)", file=sys.stderr)
            sys.exit(2)
        return files
    committed.__name__ = f"raw_records_{aid}"
    return committed


def or_exit(fn, *args):
    """``fn(*args)``, or the plan ends with one error line where it raises UserError."""
    try:
        return fn(*args)
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)


def resources_of(key):
    """Rule ``key``'s entry of the profile's ``resources`` (common.workflow.resources.RuleResources); a
    missing entry ends the plan with one error line."""
    return or_exit(_rule_resources, P, key)


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
COMPONENT_FILES = {"{medusa}": "medusa/heads.pt", "{eagle}": "eagle/head.pt", "{eagle3}": "eagle3/head.pt",
                   "{draft}": "draft/model/config.json",
                   "{prompt_tokens}": "prompt_tokens/main/prompts.pt", "{firp}": "firp_maps/main/maps.pt",
                   "{bild_small_aligned}": "bild_small_aligned/model/config.json",
                   "{rest_datastore}": "rest_datastore/datastore.json",
                   "{medusa_released}": "medusa_released/heads.pt",
                   "{prompt_tokens_released}": "prompt_tokens_released/prompts.pt"}
COMPONENT_DIRS = {"{medusa}": "medusa", "{eagle}": "eagle", "{eagle3}": "eagle3", "{draft}": "draft/model",
                  "{prompt_tokens}": "prompt_tokens/main",
                  "{firp}": "firp_maps/main", "{bild_small_aligned}": "bild_small_aligned/model",
                  "{rest_datastore}": "rest_datastore", "{medusa_released}": "medusa_released",
                  "{prompt_tokens_released}": "prompt_tokens_released"}
# EAGLE-3's ablation heads (components.eagle3_variants), each its own component
for _name in eagle3_recipes(P):
    COMPONENT_FILES.setdefault(f"{{{_name}}}", f"{_name}/head.pt")
    COMPONENT_DIRS.setdefault(f"{{{_name}}}", _name)


def components_of(options):
    """The model plus every trained component (and measured result, config.RESULT_PLACEHOLDERS)
    some decoder options name."""
    text = json.dumps(options)
    comps = [f".cache/components/{P.name}/{f}" for key, f in COMPONENT_FILES.items() if key in text]
    results = [f"{ROOT}/{f}" for name, f in RESULT_PLACEHOLDERS.items() if f"{{{name}}}" in text]
    return [*model_files(), *comps, *results]


def with_components(options):
    """Decoder options as JSON, component placeholders replaced by their folders, result
    placeholders by their files."""
    text = json.dumps(options)
    for key, folder in COMPONENT_DIRS.items():
        text = text.replace(key, f".cache/components/{P.name}/{folder}")
    for name, f in RESULT_PLACEHOLDERS.items():
        text = text.replace(f"{{{name}}}", f"{ROOT}/{f}")
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


def _section_bench(section, wildcard, what, name, key="bench"):
    """A wildcards function of a paper section's benchmark rule: ``what`` applied to the decoder
    labels it runs on the dataset of ``wildcard`` (``<key>/decoders_by_dataset`` may narrow
    them per dataset); ``key``: the section's benchmark entry (``bench``, or e.g. ``sampled``)."""
    def fn(wildcards):
        return what(bench_decoders(P.raw[section][key], wildcards[wildcard]))
    fn.__name__ = f"{section}_{key}_{name}"
    return fn


def section_bench_inputs(section, wildcard, key="bench"):
    """Input function: the model and the components those decoders name."""
    return _section_bench(section, wildcard, lambda ls: components_of(labels_config(P, ls)), "inputs", key)


def section_bench_decoders(section, wildcard, key="bench"):
    """Param function: the decoder labels, comma-separated."""
    return _section_bench(section, wildcard, ",".join, "decoders", key)


def section_bench_config(section, wildcard, key="bench"):
    """Param function: the decoders' options as JSON (component placeholders replaced)."""
    return _section_bench(section, wildcard, lambda ls: with_components(labels_config(P, ls)), "config", key)


def section_bench_prompts(section, wildcard, key="bench"):
    """Param function: the prompts the section's benchmark runs on the dataset of ``wildcard``."""
    def fn(wildcards):
        return P.raw[section][key]["datasets"][wildcards[wildcard]]
    fn.__name__ = f"{section}_{key}_prompts"
    return fn


def parent_of_heads(wildcards, output):
    """The Medusa output folder, read from its heads file."""
    return str(Path(output.heads).parent)


def parent_of_draft(wildcards, output):
    """The draft's output folder (the saved model sits in its model/ subfolder)."""
    return str(Path(output.model).parent.parent)


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


def corpus_inputs(folder):
    """The inputs of the corpus job writing ``folder`` (the converted model) where the corpus is
    still to be made; the corpus is committed (results/corpus/), and a fresh clone converts the
    model after its checkout: a job that makes an input replans its consumers whatever ancient()
    says ("updated by another job"), so a plan that converts the model would replan hours of
    generation. A corpus of another model or recipe is refused by the shards' manifest
    (common.training.corpus), not by file times; a forced rerun in a clone without the converted
    model is one error line naming rule prepare."""
    def inputs(wildcards):
        return [] if Path(f"{folder}/stats.json").is_file() else ancient(model_files())
    return inputs


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


def parent_of_head(wildcards, output):
    """EAGLE's output folder, read from its head file."""
    return str(Path(output.head).parent)


def parent_of_prompts(wildcards, output):
    """The converted prompt tokens' folder, read from its checkpoint file."""
    return str(Path(output.prompts).parent)


def corpus_of(wildcards, input):
    """The corpus folder a trainer reads, from its summary file (input ``corpus``)."""
    return str(Path(input.corpus).parent)


def parent_of_stats(wildcards, output):
    """The corpus folder, read from its summary file."""
    return str(Path(output.stats).parent)


def sampling_part_flags(wildcards):
    """tools/sampling_report.py's flags beyond --draws and --out for part ``wildcards.part`` of the
    profile's sampling_report section: the controls alone, or one decoder without them (and its
    two-sample run on the profile's model where ``real_model``; vanilla is that run's reference,
    drawn in every other part, with no row of its own)."""
    s = P.raw["sampling_report"]
    if wildcards.part == "controls":
        return "--controls-only"
    flags = f"--decoders {wildcards.part} --no-controls"
    if s["real_model"] and wildcards.part != "vanilla":
        flags += (f" --model {P.model} --real-draws {s['real_draws']} --prompts {s['prompts']}"
                  f" --device {P.device} --dtype {P.dtype}")
    return flags


def sampling_part_inputs(wildcards):
    """The profile's model where part ``wildcards.part`` loads it (a decoder's two-sample run)."""
    if wildcards.part in ("controls", "vanilla") or not P.raw["sampling_report"]["real_model"]:
        return []
    return model_files()
