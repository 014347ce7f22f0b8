# Notebook source (tools/make_notebook.py): the generated notebook starts with papermill's parameters
# artifact_id, results_root, package, profile and inputs (the raw records the rule declares).

# %% md
# # Predictive Pipelined Decoding (ppd_pipelined): implementation (Table 3)
# Greedy vs pipelined decoding with k + 1 real workers, from the `common.harness.bench` records `bench_<task>.jsonl`
# (the prompt files `prompts_<task>.jsonl` name the data). Measured: wall time of `generate` on
# this machine (prefill included) with k + 1 gloo processes. On 2 CPU cores the k + 1 workers
# cannot run in parallel, so the measured latency shows the cost of pipelined decoding here, not its ideal.
# Theorem: the latency `theory.latency_from_matches` gives for the observed match sequence,
# times the measured per-layer time of the main worker (decode phase only, no prefill, no head
# or communication time): what k + 1 truly parallel workers would achieve. The paper's
# LLaMA-2-13B numbers (`ppd_pipelined/paper_numbers.yaml`) stand beside ours.

# %%
import numpy as np
import pandas as pd

from common.records import read_jsonl
from ppd_pipelined import theory
from ppd_pipelined.tables import LABEL, Render, paper_numbers, provenance, data_note

R = Render(artifact_id, results_root, package, profile, inputs)
TASKS, tasks3 = list(R.cfg.tasks), list(R.cfg.table3.tasks)
paper = paper_numbers("table3")
prow = {(t, k): dict(zip(paper["columns"][2:], v)) for t, k, *v in paper["rows"]}

# %%
bench = []
for t in tasks3:
    prompt_info = read_jsonl(R.path(f"prompts_{t}.jsonl"))[0]  # the bench names the prompt file; this names the data
    bench += [{**r, "task": t, "dataset": prompt_info["dataset"], "stand_in": prompt_info["stand_in"]}
              for r in read_jsonl(R.path(f"bench_{t}.jsonl"))]
df = pd.DataFrame(bench)
rows = []
for t in tasks3:
    g = df[df.task == t]
    base_tok = g[g.decoder == "vanilla"].set_index("question_id")["tokens"]
    ppd = g[g.decoder.str.startswith("ppd_pipelined")]
    # One layer time per dataset for every row (greedy and each k): the theorem's latencies
    # then differ only by the accounting of the observed matches, not by how much each run's
    # main worker was slowed by its own sub-workers sharing the cores.
    layer_s = float(np.mean([e["layer_time_s"] for e in ppd.extra if e.get("layer_time_s")])) if len(ppd) else np.nan
    for dec, h in g.groupby("decoder", sort=False):
        ex = list(h.extra)
        is_ppd = dec.startswith("ppd_pipelined")
        matches = [m for e in ex for m in (e.get("matches") or [])] if is_ppd else []
        new = h.new_tokens.sum()
        if is_ppd:
            pred = sum(theory.latency_from_matches(e["layers"], e["exit_layer"], e["k"], [bool(m) for m in e["matches"]]).latency
                       for e in ex) * layer_s
        else:
            d = int(ppd.extra.iloc[0]["layers"]) if len(ppd) else np.nan
            pred = d * layer_s * new if len(ppd) else np.nan
        k = ex[0].get("k") if is_ppd else 0
        pp = prow.get((t, k), {})
        rows.append({
            "dataset": LABEL[t], "method": "greedy" if dec == "vanilla" else "greedy (w/ PPD)",
            "k": k if is_ppd else "-", "workers": (k + 1) if is_ppd else 1,
            "prompts": len(h), "mean_new_tokens": new / len(h),
            "p_correct": round(float(np.mean(matches)), 4) if matches else np.nan,
            "measured_latency_s": h.wall_time.mean(),
            "measured_latency_128_s": (h.wall_time.sum() / new) * 128,
            "measured_tokens_per_s": new / h.wall_time.sum(),
            "theorem_latency_128_s": pred / new * 128,
            "theorem_tokens_per_s": new / pred if pred else np.nan,
            "identical_to_greedy": f"{sum(tok == base_tok.get(q) for q, tok in zip(h.question_id, h.tokens))}/{len(h)}",
            "paper_p_correct": pp.get("p_correct", np.nan) / 100 if pp.get("p_correct") else np.nan,
            "paper_latency_128_s": pp.get("latency_128_s", np.nan),
            "paper_tokens_per_s": pp.get("tokens_per_s", np.nan),
        })
table = pd.DataFrame(rows)

# %% md
# The paper finds pipelined decoding faster than greedy at every k on both tasks. The lines below count, per
# pipelined row, whether its latency is below its dataset's greedy latency: measured here, and as the
# theorem's accounting of our observed matches.

# %%
def below_greedy(col):
    """Per pipelined row: is its 128-token latency below greedy's on the same dataset?"""
    out = []
    for _, g in table.groupby("dataset", sort=False):
        base = g.loc[g.method == "greedy", col].iloc[0]
        out += list(g.loc[g.method != "greedy", col] < base)
    return out


ks = sorted({str(k) for k in table.k if str(k) not in ("-", "nan", "None")}) if "k" in table else []
over = f"{len(tasks3)} tasks x k in {', '.join(ks) or 'the runs'}"
lines = [R.trend("pipelined latency below greedy's, measured", below_greedy("measured_latency_128_s"),
                 below_greedy("paper_latency_128_s"), over=over),
         R.trend("pipelined latency below greedy's, theorem with our matches", below_greedy("theorem_latency_128_s"),
                 below_greedy("paper_latency_128_s"), over=over,
                 caveat="the theorem's latency is a model of the pipeline, not a measurement")]
print("\n".join(lines))
R.save_table(table, provenance(bench, [p for t in tasks3 for p in (R.path(f"bench_{t}.jsonl"), R.path(f"prompts_{t}.jsonl"))],
                               TASKS,
                               measured="wall time on this machine, k + 1 gloo processes sharing its cores "
                                        "(prefill included); *_128_s scales the per-token time to 128 tokens",
                               theorem="Theorem 4.1's accounting of the observed match sequence x one measured "
                                       "per-layer time (main worker, mean over this dataset's pipelined runs) for every row: "
                                       "ideal parallel workers, no prefill, head or communication cost; "
                                       "greedy = d layers per token at the same layer time",
                               data=data_note(bench, TASKS) + "; prompts rendered with Table 1's templates",
                               paper=paper["cite"], trend="; ".join(lines)))

# %%
R.publish()
