# One target per artifact id: run its parameterized notebook with papermill; the executed
# copy is kept beside the tables and figures it wrote. Notebooks read results/ only.

for _aid, _spec in ARTIFACTS.items():
    rule:
        name: _aid.replace(".", "_").replace("-", "_")
        input:
            notebook=f"notebooks/{_spec['notebook']}.ipynb",
            raw=artifact_inputs(_aid),
        output:
            notebook=artifact_outputs(_aid)[0],
            files=artifact_outputs(_aid)[1:],
        log: f"{LOGS}/artifact_{_aid}.log"
        conda: "../env.yml"
        params:
            env=ENV, py=PY, aid=_aid, pkg=_spec["package"], root=results_root_of, profile=P.name,
        shell:
            "{params.env} {params.py} -m papermill -k python3 --language python {input.notebook} {output.notebook}"
            " -p artifact_id {params.aid} -p results_root {params.root} -p package {params.pkg} -p profile {params.profile}"
            " > {log} 2>&1"
