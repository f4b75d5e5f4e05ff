"""xvocab.replay and experiments.replay_tau: a greedy run replayed against the target's recorded text makes the
real run's every step (proposals, acceptances, target forwards), and a replay that leaves the recording fails."""
import json

import pytest
from _support import mirrored_pairs

from experiments import replay_tau
from xvocab.engine import generate
from xvocab.replay import ReplayMismatch, replay
from xvocab.zoo.tiny import tiny_model

PAIRS = [("qwen2", "qwen35"), ("gpt-2", "mpt"), ("llama-spm", "mistral-v1")]
PROMPTS = ["def fibonacci(n):", "The quick brown fox", "  x = [1, 2, 3]\n"]
N = 20


@pytest.fixture(scope="module")
def pairs():
    return mirrored_pairs(PAIRS)


def _steps(out):
    return out.stats.target_forwards, out.stats.proposed, out.stats.accepted


CASES = [(PAIRS[0], "native"), pytest.param(PAIRS[0], "aligned", marks=pytest.mark.slow), (PAIRS[1], "native"),
         (PAIRS[2], "aligned")]


@pytest.mark.parametrize("pair,encoding", CASES, ids=lambda x: x if isinstance(x, str) else "<-".join(x))
def test_replay_makes_the_real_runs_every_step(pairs, pair, encoding):
    """Two drafts per pair: the target's mirror (accepts often) and an unrelated random model (rarely), so both
    long and short acceptances are compared; every step must match, not only the totals."""
    target, tt, mirror, dt = pairs[pair]
    for draft in (mirror, tiny_model(dt, seed=7)):
        for algorithm in ("slem", "tli", "slrs"):
            for prompt in PROMPTS[:2]:
                kw = dict(draft=draft, draft_tokenizer=dt, algorithm=algorithm, k=3, max_new_tokens=N,
                          draft_encoding=encoding)
                real = generate(prompt, target=target, target_tokenizer=tt, **kw)
                out = replay(prompt, real.token_ids, like=target, target_tokenizer=tt, **kw)
                assert out.token_ids == real.token_ids
                assert _steps(out) == _steps(real), (algorithm, prompt)


def test_replay_with_stop_strings_keeps_tau(pairs):
    """A recording that ends at a stop string: the same tokens and target forwards (the last step's acceptance
    past the stop is not in the recording, so only it may differ)."""
    target, tt, mirror, dt = pairs["gpt-2", "mpt"]
    real_ar = generate("def f(x):", target=target, target_tokenizer=tt, algorithm="ar", max_new_tokens=40)
    stop = real_ar.text[10:14]  # text the continuation writes: it then ends there
    for algorithm in ("slem", "tli"):
        kw = dict(draft=mirror, draft_tokenizer=dt, algorithm=algorithm, k=4, max_new_tokens=40, stop=[stop])
        real = generate("def f(x):", target=target, target_tokenizer=tt, **kw)
        assert len(real.token_ids) < 40
        out = replay("def f(x):", real.token_ids, like=target, target_tokenizer=tt, **kw)
        assert out.token_ids == real.token_ids
        assert out.stats.target_forwards == real.stats.target_forwards
        assert out.stats.proposed == real.stats.proposed
        assert out.stats.accepted[:-1] == real.stats.accepted[:-1]


def test_replay_reads_the_recording(pairs):
    """The negative control of the step equality above: a recording with one token changed is replayed as given
    (the replay cannot know the target's text), and its steps then differ from the real run's."""
    target, tt, mirror, dt = pairs["qwen2", "qwen35"]
    kw = dict(draft=mirror, draft_tokenizer=dt, algorithm="slem", k=3, max_new_tokens=N)
    real = generate(PROMPTS[0], target=target, target_tokenizer=tt, **kw)
    wrong = list(real.token_ids)
    wrong[N // 2] = (wrong[N // 2] + 1) % len(tt)
    out = replay(PROMPTS[0], wrong, like=target, target_tokenizer=tt, **kw)
    assert out.token_ids == wrong
    assert _steps(out) != _steps(real)


def test_replay_refuses_a_recording_cut_where_the_engine_would_go_on(pairs):
    target, tt, mirror, dt = pairs["qwen2", "qwen35"]
    real = generate(PROMPTS[0], target=target, target_tokenizer=tt, algorithm="ar", max_new_tokens=N)
    with pytest.raises(ReplayMismatch, match=f"at token {N - 5}"):
        replay(PROMPTS[0], real.token_ids[:N - 5], like=target, target_tokenizer=tt, draft=mirror, draft_tokenizer=dt,
               algorithm="slem", k=3, max_new_tokens=N)


def test_replay_tau_command_prints_the_measured_tau_beside_its_own(tmp_path, capsys):
    """experiments.replay_tau over records of a real run: its replay tau equals the recorded tau."""
    target_spec, draft_spec = "tiny:gpt-2", "tiny:mpt:3"
    target, tt = replay_tau.load_model(target_spec, "float32", "cpu", None)
    draft, dt = replay_tau.load_model(draft_spec, "float32", "cpu", None)
    rows = []
    for i, prompt in enumerate(r["prompt"] for r in replay_tau.datasets.load("tiny", None)):
        for algorithm in ("ar", "slem"):
            kw = {} if algorithm == "ar" else dict(draft=draft, draft_tokenizer=dt, k=4)
            out = generate(prompt, target=target, target_tokenizer=tt, algorithm=algorithm, max_new_tokens=N, **kw)
            rows.append({"config": {"target": target_spec, "draft": None if algorithm == "ar" else draft_spec,
                                    "algorithm": algorithm, "k": 0 if algorithm == "ar" else 4, "dataset": "tiny",
                                    "temperature": 0.0, "max_new_tokens": N, "stop": None},
                         "prompt_id": f"tiny/{i}", "prompt_index": i, "token_ids": out.token_ids,
                         "new_tokens": len(out.token_ids), "target_forwards": out.stats.target_forwards})
    path = tmp_path / "records.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    [row] = replay_tau.main([str(path), "--drafts", draft_spec, "--out", str(tmp_path / "replay.jsonl")])
    real = [r for r in rows if r["config"]["algorithm"] == "slem"]
    assert row["measured_tau"] == round(sum(r["new_tokens"] for r in real) / sum(r["target_forwards"] for r in real), 4)
    assert row["replay_tau"] == row["measured_tau"]
    assert json.loads((tmp_path / "replay.jsonl").read_text())["replay_tau"] == row["replay_tau"]
    assert "| slem | tiny:mpt:3 |" in capsys.readouterr().out
    [last] = replay_tau.main([str(path), "--drafts", draft_spec, "--skip", "1"])  # the second prompt alone
    assert last["prompts"] == 1 and last["replay_tau"] == round(real[1]["new_tokens"] / real[1]["target_forwards"], 4)


def test_replay_tau_refuses_records_without_greedy_rows():
    rows = [{"config": {"target": "t", "temperature": 1.0, "algorithm": "ar", "dataset": "tiny"}, "prompt_id": "a"}]
    with pytest.raises(replay_tau.ConfigError, match="no greedy rows"):
        replay_tau.greedy_recordings(rows)
