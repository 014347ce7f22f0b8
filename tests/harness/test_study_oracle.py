"""study.oracle and study.calibration (issue #79) from hand-made records: the per-prompt oracle
takes, on each prompt, the fastest method whose tokens equal vanilla's there, within that prompt's
own run; the pool is measured against it, never chosen by it; the pool's calibration pools nodes
over prompts, weighted by how many each call tested."""
import math

import pandas as pd
import pytest

from common.config import AA_LABEL
from common.errors import UserError
from common.harness.cross_tables import best_pair, calibration_rows, oracle_rows, per_category

SAME, OTHER = [1, 2, 3, 4], [1, 2, 9, 9]  # vanilla's output, and a lossy one


def rec(qid, decoder, wall, tokens=SAME, category="c", **extra):
    return {"question_id": qid, "decoder": decoder, "wall_time": wall, "tokens": list(tokens),
            "new_tokens": len(tokens), "steps": len(tokens), "peak_mem_bytes": 0, "category": category, **extra}


def run(walls: dict[str, list[float]], tokens: dict[str, list] | None = None, categories=None) -> list[dict]:
    """One run's records: ``walls[label][i]`` is prompt i's wall time; ``tokens[label][i]`` its output."""
    tokens = tokens or {}
    return [rec(str(i), lab, w, (tokens.get(lab) or [SAME] * len(ws))[i],
                (categories or ["c"] * len(ws))[i])
            for lab, ws in walls.items() for i, w in enumerate(ws)]


def row(df: pd.DataFrame, cat: str = "overall") -> pd.Series:
    return df[df.category == cat].iloc[0]


def test_a_lossy_method_is_no_candidate_on_the_prompt_where_its_tokens_differ():
    walls = {"vanilla": [10.0, 10.0], "a": [5.0, 8.0], "lossy": [1.0, 4.0]}
    r = row(oracle_rows({"d": run(walls, {"lossy": [OTHER, SAME]})}))
    assert r.oracle_all == pytest.approx(20 / (5 + 4))  # prompt 0: a (lossy differs); prompt 1: lossy, equal there
    assert r.oracle_wins == "a 1, lossy 1"
    assert r.best_single == "a" and r.best_single_speedup == pytest.approx(20 / 13)  # lossy is no single method
    control = row(oracle_rows({"d": run(walls)}))  # the same walls with lossy equal to vanilla everywhere
    assert control.oracle_all == pytest.approx(20 / 5) and control.best_single == "lossy"


def test_the_oracles_and_the_best_single_method_on_known_walls():
    walls = {"vanilla": [10.0, 10.0, 10.0], "a": [4.0, 9.0, 6.0], "b": [8.0, 5.0, 7.0], "c": [9.0, 9.0, 3.0],
             AA_LABEL: [9.0, 11.0, 10.0]}
    runs = {"d": run(walls)}
    assert best_pair(runs) == ["a", "b"]  # summed walls a 19, b 20, c 21: fastest first
    r = row(oracle_rows(runs))
    assert r.best_single == "a" and r.best_single_speedup == pytest.approx(30 / 19)
    assert r.oracle_two == pytest.approx(30 / (4 + 5 + 6))  # between a and b only
    assert r.oracle_all == pytest.approx(30 / (4 + 5 + 3))  # c, the slowest single method, wins prompt 2
    assert r.oracle_all > r.oracle_two > r.best_single_speedup
    assert r.aa_oracle == pytest.approx(30 / (9 + 10 + 10))
    assert r.no_lossless == 0 and r.prompts == 3
    explicit = row(oracle_rows(runs, pair=["a", "c"]))
    assert explicit.oracle_two == pytest.approx(30 / (4 + 9 + 3))


def test_the_best_single_method_is_the_speedup_study_detail_shows():
    recs = run({"vanilla": [10.0, 12.0, 7.0], "a": [4.0, 9.0, 6.0], "b": [8.0, 5.0, 7.0]},
               categories=["x", "y", "x"])
    mine = oracle_rows({"d": recs}).set_index("category")
    theirs = per_category(recs, ["x", "y"]).set_index(["category", "decoder"])
    for cat in ("x", "y", "overall"):
        best = mine.loc[cat, "best_single"]
        assert mine.loc[cat, "best_single_speedup"] == pytest.approx(theirs.loc[(cat, best), "speedup"])
        assert mine.loc[cat, "best_single_speedup"] == max(theirs.loc[cat].speedup)
    assert list(mine.index) == ["x", "y", "overall"]


def test_two_runs_are_never_mixed_even_with_the_same_question_ids():
    """Run d1's vanilla is slow, d2's fast; the same question id "0" in each is two prompts, each
    compared with its own run's vanilla."""
    runs = {"d1": run({"vanilla": [10.0], "a": [5.0]}, categories=["x"]),
            "d2": run({"vanilla": [2.0], "a": [4.0]}, categories=["y"])}
    df = oracle_rows(runs)
    assert row(df, "x").oracle_all == pytest.approx(2.0) and row(df, "y").oracle_all == pytest.approx(0.5)
    assert row(df).prompts == 2 and row(df).oracle_all == pytest.approx(12 / 9)
    # a method that ran only in d2 is no candidate for d1's prompt, and no single method overall
    runs["d2"] += [rec("0", "b", 1.0, category="y")]
    df = oracle_rows(runs)
    assert row(df, "x").oracle_all == pytest.approx(2.0) and row(df, "y").oracle_all == pytest.approx(2.0)
    assert row(df).oracle_all == pytest.approx(12 / 6) and row(df).best_single == "a"


def test_no_lossless_candidate_leaves_vanilla_s_own_time():
    r = row(oracle_rows({"d": run({"vanilla": [10.0, 10.0], "lossy": [1.0, 5.0]}, {"lossy": [OTHER, SAME]})}))
    assert r.no_lossless == 1 and r.oracle_all == pytest.approx(20 / 15) and r.best_single is None


def test_the_pool_is_measured_against_the_oracle_never_chosen_by_it():
    walls = {"vanilla": [10.0, 10.0], "a": [5.0, 5.0], "pool@t8": [2.0, 4.0]}
    r = row(oracle_rows({"d": run(walls)}, pools=["pool@t8", "pool@t16"], absent="not run (study.pending)"))
    assert r.oracle_all == pytest.approx(2.0) and r.best_single == "a"  # the pool, fastest, is neither
    assert r["pool@t8"] == pytest.approx(20 / 6)
    assert r["pool@t16"] == "not run (study.pending)"
    assert "pool" not in "".join(best_pair({"d": run(walls)}))


def test_a_pool_missing_some_of_a_category_s_prompts_is_blank_there():
    recs = run({"vanilla": [10.0, 10.0, 10.0], "a": [5.0, 5.0, 5.0]}, categories=["x", "x", "y"])
    recs += [rec("0", "pool@t8", 2.0, category="x"), rec("2", "pool@t8", 2.0, category="y")]
    df = oracle_rows({"d": recs}, pools=["pool@t8"])
    assert math.isnan(row(df, "x")["pool@t8"]) and math.isnan(row(df)["pool@t8"])
    assert row(df, "y")["pool@t8"] == pytest.approx(5.0)


def test_records_without_vanilla_are_one_error():
    with pytest.raises(UserError, match="no vanilla"):
        oracle_rows({"d": run({"a": [1.0]})})


def cal(source, depth, tested, predicted, observed):
    return {"source": source, "depth": depth, "tested": tested, "predicted": predicted, "observed": observed}


def test_calibration_pools_nodes_weighted_by_how_many_each_call_tested():
    recs = [rec("0", "pool@t8", 1.0,
                extra={"pool_calibration": [cal("eagle", 1, 1, 0.9, 1.0), cal("suffix", 2, 0, 0.5, 0.0)]}),
            rec("1", "pool@t8", 1.0, extra={"pool_calibration": [cal("eagle", 1, 3, 0.5, 0.0)]}),
            rec("1", "pool@t16", 1.0, extra={"pool_calibration": [cal("eagle", 1, 2, 0.2, 0.5)]}),
            rec("0", "vanilla", 1.0)]
    df = calibration_rows({"d1": recs[:2], "d2": recs[2:]}).set_index(["decoder", "source", "depth"])
    e = df.loc[("pool@t8", "eagle", 1)]
    assert e.tested == 4 and e.calls == 2
    assert e.predicted == pytest.approx((0.9 + 3 * 0.5) / 4) and e.observed == pytest.approx(1 / 4)  # not 0.7, 0.5
    assert e.gap == pytest.approx(0.25 - 0.6) and e.se == pytest.approx(math.sqrt(0.6 * 0.4 / 4))
    assert df.loc[("pool@t16", "eagle", 1)].predicted == pytest.approx(0.2)  # labels kept apart
    assert ("pool@t8", "suffix", 2) not in df.index  # nothing tested: no row
    assert len(df) == 2


def test_calibration_without_a_pool_record_is_an_empty_table_with_its_columns():
    df = calibration_rows({"d": run({"vanilla": [1.0], "a": [1.0]})})
    assert df.empty and list(df.columns) == ["decoder", "source", "depth", "calls", "tested", "predicted", "observed",
                                             "gap", "se"]
