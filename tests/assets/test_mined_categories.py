"""The question-answering and retrieval-augmented-generation stand-ins mined from ShareGPT
(common.assets.data.MINED_SETS): each rule on hand-made turns, and enough prompts for a study."""
from common.assets.data import MINED_SETS, load_dataset_samples

QA, RAG = MINED_SETS["sharegpt-qa"].test, MINED_SETS["sharegpt-rag"].test
CONTEXT = ("The committee met on Tuesday to review the annual budget. " * 20).strip()


def test_qa_rule():
    assert QA("What is the capital of Australia?")
    assert QA("how do tides work?")
    assert not QA("Tell me about tides.")                      # no question
    assert not QA("What is 3 + 4 = ?")                         # arithmetic: the math stand-in's
    assert not QA("What does this ```python\nprint(1)``` do?")  # code
    assert not QA("What is " + "very " * 60 + "long?")         # over 200 characters


def test_rag_rule():
    assert RAG(CONTEXT + "\n\nWhen did the committee meet?")
    assert not RAG(CONTEXT + "\n\nSummarize the text above.")  # no question at the end
    assert not RAG("Short context.\n\nWhen did they meet?")     # no long context
    assert not RAG(CONTEXT + "\n\n" + "Why? " * 100)            # the question paragraph is too long


def test_enough_prompts_for_a_study():
    for name in ("sharegpt-qa", "sharegpt-rag"):
        samples = load_dataset_samples(name)
        assert len(samples) >= 30, name
        assert all(s.category == name for s in samples)
