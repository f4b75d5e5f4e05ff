"""HumanEval-style code prompts and raw code text from the Python standard library and pinned PyPI packages.

Why the standard library: it ships with every interpreter, so a fresh offline machine can rebuild
the same training data; it is real, idiomatic Python with docstrings, the domain of HumanEval.
Why more sources: the standard library holds about 5,900 documented functions, and its docstrings rarely
show examples. `source="pypi"`: small utility packages (algorithms, pydash, more-itertools, toolz, boltons,
funcy, networkx) add about 2,800 more, most with `>>>` examples as HumanEval's prompts have;
`source="pypi-more"`: sympy, mpmath, nltk, pygorithm and eight smaller packages add about 11,500 (over a
quarter with examples). All pinned by version and sha256 (xvocab.zoo.assets.CODE_PACKAGES, CODE_SOURCES), read
from the verified wheels.

A prompt is what HumanEval gives a model: a function's signature and docstring, dedented, ending
in a newline, e.g.

    def commonprefix(m):
        "Given a list of pathnames, returns the longest common leading component"

The invariant: no prompt defines a function named like a HumanEval entry point, so the drafter is
never trained on the evaluation prompts (the text of the two sets is disjoint, and the names are
too). Order is deterministic for a given source (interpreter version or package versions) and seed.
"""
from __future__ import annotations

import ast
import random
import sysconfig
import textwrap
import zipfile
from collections.abc import Iterator
from functools import lru_cache, partial
from pathlib import Path

from xvocab.errors import ConfigError
from xvocab.zoo.assets import CODE_PACKAGES, CODE_SOURCES
from xvocab.zoo.cache import fetch

# Directories of the standard library that are not ordinary library code (or are huge test data).
_SKIP_DIRS = {"site-packages", "dist-packages", "test", "tests", "idlelib", "lib2to3", "turtledemo",
              "__pycache__", "ensurepip", "venv", "pydoc_data", "encodings"}


def stdlib_files() -> list[Path]:
    """The standard library's .py files, sorted, without tests and vendored packages."""
    root = Path(sysconfig.get_paths()["stdlib"])
    files = [p for p in root.rglob("*.py") if not (_SKIP_DIRS & set(p.relative_to(root).parts[:-1]))]
    return sorted(files)


def _tree(source: str) -> ast.Module | None:
    """The parsed module, or None for source this interpreter cannot parse."""
    try:
        return ast.parse(source)
    except (SyntaxError, ValueError):
        return None


def _prompt_of(lines: list[str], node: ast.FunctionDef | ast.AsyncFunctionDef) -> str | None:
    body0 = node.body[0] if node.body else None
    if not (isinstance(body0, ast.Expr) and isinstance(body0.value, ast.Constant)
            and isinstance(body0.value.value, str)) or len(node.body) < 2:
        return None  # no docstring, or nothing to complete after it
    text = "".join(lines[node.lineno - 1:body0.end_lineno])
    return textwrap.dedent(text).rstrip() + "\n"


def stdlib_sources() -> Iterator[tuple[str, str]]:
    """(path relative to the standard library, source) of every readable standard-library file."""
    root = Path(sysconfig.get_paths()["stdlib"])
    for path in stdlib_files():
        try:
            yield str(path.relative_to(root)), path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, ValueError):
            continue


def pypi_sources(source: str) -> Iterator[tuple[str, str]]:
    """("pypi/NAME-VERSION/member", source) of every .py file in the wheels of CODE_SOURCES[source], tests
    excluded, sorted within each package. Fetches a missing wheel (verified by sha256) on first use."""
    for pkg in (CODE_PACKAGES[key] for key in CODE_SOURCES[source]):
        with zipfile.ZipFile(fetch(pkg)) as zf:
            for member in sorted(zf.namelist()):
                if member.endswith(".py") and not (_SKIP_DIRS & set(member.split("/")[:-1])):
                    try:
                        yield f"pypi/{pkg.name}-{pkg.version}/{member}", zf.read(member).decode("utf-8")
                    except UnicodeDecodeError:
                        continue


# Every prompt source: the standard library, then each set of pinned wheels (a new set needs only CODE_SOURCES).
SOURCES = {"stdlib": stdlib_sources, **{name: partial(pypi_sources, name) for name in CODE_SOURCES}}


def check_source(source: str) -> str:
    """`source` if it names a prompt source, else a ConfigError listing them."""
    if source not in SOURCES:
        raise ConfigError(f"prompt source {source!r} is unknown; choose one of {', '.join(SOURCES)}")
    return source


@lru_cache(maxsize=None)
def _documented_functions(source: str = "stdlib") -> tuple[tuple[str, str, str], ...]:
    """(id, name, prompt) of every documented function of `source`, in file and source order; the id is
    "path:line:name". Parsing takes seconds, so it is done once per process and source."""
    out = []
    for rel, text in SOURCES[check_source(source)]():
        tree = _tree(text)
        if tree is None:
            continue
        lines = text.splitlines(keepends=True)
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                prompt = _prompt_of(lines, node)
                if prompt:
                    out.append((f"{rel}:{node.lineno}:{node.name}", node.name, prompt))
    return tuple(out)


def code_prompts(*, seed: int, exclude_names: set[str], max_chars: int, source: str = "stdlib") -> list[dict]:
    """[{id, prompt}] for every documented function of `source` (a key of SOURCES), shuffled by `seed`.

    `exclude_names`: function names never to use (the evaluation set's entry points);
    `max_chars`: longer prompts are dropped (very long docstrings are not HumanEval-like).
    """
    rows = [{"id": id_, "prompt": prompt} for id_, name, prompt in _documented_functions(source)
            if name not in exclude_names and len(prompt) <= max_chars]
    random.Random(seed).shuffle(rows)
    return rows


def raw_code(*, max_chars: int) -> list[str]:
    """Whole standard-library source files, each cut into pieces of at most `max_chars`."""
    pieces = []
    for _, source in stdlib_sources():
        if _tree(source) is None:
            continue
        for start in range(0, len(source), max_chars):
            pieces.append(source[start:start + max_chars])
    return pieces
