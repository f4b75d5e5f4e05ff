"""xvocab.algorithms.REGISTRY: each entry says what its drafter does, and everything that lists algorithms lists them
from it. An entry that lies about its verification or its tables, an algorithm the suites or the sweep configs miss,
or a second list of algorithms that drifts from the registry fails here."""
import subprocess
import sys
from pathlib import Path

import pytest
from _support import ALL, CROSS, mirrored_pairs

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
    original = algorithms.DRAFTERS[name]

    def watched(ctx, k):
        proposal = yield from original(ctx, k)
        seen.append(proposal)
        return proposal

    monkeypatch.setitem(algorithms.DRAFTERS, name, watched)
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


def test_every_registered_algorithm_is_a_sweep_axis():
    for name in algorithms.REGISTRY:
        config = ROOT / "conf" / "algorithm" / f"{name}.yaml"
        assert config.exists(), f"conf/algorithm/{name}.yaml is missing: the sweeps cannot name {name}"
        assert f"name: {name}" in config.read_text()
    stray = {p.stem for p in (ROOT / "conf" / "algorithm").glob("*.yaml")} - set(algorithms.REGISTRY)
    assert not stray, f"configs for algorithms the registry does not know: {stray}"


def test_the_lists_outside_the_package_are_the_registrys():
    from experiments import lossless_sweep, vllm_bench
    from xvocab.vllm import settings

    assert CROSS == algorithms.names(cross_vocabulary=True) and ALL == ("ar",) + CROSS
    assert settings.ALGORITHMS == algorithms.names(in_vllm=True) == vllm_bench.PROPOSER
    assert lossless_sweep.CROSS == lossless_sweep.SAMPLING_ALGORITHMS == CROSS


def test_the_exactness_and_distribution_suites_run_every_cross_vocabulary_algorithm():
    """Collected, not read: each algorithm must own test ids in both suites (the default and the slow ones)."""
    out = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:randomly",
                          "tests/test_exactness.py", "tests/test_distributions.py"],
                         cwd=ROOT, capture_output=True, text=True, check=True).stdout
    for suite in ("test_exactness.py", "test_distributions.py"):
        ids = [line for line in out.splitlines() if suite in line]
        for name in CROSS:
            assert any(f"[{name}-" in i or f"-{name}-" in i or f"[{name}]" in i or f"-{name}]" in i for i in ids), \
                f"{suite} runs nothing for {name}"


def test_registering_refuses_a_taken_name_and_lookups_name_the_choices():
    with pytest.raises(ConfigError, match="registered already"):
        algorithms.register(algorithms.get("tli"))
    with pytest.raises(ConfigError, match="register takes an xvocab.algorithms.Algorithm"):
        algorithms.register("tli")
    with pytest.raises(ConfigError, match=r"unknown algorithm 'rdk'; choose one of ar, slem, tli, slrs, sd"):
        algorithms.get("rdk")
    with pytest.raises(ValueError, match="coupling races exact-match verification only"):
        algorithms.Algorithm("x", algorithms.DRAFTERS["tli"], verification="rejection", summary="", couples=True)
    with pytest.raises(ValueError, match="tables="):
        algorithms.Algorithm("x", algorithms.DRAFTERS["tli"], verification="rejection", summary="", tables=("psi",))


def test_no_library_module_decides_by_an_algorithms_name(tmp_path):
    """Every "which algorithms ..." question in xvocab/ reads the registry entry, none compares with a name written
    out (the distillation losses are named after TLI and SLEM, not algorithms: xvocab.drafter). Control: a module that
    compares `algorithm == "slem"` is found."""
    from experiments.import_graph import name_comparisons

    assert [m for m in name_comparisons(ROOT) if not m.startswith("xvocab.drafter.")] == []
    (tmp_path / "xvocab").mkdir()
    (tmp_path / "xvocab" / "planted.py").write_text('def f(algorithm):\n    return algorithm in ("tli", "slrs")\n')
    assert name_comparisons(tmp_path) == ["xvocab.planted:2"]
