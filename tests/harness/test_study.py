"""The cross-method study's recipe (config ``study``; docs/study.md): what its rule runs and what
its artifacts read and write follow the config, and a study that forgets a component's training
record is one error. The smoke and paper-tiny DAG tests run it end to end."""
import copy
import dataclasses

import pytest

from common.config import AA_LABEL, load_profile
from common.workflow.artifacts import artifact_inputs, artifact_outputs, study_labels, study_stats
from common.errors import UserError


def test_the_study_records_its_a_a_pair_and_exports_every_label():
    P = load_profile(None, "smoke")
    labels = study_labels(P)
    assert labels[-1] == AA_LABEL and labels[:-1] == list(P.raw["study"]["bench"]["decoders"])
    outs = artifact_outputs(P, "study.table")
    assert [o for o in outs if "/specbench/" in o] == [f"{P.results_root}/cross/specbench/{l}.jsonl" for l in labels]
    ins = artifact_inputs(P, "study.table")
    assert ins == [f"{P.results_root}/cross/raw/study_{d}.jsonl" for d in P.raw["study"]["bench"]["datasets"]]


def test_study_cost_reads_the_training_record_of_every_component_named():
    P = load_profile(None, "embedded")
    paths = study_stats(P)
    # medusa, eagle, draft, REST's datastore, prompt tokens, FIRP's maps, BiLD's small model
    assert len(paths) == 7 and "cross/raw/medusa_stats.json" in paths
    assert all(f"{P.results_root}/{p}" in artifact_inputs(P, "study.cost") for p in paths)


def test_a_component_without_a_training_record_is_one_error():
    P = load_profile(None, "embedded")
    raw = copy.deepcopy(dict(P.raw))
    raw["study"] = {**raw["study"], "stats": {k: v for k, v in raw["study"]["stats"].items() if k != "eagle"}}
    with pytest.raises(UserError, match="no training record for eagle"):
        study_stats(dataclasses.replace(P, raw=raw))


def test_components_line_says_whether_every_run_decoded_with_the_same_weights():
    from common.harness.report import components_line

    def rec(decoder, digest=None, cfg=None):
        r = {"decoder": decoder, "decoder_config": cfg or {}}
        if digest is not None:
            r["components"] = {"draft": digest}
        return r

    same = {"humaneval": [rec("vanilla", None), rec("speculative", "aaaa")],
            "sharegpt-math": [rec("speculative", "aaaa")]}
    for r in same["humaneval"][:1]:
        r["components"] = {}
    assert components_line(same) == "speculative.draft aaaa (every run)"
    differ = {"humaneval": [rec("speculative", "aaaa")], "sharegpt-math": [rec("speculative", "bbbb")]}
    assert components_line(differ) == "speculative.draft differs: humaneval aaaa, sharegpt-math bbbb"
    old = {"mt-bench": [{"decoder": "speculative", "decoder_config": {"draft": "x"}}]}
    assert components_line(old) == "no digests in mt-bench"
    assert components_line({"mt-bench": [{"decoder": "vanilla", "decoder_config": {}}]}) == "no trained components"
