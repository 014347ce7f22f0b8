# Cross-method benchmark: every decoder on the same model, prompts and machine.

rule bench_cross:
    input: group_inputs
    output: f"{ROOT}/cross/raw/bench_{{group}}.jsonl"
    conda: "../env.yml"
    log: f"{LOGS}/bench_cross_{{group}}.log"
    benchmark: f"{BENCH}/bench_cross_{{group}}.tsv"
    # exclusive in every profile's resources: timing rules never share the machine with another job.
    threads: rule_threads("bench_cross")
    resources: **rule_resources("bench_cross")
    params:
        env=ENV, py=PY, p=P, c=P.cross, decoders=group_decoders, dcfg=group_decoder_config,
    shell:
        bench_command("--dataset {params.c.dataset} --n {params.c.n}",
                      "--max-new-tokens {params.c.max_new_tokens} --max-prompt-tokens {params.c.max_prompt_tokens}")


# The verification forward's cost T(q) on this machine (common.harness.cost_curve): the hardware curve a
# hardware-aware tree size and the limit column compare against.
rule cost_curve:
    input: model_files()
    output: f"{ROOT}/cross/raw/cost_curve.jsonl"
    conda: "../env.yml"
    log: f"{LOGS}/cost_curve.log"
    benchmark: f"{BENCH}/cost_curve.tsv"
    threads: rule_threads("cost_curve")  # a timing rule never shares the machine
    resources: **rule_resources("cost_curve")
    params:
        env=ENV, py=PY, p=P, c=P.raw["cost"], q=",".join(map(str, P.raw["cost"]["q"])),
        paths=",".join(P.raw["cost"].get("paths", ["fast", "stock"])),
    shell:
        "{params.env} {params.py} -m common.harness.cost_curve --model {params.p.model} --q {params.q}"
        " --context {params.c[context]} --rounds {params.c[rounds]} --paths {params.paths} --device {params.p.device}"
        " --dtype {params.p.dtype} --threads {params.p.threads} --profile {params.p.name} --out {output} > {log} 2>&1"


# REST's datastore (common.components.rest_datastore): the profile model's tokenizer over ShareGPT's assistant
# replies, a suffix array, built once; its size and build time land in the stats record.
rule rest_datastore:
    input: model_files()
    output:
        meta=f".cache/components/{P.name}/rest_datastore/datastore.json",
        stats=f"{ROOT}/cross/raw/rest_datastore_stats.json",
    conda: "../env.yml"
    log: f"{LOGS}/rest_datastore.log"
    benchmark: f"{BENCH}/rest_datastore.tsv"
    threads: rule_threads("rest_datastore")
    resources: **rule_resources("rest_datastore")
    params: env=ENV, py=PY, m=P.model, out=datastore_folder, n=datastore_flags
    shell:
        "{params.env} {params.py} -m common.components.rest_datastore --model {params.m} --out {params.out} {params.n}"
        " --stats {output.stats} > {log} 2>&1"


# The cross-method study (config study, docs/study.md): every decoder it names on one dataset,
# interleaved per prompt with vanilla and its A/A pair (--aa: vanilla@aa, last in each prompt),
# resumable by prompt: one job per dataset, so a category reruns alone.
rule study_bench:
    input: section_bench_inputs("study", "studyset")
    output: f"{ROOT}/cross/raw/study_{{studyset}}.jsonl"
    conda: "../env.yml"
    log: f"{LOGS}/study_bench_{{studyset}}.log"
    benchmark: f"{BENCH}/study_bench_{{studyset}}.tsv"
    # exclusive in every profile's resources: timing rules never share the machine with another job.
    threads: rule_threads("study_bench")
    resources: **rule_resources("study_bench")
    params:
        env=ENV, py=PY, p=P, b=P.raw.get("study", {}).get("bench", {}), n=section_bench_prompts("study", "studyset"),
        decoders=section_bench_decoders("study", "studyset"), dcfg=section_bench_config("study", "studyset"),
    shell: section_bench_command("studyset", aa=True)


# The study at temperature > 0 (config study.sampled, artifact study.sampled): the lossless decoders that sample,
# per dataset, interleaved per prompt with vanilla (sampling at the same settings) and its A/A pair; resumable.
if "sampled" in P.raw.get("study", {}):
    rule study_sampled_bench:
        input: section_bench_inputs("study", "sampledset", "sampled")
        output: f"{ROOT}/cross/raw/sampled_study_{{sampledset}}.jsonl"
        conda: "../env.yml"
        log: f"{LOGS}/study_sampled_bench_{{sampledset}}.log"
        benchmark: f"{BENCH}/study_sampled_bench_{{sampledset}}.tsv"
        threads: rule_threads("study_sampled_bench")
        resources: **rule_resources("study_sampled_bench")
        params:
            env=ENV, py=PY, p=P, b=P.raw["study"]["sampled"], n=section_bench_prompts("study", "sampledset", "sampled"),
            decoders=section_bench_decoders("study", "sampledset", "sampled"),
            dcfg=section_bench_config("study", "sampledset", "sampled"), sampling=sampling_flags(P.raw["study"]["sampled"]),
        shell: section_bench_command("sampledset", aa=True, sampled=True)


# EAGLE-3's ablation (config eagle3_ablation, artifact cross.eagle3): the decoders drafting with each head
# compared, interleaved per prompt with vanilla and its A/A pair, one job per dataset, resumable by prompt.
if "eagle3_ablation" in P.raw:
    rule eagle3_ablation_bench:
        input: section_bench_inputs("eagle3_ablation", "ablationset")
        output: f"{ROOT}/cross/raw/eagle3_ablation_{{ablationset}}.jsonl"
        conda: "../env.yml"
        log: f"{LOGS}/eagle3_ablation_bench_{{ablationset}}.log"
        benchmark: f"{BENCH}/eagle3_ablation_bench_{{ablationset}}.tsv"
        threads: rule_threads("eagle3_ablation_bench")
        resources: **rule_resources("eagle3_ablation_bench")
        params:
            env=ENV, py=PY, p=P, b=P.raw["eagle3_ablation"]["bench"],
            n=section_bench_prompts("eagle3_ablation", "ablationset"),
            decoders=section_bench_decoders("eagle3_ablation", "ablationset"),
            dcfg=section_bench_config("eagle3_ablation", "ablationset"),
        shell: section_bench_command("ablationset", aa=True)


# The exact-distribution check (tools/sampling_report.py, config sampling_report, artifact cross.sampling), one
# part (job, record) per lossless decoder and one of the negative controls, so hours of draws are kept as each
# part ends: a decoder's first tokens G-tested against a tiny peaked LLaMA's enumerated distribution and
# (real_model) its two-sample run against vanilla on the profile's model, device and dtype; the controls the
# same test must reject. Under results/ the tool writes only from committed code, refused at its start.
if "sampling_report" in P.raw:
    rule sampling_part:
        # the profile's model only where the two-sample part loads it; the tiny model is made in the process
        input: sampling_part_inputs
        output: f"{ROOT}/cross/raw/sampling/{{part}}.json"
        wildcard_constraints: part="|".join(sampling_parts(P))
        conda: "../env.yml"
        log: f"{LOGS}/sampling_part_{{part}}.log"
        benchmark: f"{BENCH}/sampling_part_{{part}}.tsv"
        threads: rule_threads("sampling_part")  # the tiny model's draws use one; the real model's, all
        resources: **rule_resources("sampling_part")
        params: env=ENV, py=PY, draws=P.raw["sampling_report"]["draws"], flags=sampling_part_flags
        shell:
            "{params.env} {params.py} tools/sampling_report.py --draws {params.draws} {params.flags}"
            " --threads {threads} --out {output} > {log} 2>&1"
