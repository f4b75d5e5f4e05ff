"""Configs compose, every experiment runs as a real multirun on tiny models, records resume, reports add up."""
import argparse
import csv
import json
import subprocess
import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from experiments import report, run
from xvocab import algorithms, defaults
from xvocab.errors import ConfigError
from xvocab.measure import records

ROOT = Path(__file__).resolve().parent.parent
CONF = ROOT / "conf"
EXPERIMENTS = sorted(p.stem for p in (CONF / "experiment").glob("*.yaml"))
GROUPS = {g: sorted(p.stem for p in (CONF / g).glob("*.yaml")) for g in ("pair", "algorithm", "dataset")}


def _compose(overrides):
    with initialize_config_dir(config_dir=str(CONF), version_base=None):
        return compose("config", overrides=overrides, return_hydra_config=True)


@pytest.mark.parametrize("override", [f"{g}={o}" for g, opts in GROUPS.items() for o in opts] +
                         [f"+experiment={e}" for e in EXPERIMENTS])
def test_every_config_composes(override):
    cfg = _compose([override])
    filled = defaults.fill({key: cfg[key] for key in defaults.RUN_KEYS})  # null: the library's default
    assert cfg.pair.target and cfg.algorithm.name in algorithms.REGISTRY
    assert cfg.dataset.name and filled["k"] >= 1 and filled["max_new_tokens"] >= 1


def test_library_defaults_have_one_source(monkeypatch):
    """conf/config.yaml leaves the library's defaults null; generate() and the scripts take them from
    xvocab.defaults; the default pair is one pair everywhere."""
    import inspect

    from omegaconf import OmegaConf

    import xvocab
    from experiments.benchmarks import vs_hf as bench_vs_hf

    base = OmegaConf.load(CONF / "config.yaml")
    assert all(base[key] is None for key in defaults.RUN_KEYS)
    signature = inspect.signature(xvocab.generate).parameters
    assert signature["k"].default == defaults.K and signature["max_new_tokens"].default == defaults.MAX_NEW_TOKENS
    pair = OmegaConf.load(CONF / "pair" / f"{base.defaults[0]['pair']}.yaml")
    assert (pair.target, pair.draft) == (defaults.TARGET, defaults.DRAFT)
    main = OmegaConf.load(CONF / "experiment" / "main.yaml")
    assert "override /pair: gemma_drafter" in (CONF / "experiment" / "main.yaml").read_text() and main.results_dir.startswith("runs/")
    parsed = _parsed_arguments(bench_vs_hf.main, monkeypatch, K=7, TARGET="t-sentinel", DRAFT="d-sentinel")
    assert parsed.k == 7 and parsed.pair == ["t-sentinel", "d-sentinel"]  # read from xvocab.defaults, not copied


class _Parsed(Exception):
    def __init__(self, namespace):
        self.namespace = namespace


def _parsed_arguments(main, monkeypatch, **values):
    """The arguments `main` parses from an empty command line while xvocab.defaults holds `values`."""
    for name, value in values.items():
        monkeypatch.setattr(defaults, name, value)
    parse = argparse.ArgumentParser.parse_args

    def stop_after_parsing(self, args=None, namespace=None):
        raise _Parsed(parse(self, args, namespace))

    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", stop_after_parsing)
    with pytest.raises(_Parsed) as parsed:
        main([])
    return parsed.value.namespace


@pytest.mark.parametrize("launcher", ["local_parallel", "slurm"])
def test_launchers_compose(launcher):
    cfg = _compose([f"hydra/launcher={launcher}", "+experiment=real_pair"])
    assert cfg.hydra.launcher._target_.endswith("Launcher")


# The default suite runs the main job's sweep; the others (same runner, other axes) with -m slow.
DEFAULT_RUNS = ("main",)


@pytest.mark.parametrize("experiment", [pytest.param(e, marks=() if e in DEFAULT_RUNS else pytest.mark.slow)
                                        for e in EXPERIMENTS])
def test_every_experiment_runs_as_a_multirun_on_tiny_models(experiment, tmp_path):
    out = tmp_path / "results"
    composed = _compose([f"+experiment={experiment}"])
    # An experiment of interleaved variants names real drafts: on the tiny pair its variants are the tiny pair's
    # (a sampled one's coupled, as its own are, so that its exact rows are checked too).
    sampled = (composed.get("temperature") or 0) > 0
    variants = '["ar coupling=gumbel","slem coupling=gumbel",tli]' if sampled else "[ar,slem,tli]"
    interleaved = ["variants=" + variants] if composed.get("variants") else []
    cmd = [sys.executable, "-m", "experiments.run", "--multirun", f"+experiment={experiment}", "pair=tiny",
           "dataset=tiny", "max_new_tokens=6", "dtype=float32", "device=cpu", "threads=1", "warmup=0",
           f"results_dir={out}", f"hydra.sweep.dir={tmp_path / 'multirun'}", *interleaved]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    recs = records.read(out / "records.jsonl")
    sweep = composed.hydra.sweeper.get("params") or {}
    algorithms = set(str(sweep["algorithm"]).split(",")) if "algorithm" in sweep else {"ar", "slem", "tli"}
    assert {r["config"]["algorithm"] for r in recs} >= algorithms
    assert {r["prompt_id"] for r in recs} == {"tiny/0", "tiny/1"}
    # Greedy rows, and coupled slem's at T > 0, emit ar's tokens (every sweep here has some of either).
    exact = [r for r in recs if records.equals_ar_by_construction(r["config"])]
    assert exact and all(r["equals_ar"] for r in exact)
    for r in recs:
        assert r["git_revision"] and r["torch"] and r["config_hash"] == records.config_hash(r["config"])


def _cfg(tmp_path, algorithm="slem", temperature=0.0):
    cfg = _compose([f"algorithm={algorithm}", "pair=tiny", "dataset=tiny", "max_new_tokens=6", "device=cpu",
                    "threads=1", "warmup=0", f"temperature={temperature}", f"results_dir={tmp_path}"])
    from omegaconf import OmegaConf

    return OmegaConf.to_container(cfg, resolve=False) | {"results_dir": str(tmp_path)}


def test_killed_sweep_resumes_and_loses_nothing(tmp_path):
    cfg = _cfg(tmp_path)
    cfg.pop("hydra", None)
    path = run.run(cfg)
    full = records.read(path)
    assert len(full) == 4  # 2 prompts x (slem + its ar check)
    # Simulate a kill: the last record is cut mid-line.
    raw = path.read_bytes()
    lines = raw.splitlines(keepends=True)
    path.write_bytes(b"".join(lines[:-1]) + lines[-1][: len(lines[-1]) // 2])
    assert len(records.read(path)) == 3
    run.run(cfg)
    again = records.read(path)
    assert len(again) == 4
    assert sorted((r["config_hash"], r["prompt_id"]) for r in again) == \
        sorted((r["config_hash"], r["prompt_id"]) for r in full)
    run.run(cfg)  # nothing left to do: nothing is appended
    assert len(records.read(path)) == 4


def test_draft_encoding_is_a_config_axis(tmp_path):
    cfg = _cfg(tmp_path) | {"draft_encoding": "aligned"}
    cfg.pop("hydra", None)
    recs = records.read(run.run(cfg))
    assert {(r["config"]["algorithm"], r["config"].get("draft_encoding")) for r in recs} == {("slem", "aligned"),
                                                                                             ("ar", None)}
    assert all(r["equals_ar"] for r in recs if r["config"]["algorithm"] == "slem")


def test_cache_is_a_config_axis(tmp_path):
    cfg = _cfg(tmp_path) | {"cache": "static"}
    cfg.pop("hydra", None)
    recs = records.read(run.run(cfg))
    assert {r["config"].get("cache") for r in recs if r["config"]["algorithm"] == "slem"} == {"static"}
    assert all(r["equals_ar"] for r in recs if r["config"]["algorithm"] == "slem")


def test_batch_size_and_policy_are_config_axes(tmp_path):
    """Batched sweeps decode through generate_batch: the same greedy outputs as one prompt at a time, rows
    sharing a run's wall time (throughput), the policy's choices recorded; the report compares them with
    `ar` at the same batch size."""
    def go(algorithm, **over):
        cfg = _cfg(tmp_path, algorithm) | over
        cfg.pop("hydra", None)
        return run.run(cfg)

    path = go("slem")                                     # one at a time (and its ar check)
    go("slem", batch_size=2)
    go("ar", batch_size=2)
    go("slem", batch_size=2, policy=True)
    recs = records.read(path)
    single = {r["prompt_id"]: r["token_ids"] for r in recs
              if r["config"]["algorithm"] == "slem" and "batch_size" not in r["config"]}
    batched = [r for r in recs if r["config"].get("batch_size") == 2]
    assert len(batched) == 6 and all(r["batch"]["rows"] == 2 for r in batched)
    assert all(r["token_ids"] == single[r["prompt_id"]] for r in batched)
    assert all(r["batch"]["policy_k"] for r in batched if r["config"].get("policy"))
    rows = {(r["algorithm"], r["batch_size"], r["policy"]): r for r in report.aggregate(recs)}
    assert rows["slem", 2, False]["equals_ar"] == 1.0 and rows["slem", 2, True]["equals_ar"] == 1.0
    # One continuous-batching run: its rows carry their own end times; throughput is over the last one.
    ar_rows = [r for r in batched if r["config"]["algorithm"] == "ar"]
    assert len({r["batch"]["id"] for r in ar_rows}) == 1
    assert rows["ar", 2, False]["tokens_per_s"] == pytest.approx(
        sum(r["new_tokens"] for r in ar_rows) / max(r["batch"]["wall_seconds"] for r in ar_rows))


def _fake(alg, k, tokens, forwards, wall, accepted, proposed, **extra):
    config = {"target": "T", "draft": None if alg == "ar" else "D", "algorithm": alg, "dataset": "humaneval",
              "k": k, "temperature": 0.0, "top_k": 0, "top_p": 1.0, "max_new_tokens": tokens, "seed": 0,
              "device": "cpu", "dtype": "float32", "threads": 2}
    return {"config": config, "config_hash": records.config_hash(config), "prompt_id": "p", "new_tokens": tokens,
            "target_forwards": forwards, "wall_seconds": wall, "ttft_seconds": 0.1, "tpot_seconds": 0.01,
            "accepted_per_step": accepted, "proposed_per_step": proposed, "passed": True, **extra}


def test_the_report_checks_coupled_slem_against_coupled_ar_on_the_same_tape():
    """At T > 0 coupled slem must emit coupled ar's samples (same seed): the report derives equals_ar where a run
    did not record it, and only against the ar of the same tape; other sampled rows have no reference."""
    def rec(alg, ids, seed=0, coupling="gumbel", prompt="p"):
        r = _fake(alg, 0 if alg == "ar" else 4, len(ids), len(ids), 1.0, [0] * len(ids), [0] * len(ids),
                  token_ids=ids)
        r["config"] |= {"temperature": 1.0, "seed": seed} | ({"coupling": coupling} if alg != "tli" else {})
        r["config_hash"], r["prompt_id"] = records.config_hash(r["config"]), prompt
        return r

    recs = [rec("ar", [5, 6, 7]), rec("ar", [5, 6, 7], prompt="q"), rec("slem", [5, 6, 7]),
            rec("slem", [5, 6, 8], prompt="q"),                       # control: another sample fails the check
            rec("ar", [1, 2, 3], seed=1), rec("slem", [1, 2, 3], seed=1),  # another tape: its own reference
            rec("tli", [9, 9, 9])]
    rows = {r["algorithm"]: r for r in report.aggregate(recs)}
    # seed 0: p equal, q not; seed 1: equal to its own tape's ar (against seed 0's it would not be: 1/3)
    assert rows["slem"]["prompts"] == 3 and rows["slem"]["equals_ar"] == pytest.approx(2 / 3)
    assert rows["ar"]["equals_ar"] is None and rows["tli"]["equals_ar"] is None
    assert records.equals_ar_by_construction(recs[2]["config"])
    assert not records.equals_ar_by_construction(recs[-1]["config"])
    assert not records.equals_ar_by_construction(recs[2]["config"] | {"coupling": "none"})


def test_the_frontier_figure_draws_runs_with_costs_and_names_what_is_missing(tmp_path):
    from experiments.sweep import figure
    from experiments.sweep import plots

    runs = []
    for i, (c, v) in enumerate([(0.05, 1.6), (0.01, 1.1)]):
        d = tmp_path / f"run{i}"
        for r in (_fake("ar", 0, 10, 10, 2.0, [0] * 10, [0] * 10),
                  _fake("slem", 4, 10, 4, 1.0, [4, 2, 0, 0], [4, 4, 4, 4], equals_ar=True)):
            r["config"]["cpu"] = f"cpu {i}"  # costs join the rows of the machine they were measured on
            records.append(d / "records.jsonl", r | {"config_hash": records.config_hash(r["config"])})
        records.append(d / "costs.jsonl", {"target": "T", "draft": "D", "k": 4, "c": c, "v": v, "cpu": f"cpu {i}"})
        runs.append(str(d))
    path = figure.main(["--frontier", *runs, "--out", str(tmp_path / "f.png")])
    assert path.stat().st_size > 0
    with pytest.raises(SystemExit):
        figure.main([*runs])                                   # several runs only as a frontier
    with pytest.raises(SystemExit):
        figure.main(["--frontier", runs[0], "--temperature", "1"])  # no rows at that temperature
    assert plots.frontier_figure([], tmp_path / "none.png", "t") is None


def test_report_on_a_fixture_of_records(tmp_path):
    recs = [_fake("ar", 0, 10, 10, 2.0, [0] * 10, [0] * 10),
            _fake("slem", 4, 10, 4, 1.0, [4, 2, 0, 0], [4, 4, 4, 4], equals_ar=True)]
    recs.append(dict(recs[0]))  # the same ar prompt recorded twice by parallel sweep points counts once
    for r in recs:
        records.append(tmp_path / "records.jsonl", r)
    rows = {r["algorithm"]: r for r in report.main([str(tmp_path)])}
    assert rows["ar"]["speedup"] == 1.0 and rows["ar"]["prompts"] == 1
    assert rows["slem"]["speedup"] == pytest.approx(2.0)   # 10 tok/s against 5 tok/s
    assert rows["slem"]["tau"] == pytest.approx(2.5)       # 10 tokens / 4 target forwards
    assert rows["slem"]["acceptance"] == pytest.approx(6 / 16)
    assert rows["slem"]["per_position"] == [0.5, 0.5, 0.25, 0.25]
    assert rows["slem"]["equals_ar"] == 1.0 and rows["slem"]["pass_at_1"] == 1.0
    for name in ("report.md", "report.csv", "report.tex"):
        assert (tmp_path / name).read_text().strip()
    with open(tmp_path / "report.csv", newline="") as fh:
        csv_rows = {r["algorithm"]: r for r in csv.DictReader(fh)}
    assert json.loads(csv_rows["slem"]["per_position"]) == [0.5, 0.5, 0.25, 0.25]
    assert "efficiency" not in csv_rows["slem"]  # no costs.jsonl: no bound columns
    # With measured forward costs the report adds c, v, the bound tau / (k c + v) and the efficiency.
    records.append(tmp_path / "costs.jsonl", {"target": "T", "draft": "D", "k": 4, "c": 0.05, "v": 1.6})
    rows = {r["algorithm"]: r for r in report.main([str(tmp_path)])}
    assert rows["slem"]["bound"] == pytest.approx(2.5 / (4 * 0.05 + 1.6))
    assert rows["slem"]["bound_paper"] == pytest.approx(2.5 / 1.2)
    assert rows["slem"]["efficiency"] == pytest.approx(2.0 / (2.5 / 1.8))
    assert "efficiency" in (tmp_path / "report.md").read_text() and "c" not in rows["ar"]
    assert "draft_encoding" not in (tmp_path / "report.md").read_text()  # no sweep set it
    # A sweep over the draft encoding keeps its points apart and shows the column.
    aligned = _fake("slem", 4, 10, 5, 1.0, [4, 1], [4, 4], equals_ar=True)
    aligned["config"]["draft_encoding"] = "aligned"
    aligned["config_hash"] = records.config_hash(aligned["config"])
    records.append(tmp_path / "records.jsonl", aligned)
    rows = {(r["algorithm"], r["draft_encoding"]): r for r in report.main([str(tmp_path)])}
    assert rows["slem", "aligned"]["tau"] == pytest.approx(2.0) and rows["slem", None]["tau"] == pytest.approx(2.5)
    assert "| draft_encoding |" in (tmp_path / "report.md").read_text()


def test_report_puts_the_reference_beside_a_run_and_says_where_and_when(tmp_path, capsys):
    run_dir, ref_dir = tmp_path / "runs", tmp_path / "results"
    for d, cpu, wall in ((run_dir, "CPU here", 4.0), (ref_dir, "CPU there", 1.0)):
        for rec in (_fake("ar", 0, 10, 10, 2.0, [0] * 10, [0] * 10),
                    _fake("slem", 4, 10, 4, wall, [4, 2, 0, 0], [4, 4, 4, 4], equals_ar=True)):
            rec["config"]["cpu"] = rec["cpu"] = cpu
            rec["config_hash"] = records.config_hash(rec["config"])
            rec["recorded_at"] = "2026-12-01 10:00" if d == run_dir else "2026-01-01 10:00"
            records.append(d / "records.jsonl", rec)
    rows = {r["algorithm"]: r for r in report.main([str(run_dir), "--reference", str(ref_dir)])}
    assert rows["slem"]["speedup"] == pytest.approx(0.5) and rows["slem"]["ref_speedup"] == pytest.approx(2.0)
    assert rows["slem"]["ref_cpu"] == "CPU there" and rows["slem"]["ref_tau"] == pytest.approx(2.5)
    printed = capsys.readouterr().out
    assert str(run_dir / "records.jsonl") in printed and "CPU here" in printed and "2026-12-01 10:00" in printed
    assert "| ref_speedup |" in (run_dir / "report.md").read_text()
    assert not (ref_dir / "report.md").exists()  # the reference is read, never written


def test_forward_costs_are_measured_on_a_warm_cache(monkeypatch):
    """forward_ms times forwards of exactly `new_tokens` positions after `context` cached ones (never a prefill),
    warm-up included and cropped back after each; the ratios and bounds are the paper's."""
    from xvocab import zoo
    from xvocab.measure import cost
    from xvocab.runtime.kv import Decoder

    tok = zoo.tokenizer("gpt-2")
    model = zoo.tiny_model(tok, n_layers=1, hidden_size=32)
    fed = []
    step = Decoder.step

    def watched(self, full_ids, extra=()):
        before = len(self.ids)
        out = step(self, full_ids, extra)
        fed.append((before, len(full_ids) + len(extra) - before))  # (cached positions, positions fed)
        return out

    monkeypatch.setattr(Decoder, "step", watched)
    for new_tokens in (1, 4):
        fed.clear()
        cost.forward_ms(model, new_tokens=new_tokens, context=16, reps=3)
        assert fed[0] == (0, 15)                        # the context's prefill, untimed
        assert fed[1:] == [(15, new_tokens)] * (2 + 3)  # warm-up and timed steps, each after the same 15
    ratios = cost.cost_ratios(target_ms=10.0, draft_ms=2.5, verify_ms=12.0, k=4)
    assert ratios == {"target_ms": 10.0, "draft_ms": 2.5, "verify_ms": 12.0, "c": 0.25, "v": 1.2, "k": 4}
    assert cost.speedup_bounds(3.0, k=4, c=0.25, v=1.0) == {"bound_paper": 1.5, "bound_measured": 1.5}


def test_unloadable_dataset_says_which_work_offline(monkeypatch):
    import datasets as hf_datasets

    from experiments import datasets
    from xvocab.errors import ConfigError

    def no_hub(*args, **kwargs):  # what load_dataset raises without hub access (without waiting for timeouts)
        raise ConnectionError("Couldn't reach 'cnn_dailymail' on the Hub (LocalEntryNotFoundError)")

    monkeypatch.setattr(hf_datasets, "load_dataset", no_hub)
    with pytest.raises(ConfigError, match="humaneval, code_edit, prose_summary, prose_qa, tiny"):
        datasets.load("cnn_dailymail", 2)


def test_offline_prose_stand_ins_follow_their_templates():
    from experiments import datasets

    summary, qa = datasets.load("prose_summary", None), datasets.load("prose_qa", None)
    assert len(summary) >= 20 and len(qa) >= 10 and datasets.load("prose_summary", 5) == summary[:5]
    assert all(r["prompt"].startswith("Summarize the following article.\n\n") and r["prompt"].endswith("\n\nSummary:")
               for r in summary)
    for r in qa:
        heading = r["prompt"].rsplit('the section "', 1)[1].split('" explain?')[0]
        document = r["prompt"].split("\n\nQuestion: ")[0]
        assert heading in document and 6000 < len(document) <= 12000 and r["prompt"].endswith("\nAnswer:")
    assert len({r["id"] for r in summary + qa}) == len(summary) + len(qa)


def test_the_editing_set_holds_each_function_whole_and_asks_one_edit_of_it():
    """code_edit: every HumanEval function, whole, in the prompt's code block, one of the four edits rotating, the
    answer's block opened (its stop closes it); a renamed parameter is one the function has."""
    from experiments import datasets
    from xvocab import zoo

    rows, problems = datasets.load("code_edit", None), zoo.dataset("humaneval")
    assert len(rows) == len(problems) == len({r["id"] for r in rows})
    for i, (row, problem) in enumerate(zip(rows, problems)):
        function = row["prompt"].split("```python\n", 1)[1].split("```", 1)[0]
        assert function.strip() == (problem["prompt"] + problem["canonical_solution"]).strip()
        assert row["prompt"].endswith("Reply with the complete function only.\n\n```python\n")
        assert row["edit"] in row["prompt"] and ("renamed" not in row["edit"] or f"`{row['edit'].split('`')[1]}`"
                                                 in row["prompt"] and row["edit"].split("`")[1] in function)
    assert len({r["edit"].split("`")[0] for r in rows}) == len(datasets.EDITS)
    assert datasets.STOPS["code_edit"] == ("\n```",)


def test_humaneval_check_executes_completions():
    from experiments.datasets import humaneval
    from xvocab import zoo

    problems = zoo.dataset("humaneval")[:20]  # the problems the experiments decode
    assert all(humaneval.passes(p, p["canonical_solution"]) for p in problems)
    assert not any(humaneval.passes(p, "    return None\n") for p in problems)  # control: a wrong body fails
    # the canonical body followed by what a model writes next: cut at the stop string, it still passes
    assert humaneval.passes(problems[0], problems[0]["canonical_solution"] + "\n\ndef main():\n    raise SystemExit(1)\n")
    assert humaneval.truncate("    return 1\n\ndef other():\n    pass") == "    return 1\n"


def test_figures_are_made_from_aggregated_results_only(tmp_path):
    from paper_figs import figures

    for r in [_fake("ar", 0, 10, 10, 2.0, [0] * 10, [0] * 10),
              _fake("tli", 4, 10, 5, 1.25, [4, 1, 0, 0, 1], [4, 4, 4, 4, 4], equals_ar=True)]:
        records.append(tmp_path / "records.jsonl", r)
    report.main([str(tmp_path)])
    paths = figures.main([str(tmp_path / "report.csv"), "--pairs", str(ROOT / "results" / "pair_report.csv"),
                          "--out", str(tmp_path / "figs")])
    assert len(paths) == 8 and all(p.stat().st_size > 1000 for p in paths)
    loaded = subprocess.run([sys.executable, "-c", "import sys, paper_figs.figures; print('torch' in sys.modules)"],
                            cwd=ROOT, capture_output=True, text=True, check=True).stdout.strip()
    assert loaded == "False"  # figure code never loads models (it runs where no torch is installed)


def test_bench_vs_hf_runs_side_by_side_on_tiny_models(tmp_path):
    from experiments.benchmarks import vs_hf as bench_vs_hf

    table, findings = bench_vs_hf.main(["--pair", "tiny:starcoder:1", "mirror:refact", "--prompts", "1", "--reps", "1",
                                        "--max-new-tokens", "8", "--threads", "1", "--out", str(tmp_path)])
    methods = {t["method"] for t in table}
    assert {"hf_ar", "xvocab_ar", "xvocab_slem", "xvocab_tli"} <= methods
    assert not [f for f in findings if f.startswith("xvocab")]  # xvocab's greedy outputs equal the target alone
    by = {t["method"]: t for t in table}
    assert by["xvocab_ar"]["tau"] == pytest.approx(1.0) and by["hf_ar"]["tau"] == pytest.approx(1.0)
    assert list(tmp_path.glob("*.md")) and list(tmp_path.glob("*.jsonl"))


def test_batch_bench_compares_batch_sizes_side_by_side_on_tiny_models(tmp_path):
    from experiments.benchmarks import batch as batch_bench

    rows = batch_bench.main(["--pair", "tiny:starcoder:1", "mirror:refact", "--dataset", "tiny", "--prompts", "2",
                             "--batch-sizes", "1", "2", "--max-new-tokens", "6", "--threads", "1", "--out", str(tmp_path)])
    by = {(r["batch_size"], r["method"]): r for r in rows}
    assert set(by) == {(1, "ar (sequential)")} | {(b, m) for b in (1, 2) for m in batch_bench.METHODS}
    assert all(r["equals_ar"] == 1.0 for r in rows if "equals_ar" in r)   # greedy: every batched method = ar
    assert 0 <= by[2, "slem+policy"]["speculated"] <= 1
    text = (tmp_path / "batch_bench.md").read_text()
    assert "x sequential ar" in text and len(records.read(tmp_path / "records.jsonl")) == len(rows)


def test_sampling_check_and_costs_commands_on_tiny_models(tmp_path):
    """Both commands run end to end and write their records. Twelve draws say nothing about losslessness
    (tests/test_distributions.py proves that, with controls); the statistic itself is tested below."""
    from experiments.sweep import costs
    from experiments.checks import sampling_check

    rows = sampling_check.main(["--pair", "tiny:starcoder:1", "mirror:refact", "--samples", "12", "--threads", "1",
                                "--out", str(tmp_path)])
    assert {r["method"] for r in rows} >= {"xvocab_slem", "xvocab_tli", "xvocab_slrs"}
    assert all(0 <= r["p_value"] <= 1 and 0 <= r["tv"] <= 1 for r in rows)
    assert list(tmp_path.glob("sampling_check__*.md")) and list(tmp_path.glob("sampling_check__*.json"))
    out = costs.main(["tiny:gpt-2:2", "tiny:gpt-2:3", "--k", "2", "3", "--reps", "3", "--context", "16",
                      "--threads", "1", "--out", str(tmp_path)])
    assert [r["k"] for r in out] == [2, 3] and len(records.read(tmp_path / "costs.jsonl")) == 2


def test_sampling_check_statistic_separates_same_from_different():
    """sampling_check.compare passes two samples of one distribution and flags a shifted one (the control)."""
    import random
    from collections import Counter

    from experiments.checks.sampling_check import ALPHA, compare

    rng = random.Random(0)
    base = lambda: Counter(rng.choices("abcd", weights=[4, 3, 2, 1], k=1500))  # noqa: E731
    shifted = Counter(rng.choices("abcd", weights=[3, 3, 2, 2], k=1500))
    p_same, tv_same = compare(base(), base())
    p_diff, tv_diff = compare(base(), shifted)
    assert p_same > ALPHA and p_diff < ALPHA and tv_diff > tv_same


def test_expected_acceptance_tells_a_mirror_from_a_stranger():
    """alpha_i = sum min(p, q_TLI) is a probability, 1 wherever greedy argmaxes agree, and far higher for a draft
    that mirrors the target than for an unrelated one (the control that it measures something)."""
    from statistics import fmean

    from experiments.drafters.expected_acceptance import expected_acceptance
    from xvocab import algorithms, zoo
    from xvocab.verification.sampling import SamplingParams
    from xvocab.zoo.tiny import mirror_model

    tt, dt = zoo.tokenizer("starcoder"), zoo.tokenizer("refact")
    target = zoo.tiny_model(tt, seed=1)
    mirror, stranger = mirror_model(target, tt, dt), mirror_model(zoo.tiny_model(tt, seed=5), tt, dt)
    for params in (SamplingParams(0.0), SamplingParams(1.0, top_k=20)):
        a = expected_acceptance("def fibonacci(n):", (target, tt, mirror, dt), params, 12, seed=0)
        b = expected_acceptance("def fibonacci(n):", (target, tt, stranger, dt), params, 12, seed=0)
        assert a["tokens"] == b["tokens"]  # the same target continuation is scored for both drafts
        kept_a, kept_b = ([x for x in r["alphas"] if x is not None] for r in (a, b))
        assert kept_a and all(0 <= x <= 1 + 1e-6 for x in kept_a + kept_b)
        if params.greedy:
            assert set(kept_a) | set(kept_b) <= {0.0, 1.0}
        assert fmean(kept_a) > fmean(kept_b) + 0.3, (params, fmean(kept_a), fmean(kept_b))
        # Scoring a given continuation (e.g. an engine run's text) is scoring that text: the same result for the
        # one generated here, another for another text.
        again = expected_acceptance("def fibonacci(n):", (target, tt, mirror, dt), params, 12, seed=0,
                                    tokens=a["tokens"])
        assert again["tokens"] == a["tokens"] and again["alphas"] == a["alphas"]
        other = expected_acceptance("def fibonacci(n):", (target, tt, mirror, dt), params, 12, seed=0,
                                    tokens=b["tokens"][:6][::-1])
        assert other["tokens"] == b["tokens"][:6][::-1] and len(other["alphas"]) == 6
    # A draft-side nucleus cut reshapes q: 1.0 changes nothing, a tiny one leaves the draft's argmax alone, whose
    # acceptance is greedy drafting's; 0.9 changes it (the control that the cut is applied).
    cut = expected_acceptance("def fibonacci(n):", (target, tt, stranger, dt), SamplingParams(1.0), 12, seed=0,
                              draft_temperatures=(0.0, 0.7), draft_top_ps=(1.0, 0.9, 1e-6))["by_draft_temperature"]
    assert cut["0.7/1.0"] == cut["0.7"] and cut["0.7/1e-06"] == cut["0.0"]
    assert cut["0.7/0.9"] != cut["0.7"] and "0.0/0.9" not in cut
    # Any registered rejection algorithm scored by running its own drafter for one token: TLI's equals the
    # closed form above (the same q~ reached two ways), SLRS's and RDK's proposals differ from it, and
    # lookup_tli's is TLI's (no 3 ids of this continuation recur, so its first proposal is TLI's draw).
    names = algorithms.names(cross_vocabulary=True, verification="rejection")  # tli, slrs and any registered since
    scored = expected_acceptance("def fibonacci(n):", (target, tt, stranger, dt), SamplingParams(1.0), 12, seed=0,
                                 scored=names)
    tli = scored["by_algorithm"]["tli"]
    assert len(tli) == len(scored["alphas"]) and all(
        (x is None) == (y is None) and (x is None or abs(x - y) < 1e-5) for x, y in zip(tli, scored["alphas"]))
    assert all(scored["by_algorithm"][name] != tli for name in ("slrs", "rdk"))
    assert scored["by_algorithm"]["lookup_tli"] == tli  # the same drawn q~ rows, bit for bit


def test_interleave_times_variants_side_by_side_and_checks_outputs_that_must_agree(tmp_path):
    from experiments.sweep import interleave

    common = ["--pair", "tiny:starcoder:1", "mirror:refact", "--dataset", "tiny", "--prompts", "2", "--seeds", "0", "1",
              "--max-new-tokens", "10", "--threads", "1", "--out", str(tmp_path)]
    table, findings = interleave.main(common + ["--variants", "ar", "slem", "tli k=2"])  # greedy: all equal ar
    assert findings == [] and [t["variant"] for t in table] == ["ar", "slem", "tli k=2"]
    assert table[0]["ratio"] == 1.0 and table[0]["tau"] == 1.0 and all(t["decodes"] == 4 for t in table)
    assert table[1]["tau"] > 1.0  # the mirrored draft is accepted
    table, findings = interleave.main(common + ["--temperature", "1", "--variants", "ar coupling=gumbel",
                                                "slem coupling=gumbel draft_temperature=0.7", "tli"])
    assert findings == []  # coupled slem emits coupled ar's tokens; tli (its own stream) is not compared
    rows = [json.loads(line) for line in next(tmp_path.glob("*T1.jsonl")).read_text().splitlines()]
    coupled = ["ar coupling=gumbel", "slem coupling=gumbel draft_temperature=0.7"]
    assert len(rows) == 12 and {r["variant"] for r in rows} == set(coupled) | {"tli"}
    # The control: the same check flags an output that differs.
    next(r for r in rows if r["variant"] == coupled[1])["ids"] = [-1]
    variants = [interleave.parse_variant(s) for s in coupled]
    assert len(interleave.findings_for(rows, variants, 1.0)) == 1


@pytest.mark.parametrize("spec, message", [("slme", "unknown algorithm 'slme'"),
                                           ("slem coupling", "is not KEY=VALUE with KEY one of"),
                                           ("tli top_k=3", "is not KEY=VALUE"), ("tli k=two", "k='two' is not an integer")])
def test_interleave_variants_name_the_mistake(spec, message):
    from experiments.sweep import interleave
    from xvocab.errors import ConfigError

    with pytest.raises(ConfigError, match=message):
        interleave.parse_variant(spec)


def test_variants_run_interleaved_write_sweep_records_and_resume(tmp_path):
    """variants= decodes every variant on each prompt in turn: each variant's records are its sweep point's (same
    hash, same greedy outputs as a --multirun point), a rerun after a kill adds only what is missing, and the
    report reads them as a sweep's."""
    from experiments.sweep import variants

    cfg = _cfg(tmp_path) | {"variants": ["slem", "tli k=2", "slrs", "lookup"]}  # (lookup: no draft model read)
    cfg.pop("hydra", None)
    path = run.run(cfg)
    recs = records.read(path)
    assert len(recs) == 10 and all(r["schedule"] == "interleaved" for r in recs)  # ar added first: 5 x 2 prompts
    by_point = {(r["config"]["algorithm"], r["config"]["k"], r["prompt_id"]): r for r in recs}
    for (algorithm, k) in (("slem", 4), ("tli", 2), ("slrs", 4), ("lookup", 4)):
        alone = run.run(_cfg(tmp_path / algorithm, algorithm) | {"k": k, "check_ar": False})
        for r in records.read(alone):
            twin = by_point[algorithm, k, r["prompt_id"]]
            assert twin["config_hash"] == r["config_hash"] and twin["token_ids"] == r["token_ids"]
    # the rotation: prompt 1 starts with the second variant
    order = [(r["prompt_id"], r["config"]["algorithm"]) for r in recs]
    assert [a for p, a in order if p == "tiny/0"] == ["ar", "slem", "tli", "slrs", "lookup"]
    assert [a for p, a in order if p == "tiny/1"] == ["slem", "tli", "slrs", "lookup", "ar"]
    lines = path.read_bytes().splitlines(keepends=True)
    path.write_bytes(b"".join(lines[:5]) + lines[5][:10])  # killed while writing the 6th
    run.run(cfg)
    again = records.read(path)
    assert sorted((r["config_hash"], r["prompt_id"]) for r in again) == sorted((r["config_hash"], r["prompt_id"]) for r in recs)
    rows = {r["algorithm"]: r for r in report.main([str(tmp_path)])}
    assert rows["ar"]["speedup"] == 1.0 and all(rows[a]["equals_ar"] == 1.0 for a in ("slem", "tli", "slrs", "lookup"))
    assert (tmp_path / "speedup.png").stat().st_size > 0
    with pytest.raises(ConfigError, match="same sweep point"):
        run.run(cfg | {"variants": ["slem", "slem k=4"]})
    with pytest.raises(ConfigError, match="only cache= and coupling="):
        variants.parse_variant("ar draft=smollm2-135m")


def test_interleaved_sampled_runs_check_coupled_slem_against_coupled_ar(tmp_path):
    """At T = 1 the runner records equals_ar for coupled slem (drafting colder than the target: its tokens are
    still coupled ar's) against the coupled ar variant, and for nothing else; a plain ar variant is no reference."""
    cfg = _cfg(tmp_path, temperature=1.0)
    cfg.pop("hydra", None)
    cfg["variants"] = ["ar coupling=gumbel", "slem coupling=gumbel draft_temperature=0.3", "tli"]
    recs = records.read(run.run(cfg))
    checked = sorted((r["config"]["algorithm"], r.get("equals_ar")) for r in recs)
    assert checked == [("ar", None)] * 2 + [("slem", True)] * 2 + [("tli", None)] * 2
    plain = records.read(run.run(cfg | {"results_dir": str(tmp_path / "plain"),
                                        "variants": ["ar", "slem coupling=gumbel"]}))
    assert not any("equals_ar" in r for r in plain)


@pytest.mark.parametrize("experiment", [e for e in EXPERIMENTS if (CONF / "experiment" / f"{e}.yaml").read_text()
                                        .count("variants")])
def test_every_variant_of_an_experiment_parses_and_names_a_zoo_draft(experiment):
    from experiments.sweep import variants
    from xvocab import zoo

    cfg = _compose([f"+experiment={experiment}"])
    known = set(zoo.models.model_names()) | set(zoo.models.drafter_names())
    for spec in cfg.variants:
        v = variants.parse_variant(spec)
        assert v.get("draft", cfg.pair.draft) in known or v["algorithm"] == "ar", spec


def test_stop_config_resolves_a_dataset_name_or_a_list(tmp_path):
    from experiments.datasets import humaneval
    from experiments.sweep.runner import point, stop_strings

    cfg = defaults.fill(_cfg(tmp_path))
    assert stop_strings(cfg) == [] and "stop" not in point(cfg, "slem")  # none: old records keep their hashes
    assert stop_strings(cfg | {"stop": "humaneval"}) == list(humaneval.STOP)
    assert point(cfg | {"stop": ["x"]}, "slem")["stop"] == ["x"]
    with pytest.raises(ConfigError, match="stop="):
        stop_strings(cfg | {"stop": "cnn_dailymail"})


def test_a_draft_window_is_its_own_sweep_point_and_report_row(tmp_path):
    """draft_window= (a variant option or a config key) keys its records apart from the whole-prompt draft's, only
    when set (older records keep their hashes), and the report shows it as a row and a column of its own."""
    from experiments.sweep import variants
    from experiments.sweep.runner import point

    cfg = defaults.fill(_cfg(tmp_path))
    assert "draft_window" not in point(cfg, "slem") and "draft_window" not in point(cfg | {"draft_window": 3}, "ar")
    assert point(cfg | {"draft_window": 3}, "slem")["draft_window"] == 3
    assert variants.parse_variant("slem draft_window=3")["draft_window"] == 3
    run_cfg = _cfg(tmp_path) | {"variants": ["slem", "slem draft_window=1"]}
    run_cfg.pop("hydra", None)
    recs = records.read(run.run(run_cfg))
    assert len(recs) == 6 and len({r["config_hash"] for r in recs}) == 3  # ar, slem, windowed slem x 2 prompts
    rows = report.aggregate(recs)
    windowed = [r for r in rows if r["draft_window"]]
    assert len(windowed) == 1 and windowed[0]["draft_window"] == 1 and windowed[0]["equals_ar"] == 1.0


def test_submitit_jobs_side_by_side_neither_repeat_work_nor_duplicate_records(tmp_path):
    """Hydra's submitit launcher (its local executor: the SLURM path without a cluster) runs ar and slem as two
    jobs at once: each writes its own records file, no (config, prompt) is decoded twice (the greedy check of
    slem's job leaves ar's prompts to ar's job, or claims them first), and a rerun adds nothing."""
    out = tmp_path / "results"
    cmd = [sys.executable, "-m", "experiments.run", "--multirun", "hydra/launcher=submitit_local", "pair=tiny",
           "dataset=tiny", "algorithm=ar,slem", "max_new_tokens=6", "device=cpu", "threads=1", "warmup=0",
           f"results_dir={out}", f"hydra.sweep.dir={tmp_path / 'multirun'}", "hydra.launcher.timeout_min=10"]
    for _ in range(2):
        proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, proc.stderr[-3000:]
        recs = records.read(out / "records.jsonl")
        keys = [(r["config_hash"], r["prompt_id"]) for r in recs]
        assert len(keys) == len(set(keys)) == 4, keys  # 2 prompts x (ar, slem), each once
        writers = sorted(p.name for p in (out / "records.d").glob("*.jsonl"))
        assert len(writers) == 2, writers  # one file per job that wrote (a rerun's jobs have nothing to write)
        assert not list((out / "records.d" / "claims").iterdir())  # every claim released
    rows = {r["algorithm"]: r for r in report.aggregate(recs)}
    assert rows["slem"]["equals_ar"] == 1.0 and rows["ar"]["prompts"] == 2


def test_claims_exclude_a_live_holder_and_take_over_a_dead_one(tmp_path):
    path = tmp_path / "records.jsonl"
    assert records.claim(path, "abc-tiny/0") and records.claim(path, "abc-tiny/0")  # this process: reentrant
    claim_file = tmp_path / "records.d" / "claims" / "abc-tiny_0"
    import platform

    claim_file.write_text(f"{platform.node()} 1")  # pid 1 is alive: another live process holds it
    assert not records.claim(path, "abc-tiny/0")
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    claim_file.write_text(f"{platform.node()} {dead.stdout.strip()}")  # its process has exited
    assert records.claim(path, "abc-tiny/0")
    claim_file.write_text("elsewhere 123")  # another host, recent: held; old: taken over
    assert not records.claim(path, "abc-tiny/0")
    assert records.claim(path, "abc-tiny/0", stale_after_s=-1)
    records.release(path, "abc-tiny/0")
    assert not claim_file.exists()
    records.append(path, {"config_hash": "h", "prompt_id": "p"}, writer="w1")
    records.append(path, {"config_hash": "h", "prompt_id": "q"})
    assert [r["prompt_id"] for r in records.read(path)] == ["q", "p"]  # the main file, then each writer's


def test_the_lossless_sweep_passes_and_fails_when_verification_is_wrong(monkeypatch, capsys):
    """experiments.checks.lossless_sweep on one pair: no failure with the real engine (both drafts, the biased one accepted);
    with a verifier that accepts every proposal (the control), it reports failures and exits 1."""
    from experiments.checks import lossless_sweep
    from xvocab.verification import verify

    monkeypatch.setattr(lossless_sweep, "PROMPTS", lossless_sweep.PROMPTS[:3])
    args = ["--families", "gpt-2", "--offsets", "1", "--max-new-tokens", "8"]
    assert lossless_sweep.main(args) == 0
    line = capsys.readouterr().out.splitlines()[0]  # both drafts ran, and the biased one was accepted
    assert "mirror slem tau" in line and float(line.split("biased slem tau ")[1][:4]) > 1.1
    real = verify.verify_proposal

    def accept_all(logits, ids, *a, **kw):
        return len(ids), real(logits, ids, *a, **kw)[1]

    monkeypatch.setattr(verify, "verify_proposal", accept_all)
    assert lossless_sweep.main(args) == 1
    fails = [line for line in capsys.readouterr().out.splitlines() if line.startswith("FAIL ('gpt-2', 'llama-bpe'")]
    assert any("'biased'" in line for line in fails)  # the draft accepted on every pair shows the bug too


def test_the_sampling_sweep_passes_and_fails_when_tli_forgets_to_renormalize(monkeypatch, capsys):
    """`lossless_sweep --sampling` on one pair (tli, one setting): no failure with the real engine, and the line
    shows the draft was accepted; with TLI's negative control planted (its registry entry's control_draft: the
    restriction not renormalized where it is verified) it reports the failure and exits 1."""
    from _support import patch_drafter

    from experiments.checks import lossless_sweep
    from xvocab import algorithms

    monkeypatch.setattr(lossless_sweep, "SAMPLING_ALGORITHMS", ("tli",))
    monkeypatch.setattr(lossless_sweep, "SAMPLING_RUNS", lossless_sweep.SAMPLING_RUNS[:1])
    args = ["--sampling", "--families", "mistral-v1", "--offsets", "3"]
    assert lossless_sweep.main(args) == 0
    line = capsys.readouterr().out.splitlines()[0]
    assert line.startswith("mistral-v1 <- mpt: 0 failures; tli p>=") and float(line.split("tau ")[1][:4]) > 1.3
    patch_drafter(monkeypatch, "tli", algorithms.get("tli").control_draft)
    assert lossless_sweep.main(args) == 1
    assert "FAIL ('mistral-v1', 'mpt', 'tli', 'native', 'T1-top_k3'" in capsys.readouterr().out


@pytest.mark.parametrize("handler", [True, False])
def test_a_killed_serve_load_run_stops_its_server(tmp_path, handler):
    """experiments.vllm.serve_load stops each variant's server in a `finally`; SIGTERM must unwind to it. A stand-in
    run starts a child in a session of its own (as the server is started) and is killed; with the handler the child
    is gone, without it (the control) the child outlives the run."""
    import os
    import signal
    import subprocess
    import sys
    import time

    pid_file = tmp_path / "child.pid"
    script = f"""
import os, subprocess, sys, time
from experiments.vllm import serve_load as vllm_serve_load
if {handler}:
    vllm_serve_load.exit_on_sigterm()
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
open({str(pid_file)!r}, "w").write(str(child.pid))
try:
    time.sleep(60)
finally:
    os.killpg(child.pid, 15)
"""
    run = subprocess.Popen([sys.executable, "-c", script], cwd=Path(__file__).resolve().parents[1])
    for _ in range(200):
        if pid_file.exists() and pid_file.read_text():
            break
        time.sleep(0.05)
    child = int(pid_file.read_text())
    run.send_signal(signal.SIGTERM)
    run.wait(30)
    time.sleep(0.3)
    try:  # a zombie (killed, not yet reaped by whoever adopted it) counts as stopped
        alive = Path(f"/proc/{child}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        alive = False
    if alive:
        os.killpg(child, 9)
    assert alive is (not handler)


def test_the_vllm_harnesses_take_vllms_own_methods_and_any_served_algorithm():
    """experiments.vllm.bench and vllm_serve_load read one table of vLLM's methods (experiments.vllm.methods) and the
    served algorithms of the registry: ngram and suffix take no draft, lookup_slem and sd need one, xvocab's loop takes
    any registered name. vLLM's ngram searches xvocab's lookup's n-gram bounds. Controls: each wrong spec is refused."""
    from experiments.vllm import bench as vllm_bench
    from experiments.vllm import serve_load as vllm_serve_load
    from experiments.vllm.methods import speculative_config
    from xvocab.algorithms import lookup

    for parse in (vllm_bench.parse, vllm_serve_load.parse):
        assert parse("ngram")[:2] == ("ngram", None) and parse("suffix")[:2] == ("suffix", None)
        assert parse("lookup_slem:smollm2-135m")[:2] == ("lookup_slem", "smollm2-135m")
        for wrong in ("ngram:smollm2-135m", "sd", "lookup_slem", "medusa:x"):
            with pytest.raises(SystemExit):
                parse(wrong)
    assert vllm_bench.parse("xvocab-lookup")[:2] == ("xvocab-lookup", None)
    assert vllm_serve_load.parse("ngram,k=6")[2] == vllm_bench.parse("ngram,k=6")[2] == {"k": 6}
    assert vllm_serve_load.parse("slem:smollm2-135m,load_policy=off")[2] == {"load_policy": "off"}
    for wrong in ("slem:smollm2-135m,lod_policy=off", "ar,k=3", "ngram,k=0"):  # a typo, an option ar cannot take
        with pytest.raises(SystemExit):
            vllm_serve_load.parse(wrong)
    with pytest.raises(SystemExit):  # xvocab's own loop is the bench's alone
        vllm_serve_load.parse("xvocab-lookup")
    with pytest.raises(SystemExit, match="takes no draft"):
        vllm_bench.parse("xvocab-lookup:smollm2-135m")
    config = speculative_config("ngram", None, 4)
    assert (config["method"], config["prompt_lookup_max"], config["prompt_lookup_min"]) == ("ngram", lookup.MAX_N,
                                                                                           lookup.MIN_N)
    try:
        import arctic_inference  # noqa: F401
    except ImportError:
        with pytest.raises(SystemExit, match="make vllm-suffix"):
            speculative_config("suffix", None, 4)
    else:
        assert speculative_config("suffix", None, 4) == {"method": "suffix", "num_speculative_tokens": 4}


def test_vllms_own_methods_tau_counts_every_engine_step():
    """tau for vLLM's own methods is tokens over engine steps: ngram proposes on some steps only, so the draft
    model's old count (1 + drafts) would credit it with forwards it never saved. Control: that count differs here."""
    from xvocab.vllm.metrics import acceptance

    zero = {"drafts": 0, "draft_tokens": 0, "accepted": 0, "steps": 0, "per_position": []}
    after = {"drafts": 3, "draft_tokens": 12, "accepted": 9, "steps": 12, "per_position": [3, 3, 2, 1]}
    rates = acceptance(zero, after, tokens=20)  # 12 steps: 3 that proposed (accepting 9) and 9 that did not
    assert rates["tau"] == 20 / 12
    assert 20 / (1 + after["drafts"]) != rates["tau"]


def test_the_bench_report_says_how_many_proposed_ids_came_from_the_context():
    from experiments.vllm.bench import _from_context

    rows = [dict(proposed=40, context_proposed=12, context_accepted=9), dict(proposed=10, context_proposed=0,
                                                                           context_accepted=0)]
    assert _from_context(rows) == "12 of 50 (9)"
    assert _from_context([dict(proposed=None)]) == "—"


def test_the_bench_figure_takes_each_variant_against_the_ar_of_its_own_group(tmp_path):
    """vllm.bench's ratios pair each decode with its own group's ar on the same prompt (groups run minutes apart,
    and vLLM's ar drifts between them); a variant run in two groups pools its prompts. Control: against the other
    group's ar the ratio is another number. The combined figure draws one panel per run directory."""
    pytest.importorskip("matplotlib")
    from experiments.vllm.bench import combined_figure, ratios_by_variant

    def rec(group, variant, prompt, tokens, seconds, tau=1.0):
        return dict(group=group, run="r", variant=variant, prompt=prompt, token_ids=[1] * tokens, seconds=seconds,
                    tau=tau, settings=dict(dataset="code_edit", threads=2, dtype="bfloat16", target="t", k=4),
                    cpu="a CPU", git_revision="abc")

    rows = [rec(0, "ar", "p0", 10, 1.0), rec(0, "ngram", "p0", 10, 0.5, 3.0),
            rec(1, "ar", "p0", 10, 2.0), rec(1, "lookup_slem:d", "p0", 10, 0.5, 4.0),
            rec(1, "ar", "p1", 10, 2.0), rec(1, "lookup_slem:d", "p1", 10, 1.0, 2.0)]
    for r in rows:
        records.append(tmp_path / "records.jsonl", r)
    got = ratios_by_variant(records.read(tmp_path / "records.jsonl"))
    assert got["ngram"] == ((2.0, 2.0, 2.0), 3.0)
    assert got["lookup_slem:d"][0][1] == 3.0 and got["lookup_slem:d"][1] == 3.0  # median of 4x and 2x; mean tau
    assert got["ngram"][0][1] != (10 / 0.5) / (10 / 2.0)  # (the control: group 1's ar would make it 4x)
    combined_figure([tmp_path, tmp_path], tmp_path / "all.png")
    assert (tmp_path / "all.png").stat().st_size > 0


def test_the_record_hash_sees_what_a_decode_decided_and_nothing_a_clock_did(tmp_path, capsys):
    """experiments.checks.record_hash: two runs whose greedy records differ only in clocks hash the same; a token,
    or one more position fed (a cache that recomputed a state), changes the hash (controls); sampled rows are left
    out."""
    from experiments.checks import record_hash

    base = {"config": {"temperature": 0.0}, "config_hash": "c", "prompt_index": 0, "token_ids": [1, 2, 3],
            "proposed_per_step": [2, 1], "accepted_per_step": [1, 1], "target_forwards": 2, "target_tokens_fed": 9,
            "draft_forwards": 3, "draft_tokens_fed": 8, "wall_seconds": 1.0}
    sampled = base | {"config": {"temperature": 1.0}, "token_ids": [7]}

    def run(name, *rows):
        (tmp_path / name).mkdir()
        (tmp_path / name / "records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        return str(tmp_path / name)

    a = run("a", base, base | {"prompt_index": 1})
    b = run("b", base | {"prompt_index": 1, "wall_seconds": 9.0}, base | {"wall_seconds": 2.0})  # clocks, order
    c = run("c", base, base | {"prompt_index": 1, "target_tokens_fed": 10})
    d = run("d", base, base | {"prompt_index": 1, "token_ids": [1, 2, 4]}, sampled)
    assert record_hash.main([a, b]) == 0 and "same decodes" in capsys.readouterr().out
    assert record_hash.main([a, c]) == 1 and "DECODES DIFFER" in capsys.readouterr().out
    assert record_hash.main([a, d]) == 1
    assert record_hash.decode_hash([base, sampled]) == record_hash.decode_hash([base])


def test_the_cpu_named_in_every_record_says_when_its_instruction_set_is_capped(monkeypatch):
    """records.cpu_name: the model and vector flags, and the caps set on them (an AVX-512 machine run as an AVX2 one
    must never be reported as the AVX-512 machine). Control: without a cap, no cap is named."""
    from xvocab.measure import records

    for key in records.ISA_CAPS:
        monkeypatch.delenv(key, raising=False)
    records.cpu_name.cache_clear()
    plain = records.cpu_name()
    assert "capped" not in plain
    monkeypatch.setenv("ATEN_CPU_CAPABILITY", "avx2")
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2")
    records.cpu_name.cache_clear()
    try:
        assert records.cpu_name() == plain + " capped ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2"
    finally:
        records.cpu_name.cache_clear()


def test_a_serving_variants_draft_length_reaches_vllm_and_its_settings_reach_the_proposer():
    """experiments.vllm.serve_load.server_command: a variant's `k` option (else --k) is vLLM's num_speculative_tokens,
    for vLLM's own methods and xvocab's proposer alike, and xvocab's settings go to the proposer's additional config
    without it (the proposer reads k from vLLM). Control: without the option, --k."""
    from experiments.vllm import serve_load

    args = argparse.Namespace(port=8000, dtype="bfloat16", max_model_len=2048, concurrency=[1, 4], k=4)

    def spec_config(command):
        return json.loads(command[command.index("--speculative-config") + 1])

    served = serve_load.server_command("slem:smollm2-135m,k=2,load_policy=off", "m", args, Path("s.json"), 8331)
    extra = json.loads(served[served.index("--additional-config") + 1])["xvocab"]
    assert spec_config(served)["num_speculative_tokens"] == 2
    assert extra == {"draft": "smollm2-135m", "algorithm": "slem", "stats_file": "s.json", "load_policy": "off"}
    for spec, k in (("ngram,k=6", 6), ("ngram", 4)):
        assert spec_config(serve_load.server_command(spec, "m", args, Path("s.json"), 8331))["num_speculative_tokens"] == k
    # vLLM's async scheduling, which it turns off beside a custom_class proposer: `ar` as vLLM runs it there
    assert serve_load.server_command("ar,async_scheduling=false", "m", args, Path("s.json"), 8331)[-1] == \
        "--no-async-scheduling"
    assert not any("async" in x for x in serve_load.server_command("ar", "m", args, Path("s.json"), 8331))  # control
    with pytest.raises(SystemExit, match="async_scheduling must be true or false"):
        serve_load.parse("ar,async_scheduling=1")


def test_serve_load_interleaves_passes_and_pairs_each_ratio_with_ars_group_of_the_same_pass():
    """experiments.vllm.serve_load.schedule: together, every (variant, c, pass) once, pass by pass, the variants'
    order rotating; one server at a time, variant by variant. aggregate: a ratio divides a pass's tok/s by ar's of
    the same pass and c, tok/s is the passes' median. Control: a variant's pass with no ar group of its pass gets
    no ratio (it is never divided by another pass's ar)."""
    from experiments.vllm import serve_load

    order = serve_load.schedule(["ar", "x"], [1, 4], 2, together=True)
    assert sorted(order) == sorted((v, c, p) for v in ("ar", "x") for c in (1, 4) for p in (0, 1))
    assert [v for v, _, _ in order[:4]] == ["ar", "x", "x", "ar"]  # rotating
    assert [p for _, _, p in order] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert serve_load.schedule(["ar", "x"], [1], 2, together=False) == [("ar", 1, 0), ("ar", 1, 1), ("x", 1, 0),
                                                                          ("x", 1, 1)]

    def group(variant, p, tps):
        return dict(kind="group", variant=variant, concurrency=4, output_tokens_per_s=tps, requests_per_s=tps / 64,
                    errors=0, spec={}, proposer=None, **{"pass": p})

    def request(variant, p, ttft):
        return dict(kind="request", variant=variant, concurrency=4, ttft=ttft, gaps=[0.1, 0.2], **{"pass": p})

    recs = [group("ar", 0, 10.0), group("x", 0, 12.0), group("ar", 1, 20.0), group("x", 1, 19.0),
            group("x", 2, 50.0), request("x", 0, 1.0), request("x", 1, 3.0)]
    rows = {r["variant"]: r for r in serve_load.aggregate(recs)}
    assert rows["x"]["ratios"] == [1.2, 0.95]  # pass 2 has no ar: no ratio (control)
    assert rows["x"]["output_tokens_per_s"] == 19.0 and rows["x"]["passes"] == 3
    assert rows["x"]["ttft_p50"] in (1.0, 3.0) and rows["x"]["ttft_p99"] == 3.0
    assert rows["ar"]["ratios"] == [1.0, 1.0]


def test_serve_load_interleaved_parts_cancel_a_drifting_machine(monkeypatch):
    """experiments.vllm.serve_load._round with --interleave: each part goes to every server in turn, the order
    rotating part by part, a part never under 2c rows, and a group's wall is the sum of its parts'. Two identical
    stand-in servers on a machine that slows down as it runs: sent in 8 parts their ratio stays within 2% of 1.
    Control: sent whole (one part), the same drift makes the second server look 20% slower."""
    from types import SimpleNamespace

    from experiments.vllm import serve_load

    clock, calls = [0.0], []

    async def drive(port, model, rows, concurrency, max_tokens):  # a request costs more as the machine drifts
        wall = sum(1.0 + clock[0] / 20 for _ in rows)
        clock[0] += wall
        calls.append((port, len(rows)))
        return [dict(id=r["id"], tokens=10, ttft=0.1, gaps=[0.1]) for r in rows], wall

    monkeypatch.setattr(serve_load, "drive", drive)
    monkeypatch.setattr(serve_load, "spec_counters", lambda port: {"per_position": {}})
    monkeypatch.setattr(serve_load, "_read", lambda path: None)
    monkeypatch.setattr(serve_load.time, "sleep", lambda s: None)
    servers = [SimpleNamespace(spec=name, port=port, model_dir="m", stats_file=None)
               for name, port in (("ar", 1), ("x", 2))]
    rows = [dict(id=i) for i in range(16)]

    def ratio(parts):
        calls.clear()
        clock[0] = 0.0
        out = serve_load._round(servers, rows, 1, 8, parts)
        return out["x"][1]["output_tokens_per_s"] / out["ar"][1]["output_tokens_per_s"], out

    interleaved, out = ratio(8)
    assert [port for port, _ in calls[:8]] == [1, 2, 2, 1, 1, 2, 2, 1] and {n for _, n in calls[:8]} == {2}
    assert out["x"][1]["parts"] == 8 and len(out["x"][0]) == 16
    assert out["x"][1]["wall_s"] == pytest.approx(sum(out["x"][1]["part_walls"]))
    assert abs(interleaved - 1) < 0.02
    whole, _ = ratio(1)
    assert whole < 0.8  # control: the drift is real, and one part per group leaves it in the ratio
    assert [len(part) for part in serve_load.split(rows, 4, 8)] == [8, 8]  # at least 2c rows a part
    assert [len(part) for part in serve_load.split(rows[:5], 1, 2)] == [3, 2]
    assert serve_load.rounds([("ar", 1, 0), ("x", 1, 0), ("x", 4, 0), ("ar", 4, 0), ("ar", 1, 1)]) == [
        (1, 0, ["ar", "x"]), (4, 0, ["x", "ar"]), (1, 1, ["ar"])]


def test_step_trace_charges_each_interval_to_the_step_before_it_and_names_what_it_held(tmp_path, capsys):
    """experiments.vllm.step_trace: an interval is the previous step's (its arm, its prefill), idle intervals are
    left out, and a drafting arm whose prefill steps are slow shows an all-in rate below its clean one. Control: the
    same trace read with each interval charged to its own line's arm would put the prefill on stepping aside."""
    from experiments.vllm import step_trace

    def line(arm, interval, emitted, clean=True, idle=False, prefill=0, batch=1):
        return dict(batch=batch, arm=arm, interval=interval, emitted=emitted, clean=clean, idle=idle,
                    prefill_tokens=prefill, caught_up=False)

    lines = [line(0, None, 0), line(2, 0.1, 1), line(2, 0.2, 3, prefill=500), line(0, 2.0, 3, clean=False),
             line(0, 0.1, 1), line(0, 50.0, 1, idle=True), line(0, 0.1, 1)]  # step 2 prefilled: 2 -> 3 its cost
    rows = {(r["bucket"], r["arm"]): r for r in step_trace.summarize(lines)}
    assert rows[1, 2]["steps"] == 2 and rows[1, 2]["seconds_by_kind"] == {"clean": 0.2, "prefill": 2.0}
    assert rows[1, 2]["rate"] == pytest.approx(6 / 2.2) and rows[1, 2]["clean_rate"] == pytest.approx(15.0)
    assert rows[1, 0]["steps"] == 3 and rows[1, 0]["seconds"] == pytest.approx(0.3)  # the idle 50 s: left out
    assert "prefill" not in rows[1, 0]["seconds_by_kind"]  # control: charged to its own line, step 3 (arm 0) pays
    path = tmp_path / "steps.jsonl"
    path.write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    step_trace.main([str(path)])
    assert "| 1 | 2 | 2 | 2.2 |" in capsys.readouterr().out
    with pytest.raises(SystemExit, match="step_trace"):
        step_trace.main([str(tmp_path / "missing.jsonl")])


def test_lookup_replay_takes_a_real_runs_rounds_and_each_rule_finds_what_it_says():
    """experiments.benchmarks.lookup_replay: replaying xvocab's lookup rule over a greedy `lookup` run's own output
    takes exactly that run's target forwards (a tiny target whose head is zeroed: its argmax, id 0, repeats);
    `longest` takes the occurrence sharing the longest suffix where `lookup` takes the latest 4-id match;
    `frequent` the majority continuation, and earlier outputs where `frequent+outputs` may read them. Control: the
    replay can differ from the run: the frequent walk over an earlier output of zeros proposes 4 ids a round where
    lookup's latest match has 1."""
    import torch

    import xvocab
    from experiments.benchmarks.lookup_replay import RULES, replay
    from xvocab import zoo
    from xvocab.alignment.roles import prompt_ids

    tt = zoo.tokenizer("qwen2")
    target = zoo.tiny_model(tt, seed=3)
    with torch.no_grad():
        target.lm_head.weight.zero_()  # every logit 0: the argmax is id 0 at every position
    prompt = "def f(x):\n    return x + 1\n\ndef g(x):\n    return"
    out = xvocab.generate(prompt, target=target, target_tokenizer=tt, algorithm="lookup", k=4,
                          max_new_tokens=48, temperature=0.0)
    ids = prompt_ids(tt, prompt)
    forwards, proposing, accepted = replay(RULES["lookup"], ids, list(out.token_ids), 4, [])
    assert accepted > 0 and forwards == out.stats.target_forwards, (forwards, out.stats.summary())
    assert replay(RULES["frequent+outputs"], ids, list(out.token_ids), 4, [[0] * 64])[0] < forwards

    # 0 1 2 3 4 5 | 9 1 2 3 4 6 | 7 0 1 2 3 4: lookup's latest 4-id match "1 2 3 4" -> 6; the longest "0 1 2 3 4" -> 5
    ctx = [0, 1, 2, 3, 4, 5, 9, 1, 2, 3, 4, 6, 7, 0, 1, 2, 3, 4]
    assert RULES["lookup"](ctx, 1, []) == [6] and RULES["longest"](ctx, 1, []) == [5]
    # "7 8" was followed by 1 twice and by 2 once: the frequent walk proposes 1
    ctx = [7, 8, 1, 0, 7, 8, 2, 0, 7, 8, 1, 5, 7, 8]
    assert RULES["frequent"](ctx, 1, []) == [1] and RULES["lookup"](ctx, 1, []) == [1]
    assert RULES["frequent"]([3, 7, 8], 1, []) == []
    assert RULES["frequent+outputs"]([3, 7, 8], 2, [[7, 8, 4, 4]]) == [4, 4]
