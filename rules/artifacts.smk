# One target per artifact id: run its notebook (notebooks/<id>.ipynb, generated from
# notebooks/src/) with papermill (common.harness.execute: its kernel on Unix sockets, so parallel renders
# never draw the same TCP port); the executed copy is kept beside the tables and figures it
# wrote. Notebooks read exactly the raw records declared here (parameter `inputs`). After
# papermill, `python -m common.harness.render close` appends the notebook's closing markdown cell (what
# the artifact shows, from the verdict lines the notebook computed).
#
# A failed render never replaces what is there: outputs are flagged update() (Snakemake keeps
# them during the job and restores them when it fails), the notebook writes its tables and
# figure atomically at its very end, and papermill writes to a temporary notebook that is
# moved into place only on success.
import json as _json

for _aid, _spec in ARTIFACTS.items():
    rule:
        name: _aid.replace(".", "_").replace("-", "_")
        input:
            notebook=f"notebooks/{_aid}.ipynb",
            raw=raw_records(_aid),
        output:
            notebook=update(artifact_outputs(_aid)[0]),
            files=[update(f) for f in artifact_outputs(_aid)[1:]],
        log: f"{LOGS}/artifact_{_aid}.log"
        threads: rule_threads("render")
        resources: **rule_resources("render")
        conda: "../env.yml"
        params:
            env=ENV, py=PY, aid=_aid, pkg=_spec["package"], root=results_root_of, profile=P.name,
            inputs=_json.dumps({"inputs": artifact_inputs(_aid)}),
        shell:
            "({params.env} {params.py} -m common.harness.execute {input.notebook} {output.notebook}.partial"
            " -p artifact_id {params.aid} -p results_root {params.root} -p package {params.pkg} -p profile {params.profile}"
            " -y '{params.inputs}' > {log} 2>&1"
            # the closing markdown cell: what the artifact shows, from its computed verdict lines
            " && {params.py} -m common.harness.render close {output.notebook}.partial >> {log} 2>&1"
            " && mv {output.notebook}.partial {output.notebook})"
            " || {{ rm -f {output.notebook}.partial; exit 1; }}"  # the error is in the log


# results/SUMMARY.md: per paper, each artifact's range beside the paper's and its verdict, read
# from the rendered tables (common.harness.summary); part of `all`, so it never lags the tables.
rule summary:
    input: tables=[f for f in all_targets() if f.endswith(".md")], titles="config/packages.yaml"
    output: f"{ROOT}/SUMMARY.md"
    log: f"{LOGS}/summary.log"
    threads: rule_threads("render")
    resources: **rule_resources("render")
    conda: "../env.yml"
    params: py=PY
    shell: "{params.py} -m common.harness.summary {input.tables} --titles {input.titles} --out {output} > {log} 2>&1"
