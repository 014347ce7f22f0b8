"""Prompt formatting: the chat template for chat models, paper templates for task prompts.

``TEMPLATES`` maps a template name to a format string with a ``{text}`` field. Paper
prompt templates (with their own fields) live in their package, e.g. Predictive Pipelined
Decoding's Table 1 in that paper package's ``templates`` module.
"""
from __future__ import annotations

import torch

from .errors import unknown

TEMPLATES: dict[str, str] = {"plain": "{text}"}


def render(template: str, text: str) -> str:
    """Fill a named template with the sample text."""
    if template not in TEMPLATES:
        raise unknown("prompt template", template, TEMPLATES)
    return TEMPLATES[template].format(text=text)


def encode_prompt(tokenizer, text: str, template: str = "plain", chat: bool = True,
                  max_prompt_tokens: int | None = None) -> torch.Tensor:
    """Text -> ``[1, S]`` input ids, through the chat template when the tokenizer has one.

    ``max_prompt_tokens`` keeps the *last* tokens of over-long prompts (the generation
    prompt sits at the end), so long ShareGPT or article inputs fit small contexts.
    """
    content = render(template, text)
    if chat and getattr(tokenizer, "chat_template", None):
        ids = tokenizer.apply_chat_template([{"role": "user", "content": content}],
                                            add_generation_prompt=True, return_tensors="pt")["input_ids"]
    else:
        ids = tokenizer(content, return_tensors="pt")["input_ids"]
    if max_prompt_tokens is not None and ids.shape[1] > max_prompt_tokens:
        ids = ids[:, -max_prompt_tokens:]
    return ids
