# Cross-method benchmark: every decoder on the same model, prompts and machine.

rule bench_cross:
    input: group_inputs
    output: f"{ROOT}/cross/raw/bench_{{group}}.jsonl"
    conda: "../env.yml"
    log: f"{LOGS}/bench_cross_{{group}}.log"
    benchmark: f"{BENCH}/bench_cross_{{group}}.tsv"
    # All cores: timing rules never share the machine with another job.
    threads: workflow.cores
    params:
        env=ENV, py=PY, p=P, c=P.cross, decoders=group_decoders, dcfg=group_decoder_config,
    shell:
        "{params.env} {params.py} -m common.bench --model {params.p.model} --decoders {params.decoders}"
        " --dataset {params.c.dataset} --n {params.c.n} --max-new-tokens {params.c.max_new_tokens}"
        " --max-prompt-tokens {params.c.max_prompt_tokens} --dtype {params.p.dtype} --device {params.p.device}"
        " --threads {params.p.threads} --profile {params.p.name} --decoder-config '{params.dcfg}'"
        " --out {output} > {log} 2>&1"
