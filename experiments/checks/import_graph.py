"""`python -m experiments.checks.import_graph`: the project's module graph as a reader meets it: rooms, floors,
cycles, and where an algorithm's name travels.

What: every import in xvocab/, experiments/ and paper_figs/ (function-level ones too) read from the source (`graph`);
`ROOMS` declares the order of the library's rooms and `room_violations` lists every import against it;
`find_cycle` returns one import cycle or None; a module's floor (printed) is 0 when it imports no library module,
else one above the highest floor it imports. `--walk` lists the library functions that take
an `algorithm` argument, by floor: each is a place an algorithm's name is read or handed on, the walk a reader
follows from `xvocab.generate` (the fewer, and the fewer floors they span, the less there is to follow).

Why: tests/test_crash_paths.py asserts the room order, no cycle and no reaching into another module's private
names from this graph; this command prints what the test asserts about, for the log and the house issue's before/after.

    python -m experiments.checks.import_graph [--walk] [--root DIR]
"""
from __future__ import annotations

import argparse
import ast
from collections import Counter
from pathlib import Path

PACKAGES = ("xvocab", "experiments", "paper_figs")  # every module of the project

# The library's rooms (xvocab/<room>/ folders, and the single modules errors.py and defaults.py), lowest first: a
# module may import from its own room and from rooms below it, never above (the package's __init__, the door,
# may import any). A dotted name is one module placed on a floor of its own below its folder: decode.state, the
# per-row state the loop moves and the drafters read, sits under the algorithms, the loop above them.
# CONTRIBUTING.md shows this order; tests/test_crash_paths.py holds the graph to it.
ROOMS = ("errors", "defaults", "alignment", "zoo", "runtime", "verification", "decode.state", "algorithms", "measure",
         "decode", "checks", "drafter", "vllm")


def room(module: str) -> str | None:
    """The room of a library module (`xvocab.decode.loop` -> decode, `xvocab.decode.state` -> decode.state,
    `xvocab.errors` -> errors); None for the package itself and for modules outside the library."""
    parts = module.split(".")
    if parts[0] != "xvocab" or len(parts) < 2:
        return None
    dotted = ".".join(parts[1:3])
    return dotted if dotted in ROOMS else parts[1]


def room_violations(g: dict[str, set[str]]) -> list[str]:
    """Every library import that points up the room order or into an undeclared room, as "module -> module (room
    -> room)"; empty when the rooms form the declared order (which makes a cycle between rooms impossible)."""
    out = []
    for m, deps in sorted(g.items()):
        mine = room(m)
        if mine is None:
            continue
        for d in sorted(deps):
            theirs = room(d)
            if theirs is None or theirs == mine:
                continue
            if mine not in ROOMS or theirs not in ROOMS or ROOMS.index(theirs) > ROOMS.index(mine):
                out.append(f"{m} -> {d} ({mine} -> {theirs})")
    return out


def modules(root: Path) -> dict[str, Path]:
    """{dotted module name: its file} for every module of PACKAGES under `root`."""
    return {".".join(p.relative_to(root).with_suffix("").parts).removesuffix(".__init__"): p
            for package in PACKAGES for p in sorted((root / package).rglob("*.py"))}


def graph(root: Path) -> tuple[dict[str, set[str]], list[str]]:
    """({module: the project modules it imports}, private names imported across modules)."""
    found = modules(root)
    out, private = {}, []
    for name, path in found.items():
        deps = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith(PACKAGES):
                deps.add(node.module)
                deps.update(f"{node.module}.{a.name}" for a in node.names if f"{node.module}.{a.name}" in found)
                private += [f"{name}: from {node.module} import {a.name}" for a in node.names
                            if a.name.startswith("_") and node.module != name]
            elif isinstance(node, ast.Import):
                deps.update(a.name for a in node.names if a.name.startswith(PACKAGES))
        out[name] = {d for d in deps if d in found and d != name and not name.startswith(d + ".") and d not in PACKAGES}
    return out, private


def find_cycle(g: dict[str, set[str]]) -> list[str] | None:
    """One import cycle of `g` (its modules in order, the first repeated at the end), or None."""
    state = {}

    def visit(n, stack):
        state[n] = 1
        for m in sorted(g.get(n, ())):
            if state.get(m) == 1:
                return stack + [n, m]
            if m not in state and (found := visit(m, stack + [n])):
                return found
        state[n] = 2
        return None

    return next((c for n in sorted(g) if n not in state and (c := visit(n, []))), None)


def floors(g: dict[str, set[str]], package: str = "xvocab") -> dict[str, int]:
    """{module of `package`: its floor} (module docstring); `g` must have no cycle."""
    lib = {m: {d for d in deps if d.startswith(package)} for m, deps in g.items() if m.startswith(package)}
    floor: dict[str, int] = {}

    def of(m):
        if m not in floor:
            floor[m] = 1 + max(map(of, lib[m]), default=-1)
        return floor[m]

    for m in lib:
        of(m)
    return floor


def algorithm_walk(root: Path, floor: dict[str, int]) -> list[tuple[int, str]]:
    """(floor, module:function) for each library function with an `algorithm` parameter."""
    out = []
    for name, path in modules(root).items():
        if not name.startswith("xvocab"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                args = node.args.args + node.args.kwonlyargs + node.args.posonlyargs
                if any(a.arg == "algorithm" for a in args):
                    out.append((floor.get(name, -1), f"{name}:{node.name}"))
    return sorted(out)


def _names() -> set[str]:
    """The registered algorithms' names, as source text would spell them."""
    from xvocab import algorithms

    return set(algorithms.REGISTRY)


def name_comparisons(root: Path, package: str = "xvocab") -> list[str]:
    """module:line of each comparison with an algorithm's name written out (`algorithm == "slem"`, `in ("tli",
    "slrs")`): each is a place that decides by name what the registry entry should say."""
    out, names = [], _names()
    for name, path in modules(root).items():
        if not name.startswith(package):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Compare):
                for side in [node.left, *node.comparators]:
                    consts = side.elts if isinstance(side, (ast.Tuple, ast.List, ast.Set)) else [side]
                    if any(isinstance(c, ast.Constant) and c.value in names for c in consts):
                        out.append(f"{name}:{node.lineno}")
                        break
    return out


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", default=str(Path(__file__).resolve().parents[2]))
    parser.add_argument("--walk", action="store_true", help="also list where an algorithm's name is read")
    args = parser.parse_args(argv)
    root = Path(args.root)
    g, private = graph(root)
    cycle = find_cycle(g)
    print(f"modules: {len(g)} ({sum(m.startswith('xvocab') for m in g)} in the library); cycle: "
          f"{' -> '.join(cycle) if cycle else 'none'}; private imports across modules: {len(private)}")
    print(f"rooms, lowest first: {' < '.join(ROOMS)}; imports against that order: "
          + ("; ".join(room_violations(g)) or "none"))
    if find_cycle({m: d for m, d in g.items() if m.startswith("xvocab")}):
        return  # floors need an acyclic library
    floor = floors(g)
    rooms = Counter(m.split(".")[1] if m.count(".") >= 1 else "(package)" for m in floor)
    top = [m.split(".")[1] for m in floor if m.count(".") == 1 and not (root / m.replace(".", "/")).is_dir()]
    print(f"library floors: {max(floor.values()) + 1}; modules per floor: "
          + ", ".join(f"{f}: {n}" for f, n in sorted(Counter(floor.values()).items())))
    print(f"rooms (library folders): {', '.join(sorted(r for r in rooms if (root / 'xvocab' / r).is_dir()))}")
    print(f"library modules outside a room: {', '.join(sorted(top)) or 'none'}")
    if args.walk:
        walk = algorithm_walk(root, floor)
        print(f"functions taking `algorithm`: {len(walk)}, over {len({f for f, _ in walk})} floors and "
              f"{len({w.split(':')[0] for _, w in walk})} modules")
        for f, w in walk:
            print(f"  floor {f:2d}  {w}")
        named = name_comparisons(root)
        print(f"library comparisons with an algorithm's name written out: {len(named)}"
              + (f" ({', '.join(named)})" if named else ""))


if __name__ == "__main__":
    main()
