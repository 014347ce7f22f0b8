"""Self-speculative decoding's searched skipped-layer set (common.components.skip_search) on a
tiny random model: the objective agrees with what the decoder does, the search is seeded and
keeps its history, and the decoder takes the set by option and says which set it ran."""
import json

import pytest
import torch

from common.components.skip_search import draft_agreement, score, search, simulate
from common.decoders import get_decoder
from common.errors import UserError
from common.engine.forward import num_layers

pytestmark = pytest.mark.usefixtures("one_thread")


def _greedy(model, prompt, n=24):
    ids = torch.tensor([prompt])
    return torch.cat([ids[0], torch.tensor(get_decoder("vanilla", model).generate(ids, n).tokens)]), len(prompt)


def test_simulate_counts_chain_steps():
    flags = torch.tensor([True, True, False, True, True, True, True, False])
    # gamma 2: [T T]+1 -> 3 tokens; [T T]+1 (positions 3, 4, then 5) -> 3; [T]+end... positions 6, 7
    assert simulate(flags, 2) == (8, 3)
    assert simulate(torch.zeros(5, dtype=torch.bool), 4) == (5, 5)   # nothing agrees: one token a step


def test_full_model_as_draft_always_agrees(chaotic_llama):
    seq, start = _greedy(chaotic_llama, [1, 5, 6, 7])
    assert bool(draft_agreement(chaotic_llama, seq, start, []).all())


@pytest.mark.parametrize("skip", [[1], [2], [1, 2]])
def test_objective_matches_the_decoder(chaotic_llama, skip):
    """Tokens a step from one teacher-forced draft pass equal the decoder's own (greedy, constant
    gamma): the search scores what self_speculative would do."""
    model, gamma = chaotic_llama, 3
    prompt = [1, 40, 41, 42, 43]
    seq, start = _greedy(model, prompt)
    out = get_decoder("self_speculative", model, skip=skip, gamma=gamma).generate(torch.tensor([prompt]),
                                                                                  seq.numel() - start)
    assert out.tokens == seq[start:].tolist()
    steps = len(out.stats["accepted"]) - 1                       # the prefill's step is not drafted
    assert score(model, [(seq, start)], skip, gamma)["tokens_per_step"] == pytest.approx((len(out.tokens) - 1) / steps)


def test_search_is_seeded_and_keeps_its_history(chaotic_llama):
    model = chaotic_llama
    seqs = [_greedy(model, p) for p in ([1, 5, 6, 7], [1, 77, 3, 12])]
    a = search(model, seqs, gamma=3, trials=8, random_trials=3, seed=1)
    b = search(model, seqs, gamma=3, trials=8, random_trials=3, seed=1)
    assert a == b and len(a["history"]) == 8
    d = num_layers(model)
    assert a["history"][0]["skip"] == [i for i in range(1, d - 1) if i % 2]   # the every-other default first
    assert a["objective"] == max(h["objective"] for h in a["history"])
    assert sorted(a["skip"] + a["kept"]) == list(range(d)) and {0, d - 1} <= set(a["kept"])


def test_decoder_takes_a_searched_file_or_a_list_and_says_which(chaotic_llama, tmp_path):
    model, d = chaotic_llama, num_layers(chaotic_llama)
    f = tmp_path / "skip.json"
    f.write_text(json.dumps({"skip": [2], "layers": d}))
    ids = torch.tensor([[1, 40, 41, 42, 43]])
    ref = get_decoder("vanilla", model).generate(ids, 20).tokens
    for opts, kind, skipped in (({"skip": str(f)}, "searched", [2]), ({"skip": [1, 2]}, "given", [1, 2]),
                                ({}, "every_other", [i for i in range(1, d - 1) if i % 2])):
        out = get_decoder("self_speculative", model, **opts).generate(ids, 20)
        assert out.tokens == ref and out.stats["layer_set"] == kind and out.stats["skipped_layers"] == skipped


@pytest.mark.parametrize("opts, says", [
    ({"skip": [9]}, r"skip=\[9\] is invalid"),
    ({"skip": [0, 1, 2, 3]}, "skips all 4 layers"),
    ({"skip": [1], "draft_layers": [0, 3]}, "not both"),
    ({"skip": "MISSING"}, "does not exist"),
    ({"skip": "NOTJSON"}, "is not JSON"),
    ({"skip": "OTHER"}, "searched on a 30-layer model"),
])
def test_bad_skip_is_one_error(chaotic_llama, tmp_path, opts, says):
    files = {"MISSING": tmp_path / "none.json", "NOTJSON": tmp_path / "bad.json", "OTHER": tmp_path / "other.json"}
    files["NOTJSON"].write_text("{skip")
    files["OTHER"].write_text(json.dumps({"skip": [1], "layers": 30}))
    opts = {k: str(files[v]) if isinstance(v, str) else v for k, v in opts.items()}
    with pytest.raises(UserError, match=says):
        get_decoder("self_speculative", chaotic_llama, **opts)


def test_search_cli_checks_its_options_before_loading(monkeypatch, tmp_path):
    import common.assets.models
    from common.components.skip_search import _main

    monkeypatch.setattr(common.assets.models, "load_model", lambda *a, **k: (_ for _ in ()).throw(
        AssertionError("the model was loaded before the options were checked")))
    with pytest.raises(UserError, match="--gamma"):
        _main(["--model", "m", "--out", str(tmp_path / "s.json"), "--gamma", "0"])
    assert not (tmp_path / "s.json").exists()
