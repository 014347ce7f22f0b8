"""ppd_pipelined: token-for-token equal to vanilla greedy on both backends, honest match stats."""
import pytest
import torch
from torch import nn

from common.decoders import get_decoder
from common.decoders.greedy import Vanilla
from common.errors import UserError
from common.assets.models import tiny_llama
from ppd_pipelined.decoding import MAX_K, PipelinedDecoder

PROMPTS = [torch.tensor([[1, 5, 6, 7, 5, 6, 40, 41]]), torch.tensor([[1, 9, 30, 31, 2, 77]])]
N_NEW = 24


def mixed_tiny(layers: int = 6, seed: int = 2):
    """A tiny LLaMA whose greedy output varies and whose early exits both hit and miss.

    Plain ``tiny_llama`` repeats one token and its tied head makes every early exit match;
    an untied head (the embeddings, permuted) and 1.5x stronger residual branches fix both.
    """
    m = tiny_llama(seed=seed, layers=layers)
    with torch.no_grad():
        perm = torch.randperm(m.config.vocab_size, generator=torch.Generator().manual_seed(seed))
        m.lm_head.weight = nn.Parameter(m.model.embed_tokens.weight[perm].clone())
        for layer in m.model.layers:
            layer.self_attn.o_proj.weight.mul_(1.5)
            layer.mlp.down_proj.weight.mul_(1.5)
    return m


@pytest.fixture(scope="module")
def mixed(one_thread):
    return mixed_tiny()


@pytest.fixture(scope="module")
def refs(mixed):
    return [Vanilla(mixed).generate(ids, N_NEW).tokens for ids in PROMPTS]


@pytest.fixture
def make():
    """Build decoders and always shut their worker pools down."""
    made = []

    def build(model, **cfg):
        made.append(PipelinedDecoder(model, **cfg))
        return made[-1]

    yield build
    for dec in made:
        dec.close()


def check_stats(dec, out):
    st, n = out.stats, len(out.tokens)
    assert st["steps"] == n and st["accept_lengths"] == [1] * n
    assert len(st["matches"]) == n - 1 and sum(st["runs"]) == n
    assert len(st["runs"]) == 1 + st["matches"].count(False)
    assert st["p_correct"] == pytest.approx(sum(st["matches"]) / (n - 1))
    assert len(st["worker_busy_s"]) == dec.k + 1 and all(b > 0 for b in st["worker_busy_s"])
    assert st["layer_time_s"] > 0
    # main worker layers: d for a token started at layer 0, d - split for one a sub-worker started
    used = [m for i, m in enumerate(st["matches"][:-1]) if out.tokens[i + 1] not in dec.eos]
    assert st["main_layer_forwards"] == (n - 1) * dec.d - dec.split * sum(used)


@pytest.mark.parametrize("backend", ["serial", "gloo"])
def test_lossless_with_matches(mixed, refs, make, backend):
    seen = {}
    # exit 3 = d/2 (Algorithm 1), exit 4 > d/2 (Algorithm 2: sub-workers run d - d_bar layers)
    for k, exit_layer, offload in [(1, 3, False), (1, 4, False), (3, 3, False), (3, 4, False),
                                   (1, 3, True), (3, 4, True)]:
        dec = make(mixed, k=k, exit_layer=exit_layer, backend=backend, offload_head=offload)
        for i, (ids, ref) in enumerate(zip(PROMPTS, refs)):  # two calls: the pool is reused
            out = dec.generate(ids, N_NEW)
            assert out.tokens == ref, (k, exit_layer, offload)
            check_stats(dec, out)
            seen.setdefault((k, exit_layer, i), []).append(out.stats["matches"])
    for matches in seen.values():
        assert all(m == matches[0] for m in matches)  # where the head runs changes nothing
    flat = [m for runs in seen.values() for m in runs[0]]
    assert any(flat) and not all(flat)  # both the sub-worker path and the restart path ran


def test_exit_below_half_and_registry(mixed, refs, make):
    """d_bar < d/2 is outside Theorem 4.1 but still exact; the registry name builds the decoder."""
    dec = get_decoder("ppd_pipelined", mixed, k=2, exit_layer=2, backend="serial")
    assert isinstance(dec, PipelinedDecoder) and dec.lossless and dec.split == 2
    assert dec.generate(PROMPTS[0], N_NEW).tokens == refs[0]


def test_matches_are_early_topk(mixed, refs):
    """Recorded matches equal an independent full forward's layer-d_bar top-k check."""
    k, d_bar = 3, 3
    out = PipelinedDecoder(mixed, k=k, exit_layer=d_bar, backend="serial").generate(PROMPTS[0], N_NEW)
    seq = torch.cat([PROMPTS[0], torch.tensor([out.tokens])], 1)
    with torch.inference_mode():
        hs = mixed(input_ids=seq, output_hidden_states=True).hidden_states[d_bar]  # raw layer output
        early = mixed.lm_head(mixed.model.norm(hs))[0]
    s = PROMPTS[0].shape[1]
    expected = [out.tokens[i + 1] in early[s + i].topk(k).indices.tolist() for i in range(len(out.tokens) - 1)]
    assert out.stats["matches"] == expected


def forced_match_model():
    """Last layer made an identity: the layer-(d-1) exit through the final head is always right."""
    m = mixed_tiny(layers=4, seed=0)
    with torch.no_grad():
        m.model.layers[-1].self_attn.o_proj.weight.zero_()
        m.model.layers[-1].mlp.down_proj.weight.zero_()
    return m


@pytest.mark.parametrize("backend", ["serial", "gloo"])
def test_forced_matches_stay_exact(one_thread, make, tmp_path, backend):
    m = forced_match_model()
    ref = Vanilla(m).generate(PROMPTS[0], N_NEW).tokens
    head = nn.Linear(m.config.hidden_size, m.config.vocab_size, bias=False)
    head.load_state_dict(m.lm_head.state_dict())
    torch.save(m.lm_head.state_dict(), tmp_path / "head.pt")
    for h, offload in ((head, True), (tmp_path / "head.pt", False), (str(tmp_path / "head.pt"), True)):
        dec = make(m, k=1, exit_layer=3, head=h, backend=backend, offload_head=offload)
        out = dec.generate(PROMPTS[0], N_NEW)
        assert out.tokens == ref
        assert all(out.stats["matches"]) and out.stats["runs"] == [N_NEW] and out.stats["p_correct"] == 1.0
        check_stats(dec, out)


def test_stops_after_eos(mixed, refs):
    dec = PipelinedDecoder(mixed, k=2, backend="serial")
    stop = refs[0][5]
    dec.eos = {stop}
    out = dec.generate(PROMPTS[0], N_NEW)
    assert out.tokens == refs[0][: refs[0].index(stop) + 1]
    assert len(out.stats["matches"]) == len(out.tokens) - 1


def test_gloo_pool_lifecycle(mixed, refs):
    with PipelinedDecoder(mixed, k=1, backend="gloo") as dec:
        assert dec.generate(PROMPTS[0], 4).tokens == refs[0][:4]
        procs = list(dec._pool._procs)
        assert dec.generate(PROMPTS[1], N_NEW).tokens == refs[1]
        assert dec._pool._procs == procs and all(p.is_alive() for p in procs)  # kept across calls
        dec.close()
        assert not any(p.is_alive() for p in procs)
        assert dec.generate(PROMPTS[0], N_NEW).tokens == refs[0]  # restarts lazily
        procs = list(dec._pool._procs)
    assert not any(p.is_alive() for p in procs)


def test_bad_input(mixed, tmp_path):
    cases = [({"k": 0}, r"k=0 is invalid"), ({"k": MAX_K + 1}, r"k=9 is invalid; valid: an integer in \[1, 8\]"),
             ({"k": 1.5}, r"k=1.5 is invalid"), ({"exit_layer": 0}, r"exit_layer=0 is invalid"),
             ({"exit_layer": 6}, r"exit_layer=6 is outside.*valid: 1\.\.5"),
             ({"backend": "mpi"}, r"backend='mpi' is invalid; valid: one of 'gloo', 'serial'"), ({"gamma": 3}, r"no option"),
             ({"offload_head": "yes"}, r"offload_head='yes' is invalid; valid: true/false"),
             ({"head": tmp_path / "none.pt"}, r"does not exist"), ({"threads": 0}, r"threads=0")]
    torch.save({"weight": torch.zeros(3, 64)}, tmp_path / "bad.pt")
    cases.append(({"head": tmp_path / "bad.pt"}, r"weight has shape \[3, 64\]; valid: \[96, 64\]"))
    for cfg, msg in cases:
        with pytest.raises(UserError, match=msg):
            PipelinedDecoder(mixed, **cfg)
    from transformers import GPT2Config, GPT2LMHeadModel
    gpt2 = GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=50))
    for model in (gpt2, nn.Linear(2, 2)):
        with pytest.raises(UserError, match="LLaMA-style causal LM|decoder-only causal LM"):
            PipelinedDecoder(model)


@pytest.mark.model
def test_embedded_lossless_on_mt_bench(embedded):
    """k = 1 and 3 sub-worker processes reproduce vanilla greedy on the real model (fp32)."""
    from common.assets.data import load_dataset_samples
    from common.assets.prompts import encode_prompt

    model, tok = embedded
    prompts = [encode_prompt(tok, s.turns[0]) for s in load_dataset_samples("mt-bench", n=2)]
    prev = torch.get_num_threads()
    torch.set_num_threads(2)  # vanilla as the benchmarks run it; the pipelined sub-workers get 1 thread each
    try:
        refs = [Vanilla(model, tok).generate(ids, 32).tokens for ids in prompts]
        for k in (1, 3):
            with PipelinedDecoder(model, tok, k=k) as dec:
                for ids, ref in zip(prompts, refs):
                    out = dec.generate(ids, 32)
                    assert out.tokens == ref, k
                    assert len(out.stats["matches"]) == len(ref) - 1 and out.stats["layer_time_s"] > 0
    finally:
        torch.set_num_threads(prev)
