# %% parameters
artifact_id = "cross.table"
results_root = "results"
package = "cross"
profile = "embedded"

# %% md
# # Cross-method comparison
# Every decoder registered in this repository on the same model, prompts and machine.
# Each benchmark group (`results/<root>/cross/raw/bench_<group>.jsonl`) ran its decoders
# interleaved per prompt with its own `vanilla` baseline, so every speedup is a ratio measured
# within one run. Computed from the raw records only (written by `common.bench`).

# %%
from pathlib import Path

import pandas as pd

from common.records import read_jsonl
from common.report import provenance, summarize, write_table

base = Path(results_root) / package
files = sorted((base / "raw").glob("bench_*.jsonl"))
groups = {f.stem.removeprefix("bench_"): read_jsonl(f) for f in files}
records = [r for recs in groups.values() for r in recs]
meta = {"artifact": artifact_id, **provenance(records), "sources": ", ".join(str(f) for f in files)}
meta

# %%
if artifact_id == "cross.table":
    rows = []
    for g, recs in groups.items():
        t = summarize(recs)
        t.insert(0, "group", g)
        rows.append(t)
    table = pd.concat(rows, ignore_index=True)
    cols = ["group", "decoder", "prompts", "new_tokens", "tokens_per_s", "speedup", "mean_accepted_length",
            "peak_mem_mib", "identical_to_vanilla"]
    table = table[cols]
    write_table(table, artifact_id, base / "tables", meta)
    print((base / "tables" / f"{artifact_id}.md").read_text())
else:
    raise ValueError(f"notebook cross does not make {artifact_id!r}")
