"""Per-prompt sampling in the benchmark (issue #80, the papers' non-greedy MT-Bench runs): each
prompt at its category's temperature from FastChat's MT-Bench table, typical acceptance where a
decoder offers it, every record naming what it decoded with; bad combinations refused before
any model loads."""
import json

import pytest

from common.assets.data import MTBENCH_DEFAULT_TEMPERATURE, category_temperature, mtbench_temperatures
from common.errors import UserError
from common.harness import bench
from common.records import read_jsonl


def _args(tmp_path, *extra, decoders="vanilla,medusa@x,prompt_lookup"):
    return bench.parse_args(["--model", "m", "--decoders", decoders, "--dataset", "mt-bench",
                             "--out", str(tmp_path / "o.jsonl"), *extra])


def test_the_table_is_fastchats():
    """Read from the installed FastChat source: its sampled categories and its greedy ones."""
    t = mtbench_temperatures()
    assert t["writing"] == t["roleplay"] == 0.7 and t["math"] == t["coding"] == 0.0 and t["stem"] == 0.1
    assert category_temperature("mt-bench", "no-such-category") == MTBENCH_DEFAULT_TEMPERATURE
    with pytest.raises(UserError, match="category temperature table"):
        category_temperature("gsm8k", "math")


@pytest.mark.parametrize("extra, match", [
    (["--category-temperatures", "nope"], "--category-temperatures table"),
    (["--category-temperatures", "mt-bench", "--temperature", "1"], "drop --temperature"),
    (["--temperature", "1", "--acceptance", "typical"], "offered by none"),
    (["--acceptance", "typical"], "the run is greedy"),
])
def test_bad_combinations_are_refused_before_a_model_loads(tmp_path, extra, match):
    decoders = "vanilla,prompt_lookup" if "offered by none" in match else "vanilla,medusa@x,prompt_lookup"
    with pytest.raises(UserError, match=match):
        bench.validate(_args(tmp_path, *extra, decoders=decoders))


def test_one_instance_per_temperature_typical_only_where_offered_and_sampling(tmp_path):
    args = _args(tmp_path, "--category-temperatures", "mt-bench", "--acceptance", "typical")
    names, cfgs = bench.validate(args)
    v = bench.instance_configs(args, names, cfgs, [0.7, 0.0, 0.1, 0.7])
    assert v["vanilla"] == {0.0: {"temperature": 0.0}, 0.1: {"temperature": 0.1}, 0.7: {"temperature": 0.7}}
    assert v["medusa@x"][0.0] == {"temperature": 0.0}  # typical needs temperature > 0: greedy there
    assert v["medusa@x"][0.7] == {"temperature": 0.7, "acceptance": "typical"}
    assert "acceptance" not in v["prompt_lookup"][0.7]  # it offers no typical rule: the exact one
    # a label's own temperature wins: one instance; a decoder that cannot sample: one greedy instance
    names = {**names, "ppd_pipelined": "ppd_pipelined"}
    v = bench.instance_configs(args, names, {**cfgs, "medusa@x": {"temperature": 1.0}}, [0.7, 0.0])
    assert v["medusa@x"] == {None: {"temperature": 1.0, "acceptance": "typical"}}
    assert v["ppd_pipelined"] == {None: {}}
    ident = bench.variants_for_identity(v)
    assert ident["ppd_pipelined"] == {} and set(ident["vanilla"]) == {"t=0.0", "t=0.7"}


@pytest.mark.model
def test_each_prompt_samples_at_its_categorys_temperature(tmp_path, embedded, monkeypatch):
    monkeypatch.setattr(bench, "load_model", lambda *a, **k: embedded)
    prompts = tmp_path / "q.jsonl"
    prompts.write_text("".join(json.dumps({"question_id": i, "category": c, "turns": [t]}) + "\n" for i, (c, t) in
                               enumerate([("writing", "Write a line about rain."), ("math", "What is 2 + 3?")])))
    out = tmp_path / "o.jsonl"
    bench.main(["--model", "smollm2-135m-instruct", "--decoders", "vanilla,prompt_lookup", "--prompts", str(prompts),
                "--max-new-tokens", "6", "--category-temperatures", "mt-bench", "--seed", "3", "--out", str(out)])
    recs = read_jsonl(out)
    got = {(r["category"], r["decoder"]): (r["temperature"], r["seed"], r["category_temperatures"]) for r in recs}
    assert got == {(c, d): (t, 3, "mt-bench") for c, t in (("writing", 0.7), ("math", 0.0))
                   for d in ("vanilla", "prompt_lookup")}
    greedy = {r["decoder"]: r["tokens"] for r in recs if r["category"] == "math"}
    assert greedy["prompt_lookup"] == greedy["vanilla"]  # at temperature 0 both are greedy: the same tokens
