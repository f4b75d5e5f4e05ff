"""The drafter pipeline: prompts never overlap the evaluation set, batched teacher text equals the
target's own greedy decoding, training resumes bit-exactly, the checkpoint loads back as a draft,
and the shipped drafter is lossless on real HumanEval prompts."""
import ast
import json

import pytest
import torch

from xvocab import generate, zoo
from xvocab.alignment.roles import prompt_ids
from xvocab.drafter import code_prompts, generate_teacher_text, read_teacher_text
from xvocab.drafter.student import (
    StudentShape,
    batch_rows,
    build_student,
    encode_documents,
    lr_schedule,
    save_student,
    train_student,
)
from xvocab.drafter.teacher import continue_batch
from xvocab.errors import ConfigError


def test_prompts_are_humaneval_style_deterministic_and_exclude_the_evaluation_set():
    humaneval = zoo.dataset("humaneval")
    names = {row["entry_point"] for row in humaneval}
    a = code_prompts(seed=0, exclude_names=names, max_chars=1200)
    b = code_prompts(seed=0, exclude_names=names, max_chars=1200)
    assert a == b and len(a) > 1000
    assert {r["prompt"] for r in a}.isdisjoint(r["prompt"] for r in humaneval)
    defined = {r["id"].rsplit(":", 1)[1] for r in a}
    assert defined.isdisjoint(names)
    for r in a[:200]:
        assert r["prompt"].startswith(("def ", "async def ")) and r["prompt"].endswith("\n")
        assert len(r["prompt"]) <= 1200
        fn = ast.parse(r["prompt"] + "    pass\n").body[0]  # a signature and a docstring, nothing else
        assert isinstance(fn.body[0].value.value, str) and isinstance(fn.body[1], ast.Pass) and len(fn.body) == 2
    # Excluding a name really removes it (negative control: without exclusion it is there).
    some = a[0]["id"].rsplit(":", 1)[1]
    assert some not in {r["id"].rsplit(":", 1)[1] for r in code_prompts(seed=0, exclude_names={some}, max_chars=1200)}


def test_pypi_prompts_are_humaneval_style_pinned_and_disjoint_from_the_standard_librarys():
    """The second prompt source: real functions of the pinned wheels, HumanEval-shaped, most with examples,
    none named like a HumanEval entry point, and no id shared with the standard library's."""
    names = {row["entry_point"] for row in zoo.dataset("humaneval")}
    a = code_prompts(seed=0, exclude_names=names, max_chars=1200, source="pypi")
    assert a == code_prompts(seed=0, exclude_names=names, max_chars=1200, source="pypi") and len(a) > 2000
    packages = {r["id"].split("/")[1] for r in a}
    assert {"algorithms-1.0.1", "pydash-8.1.0", "more-itertools-11.2.1", "toolz-1.2.0"} <= packages
    assert sum(">>>" in r["prompt"] for r in a) > len(a) / 3  # the doctest examples HumanEval's prompts have
    assert {r["id"].rsplit(":", 1)[1] for r in a}.isdisjoint(names)
    assert all("/tests/" not in r["id"] and "/test/" not in r["id"] for r in a)
    stdlib = code_prompts(seed=0, exclude_names=names, max_chars=1200)
    assert {r["id"] for r in a}.isdisjoint(r["id"] for r in stdlib)
    for r in a[:200]:
        fn = ast.parse(r["prompt"] + "    pass\n").body[0]
        assert isinstance(fn.body[0].value.value, str) and isinstance(fn.body[1], ast.Pass) and len(fn.body) == 2
    with pytest.raises(ConfigError, match="stdlib, pypi"):
        code_prompts(seed=0, exclude_names=names, max_chars=1200, source="github")


@pytest.mark.slow
def test_the_larger_pypi_source_is_pinned_humaneval_style_and_disjoint_from_the_other_two():
    """pypi-more: each package feeds one source only, so the three sources' prompts never overlap (a held-out
    standard-library document cannot come back through another source); its prompts are HumanEval-shaped."""
    from xvocab.zoo.assets import CODE_PACKAGES, CODE_SOURCES

    keys = [k for pkgs in CODE_SOURCES.values() for k in pkgs]
    assert len(keys) == len(set(keys)) and set(keys) == set(CODE_PACKAGES)
    names = {row["entry_point"] for row in zoo.dataset("humaneval")}
    more = code_prompts(seed=0, exclude_names=names, max_chars=1200, source="pypi-more")
    packages = {r["id"].split("/")[1] for r in more}
    assert len(more) > 10000 and {"sympy-1.14.0", "nltk-3.10.4", "pygorithm-1.0.4"} <= packages
    assert sum(">>>" in r["prompt"] for r in more) > len(more) / 4
    assert {r["id"].rsplit(":", 1)[1] for r in more}.isdisjoint(names)
    ids = {r["id"] for r in more}
    for other in ("stdlib", "pypi"):
        assert ids.isdisjoint(r["id"] for r in code_prompts(seed=0, exclude_names=names, max_chars=1200, source=other))
    for r in more[:200]:
        fn = ast.parse(r["prompt"] + "    pass\n").body[0]
        assert isinstance(fn.body[0].value.value, str) and isinstance(fn.body[1], ast.Pass) and len(fn.body) == 2


@pytest.fixture(scope="module")
def tiny_target():
    tok = zoo.tokenizer("llama-spm")
    return zoo.tiny_model(tok, seed=3), tok


def test_batched_teacher_greedy_equals_the_targets_own_decoding(tiny_target):
    target, tok = tiny_target
    prompts = ["def add(a, b):\n    return", "x", "import os\n\n\ndef walk(path):\n    \"\"\"List files.\"\"\"\n"]
    texts, n, dists = continue_batch(target, tok, prompts, max_new_tokens=12, temperature=0.0,
                                     generator=torch.Generator().manual_seed(0))
    assert n == 36 and dists is None
    for prompt, text in zip(prompts, texts):  # left padding changes nothing: each row is its prompt alone
        assert text == generate(prompt, target=target, target_tokenizer=tok, algorithm="ar", max_new_tokens=12).text


def test_teacher_stops_on_every_eos_of_the_generation_config(tiny_target):
    """The teacher ends a row on any id of the model's EOS set (its generation config's too, as Qwen's instruct
    models have two), as the decoders do. Control: with the tokenizer's EOS alone the row runs past that id."""
    target, tok = tiny_target
    prompt = "def add(a, b):\n    return"
    full = generate(prompt, target=target, target_tokenizer=tok, algorithm="ar", max_new_tokens=12).token_ids
    stop_id = full[3]
    kept = full[: full.index(stop_id)]
    saved = target.generation_config.eos_token_id
    try:
        target.generation_config.eos_token_id = [tok.eos_token_id, stop_id]
        texts, n, _ = continue_batch(target, tok, [prompt], max_new_tokens=12, temperature=0.0,
                                     generator=torch.Generator().manual_seed(0))
        assert texts[0] == tok.decode(kept, skip_special_tokens=True) and n == len(kept) + 1
    finally:
        target.generation_config.eos_token_id = saved
    texts, n, _ = continue_batch(target, tok, [prompt], max_new_tokens=12, temperature=0.0,
                                 generator=torch.Generator().manual_seed(0))
    assert n == 12 and texts[0] == tok.decode(full, skip_special_tokens=True)  # control


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_teacher_distributions_are_the_targets_own_at_each_generated_position(tiny_target, temperature):
    """The recorded top-k log-probabilities equal a cache-free forward over prompt + generated ids, the
    recorded ids spell the text, and greedy rows' top-1 is the emitted id (sampled rows' need not be)."""
    target, tok = tiny_target
    prompts = ["def add(a, b):\n    return", "x"]
    texts, _, dists = continue_batch(target, tok, prompts, max_new_tokens=10, temperature=temperature,
                                     generator=torch.Generator().manual_seed(1), top_k=5)
    for prompt, text, dist in zip(prompts, texts, dists):
        ids = dist["ids"].long()
        assert tok.decode(ids.tolist(), skip_special_tokens=True) == text
        assert dist["top_ids"].shape == dist["top_logp"].shape == (len(ids), 5)
        context = torch.tensor([prompt_ids(tok, prompt) + ids.tolist()])
        with torch.no_grad():
            logp = torch.log_softmax(target(context).logits[0, -len(ids) - 1:-1].float(), -1)   # [n, V]
        expect_logp, expect_ids = logp.topk(5, dim=-1)
        assert torch.equal(dist["top_ids"].long()[:, 0], expect_ids[:, 0])
        torch.testing.assert_close(dist["top_logp"].float(), expect_logp, atol=2e-2, rtol=1e-2)  # float16 storage
        if temperature == 0:
            assert torch.equal(dist["top_ids"][:, 0].long(), ids)


def test_scoring_gives_the_targets_own_distributions_and_reproduces_the_teachers(tiny_target):
    """score_batch (on-policy rounds) = a cache-free unpadded forward of each row alone, an empty continuation
    included; and scoring the teacher's own generated ids gives back what the teacher recorded while generating."""
    from xvocab.drafter.onpolicy import score_batch

    target, tok = tiny_target
    prompts = ["def add(a, b):\n    return", "x", "import os\n", "y = 2"]
    conts = [tok.encode(" a + b\n", add_special_tokens=False), tok.encode(" = 1", add_special_tokens=False), [],
             tok.encode("\n\n\ndef main():\n    pass", add_special_tokens=False)]
    dists = score_batch(target, tok, prompts, conts, top_k=4, rows_per_forward=3)  # a forward of 3, then 1
    for prompt, cont, dist in zip(prompts, conts, dists):
        assert dist["ids"].tolist() == cont and dist["top_ids"].shape == dist["top_logp"].shape == (len(cont), 4)
        if not cont:
            continue
        with torch.no_grad():
            logits = target(torch.tensor([prompt_ids(tok, prompt) + cont])).logits[0, -len(cont) - 1:-1]
        expect_logp, expect_ids = torch.log_softmax(logits.float(), -1).topk(4, dim=-1)
        assert torch.equal(dist["top_ids"].long()[:, 0], expect_ids[:, 0])
        torch.testing.assert_close(dist["top_logp"].float(), expect_logp, atol=2e-2, rtol=1e-2)
    # Negative control: the same continuation after another prompt is scored differently.
    other = score_batch(target, tok, ["z"], conts[:1], top_k=4)[0]
    assert not torch.allclose(other["top_logp"].float(), dists[0]["top_logp"].float(), atol=2e-2)
    # The teacher's own text, scored afterwards, gives back its recorded distributions.
    texts, _, recorded = continue_batch(target, tok, prompts[:2], max_new_tokens=8, temperature=1.0,
                                        generator=torch.Generator().manual_seed(2), top_k=4)
    rescored = score_batch(target, tok, prompts[:2], [d["ids"].tolist() for d in recorded], top_k=4)
    for a, b in zip(recorded, rescored):
        assert torch.equal(a["top_ids"][:, 0], b["top_ids"][:, 0])
        torch.testing.assert_close(a["top_logp"].float(), b["top_logp"].float(), atol=2e-2, rtol=1e-2)


def test_onpolicy_shards_hold_the_drafters_text_scored_by_the_target_and_resume(tiny_target, tmp_path):
    from xvocab.alignment.aligned import aligned_codec
    from xvocab.alignment.tokens import codec
    from xvocab.drafter.onpolicy import generate_onpolicy_data, score_batch

    target, tok = tiny_target
    draft_tok = zoo.tokenizer("deepseek-coder")
    drafter = build_student(draft_tok, StudentShape(1, 32, 64, 2), seed=0).eval()
    aligned = aligned_codec(codec(tok), codec(draft_tok))
    prompts = [{"id": str(i), "prompt": f"def f{i}(x):\n    return"} for i in range(5)]
    kw = dict(batch_size=2, max_new_tokens=6, temperature=1.0, seed=1, top_k=3, meta={"t": "tiny"})
    generate_onpolicy_data(drafter, draft_tok, aligned, target, tok, prompts, tmp_path, **kw)
    rows = read_teacher_text(tmp_path, distributions=True)
    assert [r["id"] for r in rows] == [str(i) for i in range(5)] and {r["temperature"] for r in rows} == {1.0}
    assert len({r["completion"] for r in rows}) > 1        # sampled: the rows differ
    with torch.no_grad():  # the drafter's own continuation, drawn with the shard's generator
        texts, _, _ = continue_batch(drafter, draft_tok, [r["prompt"] for r in prompts[:2]], max_new_tokens=6,
                                     temperature=1.0, generator=torch.Generator().manual_seed(1 * 1_000_003 + 0),
                                     aligned=aligned)
    assert [r["completion"] for r in rows[:2]] == texts
    for r in rows:  # the target's ids spell the text, and the distributions are the target's at those ids
        assert r["dist"]["ids"].tolist() == codec(tok).encode_continuation(r["completion"])
        again = score_batch(target, tok, [r["prompt"]], [r["dist"]["ids"].tolist()], top_k=3)[0]
        torch.testing.assert_close(again["top_logp"].float(), r["dist"]["top_logp"].float(), atol=2e-2, rtol=1e-2)
    (tmp_path / "shard-00001.jsonl").unlink()
    generate_onpolicy_data(drafter, draft_tok, aligned, target, tok, prompts, tmp_path, **kw)
    assert [r["completion"] for r in read_teacher_text(tmp_path)] == [r["completion"] for r in rows]
    with pytest.raises(ConfigError, match="other settings"):
        generate_onpolicy_data(drafter, draft_tok, aligned, target, tok, prompts, tmp_path, **(kw | {"seed": 2}))


def test_scored_teacher_text_holds_the_first_sources_rows_with_the_targets_own_distributions(tiny_target, tmp_path):
    """stage=score (xvocab.drafter.rescore): shard i holds the rows of the first source that has it, each scored
    as the target scores that row alone; the target's own greedy text is its own top choice, another writer's is
    not everywhere (the control); a deleted shard is rewritten the same; prompts cut differently are refused."""
    from xvocab.alignment.tokens import codec
    from xvocab.drafter.onpolicy import score_batch
    from xvocab.drafter.rescore import score_teacher_text

    target, tok = tiny_target
    writer = zoo.tiny_model(tok, seed=4)  # another model over the target's vocabulary writes most of the text
    prompts = [{"id": str(i), "prompt": f"def f{i}(x):\n    return"} for i in range(5)]
    kw = dict(batch_size=2, max_new_tokens=6, sample_fraction=0.0, temperature=1.0, seed=1, top_k=3)
    own = generate_teacher_text(target, tok, prompts[:2], tmp_path / "own", meta={"target": "t", "prompts": "p"}, **kw)
    other = generate_teacher_text(writer, tok, prompts, tmp_path / "other", meta={"target": "w", "prompts": "p"}, **kw)
    score = dict(top_k=3, meta={"target": "t", "dtype": "float32"}, rows_per_forward=3)
    out = score_teacher_text(target, tok, [own, other], tmp_path / "scored", **score)
    rows = read_teacher_text(out, distributions=True)
    expected = read_teacher_text(own) + read_teacher_text(other)[2:]    # shard 0 from `own`, shards 1-2 from `other`
    assert [(r["id"], r["prompt"], r["completion"]) for r in rows] == [(r["id"], r["prompt"], r["completion"])
                                                                       for r in expected]
    for r in rows:
        ids = codec(tok).encode_continuation(r["completion"])
        alone = score_batch(target, tok, [r["prompt"]], [ids], top_k=3, rows_per_forward=1)[0]
        assert r["dist"]["ids"].tolist() == ids and torch.equal(r["dist"]["top_ids"][:, 0], alone["top_ids"][:, 0])
        torch.testing.assert_close(r["dist"]["top_logp"].float(), alone["top_logp"].float(), atol=2e-2, rtol=1e-2)
    agree = [bool(torch.equal(r["dist"]["top_ids"][:, 0].long(), r["dist"]["ids"].long())) for r in rows]
    assert agree[:2] == [True, True]       # greedy text by the target: its own first choice at every position
    assert not all(agree[2:])              # control: the writer's greedy text is not the target's everywhere
    meta = json.loads((out / "meta.json").read_text())
    assert [s["target"] for s in meta["sources"]] == ["t", "w"] and meta["top_k"] == 3 and meta["prompts"] == "p"
    before = (out / "shard-00001.jsonl").read_bytes()
    (out / "shard-00001.jsonl").unlink()
    score_teacher_text(target, tok, [own, other], out, **score)
    assert (out / "shard-00001.jsonl").read_bytes() == before
    with pytest.raises(ConfigError, match="other settings"):
        score_teacher_text(target, tok, [own, other], out, **(score | {"top_k": 2}))
    third = generate_teacher_text(writer, tok, prompts, tmp_path / "third", meta={"target": "w", "prompts": "q"}, **kw)
    with pytest.raises(ConfigError, match="cuts its prompts"):
        score_teacher_text(target, tok, [own, third], tmp_path / "mixed", **score)
    with pytest.raises(ConfigError, match="no meta.json"):
        score_teacher_text(target, tok, [tmp_path / "nothing"], tmp_path / "none", **score)
    with pytest.raises(ConfigError, match="score.sources"):
        score_teacher_text(target, tok, [], tmp_path / "none", **score)


def test_teacher_shards_resume_and_refuse_other_settings(tiny_target, tmp_path):
    target, tok = tiny_target
    prompts = [{"id": str(i), "prompt": f"def f{i}(x):\n    return"} for i in range(5)]
    kw = dict(batch_size=2, max_new_tokens=4, sample_fraction=0.5, temperature=1.0, seed=1, meta={"t": "tiny"})
    generate_teacher_text(target, tok, prompts, tmp_path, **kw)
    first = read_teacher_text(tmp_path)
    assert [r["id"] for r in first] == [str(i) for i in range(5)]
    assert sorted({r["temperature"] for r in first}) == [0.0, 1.0]
    (tmp_path / "shard-00001.jsonl").unlink()  # as if killed before shard 1 was written
    generate_teacher_text(target, tok, prompts, tmp_path, **kw)
    assert read_teacher_text(tmp_path) == first  # seeded per shard: the redone shard is identical
    with pytest.raises(ConfigError, match="other settings"):
        generate_teacher_text(target, tok, prompts, tmp_path, **(kw | {"max_new_tokens": 5}))
    # Continued elsewhere from shard 1 on (shard 0 archived, say): the same shards, none before it.
    generate_teacher_text(target, tok, prompts, tmp_path / "later", **kw, first_shard=1)
    assert sorted(p.name for p in (tmp_path / "later").glob("shard-*")) == ["shard-00001.jsonl", "shard-00002.jsonl"]
    assert read_teacher_text(tmp_path / "later") == first[2:]


def test_archived_teacher_text_reads_as_the_source_and_only_whole_new_shards_are_added(tiny_target, tmp_path):
    import gzip

    from xvocab.drafter.teacher import archive_teacher_text

    target, tok = tiny_target
    prompts = [{"id": str(i), "prompt": f"def f{i}(x):\n    return"} for i in range(5)]
    kw = dict(batch_size=2, max_new_tokens=4, sample_fraction=0.5, temperature=1.0, seed=1, meta={"t": "tiny"},
              top_k=3)
    src, dst = tmp_path / "teacher", tmp_path / "archive"
    generate_teacher_text(target, tok, prompts[:4], src, **kw)
    assert archive_teacher_text(src, dst) == 2
    assert read_teacher_text(dst) == read_teacher_text(src) and len(read_teacher_text(dst)) == 4
    for i in range(2):
        assert gzip.decompress((dst / f"shard-{i:05d}.jsonl.gz").read_bytes()) == \
            (src / f"shard-{i:05d}.jsonl").read_bytes()
    assert json.loads((dst / "meta.json").read_text())["top_k"] == 0  # a student reads it as text only
    with pytest.raises(ConfigError, match="no distributions"):
        read_teacher_text(dst, distributions=True)
    assert not list(dst.glob(".*tmp"))
    generate_teacher_text(target, tok, prompts, src, **kw)  # one shard more
    before = (dst / "shard-00000.jsonl.gz").read_bytes()
    assert archive_teacher_text(src, dst) == 1 and (dst / "shard-00000.jsonl.gz").read_bytes() == before
    assert [r["id"] for r in read_teacher_text(dst)] == [str(i) for i in range(5)]
    assert len(read_teacher_text(dst, max_shards=2)) == 4
    with pytest.raises(ConfigError, match="into itself"):
        archive_teacher_text(src, src)
    (src / "shard-00000.jsonl.gz").write_bytes((dst / "shard-00000.jsonl.gz").read_bytes())
    with pytest.raises(ConfigError, match="both plain and gzipped"):
        read_teacher_text(src)
    (src / "shard-00000.jsonl.gz").unlink()
    (src / "meta.json").write_text(json.dumps({**json.loads((src / "meta.json").read_text()), "seed": 9}))
    with pytest.raises(ConfigError, match="other settings"):
        archive_teacher_text(src, dst)


def test_held_out_documents_never_include_one_trained_on_with_less_teacher_text():
    """Training further on more teacher text (student.init_from, larger teacher.n_prompts) must not validate on
    documents the starting checkpoint was trained on: a row trained on among fewer rows is never held out later."""
    import random

    from xvocab.drafter.train import held_out_ids

    ids = [f"mod{i}.py:{i * 7}:f{i}" for i in range(3000)]
    for seed in (0, 1):
        small = held_out_ids(ids[:1000], 64, seed)
        assert len(small) == 64 and small == held_out_ids(list(reversed(ids[:1000])), 64, seed)  # order-free
        for more in (1500, 3000):
            large = held_out_ids(ids[:more], 64, seed)
            trained_before = set(ids[:1000]) - small
            assert len(large) == 64 and not large & trained_before
            assert large - small  # new documents do take places (otherwise this test checks nothing)
    assert held_out_ids(ids, 64, 0) != held_out_ids(ids, 64, 1)
    # Control: the first n of a seeded shuffle, the rule this replaced, fails the property.
    def first_of_shuffle(xs, n, seed):
        xs = list(xs)
        random.Random(seed).shuffle(xs)
        return set(xs[:n])

    assert first_of_shuffle(ids, 64, 0) & (set(ids[:1000]) - first_of_shuffle(ids[:1000], 64, 0))


def test_lr_schedule_warms_up_then_decays_and_resumes_where_it_stopped():
    import math

    def lrs(start=0, n=111):
        optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=123.0)  # (a checkpoint's stale lr)
        schedule = lr_schedule(optimizer, lr=1.0, min_lr=0.1, warmup=10, steps=110, start=start)
        out = []
        for _ in range(start, n):
            out.append(optimizer.param_groups[0]["lr"])
            optimizer.step()
            schedule.step()
        return out

    closed = [(s + 1) / 10 if s < 10 else 0.1 + 0.45 * (1 + math.cos(math.pi * (s - 10) / 100)) for s in range(111)]
    assert lrs() == pytest.approx(closed, abs=1e-9)
    assert lrs()[60] == pytest.approx(0.55) and lrs()[110] == pytest.approx(0.1)
    assert lrs(start=60) == pytest.approx(closed[60:], abs=1e-9)  # a run resumed at step 60


def _train(tok, docs, work, steps, **over):
    model = build_student(tok, StudentShape(2, 32, 64, 2), seed=0)
    kw = dict(steps=steps, batch_size=4, lr=2e-2, min_lr=2e-3, warmup=2, weight_decay=0.0, raw_fraction=0.0,
              checkpoint_every=3, eval_every=3, seed=0, pad_id=tok.eos_token_id, autocast=False)
    return train_student(model, docs, [], docs[:2], work, **(kw | over))


def test_training_learns_and_resumes_bit_exactly(tmp_path):
    tok = zoo.tokenizer("deepseek-coder")
    docs = encode_documents(tok, [f"def f{i}(x):\n    return x + {i}\n" for i in range(8)], 64)
    assert all(d[0] == tok.bos_token_id for d in docs)
    straight, progress = _train(tok, docs, tmp_path / "a", 12)
    log = [json.loads(line) for line in (tmp_path / "a" / "train_log.jsonl").read_text().splitlines()]
    assert progress["step"] == 12 and log[-1]["val_loss"] < log[2]["val_loss"] - 1.0  # it learns
    _train(tok, docs, tmp_path / "b", 12, time_budget_s=0.0)  # stops after one step, checkpointed
    resumed, progress = _train(tok, docs, tmp_path / "b", 12)
    assert progress["step"] == 12
    for (name, a), b in zip(straight.state_dict().items(), resumed.state_dict().values()):
        assert torch.equal(a, b), name
    # stop_at=s keeps the schedule planned for `steps`: s steps of a 12-step plan, then the rest, is the straight run;
    # control: a plan of s steps (the learning rate decays by step s) ends elsewhere.
    stopped, progress = _train(tok, docs, tmp_path / "c", 12, stop_at=5)
    assert progress["step"] == 5
    short, _ = _train(tok, docs, tmp_path / "d", 5)
    assert any(not torch.equal(a, b) for a, b in zip(stopped.state_dict().values(), short.state_dict().values()))
    resumed, progress = _train(tok, docs, tmp_path / "c", 12)
    assert progress["step"] == 12
    assert all(torch.equal(a, b) for a, b in zip(straight.state_dict().values(), resumed.state_dict().values()))


def test_batches_mix_raw_text_at_the_configured_rate():
    gen = torch.Generator().manual_seed(0)
    teacher, raw = [[1, 2, 3]], [[1, 9, 9, 9]]
    ids, mask, labels, _ = batch_rows(teacher, raw, batch_size=400, raw_fraction=0.25, generator=gen, pad_id=0)
    share = float((ids[:, 1] == 9).float().mean())
    assert 0.18 < share < 0.32  # binomial(400, 0.25): 4.5 standard deviations either side
    assert (labels[mask == 0] == -100).all() and (labels[mask == 1] == ids[mask == 1]).all()


def test_saved_student_loads_as_a_draft_and_is_lossless(tmp_path, tiny_target):
    target, target_tok = tiny_target
    tok = zoo.tokenizer("deepseek-coder")
    student = build_student(tok, StudentShape(2, 32, 64, 2), seed=0).eval()
    out = save_student(student, tok, tmp_path / "drafter", tokenizer_name="deepseek-coder", dtype="float32",
                       extra={"note": "test"})
    draft, draft_tok = zoo.model(str(out), device="cpu")
    assert draft_tok.xvocab_add_bos == tok.xvocab_add_bos and len(draft_tok) == len(tok)
    ids = torch.tensor([[tok.bos_token_id, 100, 200]])
    assert torch.equal(draft(ids).logits, student(ids).logits)
    save_student(student, tok, out, tokenizer_name="deepseek-coder", dtype="float16", extra={})  # replaced whole
    assert not out.with_name("drafter.new").exists() and not out.with_name("drafter.old").exists()
    prompt = "def add(a, b):\n    return"
    ar = generate(prompt, target=target, target_tokenizer=target_tok, algorithm="ar", max_new_tokens=10)
    for algorithm in ("slem", "tli"):
        out_ = generate(prompt, target=target, target_tokenizer=target_tok, draft=draft, draft_tokenizer=draft_tok,
                        algorithm=algorithm, max_new_tokens=10, k=3)
        assert out_.text == ar.text


def _train_drafter_command(tmp_path):
    """(repository root, output directory, arguments) of a train_drafter run on a tiny target, both stages."""
    from pathlib import Path

    out = tmp_path / "drafter"
    args = ["-m", "experiments.drafters.train", "target=tiny:llama-spm:3", "draft_tokenizer=deepseek-coder",
            f"work_dir={tmp_path / 'work'}", f"out_dir={out}", "teacher.n_prompts=6", "teacher.batch_size=3",
            "teacher.max_new_tokens=5", "teacher.dtype=float32", "student.layers=1", "student.hidden=32",
            "student.intermediate=64", "student.heads=2", "student.steps=4", "student.batch_size=2",
            "student.holdout=2", "student.eval_every=2", "student.checkpoint_every=2", "threads=1", "device=cpu",
            "student.encoding=aligned", "name=tiny-drafter", f"hydra.run.dir={tmp_path / 'hydra'}"]
    return Path(__file__).resolve().parent.parent, out, args


@pytest.mark.slow  # the default tier runs the same entry, with replay on (test_replay.py's student-stage test)
def test_train_drafter_command_end_to_end_on_a_tiny_target(tmp_path):
    """The Hydra entry runs both stages and leaves a loadable checkpoint with its record."""
    import subprocess
    import sys

    root, out, args = _train_drafter_command(tmp_path)
    cmd = [sys.executable, *args]
    proc = subprocess.run(cmd, cwd=root, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    check_trained_drafter(tmp_path, out)


def check_trained_drafter(tmp_path, out) -> None:
    """What a run of `_train_drafter_command` leaves: two teacher shards, the record, the loss figure and log, and a
    checkpoint that loads with its tokenizer and drafts as it learned."""
    assert len(list((tmp_path / "work" / "teacher").glob("shard-*.jsonl"))) == 2
    record = json.loads((out / "xvocab_training.json").read_text())
    assert record["step"] == 4 and record["teacher_documents"] == 6 and record["draft_tokenizer"] == "deepseek-coder"
    assert (out / "loss.png").stat().st_size > 0 and len((out / "train_log.jsonl").read_text().splitlines()) == 4
    draft, tok = zoo.model(str(out), device="cpu")
    assert draft.config.vocab_size == len(tok) and draft.config.xvocab_tokenizer == "deepseek-coder"
    assert draft.config.xvocab_draft_encoding == "aligned"  # the engine drafts the way the student learned


def test_model_card_says_who_wrote_scored_teacher_text():
    """The model card names the writers of scored text (stage=score), as teacher text or extra teacher text, and
    the decoding temperature of the target's own; a control: the target's own text names no other writer."""
    from xvocab.drafter.train import _distill_words, _scored_words, _writer_words

    own = {"target": "big", "dtype": "float32", "temperature": 1.0, "sample_fraction": 0.25, "prompts": "python-stdlib"}
    scored = {"target": "big", "dtype": "bfloat16", "top_k": 32, "prompts": "python-stdlib",
              "sources": [{"target": "big", "dtype": "float32"}, {"target": "small", "dtype": "bfloat16"}]}
    extra = {"target": "big", "teacher_meta": scored, "student_config": {},
             "extra_teacher": [{"documents": 5, "dir": "d", "meta": scored}]}
    assert _writer_words(extra) == "`big` (float32) and `small` (bfloat16) continued"
    assert "recorded its own top-32 distribution" in _scored_words(extra)
    assert "written by `big` and `small`, scored by the target" in _distill_words(extra)
    plain = dict(extra, teacher_meta=own, extra_teacher=[{"documents": 5, "dir": "d", "meta": own}])
    assert _writer_words(plain) == "`big` (float32) continued" and "small" not in _distill_words(plain)
    assert _scored_words(plain) == ", greedy and sampled at T=1.0"
    assert "T=1.0, sample share 0.25" in _distill_words(plain)


@pytest.mark.slow
def test_train_drafter_command_scores_teacher_text_and_trains_on_the_targets_labels(tmp_path):
    """stage=score through the Hydra entry (three processes: slow): the target scores text another directory holds
    (here its own teacher text, written from shard 1 on into a second directory after shard 0 in the first), a
    student trains on the scored directory with the target's labels, and its model card names the writers; with
    no sources the stage refuses by name."""
    import subprocess
    import sys

    root, out, args = _train_drafter_command(tmp_path)
    cmd = [sys.executable, *args]
    work = tmp_path / "work"
    proc = subprocess.run(cmd + ["stage=teacher", "teacher.n_prompts=3"], cwd=root, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    proc = subprocess.run(cmd + ["stage=teacher", "teacher.first_shard=1", f"teacher.dir={work / 'later'}"], cwd=root,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert [p.name for p in sorted((work / "later").glob("shard-*.jsonl"))] == ["shard-00001.jsonl"]
    proc = subprocess.run(cmd + ["stage=score", f"score.sources=[{work / 'teacher'},{work / 'later'}]"], cwd=root,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    scored = read_teacher_text(work / "scored", distributions=True)
    assert [r["completion"] for r in scored] == [r["completion"] for r in read_teacher_text(work / "teacher")
                                                 + read_teacher_text(work / "later")]
    proc = subprocess.run(cmd + ["stage=student", f"teacher.dir={work / 'scored'}", "student.next_token=target_argmax",
                                 "student.distill_weight=0.5", "student.distill_loss=tli"], cwd=root,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    record = json.loads((out / "xvocab_training.json").read_text())
    assert record["teacher_documents"] == 6 and len(record["teacher_meta"]["sources"]) == 2
    assert "xvocab.drafter.rescore" in (out / "README.md").read_text()
    proc = subprocess.run(cmd + ["stage=score", f"score.dir={work / 'none'}"], cwd=root, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode != 0 and "score.sources" in proc.stderr


@pytest.mark.slow
def test_train_drafter_command_distills_on_policy_and_second_source_text(tmp_path):
    """The later stages through the Hydra entry (five processes: slow): on-policy data from the drafter just made,
    teacher text from the second prompt source, logit-level distillation from both into a deepened student, and
    distillation from text recorded without distributions refused with the fix."""
    import subprocess
    import sys

    root, out, args = _train_drafter_command(tmp_path)
    cmd = [sys.executable, *args]
    proc = subprocess.run(cmd, cwd=root, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    # Logit-level distillation from the recorded distributions, continuing the drafter just made.
    out2 = tmp_path / "distilled"
    distill = [a.replace(f"out_dir={out}", f"out_dir={out2}").replace("name=tiny-drafter", "name=tiny-distilled")
               .replace("student.layers=1", "student.layers=2")
               for a in cmd] + ["stage=student", f"student.init_from={out}", "student.distill_weight=0.5",
                                "student.distill_loss=tli", "student.grow=true"]   # deepened 1 -> 2 layers first
    # The drafter just made writes on-policy data, which the distilling student adds to its documents.
    proc = subprocess.run(cmd + ["stage=onpolicy", f"onpolicy.drafter={out}", "onpolicy.n_prompts=3",
                                 "onpolicy.max_new_tokens=5"], cwd=root, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert len(read_teacher_text(tmp_path / "work" / "onpolicy", distributions=True)) == 3
    # Teacher text from the second prompt source, in its own directory, joins the training documents.
    pypi = tmp_path / "work" / "teacher_pypi"
    proc = subprocess.run(cmd + ["stage=teacher", "teacher.prompts=pypi", f"teacher.dir={pypi}", "teacher.n_prompts=3"],
                          cwd=root, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert all(r["id"].startswith("pypi/") for r in read_teacher_text(pypi))
    proc = subprocess.run(distill + ["student.onpolicy=true", "onpolicy.n_prompts=3", f"student.extra_teacher=['{pypi}']",
                                     "student.next_token=target_argmax"], cwd=root, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    record = json.loads((out2 / "xvocab_training.json").read_text())
    assert record["extra_teacher"][0]["documents"] == 3 and record["extra_teacher"][0]["meta"]["prompts"].startswith("pypi")
    assert record["teacher_meta"]["prompts"] == "python-stdlib" and "teacher continuations" in (out2 / "README.md").read_text()
    assert record["init_from"] == str(out) and record["distill"]["loss"] == "tli" and record["shape"]["layers"] == 2
    assert record["onpolicy"]["documents"] == 3 and record["onpolicy"]["meta"]["drafter"] == str(out)
    assert "On-policy data" in (out2 / "README.md").read_text()
    assert 0 <= record["distill"]["teacher_rest_mass"] < 1 and 0 <= record["final_val_tv"] <= 1
    assert 0 <= record["final_val_tli"] <= 1 and 0 <= record["final_val_greedy"] <= 1
    assert record["student_config"]["next_token"] == "target_argmax"
    assert "target_argmax" in (out2 / "README.md").read_text()
    log = [json.loads(line) for line in (out2 / "train_log.jsonl").read_text().splitlines()]
    assert log[0]["step"] == 0 and "val_tv" in log[0] and "val_tli" in log[0] and "val_fkl" in log[-1]
    assert "val_greedy" in log[0] and "val_greedy" in log[-1]
    assert "logit level" in (out2 / "README.md").read_text() and "TLI's" in (out2 / "README.md").read_text()
    # Distilling from teacher text recorded without distributions is refused with the fix.
    bare = [a.replace(f"work_dir={tmp_path / 'work'}", f"work_dir={tmp_path / 'bare'}") for a in distill
            if a != "stage=student"]
    proc = subprocess.run(bare + ["teacher.top_k=0"], cwd=root, capture_output=True, text=True, timeout=600)
    assert proc.returncode != 0 and "teacher.top_k > 0" in proc.stderr


@pytest.mark.slow
def test_train_drafter_command_resumes_and_refuses_other_settings(tmp_path):
    """Rerun: both stages are found done; resuming the student on other settings is refused by name."""
    import subprocess
    import sys

    root, out, args = _train_drafter_command(tmp_path)
    cmd = [sys.executable, *args]
    proc = subprocess.run(cmd, cwd=root, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    # A rerun finds both stages done: nothing is regenerated or retrained.
    proc = subprocess.run(cmd, cwd=root, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert len((out / "train_log.jsonl").read_text().splitlines()) == 4
    # Resuming that student (same name) on differently encoded text is refused, naming the setting.
    other = [c.replace("encoding=aligned", "encoding=native") for c in cmd] + ["stage=student"]
    proc = subprocess.run(other, cwd=root, capture_output=True, text=True, timeout=600)
    assert proc.returncode != 0 and "other settings {'encoding': ('aligned', 'native')}" in proc.stderr
    # A student begun before held-out documents were chosen by id hash is not resumed under the new split.
    config = tmp_path / "work" / "students" / "tiny-drafter" / "config.json"
    stored = json.loads(config.read_text())
    config.write_text(json.dumps({k: v for k, v in stored.items() if k != "holdout_rule"}))
    proc = subprocess.run(cmd + ["stage=student"], cwd=root, capture_output=True, text=True, timeout=600)
    assert proc.returncode != 0 and "'holdout_rule': ('first-of-shuffle', 'id-hash')" in proc.stderr
    # Extra teacher text that repeats the held-out prompts (here: the same directory) would leak them: refused.
    proc = subprocess.run([c.replace("name=tiny-drafter", "name=tiny-extra") for c in cmd]
                          + ["stage=student", f"student.extra_teacher=['{tmp_path / 'work' / 'teacher'}']"],
                          cwd=root, capture_output=True, text=True, timeout=600)
    assert proc.returncode != 0 and "repeats 2 held-out prompts" in proc.stderr
    # A stop_at outside the planned schedule is refused, naming both settings.
    proc = subprocess.run(cmd + ["stage=student", "student.stop_at=0"], cwd=root, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode != 0 and "student.stop_at=0 with student.steps=" in proc.stderr


def test_micro_batches_give_the_whole_batch_gradient():
    from xvocab.drafter.student import _accumulate

    tok = zoo.tokenizer("deepseek-coder")
    docs = encode_documents(tok, ["x = 1\n" * n for n in (1, 3, 9, 27, 2, 5)], 64)
    ids, mask, labels, _ = batch_rows(docs, [], batch_size=6, raw_fraction=0.0, generator=torch.Generator().manual_seed(0),
                                   pad_id=tok.eos_token_id)
    grads, losses = [], []
    for micro in (1, 3):
        model = build_student(tok, StudentShape(1, 32, 64, 2), seed=0)
        losses.append(float(_accumulate(model, ids, mask, labels, torch.device("cpu"), False, micro)))
        grads.append(torch.cat([p.grad.flatten() for p in model.parameters()]))
    assert losses[0] == pytest.approx(losses[1], rel=1e-5)
    assert torch.allclose(grads[0], grads[1], atol=1e-6, rtol=1e-4)


SHIPPED = "gemma-3-270m-drafter-deepseek-coder-aligned-v5"  # the default (xvocab.defaults.DRAFT)


def test_shipped_drafter_is_small_whole_and_lossless_on_humaneval():
    """The committed drafter loads by name offline, fits the size budget, and decodes Gemma exactly."""
    from xvocab.zoo.models import DRAFTERS_DIR

    assert SHIPPED in zoo.drafter_names()
    size = sum(p.stat().st_size for p in (DRAFTERS_DIR / SHIPPED).iterdir())
    assert size < 26 * 2**20, f"{size / 2**20:.1f} MiB"
    record = json.loads((DRAFTERS_DIR / SHIPPED / "xvocab_training.json").read_text())
    assert record["target"] == "gemma-3-270m" and record["command"].startswith("python -m experiments.drafters.train")
    target, target_tok = zoo.model("gemma-3-270m", device="cpu")
    draft, draft_tok = zoo.model(SHIPPED, device="cpu")
    assert draft.dtype == torch.float32 and (len(draft_tok), len(target_tok)) == (32256, 262144)
    for row in zoo.dataset("humaneval")[30:32]:  # outside the 20 prompts of the benchmark tables too
        ar = generate(row["prompt"], target=target, target_tokenizer=target_tok, algorithm="ar", max_new_tokens=24)
        for algorithm in ("slem", "tli"):
            out = generate(row["prompt"], target=target, target_tokenizer=target_tok, draft=draft,
                           draft_tokenizer=draft_tok, algorithm=algorithm, k=4, max_new_tokens=24)
            assert out.token_ids == ar.token_ids, (row["id"], algorithm)
            assert out.stats.tau > 1.0  # the drafter's tokens are accepted, not just the target's own


def test_grown_positions_spread_the_inserted_layers():
    from xvocab.drafter.student import grown_positions

    assert grown_positions(4, 4) == [0, 1, 2, 3]
    assert grown_positions(4, 6) == [0, 1, 3, 4] and grown_positions(4, 8) == [0, 2, 4, 6]
    for old, new in [(1, 3), (3, 4), (4, 5), (5, 12)]:
        pos = grown_positions(old, new)
        assert pos[0] == 0 and pos == sorted(set(pos)) and pos[-1] < new and len(pos) == old
    with pytest.raises(ConfigError, match="at least as deep"):
        grown_positions(4, 3)


def test_growing_depth_keeps_the_function_and_trains_the_new_layers():
    """grow_depth: the deepened drafter's logits equal the original's; the zeroed output projections get gradients
    at once; control: the same copies without zeroed projections compute something else."""
    from xvocab.drafter.student import grow_depth

    tok = zoo.tokenizer("deepseek-coder")
    model = build_student(tok, StudentShape(2, 32, 64, 2), seed=0).eval()
    ids = torch.randint(100, 5000, (2, 17), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        before = model(ids).logits
        grown = grow_depth(model, 5).eval()
        after = grown(ids).logits
    assert grown.config.num_hidden_layers == 5 and len(grown.model.layers) == 5
    torch.testing.assert_close(after, before, atol=1e-5, rtol=0)
    assert grown.lm_head.weight.data_ptr() == grown.model.embed_tokens.weight.data_ptr()   # still tied
    grown.train()
    grown(ids, labels=ids).loss.backward()
    inserted = [j for j in range(5) if not grown.model.layers[j].mlp.down_proj.weight.detach().any()]
    assert len(inserted) == 3
    for j in inserted:
        assert grown.model.layers[j].mlp.down_proj.weight.grad.abs().sum() > 0
        assert grown.model.layers[j].self_attn.o_proj.weight.grad.abs().sum() > 0
    # Control: un-zero the inserted layers' projections (plain copies) and the function changes.
    with torch.no_grad():
        for j in inserted:
            grown.model.layers[j].mlp.down_proj.weight.normal_(0, 0.02)
            grown.model.layers[j].self_attn.o_proj.weight.normal_(0, 0.02)
        assert not torch.allclose(grown.eval()(ids).logits, before, atol=1e-5)


def test_init_from_grows_only_when_asked_and_only_in_depth():
    """student.init_from with another depth is refused with the fix (student.grow=true); with grow it deepens the
    shipped drafter; another width is refused even with grow."""
    from xvocab.drafter.train import _initial

    c = zoo.model(SHIPPED, device="cpu")[0].config
    shape = StudentShape(c.num_hidden_layers, c.hidden_size, c.intermediate_size, c.num_attention_heads)
    deeper = StudentShape(shape.layers + 2, shape.hidden, shape.intermediate, shape.heads)
    with pytest.raises(ConfigError, match="student.grow=true"):
        _initial(SHIPPED, "deepseek-coder", "aligned", deeper)
    assert _initial(SHIPPED, "deepseek-coder", "aligned", deeper, grow=True).config.num_hidden_layers == deeper.layers
    wider = StudentShape(shape.layers + 2, shape.hidden * 2, shape.intermediate, shape.heads)
    with pytest.raises(ConfigError, match="keep hidden"):
        _initial(SHIPPED, "deepseek-coder", "aligned", wider, grow=True)
    shallower = StudentShape(shape.layers - 1, shape.hidden, shape.intermediate, shape.heads)
    with pytest.raises(ConfigError, match="layers >="):
        _initial(SHIPPED, "deepseek-coder", "aligned", shallower, grow=True)


def test_shared_embedding_drafter_loads_as_trained_and_refuses_another_base(tmp_path):
    """A drafter saved without its (frozen) embedding loads back computing exactly what was saved, from the
    base's bytes; a base whose embedding changed, and an embedding that was trained, are refused by name."""
    from xvocab.errors import AssetError
    from xvocab.zoo import shared_embedding

    tok = zoo.tokenizer("deepseek-coder")
    base = build_student(tok, StudentShape(2, 32, 64, 2), seed=0).eval()
    base_dir = save_student(base, tok, tmp_path / "base", tokenizer_name="deepseek-coder", dtype="float16", extra={})
    base16, _ = zoo.model(str(base_dir), device="cpu")  # the embedding as shipped (float16 bytes)
    child = build_student(tok, StudentShape(2, 32, 64, 2), seed=1)
    child.get_input_embeddings().weight.data.copy_(base16.get_input_embeddings().weight)
    out = save_student(child, tok, tmp_path / "child", tokenizer_name="deepseek-coder", dtype="float32", extra={},
                       shared_embedding=str(base_dir))
    assert (out / "model.safetensors").stat().st_size < 0.5 * (base_dir / "model.safetensors").stat().st_size
    loaded, _ = zoo.model(str(out), device="cpu")
    ids = torch.tensor([[tok.bos_token_id, 100, 200, 3000]])
    assert torch.equal(loaded(ids).logits, child.eval()(ids).logits)
    # control: without the fill the loaded embedding would be a fresh initialization, and the logits differ
    assert not torch.equal(build_student(tok, StudentShape(2, 32, 64, 2), seed=1)(ids).logits, loaded(ids).logits)
    # trained further again from the child (which holds no embedding): the grandchild names the base, and loads
    grandchild = build_student(tok, StudentShape(2, 32, 64, 2), seed=3)
    grandchild.get_input_embeddings().weight.data.copy_(base16.get_input_embeddings().weight)
    out2 = save_student(grandchild, tok, tmp_path / "grandchild", tokenizer_name="deepseek-coder", dtype="float32",
                        extra={}, shared_embedding=str(out))
    assert shared_embedding.shared_from(out2)["drafter"] == str(base_dir)
    assert torch.equal(zoo.model(str(out2), device="cpu")[0](ids).logits, grandchild.eval()(ids).logits)
    trained = build_student(tok, StudentShape(2, 32, 64, 2), seed=2)  # its embedding is not the base's
    with pytest.raises(AssetError, match="not .*base"):
        save_student(trained, tok, tmp_path / "bad", tokenizer_name="deepseek-coder", dtype="float16", extra={},
                     shared_embedding=str(base_dir))
    assert not (tmp_path / "bad").exists()
    save_student(trained, tok, base_dir, tokenizer_name="deepseek-coder", dtype="float16", extra={})  # base replaced
    with pytest.raises(AssetError, match="not the one it was trained with"):
        zoo.model(str(out), device="cpu")
    assert shared_embedding.shared_from(base_dir) is None
