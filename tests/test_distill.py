"""Logit-level distillation (xvocab.drafter.distill): the divergences are the exact divergences between the
coarsened distributions (fast = dictionary reference; = exact KL / TV / TLI rejection when nothing is coarsened),
zero exactly when the student matches the teacher, and the target's distributions land on the right draft
positions."""
import pytest
import torch

from xvocab import zoo
from xvocab.alignment.aligned import aligned_codec
from xvocab.alignment.intersection import intersection
from xvocab.alignment.roles import prompt_ids
from xvocab.alignment.tokens import codec
from xvocab.drafter.distill import (
    NOWHERE,
    argmax_labels,
    divergence,
    divergence_reference,
    document,
    first_piece_map,
    greedy_agreement,
    pieces,
)
from xvocab.drafter.student import Distill, StudentShape, _accumulate, batch_rows, build_student


def _case(seed: int, m: int = 5, k: int = 6, V: int = 20):
    gen = torch.Generator().manual_seed(seed)
    logq = torch.log_softmax(torch.randn(m, V, generator=gen, dtype=torch.float64) * 2, -1)
    ids = torch.randint(V, (m, k), generator=gen)
    ids[0, 1] = ids[0, 0]                      # two target ids landing on one draft id
    ids[1, 2] = NOWHERE                         # a special token: its mass joins "other"
    ids[2, 0], ids[2, -1] = 0, NOWHERE          # draft id 0 recorded before a special token (must stay recorded)
    p = torch.softmax(torch.randn(m, k, generator=gen), -1) * 0.9   # 10% outside the top-k
    return logq, ids, p


def _inside(seed: int, V: int = 20) -> torch.Tensor:
    inside = torch.rand(V, generator=torch.Generator().manual_seed(100 + seed)) < 0.7
    inside[0] = True
    return inside


@pytest.mark.parametrize("kind", ["fkl", "tv", "tli"])
@pytest.mark.parametrize("seed", range(4))
def test_divergence_equals_the_dictionary_reference(kind, seed):
    logq, ids, p = _case(seed)
    inside = _inside(seed)
    if kind == "tli":  # intersection partners are inside by construction
        ids = torch.where(inside[ids.clamp(min=0)] & (ids != NOWHERE), ids, NOWHERE)
    fast = divergence(logq, ids, p.double(), kind, inside)
    assert fast.tolist() == pytest.approx(divergence_reference(logq, ids, p, kind, inside), rel=1e-9, abs=1e-12)


def test_tli_is_one_minus_the_acceptance_of_the_renormalized_intersection_proposal():
    """With every target id recorded: 1 - sum over partnered ids of min(p, q~), q~ = q on the intersection
    renormalized; equal to tv when every id is inside; and it never falls below p's mass without a partner."""
    gen = torch.Generator().manual_seed(3)
    V = 12
    logq = torch.log_softmax(torch.randn(2, V, generator=gen), -1).double()
    p_full = torch.softmax(torch.randn(2, V, generator=gen), -1).double()             # over "target" ids 0..V-1
    inside = torch.ones(V, dtype=torch.bool)
    inside[[2, 5, 9]] = False
    partner = torch.where(inside, torch.arange(V), NOWHERE).repeat(2, 1)              # target t <-> draft t
    q_tilde = torch.where(inside, logq.exp(), 0.0)
    q_tilde = q_tilde / q_tilde.sum(-1, keepdim=True)
    expected = 1 - torch.minimum(p_full, q_tilde).sum(-1)
    got = divergence(logq, partner, p_full, "tli", inside)
    torch.testing.assert_close(got, expected)
    assert (got >= p_full[:, ~inside].sum(-1) - 1e-12).all()                         # unwinnable mass
    everything = torch.ones(V, dtype=torch.bool)
    every = torch.arange(V).repeat(2, 1)
    torch.testing.assert_close(divergence(logq, every, p_full, "tli", everything),
                               divergence(logq, every, p_full, "tv"))
    # A student moving mass onto an id outside the intersection loses nothing under tli, but does under tv.
    shifted = logq.clone()
    shifted[:, 2] += 3.0
    shifted = torch.log_softmax(shifted, -1)
    torch.testing.assert_close(divergence(shifted, partner, p_full, "tli", inside), got)
    assert not torch.allclose(divergence(shifted, every, p_full, "tv"), divergence(logq, every, p_full, "tv"))
    with pytest.raises(ValueError, match="inside"):
        divergence(logq, partner, p_full, "tli")
    # A model vocabulary padded past the tokenizer's ids: the padded rows count as outside.
    padded = torch.log_softmax(torch.cat([logq, torch.full((2, 3), 5.0, dtype=logq.dtype)], -1), -1)
    torch.testing.assert_close(divergence(padded, partner, p_full, "tli", inside), got)


def test_with_the_whole_vocabulary_recorded_it_is_the_exact_kl_and_tv():
    gen = torch.Generator().manual_seed(0)
    V = 12
    logq = torch.log_softmax(torch.randn(3, V, generator=gen), -1).double()
    logp = torch.log_softmax(torch.randn(3, V, generator=gen), -1).double()
    perm = torch.stack([torch.randperm(V, generator=gen) for _ in range(3)])        # one-to-one map
    p = logp.exp().gather(1, perm)
    kl = (logp.exp() * (logp - logq)).sum(-1)
    tv = 0.5 * (logp.exp() - logq.exp()).abs().sum(-1)
    torch.testing.assert_close(divergence(logq, perm, p, "fkl"), kl)
    torch.testing.assert_close(divergence(logq, perm, p, "tv"), tv)


@pytest.mark.parametrize("kind", ["fkl", "tv"])
def test_zero_exactly_when_the_student_matches_the_coarsened_teacher(kind):
    V = 10
    ids = torch.tensor([[3, 7, 3, NOWHERE]])
    p = torch.tensor([[0.4, 0.3, 0.1, 0.05]], dtype=torch.float64)   # P: 3 -> 0.5, 7 -> 0.3, other 0.2
    q = torch.full((1, V), 0.2 / 8, dtype=torch.float64)            # other 0.2 over the 8 unrecorded ids
    q[0, 3], q[0, 7] = 0.5, 0.3
    assert float(divergence(q.log(), ids, p, kind)) == pytest.approx(0.0, abs=1e-9)
    # Mass moved between two unrecorded ids is invisible: the unrecorded mass is one outcome.
    spread = q.clone()
    spread[0, 0], spread[0, 1] = spread[0, 0] + 0.01, spread[0, 1] - 0.01
    assert float(divergence(spread.log(), ids, p, kind)) == pytest.approx(0.0, abs=1e-9)
    # Negative control: moving 0.1 from recorded id 3 to an unrecorded id is seen by both losses.
    moved = q.clone()
    moved[0, 3], moved[0, 0] = 0.4, moved[0, 0] + 0.1
    assert float(divergence(moved.log(), ids, p, kind)) > 0.01


def test_gradients_are_finite_when_every_id_is_recorded():
    logq = torch.log_softmax(torch.randn(2, 4), -1).requires_grad_()
    ids = torch.arange(4).repeat(2, 1)
    p = torch.full((2, 4), 0.25)
    for kind in ("fkl", "tv", "tli"):
        logq.grad = None
        divergence(logq, ids, p, kind, torch.ones(4, dtype=torch.bool)).sum().backward()
        assert torch.isfinite(logq.grad).all()


@pytest.fixture(scope="module")
def gemma_deepseek():
    target, draft = zoo.tokenizer("gemma-3-270m"), zoo.tokenizer("deepseek-coder")
    return target, draft, aligned_codec(codec(target), codec(draft))


def test_documents_put_each_target_distribution_where_the_draft_predicts_that_token(gemma_deepseek):
    target, draft, aligned = gemma_deepseek
    first = first_piece_map(aligned)
    prompt = "def greet(name):\n    \"\"\"Say hello.\"\"\"\n"
    completion = "    return f'héllo, {name}' + ''.join(['😀', '\\t'])\n"
    gen_ids = target.encode(completion, add_special_tokens=False)
    n = len(gen_ids)
    top_ids = torch.tensor(gen_ids)[:, None].repeat(1, 3)          # top-1 = the generated id (greedy)
    top_ids[:, 1] = torch.arange(n) + 5000
    top_logp = torch.log(torch.tensor([[0.7, 0.2, 0.05]])).repeat(n, 1).half()
    prefix = prompt_ids(draft, prompt, aligned)
    ids, soft = document(prefix, gen_ids, top_ids, top_logp, aligned, first, max_len=512)
    # The draft text is exactly what the drafter reads for prompt + completion (the aligned encoding).
    assert ids == prompt_ids(draft, prompt + completion, aligned)
    assert len(soft["rows"]) == n
    inside = intersection(target, draft).draft_mask
    for row, mapped, tli, t in zip(soft["rows"].tolist(), soft["ids"].tolist(), soft["tli_ids"].tolist(), gen_ids):
        assert ids[row + 1] == mapped[0] == pieces(aligned, t)[0]
        # tli reads intersection partners only: a token spelled in several pieces has none
        assert tli[0] == (mapped[0] if len(pieces(aligned, t)) == 1 and aligned.target_to_draft[t] != NOWHERE
                          else NOWHERE)
        assert tli[0] == NOWHERE or bool(inside[tli[0]])
    assert (soft["tli_ids"][:, 0] == NOWHERE).any() and (soft["tli_ids"][:, 0] != NOWHERE).any()
    # Some of these target tokens are outside the intersection (several draft ids), so rows are not consecutive.
    assert any(len(pieces(aligned, t)) > 1 for t in gen_ids)
    torch.testing.assert_close(soft["p"][:, 0], torch.full((n,), 0.7), atol=1e-3, rtol=0)
    assert int(first[target.eos_token_id]) == draft.eos_token_id   # paired specials land on their counterpart
    short, soft_short = document(prefix, gen_ids, top_ids, top_logp, aligned, first, max_len=len(prefix) + 3)
    assert len(short) == len(prefix) + 3 and int(soft_short["rows"].max()) < len(short) - 1


def test_micro_batches_give_the_whole_batch_gradient_with_soft_targets():
    tok = zoo.tokenizer("deepseek-coder")
    gen = torch.Generator().manual_seed(0)
    docs = [[tok.bos_token_id] + torch.randint(100, 5000, (n,), generator=gen).tolist() for n in (3, 9, 27, 5)]
    soft = []
    for d in docs:
        m = len(d) - 1
        soft.append({"rows": torch.arange(m), "ids": torch.randint(100, 5000, (m, 4), generator=gen),
                     "p": torch.full((m, 4), 0.2)})
    ids, mask, labels, rows_soft = batch_rows(docs, [], batch_size=6, raw_fraction=0.0, pad_id=tok.eos_token_id,
                                              generator=torch.Generator().manual_seed(1), teacher_soft=soft)
    assert all(s is not None for s in rows_soft)
    grads, losses = [], []
    for micro in (1, 3):
        model = build_student(tok, StudentShape(1, 32, 64, 2), seed=0)
        losses.append(float(_accumulate(model, ids, mask, labels, torch.device("cpu"), False, micro, rows_soft,
                                        Distill(0.5, "tv"))))
        grads.append(torch.cat([p.grad.flatten() for p in model.parameters()]))
    assert losses[0] == pytest.approx(losses[1], rel=1e-5)
    assert torch.allclose(grads[0], grads[1], atol=1e-6, rtol=1e-4)
    # Negative control: the soft targets do change the gradient.
    model = build_student(tok, StudentShape(1, 32, 64, 2), seed=0)
    _accumulate(model, ids, mask, labels, torch.device("cpu"), False, 1, rows_soft, Distill(0.0, "tv"))
    assert not torch.allclose(torch.cat([p.grad.flatten() for p in model.parameters()]), grads[0])


def test_onpolicy_documents_train_on_the_divergence_only():
    """Rows marked next_token=False (the drafter's own text) get no labels; their divergence still trains, and
    a batch of only such rows gives a finite gradient equal to the divergence's alone."""
    tok = zoo.tokenizer("deepseek-coder")
    gen = torch.Generator().manual_seed(0)
    docs = [[tok.bos_token_id] + torch.randint(100, 5000, (n,), generator=gen).tolist() for n in (4, 7)]
    soft = [{"rows": torch.arange(len(d) - 1), "ids": torch.randint(100, 5000, (len(d) - 1, 4), generator=gen),
             "p": torch.full((len(d) - 1, 4), 0.2), "next_token": False} for d in docs]
    ids, mask, labels, rows_soft = batch_rows(docs, [], batch_size=4, raw_fraction=0.0, pad_id=tok.eos_token_id,
                                              generator=torch.Generator().manual_seed(1), teacher_soft=soft)
    assert (labels == -100).all()
    grads = []
    for weight in (0.5, 1.0):
        model = build_student(tok, StudentShape(1, 32, 64, 2), seed=0)
        loss = _accumulate(model, ids, mask, labels, torch.device("cpu"), False, 2, rows_soft, Distill(weight, "fkl"))
        grads.append(torch.cat([p.grad.flatten() for p in model.parameters()]))
        assert torch.isfinite(loss) and float(loss) > 0 and torch.isfinite(grads[-1]).all()
    torch.testing.assert_close(grads[0] * 2, grads[1])   # only the divergence term: weight scales it
    # Control: the same rows as teacher text (labels kept) change the gradient.
    for s in soft:
        s["next_token"] = True
    ids, mask, labels, rows_soft = batch_rows(docs, [], batch_size=4, raw_fraction=0.0, pad_id=tok.eos_token_id,
                                              generator=torch.Generator().manual_seed(1), teacher_soft=soft)
    model = build_student(tok, StudentShape(1, 32, 64, 2), seed=0)
    _accumulate(model, ids, mask, labels, torch.device("cpu"), False, 2, rows_soft, Distill(0.5, "fkl"))
    assert not torch.allclose(torch.cat([p.grad.flatten() for p in model.parameters()]), grads[0])


def test_target_argmax_labels_replace_only_the_recorded_positions_with_the_targets_top1():
    """next_token=target_argmax: at each recorded position the label is the first piece of the target's most likely
    token (top-1 of the recorded distribution), on-policy rows included; every other label is the text's."""
    gen = torch.Generator().manual_seed(0)
    doc = [1] + torch.randint(100, 5000, (9,), generator=gen).tolist()
    rows = torch.tensor([2, 3, 5, 7])   # a multi-piece token leaves gaps (rows 4, 6 predict its later pieces)
    top = torch.randint(100, 5000, (4, 3), generator=gen)
    top[2, 0] = NOWHERE                                    # a special token as top-1: keeps the text's label
    soft = {"rows": rows, "ids": top, "p": torch.full((4, 3), 0.3)}
    labels = torch.tensor(doc)
    out = argmax_labels(labels, soft)
    expect = list(doc)
    for r, t in zip(rows.tolist(), top[:, 0].tolist()):
        if t != NOWHERE:
            expect[r + 1] = t
    assert out.tolist() == expect and labels.tolist() == doc          # a copy, the input untouched
    assert out[rows[0] + 1] != doc[rows[0] + 1]                        # control: the replacement changed something
    # Through batch_rows: an on-policy row (no text labels) gets exactly the recorded positions' top-1 labels.
    ids, mask, lab, _ = batch_rows([doc], [], batch_size=2, raw_fraction=0.0, pad_id=0,
                                   generator=torch.Generator().manual_seed(1),
                                   teacher_soft=[dict(soft, next_token=False)], next_token="target_argmax")
    want = torch.full((len(doc),), -100)
    want[rows[[0, 1, 3]] + 1] = top[[0, 1, 3], 0]
    assert (lab == want).all()
    _, _, lab_text, _ = batch_rows([doc], [], batch_size=2, raw_fraction=0.0, pad_id=0,
                                   generator=torch.Generator().manual_seed(1),
                                   teacher_soft=[dict(soft, next_token=False)])
    assert (lab_text == -100).all()                                    # the default keeps on-policy rows unlabelled
    with pytest.raises(Exception, match="next_token"):
        batch_rows([doc], [], batch_size=1, raw_fraction=0.0, pad_id=0, generator=torch.Generator().manual_seed(1),
                   teacher_soft=[soft], next_token="argmax")


def test_greedy_agreement_is_argmax_equality_at_the_recorded_rows():
    gen = torch.Generator().manual_seed(3)
    logq = torch.log_softmax(torch.randn(8, 30, generator=gen), -1)   # [T, V]
    rows = torch.tensor([0, 2, 3, 6])
    top = torch.randint(0, 30, (4, 5), generator=gen)
    top[0, 0] = int(logq[0].argmax())                                  # agrees
    top[1, 0] = (int(logq[2].argmax()) + 1) % 30                       # disagrees
    top[2, 0] = NOWHERE                                                # maps nowhere: never agrees
    top[3, 0] = int(logq[6].argmax())
    got = greedy_agreement(logq, {"rows": rows, "ids": top}).tolist()
    assert got == [True, False, False, True]
    reference = [int(top[i, 0]) != NOWHERE and int(top[i, 0]) == max(range(30), key=lambda v: float(logq[r, v]))
                 for i, r in enumerate(rows.tolist())]
    assert got == reference
