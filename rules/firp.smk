# FIRP: the K affine maps trained on the base model's greedy answers (frozen model), their
# held-out accuracy per step (the tree search's input) stored in the checkpoint. Raw statistics
# and learning curves under <root>/firp/raw/. One training per variant of config firp.variants:
# main (what decoding uses) and the layer sweeps of Figures 5-7 (firp.ablation names which).
from firp.workflow import RuleParams as FirpParams

FIRP = P.raw["firp"]
FIRPR = FirpParams(FIRP)  # rule arguments (firp/workflow.py)
FIRP_RAW = f"{ROOT}/firp/raw"


wildcard_constraints:
    firpv="|".join(FIRP["variants"]),
    firpset="|".join(FIRP["bench"]["datasets"]),


rule firp_train:
    input: **seq_inputs()
    output:
        ckpt=f"{COMP}/firp_maps/{{firpv}}/maps.pt",
        stats=f"{FIRP_RAW}/train_{{firpv}}_stats.json",
        curve=f"{FIRP_RAW}/train_{{firpv}}_curve.jsonl",
    conda: "../env.yml"
    log: f"{LOGS}/firp_train_{{firpv}}.log"
    benchmark: f"{BENCH}/firp_train_{{firpv}}.tsv"
    threads: rule_threads("firp_train")
    resources: **rule_resources("firp_train")
    params:
        env=ENV, py=PY, m=P.model, tr=FIRPR.train_config, data=seq_data_flags, t=P.threads, dev=P.device,
        out=parent_of_ckpt, stop=FIRPR.stopping_flags, layers=FIRPR.layer_flags, mode=FIRPR.mode_flags,
    shell:
        "{params.env} {params.py} -m firp.train --model {params.m} --out {params.out}"
        " {params.data} --steps-k {params.tr[steps_k]} {params.layers} {params.mode} --anchors {params.tr[anchors]}"
        " --lr {params.tr[lr]} --batch-size {params.tr[batch_size]} {params.stop}"
        " --stats-out {output.stats} --curve-out {output.curve} --device {params.dev} --threads {params.t} > {log} 2>&1"


# Figure 4: how close the pseudo states come to the real ones, layer by layer (firp.analysis).
rule firp_cosine:
    input: maps=f"{COMP}/firp_maps/{{firpv}}/maps.pt", **heldout_inputs()
    output: f"{FIRP_RAW}/cosine_{{firpv}}.jsonl"
    conda: "../env.yml"
    log: f"{LOGS}/firp_cosine_{{firpv}}.log"
    benchmark: f"{BENCH}/firp_cosine_{{firpv}}.tsv"
    threads: rule_threads("firp_cosine")
    resources: **rule_resources("firp_cosine")
    params: env=ENV, py=PY, m=P.model, t=P.threads, dev=P.device, maps=parent_of_maps, held=heldout_flags
    shell:
        "{params.env} {params.py} -m firp.analysis --model {params.m} --maps {params.maps} {params.held}"
        " --device {params.dev} --threads {params.t} --out {output} > {log} 2>&1"


# Figure 3's early-exit baseline (firp.exit_heads): step i's head reads the anchor's state entering
# the main maps' layer t_i; trained like the Medusa heads (components.medusa's recipe, teacher cache).
EXIT_HEADS = {**C["medusa"], **FIRP.get("early_exit", {})}  # the profile's own overrides (its config says why)


rule firp_early_exit:
    input: teacher=f"{COMP}/teacher.pt", **teacher_inputs(C["teacher"])
    output:
        heads=f"{COMP}/firp_early_exit/heads.pt",
        stats=f"{FIRP_RAW}/early_exit_stats.json",
        curve=f"{FIRP_RAW}/early_exit_curve.jsonl",
    conda: "../env.yml"
    log: f"{LOGS}/firp_early_exit.log"
    benchmark: f"{BENCH}/firp_early_exit.tsv"
    threads: rule_threads("firp_early_exit")
    resources: **rule_resources("firp_early_exit")
    params:
        env=ENV, py=PY, m=P.model, h=EXIT_HEADS, t=P.threads, dev=P.device, out=parent_of_heads, steps=FIRPR.exit_flags(),
        share="--share-lm-head" if EXIT_HEADS.get("share_lm_head") else "",
        teacher=teacher_flags(C["corpus"], C["teacher"]), stop=stopping_flags(EXIT_HEADS),
    shell:
        "{params.env} {params.py} -m firp.exit_heads --model {params.m} --teacher {input.teacher}"
        " {params.teacher} --out {params.out}"
        " --stats-out {output.stats} --curve-out {output.curve} {params.steps} {params.share}"
        " --labels {params.h[labels]} --train-vocab {params.h[train_vocab]} {params.stop}"
        " --lr {params.h[lr]} --batch-size {params.h[batch_size]} --device {params.dev} --threads {params.t} > {log} 2>&1"


# Figure 3's like-for-like Medusa-1 (where the profile asks for it: firp.medusa_own): K heads with an
# LM head each, components.medusa's recipe otherwise, on the same teacher cache.
MEDUSA_OWN = {**C["medusa"], **FIRP["medusa_own"]} if FIRP.get("medusa_own") else None
if MEDUSA_OWN:
    rule firp_medusa_own:
        input: teacher=f"{COMP}/teacher.pt", **teacher_inputs(C["teacher"])
        output:
            heads=f"{COMP}/firp_medusa_own/heads.pt",
            stats=f"{FIRP_RAW}/medusa_own_stats.json",
            curve=f"{FIRP_RAW}/medusa_own_curve.jsonl",
        conda: "../env.yml"
        log: f"{LOGS}/firp_medusa_own.log"
        benchmark: f"{BENCH}/firp_medusa_own.tsv"
        threads: rule_threads("firp_medusa_own")
        resources: **rule_resources("firp_medusa_own")
        params:
            env=ENV, py=PY, m=P.model, t=P.threads, dev=P.device, out=parent_of_heads,
            teacher=teacher_flags(C["corpus"], C["teacher"]), heads=head_train_flags(MEDUSA_OWN),
        shell:
            "{params.env} {params.py} -m common.components.medusa_heads --model {params.m} --teacher {input.teacher}"
            " {params.teacher} --out {params.out}"
            " --stats-out {output.stats} --curve-out {output.curve} {params.heads}"
            " --device {params.dev} --threads {params.t} > {log} 2>&1"


# Figure 3: the main maps, the early-exit heads and the Medusa heads (and Medusa-1's, where trained)
# scored on the same split points of the held-out greedy answers (firp.accuracy).
rule firp_topk:
    input:
        maps=f"{COMP}/firp_maps/main/maps.pt", early=f"{COMP}/firp_early_exit/heads.pt",
        medusa=f"{COMP}/medusa/heads.pt", **heldout_inputs(),
        **({"medusa_own": f"{COMP}/firp_medusa_own/heads.pt"} if MEDUSA_OWN else {}),
    output: f"{FIRP_RAW}/topk.jsonl"
    conda: "../env.yml"
    log: f"{LOGS}/firp_topk.log"
    benchmark: f"{BENCH}/firp_topk.tsv"
    threads: rule_threads("firp_topk")
    resources: **rule_resources("firp_topk")
    params:
        env=ENV, py=PY, m=P.model, t=P.threads, dev=P.device, maps=parent_of_maps,
        early=FIRPR.early_folder, medusa=FIRPR.medusa_flags, held=heldout_flags,
    shell:
        "{params.env} {params.py} -m firp.accuracy --model {params.m} --maps {params.maps} --early-exit {params.early}"
        " {params.medusa} {params.held} --device {params.dev} --threads {params.t} --out {output} > {log} 2>&1"


# The decoding benchmark of one dataset: the section's decoders (vanilla, self-speculative, Medusa
# and FIRP per tree size; options in config decoder_config), interleaved per prompt; resumable.
rule firp_bench:
    input: section_bench_inputs("firp", "firpset")
    output: f"{FIRP_RAW}/bench_{{firpset}}.jsonl"
    conda: "../env.yml"
    log: f"{LOGS}/firp_bench_{{firpset}}.log"
    benchmark: f"{BENCH}/firp_bench_{{firpset}}.tsv"
    # exclusive in every profile's resources: timing rules never share the machine with another job.
    threads: rule_threads("firp_bench")
    resources: **rule_resources("firp_bench")
    params:
        env=ENV, py=PY, p=P, b=FIRP["bench"], n=section_bench_prompts("firp", "firpset"),
        decoders=section_bench_decoders("firp", "firpset"), dcfg=section_bench_config("firp", "firpset"),
    shell: section_bench_command("firpset")
