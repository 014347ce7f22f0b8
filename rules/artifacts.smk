# One target per artifact id: run its notebook (notebooks/<id>.ipynb, generated from
# notebooks/src/) with papermill; the executed copy is kept beside the tables and figures it
# wrote. Notebooks read exactly the raw records declared here (parameter `inputs`).
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
            raw=artifact_inputs(_aid),
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
            "({params.env} {params.py} -m papermill -k python3 --language python {input.notebook} {output.notebook}.partial"
            " -p artifact_id {params.aid} -p results_root {params.root} -p package {params.pkg} -p profile {params.profile}"
            " -y '{params.inputs}' > {log} 2>&1 && mv {output.notebook}.partial {output.notebook})"
            " || {{ rm -f {output.notebook}.partial; exit 1; }}"  # the error is in the log
