"""Shared mechanics of the four reproductions: models, data, KV cache, trees, decoders, bench.

The project is offline by default (the embedded profile): the hub is switched off before
transformers or datasets are imported. The paper profile sets ``HF_HUB_OFFLINE=0``.
"""
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", os.environ["HF_HUB_OFFLINE"])
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
