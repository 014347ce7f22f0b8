# Parallel prompt decoding: prompt tokens trained on the base model's greedy answers (frozen
# model, only the embeddings learn), their held-out accuracy per distance (the sparse tree's
# input) stored in the checkpoint; one training per variant (the appendix ablations too). Raw
# statistics and learning curves under <root>/prompt_decoding/raw/. A variant with a ``base`` trains
# on that model instead (``draft``: the distilled draft, whose prompt tokens pd_speculative runs), on
# its own greedy answers (pd_base_corpora). pd.spec's benchmark: pd_spec_bench.
from prompt_decoding.workflow import RuleParams as PDParams

PD = P.raw["prompt_decoding"]
PD_RAW = f"{ROOT}/prompt_decoding/raw"
PDR = PDParams(PD, P.model, COMP, model_files, seq_inputs(), P.name)  # rule arguments (prompt_decoding/workflow.py)
PD_SPEC = or_exit(PDR.spec_options)  # pd.spec's decoders; a profile without their draft is one error line


wildcard_constraints:
    pdv="|".join(PD["variants"]),
    pdset="|".join(PD["bench"]["datasets"]),
    pdspec="|".join(PD["spec"]["datasets"]),


# Self-distillation needs the trained model's own greedy answers: for a variant with a base, that
# model's answers to the same ShareGPT prompts as the profile's corpora (rules selfdistill_corpus,
# seq_corpus: held out, then the training prompts after them).
rule pd_base_corpora:
    input: PDR.base_corpora_inputs
    output:
        corpus=f"{COMP}/prompt_tokens/{{pdv}}/corpus.pt",
        seqcorpus=f"{COMP}/prompt_tokens/{{pdv}}/seqcorpus.pt",
    conda: "../env.yml"
    log: f"{LOGS}/pd_base_corpora_{{pdv}}.log"
    benchmark: f"{BENCH}/pd_base_corpora_{{pdv}}.tsv"
    threads: rule_threads("pd_base_corpora")
    resources: **rule_resources("pd_base_corpora")
    params: env=ENV, py=PY, m=PDR.train_model, c=C["corpus"], s=C["seqcorpus"], t=P.threads, dev=P.device
    shell:
        f"({answer_set_command('{output.corpus}', '{params.c[prompts]}', log=False)} && "
        f"{answer_set_command('{output.seqcorpus}', '{params.s[prompts]}', skip='{params.c[prompts]}', max_prompt_tokens='{params.s[max_prompt_tokens]}', log=False)})"
        " > {log} 2>&1"


rule pd_train:
    input: unpack(PDR.train_inputs)
    output:
        ckpt=f"{COMP}/prompt_tokens/{{pdv}}/prompts.pt",
        stats=f"{PD_RAW}/train_{{pdv}}_stats.json",
        curve=f"{PD_RAW}/train_{{pdv}}_curve.jsonl",
    conda: "../env.yml"
    log: f"{LOGS}/pd_train_{{pdv}}.log"
    benchmark: f"{BENCH}/pd_train_{{pdv}}.tsv"
    threads: rule_threads("pd_train")
    resources: **rule_resources("pd_train")
    params:
        env=ENV, py=PY, m=PDR.train_model, tr=PDR.train_config, data=seq_data_flags, t=P.threads, dev=P.device,
        out=parent_of_ckpt, stop=PDR.stopping_flags, extra=PDR.variant_flags,
    shell:
        "{params.env} {params.py} -m prompt_decoding.train --model {params.m} --out {params.out}"
        " {params.data} --m {params.tr[m]} --n {params.tr[n]} --mask {params.tr[mask]} --cuts {params.tr[cuts]}"
        " --lr {params.tr[lr]} --batch-size {params.tr[batch_size]} {params.stop} {params.extra}"
        " --stats-out {output.stats} --curve-out {output.curve} --device {params.dev} --threads {params.t} > {log} 2>&1"


# The decoding benchmark of one dataset: the section's decoders (vanilla, Medusa and prompt decoding
# at every tree size; options in config decoder_config), interleaved per prompt; resumable.
rule pd_bench:
    input: section_bench_inputs("prompt_decoding", "pdset")
    output: f"{PD_RAW}/bench_{{pdset}}.jsonl"
    conda: "../env.yml"
    log: f"{LOGS}/pd_bench_{{pdset}}.log"
    benchmark: f"{BENCH}/pd_bench_{{pdset}}.tsv"
    # exclusive in every profile's resources: timing rules never share the machine with another job.
    threads: rule_threads("pd_bench")
    resources: **rule_resources("pd_bench")
    params:
        env=ENV, py=PY, p=P, b=PD["bench"], n=section_bench_prompts("prompt_decoding", "pdset"),
        decoders=section_bench_decoders("prompt_decoding", "pdset"), dcfg=section_bench_config("prompt_decoding", "pdset"),
    shell: section_bench_command("pdset")


# Table 1 and Figure 4 as the paper ran them (artifact pd.sampled): MT-Bench at FastChat's per-category
# temperatures, Medusa and prompt decoding on typical acceptance (lossy; greedy where a category's temperature
# is 0), vanilla sampling at the same temperatures; config prompt_decoding.sampled, resumable.
if "sampled" in PD:
    rule pd_sampled_bench:
        input: section_bench_inputs("prompt_decoding", "pdsampled", "sampled")
        output: f"{PD_RAW}/sampled_{{pdsampled}}.jsonl"
        conda: "../env.yml"
        log: f"{LOGS}/pd_sampled_bench_{{pdsampled}}.log"
        benchmark: f"{BENCH}/pd_sampled_bench_{{pdsampled}}.tsv"
        threads: rule_threads("pd_sampled_bench")
        resources: **rule_resources("pd_sampled_bench")
        params:
            env=ENV, py=PY, p=P, b=PD["sampled"], n=section_bench_prompts("prompt_decoding", "pdsampled", "sampled"),
            decoders=section_bench_decoders("prompt_decoding", "pdsampled", "sampled"),
            dcfg=section_bench_config("prompt_decoding", "pdsampled", "sampled"), sampling=sampling_flags(PD["sampled"]),
        shell: section_bench_command("pdsampled", aa=True, sampled=True)


# pd.spec (section 5.3): vanilla, speculative and pd_speculative (prompt decoding inside the draft),
# each drafter at every gamma of config prompt_decoding.spec, all on variant draft's base, interleaved
# per prompt; resumable.
rule pd_spec_bench:
    input: PDR.spec_inputs()
    output: f"{PD_RAW}/spec_{{pdspec}}.jsonl"
    conda: "../env.yml"
    log: f"{LOGS}/pd_spec_bench_{{pdspec}}.log"
    benchmark: f"{BENCH}/pd_spec_bench_{{pdspec}}.tsv"
    threads: rule_threads("pd_spec_bench")
    resources: **rule_resources("pd_spec_bench")
    params:
        env=ENV, py=PY, p=P, b=PD["spec"], n=PDR.spec_prompts, decoders=PDR.spec_decoders(), dcfg=PDR.spec_config(),
    shell: section_bench_command("pdspec")
