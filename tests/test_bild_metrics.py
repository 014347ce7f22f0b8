"""BiLD's quality metrics: the libraries' scores on cases computed by hand."""
import pytest

from bild.metrics import agreement, bleu, rouge_l
from common.errors import UserError


def test_bleu_and_rouge_bounds_and_a_hand_case():
    refs = ["the cat sat on the mat today", "a quick brown fox jumps"]
    assert bleu(refs, refs) == pytest.approx(100.0)
    assert rouge_l(refs, refs) == pytest.approx(100.0)
    assert bleu(["zz yy xx ww vv", "qq pp oo nn mm"], refs) == pytest.approx(0.0)
    assert rouge_l(["zz yy"], ["the cat"]) == 0.0
    # LCS("the cat sat", "the cat sat on the mat") = 3: P = 3/3, R = 3/6, F1 = 2/3
    assert rouge_l(["the cat sat"], ["the cat sat on the mat"]) == pytest.approx(200 / 3)


def test_agreement_by_hand():
    a = agreement([[1, 2, 3, 4], [5, 6, 7, 8]], [[1, 2, 3, 4], [5, 9, 7, 8]])
    assert a == {"identical": 0.5, "prefix": pytest.approx((1 + 0.25) / 2), "tokens": pytest.approx((1 + 0.75) / 2)}


def test_mismatched_counts_are_an_error():
    with pytest.raises(UserError, match="one reference per output"):
        bleu(["a"], ["a", "b"])
    with pytest.raises(UserError):
        agreement([], [])
