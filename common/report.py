"""From raw benchmark records to summary tables (used by ``common.bench`` and the notebooks).

Which averages: ``tokens_per_s`` is a ratio of totals (every new token of a decoder over its
summed wall time), so prompts with long answers weigh more than a mean of per-prompt rates
would let them; ``speedup`` is that ratio over vanilla's on the same prompts in the same run.
``mean_accepted_length`` is likewise total new tokens over total target forwards (steps).
"""
from __future__ import annotations

from pathlib import Path

import pandas as pd


def summarize(records: list[dict], baseline: str = "vanilla") -> pd.DataFrame:
    """One row per decoder: prompts, tokens/s, speedup, mean accepted length, peak memory,
    and whether every output equals the baseline's on the same prompt."""
    df = pd.DataFrame(records)
    base = df[df.decoder == baseline].set_index("question_id")["tokens"] if baseline in set(df.decoder) else None
    rows = []
    for name, g in df.groupby("decoder", sort=False):
        row = {
            "decoder": name,
            "prompts": len(g),
            "new_tokens": int(g.new_tokens.sum()),
            "tokens_per_s": g.new_tokens.sum() / g.wall_time.sum(),
            "mean_accepted_length": g.new_tokens.sum() / g.steps.sum(),
            "peak_mem_mib": g.peak_mem_bytes.max() / 2**20,
        }
        if base is not None:
            same = [t == base.get(q) for q, t in zip(g.question_id, g.tokens)]
            row["identical_to_vanilla"] = f"{sum(same)}/{len(same)}"
        rows.append(row)
    out = pd.DataFrame(rows)
    if base is not None:
        out["speedup"] = out.tokens_per_s / out.loc[out.decoder == baseline, "tokens_per_s"].iloc[0]
    return out


def provenance(records: list[dict]) -> dict:
    """Model, data, profile and hardware named by the records (each must be unique)."""
    df = pd.DataFrame(records)
    keys = ["model", "dataset", "profile", "device", "dtype", "max_new_tokens"]
    return {k: ", ".join(sorted(map(str, df[k].unique()))) for k in keys if k in df}


def write_table(df: pd.DataFrame, artifact_id: str, out_dir: Path, meta: dict, floatfmt: str = ".3f") -> None:
    """Write ``tables/<id>.csv`` and ``tables/<id>.md``; the markdown names its provenance."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    df.to_csv(out_dir / f"{artifact_id}.csv", index=False)
    head = "\n".join(f"- **{k}**: {v}" for k, v in meta.items())
    md = f"# {artifact_id}\n\n{head}\n\n{df.to_markdown(index=False, floatfmt=floatfmt)}\n"
    (out_dir / f"{artifact_id}.md").write_text(md)
