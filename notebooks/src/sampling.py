# Notebook source (tools/make_notebook.py): the generated notebook starts with papermill's parameters
# artifact_id, results_root, package, profile and inputs (the raw records the rule declares).

# %% md
# # Lossless sampling, checked against the exact distribution
# A decoder called lossless must, above temperature 0, draw its tokens from exactly the distribution the
# target model samples (after temperature, top-k and top-p, in transformers' order): speculative sampling's
# acceptance rule, recursive rejection on a drafted tree, or keeping only what the target itself would have
# drawn. This table checks that claim for every registered lossless decoder (`tools/sampling_report.py`,
# rule `sampling_part`: a record per decoder and one of the controls under `cross/raw/sampling/`, merged
# here). On a tiny random LLaMA made peaked, the
# exact distribution of the first new tokens is enumerated; each decoder option set then draws that many
# sequences with seeds 0..N-1 and a G-test compares the counts with the enumeration (cells expected below 5
# pooled; a sequence of probability 0 fails outright). A row passes when the test does not reject at alpha
# and the same seed gives the same tokens. Two negative controls (a wrong acceptance rule, and vanilla at the
# wrong temperature) must be rejected by the same test at the same draws: they show it can fail. Where the
# record has it, a two-sample run on the profile's model compares each decoder's first tokens with
# vanilla's (its distribution cannot be enumerated: reported, not asserted).

# %%
import json
from pathlib import Path

from common.harness.render import Render
from common.harness.sampling_tables import (lossy_note, merge_records, sampling_meta, sampling_table,
                                            sampling_verdicts)

R = Render(artifact_id, results_root, package, profile, inputs)
record = merge_records([json.loads(Path(p).read_text()) for p in R.inputs], [Path(p).name for p in R.inputs])
meta = {**sampling_meta(record), "sources": ", ".join(Path(p).name for p in R.inputs)}
note = lossy_note(record)
if note:
    meta = {"not tested": note, **meta}
meta

# %%
table = sampling_table(record)
for line in sampling_verdicts(record):
    R.verdict(line)
R.no_paper_numbers("No paper reports these tests: each method's paper proves its rule lossless (or, for "
                   "Medusa's typical acceptance, says it is not); this table checks the code against the "
                   "target's exact distribution instead.")
R.save_table(table, meta, floatfmt=".3g")  # p-values span many orders: three significant digits, not decimals

# %%
R.publish()  # last step: the table moves into place only when all of it worked
