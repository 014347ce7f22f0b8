# Big Little Decoder: small models (embedded: the large model's first layers, trained unaligned on
# ShareGPT references and aligned on the large model's own greedy outputs) -> one sweep per task
# and variant (vanilla beside bild at every (alpha_FB, alpha_RB) of the task's grid, interleaved
# per prompt, with decoded text and references for the quality metrics), and one oracle study per
# task and variant (Figure 2). Early exit (Figure 6) and CALM (Figure 7): one model per exit loss
# (a shared exit head on the frozen model) -> one sweep per early-exit task and loss (the trained
# model's vanilla beside bild with exit_layer, or calm). Raw JSONL under <root>/bild/raw/; the
# small and exit models in the git-ignored cache.
from bild.config import EXIT_LOSSES as BILD_EXIT_LOSSES, VARIANTS as BILD_VARIANTS, from_profile as bild_from_profile
from bild.workflow import RuleParams as BildParams, sweep_command as bild_sweep_command

BILD = bild_from_profile(P)
# rule arguments (bild/workflow.py), with the shared helpers its inputs and teacher flags need
BILDR = BildParams(BILD, f".cache/components/{P.name}", P.model, answers_as_text=TEACHER_ANSWERS is not None,
                   model_files=model_files, teacher_flags=teacher_flags, teacher_inputs=teacher_inputs(C["teacher"]),
                   teachers={"corpus": C["corpus"], "teacher": C["teacher"], "teacher_text": TEACHER_TEXT,
                             "teacher_answers": TEACHER_ANSWERS})
BILD_RAW = f"{ROOT}/bild/raw"
BILD_BENCH = P.raw["bild"].get("bench") or {"datasets": {}}


wildcard_constraints:
    variant="|".join(BILD_VARIANTS),
    btask="|".join(BILD.tasks),
    exitloss="|".join(BILD_EXIT_LOSSES),
    bildset="|".join(BILD_BENCH["datasets"]) or "(?!)",


# The small models come from the draft family's trainer (common.components.draft_model) on the shared teacher cache,
# with hard labels: the reference text (unaligned) or the large model's greedy tokens (aligned).
rule bild_small:
    input: teacher=BILDR.small_teacher_cache, **teacher_inputs(C["teacher"])
    output:
        model=f".cache/components/{P.name}/bild_small_{{variant}}/model/config.json",
        stats=f"{BILD_RAW}/small_{{variant}}_stats.json",
        curve=f"{BILD_RAW}/small_{{variant}}_curve.jsonl",
    conda: "../env.yml"
    log: f"{LOGS}/bild_small_{{variant}}.log"
    benchmark: f"{BENCH}/bild_small_{{variant}}.tsv"
    threads: rule_threads("bild_small")
    resources: **rule_resources("bild_small")
    params:
        env=ENV, py=PY, p=P, b=BILD, labels=BILDR.labels, d=BILDR.train(C["draft"]),
        teacher=BILDR.small_teacher_flags, stop=stopping_flags(BILDR.train(C["draft"])),
    shell:
        "{params.env} {params.py} -m common.components.draft_model --model {params.b.model} --teacher {input.teacher}"
        " {params.teacher} --labels {params.labels} --layers {params.b.small_layers}"
        " --out .cache/components/{params.p.name}/bild_small_{wildcards.variant} --stats-out {output.stats}"
        " --curve-out {output.curve} {params.stop} --lr {params.d[lr]} --batch-size {params.d[batch_size]}"
        " --device {params.p.device} --threads {params.p.threads} > {log} 2>&1"


rule bild_sweep:
    input: BILDR.sweep_inputs
    output: f"{BILD_RAW}/sweep_{{btask}}_{{variant}}.jsonl"
    conda: "../env.yml"
    log: f"{LOGS}/bild_sweep_{{btask}}_{{variant}}.log"
    benchmark: f"{BENCH}/bild_sweep_{{btask}}_{{variant}}.tsv"
    # All cores: a timing rule never shares the machine with another job.
    threads: rule_threads("bild_sweep")
    resources: **rule_resources("bild_sweep")
    params:
        env=ENV, py=PY, p=P, b=BILD, large=BILDR.large, t=BILDR.task, decoders=BILDR.decoders,
        dcfg=BILDR.decoder_config,
    shell: bild_sweep_command("{params.large}")


# Table 2: the large and small models' configurations, read from their configs (no weights).
rule bild_models:
    input: model_files(BILD.model)
    output: f"{BILD_RAW}/models.jsonl"
    conda: "../env.yml"
    log: f"{LOGS}/bild_models.log"
    threads: rule_threads("bild_models")
    resources: **rule_resources("bild_models")
    params: env=ENV, py=PY, p=P
    shell:
        "{params.env} {params.py} -m bild.model_configs --profile {params.p.name} --out {output} > {log} 2>&1"


# Figure 2's oracle study: the small model decodes, the large model's token replaces its own where
# p_L(small token) is below each threshold (both models alone included), on the sweep's first prompts.
rule bild_oracle:
    input: BILDR.sweep_inputs
    output: f"{BILD_RAW}/oracle_{{btask}}_{{variant}}.jsonl"
    conda: "../env.yml"
    log: f"{LOGS}/bild_oracle_{{btask}}_{{variant}}.log"
    benchmark: f"{BENCH}/bild_oracle_{{btask}}_{{variant}}.tsv"
    threads: rule_threads("bild_oracle")
    resources: **rule_resources("bild_oracle")
    params:
        env=ENV, py=PY, p=P, b=BILD, large=BILDR.large, small=BILDR.small, t=BILDR.task,
        thr=BILDR.oracle_thresholds, n=BILDR.oracle_n,
    shell:
        "{params.env} {params.py} -m bild.oracle --large {params.large} --small {params.small}"
        " --dataset {params.t.dataset} --n {params.n} --template {params.t.template}"
        " --max-new-tokens {params.t.max_new_tokens} --max-prompt-tokens {params.b.max_prompt_tokens} --truncate left"
        " --thresholds {params.thr} --dtype {params.p.dtype} --device {params.p.device} --threads {params.p.threads}"
        " --profile {params.p.name} --resume --out {output} > {log} 2>&1"
# Figures 6 and 7: the shared exit head of each loss (bild: (L_k + L_d)/2, calm: sum_i i/sum_j j L_i),
# trained on the frozen model (bild.exits) and saved with it as the sweeps' large model.
rule bild_exit_train:
    input: unpack(BILDR.exit_inputs)
    output:
        model=f".cache/components/{P.name}/bild_exit_{{exitloss}}/model/config.json",
        stats=f"{BILD_RAW}/exit_{{exitloss}}_stats.json",
        curve=f"{BILD_RAW}/exit_{{exitloss}}_curve.jsonl",
    conda: "../env.yml"
    log: f"{LOGS}/bild_exit_train_{{exitloss}}.log"
    benchmark: f"{BENCH}/bild_exit_train_{{exitloss}}.tsv"
    threads: rule_threads("bild_exit_train")
    resources: **rule_resources("bild_exit_train")
    params:
        env=f"{ENV} {KEEP_MEMORY}", py=PY, p=P, ee=BILD.early_exit, out=BILDR.exit_dir, caches=BILDR.exit_teacher,
        flags=BILDR.exit_train_flags, teacher=BILDR.exit_teacher_flags,
    shell:
        "{params.env} {params.py} -m bild.exits --model {params.ee.model} {params.flags}"
        " --teacher {params.caches[teacher]} {params.teacher}"
        " --out {params.out} --stats-out {output.stats} --curve-out {output.curve}"
        " --device {params.p.device} --threads {params.p.threads} > {log} 2>&1"


# One sweep per early-exit task and loss: vanilla (the trained model alone: the paper's fine-tuned
# reference) beside bild with exit_layer at every (alpha_FB, alpha_RB), or calm at every (lambda, tau).
rule bild_exit_sweep:
    input: f".cache/components/{P.name}/bild_exit_{{exitloss}}/model/config.json"
    output: f"{BILD_RAW}/exit_sweep_{{btask}}_{{exitloss}}.jsonl"
    conda: "../env.yml"
    log: f"{LOGS}/bild_exit_sweep_{{btask}}_{{exitloss}}.log"
    benchmark: f"{BENCH}/bild_exit_sweep_{{btask}}_{{exitloss}}.tsv"
    # All cores: a timing rule never shares the machine with another job.
    threads: rule_threads("bild_exit_sweep")
    resources: **rule_resources("bild_exit_sweep")
    params:
        env=ENV, py=PY, p=P, b=BILD, model=BILDR.exit_model, t=BILDR.task, decoders=BILDR.exit_decoders,
        dcfg=BILDR.exit_decoder_config,
    shell: bild_sweep_command("{params.model}")


# The decoding benchmark of one dataset (MT-Bench: no references, so its quality is agreement with
# vanilla): the section's decoders interleaved per prompt; bild@rb0 is the identity record
# (alpha_RB = 0 must give the large model's greedy tokens on every prompt); resumable.
rule bild_bench:
    input: section_bench_inputs("bild", "bildset")
    output: f"{BILD_RAW}/bench_{{bildset}}.jsonl"
    conda: "../env.yml"
    log: f"{LOGS}/bild_bench_{{bildset}}.log"
    benchmark: f"{BENCH}/bild_bench_{{bildset}}.tsv"
    # exclusive in every profile's resources: timing rules never share the machine with another job.
    threads: rule_threads("bild_bench")
    resources: **rule_resources("bild_bench")
    params:
        env=ENV, py=PY, p=P, b=BILD_BENCH, n=section_bench_prompts("bild", "bildset"),
        decoders=section_bench_decoders("bild", "bildset"), dcfg=section_bench_config("bild", "bildset"),
    shell: section_bench_command("bildset")


# Beyond the paper (bild.reduced_vocab, embedded small models only): the variant's trained small
# model with an LM head over its training labels' most frequent tokens (no training: the kept rows
# are the trained head's), and one sweep of the task's grid with both heads beside one vanilla run.
if BILD.reduced_vocab is not None:
    rule bild_reduce_vocab:
        input:
            model=f"{BILDR.reduced_source()}/config.json",
            teacher=BILDR.teacher(BILD.reduced_vocab.variant)[0],
        output:
            model=f"{BILDR.reduced_dir()}/config.json",
            stats=f"{BILD_RAW}/reduced_vocab_stats.json",
        conda: "../env.yml"
        log: f"{LOGS}/bild_reduce_vocab.log"
        threads: rule_threads("bild_reduce_vocab")
        resources: **rule_resources("bild_reduce_vocab")
        params: env=ENV, py=PY, labels=BILDR.reduced_labels(), rv=BILD.reduced_vocab,
        shell:
            # the checkpoint folders (those of the input's and output's config.json) written out,
            # as bild_small's --out is: a path prefix in params is what --lint rejects
            f"{{params.env}} {{params.py}} -m common.components.reduced_vocab --model {BILDR.reduced_source()}"
            f" --teacher {{input.teacher}} --labels {{params.labels}} --keep {{params.rv.keep}} --out {BILDR.reduced_dir()}"
            " --stats-out {output.stats} > {log} 2>&1"

    # Beyond the paper: a shallower small model trained with the reduced head from the start
    # (common.components.draft_model --keep), at the paper's small/large size ratio; swept in the same run.
    if BILDR.compact_dir() is not None:
        COMPACT_TEACHER = BILDR.teacher(BILD.reduced_vocab.variant)

        rule bild_compact:
            input: teacher=COMPACT_TEACHER[0], **teacher_inputs(C["teacher"])
            output:
                model=f"{BILDR.compact_dir()}/config.json",
                stats=f"{BILD_RAW}/compact_stats.json",
                curve=f"{BILD_RAW}/compact_curve.jsonl",
            conda: "../env.yml"
            log: f"{LOGS}/bild_compact.log"
            benchmark: f"{BENCH}/bild_compact.tsv"
            threads: rule_threads("bild_small")
            resources: **rule_resources("bild_small")
            params:
                env=ENV, py=PY, p=P, b=BILD, rv=BILD.reduced_vocab, labels=BILDR.reduced_labels(),
                d=BILDR.train(C["draft"]),
                teacher=COMPACT_TEACHER[1],
                stop=stopping_flags(BILDR.train(C["draft"])),
            shell:
                # the checkpoint folder written out (parent of the output's config.json), as in bild_reduce_vocab
                f"{{params.env}} {{params.py}} -m common.components.draft_model --model {{params.b.model}} --teacher {{input.teacher}}"
                " {params.teacher} --labels {params.labels} --layers {params.rv.compact_layers} --keep {params.rv.keep}"
                f" --out {Path(BILDR.compact_dir()).parent} --stats-out {{output.stats}}"
                " --curve-out {output.curve} {params.stop} --lr {params.d[lr]} --batch-size {params.d[batch_size]}"
                " --device {params.p.device} --threads {params.p.threads} > {log} 2>&1"

    rule bild_reduced_sweep:
        input:
            large=model_files(BILD.model),
            small=f"{BILDR.reduced_source()}/config.json",
            reduced=f"{BILDR.reduced_dir()}/config.json",
            **({"compact": f"{BILDR.compact_dir()}/config.json"} if BILDR.compact_dir() else {}),
        output: f"{BILD_RAW}/reduced_vocab_sweep.jsonl"
        conda: "../env.yml"
        log: f"{LOGS}/bild_reduced_sweep.log"
        benchmark: f"{BENCH}/bild_reduced_sweep.tsv"
        # All cores: a timing rule never shares the machine with another job.
        threads: rule_threads("bild_sweep")
        resources: **rule_resources("bild_sweep")
        params:
            env=ENV, py=PY, p=P, b=BILD, t=BILD.task(BILD.reduced_vocab.task), decoders=BILDR.reduced_decoders,
            dcfg=BILDR.reduced_decoder_config,
        shell: bild_sweep_command("{params.b.model}")
