"""Shared mechanics of the four reproductions: models, data, KV cache, trees, decoders, bench.

The project is offline by default (the embedded profile): the hub is switched off before
transformers or datasets are imported. The paper profile sets ``HF_HUB_OFFLINE=0``.
"""
import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", os.environ["HF_HUB_OFFLINE"])
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

# jsonschema imports rfc3987_syntax when it is installed (jupyter pulls it in) only to check the
# "iri" string formats, which no schema here uses and no validator here checks (no
# FormatChecker); building that package's grammar costs ~1.1 s of every process that loads the
# config: each DAG job, notebook kernel and command. Marked absent, jsonschema skips it.
sys.modules.setdefault("rfc3987_syntax", None)
