# %% parameters
artifact_id = "cross.table"
results_root = "results"
package = "cross"
profile = "embedded"

# %% md
# # Cross-method comparison
# Every decoder registered in this repository on the same model, prompts and machine.
# Computed from the raw benchmark records under `results/` only (written by `common.bench`).

# %%
from pathlib import Path

from common.records import read_jsonl
from common.report import provenance, summarize, write_table

base = Path(results_root) / package
records = read_jsonl(base / "raw" / "bench.jsonl")
meta = {"artifact": artifact_id, **provenance(records), "source": str(base / "raw" / "bench.jsonl")}
meta

# %%
if artifact_id == "cross.table":
    table = summarize(records)
    cols = ["decoder", "prompts", "new_tokens", "tokens_per_s", "speedup", "mean_accepted_length",
            "peak_mem_mib", "identical_to_vanilla"]
    table = table[cols]
    write_table(table, artifact_id, base / "tables", meta)
    print((base / "tables" / f"{artifact_id}.md").read_text())
else:
    raise ValueError(f"notebook cross does not make {artifact_id!r}")
