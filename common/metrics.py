"""Output-quality metrics, with the libraries researchers use.

* :func:`bleu` - corpus BLEU (sacrebleu's defaults: 13a tokenizer, exponential smoothing off),
  BiLD's translation metric (IWSLT 2017 / WMT 2014 De-En);
* :func:`rouge_l` - mean ROUGE-L F1 x 100 (rouge-score, Porter stemming), BiLD's summarization
  metric (XSum, CNN/DM); :func:`rouge_2` - mean ROUGE-2 F1 (0-1, as FIRP's Table 1 reports it);
* :func:`agreement` - how far outputs agree with the large model's own greedy output, token
  for token: the measure of how much a lossy setting departs from the model it accelerates.
"""
from __future__ import annotations

from typing import Sequence

from common.errors import UserError


def _check(hyps: Sequence[str], refs: Sequence[str]) -> None:
    if len(hyps) != len(refs) or not hyps:
        raise UserError(f"metrics need one reference per output; got {len(hyps)} outputs and {len(refs)} "
                        "references (valid: equal, non-zero counts)")


def bleu(hyps: Sequence[str], refs: Sequence[str]) -> float:
    """Corpus BLEU (0-100) of ``hyps`` against one reference each."""
    # sacrebleu and rouge_score are imported where a score is computed: only BiLD's quality
    # columns need them, and every bench run imports this module.
    import sacrebleu

    _check(hyps, refs)
    return float(sacrebleu.corpus_bleu(list(hyps), [list(refs)]).score)


def rouge_l(hyps: Sequence[str], refs: Sequence[str]) -> float:
    """Mean ROUGE-L F1 (0-100) over pairs."""
    from rouge_score import rouge_scorer

    _check(hyps, refs)
    scorer = rouge_scorer.RougeScorer(["rougeL"], use_stemmer=True)
    return 100.0 * sum(scorer.score(r, h)["rougeL"].fmeasure for h, r in zip(hyps, refs)) / len(hyps)


def rouge_2(hyps: Sequence[str], refs: Sequence[str]) -> float:
    """Mean ROUGE-2 F1 (0-1) over pairs."""
    from rouge_score import rouge_scorer

    _check(hyps, refs)
    scorer = rouge_scorer.RougeScorer(["rouge2"], use_stemmer=True)
    return sum(scorer.score(r, h)["rouge2"].fmeasure for h, r in zip(hyps, refs)) / len(hyps)


METRICS = {"bleu": bleu, "rouge_l": rouge_l}


def agreement(outputs: Sequence[Sequence[int]], reference: Sequence[Sequence[int]]) -> dict:
    """Token agreement with a reference decoder's outputs (the large model's greedy).

    Returns:
        ``{"identical": share of outputs equal to their reference, "prefix": mean share of each
        reference matched before the first difference, "tokens": mean share of positions equal}``.
    """
    if len(outputs) != len(reference) or not outputs:
        raise UserError(f"agreement needs one reference output per output; got {len(outputs)} and {len(reference)}")
    same = pre = pos = 0.0
    for o, r in zip(outputs, reference):
        o, r = list(o), list(r)
        same += o == r
        n = 0
        while n < min(len(o), len(r)) and o[n] == r[n]:
            n += 1
        pre += n / max(len(r), 1)
        pos += sum(a == b for a, b in zip(o, r)) / max(len(r), len(o), 1)
    k = len(outputs)
    return {"identical": same / k, "prefix": pre / k, "tokens": pos / k}
