"""common.harness.cross_tables: the cross-method, study and components tables from small synthetic records."""
import pandas as pd
import pytest

from common.config import AA_LABEL
from common.harness import cross_tables as T


def rec(decoder, q, wall, tokens=(1, 2, 3, 4), category="writing", config=None):
    return {"question_id": q, "decoder": decoder, "tokens": list(tokens), "new_tokens": len(tokens), "steps": 2,
            "wall_time": wall, "peak_mem_bytes": 2**20, "category": category, "decoder_config": config or {},
            "device": "cpu: X, torch 2"}


def test_component_of_and_extras():
    assert [T.component_of(c) for c in ({"heads": 4}, {"head": "x"}, {"draft": "d"}, {})] == \
        ["medusa", "eagle", "draft", None]
    recs = [rec("vanilla", 0, 1.0), rec("medusa@t16", 0, 0.5, config={"heads": 4}), rec("prompt_lookup", 0, 0.5)]
    stats = {"medusa": {"params": 2_000_000, "train_wall_s": 60.0, "hardware": "cpu: X"}}
    assert T.extras("g", recs, "vanilla", stats, {}) == (0.0, None, None, None)
    assert T.extras("g", recs, "prompt_lookup", stats, {}) == (0.0, None, None, None)  # nothing trained
    assert T.extras("g", recs, "medusa@t16", stats, {})[:3] == (2.0, 60.0, "cpu: X")
    # a joined group's decoders load its package's component, named by the group
    assert T.extras("firp", recs, "prompt_lookup", {"firp": stats["medusa"]}, {"firp": {}})[0] == 2.0
    with pytest.raises(FileNotFoundError, match="no medusa_stats.json"):
        T.extras("g", recs, "medusa@t16", {}, {})


def study_records():
    """Two categories; 'fast' is lossless and fastest; 'lossy' is faster in writing but changes an output."""
    out = []
    for q, cat in ((0, "writing"), (1, "writing"), (2, "math"), (3, "math")):
        out += [rec("vanilla", q, 1.0, category=cat), rec("fast", q, 0.5, category=cat),
                rec("slow", q, 0.8, category=cat), rec(AA_LABEL, q, 1.0, category=cat),
                rec("lossy", q, 0.4 if cat == "writing" else 2.0, tokens=(9, 9, 9, 9) if q == 2 else (1, 2, 3, 4),
                    category=cat)]
    return out


def test_per_category_marks_a_method_lossy_everywhere():
    long = T.per_category(study_records(), ["writing", "math"])
    assert list(long.category.unique()) == ["writing", "math", "overall"]
    assert "vanilla" not in set(long.decoder)
    lossy = long[long.decoder == "lossy"]
    assert not lossy.lossless.any()  # identical on the writing prompts, still lossy there
    assert long[long.decoder == "fast"].lossless.all()
    assert long[(long.category == "writing") & (long.decoder == "fast")].speedup.iloc[0] == pytest.approx(2.0)


def test_fastest_lines_skip_lossy_and_aa_and_call_ties():
    long = T.per_category(study_records(), ["writing", "math"])
    lines = T.fastest_lines(long)
    assert lines[0].startswith("writing: fastest lossless fast 2.00x, ahead of slow by 0.75")
    assert len(lines) == 3 and all("lossy" not in x and AA_LABEL not in x for x in lines)
    tie = long.assign(aa_spread=0.5)  # a 0.75 margin is inside half of a 2x speedup
    assert "(within the A/A spread: a tie)" in T.fastest_lines(tie)[0]
    only = long[long.decoder.isin(["fast", "lossy"])]
    assert T.fastest_lines(only)[0] == "writing: only lossless method fast 2.00x"


def test_curve_rows_keep_the_published_weights():
    curve = pd.DataFrame({"step": [0, 10, 20], "examples_seen": [0, 5, 10], "wall_s": [0.0, 3.0, 6.04],
                          "heldout_top1": [[0.1, 0.0], [0.5, 0.2], [0.4, 0.3]],
                          "heldout_loss": [[3.0, 4.0], [2.0, 3.0], [2.5, 3.5]]})
    stats = {"medusa": {"stopped": "flat", "chosen_step": 10, "teacher": {"k": 1}, "train_tokens": 99}}
    t = T.curve_rows({"medusa": curve}, stats, {"k": 1}, lambda k: "other").iloc[0]
    assert (t.top1_untrained, t.top1_best, t.top1_final, t.top1_kept) == (0.1, 0.5, 0.4, 0.5)
    assert t.train_wall_s == 6.0 and t.heldout_loss_final == 2.5 and t.watched == "head-1 top-1"
    assert t.data == "as above"
    other = T.curve_rows({"draft": curve.assign(heldout_top1=[0.1, 0.2, 0.3], heldout_loss=[3.0, 2.0, 1.0])},
                         {"draft": {"stopped": "max steps", "teacher": {"k": 2}}}, {"k": 1}, lambda k: f"data {k}").iloc[0]
    assert other.top1_kept == 0.3 and other.data == "data {'k': 2}" and other.watched == "top-1 agreement"
    assert T.top1([0.7, 0.1]) == 0.7 and T.top1(0.3) == 0.3


def test_ran_on_names_hosts_as_every_host_caveat_does():
    from common.harness.report import host_caveat
    one = [rec("vanilla", 0, 1.0), rec("fast", 0, 0.5)]
    assert T.ran_on(one) == "cpu: X, torch 2"  # the same name the verdicts' caveats use, torch included
    two = one + [{**rec("fast", 1, 0.5), "device": "cpu: Y, torch 2"}]
    assert T.ran_on(two) == host_caveat(two) and "2 hosts" in T.ran_on(two)
    assert T.ran_on([{k: v for k, v in r.items() if k != "device"} for r in one]) == "unknown"
