"""Drafting strategies, one per file, and the registry that says what each one is.

Each file defines `draft(ctx, k)`, a generator over the row's decode state (xvocab.decode.state.DraftContext)
returning a Proposal (it asks for the draft's logits whenever it needs them: xvocab.algorithms.common), and
`ALGORITHM`, its entry: how its proposals are verified, whether it reads a draft, can be coupled or needs one
vocabulary, which pair tables it reads, and its negative control (xvocab.algorithms.common.Algorithm). REGISTRY
lists them, one line each; everything outside this package knows algorithms only through it (the loop,
xvocab.decode.pair, xvocab.measure.records, the sweeps, the benchmarks and the test suites). Adding an algorithm is
its file, its line below and conf/algorithm/<name>.yaml (README, "Adding an algorithm"; tests/test_registry.py
checks each entry against its drafter and the suites).

Every list of algorithms outside this package is read from REGISTRY when it is used, never copied at import, so
an algorithm registered later joins them. An algorithm defined outside the package reaches other processes
(sweep workers, vLLM's engine and its workers) as a plugin: a module path in the environment variable
XVOCAB_PLUGINS (comma-separated), imported at the end of this package's import in every process that imports
xvocab, and calling `register` at its top level (it may import from xvocab.algorithms and xvocab.alignment there).

A Proposal carries target-vocabulary ids and, for the rejection-sampling family (sd, tli, slrs), the
distribution each was drawn from; exact-match proposals (slem, ar) carry none.
"""
from xvocab.algorithms import ar, lookup, lookup_slem, lookup_tli, rdk, sd, slem, slrs, tli
from xvocab.algorithms.common import Algorithm, Proposal
from xvocab.errors import ConfigError

REGISTRY: dict[str, Algorithm] = {a.name: a for a in (
    ar.ALGORITHM,
    slem.ALGORITHM,
    tli.ALGORITHM,
    slrs.ALGORITHM,
    sd.ALGORITHM,
    rdk.ALGORITHM,
    lookup.ALGORITHM,
    lookup_slem.ALGORITHM,
    lookup_tli.ALGORITHM,
)}


PLUGINS_VARIABLE = "XVOCAB_PLUGINS"  # module paths imported at import (module docstring)


def register(algorithm: Algorithm) -> Algorithm:
    """Add an algorithm defined outside this package (a research script's): from then on xvocab.generate,
    generate_batch, the sweeps and the checks that read the registry know it. A name already taken is refused."""
    if not isinstance(algorithm, Algorithm):
        raise ConfigError(f"register takes an xvocab.algorithms.Algorithm, not a {type(algorithm).__name__}")
    if algorithm.name in REGISTRY:
        raise ConfigError(f"an algorithm named {algorithm.name!r} is registered already; choose another name")
    REGISTRY[algorithm.name] = algorithm
    return algorithm


def get(name: str) -> Algorithm:
    """The registry entry of `name`, or a ConfigError listing the algorithms."""
    try:
        return REGISTRY[name]
    except (KeyError, TypeError):
        raise ConfigError(f"unknown algorithm {name!r}; choose one of {', '.join(REGISTRY)}") from None


def draft_arguments(name: str, draft, draft_tokenizer) -> dict:
    """xvocab.generate's draft arguments for algorithm `name`: none for an entry that reads no draft model (ar and
    lookup refuse one)."""
    return {"draft": draft, "draft_tokenizer": draft_tokenizer} if get(name).uses_draft else {}


def names(*, drafting: bool | None = None, proposing: bool | None = None, verification: str | None = None,
          couples: bool | None = None, cross_vocabulary: bool | None = None,
          in_vllm: bool | None = None) -> tuple[str, ...]:
    """The registered names with the asked properties, in registry order (None: either). `drafting`: reads a
    draft model; `proposing`: proposes at all (every entry but ar: lookup proposes from the context alone)."""
    def keep(a: Algorithm) -> bool:
        return ((drafting is None or a.uses_draft == drafting)
                and (proposing is None or a.proposes == proposing)
                and (verification is None or a.verification == verification)
                and (couples is None or a.couples == couples)
                and (cross_vocabulary is None or (a.uses_draft and not a.one_vocabulary) == cross_vocabulary)
                and (in_vllm is None or a.in_vllm == in_vllm))
    return tuple(n for n, a in REGISTRY.items() if keep(a))


def load_plugins(spec: str | None = None) -> tuple[str, ...]:
    """Import each module named in `spec` (comma-separated; None: the XVOCAB_PLUGINS variable), each of which
    registers its algorithms; a module already imported is not run again. The module paths imported."""
    import importlib
    import os

    paths = tuple(p.strip() for p in (os.environ.get(PLUGINS_VARIABLE, "") if spec is None else spec).split(",")
                  if p.strip())
    for path in paths:
        try:
            importlib.import_module(path)
        except ImportError as err:
            raise ConfigError(f"algorithm plugin {path!r} (from {PLUGINS_VARIABLE} or a plugins setting) could not be "
                              f"imported: {err}; name an importable module that calls xvocab.algorithms.register, "
                              f"with its folder on PYTHONPATH") from err
    return paths


__all__ = ["REGISTRY", "Algorithm", "DraftContext", "Proposal", "draft_arguments", "get", "load_plugins", "names",
           "register"]

load_plugins()
