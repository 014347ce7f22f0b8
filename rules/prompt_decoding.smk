# Parallel prompt decoding: prompt tokens trained on the base model's greedy answers (frozen
# model, only the embeddings learn), their held-out accuracy per distance (the sparse tree's
# input) stored in the checkpoint; one training per variant (the appendix ablations too). Raw
# statistics and learning curves under <root>/prompt_decoding/raw/.
PD = P.raw["prompt_decoding"]
PD_RAW = f"{ROOT}/prompt_decoding/raw"


wildcard_constraints:
    pdv="|".join(PD["variants"]),
    pdset="|".join(PD["bench"]["datasets"]),


rule pd_train:
    input: unpack(pd_train_inputs)
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
        env=ENV, py=PY, m=P.model, tr=pd_train_config, c=C["corpus"], s=C["seqcorpus"], t=P.threads, dev=P.device, out=parent_of_ckpt,
        stop=pd_stopping_flags, extra=pd_variant_flags,
    shell:
        "{params.env} {params.py} -m prompt_decoding.train --model {params.m} --out {params.out}"
        " --corpus {input.seqcorpus} --prompts {params.s[prompts]} --max-prompt-tokens {params.s[max_prompt_tokens]}"
        " --heldout-corpus {input.corpus} --heldout-prompts {params.c[prompts]} --answer-tokens {params.c[answer_tokens]}"
        " --m {params.tr[m]} --n {params.tr[n]} --mask {params.tr[mask]} --cuts {params.tr[cuts]}"
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
        env=ENV, py=PY, p=P, b=PD["bench"], n=pd_bench_prompts,
        decoders=section_bench_decoders("prompt_decoding", "pdset"), dcfg=section_bench_config("prompt_decoding", "pdset"),
    shell:
        "{params.env} {params.py} -m common.bench --model {params.p.model} --decoders {params.decoders}"
        " --dataset {wildcards.pdset} --n {params.n} --max-new-tokens {params.b[max_new_tokens]}"
        " --max-prompt-tokens {params.b[max_prompt_tokens]} --dtype {params.p.dtype} --device {params.p.device}"
        " --threads {params.p.threads} --profile {params.p.name} --decoder-config '{params.dcfg}'"
        " --resume --out {output} > {log} 2>&1"
