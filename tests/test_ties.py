"""xvocab.checks.ties, the bfloat16 policy: a difference from ar is a tie only where the target's two choices are within
TIE_SPACINGS bfloat16 spacings, read in float32 over the same weights; anything else is a failure, and float32
needs equality. Each verdict is shown with the case that must give the other one."""
import pytest
import torch

from experiments.sweep.runner import ar_check
from xvocab import zoo
from xvocab.alignment.roles import prompt_ids
from xvocab.checks import ties
from xvocab.zoo.tiny import tiny_model

PROMPT = "def fibonacci(n):"


def test_spacing_is_bfloat16s_gap_at_the_magnitude():
    for x in (1.0, 3.0, -20.5, 1e-3):
        at = torch.tensor(abs(x), dtype=torch.bfloat16).float()   # a bfloat16 value at |x|
        near = torch.tensor(float(at) + ties.bf16_spacing(x) * 0.49).to(torch.bfloat16).float()
        over = torch.tensor(float(at) + ties.bf16_spacing(x) * 1.01).to(torch.bfloat16).float()
        assert near == at and over != at   # less than half a spacing rounds back; a spacing is the next value


def test_classify_tie_and_differs_from_the_logits_and_equal_lists_read_none():
    logits = torch.zeros(10)
    logits[3], logits[4], logits[5] = 8.0, 8.0 - ties.bf16_spacing(8.0), 6.0   # 4 within a spacing, 5 far below
    read = []

    def logits_at(prefix):
        read.append(list(prefix))
        return logits

    assert ties.classify([1, 3], [1, 3], logits_at)["verdict"] == "equal" and not read
    tie = ties.classify([1, 3, 7], [1, 4], logits_at)
    assert tie["verdict"] == "tie" and tie["position"] == 1 and read == [[1]]
    assert ties.classify([1, 3], [1, 5], logits_at)["verdict"] == "differs"      # the negative control
    # one list stopping early is judged by the longer one's token against the top choice
    assert ties.classify([1], [1, 4], logits_at)["verdict"] == "tie"
    assert ties.classify([1], [1, 5], logits_at)["verdict"] == "differs"


def test_verdict_asks_for_logits_only_for_a_bfloat16_difference():
    def never():
        raise AssertionError("logits asked for")

    assert ties.verdict([1, 2], [1, 2], "bfloat16", never) == "equal"
    assert ties.verdict([1, 2], [1, 3], "float32", never) == "differs"   # float32 needs equality
    flat = torch.zeros(5)
    assert ties.verdict([1, 2], [1, 3], "bfloat16", lambda: lambda prefix: flat) == "tie"


@pytest.fixture(scope="module")
def tied_target():
    """A bfloat16 target whose head gives two ids the same row (an exact tie after the prompt) and a third id a
    row far below; (model, tokenizer, prompt ids, top id, tied id, far id)."""
    tok = zoo.tokenizer("qwen2")
    model = tiny_model(tok, seed=3).to(torch.bfloat16).eval()
    ids = prompt_ids(tok, PROMPT)
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0, -1].float()
        top, far = int(logits.argmax()), int(logits.argmin())
        twin = (top + 1) % len(tok)
        head = model.get_output_embeddings().weight
        head[twin] = head[top]
    return model, tok, ids, top, twin, far


def test_float32_judge_reads_a_real_tie_and_a_real_difference_on_the_targets_weights(tied_target):
    model, tok, ids, top, twin, far = tied_target
    judge = ties.Float32Judge(model)
    assert ties.verdict([top], [twin], "bfloat16", lambda: judge.for_prompt(ids)) == "tie"
    assert ties.verdict([top], [far], "bfloat16", lambda: judge.for_prompt(ids)) == "differs"
    assert model.get_input_embeddings().weight.dtype == torch.bfloat16  # the judge reads a copy
    assert judge.why is None and ties._no_room_for_a_copy(model) is None  # a tiny target fits: the real rule ran


def test_the_runners_check_records_the_verdict_and_reports_a_failure(tied_target, capsys):
    model, tok, ids, top, twin, far = tied_target
    judge, row = ties.Float32Judge(model), {"id": "p0", "prompt": PROMPT}

    def rec(token_ids, dtype="bfloat16"):
        return {"token_ids": token_ids, "config": {"algorithm": "slem", "dtype": dtype}}

    assert ar_check(rec([top, 5]), rec([top, 5]), row, judge, tok) == {"equals_ar": True, "ar_verdict": "equal"}
    assert ar_check(rec([twin]), rec([top]), row, judge, tok) == {"equals_ar": False, "ar_verdict": "tie"}
    assert "FAILURE" not in capsys.readouterr().err
    assert ar_check(rec([far]), rec([top]), row, judge, tok) == {"equals_ar": False, "ar_verdict": "differs"}
    assert "FAILURE: slem on p0" in capsys.readouterr().err
    assert ar_check(rec([twin], "float32"), rec([top], "float32"), row, judge, tok)["ar_verdict"] == "differs"


def test_a_target_too_large_to_copy_leaves_its_difference_unjudged_not_a_crash(tied_target, monkeypatch, capsys):
    model, tok, ids, top, twin, far = tied_target
    monkeypatch.setattr(ties, "_no_room_for_a_copy", lambda m: "a float32 copy needs 280.0 GiB, 20.0 GiB free")
    judge = ties.Float32Judge(model)
    assert ties.verdict([top], [far], "bfloat16", lambda: judge.for_prompt(ids)) == "unjudged"
    assert judge._copy is None and "280.0 GiB" in judge.why
    rec = {"token_ids": [far], "config": {"algorithm": "slem", "dtype": "bfloat16"}}
    ref = {"token_ids": [top], "config": {"algorithm": "ar", "dtype": "bfloat16"}}
    assert ar_check(rec, ref, {"id": "p0", "prompt": PROMPT}, judge, tok)["ar_verdict"] == "unjudged"
    err = capsys.readouterr().err
    assert "not judged" in err and "FAILURE" not in err
