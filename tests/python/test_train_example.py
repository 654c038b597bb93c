"""The packed-training example runs, and on the CPU backend its loss curve with raggedattn equals
the reference attention's (fp32 math on both sides): the example is wired correctly end to end."""
import os
import sys

import pytest

torch = pytest.importorskip("torch")

EXAMPLE = os.path.join(os.path.dirname(__file__), "..", "..", "examples", "train_packed")
sys.path.insert(0, os.path.abspath(EXAMPLE))


def run_example(tmp_path, *extra):
    """train.py's main on a tiny CPU configuration; its results.json's runs."""
    import json

    import train  # noqa: E402  (examples/train_packed/train.py)

    argv = ["train.py", "--device", "cpu", "--steps", "4", "--batch-tokens", "768",
            "--eval-batches", "1", "--dim", "128", "--layers", "1", "--heads", "2",
            "--kv-heads", "1", "--out", str(tmp_path), *extra]
    old = sys.argv
    sys.argv = argv
    try:
        train.main()
    finally:
        sys.argv = old
    return json.load(open(tmp_path / "results.json"))["runs"]


def test_cpu_training_matches_reference(tmp_path):
    res = run_example(tmp_path, "--runs", "reference,raggedattn")
    ref, rag = res["reference"], res["raggedattn"]
    assert len(rag["train_loss"]) == 4
    assert rag["train_loss"][-1] < rag["train_loss"][0] + 0.5  # it trains, no blow-up
    assert rag["max_gap"] < 1e-4, rag["max_gap"]
    assert abs(rag["eval_loss"] - ref["eval_loss"]) < 1e-4


def test_packing_keeps_documents_apart():
    from data import Packer, load_documents

    train_docs, heldout = load_documents()
    assert len(train_docs) > 50 and len(heldout) > 3
    toks, tgts, cu, max_len, pos = next(Packer(train_docs, 4096, seed=0))
    assert toks.shape == (4096,) and int(cu[-1]) == 4096 and int(cu[0]) == 0
    cu = cu.tolist()
    for a, b in zip(cu[:-1], cu[1:]):
        assert pos[a] == 0 and int(pos[b - 1]) == b - a - 1  # positions restart per document
        assert int(tgts[b - 1]) == -100  # no target across a document boundary
    assert max_len == max(b - a for a, b in zip(cu[:-1], cu[1:]))


def test_corrupt_dq_switch_breaks_only_later_documents():
    """The corruption experiment's switch leaves dQ of the first document alone and replaces every
    later document's dQ by the first document's rows (what a stride-0 scratch read returns)."""
    from model import _CorruptDq

    cu = torch.tensor([0, 3, 8, 9])
    q = torch.randn(9, 2, 4, requires_grad=True)
    g = torch.randn(9, 2, 4)
    _CorruptDq.apply(q, cu).backward(g)
    assert torch.equal(q.grad[:3], g[:3])
    assert torch.equal(q.grad[3:8], g[[0, 1, 2, 0, 1]])
    assert torch.equal(q.grad[8:], g[:1])
    assert not torch.equal(q.grad, g)


def test_hf_mode_matches_sdpa_on_cpu(tmp_path):
    """--hf: a transformers Llama trained through attn_implementation="raggedattn" follows the
    same model through transformers' sdpa, step by step (fp32 on the CPU backend)."""
    pytest.importorskip("transformers")
    res = run_example(tmp_path, "--hf")
    ref, rag = res["hf_reference"], res["hf_raggedattn"]
    assert len(rag["train_loss"]) == 4
    assert rag["max_gap"] < 1e-4, rag["max_gap"]
    assert abs(rag["eval_loss"] - ref["eval_loss"]) < 1e-4
