# %% parameters
artifact_id = "ppdp.table2"
results_root = "results"
package = "ppd_pipelined"
profile = "embedded"

# %% md
# # Predictive Pipelined Decoding (PPD): match rates, theory, implementation
# One notebook for every `ppdp.*` artifact (parameter `artifact_id`). It reads the raw records
# under `<results_root>/ppd_pipelined/raw/` only: rendered prompts (`prompts_<task>.jsonl`),
# match-rate runs (`matchrate_<task>.jsonl`: greedy, N and Y heads; `sampling_<task>_<method>.jsonl`:
# N head), the heads' training record (`heads_meta.json`, `heads_train.jsonl`) and the Table 3
# benchmark (`bench_<task>.jsonl`, written by `common.bench`). A record keeps, per generated
# token and probed layer, the rank of the chosen token in the early logits: a top-k match is
# `rank < k`. Every table names its model, data (with the offline stand-ins), profile and hardware.

# %%
import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from common.records import read_jsonl
from common.report import write_table
from ppd_pipelined import theory

base = Path(results_root) / package
raw, tables, figures = base / "raw", base / "tables", base / "figures"
TASKS = ["squad", "wmt", "cnn_dm"]
LABEL = {"squad": "SQuAD 1.1", "wmt": "WMT EN-FR", "cnn_dm": "CNN/DM"}


def load(name):
    path = raw / name
    return read_jsonl(path), str(path)


def data_note(recs):
    """'SQuAD 1.1: mt-bench (stand-in)' per task, from the records themselves."""
    seen = {}
    for r in recs:
        t = r.get("task") or r.get("category")
        ds = r.get("dataset")
        seen[t] = f"{LABEL.get(t, t)}: {ds}" + (" (offline stand-in for the paper's set)" if r.get("stand_in") else "")
    return "; ".join(seen[t] for t in TASKS if t in seen)


def provenance(recs, sources, **extra):
    keys = {"model": "model", "profile": "profile", "hardware": "device", "dtype": "dtype"}
    meta = {"artifact": artifact_id}
    for label, k in keys.items():
        vals = sorted({str(r[k]) for r in recs if k in r})
        if vals:
            meta[label] = ", ".join(vals)
    meta["data"] = data_note(recs)
    meta.update(extra)
    meta["sources"] = ", ".join(sources)
    return meta


def save_table(df, meta):
    write_table(df, artifact_id, tables, meta)
    print((tables / f"{artifact_id}.md").read_text())


def save_figure(fig):
    figures.mkdir(parents=True, exist_ok=True)
    fig.savefig(figures / f"{artifact_id}.png", dpi=120, bbox_inches="tight")


def ranks_frame(recs):
    """One row per (record, classifier, layer, generated position): the chosen token's early rank."""
    rows = []
    for i, r in enumerate(recs):
        for c, by_layer in r["early"].items():
            for layer, v in by_layer.items():
                for pos, rank in enumerate(v["rank"]):
                    rows.append((r["task"], r.get("method", "greedy"), i, c, int(layer), pos, rank))
    return pd.DataFrame(rows, columns=["task", "method", "rec", "classifier", "layer", "pos", "rank"])


def pct(x):
    return round(100 * float(x), 2)


# %% md
# ## Greedy match-rate runs (Tables 2, 6-8; Figures 3-4; theory)

# %%
greedy, greedy_src = [], []
if artifact_id in ("ppdp.table2", "ppdp.table6-8", "ppdp.fig3", "ppdp.fig4", "ppdp.theory"):
    for t in TASKS:
        recs, src = load(f"matchrate_{t}.jsonl")
        greedy += recs
        greedy_src.append(src)
    R = ranks_frame(greedy)
    greedy_data = {r["task"]: r for r in greedy}
    depth = greedy[0]["depth"]
    layers = greedy[0]["layers"]
    mid = depth // 2 if depth // 2 in layers else min(layers, key=lambda l: abs(l - depth / 2))
    ks = [1, 3, 5]
    print(f"{len(greedy)} generations, {len(R)} (token, layer, classifier) comparisons; d = {depth}, d/2 layer = {mid}")

# %%
if artifact_id == "ppdp.table2":
    heads_meta = json.loads((raw / "heads_meta.json").read_text())
    rows = []
    for t in TASKS:
        for k in ks:
            for c in sorted(R.classifier.unique()):
                g = R[(R.task == t) & (R.classifier == c)]
                row = {"dataset": LABEL[t], "k": k, "trained": c, "tokens": int(g[g.layer == layers[0]].shape[0])}
                for l in layers:
                    row[f"layer {l}"] = pct((g[g.layer == l]["rank"] < k).mean())
                rows.append(row)
    table = pd.DataFrame(rows)
    hm = heads_meta["config"]
    save_table(table, provenance(greedy, greedy_src + [str(raw / "heads_meta.json")],
                                 layers=f"{layers} of d = {depth} (the paper's 10/20/30/35/37 of 40 at the same depth fractions)",
                                 values="p_correct in %: the final token is among the early top-k at that layer (all generated positions)",
                                 trained=f"N: the model's LM head reused; Y: a head trained for that layer "
                                         f"(lr {hm['lr']}, {hm['epochs']} epoch(s), batch {hm['batch_size']}, "
                                         f"{heads_meta['steps']} steps; see ppdp.table4)"))

# %%
if artifact_id == "ppdp.table6-8":
    rows = []
    for t in TASKS:
        recs = [r for r in greedy if r["task"] == t]
        L = recs[0]["max_new_tokens"]
        width = max(1, L // 8)  # the paper: 16 tokens in pairs, 128 tokens in 16-token buckets
        edges = list(range(0, L, width))
        g = R[R.task == t]
        for l in layers:
            for k in ks:
                for c in sorted(g.classifier.unique()):
                    h = g[(g.layer == l) & (g.classifier == c)]
                    row = {"dataset": LABEL[t], "tokens per bucket": width, "layer": l, "k": k, "trained": c}
                    for j, e in enumerate(edges):
                        b = h[(h.pos >= e) & (h.pos < e + width)]
                        row[f"bucket {j + 1}"] = pct((b["rank"] < k).mean()) if len(b) else np.nan
                    row["Total"] = pct((h["rank"] < k).mean())
                    rows.append(row)
    table = pd.DataFrame(rows)
    table = table[[c for c in table.columns if c != "Total"] + ["Total"]]
    save_table(table, provenance(greedy, greedy_src, values="p_correct in % by generated-token position: bucket j covers positions "
                                 "(j-1)*w+1 .. j*w (w = tokens per bucket; "
                                 "SQuAD-like 16-token runs in pairs, 128-token runs in 16-token buckets; "
                                 "empty: no generation reached that position)"))

# %% md
# ## Figures 3 and 4: theoretical trade-off from the measured p_correct at layer d/2
# Eq. 3 (per-token latency), eq. 5 (compute per time unit) and eq. 6 (compute per token), all
# relative to greedy decoding, from `ppd_pipelined.theory` with p = the measured match rate at d/2.

# %%
if artifact_id in ("ppdp.fig3", "ppdp.fig4"):
    frac = mid / depth
    rows = []
    for t in TASKS:
        for c in sorted(R.classifier.unique()):
            g = R[(R.task == t) & (R.classifier == c) & (R.layer == mid)]
            for k in ks:
                p = float((g["rank"] < k).mean())
                rows.append({"dataset": LABEL[t], "trained": c, "k": k, "p_correct": round(p, 4),
                             "latency_per_token": theory.per_token_latency(p, d_bar_frac=frac),
                             "compute_per_time_unit": theory.compute_per_time_unit(p, k, d_bar_frac=frac),
                             "compute_per_token": theory.compute_per_token(p, k, d_bar_frac=frac)})
    table = pd.DataFrame(rows)
    x = "compute_per_time_unit" if artifact_id == "ppdp.fig3" else "compute_per_token"
    fig, ax = plt.subplots(figsize=(6, 4.2))
    for (t, c), g in table.groupby(["dataset", "trained"], sort=False):
        ax.plot(g[x], g.latency_per_token, "o-" if c == "N" else "s--", label=f"{t}" + ("+tr" if c == "Y" else ""))
        for _, r in g.iterrows():
            ax.annotate(f"k={r.k}", (r[x], r.latency_per_token), fontsize=7, textcoords="offset points", xytext=(3, 3))
    ax.axhline(1.0, color="grey", lw=0.8)
    ax.set_xlabel("average compute per time unit (eq. 5; greedy = 1)" if x == "compute_per_time_unit"
                  else "compute per token (eq. 6; greedy = 1)")
    ax.set_ylabel("latency per token (eq. 3; greedy = 1)")
    ax.set_title(f"PPD trade-off at layer {mid} of {depth} (measured p_correct); {profile}")
    ax.legend(fontsize=8)
    save_figure(fig)
    save_table(table, provenance(greedy, greedy_src, layer=f"{mid} of {depth} (d/2)",
                                 values="limit forms (length -> inf) of Theorem 4.1, normalised to greedy; "
                                        "'tr' / Y = head trained for the layer"))

# %% md
# ## Theory vs simulation vs real decoding
# For each task and k: Theorem 4.1's expected latency with the measured p (per generation
# length), the Monte Carlo mean of the run-length model, and the latency that the observed
# match sequences imply (`theory.latency_from_matches`), in time units (layer forwards) per
# token. The run-length model assumes independent matches; real sequences show whether runs
# are longer (clustered matches) than Geom(1 - p). Sources: the match-rate runs (positions
# >= 2, N head, layer d/2) and the Table 3 benchmark's real PPD decoding (`extra.matches`).

# %%
if artifact_id == "ppdp.theory":
    bench, bench_src = [], []
    for t in ("cnn_dm", "squad"):
        recs, src = load(f"bench_{t}.jsonl")
        bench += [{**r, "task": t, "dataset": greedy_data[t]["dataset"], "stand_in": greedy_data[t]["stand_in"]}
                  for r in recs]
        bench_src.append(src)
    seqs = []  # (source, task, k, d, d_bar, matches)
    for r in greedy:
        ranks = r["early"]["N"][str(mid)]["rank"][1:]
        for k in (1, 3):
            seqs.append(("match-rate run (N head)", r["task"], k, depth, mid, [x < k for x in ranks]))
    for r in bench:
        ex = r.get("extra", {})
        if r["decoder"].startswith("ppd_pipelined") and ex.get("matches") is not None:
            seqs.append(("real PPD decoding (Table 3 run)", r["task"], ex["k"], ex["layers"], ex["exit_layer"],
                         [bool(m) for m in ex["matches"]]))
    rows, runs_seen = [], {}
    for (src, t, k), grp in pd.DataFrame(seqs, columns=["src", "task", "k", "d", "d_bar", "m"]).groupby(
            ["src", "task", "k"], sort=False):
        d, d_bar = int(grp.d.iloc[0]), int(grp.d_bar.iloc[0])
        allm = [x for m in grp.m for x in m]
        p = float(np.mean(allm)) if allm else 0.0
        n_tok = sum(len(m) + 1 for m in grp.m)
        thm = sum(theory.expected_latency(d, d_bar, k, p, len(m) + 1) for m in grp.m)
        sims = [theory.simulate(d, d_bar, k, p, len(m) + 1, n_runs=2000, seed=i) for i, m in enumerate(grp.m)]
        sim = sum(s.latency for s in sims)
        sim_se = float(np.sqrt(sum(s.latency_se ** 2 for s in sims)))
        obs = sum(theory.latency_from_matches(d, d_bar, k, m).latency for m in grp.m)
        runs = []
        for m in grp.m:
            cur = 1
            for x in m:
                if x:
                    cur += 1
                else:
                    runs.append(cur)
                    cur = 1
            runs.append(cur)
        runs_seen[(src, t, k)] = (runs, p)
        rows.append({"source": src, "dataset": LABEL[t], "k": k, "d_bar/d": f"{d_bar}/{d}", "generations": len(grp),
                     "tokens": n_tok, "p_correct": round(p, 4),
                     "theorem_latency_per_token": thm / n_tok / d, "simulated_latency_per_token": sim / n_tok / d,
                     "simulated_se": sim_se / n_tok / d, "observed_latency_per_token": obs / n_tok / d,
                     "mean_run_length_observed": float(np.mean(runs)),
                     "mean_run_length_model": 1 / (1 - p) if p < 1 else np.inf,
                     "longest_run": int(max(runs))})
    table = pd.DataFrame(rows)
    keys = [key for key in runs_seen if key[2] == 1][:6]
    fig, axes = plt.subplots(1, max(1, len(keys)), figsize=(3.2 * max(1, len(keys)), 3), squeeze=False)
    for ax, key in zip(axes[0], keys):
        runs, p = runs_seen[key]
        top = max(runs)
        xs = np.arange(1, top + 1)
        obs_pmf = np.bincount(runs, minlength=top + 1)[1:] / len(runs)
        ax.bar(xs, obs_pmf, alpha=0.6, label="observed")
        ax.plot(xs, (1 - p) * p ** (xs - 1), "r.-", label="Geom(1-p)")
        ax.set_title(f"{LABEL[key[1]]}, k={key[2]}\n{key[0][:24]}", fontsize=8)
        ax.set_xlabel("run length")
    axes[0][0].set_ylabel("fraction of runs")
    axes[0][0].legend(fontsize=7)
    save_figure(fig)
    save_table(table, provenance(greedy + bench, greedy_src + bench_src, layer=f"{mid} of {depth} (d/2)",
                                 values="latency in units of greedy's d layer forwards per token (1 = greedy): "
                                        "theorem = Theorem 4.1 with the measured p; simulated = Monte Carlo of the "
                                        "run-length model (2000 draws per generation; se = standard error); "
                                        "observed = the run accounting of the actual match sequences"))

# %% md
# ## Table 3: greedy vs PPD with k + 1 real workers (`common.bench`)
# Measured: wall time of `generate` on this machine (prefill included) with k + 1 gloo processes.
# On 2 CPU cores the k + 1 workers cannot run in parallel, so the measured latency shows the
# cost of PPD here, not its ideal. Theorem: the latency `theory.latency_from_matches` gives
# for the observed match sequence, times the measured per-layer time of the main worker
# (decode phase only, no prefill, no head or communication time): what k + 1 truly parallel
# workers would achieve.

# %%
if artifact_id == "ppdp.table3":
    bench, bench_src = [], []
    for t in ("cnn_dm", "squad"):
        recs, src = load(f"bench_{t}.jsonl")
        prompt_info = load(f"prompts_{t}.jsonl")[0][0]  # the bench names the prompt file; this names the data
        bench += [{**r, "task": t, "dataset": prompt_info["dataset"], "stand_in": prompt_info["stand_in"]}
                  for r in recs]
        bench_src += [src, str(raw / f"prompts_{t}.jsonl")]
    df = pd.DataFrame(bench)
    rows = []
    for t in ("cnn_dm", "squad"):
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
                d = ex[0]["layers"]
            else:
                d = int(ppd.extra.iloc[0]["layers"]) if len(ppd) else np.nan
                pred = d * layer_s * new if len(ppd) else np.nan
            rows.append({
                "dataset": LABEL[t], "method": "greedy" if dec == "vanilla" else "greedy (w/ PPD)",
                "k": ex[0].get("k") if is_ppd else "-", "workers": (ex[0].get("k") + 1) if is_ppd else 1,
                "prompts": len(h), "mean_new_tokens": new / len(h),
                "p_correct": round(float(np.mean(matches)), 4) if matches else np.nan,
                "measured_latency_s": h.wall_time.mean(),
                "measured_latency_128_s": (h.wall_time.sum() / new) * 128,
                "measured_tokens_per_s": new / h.wall_time.sum(),
                "theorem_latency_128_s": pred / new * 128,
                "theorem_tokens_per_s": new / pred if pred else np.nan,
                "identical_to_greedy": f"{sum(tok == base_tok.get(q) for q, tok in zip(h.question_id, h.tokens))}/{len(h)}",
            })
    table = pd.DataFrame(rows)
    save_table(table, provenance(bench, bench_src,
                                 measured="wall time on this machine, k + 1 gloo processes sharing its cores "
                                          "(prefill included); *_128_s scales the per-token time to 128 tokens",
                                 theorem="Theorem 4.1's accounting of the observed match sequence x one measured "
                                         "per-layer time (main worker, mean over this dataset's PPD runs) for every row: "
                                         "ideal parallel workers, no prefill, head or communication cost; "
                                         "greedy = d layers per token at the same layer time",
                                 data=data_note(bench) + "; prompts rendered with Table 1's templates"))

# %% md
# ## Table 4: the intermediate heads' training recipe (from the checkpoint's metadata)

# %%
if artifact_id == "ppdp.table4":
    hm = json.loads((raw / "heads_meta.json").read_text())
    log = read_jsonl(raw / "heads_train.jsonl")
    c, m = hm["config"], hm["meta"]
    paper = {"Number of Epochs": 3, "Learning Rate": 2e-5, "Batch Size": 128, "Optimizer": "AdamW",
             "Loss Function": "Cross-Entropy", "Max Sequence Length": 2048, "Warmup ratio": 0.04,
             "Weight Decay": 0.0}
    used = {"Number of Epochs": c["epochs"], "Learning Rate": c["lr"], "Batch Size": c["batch_size"],
            "Optimizer": "AdamW", "Loss Function": "Cross-Entropy (next token, reply tokens)",
            "Max Sequence Length": c["max_len"], "Warmup ratio": c["warmup_frac"], "Weight Decay": c["weight_decay"]}
    rows = [{"hyperparameter": k, "paper": str(paper[k]), "used": str(used[k])} for k in paper]
    extra = [("LR schedule", "-", "linear warmup, then linear decay (common.training)"),
             ("Max grad norm", "-", c["max_grad_norm"]), ("Seed", "-", c["seed"]),
             ("Initialization", "-", m["init"]), ("Frozen", "all model parameters", m["frozen"]),
             ("Training data", "ShareGPT", f"{m['dataset']}: {m['sequences']} conversations "
                                          f"({hm['train_tokens']} reply tokens), {m['excluded_eval_conversations']} "
                                          f"evaluation conversations excluded"),
             ("Layers", "each probed layer", ", ".join(map(str, m["layers"]))),
             ("Steps", "-", hm["steps"]), ("Training wall time (s)", "8 A100 GPUs", round(hm["train_wall_s"], 1))]
    rows += [{"hyperparameter": a, "paper": str(b), "used": str(v)} for a, b, v in extra]
    if hm.get("holdout_before") and hm.get("holdout_after"):
        b, a = hm["holdout_before"], hm["holdout_after"]
        for l in m["layers"]:
            x, y = b[str(l)], a[str(l)]
            rows.append({"hyperparameter": f"held-out, layer {l}: CE / top-1 acc / top-1 = final",
                         "paper": "-", "used": f"{x['loss']:.3f} -> {y['loss']:.3f} / {x['acc']:.3f} -> {y['acc']:.3f}"
                                               f" / {x['match_final']:.3f} -> {y['match_final']:.3f}"
                                               f" ({b['tokens']} tokens, before -> after)"})
    table = pd.DataFrame(rows)
    fig, ax = plt.subplots(figsize=(5, 3))
    ax.plot([r["step"] for r in log], [r["loss"] for r in log], ".-")
    ax.set_xlabel("step")
    ax.set_ylabel("training loss (mean CE over layers)")
    ax.set_title(f"PPD intermediate heads, {profile}")
    save_figure(fig)
    rec = {"model": hm["model_name"], "profile": hm["profile"], "device": hm["device"], "dtype": hm["dtype"]}
    meta = provenance([rec], [str(raw / "heads_meta.json"), str(raw / "heads_train.jsonl")])
    meta["data"] = f"{m['dataset']} (first exchange: prompt through the chat template, loss on the reply)"
    meta["note"] = "'used' is read from the checkpoint's metadata, not typed; 'paper' is the paper's Table 4"
    save_table(table, meta)

# %% md
# ## Table 5: match rate under greedy, top-k (k=3) and top-p (0.95) sampling (N head, layer d/2)

# %%
if artifact_id == "ppdp.table5":
    recs, srcs = [], []
    for t in ("cnn_dm", "squad"):
        for mth in ("greedy", "top_k", "top_p"):
            r, s = load(f"sampling_{t}_{mth}.jsonl")
            recs += r
            srcs.append(s)
    S = ranks_frame(recs)
    depth, lay = recs[0]["depth"], recs[0]["layers"]
    mid = depth // 2 if depth // 2 in lay else min(lay, key=lambda l: abs(l - depth / 2))
    names = {"greedy": "Greedy decoding", "top_k": f"Top-k sampling (k={recs[0].get('method_params', {}).get('top_k', 3)})",
             "top_p": "Top-p sampling (p=0.95)"}
    for r in recs:
        if r["method"] == "top_k":
            names["top_k"] = f"Top-k sampling (k={r['method_params']['top_k']})"
        if r["method"] == "top_p":
            names["top_p"] = f"Top-p sampling (p={r['method_params']['top_p']})"
    rows = []
    for mth in ("greedy", "top_k", "top_p"):
        for k in (1, 3):
            row = {"method": names[mth], "early top-k": k}
            for t in ("cnn_dm", "squad"):
                g = S[(S.task == t) & (S.method == mth) & (S.layer == mid) & (S.classifier == "N")]
                row[LABEL[t]] = pct((g["rank"] < k).mean())
            rows.append(row)
    table = pd.DataFrame(rows)
    save_table(table, provenance(recs, srcs, layer=f"{mid} of {depth} (d/2), N head (the model's LM head)",
                                 values="p_correct in %: the token the method chose is among the early top-k",
                                 sampling="temperature 1, seeded per prompt"))

# %% md
# ## Table 1: the prompt templates, as the code used them

# %%
if artifact_id == "ppdp.table1":
    recs, srcs = [], []
    for t in TASKS:
        r, s = load(f"prompts_{t}.jsonl")
        recs += r
        srcs.append(s)
    rows = []
    for t in TASKS:
        r = [x for x in recs if x["task"] == t]
        rows.append({"task": LABEL[t], "paper dataset": r[0]["paper_dataset"], "dataset used": r[0]["dataset"],
                     "prompts": len(r), "template": r[0]["template"],
                     "prompt": r[0]["template_text"].replace("\n", "<br>"), "fields": r[0]["fields_rule"]})
    table = pd.DataFrame(rows)
    meta = provenance(recs, srcs, note="the rendered prompt is then wrapped in the model's chat template "
                                       "(common.prompts.encode_prompt), as in every decoding run")
    meta["profile"] = profile
    save_table(table, meta)

# %%
known = {"ppdp.table1", "ppdp.table2", "ppdp.theory", "ppdp.fig3", "ppdp.fig4", "ppdp.table3", "ppdp.table4",
         "ppdp.table5", "ppdp.table6-8"}
if artifact_id not in known:
    raise ValueError(f"notebook ppd_pipelined does not make {artifact_id!r}; it makes {sorted(known)}")
