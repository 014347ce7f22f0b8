# Notebook source (tools/make_notebook.py): the generated notebook starts with papermill's parameters
# artifact_id, results_root, package, profile and inputs (the raw records the rule declares).

# %% md
# # BiLD: model configurations (Table 2)
# The large and small models of each task, read from their configs by `python -m bild.model_configs`
# (instantiated on the meta device: parameter counts without loading weights). In the paper the
# pairs are T5-small/large (summarization) and mT5-small/large (translation); in the embedded
# profile the large model is SmolLM2-135M-Instruct and the small model its first layers with the
# final norm and the shared embeddings and head (the draft family of `common.components.draft_model`; its parameter
# count includes the shared embeddings, as the decoder loads them).

# %%
import pandas as pd

from common.harness.render import Render
from common.records import read_jsonl

R = Render(artifact_id, results_root, package, profile, inputs)
df = pd.DataFrame(read_jsonl(R.inputs[0]))
meta = {"profile": ", ".join(sorted(df.profile.unique())),
        "models": "read from each model's config (python -m bild.model_configs)", "hardware": "none (no weights loaded)",
        "sources": str(R.inputs[0])}
meta

# %% md
# The paper's Table 2 lists, per model pair, the layers (encoder + decoder), model and FFN widths
# and the parameter counts: T5-small 60 M / T5-large 770 M, mT5-small 300 M / mT5-large 1.2 B.

# %%
table = df[["task", "role", "model", "kind", "layers", "d_model", "ffn", "heads", "kv_heads", "vocab", "params"]].copy()
table["params_m"] = table.pop("params") / 1e6
large = table[table.role == "large"].set_index("task").params_m
table["share_of_large"] = [p / large[t] for t, p in zip(table.task, table.params_m)]
R.setup_only("the model pairs' sizes")
R.no_paper_numbers("The paper's Table 2 lists its model pairs (see the markdown above); this table states the embedded "
                   "pairs: a setup, no measurement.")
R.save_table(table, meta, floatfmt=".2f")

# %%
R.publish()
