# Notebook source (tools/make_notebook.py): the generated notebook starts with papermill's parameters
# artifact_id, results_root, package, profile and inputs (the raw records the rule declares).

# %% md
# # Prompt decoding inside speculative decoding's draft (section 5.3)
# Speculative decoding (`speculative`): a draft model proposes a chain of γ tokens, one draft
# forward per token, and the target verifies the chain in one forward. `pd_speculative` makes
# the same chain with parallel prompt decoding *on the draft*: prompt tokens trained on the draft
# (variant `draft`, on the draft's own greedy answers) guess its next tokens, and the draft
# verifies its guesses itself, so the chain is exactly the draft's greedy chain in fewer draft
# forwards (`prompt_decoding/spec.py`'s docstring). Both drafters use the same draft, each
# at every γ of config `prompt_decoding.spec`, run back to back with `vanilla` on each prompt
# (`rules/prompt_decoding.smk`, `pd_spec_bench`); each is compared at its fastest γ. Greedy: every
# output must equal `vanilla`'s, and at one γ both drafters propose the same chains, so their
# accepted lengths per step must be equal too. The paper (Vicuna-68M drafting for Vicuna-7B on
# a GPU): up to 1.22× over speculative decoding alone.

# %%
import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from matplotlib.ticker import MaxNLocator

from common.harness.render import Render, paper_numbers
from common.harness.report import provenance
from prompt_decoding.tables import same_chains, spec_gains, spec_table

R = Render(artifact_id, results_root, package, profile, inputs)  # the declared inputs, staged outputs
inputs = R.inputs
runs = R.runs("spec_")  # dataset -> records
draft_pt = R.find("train_draft_stats.json")  # the draft's prompt tokens
paper = paper_numbers(package)["spec"]
records = [r for recs in runs.values() for r in recs]
drafts = sorted({str(r["decoder_config"]["draft"]) for r in records if r["decoder"] != "vanilla"})
meta = {"model": ", ".join(sorted({r["model"] for r in records})), "draft": ", ".join(drafts),
        "draft prompt tokens": (f"{draft_pt['m']} x {draft_pt['n']} EPT trained on {draft_pt['model']}'s own "
                                f"greedy answers ({draft_pt['steps']} steps, {draft_pt['train_wall_s'] / 60:.1f} min; "
                                f"held-out top-1 per distance {[round(a, 3) for a in draft_pt['heldout_top1']]})"),
        "profile": profile, **provenance(records), "sources": ", ".join(str(p) for p in inputs)}
meta

# %% md
# ## Speed, accepted length and draft cost per decoder and γ
# `tokens_per_s`, `speedup` over `vanilla` (same run), `tau` = tokens per target forward (the
# prefill counts as one step), `draft_tokens_per_forward` = drafted tokens / draft forwards (1
# for `speculative` up to its prefill; more when the draft's prompt tokens guess right),
# `draft_ms_per_step` and `target_ms_per_step` = forward time per target step, `best` = the
# fastest γ of each drafter.

# %%
table = spec_table(runs)
table

# %% md
# ## Prompt decoding in the draft against speculative decoding alone
# Each drafter at its fastest γ; `gain` = `pd_speculative`'s tokens/s over `speculative`'s
# (within one run).

# %%
print("paper:", paper["cite"])
for c in paper["claims"]:
    print("paper:", c)
pairs = spec_gains(table, paper["speedup_over_speculative"])
print(pairs.to_string(index=False))
print(R.trend("prompt decoding in the draft is faster than speculative decoding alone (best gamma each)",
              pairs.gain > 1.0, over=f"gains {pairs.gain.min():.2f}-{pairs.gain.max():.2f}x over {len(pairs)} run(s)"))
print(R.trend("the draft's prompt tokens make more than one draft token per draft forward",
            table[table.drafter == "pd_speculative"].draft_tokens_per_forward > 1.0))
print(R.trend("every output equals vanilla's", [s.split("/")[0] == s.split("/")[1] for s in table.identical_to_vanilla]))
# Same gamma, same chains: the accepted lengths of every step of every prompt agree.
same = same_chains(runs, table.gamma.dropna())
print(R.trend("at equal gamma both drafters' steps accept the same lengths (the same chains)", same))
R.save_table(table, meta)

# %%
fig, axes = plt.subplots(1, 2, figsize=(11, 4))
van = table[table.decoder == "vanilla"]
for drafter, g in table[table.gamma.notna()].groupby("drafter"):
    g = g.sort_values("gamma")
    axes[0].plot(g.gamma, g.tokens_per_s, "o-", label=drafter)
    axes[1].plot(g.gamma, g.draft_tokens_per_forward, "o-", label=drafter)
for v in van.tokens_per_s:
    axes[0].axhline(v, color="grey", lw=0.8, ls="--", label="vanilla")
axes[0].set_title("tokens/s by draft length")
axes[1].set_title("draft tokens per draft forward")
for a in axes:
    a.set_xlabel("gamma (draft tokens per target step)")
    a.xaxis.set_major_locator(MaxNLocator(integer=True))
    a.legend(fontsize=8)
fig.suptitle(f"{meta['model']} (draft {meta['draft']}), {profile}, {meta.get('device')}", fontsize=9)
R.save_figure(fig)

# %%
R.publish()  # last step: tables and figure move into place only when all of it worked
