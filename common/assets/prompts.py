"""Prompt formatting: the chat template for chat models, paper templates for task prompts.

``TEMPLATES`` maps a template name to a format string with a ``{text}`` field. Paper
prompt templates (with their own fields) live in their package, e.g. Predictive Pipelined
Decoding's Table 1 in that paper package's ``templates`` module.
"""
from __future__ import annotations

import torch

from ..errors import UserError, unknown

# "t5-summarize": T5's task prefix for summarization (the prefix its fine-tuned checkpoints expect)
TEMPLATES: dict[str, str] = {"plain": "{text}", "t5-summarize": "summarize: {text}"}


def render(template: str, text: str) -> str:
    """Fill a named template with the sample text."""
    if template not in TEMPLATES:
        raise unknown("prompt template", template, TEMPLATES)
    return TEMPLATES[template].format(text=text)


TRUNCATE = ("left", "right", "last")


def encode_prompt(tokenizer, text: str, template: str = "plain", chat: bool = True,
                  max_prompt_tokens: int | None = None, truncate: str | None = "last") -> torch.Tensor:
    """Text -> ``[1, S]`` input ids, through the chat template when the tokenizer has one.

    Over-long prompts are cut as :func:`fit_prompt` says; the default ``"last"`` keeps the
    last ``max_prompt_tokens`` tokens (the generation prompt sits at the end), as the trained
    components' data were built.
    """
    return fit_prompt(tokenizer, text, template, chat, max_prompt_tokens, truncate)[0]


def fit_prompt(tokenizer, text: str, template: str = "plain", chat: bool = True,
               max_prompt_tokens: int | None = None, truncate: str | None = None) -> tuple[torch.Tensor, int]:
    """Encode a prompt within ``max_prompt_tokens`` (None: no limit).

    Args:
        truncate: what to do with a longer prompt. None: raise UserError. ``"left"`` /
            ``"right"``: drop the start / the end of the sample text, keeping the template,
            the chat header and the generation prompt. ``"last"``: keep the last tokens of the
            whole encoded prompt (the chat header goes first).
    Returns:
        ``([1, S] ids, the untruncated length)``.
    """
    if max_prompt_tokens is not None and (isinstance(max_prompt_tokens, bool) or max_prompt_tokens < 1):
        raise UserError(f"max_prompt_tokens={max_prompt_tokens} is out of range; valid: an integer >= 1, "
                        "or None for no limit")
    if truncate is not None and truncate not in TRUNCATE:
        raise unknown("truncation", truncate, TRUNCATE)
    ids = _encode(tokenizer, render(template, text), chat)
    full = ids.shape[1]
    if max_prompt_tokens is None or full <= max_prompt_tokens:
        return ids, full
    if truncate is None:
        raise UserError(f"the prompt has {full} tokens, more than max_prompt_tokens={max_prompt_tokens}; "
                        "valid: a larger limit, or truncation asked for (left or right)")
    if truncate == "last":
        return ids[:, -max_prompt_tokens:], full
    return _cut_text(tokenizer, text, template, chat, max_prompt_tokens, truncate, full), full


def encode_messages(tokenizer, messages, max_prompt_tokens: int, chars_per_token: int = 8) -> torch.Tensor:
    """A conversation ``((role, text), ...)`` (roles user / assistant / system, the last one the
    turn to answer) -> ``[1, S]`` ids through the chat template, keeping the last
    ``max_prompt_tokens`` tokens (as :func:`encode_prompt`'s ``"last"`` does).

    Only the conversation's last ``chars_per_token * max_prompt_tokens`` characters are
    templated (whole messages, the first kept one cut at its start), so a 100 k-character
    conversation costs no more than a short one; a token is ~4 characters here, so the cut lies
    outside the kept tokens. Without a chat template, the texts are joined with blank lines.
    """
    budget, kept = chars_per_token * max_prompt_tokens, []
    for role, text in reversed(tuple(messages)):
        kept.append({"role": role, "content": text[-budget:]})
        budget -= len(text)
        if budget <= 0:
            break
    kept.reverse()
    if getattr(tokenizer, "chat_template", None):
        ids = tokenizer.apply_chat_template(kept, add_generation_prompt=True, return_tensors="pt")["input_ids"]
    else:
        ids = tokenizer("\n\n".join(m["content"] for m in kept), return_tensors="pt")["input_ids"]
    return ids[:, -max_prompt_tokens:]


def _encode(tokenizer, content: str, chat: bool) -> torch.Tensor:
    if chat and getattr(tokenizer, "chat_template", None):
        return tokenizer.apply_chat_template([{"role": "user", "content": content}],
                                             add_generation_prompt=True, return_tensors="pt")["input_ids"]
    return tokenizer(content, return_tensors="pt")["input_ids"]


def _cut_text(tokenizer, text, template, chat, limit: int, side: str, full: int) -> torch.Tensor:
    """Shorten the sample text (tokens dropped on ``side``) until the encoded prompt fits.

    Decoding a token slice and encoding it again can merge tokens at the cut, so the length
    is measured after each try and the text shortened by the excess until it fits.
    """
    text_ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    overhead = full - len(text_ids)  # template, chat header and generation prompt
    keep = min(len(text_ids), limit - overhead)
    while True:
        if keep < 1:
            raise UserError(f"max_prompt_tokens={limit} leaves no room for the text: the template and chat "
                            f"header alone take {overhead} tokens; valid: a limit > {overhead}")
        cut = text_ids[-keep:] if side == "left" else text_ids[:keep]
        ids = _encode(tokenizer, render(template, tokenizer.decode(cut)), chat)
        if ids.shape[1] <= limit:
            return ids
        keep -= ids.shape[1] - limit
