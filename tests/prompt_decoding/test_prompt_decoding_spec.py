"""Prompt decoding inside speculative decoding's draft (decoder ``pd_speculative``) on tiny random
LLaMAs: vanilla's greedy tokens whatever the draft and its prompt tokens; exactly the chains
``speculative`` proposes with the same draft; after the target rejects, the draft's cache and
the prompt-token states its next guesses come from are those of the committed sequence; bad
options end in one UserError naming what is valid."""
import copy
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from common.decoders import get_decoder
from common.errors import UserError
from common.assets.models import tiny_llama, tiny_t5
from common.training.loop import save_trained
from prompt_decoding.decoding import new_prompts, prompts_meta
from decoding_checks import SPEC_PROMPTS

PROMPTS = SPEC_PROMPTS

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def target(chaotic_llama):
    return chaotic_llama


def draft_prompts(draft, folder, m=3, n=1, scale=50.0, seed=3):
    """Random prompt tokens trained "for" ``draft`` (scaled up, so they sway the guesses)."""
    p = new_prompts(draft, m, n, "ensemble", seed=seed)
    with torch.no_grad():
        p.embeddings.mul_(scale)
    save_trained(p, folder / "prompts.pt", prompts_meta(draft, m, n, "ensemble"))
    return str(folder)


def recorded(dec):
    """Make ``dec`` record every proposal: (committed tokens, proposed tokens)."""
    seen = []
    make = dec.make_proposer

    def wrapped(ids):
        p = make(ids)
        propose = p.propose

        def spy(state):
            out = propose(state)
            seen.append((len(state.tokens), out.tokens.tolist()))
            return out
        p.propose = spy
        return p
    dec.make_proposer = wrapped
    return seen


def oracle(draft, wrong_every=3):
    """Guesses from the draft's true greedy continuation (``PromptProposer.guesses``' contract:
    ``[k, width]`` for depths ``1..k`` below the root, the last of ``state.tokens``): rank 0
    right except at every ``wrong_every``-th position, where rank 1 is right, so draft trees
    accept long paths, through branches too, and reject some."""
    vanilla = get_decoder("vanilla", draft)

    def guesses(self, state):
        ids = torch.cat([state.prompt, torch.tensor([state.tokens], dtype=torch.long)], dim=1)
        k, width, vocab = self.source.shape[0] // self.prompts.n, self.width, draft.config.vocab_size
        cont = vanilla.generate(ids, k).tokens                          # depths 1..k below the root
        out = torch.zeros(k, width, dtype=torch.long)
        for j in range(k):
            right = cont[j] if j < len(cont) else 0
            wrong = [(right + 1 + r) % vocab for r in range(width)]
            miss = (len(state.tokens) + j) % wrong_every == 0 and width > 1
            out[j] = torch.tensor([wrong[0], right, *wrong[2:]] if miss else [right, *wrong[1:]])
        return out
    return guesses


@pytest.mark.parametrize("draft", ["random", "near", "self"])
@pytest.mark.parametrize("gamma,shape", [(1, "dynamic"), (2, "static"), (4, "dynamic")])
def test_equals_vanilla_with_random_prompt_tokens(target, spec_drafts, tmp_path, draft, gamma, shape):
    folder = draft_prompts(spec_drafts[draft], tmp_path / "pt")
    dec = get_decoder("pd_speculative", target, draft=spec_drafts[draft], prompt_tokens=folder, gamma=gamma, tree=12,
                      shape=shape)
    vanilla = get_decoder("vanilla", target)
    for prompt in PROMPTS:
        ids = torch.tensor([prompt])
        for n in (1, 7, 30):
            out = dec.generate(ids, n)
            assert out.tokens == vanilla.generate(ids, n).tokens, (prompt, n)
            acc = out.stats["accept_lengths"]
            assert acc[0] == 1 and all(1 <= a <= gamma + 1 for a in acc) and out.stats["steps"] == len(acc)


@pytest.mark.parametrize("draft", ["random", "near", "self"])
@pytest.mark.parametrize("guesses", ["random", "oracle"])
def test_proposals_are_speculatives_in_fewer_draft_forwards(target, spec_drafts, tmp_path, draft, guesses):
    """Step by step the same chains as ``speculative`` on the same draft (so the same accepted
    lengths); with guesses that are often right, in fewer draft forwards."""
    folder = draft_prompts(spec_drafts[draft], tmp_path / "pt")
    gamma = 4
    ppd = get_decoder("pd_speculative", target, draft=spec_drafts[draft], prompt_tokens=folder, gamma=gamma, tree=16)
    spec = get_decoder("speculative", target, draft=spec_drafts[draft], gamma=gamma)
    seen_p, seen_s = recorded(ppd), recorded(spec)
    if guesses == "oracle":
        make = ppd.make_proposer

        def with_oracle(ids):
            p = make(ids)
            p.inner.guesses = oracle(spec_drafts[draft]).__get__(p.inner)
            return p
        ppd.make_proposer = with_oracle
    forwards = {"pd": 0, "spec": 0}
    for prompt in PROMPTS:
        ids = torch.tensor([prompt])
        a, b = ppd.generate(ids, 30), spec.generate(ids, 30)
        assert a.tokens == b.tokens and a.stats["accept_lengths"] == b.stats["accept_lengths"], prompt
        forwards["pd"] += a.stats["draft_forwards"]
        forwards["spec"] += b.stats["draft_forwards"]
        st = a.stats
        assert st["draft_tokens"] == sum(st["proposed"]) and st["target_forwards"] == st["steps"]
        assert st["draft_tokens_per_forward"] == pytest.approx(st["draft_tokens"] / st["draft_forwards"])
    assert seen_p == seen_s
    if guesses == "oracle":
        assert forwards["pd"] < 0.7 * forwards["spec"], forwards


def test_guesses_after_a_rejection_come_from_the_committed_sequence(target, spec_drafts, tmp_path):
    """Whenever the draft's next guesses are set (after a draft step, after the target's step,
    after a catch-up), they come from the prompt tokens of the draft's last cached position: the
    same states a plain causal forward of the prompt tokens after the draft's cache gives. With
    a near draft the target rejects often, so the rows kept from earlier draft steps are used."""
    draft = spec_drafts["near"]
    folder = draft_prompts(draft, tmp_path / "pt", scale=1.0)
    dec = get_decoder("pd_speculative", target, draft=draft, prompt_tokens=folder, gamma=4, tree=16)
    checked = []
    make = dec.make_proposer

    def checking(ids):
        p = make(ids)
        resume = p.inner.resume

        def check(rows):
            resume(rows)
            if rows is None:
                return
            L, k = p.draft.length, rows.shape[0]
            cache = copy.deepcopy(p.draft.cache)
            emb = p.inner.prompts.embeddings[:k, 0][None]             # one EPT: a causal block
            out = draft(inputs_embeds=emb, past_key_values=cache, position_ids=torch.arange(L, L + k)[None],
                        output_hidden_states=True)
            assert torch.allclose(rows, out.hidden_states[-1][0], atol=1e-4)
            checked.append(L)
        p.inner.resume = check
        return p
    dec.make_proposer = checking
    rejected = 0
    for prompt in PROMPTS:
        ids = torch.tensor([prompt])
        out = dec.generate(ids, 30)
        assert out.tokens == get_decoder("vanilla", target).generate(ids, 30).tokens
        rejected += sum(a < p for a, p in zip(out.stats["accepted"][1:], out.stats["proposed"][1:]))
    assert rejected > 5 and len(checked) > 20


def test_bad_options_name_what_is_valid(target, spec_drafts, tmp_path):
    draft = spec_drafts["near"]
    ok = {"draft": draft, "prompt_tokens": draft_prompts(draft, tmp_path / "pt")}
    cases = [
        ({"prompt_tokens": ok["prompt_tokens"]}, "needs a draft model; set option draft="),
        ({"draft": draft}, "needs prompt_tokens=<folder with prompts.pt>"),
        ({**ok, "prompt_tokens": str(tmp_path / "none")}, "does not exist"),
        ({**ok, "gamma": 0}, "option gamma=0 is invalid; valid: an integer >= 1"),
        ({**ok, "tree": 1}, "tree=1 is out of range; valid: 2..512 verified positions"),
        ({**ok, "shape": "round"}, "valid: one of 'dynamic', 'static'"),
        ({**ok, "acceptance": "typical"}, "cannot use acceptance='typical'; valid: greedy"),
        ({**ok, "draft": tiny_llama(seed=2, layers=1, vocab=80)}, "draft vocabulary size 80 differs"),
        ({**ok, "depth": 3}, "has no option(s) ['depth']"),
    ]
    for opts, msg in cases:
        with pytest.raises(UserError, match=re.escape(msg)):
            get_decoder("pd_speculative", target, **opts)
    # prompt tokens trained for the target, not for the draft
    with pytest.raises(UserError, match="trained for another model or setting .*layers: 4 there, 1 here"):
        get_decoder("pd_speculative", target, draft=spec_drafts["random"], prompt_tokens=draft_prompts(target, tmp_path / "t"))
    with pytest.raises(UserError, match="needs a causal LM"):
        get_decoder("pd_speculative", tiny_t5(seed=0), **ok)


def test_training_refuses_another_models_answers(target, spec_drafts, tmp_path):
    """Prompt tokens for the draft learn the draft's greedy continuation: trained on the
    target's answers, the trainer stops with what to build instead; on its own, it trains."""
    from decoding_checks import WordTokenizer, frozen, greedy_sequences
    from common.config import TrainConfig
    from common.training.loop import Stopping
    from prompt_decoding.train import PromptRecipe, own_greedy_rate, train_prompts

    draft = spec_drafts["random"]
    theirs = greedy_sequences(target, 2, seed=50)
    assert own_greedy_rate(target, *zip(*theirs)) > 0.95 and own_greedy_rate(draft, *zip(*theirs)) < 0.5
    cfg = TrainConfig(lr=1e-2, epochs=1, batch_size=1, warmup_frac=0.0, schedule="cosine", max_steps=2)
    with frozen(draft):
        with pytest.raises(UserError, match="not this model's own greedy answers .*python -m common.training.corpus answers"):
            train_prompts(draft, WordTokenizer(), {"train": theirs, "heldout": theirs}, tmp_path / "x", cfg,
                          Stopping(eval_every=2), PromptRecipe(m=2, n=1, cuts=2))
        own = greedy_sequences(draft, 2, seed=50)
        stats = train_prompts(draft, WordTokenizer(), {"train": own, "heldout": own}, tmp_path / "ok", cfg,
                              Stopping(eval_every=2), PromptRecipe(m=2, n=1, cuts=2))
    assert stats["heldout_own_greedy"] > 0.95
    out = get_decoder("pd_speculative", target, draft=draft, prompt_tokens=str(tmp_path / "ok"), gamma=3)
    ids = torch.tensor([PROMPTS[0]])
    assert out.generate(ids, 20).tokens == get_decoder("vanilla", target).generate(ids, 20).tokens


def test_the_plan_trains_the_drafts_prompt_tokens_on_the_drafts_own_answers():
    """pd.spec's embedded plan: variant draft's corpora are the draft's own greedy answers (to
    the profile's corpus prompts), its prompt tokens train on the draft, and the benchmark runs
    both drafters on that draft at every configured gamma."""
    from common.config import load_profile

    spec = load_profile(profile="embedded").raw["prompt_decoding"]["spec"]
    r = subprocess.run([sys.executable, "-m", "snakemake", "-n", "-F", "--nolock", "-p", "pd_spec",
                        "--config", "profile=embedded", "rerun=true"], cwd=Path(__file__).resolve().parents[2],
                       capture_output=True, text=True, timeout=600)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-3000:]
    draft, own = ".cache/components/embedded/draft/model", ".cache/components/embedded/prompt_tokens/draft"
    assert f"-m common.training.corpus answers --model {draft} --out {own}/corpus.pt --prompts 32 " in out
    assert f"-m common.training.corpus answers --model {draft} --out {own}/seqcorpus.pt --prompts 320 --skip 32 " in out
    assert (f"-m prompt_decoding.train --model {draft} --out {own} --corpus {own}/seqcorpus.pt" in out
            and f"--heldout-corpus {own}/corpus.pt" in out)
    labels = ["vanilla", *(f"speculative@g{g}" for g in spec["gamma"]), *(f"pd_speculative@g{g}" for g in spec["pd_gamma"])]
    assert f"--decoders {','.join(labels)} --dataset mt-bench" in out
    cfg = json.loads(re.search(r"--decoder-config '([^']*)' --resume --out \S*spec_mt-bench", out).group(1))
    assert {c["draft"] for c in cfg.values()} == {draft}
    assert all(c["prompt_tokens"] == own for k, c in cfg.items() if k.startswith("pd_speculative"))
