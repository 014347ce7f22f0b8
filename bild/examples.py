"""BiLD's Figure 10: example outputs with the large model's tokens marked.

:func:`segments` (run by the decoder, which holds the tokenizer) cuts the output text into runs
of tokens from one model; :func:`marked` renders them for a markdown table with the large
model's runs in bold; :func:`pick` chooses the prompts to show.
"""
from __future__ import annotations

import re
from typing import Sequence


def _common_prefix(a: str, b: str) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def segments(tokenizer, tokens: Sequence[int], source: Sequence[str]) -> list[list[str]]:
    """The decoded text of ``tokens`` as ``[[source, text], ...]``, one entry per run of
    consecutive tokens with the same ``source`` (runs that add no text are dropped, and their
    neighbours merged).

    The text of a run is where the decoded prefix grows over it. Decoding a prefix is not always
    a prefix of the whole text (a multi-byte character split between tokens, cleaned-up spaces),
    so each cut is the longest common prefix of the prefix's text and the whole text, never
    moving back: the runs always join to exactly ``tokenizer.decode(tokens,
    skip_special_tokens=True)`` (the record's ``text``).
    """
    if len(tokens) != len(source):
        raise ValueError(f"{len(tokens)} tokens but {len(source)} sources")
    text = tokenizer.decode(list(tokens), skip_special_tokens=True)
    bounds = [i for i in range(1, len(tokens)) if source[i] != source[i - 1]]
    cuts = [0]
    for b in bounds:
        prefix = tokenizer.decode(list(tokens[:b]), skip_special_tokens=True)
        cuts.append(max(cuts[-1], _common_prefix(prefix, text)))
    cuts.append(len(text))
    starts = [0, *bounds]
    out: list[list[str]] = []
    for s, a, b in zip(starts, cuts, cuts[1:]):
        if a == b:
            continue  # a run that added no text (a special token, half a character) shows nothing
        if out and out[-1][0] == source[s]:
            out[-1][1] += text[a:b]  # its neighbours, now adjacent, are one run
        else:
            out.append([source[s], text[a:b]])
    return out


_MD_SPECIAL = re.compile(r"([\\`*_|<>\[\]])")


def _md(text: str) -> str:
    """Text safe inside a markdown table cell: one line, markup characters escaped."""
    return _MD_SPECIAL.sub(r"\\\1", " ".join(text.split("\n")))


def marked(segs: Sequence[Sequence[str]], mark: str = "large") -> str:
    """One markdown line of ``segs`` with the ``mark`` runs in bold.

    Markdown bold does not open or close next to a space (``** word**`` stays literal), so a
    run's outer whitespace stays outside the markers.
    """
    out = []
    for src, text in segs:
        text = _md(text)
        core = text.strip()
        if src != mark or not core:
            out.append(text)
            continue
        lead, trail = text[: len(text) - len(text.lstrip())], text[len(text.rstrip()):]
        out.append(f"{lead}**{core}**{trail}")
    return "".join(out)


def plain(text: str) -> str:
    """An unmarked output, escaped as :func:`marked` escapes."""
    return _md(text)


def pick(question_ids: Sequence, small_texts: Sequence[str], large_texts: Sequence[str], k: int) -> list:
    """The ``k`` prompts to show, in dataset order: first those where the small model alone
    wrote something else than the large model (where BiLD's corrections can show), then others."""
    differ = [q for q, s, l in zip(question_ids, small_texts, large_texts) if s != l]
    same = [q for q, s, l in zip(question_ids, small_texts, large_texts) if s == l]
    return (differ + same)[:k]


def example_table(sweep: Sequence[dict], oracle: Sequence[dict], decoder: str, k: int):
    """Figure 10's rows for ``k`` prompts (:func:`pick`) of one task and variant.

    Args:
        sweep: ``common.harness.bench`` records of one sweep (``vanilla`` and ``decoder`` among them).
        oracle: :mod:`bild.oracle` records of the same task and variant (``small``: the small
            model alone).
    Returns:
        a DataFrame with ``question_id, reference, large, small, bild`` (markdown-ready text; the
        large model's runs of BiLD's output in bold) and ``large_share`` (BiLD's tokens from it).
    """
    import pandas as pd

    large = {r["question_id"]: r for r in sweep if r["decoder"] == "vanilla"}
    mine = {r["question_id"]: r for r in sweep if r["decoder"] == decoder}
    small = {r["question_id"]: r for r in oracle if r["setting"] == "small"}
    ids = [q for q in large if q in mine and q in small]  # dataset order, as the sweep ran
    chosen = pick(ids, [small[q]["text"] for q in ids], [large[q]["text"] for q in ids], k)
    rows = []
    for q in chosen:
        r = mine[q]
        extra = r.get("extra") or {}
        segs = extra.get("segments")
        if segs is None:
            raise ValueError(f"{decoder} record {q!r} has no extra.segments (recorded before Figure 10's marking)")
        src = extra.get("source") or []
        rows.append({"question_id": q, "reference": plain(r.get("reference") or ""), "large": plain(large[q]["text"]),
                     "small": plain(small[q]["text"]), "bild": marked(segs),
                     "large_share": src.count("large") / len(src) if src else float("nan")})
    return pd.DataFrame(rows)
