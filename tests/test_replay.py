"""xvocab.checks.replay and experiments.drafters.replay_tau: a greedy run replayed against the target's recorded text makes the
real run's every step (proposals, acceptances, target forwards), and a replay that leaves the recording fails."""
import json

import pytest
from _support import CROSS, mirrored_pairs

from experiments.drafters import replay_tau
from xvocab.checks.replay import ReplayMismatch, replay
from xvocab.decode.doors import generate
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
        for algorithm in CROSS:
            for prompt in PROMPTS[:2]:
                kw = dict(draft=draft, draft_tokenizer=dt, algorithm=algorithm, k=3, max_new_tokens=N,
                          draft_encoding=encoding)
                real = generate(prompt, target=target, target_tokenizer=tt, **kw)
                out = replay(prompt, real.token_ids, like=target, target_tokenizer=tt, **kw)
                assert out.token_ids == real.token_ids
                assert _steps(out) == _steps(real), (algorithm, prompt)


def test_a_draft_window_replays_the_real_runs_every_step(pairs):
    """draft_window cuts the draft's prompt only: the replayed target reads the whole prompt, as the real one does,
    so a windowed run's steps are replayed exactly. Control: without the window the steps differ."""
    target, tt, mirror, dt = pairs[PAIRS[2]]
    prompt = "def add(a, b):\n    return a + b\n\n\ndef mul(a, b):\n"
    moved = 0
    for algorithm in ("slem", "tli"):
        kw = dict(draft=mirror, draft_tokenizer=dt, algorithm=algorithm, k=3, max_new_tokens=N)
        real = generate(prompt, target=target, target_tokenizer=tt, draft_window=2, **kw)
        out = replay(prompt, real.token_ids, like=target, target_tokenizer=tt, draft_window=2, **kw)
        assert out.token_ids == real.token_ids and _steps(out) == _steps(real), algorithm
        moved += _steps(replay(prompt, real.token_ids, like=target, target_tokenizer=tt, **kw)) != _steps(real)
    assert moved


@pytest.mark.parametrize("pair", [PAIRS[0], PAIRS[2]], ids="<-".join)
def test_coupled_sampling_replays_the_real_runs_every_step(pairs, pair):
    """At T = 1 with coupling="gumbel", slem's verification is an exact match against the target's race on the
    tape: a replay of the coupled samples makes the real run's every step, at the draft's own temperature and at
    a colder one, for two seeds. Control: the replay with another seed (other noise) still emits the recording,
    but its steps differ; tli at T > 0 is refused (it reads the target's distribution)."""
    target, tt, mirror, dt = pairs[pair]
    for draft_temperature in (None, 0.5):
        for seed in (0, 3):
            kw = dict(draft=mirror, draft_tokenizer=dt, algorithm="slem", k=3, max_new_tokens=N, temperature=1.0,
                      seed=seed, coupling="gumbel", draft_temperature=draft_temperature)
            real = generate(PROMPTS[0], target=target, target_tokenizer=tt, **kw)
            out = replay(PROMPTS[0], real.token_ids, like=target, target_tokenizer=tt, **kw)
            assert out.token_ids == real.token_ids and _steps(out) == _steps(real), (draft_temperature, seed)
    other = replay(PROMPTS[0], real.token_ids, like=target, target_tokenizer=tt, **dict(kw, seed=seed + 1))
    assert other.token_ids == real.token_ids and _steps(other) != _steps(real)
    with pytest.raises(replay_tau.ConfigError, match="coupling='gumbel'"):
        replay(PROMPTS[0], real.token_ids, like=target, target_tokenizer=tt, **dict(kw, algorithm="tli"))


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
    """experiments.drafters.replay_tau over records of a real run: its replay tau equals the recorded tau."""
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
        replay_tau.exact_recordings(rows)


def _greedy_records(path, target_spec: str, n: int = N, **draft) -> list:
    """Write `target_spec`'s greedy records over the tiny dataset's prompts to `path` (the runner's fields replay
    reads): ar's, or with `draft` (draft=, draft_tokenizer=, algorithm=, k=) a speculative run's; returns the rows."""
    target, tt = replay_tau.load_model(target_spec, "float32", "cpu", None)
    kw = dict(draft, algorithm=draft.get("algorithm", "ar"))
    rows = []
    for i, prompt in enumerate(r["prompt"] for r in replay_tau.datasets.load("tiny", None)):
        out = generate(prompt, target=target, target_tokenizer=tt, max_new_tokens=n, **kw)
        rows.append({"config": {"target": target_spec, "draft": None, "algorithm": kw["algorithm"],
                                "k": kw.get("k", 0), "dataset": "tiny", "temperature": 0.0, "max_new_tokens": n,
                                "stop": None},
                     "prompt_id": f"tiny/{i}", "prompt_index": i, "token_ids": out.token_ids,
                     "new_tokens": len(out.token_ids), "target_forwards": out.stats.target_forwards})
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return rows


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_replay_tau_gives_the_tau_the_runner_measured(tmp_path, temperature):
    """End to end through the runner (experiments.run's interleaved variants, prompt i seeded seed + i): greedy, the
    replay of ar's text gives slem's and tli's measured tau; at T = 1 the replay of coupled ar's samples gives
    coupled slem's at its draft temperature, and a colder draft another tau (the option is read); tli there is
    refused by name."""
    from test_experiments import _cfg

    from experiments.sweep.runner import run

    cfg = _cfg(tmp_path, temperature=temperature)
    cfg.pop("hydra", None)
    drafting = ["slem", "tli"] if temperature == 0 else ["slem coupling=gumbel draft_temperature=0.5"]
    cfg.update(max_new_tokens=N, variants=["ar" if temperature == 0 else "ar coupling=gumbel", *drafting])
    path = run(cfg)
    args = [str(path), "--drafts", "mirror:refact", "--temperature", str(temperature)]
    if temperature == 0:
        rows = replay_tau.main(args + ["--algorithms", "slem", "tli"])
    else:
        rows = replay_tau.main(args + ["--draft-temperature", "0.5"])
        [cold] = replay_tau.main(args + ["--draft-temperature", "0.05"])
        assert cold["measured_tau"] is None and cold["replay_tau"] != rows[0]["replay_tau"]
        with pytest.raises(SystemExit, match="slem only"):
            replay_tau.main(args + ["--algorithms", "tli"])
    assert all(r["replay_tau"] == r["measured_tau"] and r["replay_tau"] > 1.2 for r in rows), rows


def test_replay_probe_gives_a_real_runs_measured_tau(pairs, tmp_path):
    """The training loop's probe (replay_tau.replay_probe) over ar's records gives the tau a real slem run measures
    with the same draft (here the target's mirror over another tokenizer, tau well above 1); the control, an
    unrelated random draft, gets less. Records of another target, an algorithm it cannot replay and a skip past
    every prompt are refused by name."""
    target, tt, mirror, dt = pairs["qwen2", "qwen35"]  # the target is tiny:qwen2:1 (mirrored_pairs' seed)
    path = tmp_path / "records.jsonl"
    _greedy_records(path, "tiny:qwen2:1")
    real = _greedy_records(tmp_path / "real.jsonl", "tiny:qwen2:1", draft=mirror, draft_tokenizer=dt,
                           algorithm="slem", k=4)
    measured = sum(r["new_tokens"] for r in real) / sum(r["target_forwards"] for r in real)
    probe = replay_tau.replay_probe(path, target="tiny:qwen2:1", draft_tokenizer=dt, draft_encoding="native",
                                    algorithms=["slem"], k=4)
    assert measured > 2 and probe(mirror) == {"replay_tau_slem": round(measured, 4)}
    assert probe(tiny_model(dt, seed=7))["replay_tau_slem"] < measured - 1
    kw = dict(draft_tokenizer=dt, draft_encoding="native", algorithms=["slem"])
    with pytest.raises(replay_tau.ConfigError, match="holds tiny:qwen2:1's greedy text"):
        replay_tau.replay_probe(path, target="tiny:qwen2:2", **kw)
    with pytest.raises(replay_tau.ConfigError, match="'sd' is not a cross-vocabulary"):
        replay_tau.replay_probe(path, target="tiny:qwen2:1", **dict(kw, algorithms=["sd"]))
    with pytest.raises(replay_tau.ConfigError, match="after skip=9"):
        replay_tau.replay_probe(path, target="tiny:qwen2:1", skip=9, **kw)


def test_student_stage_logs_the_replayed_tau_of_the_checkpoint_it_saves(tmp_path):
    """The drafter's Hydra entry end to end (both stages; the default tier's run of it, test_drafter's plain run is
    `slow`): a loadable checkpoint with its record. replay.records: the student stage logs replay_tau_<algorithm> at
    every evaluation; the last values are those experiments.drafters.replay_tau gives the saved checkpoint (saved in
    float32: the same weights), and the model card states them. Records of another target are refused by name before
    any training. (A 4-step student agrees with nothing, so its tau is 1: that the probe measures tau is
    test_replay_probe_gives_a_real_runs_measured_tau's to show.)"""
    import subprocess
    import sys

    from test_drafter import _train_drafter_command

    root, out, args = _train_drafter_command(tmp_path)
    records = tmp_path / "records.jsonl"
    _greedy_records(records, "tiny:llama-spm:3")
    cmd = [sys.executable, *args, f"replay.records={records}", "replay.algorithms=[slem,tli]", "replay.k=3",
           "student.save_dtype=float32"]
    proc = subprocess.run(cmd, cwd=root, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    from test_drafter import check_trained_drafter

    check_trained_drafter(tmp_path, out)
    log = [json.loads(line) for line in (out / "train_log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in log if "replay_tau_slem" in r] == [2, 4]  # eval_every=2 of 4 steps
    assert all(r["replay_tau_slem"] >= 1 and r["replay_tau_tli"] >= 1 for r in log if "replay_tau_slem" in r)
    rows = replay_tau.main([str(records), "--drafts", str(out), "--algorithms", "slem", "tli", "--k", "3"])
    replayed = {r["algorithm"]: r["replay_tau"] for r in rows}
    assert {"slem": log[-1]["replay_tau_slem"], "tli": log[-1]["replay_tau_tli"]} == replayed
    training = json.loads((out / "xvocab_training.json").read_text())
    assert training["final_replay"] == {"replay_tau_slem": replayed["slem"], "replay_tau_tli": replayed["tli"]}
    assert f"slem {replayed['slem']}, tli {replayed['tli']}" in (out / "README.md").read_text()
    other = tmp_path / "other.jsonl"
    _greedy_records(other, "tiny:gpt-2", n=4)  # another target's text: refused before a step is taken
    proc = subprocess.run(cmd + ["name=other", f"out_dir={tmp_path / 'other'}", f"replay.records={other}"], cwd=root,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode != 0 and "holds tiny:gpt-2's greedy text" in proc.stderr
