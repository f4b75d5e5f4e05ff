"""xvocab.algorithms.REGISTRY: each entry says what its drafter does, and everything that lists algorithms lists them
from it. An entry that lies about its verification or its tables, an algorithm the suites or the sweep configs miss,
or a second list of algorithms that drifts from the registry fails here."""
import subprocess
import sys
from pathlib import Path

import pytest
from _support import ALL, CROSS, mirrored_pairs, patch_drafter

import xvocab
from xvocab import algorithms
from xvocab.alignment.tables import pair_tables
from xvocab.decode.pair import prepare
from xvocab.errors import ConfigError, VocabularyMismatchError

ROOT = Path(__file__).resolve().parents[1]
PAIR = ("llama-spm", "gpt-2")


@pytest.fixture(scope="module")
def pair():
    return mirrored_pairs([PAIR])[PAIR]


@pytest.mark.parametrize("name", algorithms.names(cross_vocabulary=True))
def test_an_entrys_verification_is_what_its_proposals_carry(pair, name, monkeypatch):
    """exact: proposals without a distribution (the target's own choice decides); rejection: with one, when sampled."""
    target, tt, draft, dt = pair
    seen = []
    original = algorithms.get(name).draft

    def watched(ctx, k):
        proposal = yield from original(ctx, k)
        seen.append(proposal)
        return proposal

    patch_drafter(monkeypatch, name, watched)
    xvocab.generate("def fibonacci(n):", target=target, target_tokenizer=tt, draft=draft, draft_tokenizer=dt,
                    algorithm=name, temperature=1.0, max_new_tokens=8, seed=3)
    proposed = [p for p in seen if p.ids]
    assert proposed, "the drafter proposed nothing: the check would be empty"
    if algorithms.get(name).verification == "exact":
        assert all(p.probs is None for p in proposed)
    else:
        assert all(p.probs is not None and p.probs.shape[0] == len(p.ids) for p in proposed)


@pytest.mark.parametrize("name", algorithms.names(drafting=True))
def test_prepare_builds_the_tables_an_entry_names_and_no_other(name):
    tt = xvocab.zoo.tokenizer("gpt-2")
    dt = tt if algorithms.get(name).one_vocabulary else xvocab.zoo.tokenizer("llama-spm")
    target, draft = xvocab.zoo.tiny_model(tt), xvocab.zoo.tiny_model(dt)
    pair_tables.cache_clear()
    p = prepare(target, tt, draft, dt, algorithm=name)
    assert set(p.tables.built()) == set(algorithms.get(name).tables)
    if not algorithms.get(name).one_vocabulary:
        other = xvocab.zoo.tokenizer("llama-spm")
        assert prepare(target, tt, xvocab.zoo.tiny_model(other), other, algorithm="slem")  # a pair it may serve
    else:
        with pytest.raises(VocabularyMismatchError, match=f"algorithm {name!r} needs one shared vocabulary"):
            prepare(target, tt, xvocab.zoo.tiny_model(xvocab.zoo.tokenizer("llama-spm")),
                    xvocab.zoo.tokenizer("llama-spm"), algorithm=name)


def entries_in_files(folder: Path) -> dict[str, str]:
    """{algorithm name: file} for every `ALGORITHM = Algorithm("name", ...)` in the files of `folder`, read from the
    source (not from the registry)."""
    import ast

    out = {}
    for path in sorted(folder.glob("*.py")):
        for node in ast.parse(path.read_text()).body:
            if (isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "ALGORITHM" for t in node.targets)
                    and isinstance(node.value, ast.Call) and node.value.args
                    and isinstance(node.value.args[0], ast.Constant)):
                out[node.value.args[0].value] = path.name
    return out


def config_mismatches(folder: Path, names) -> list[str]:
    """What differs between the registry's names and conf/algorithm/*.yaml (`name: <name>` in `<name>.yaml`)."""
    out = [f"conf/algorithm/{n}.yaml is missing or does not say name: {n}" for n in names
           if not (folder / f"{n}.yaml").exists() or f"name: {n}" not in (folder / f"{n}.yaml").read_text()]
    return out + [f"conf/algorithm/{p.name} names no registered algorithm" for p in sorted(folder.glob("*.yaml"))
                  if p.stem not in names]


def test_the_registry_is_the_algorithm_files_and_the_sweep_configs(tmp_path):
    """Read independently of the registry: the entries the files of xvocab/algorithms/ define, and the configs under
    conf/algorithm/. Controls: a file with an entry the registry lacks, and a stray config, are each caught."""
    import shutil

    folder = ROOT / "xvocab" / "algorithms"
    assert entries_in_files(folder) == {n: f"{n}.py" for n in algorithms.REGISTRY}, "one file an entry, named after it"
    assert config_mismatches(ROOT / "conf" / "algorithm", algorithms.REGISTRY) == []
    planted = tmp_path / "algorithms"
    shutil.copytree(folder, planted)
    (planted / "medusa.py").write_text('ALGORITHM = Algorithm("medusa", draft, verification="exact", summary="")\n')
    assert set(entries_in_files(planted)) - set(algorithms.REGISTRY) == {"medusa"}
    conf = tmp_path / "conf"
    shutil.copytree(ROOT / "conf" / "algorithm", conf)
    (conf / "medusa.yaml").write_text("name: medusa\n")
    (conf / "tli.yaml").write_text("name: slem\n")
    assert config_mismatches(conf, algorithms.REGISTRY) == ["conf/algorithm/tli.yaml is missing or does not say "
                                                            "name: tli", "conf/algorithm/medusa.yaml names no "
                                                            "registered algorithm"]


def test_the_lists_outside_the_package_are_the_registrys():
    from experiments.checks import lossless_sweep
    from xvocab.vllm import settings

    assert CROSS == algorithms.names(cross_vocabulary=True) and ALL == ("ar",) + CROSS
    assert settings.served() == algorithms.names(in_vllm=True)
    assert lossless_sweep.SAMPLING_ALGORITHMS is None  # every cross-vocabulary entry, read when the sweep runs


def suite_gaps(collected: str, names, suites=("test_exactness.py", "test_distributions.py")) -> list[str]:
    """"suite: name" for each algorithm that owns no test id in a suite of pytest's --collect-only output."""
    out = []
    for suite in suites:
        ids = [line for line in collected.splitlines() if suite in line]
        out += [f"{suite}: {name}" for name in names
                if not any(f"[{name}-" in i or f"-{name}-" in i or f"[{name}]" in i or f"-{name}]" in i for i in ids)]
    return out


def _collect(*marks: str) -> str:
    return subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:randomly", *marks,
                           "tests/test_exactness.py", "tests/test_distributions.py"],
                          cwd=ROOT, capture_output=True, text=True, check=True).stdout


def test_the_exactness_and_distribution_suites_run_every_proposing_algorithm():
    """Collected, not read: each algorithm that proposes (with a draft model or without) owns test ids in both
    suites, and in the default tier a sampled test, a batched one and its control. Control: the same check over ids
    with one algorithm's removed fails."""
    drafting = algorithms.names(proposing=True)
    collected = _collect()
    assert suite_gaps(collected, drafting) == []
    default = _collect("-m", "not slow")
    for test in ("test_sampled_sequences_follow_the_target[", "test_each_negative_control_is_rejected[",
                 "test_sampled_sequences_follow_the_target_through_the_batched_path["):
        assert suite_gaps(default.replace(test, "@["), drafting, ("@",)) == [], f"default tier: {test}"
    last = drafting[-1]
    without = "\n".join(line for line in collected.splitlines() if f"[{last}" not in line and f"-{last}" not in line)
    assert suite_gaps(without, drafting) == [f"test_exactness.py: {last}", f"test_distributions.py: {last}"]


def test_registering_refuses_a_taken_name_and_lookups_name_the_choices():
    with pytest.raises(ConfigError, match="registered already"):
        algorithms.register(algorithms.get("tli"))
    with pytest.raises(ConfigError, match="register takes an xvocab.algorithms.Algorithm"):
        algorithms.register("tli")
    with pytest.raises(ConfigError, match=r"unknown algorithm 'nope'; choose one of ar, slem, tli, slrs, sd"):
        algorithms.get("nope")
    with pytest.raises(ValueError, match="coupling races exact-match verification only"):
        algorithms.Algorithm("x", algorithms.get("tli").draft, verification="rejection", summary="", couples=True)
    with pytest.raises(ValueError, match="tables="):
        algorithms.Algorithm("x", algorithms.get("tli").draft, verification="rejection", summary="", tables=("psi",))  # a name, not a builder


def test_a_plugin_named_in_the_environment_reaches_every_list_of_a_new_process():
    """XVOCAB_PLUGINS: a fresh process (a sweep worker, vLLM's engine) that imports xvocab knows the plugin's
    algorithm everywhere the registry is read. Control: the same process without the variable does not."""
    code = ("import xvocab; from xvocab.vllm.settings import served; "
            "print('tli-copy' in xvocab.ALGORITHMS, 'tli-copy' in served())")
    env = {**__import__("os").environ, "PYTHONPATH": str(ROOT / "tests")}
    run = lambda extra: subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                                       env=env | extra, check=True).stdout.split()
    assert run({"XVOCAB_PLUGINS": "plugin_tli_copy"}) == ["True", "True"]
    assert run({"XVOCAB_PLUGINS": ""}) == ["False", "False"]
    with pytest.raises(ConfigError, match="algorithm plugin 'no_such_module'"):
        algorithms.load_plugins("no_such_module")


def test_no_library_module_decides_by_an_algorithms_name(tmp_path):
    """Every "which algorithms ..." question in xvocab/ reads the registry entry, none compares with a name written
    out (the distillation losses are named after TLI and SLEM, not algorithms: xvocab.drafter). Control: a module that
    compares `algorithm == "slem"` is found."""
    from experiments.checks.import_graph import name_comparisons

    assert [m for m in name_comparisons(ROOT) if not m.startswith("xvocab.drafter.")] == []
    (tmp_path / "xvocab").mkdir()
    (tmp_path / "xvocab" / "planted.py").write_text('def f(algorithm):\n    return algorithm in ("tli", "slrs")\n')
    assert name_comparisons(tmp_path) == ["xvocab.planted:2"]
