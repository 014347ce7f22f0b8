"""Shared checks of the tests of guess-and-verify decoders (imported by test modules)."""
import torch

from common.decoders import get_decoder


def assert_exact_and_accepting(model, name: str, prompts: int = 6, new_tokens: int = 40, **cfg) -> None:
    """Decoder ``name`` gives ``vanilla``'s tokens on random prompts, and accepts some of its
    guesses (so the exactness is not only ever that of one-token steps)."""
    accepted = 0
    for seed in range(prompts):
        ids = torch.randint(3, model.config.vocab_size, (1, 7), generator=torch.Generator().manual_seed(seed))
        ref = get_decoder("vanilla", model).generate(ids, new_tokens).tokens
        out = get_decoder(name, model, **cfg).generate(ids, new_tokens)
        assert out.tokens == ref, (name, cfg, seed)
        accepted += sum(out.stats["accepted"])
    assert accepted > 0, f"{name} accepted no guessed token in {prompts} prompts"


def assert_component_checks(model, name: str, option: str, filename: str, module, meta: dict, tmp_path) -> None:
    """A checkpoint made for another model (``meta`` with a wrong hidden size), the option
    unset, and a folder without the checkpoint: each one ``UserError`` naming the problem."""
    import pytest

    from common.errors import UserError
    from common.training import save_trained

    save_trained(module, tmp_path / "other" / filename, {**meta, "hidden": -1})
    with pytest.raises(UserError, match="trained for"):
        get_decoder(name, model, **{option: str(tmp_path / "other")})
    with pytest.raises(UserError, match=f"needs {option}"):
        get_decoder(name, model)
    with pytest.raises(UserError, match="does not exist"):
        get_decoder(name, model, **{option: str(tmp_path / "none")})
