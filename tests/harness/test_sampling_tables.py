"""The exact-distribution check's table (common.harness.sampling_tables) on a hand-made record
shaped like tools/sampling_report.py's: a failing row and a control that was not rejected must
show as such, in the rows and in the verdicts."""
import pandas as pd
import pytest

from common.errors import UserError
from common.harness.sampling_tables import (lossy_note, merge_records, sampling_counts, sampling_meta,
                                            sampling_table, sampling_verdicts)

ALPHA = 1e-3


def _row(decoder, config, setting, p, same=True, impossible=0):
    return {"decoder": decoder, "config": config, "setting": setting, "status": "tested", "rule": "target_sampling",
            "statistic": 3.5, "dof": 4, "p_value": p, "samples": 200, "cells": 5, "impossible": impossible,
            "seconds_per_draw": 0.012, "same_seed_same_tokens": same}


def _record(real=True):
    rec = {"alpha": ALPHA, "min_expected": 5.0, "counted_tokens": 3, "max_new_tokens": 4, "prompt": [1, 5, 6],
           "model": "tiny_llama(seed=0, scale=10), final norm x40.0", "draws": 200,
           "settings": {"t1": {"temperature": 1.0}}, "device": "cpu: AMD EPYC (1 threads), torch 2",
           "threads": 1, "code_version": "abc123",
           "decoders": [_row("vanilla", "defaults", "t1", 0.5),
                        _row("eagle", "mode=static", "t1", 1e-7, impossible=2),    # rejected: fails
                        _row("lookahead", "w=3", "t1", 0.4, same=False),           # not reproducible: fails
                        {"decoder": "bild", "status": "cannot run", "reason": "test_configs: a T5 only"},
                        {"decoder": "calm", "config": "defaults", "setting": "t1", "status": "cannot sample",
                         "reason": "cannot sample"}],
           "controls": [{"control": "wrong rule", "rule": "accept_p", "statistic": 90.0, "dof": 4, "p_value": 1e-15,
                         "samples": 200, "cells": 5, "impossible": 0},
                        {"control": "wrong temperature", "rule": "target", "statistic": 8.0, "dof": 4,
                         "p_value": 0.09, "samples": 200, "cells": 5, "impossible": 0}],   # NOT rejected
           "lossy_rules": {"typical": ["eagle", "medusa"]}}
    if real:
        rec["real_model"] = {"model": "smollm2-135m-instruct", "draws": 20, "counted_tokens": 2, "device": "cpu: x",
                             "dtype": "float32",
                             "rows": [{"decoder": "eagle", "prompt": "Name three colours.", "status": "tested",
                                       "rule": "target_sampling", "statistic": 1.0, "dof": 1, "p_value": 0.3,
                                       "samples": [20, 20], "cells": 2},
                                      {"decoder": "rest", "prompt": "Name three colours.", "status": "not run",
                                       "reason": "no datastore"}]}
    return rec


def test_rows_say_which_pass_and_which_control_was_not_rejected():
    t = sampling_table(_record())
    assert list(t.part) == ["lossless"] * 5 + ["control"] * 2 + ["real model"] * 2
    lossless = t[t.part == "lossless"].set_index("decoder")
    assert lossless.loc["vanilla", "passes"] and not lossless.loc["eagle", "passes"]
    assert not lossless.loc["lookahead", "passes"]          # p is fine, the seed did not reproduce
    assert "2 draws of probability 0" in lossless.loc["eagle", "note"]
    assert lossless.loc["vanilla", "ms_per_draw"] == pytest.approx(12.0)
    assert pd.isna(lossless.loc["bild", "p_value"]) and lossless.loc["bild", "note"].startswith("cannot run")
    controls = t[t.part == "control"]
    assert controls.rejected.tolist() == [True, False] and controls.passes.isna().all()
    assert "NOT rejected" in controls.note.iloc[1]
    assert t[t.part == "real model"].draws.iloc[0] == 20


def test_counts_and_verdicts_come_from_the_record():
    n = sampling_counts(_record())
    assert (n["tested"], n["passed"], n["untested"], n["controls"], n["rejected"]) == (3, 1, 2, 2, 1)
    assert n["failed"] == ["eagle [mode=static] t1", "lookahead [w=3] t1"]
    lines = sampling_verdicts(_record())
    assert lines[0].startswith("1 of 3 decoder option sets x settings pass at alpha 0.001")
    assert "failed: eagle [mode=static] t1, lookahead [w=3] t1 - 2 more could not run" in lines[0]
    assert not any("; " in line for line in lines)   # the header joins the lines with "; "
    assert lines[1].startswith("only 1 of 2 negative controls were rejected")
    assert lines[2].startswith("1 of 1 two-sample comparisons")
    ok = _record(real=False)
    ok["controls"][1]["p_value"] = 1e-9
    ok["decoders"] = ok["decoders"][:1]
    lines = sampling_verdicts(ok)
    assert len(lines) == 2 and lines[0].startswith("1 of 1 ") and "failed" not in lines[0]
    assert lines[1] == "all 2 negative controls were rejected at alpha 0.001: the check can fail"


def test_header_and_the_lossy_rule_note():
    meta = sampling_meta(_record())
    assert meta["draws"] == 200 and meta["alpha"] == ALPHA and meta["code_version"] == "abc123"
    assert meta["real model"].startswith("smollm2-135m-instruct, 20 draws")
    old = _record(real=False)
    for key in ("device", "threads", "code_version", "lossy_rules"):   # a record from before they were written
        del old[key]
    assert "device" not in sampling_meta(old) and "real model" not in sampling_meta(old)
    assert lossy_note(old) is None
    assert lossy_note(_record()) == "typical (offered by eagle, medusa) is lossy by design: not among the lossless rows"


def _parts(rec):
    """``rec`` cut as the workflow writes it: the controls part, then one part per decoder."""
    parts = [{**rec, "decoders": [], "lossy_rules": {}, "real_model": None, "code_version": "c0"}]
    names = dict.fromkeys([*(r["decoder"] for r in rec["decoders"] + rec["real_model"]["rows"]),
                           *(d for decs in rec["lossy_rules"].values() for d in decs)])
    for name in names:
        real = {**rec["real_model"], "rows": [r for r in rec["real_model"]["rows"] if r["decoder"] == name]}
        parts.append({**rec, "decoders": [r for r in rec["decoders"] if r["decoder"] == name], "controls": [],
                      "real_model": real, "code_version": "c1",
                      "lossy_rules": {k: [name] for k, v in rec["lossy_rules"].items() if name in v}})
    return parts


def test_merged_parts_read_as_the_whole_record():
    """The per-part records merge into what the tool writes whole: same table, counts and verdicts;
    the header names both code versions the parts ran."""
    whole = _record()
    merged = merge_records(_parts(whole))
    pd.testing.assert_frame_equal(sampling_table(merged), sampling_table(whole))
    assert sampling_counts(merged) == sampling_counts(whole)
    assert sampling_verdicts(merged) == sampling_verdicts(whole)
    assert merged["code_version"] == "c0; c1" and merged["controls_rejected"] is False
    assert merged["failed"] == ["eagle [mode=static] t1", "lookahead [w=3] t1"]


def test_a_part_drawn_under_another_config_is_refused():
    parts = _parts(_record())
    parts[2] = {**parts[2], "draws": 10_000}
    with pytest.raises(UserError, match=r"b\.json differs from a\.json in draws"):
        merge_records(parts[:1] + parts[2:3], ["a.json", "b.json"])
    with pytest.raises(UserError, match="no sampling records"):
        merge_records([])
