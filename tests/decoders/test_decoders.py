"""The decoder contract and the lossless baselines."""
import pytest
import torch

from common.decoders import DECODERS, get_decoder
from common.errors import UserError

LOSSLESS = ["vanilla", "hf_generate", "prompt_lookup"]


def test_contract_on_tiny(tiny):
    ids = torch.tensor([[1, 5, 6, 7, 5, 6]])
    outs = {n: get_decoder(n, tiny).generate(ids, 20) for n in LOSSLESS}
    ref = outs["vanilla"].tokens
    assert 1 <= len(ref) <= 20
    for name, o in outs.items():
        assert o.tokens == ref, name
        st = o.stats
        assert st["new_tokens"] == len(o.tokens) and sum(st["accept_lengths"]) == len(o.tokens)
        assert st["steps"] == len(st["accept_lengths"]) and st["wall_time"] > 0


def test_vanilla_stops_after_eos(tiny):
    ids = torch.tensor([[1, 5, 6]])
    tokens = get_decoder("vanilla", tiny).generate(ids, 30).tokens
    eos = tiny.generation_config.eos_token_id
    forced = get_decoder("vanilla", tiny)
    stop = tokens[2]  # pretend this token is EOS: generation must stop right after its first use
    forced.eos = {stop}
    assert forced.generate(ids, 30).tokens == tokens[: tokens.index(stop) + 1]
    assert eos not in tokens[:-1]


def test_bad_decoder_input(tiny):
    with pytest.raises(UserError, match="unknown decoder 'nope'; valid: .*vanilla"):
        get_decoder("nope", tiny)
    with pytest.raises(UserError, match="max_new_tokens=0"):
        get_decoder("vanilla", tiny).generate(torch.tensor([[1, 2]]), 0)
    with pytest.raises(UserError, match="no option"):
        get_decoder("vanilla", tiny, gamma=3)
    with pytest.raises(UserError, match="num_tokens=0"):
        get_decoder("prompt_lookup", tiny, num_tokens=0)


@pytest.mark.model
def test_embedded_lossless_on_mt_bench(embedded):
    """vanilla == hf_generate == prompt_lookup == self_speculative on real prompts with the real
    model (fp32). Decoders with trained parts (medusa, speculative, hf_assisted, ppd_pipelined)
    are checked on the real model by the smoke DAG (tests/workflow/test_cli_dag.py)."""
    from common.assets.data import load_dataset_samples
    from common.assets.prompts import encode_prompt

    model, tok = embedded
    for s in load_dataset_samples("mt-bench", n=3):
        ids = encode_prompt(tok, s.turns[0])
        outs = {n: get_decoder(n, model, tok).generate(ids, 40).tokens for n in [*LOSSLESS, "self_speculative"]}
        assert len(outs["vanilla"]) > 0
        assert outs["hf_generate"] == outs["vanilla"], s.question_id
        assert outs["prompt_lookup"] == outs["vanilla"], s.question_id
        assert outs["self_speculative"] == outs["vanilla"], s.question_id
    assert set(LOSSLESS) <= set(DECODERS)
