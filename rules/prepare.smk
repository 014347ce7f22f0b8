# Preparation: the embedded model's GGUF -> fp32 safetensors checkpoint in the git-ignored cache.

rule prepare_model:
    output: str(checkpoint_dir("{model}") / "model.safetensors")
    conda: "../env.yml"
    log: f"{LOGS}/prepare_model_{{model}}.log"
    benchmark: f"{BENCH}/prepare_model_{{model}}.tsv"
    threads: rule_threads("prepare_model")
    resources: **rule_resources("prepare_model")
    params: env=ENV, py=PY
    shell: "{params.env} {params.py} -m common.assets.models convert {wildcards.model} > {log} 2>&1"


rule prepare:
    input: model_files()


if STAND_INS_DONE:
    # Tiny random stand-ins of every hub model the profile names, written as local copies of their
    # repositories (common.harness.stand_ins), with the embedded model's tokenizer.
    rule stand_ins:
        input: model_files("smollm2-135m-instruct")
        output: STAND_INS_DONE
        conda: "../env.yml"
        log: f"{LOGS}/stand_ins.log"
        benchmark: f"{BENCH}/stand_ins.tsv"
        threads: rule_threads("stand_ins")
        resources: **rule_resources("stand_ins")
        params: env=ENV, py=PY
        shell: "{params.env} {params.py} -m common.harness.stand_ins --profile {P.name} > {log} 2>&1"
