# Preparation: the embedded model's GGUF -> fp32 safetensors checkpoint in the git-ignored cache.

rule prepare_model:
    output: str(checkpoint_dir("{model}") / "model.safetensors")
    conda: "../env.yml"
    log: f"{LOGS}/prepare_model_{{model}}.log"
    benchmark: f"{BENCH}/prepare_model_{{model}}.tsv"
    threads: rule_threads("prepare_model")
    resources: **rule_resources("prepare_model")
    params: env=ENV, py=PY
    shell: "{params.env} {params.py} -m common.models convert {wildcards.model} > {log} 2>&1"


rule prepare:
    input: model_files()
