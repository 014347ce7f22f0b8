"""Shared fixtures: a tiny random LLaMA for mechanics, the embedded model for integration."""
from __future__ import annotations

import pytest
import torch

from common.assets.models import checkpoint_dir, convert_embedded, load_model, tiny_llama

EMBEDDED = "smollm2-135m-instruct"


@pytest.fixture(scope="session")
def tiny():
    """4-layer LLaMA, vocab 96, random weights (fp32)."""
    torch.set_num_threads(2)
    return tiny_llama(seed=0)


@pytest.fixture(scope="session")
def chaotic_llama():
    """The tiny LLaMA with its layer weights scaled x10, so its greedy output depends on the
    whole context (22-25 distinct tokens in 30)."""
    return tiny_llama(seed=0, scale=10.0)


@pytest.fixture(scope="session")
def llama_pair(chaotic_llama):
    """(large, small) for BiLD: a 1-layer small model rarely agrees, so every policy is exercised."""
    return chaotic_llama, tiny_llama(seed=1, layers=1, scale=10.0)


@pytest.fixture(scope="session")
def spec_drafts(chaotic_llama):
    """Drafts of ``chaotic_llama`` for the speculative decoders: a random 1-layer draft (rarely
    agrees), a slightly perturbed copy (agrees for a few tokens at a time) and the target
    itself (always agrees: every chain fully accepted)."""
    from common.decoders.speculative import perturbed_copy
    return {"random": tiny_llama(seed=1, layers=1, scale=10.0), "near": perturbed_copy(chaotic_llama, 0.002, seed=7),
            "self": chaotic_llama}


@pytest.fixture(scope="session")
def t5_pair():
    """(large, small) tiny T5s: the small one a slightly perturbed copy of the large."""
    from common.decoders.speculative import perturbed_copy
    from common.assets.models import tiny_t5
    large = tiny_t5(seed=0)
    return large, perturbed_copy(large, 0.05)


@pytest.fixture(scope="session")
def embedded():
    """(model, tokenizer) of the embedded model on the fast path (what benchmarks run, so what
    the lossless tests check); converts the GGUF once if needed (~40 s)."""
    torch.set_num_threads(2)
    if not (checkpoint_dir(EMBEDDED) / "model.safetensors").is_file():
        convert_embedded(EMBEDDED)
    return load_model(EMBEDDED, fast=True)


@pytest.fixture(scope="module")
def one_thread():
    """Tiny-model ops are too small for 2 threads: on a shared 2-core machine the second thread
    only adds spin-waiting (5 s instead of 0.2 s for a brute-force recomputation)."""
    prev = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(prev)
