"""HumanEval-style code prompts and raw code text from the Python standard library.

Why the standard library: it ships with every interpreter, so a fresh offline machine can rebuild
the same training data; it is real, idiomatic Python with docstrings, the domain of HumanEval.

A prompt is what HumanEval gives a model: a function's signature and docstring, dedented, ending
in a newline, e.g.

    def commonprefix(m):
        "Given a list of pathnames, returns the longest common leading component"

The invariant: no prompt defines a function named like a HumanEval entry point, so the drafter is
never trained on the evaluation prompts (the text of the two sets is disjoint, and the names are
too). Order is deterministic for a given interpreter version and seed.
"""
from __future__ import annotations

import ast
import random
import sysconfig
import textwrap
from functools import lru_cache
from pathlib import Path

# Directories of the standard library that are not ordinary library code (or are huge test data).
_SKIP_DIRS = {"site-packages", "dist-packages", "test", "tests", "idlelib", "lib2to3", "turtledemo",
              "__pycache__", "ensurepip", "venv", "pydoc_data", "encodings"}


def stdlib_files() -> list[Path]:
    """The standard library's .py files, sorted, without tests and vendored packages."""
    root = Path(sysconfig.get_paths()["stdlib"])
    files = [p for p in root.rglob("*.py") if not (_SKIP_DIRS & set(p.relative_to(root).parts[:-1]))]
    return sorted(files)


def _parse(path: Path) -> tuple[str, ast.Module] | None:
    try:
        source = path.read_text(encoding="utf-8")
        return source, ast.parse(source)
    except (SyntaxError, UnicodeDecodeError, ValueError):
        return None


def _prompt_of(lines: list[str], node: ast.FunctionDef | ast.AsyncFunctionDef) -> str | None:
    body0 = node.body[0] if node.body else None
    if not (isinstance(body0, ast.Expr) and isinstance(body0.value, ast.Constant)
            and isinstance(body0.value.value, str)) or len(node.body) < 2:
        return None  # no docstring, or nothing to complete after it
    text = "".join(lines[node.lineno - 1:body0.end_lineno])
    return textwrap.dedent(text).rstrip() + "\n"


@lru_cache(maxsize=1)
def _documented_functions() -> tuple[tuple[str, str, str], ...]:
    """(id, name, prompt) of every documented standard-library function, in file and source order.
    Parsing the standard library takes seconds, so it is done once per process."""
    out = []
    root = Path(sysconfig.get_paths()["stdlib"])
    for path in stdlib_files():
        parsed = _parse(path)
        if parsed is None:
            continue
        source, tree = parsed
        lines = source.splitlines(keepends=True)
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                prompt = _prompt_of(lines, node)
                if prompt:
                    out.append((f"{path.relative_to(root)}:{node.lineno}:{node.name}", node.name, prompt))
    return tuple(out)


def code_prompts(*, seed: int, exclude_names: set[str], max_chars: int) -> list[dict]:
    """[{id, prompt}] for every documented standard-library function, shuffled by `seed`.

    `exclude_names`: function names never to use (the evaluation set's entry points);
    `max_chars`: longer prompts are dropped (very long docstrings are not HumanEval-like).
    """
    rows = [{"id": id_, "prompt": prompt} for id_, name, prompt in _documented_functions()
            if name not in exclude_names and len(prompt) <= max_chars]
    random.Random(seed).shuffle(rows)
    return rows


def raw_code(*, max_chars: int) -> list[str]:
    """Whole standard-library source files, each cut into pieces of at most `max_chars`."""
    pieces = []
    for path in stdlib_files():
        parsed = _parse(path)
        if parsed is None:
            continue
        source = parsed[0]
        for start in range(0, len(source), max_chars):
            pieces.append(source[start:start + max_chars])
    return pieces
