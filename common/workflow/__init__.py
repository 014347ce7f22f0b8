"""What the Snakemake workflow derives from a validated profile (:mod:`common.config`) while
planning: each rule's reservation (:mod:`.resources`), each artifact's raw records and outputs,
and the notebooks' side of that contract (:mod:`.artifacts`), and the command lines several rules
share (:mod:`.commands`). Torch-free: planning a DAG imports no model code.
"""
