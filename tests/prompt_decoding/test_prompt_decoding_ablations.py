"""Appendix B's ablation options of the prompt tokens (prompt_decoding.prompt_tokens.Extras) on a tiny
random LLaMA: each does what the paper describes and nothing else (the defaults leave the
method and its checkpoints as they were), the decoder serves the ones it can run exactly and
refuses the others, and the config's variant references are checked."""
import pytest
import torch

from decoding_checks import assert_exact_and_accepting, frozen
from common.errors import UserError
from common.engine.forward import embed, final_norm, num_layers
from common.training.seqtrain import teacher_forward
from common.training.loop import save_trained
from prompt_decoding.decoding import new_prompts, prompts_meta
from prompt_decoding.prompt_tokens import Extras
from prompt_decoding.train import cut_logits

IDS = torch.randint(3, 96, (20,), generator=torch.Generator().manual_seed(4))
CUTS = torch.tensor([5, 9, 14])


def student(model, prompts, ids=IDS, cuts=CUTS):
    cache, _, _ = teacher_forward(model, ids)
    out = cut_logits(model, prompts, cache, cuts, ids.numel())
    assert cache.get_seq_length() == ids.numel()  # prefix and prompt positions dropped again
    return out


def test_defaults_are_the_papers_method_and_keep_old_metas(chaotic_llama):
    assert Extras().meta() == {}
    assert prompts_meta(chaotic_llama, 3, 1, "ensemble", Extras()) == prompts_meta(chaotic_llama, 3, 1, "ensemble")
    e = Extras(aggregation="learned", head=True, prefix=2, exits=3)
    assert e.meta() == {"aggregation": "learned", "head": True, "prefix": 2, "exits": 3}
    assert Extras.from_meta({"m": 3, **e.meta()}) == e
    for bad, match in (({"aggregation": "max"}, "valid: average, learned"), ({"prefix": -1}, "prefix"),
                       ({"exits": 0}, "exits")):
        with pytest.raises(UserError, match=match):
            Extras(**bad)


@torch.no_grad()
def test_learned_weights_and_custom_head_start_as_the_plain_method(chaotic_llama):
    """Learned EPT weights start at 1/n (the average) and the custom head as a copy of the LM
    head, so before training both give the plain method's guesses; then they move apart."""
    model = chaotic_llama
    base = new_prompts(model, 2, 3, seed=1)
    want = student(model, base)
    for extras in (Extras(aggregation="learned"), Extras(head=True)):
        p = new_prompts(model, 2, 3, seed=1, extras=extras)
        assert torch.allclose(student(model, p), want, atol=1e-5), extras
    p = new_prompts(model, 2, 3, seed=1, extras=Extras(aggregation="learned", head=True))
    assert sum(x.numel() for x in p.parameters()) == 2 * 3 * model.config.hidden_size + 2 * 3 + \
        model.lm_head.weight.numel()
    p.weights[0].copy_(torch.tensor([1.0, 0.0, 0.0]))           # prompt token 0 reads only its first EPT
    h = torch.randn(5, 6, model.config.hidden_size)
    out = p.readout(h, model.lm_head)
    assert torch.allclose(out[:, 0], p.head(h[:, 0]), atol=1e-5)
    assert torch.allclose(out[:, 1], p.head(h[:, 3:6]).mean(1), atol=1e-5)
    assert p.readout(h[:, :3], model.lm_head).shape[1] == 1       # a node carrying fewer prompt tokens


def test_prefix_is_seen_only_by_its_own_prompt_token_and_trains(chaotic_llama):
    """Prompt token j attends to prefix j alone: changing the last prompt token's prefix changes
    its guesses and no earlier one's (earlier ones never see later positions); the prefix keys
    and values of every layer get gradients."""
    model = chaotic_llama
    p = new_prompts(model, 3, 2, seed=2, extras=Extras(prefix=1))
    d = num_layers(model)
    assert p.prefix_kv.shape[:4] == (d, 2, model.config.num_key_value_heads, 3)
    with torch.no_grad():
        p.embeddings.mul_(50.0)
        before = student(model, p)
        p.prefix_kv[:, :, :, 2].add_(torch.randn_like(p.prefix_kv[:, :, :, 2]) * 5)
        after = student(model, p)
    assert torch.allclose(before[:, :2], after[:, :2], atol=1e-5)
    assert not torch.allclose(before[:, 2], after[:, 2], atol=1e-3)
    with frozen(model):
        student(model, p).float().logsumexp(-1).sum().backward()
    assert all(float(p.prefix_kv.grad[layer].abs().sum()) > 0 for layer in range(d))


@torch.no_grad()
def test_multi_exit_averages_the_last_layers_outputs(chaotic_llama):
    """exits=k: a prompt token's state is the mean of the last k layers' outputs, then the final
    norm and the head (checked against hooks on a plain forward over prefix ++ prompt token)."""
    model = chaotic_llama
    d = num_layers(model)
    p = new_prompts(model, 1, 1, seed=3, extras=Extras(exits=2))
    p.embeddings.mul_(50.0)
    t = 9
    got = student(model, p, cuts=torch.tensor([t]))[0, 0]
    outs = {}
    hooks = [model.model.layers[i].register_forward_hook(
        lambda mod, args, out, i=i: outs.__setitem__(i, out[0] if isinstance(out, tuple) else out)) for i in (d - 2, d - 1)]
    try:
        seq = torch.cat([embed(model, IDS[None, :t + 1])[0], p.embeddings[0]])
        model(inputs_embeds=seq[None])
    finally:
        for h in hooks:
            h.remove()
    mean = (outs[d - 2][0, -1] + outs[d - 1][0, -1]) / 2
    assert torch.allclose(got, model.lm_head(final_norm(model, mean)), atol=1e-4)


def test_two_stage_training_starts_from_the_first_stage(chaotic_llama, tmp_path):
    from decoding_checks import WordTokenizer, greedy_sequences
    from common.config import TrainConfig
    from common.training.loop import Stopping
    from prompt_decoding.train import PromptRecipe, train_prompts

    model = chaotic_llama
    with frozen(model):
        data = {"train": greedy_sequences(model, 4), "heldout": greedy_sequences(model, 2, seed=50)}
        cfg = TrainConfig(lr=1e-2, epochs=5, batch_size=2, warmup_frac=0.0, schedule="cosine", max_steps=3)
        train_prompts(model, WordTokenizer(), data, tmp_path / "s1", cfg, Stopping(eval_every=3),
                      PromptRecipe(m=2, n=1, cuts=4))
        s1 = torch.load(tmp_path / "s1" / "prompts.pt", weights_only=False)["module"]["embeddings"]
        cfg0 = TrainConfig(lr=1e-3, epochs=5, batch_size=2, warmup_frac=0.0, schedule="cosine", max_steps=1)
        stats = train_prompts(model, WordTokenizer(), data, tmp_path / "s2", cfg0, Stopping(eval_every=3),
                              PromptRecipe(m=2, n=1, cuts=4, extras=Extras(head=True),
                                           init_from=tmp_path / "s1" / "prompts.pt"))
        with pytest.raises(UserError, match="m: 2 there, 3 here"):
            train_prompts(model, WordTokenizer(), data, tmp_path / "s3", cfg0, Stopping(eval_every=3),
                          PromptRecipe(m=3, n=1, cuts=4, init_from=tmp_path / "s1" / "prompts.pt"))
    state = torch.load(tmp_path / "s2" / "prompts.pt", weights_only=False)
    assert state["identity"]["meta"]["init_from"] == str(tmp_path / "s1" / "prompts.pt")
    assert stats["stage1_steps"] == 3 and stats["head"] is True
    moved = (state["module"]["embeddings"] - s1).abs().max()
    assert 0 < moved < 0.01          # one step at lr 1e-3 from the first stage, not from the text init
    assert_exact_and_accepting(model, "prompt_decoding", prompts=2, prompt_tokens=str(tmp_path / "s2"), tree=8)


def test_decoder_serves_learned_weights_and_head_exactly_and_refuses_prefix_and_exits(chaotic_llama, tmp_path,
                                                                                        one_thread):
    from common.decoders import get_decoder

    model = chaotic_llama
    e = Extras(aggregation="learned", head=True)
    p = new_prompts(model, 3, 2, seed=5, extras=e)
    with torch.no_grad():
        p.weights.copy_(torch.rand(3, 2))
    save_trained(p, tmp_path / "lh" / "prompts.pt", prompts_meta(model, 3, 2, "ensemble", e))
    assert_exact_and_accepting(model, "prompt_decoding", prompt_tokens=str(tmp_path / "lh"), tree=20)
    for extras, what in ((Extras(prefix=1), "prefix tuning"), (Extras(exits=2), "a multi-exit")):
        folder = tmp_path / what.replace(" ", "_")
        save_trained(new_prompts(model, 2, 1, extras=extras), folder / "prompts.pt",
                     prompts_meta(model, 2, 1, "ensemble", extras))
        with pytest.raises(UserError, match=f"trained with {what}.*valid for decoding"):
            get_decoder("prompt_decoding", model, prompt_tokens=str(folder))


def test_config_refuses_unknown_or_misshapen_variant_references():
    import copy

    from common.config import check_variant_refs, load_config

    raw = load_config()["profiles"]["embedded"]
    check_variant_refs("embedded", raw)
    for edit, match in ((lambda s: s["ablation"].__setitem__("table4", ["main", "prefx"]), "no variant prefx"),
                        (lambda s: s["variants"]["head2"].__setitem__("init_from", "head2"), "not another variant"),
                        (lambda s: s["variants"]["head2"].__setitem__("init_from", "ept10"), "same shape")):
        bad = copy.deepcopy(raw)
        edit(bad["prompt_decoding"])
        with pytest.raises(UserError, match=match):
            check_variant_refs("embedded", bad)
