"""Training prompt tokens (section 3.3): only the prompt embeddings learn, the model is frozen.

Data: the model's own greedy answers (:mod:`common.training.seqtrain`'s corpora), so the greedy
continuation from any cut ``t`` inside an answer is the rest of the sequence, and one frozen
forward over a sequence gives both the context cache of every cut and the teacher's
distribution at every position. A cut's ``m`` prompt tokens sit at ``t + 1 .. t + m`` (prompt
token ``j`` stands in for the token at ``t + j`` and guesses the one after it); the teacher
for prompt token ``j`` (0-based) is the model's distribution at position ``t + 1 + j`` of the
greedy text. Loss (eq. 1, distillation): ``sum_j alpha^j KL(teacher_j || student_j)``, the
student being the EPT-averaged logits; without distillation, cross-entropy on the text's
tokens ``x[t + 2 + j]``.

"The model's own" is the model being trained, whichever it is: prompt tokens for a draft model
(``pd_speculative``, where the draft verifies its own guesses) train on the draft's greedy
answers, so both the teacher and the held-out accuracy are the draft's own greedy continuation.
On the target's answers instead, the teacher after a cut would be the draft's distribution
given the *target's* next tokens, which the draft's own chain follows only as often as the
draft agrees with the target (about a quarter of the tokens for the embedded draft). The
trainer refuses held-out answers that are not the trained model's own greedy tokens
(:func:`own_greedy_rate` below ``OWN_GREEDY_MIN``).

Cheap on CPU: every cut of a sequence trains in one forward of ``cuts * m * n`` positions
against the sequence's cache (no gradient through the context); each block sees only its
cut's prefix (``past_allow``) and its own EPTs (the EPT mask). Tests check that these logits
equal the ones decoding computes inside the verification forward.

Entry point (the paper's optimizer: AdamW, lr 1e-2, cosine schedule, no warmup, no weight
decay; a step is ``--batch-size`` sequences with ``--cuts`` random cuts each, the paper's one
random insertion point per sample made cheap by sharing the sequence's forward)::

    python -m prompt_decoding.train --model smollm2-135m-instruct --out DIR \
        --corpus .cache/.../pd_corpus.pt --heldout-corpus .cache/.../corpus.pt

writes ``DIR/prompts.pt`` (a :mod:`common.training.loop` checkpoint that also holds ``acc``, the
held-out top-k accuracy per distance the sparse tree is built from), ``DIR/curve.jsonl`` and
``DIR/stats.json``. ``--no-distill`` trains on ShareGPT's reference replies with cross-entropy
(the paper's ablation): with ``--corpus-dir`` the replies to the same conversations the corpus's
training shards answer (as many, after its held-out prompts), so only the labels differ from the
distilled training; the held-out metric stays agreement with the model's greedy tokens.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from common.engine.cache import crop_to
from common.checks import differences
from common.errors import UserError, check_range, cli_main
from common.engine.forward import final_norm, num_layers, run_layers
from common.training.seqtrain import cuts_loss, teacher_forward
from common.training.loop import fingerprint, read_trained

from .prompt_tokens import AGGREGATIONS, MASKS, Extras, PromptTokens

ALPHA = 0.8  # the decay ratio of eq. 1 (Medusa's head weighting)
INIT_TEXT = "the next words are"  # the paper initialises from "normal text token embeddings"


def cut_logits(model, prompts: PromptTokens, cache, cuts: torch.Tensor, length: int) -> torch.Tensor:
    """Student logits of the prompt tokens placed after each cut of one cached sequence.

    Args:
        cache: the sequence's cache (``length`` positions; restored to them on return).
        cuts: ``[B]`` positions ``t``; block ``b``'s prompt tokens sit at ``t_b + 1 ..``.
    Returns:
        ``[B, m, V]`` guess logits (:meth:`PromptTokens.readout`, with gradients into ``prompts``).
    """
    m, n, dev = prompts.m, prompts.n, cuts.device
    B, e, d = cuts.numel(), m * n, num_layers(model)
    states = prompts.embeddings.reshape(e, -1).repeat(B, 1)                         # [B*e, H]
    j = torch.arange(m, device=dev).repeat_interleave(n)                            # prompt token of each EPT
    pos = (cuts[:, None] + 1 + j[None]).reshape(-1)                                 # [B*e]
    block = torch.arange(B, device=dev).repeat_interleave(e)
    allow = (block[:, None] == block[None, :]) & prompts.allow(dev).repeat(B, B)    # own block, EPT mask
    past_allow = torch.arange(length, device=dev)[None, :] <= cuts[block][:, None]  # each cut's prefix
    if prompts.prefix_kv is not None:  # B.3: every layer's cache gains the prefixes, seen by their own prompt token
        for layer in range(d):
            kv = prompts.prefix_kv[layer].to(model.dtype)                           # [2, kvh, m*p, hd]
            cache.update(kv[0][None], kv[1][None], layer)
        past_allow = torch.cat([past_allow, prompts.prefix_allow(dev).repeat(B, 1)], dim=1)
    k = prompts.extras.exits
    h = run_layers(model, states[None].to(model.dtype), cache, 0, d - k + 1, pos[None], allow, past_allow)
    if k > 1:  # B.7: the average of the last k layers' outputs
        outs = [h]
        for layer in range(d - k + 1, d):
            outs.append(run_layers(model, outs[-1], cache, layer, layer + 1, pos[None], allow, past_allow))
        h = torch.stack(outs).mean(0)
    crop_to(cache, length)  # the prefix and prompt positions are never kept
    return prompts.readout(final_norm(model, h[0]).view(B, e, -1), model.lm_head)   # [B, m, V]


def sequence_loss(model, prompts: PromptTokens, ids: torch.Tensor, cuts: torch.Tensor, distill: bool = True,
                  alpha: float = ALPHA) -> torch.Tensor:
    """Eq. 1 averaged over the cuts of one greedy sequence ``[L]`` (cuts ``t <= L - 2 - m``)."""
    m = prompts.m
    cache, _, teacher = teacher_forward(model, ids)
    student = cut_logits(model, prompts, cache, cuts, ids.numel()).float().log_softmax(-1)   # [B, m, V]
    rows = cuts[:, None] + 1 + torch.arange(m, device=ids.device)[None]                     # [B, m]
    w = alpha ** torch.arange(m, device=ids.device, dtype=student.dtype)
    if distill:
        t = teacher[rows]                                                                    # [B, m, V]
        per = nn.functional.kl_div(student, t, log_target=True, reduction="none").sum(-1)   # [B, m]
    else:
        per = nn.functional.nll_loss(student.flatten(0, 1), ids[rows + 1].flatten(), reduction="none").view(rows.shape)
    return (per * w).sum(-1).mean()


@torch.inference_mode()
def guess_accuracy(model, prompts: PromptTokens, seqs: list[torch.Tensor], starts: list[int], topk: int = 10) -> list[list[float]]:
    """``acc[d][r]``: how often the rank-``r`` guess at distance ``d + 1`` is the model's own
    greedy token there, over every cut inside the answers of held-out greedy sequences (the
    table the candidate tree is built from)."""
    m = prompts.m
    hits, total = torch.zeros(m, topk), torch.zeros(m)
    for ids, start in zip(seqs, starts):
        L = ids.numel()
        cuts = torch.arange(max(start - 1, 0), L - m, device=ids.device)
        if cuts.numel() == 0:
            continue
        cache, _, teacher = teacher_forward(model, ids)
        ranks = cut_logits(model, prompts, cache, cuts, L).topk(topk, dim=-1).indices.cpu()  # [B, m, K]
        rows = (cuts[:, None] + 1 + torch.arange(m, device=ids.device)[None]).cpu()
        want = teacher.argmax(-1).cpu()[rows]                                                # [B, m]
        hits += (ranks == want[..., None]).float().sum(0)
        total += cuts.numel()
    return (hits / total.clamp(min=1)[:, None]).tolist()


OWN_GREEDY_MIN = 0.9  # below it the answers are another model's (a near tie may still flip a token)


@torch.inference_mode()
def own_greedy_rate(model, seqs: list[torch.Tensor], starts: list[int]) -> float:
    """How often the model's argmax after an answer position is the answer's next token, over
    greedy sequences ``[L]`` whose answers start at ``starts``: ~1 for the model's own greedy
    answers (what self-distillation needs), the two models' agreement for another's."""
    hits = total = 0
    for ids, start in zip(seqs, starts):
        _, _, logp = teacher_forward(model, ids)
        want = ids[max(start, 1):]
        hits += int((logp[max(start, 1) - 1:-1].argmax(-1) == want).sum())
        total += want.numel()
    return hits / max(total, 1)


def text_init(model, tokenizer, text: str) -> torch.Tensor:
    """``[k, H]`` input embeddings of ``text``'s tokens (the prompt tokens start from them)."""
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    if not ids:
        raise UserError(f"--init-text {text!r} has no tokens")
    with torch.no_grad():
        return model.get_input_embeddings()(torch.tensor(ids, device=model.device)).float().cpu()


def check_options(m: int, n: int, cuts: int, eval_seqs: int) -> None:
    """The trainer's own settings (the entry point checks them before loading anything;
    :class:`Extras` checks its own on construction)."""
    check_range("--m", m, 1, 16)
    check_range("--n", n, 1, 512)
    check_range("--cuts", cuts, 1)
    check_range("--eval-seqs", eval_seqs, 1)


def check_extras_fit(model, extras: Extras) -> None:
    """Options that depend on the model: the exits must be layers of it."""
    d = num_layers(model)
    if extras.exits > d:
        raise UserError(f"--exits {extras.exits} is out of range for a {d}-layer model; valid: 1..{d}")


def init_from_stage1(prompts: PromptTokens, path: Path, model) -> dict:
    """Two-stage training (B.4): start the prompt embeddings from a finished training of the
    same shape on the same model (``path``: its ``prompts.pt``); returns that run's stats
    fields worth carrying (its steps and wall time)."""
    state = read_trained(Path(path), hint="train the first stage first (python -m prompt_decoding.train)")
    meta = state["identity"]["meta"]
    want = {"m": prompts.m, "n": prompts.n, "mask": prompts.mask, **fingerprint(model)}
    if diff := differences({k: meta.get(k) for k in want}, want):
        raise UserError(f"--init-from {path} holds prompt tokens of another shape or model ({diff}); "
                        "train a first stage like this one")
    with torch.no_grad():
        prompts.embeddings.copy_(state["module"]["embeddings"])
    return {"init_from": str(path), "stage1_steps": state["step"], "stage1_wall_s": state.get("wall_s")}


def make_loss(model, seqs: list[tuple[torch.Tensor, int]], cuts: int, distill: bool):
    """``(prompts, batch of sequence indices) -> loss``: eq. 1 over ``cuts`` random cuts of each."""
    return cuts_loss(seqs, cuts, lambda prompts: prompts.m + 1,
                     lambda prompts, ids, c: sequence_loss(model, prompts, ids, c, distill))


@dataclass(frozen=True, kw_only=True)
class PromptRecipe:
    """What one prompt-token training learns, beside the optimizer's ``TrainConfig``.

    Attributes:
        m, n: prompt tokens (guessed distances) and ensemble prompt tokens per prompt token.
        mask: attention among the EPTs (``MASKS``).
        cuts: random cuts trained per sequence and step.
        distill: KL to the model's own distribution; False: cross-entropy on reference
            replies (the ablation; :func:`train_prompts` then needs ``text_seqs``).
        init_text: the prompt tokens start from its token embeddings.
        eval_seqs: held-out sequences the learning curve is measured on (the final accuracy
            table uses all of them).
        extras: Appendix B's options (:class:`prompt_decoding.prompt_tokens.Extras`).
        init_from: a finished training's ``prompts.pt`` to start the embeddings from (the
            second stage of the custom head's two-stage training).
    """
    m: int = 3
    n: int = 1
    mask: str = "ensemble"
    cuts: int = 16
    distill: bool = True
    init_text: str = INIT_TEXT
    eval_seqs: int = 16
    extras: Extras = Extras()
    init_from: Path | None = None


def train_prompts(model, tokenizer, data: dict, out: Path, cfg, stop, recipe: PromptRecipe = PromptRecipe(), *,
                  curve_path: Path | None = None, text_seqs=None) -> dict:
    """Train ``recipe.m x recipe.n`` prompt tokens; returns the stats (also written to
    ``out/stats.json``).

    Args:
        data: :func:`common.training.seqtrain.from_args` (``train`` and ``heldout`` greedy sequences).
        recipe: what is trained (:class:`PromptRecipe`).
        curve_path: also copy the learning curve here.
        text_seqs: the no-distillation variant's training sequences (reference replies).
    """
    m, n, mask, cuts, distill = recipe.m, recipe.n, recipe.mask, recipe.cuts, recipe.distill
    init_text, eval_seqs, extras, init_from = recipe.init_text, recipe.eval_seqs, recipe.extras, recipe.init_from
    from common.training.loop import finish_with_accuracy, train

    from .decoding import new_prompts, prompts_meta

    check_options(m, n, cuts, eval_seqs)
    check_extras_fit(model, extras)
    prompts = new_prompts(model, m, n, mask, seed=cfg.seed, init=text_init(model, tokenizer, init_text), extras=extras)
    stage1 = init_from_stage1(prompts, init_from, model) if init_from is not None else {}
    seqs = data["train"] if distill else text_seqs
    held = data["heldout"]
    curve_seqs, curve_starts = [s for s, _ in held[:eval_seqs]], [t for _, t in held[:eval_seqs]]
    own = own_greedy_rate(model, curve_seqs, curve_starts)
    if own < OWN_GREEDY_MIN:
        raise UserError(f"the held-out answers are not this model's own greedy answers (its argmax gives "
                        f"{own:.2f} of their tokens; valid: >= {OWN_GREEDY_MIN}): prompt tokens learn the greedy "
                        "continuation of the model they run on, so build both corpora with it "
                        "(python -m common.training.corpus answers --model <it>)")

    def evaluate(p):
        acc = guess_accuracy(model, p, curve_seqs, curve_starts, topk=5)
        return {"heldout_top1": [a[0] for a in acc], "heldout_top5": [sum(a) for a in acc]}

    out = Path(out)
    ckpt = out / "prompts.pt"
    meta = {**prompts_meta(model, m, n, mask, extras), "distill": distill, "cuts": cuts, "init_text": init_text,
            **({"init_from": stage1["init_from"]} if stage1 else {})}
    t0 = time.perf_counter()
    train(prompts, list(range(len(seqs))), make_loss(model, seqs, cuts, distill), cfg, ckpt, meta=meta,
          desc="prompt tokens", evaluate=evaluate, stop=stop, curve_path=out / "curve.jsonl")
    acc = guess_accuracy(model, prompts, [s for s, _ in held], [t for _, t in held], topk=10)
    return finish_with_accuracy(ckpt, prompts, model, acc, out, curve_path, t0, m=m, n=n, mask=mask, distill=distill,
                                cuts=cuts, init_text=init_text, train_sequences=len(seqs), heldout_sequences=len(held),
                                heldout_own_greedy=round(own, 4),
                                **extras.meta(), **stage1)


def _main(argv=None) -> None:
    from common.training import seqtrain
    from common.training.corpus import read_manifest
    from common.training.teacher import corpus_text, sharegpt_text
    from common.training.cli import component_main

    def add_args(ap):
        ap.add_argument("--m", type=int, default=3, help="prompt tokens (guessed distances)")
        ap.add_argument("--n", type=int, default=1, help="ensemble prompt tokens (EPTs) per prompt token")
        ap.add_argument("--mask", choices=MASKS, default="ensemble", help="attention among the EPTs")
        ap.add_argument("--cuts", type=int, default=16, help="random cuts trained per sequence and step")
        ap.add_argument("--no-distill", action="store_true",
                        help="cross-entropy on ShareGPT's reference replies instead of KL to the model (ablation)")
        ap.add_argument("--init-text", default=INIT_TEXT, help="the prompt tokens start from its token embeddings")
        ap.add_argument("--eval-seqs", type=int, default=16, help="held-out sequences per curve point")
        ap.add_argument("--aggregation", choices=AGGREGATIONS, default="average",
                        help="how a prompt token's EPT logits combine (learned: a trained weight per EPT; B.6)")
        ap.add_argument("--head", action="store_true", help="train a custom decoding head for the prompt tokens (B.4)")
        ap.add_argument("--prefix", type=int, default=0, help="prefix-tuning tokens per prompt token (B.3)")
        ap.add_argument("--exits", type=int, default=1, help="average the last k layers' outputs (multi-exit, B.7)")
        ap.add_argument("--init-from", type=Path, default=None,
                        help="a finished training's prompts.pt to start from (the custom head's second stage)")

    def run(a, model, tok, data, cfg, stop):
        text = None
        if a.no_distill:
            max_len = a.max_prompt_tokens + a.answer_tokens
            if a.corpus_dir is not None:  # the reference replies to the prompts the corpus's shards answer
                # (from_args has already checked the corpus against the model: its manifest is read only)
                raw = corpus_text(tok, read_manifest(a.corpus_dir), len(data["train"]), max_len, a.max_prompt_tokens)
            else:  # the --prompts conversations after the held-out greedy corpus's
                raw = sharegpt_text(tok, a.prompts, skip=a.heldout_prompts, max_len=max_len,
                                    max_prompt_tokens=a.max_prompt_tokens)
            text = [(torch.tensor(s["ids"], device=model.device), s["start"]) for s in raw]
        recipe = PromptRecipe(m=a.m, n=a.n, mask=a.mask, cuts=a.cuts, distill=not a.no_distill, init_text=a.init_text,
                              eval_seqs=a.eval_seqs, extras=extras_of(a), init_from=a.init_from)
        stats = train_prompts(model, tok, data, a.out, cfg, stop, recipe, curve_path=a.curve_out, text_seqs=text)
        print("held-out top-1 per distance:", [round(x, 3) for x in stats["heldout_top1"]])
        return stats

    component_main("train prompt tokens (parallel prompt decoding) on the model's own greedy answers", add_args,
                   run, (seqtrain.add_args, seqtrain.from_args, seqtrain.check_args), argv, lr=1e-2, batch_size=1, eval_every=50,
                   warmup_frac=0.0, schedule="cosine",
                   check_args=lambda a: (check_options(a.m, a.n, a.cuts, a.eval_seqs), extras_of(a),
                                         a.init_from is None or read_trained(a.init_from)))


def extras_of(a) -> Extras:
    """The appendix options of the command line (checked on construction)."""
    return Extras(aggregation=a.aggregation, head=a.head, prefix=a.prefix, exits=a.exits)


if __name__ == "__main__":
    cli_main(_main)
