# Predictive Pipelined Decoding: Table 1's prompts -> intermediate heads -> match-rate runs
# (greedy, N and Y heads; sampling methods, N head) -> Table 3's benchmark with real workers.
# Raw JSONL under <root>/ppd_pipelined/raw/; the heads checkpoint in the git-ignored cache.
from ppd_pipelined.workflow import RuleParams
from ppd_pipelined.config import TASKS as PPDP_TASKS, METHODS as PPDP_METHODS, from_profile as ppdp_from_profile

PPDP = ppdp_from_profile(P)
PPDR = RuleParams(PPDP)  # rule arguments (ppd_pipelined/workflow.py)
PPDP_RAW = f"{ROOT}/ppd_pipelined/raw"
PPDP_CACHE = f".cache/ppd_pipelined/{P.name}"


wildcard_constraints:
    task="|".join(PPDP_TASKS),
    method="|".join(PPDP_METHODS),


rule ppdp_prompts:
    output: f"{PPDP_RAW}/prompts_{{task}}.jsonl"
    conda: "../env.yml"
    log: f"{LOGS}/ppdp_prompts_{{task}}.log"
    threads: rule_threads("ppdp_prompts")
    resources: **rule_resources("ppdp_prompts")
    params: env=ENV, py=PY, t=PPDR.task
    shell:
        "{params.env} {params.py} -m ppd_pipelined.templates --task {wildcards.task} --dataset {params.t.dataset}"
        " --template {params.t.template} --n {params.t.n} --out {output} > {log} 2>&1"


rule ppdp_train_heads:
    input: model_files(PPDP.model)
    output:
        heads=f"{PPDP_CACHE}/heads.pt",
        layer_heads=[f"{PPDP_CACHE}/head_l{l}.pt" for l in PPDP.layers],
        log=f"{PPDP_RAW}/heads_train.jsonl",
        meta=f"{PPDP_RAW}/heads_meta.json",
        curve=f"{PPDP_RAW}/heads_curve.jsonl",
    conda: "../env.yml"
    log: f"{LOGS}/ppdp_train_heads.log"
    benchmark: f"{BENCH}/ppdp_train_heads.tsv"
    threads: rule_threads("ppdp_train_heads")
    resources: **rule_resources("ppdp_train_heads")
    params:
        env=ENV, py=PY, m=PPDP.model, p=P, layers=PPDR.layers, cfg=PPDR.heads_config,
        excl=PPDR.eval_datasets, out=PPDR.heads_dir,
    shell:
        "{params.env} {params.py} -m ppd_pipelined.heads --model {params.m} --layers {params.layers}"
        " --out {params.out} --log {output.log} --meta-out {output.meta} --curve-out {output.curve}"
        " --exclude-datasets {params.excl}"
        " --config '{params.cfg}' --dtype {params.p.dtype} --device {params.p.device} --threads {params.p.threads}"
        " --profile {params.p.name} > {log} 2>&1"


rule ppdp_matchrate:
    input:
        model_files(PPDP.model),
        prompts=f"{PPDP_RAW}/prompts_{{task}}.jsonl",
        heads=f"{PPDP_CACHE}/heads.pt",
    output: f"{PPDP_RAW}/matchrate_{{task}}.jsonl"
    conda: "../env.yml"
    log: f"{LOGS}/ppdp_matchrate_{{task}}.log"
    benchmark: f"{BENCH}/ppdp_matchrate_{{task}}.tsv"
    threads: rule_threads("ppdp_matchrate")
    resources: **rule_resources("ppdp_matchrate")
    params:
        env=ENV, py=PY, m=PPDP.model, p=P, t=PPDR.task, layers=PPDR.layers,
        cls=PPDR.classifiers, mpt=PPDP.max_prompt_tokens,
    shell:
        "{params.env} {params.py} -m ppd_pipelined.matchrate --model {params.m} --task {wildcards.task}"
        " --prompts {input.prompts} --layers {params.layers} --classifiers {params.cls} --heads {input.heads}"
        " --method greedy --n {params.t.n} --max-new-tokens {params.t.max_new_tokens} --max-prompt-tokens {params.mpt} --truncate last"
        " --dtype {params.p.dtype} --device {params.p.device} --threads {params.p.threads}"
        " --profile {params.p.name} --out {output} > {log} 2>&1"


rule ppdp_sampling:
    input:
        model_files(PPDP.sampling.model),
        prompts=f"{PPDP_RAW}/prompts_{{task}}.jsonl",
    output: f"{PPDP_RAW}/sampling_{{task}}_{{method}}.jsonl"
    conda: "../env.yml"
    log: f"{LOGS}/ppdp_sampling_{{task}}_{{method}}.log"
    benchmark: f"{BENCH}/ppdp_sampling_{{task}}_{{method}}.tsv"
    threads: rule_threads("ppdp_sampling")
    resources: **rule_resources("ppdp_sampling")
    params:
        env=ENV, py=PY, s=PPDP.sampling, p=P, t=PPDR.task, layers=PPDR.layers, mpt=PPDP.max_prompt_tokens,
    shell:
        "{params.env} {params.py} -m ppd_pipelined.matchrate --model {params.s.model} --task {wildcards.task}"
        " --prompts {input.prompts} --layers {params.layers} --classifiers N --method {wildcards.method}"
        " --top-k {params.s.top_k} --top-p {params.s.top_p} --seed {params.s.seed} --n {params.s.n}"
        " --max-new-tokens {params.t.max_new_tokens} --max-prompt-tokens {params.mpt} --truncate last"
        " --dtype {params.p.dtype} --device {params.p.device} --threads {params.p.threads}"
        " --profile {params.p.name} --out {output} > {log} 2>&1"


rule ppdp_bench:
    input:
        model_files(PPDP.table3.model),
        prompts=f"{PPDP_RAW}/prompts_{{task}}.jsonl",
    output: f"{PPDP_RAW}/bench_{{task}}.jsonl"
    conda: "../env.yml"
    log: f"{LOGS}/ppdp_bench_{{task}}.log"
    benchmark: f"{BENCH}/ppdp_bench_{{task}}.tsv"
    # exclusive in every profile's resources: a timing rule never shares the machine with another job.
    threads: rule_threads("ppdp_bench")
    resources: **rule_resources("ppdp_bench")
    params:
        env=ENV, py=PY, t3=PPDP.table3, p=P, decoders=PPDR.bench_decoders, dcfg=PPDR.bench_config,
        mpt=PPDP.max_prompt_tokens,
    shell:
        bench_command("--prompts {input.prompts} --n {params.t3.n}",
                      "--max-new-tokens {params.t3.max_new_tokens} --max-prompt-tokens {params.mpt}",
                      model="{params.t3.model}", truncate="last")
