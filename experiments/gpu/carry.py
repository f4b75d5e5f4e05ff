"""What a GPU session brings with it: packed here (`pack`), checked there before anything runs (`preflight`).

A lent GPU machine (the device tool) has Python 3.12, torch 2.11 and transformers 5.17, no network, and takes
the working tree plus named ignored paths, 64 MiB in all. xvocab runs under 5.17 (its models take the KV cache
as `past_key_values`, which xvocab.runtime.kv.cache_argument reads), but the figures were measured under 5.24, so the
session carries transformers 5.24 (and the huggingface-hub it needs), as wheels for the machine's Python, installed
there without byte-compiling; and the converted tokenizers the GPU tests and experiments.gpu.bench read, as
one xz archive of the xvocab cache (a missing one would send the zoo to the network: the session sets
XVOCAB_OFFLINE, and the preflight loads every one first).

    python -m experiments.gpu.carry                 # here: gpu_carry/ (wheels, cache archive, manifest)
    python -m experiments.gpu.carry --preflight     # there (experiments/gpu/session.sh runs it): versions, assets

`pack` measures what travels (tracked and untracked-but-not-ignored files plus gpu_carry/) and fails above
LIMIT_MIB, leaving a margin under the tool's 64 MiB.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tarfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CARRY = ROOT / "gpu_carry"
LIMIT_MIB = 60
PYTHON = "3.12"                        # the GPU machine's interpreter
PLATFORM = "manylinux2014_x86_64"
WHEELS = ("transformers==5.24.0", "huggingface-hub==1.31.0")  # 5.24: models take cache=; it needs hub>=1.31
TEST_TOKENIZERS = ("starcoder", "refact", "gemma-4")            # tests/test_cuda.py


def tokenizers_needed() -> tuple[str, ...]:
    """Every zoo tokenizer the session reads: the GPU tests', the benchmark shapes' and the shipped drafter's."""
    from experiments.gpu.bench import SHAPES
    from xvocab import defaults
    from xvocab.zoo.models import DRAFTERS_DIR

    drafter = json.loads((DRAFTERS_DIR / defaults.DRAFT / "config.json").read_text())["xvocab_tokenizer"]
    shapes = tuple(tok for _, _, tok in SHAPES.values() if tok)
    return tuple(dict.fromkeys(TEST_TOKENIZERS + shapes + (drafter,)))


def travelling_bytes() -> int:
    """Bytes the device tool copies: files git tracks or would add (untracked, not ignored), and gpu_carry/."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                            capture_output=True, check=True).stdout.decode().split("\0")
    tree = sum((ROOT / p).stat().st_size for p in listed if p and (ROOT / p).is_file())
    return tree + sum(p.stat().st_size for p in CARRY.rglob("*") if p.is_file())


def pack() -> dict:
    import shutil

    from xvocab import zoo
    from xvocab.zoo.tokenizers import converted_dir

    shutil.rmtree(CARRY, ignore_errors=True)
    (CARRY / "wheels").mkdir(parents=True)
    subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary", ":all:",
                    "--python-version", PYTHON, "--platform", PLATFORM, "--dest", str(CARRY / "wheels"), *WHEELS],
                   check=True)
    names = tokenizers_needed()
    dirs = []
    for name in names:
        zoo.tokenizer(name)  # converts (once) what is not cached yet
        dirs.append(converted_dir(name).relative_to(zoo.cache_dir()))
    with tarfile.open(CARRY / "xvocab-cache.tar.xz", "w:xz") as tar:
        for d in dirs:
            tar.add(zoo.cache_dir() / d, arcname=str(d))
    size = travelling_bytes()  # (the manifest, under a kilobyte, is written after)
    manifest = {"wheels": sorted(p.name for p in (CARRY / "wheels").iterdir()), "python": PYTHON,
                "tokenizers": list(names), "cache_dirs": [str(d) for d in dirs],
                "travelling_mib": round(size / 2**20, 1)}
    (CARRY / "manifest.json").write_text(json.dumps(manifest, indent=1))
    print(f"gpu_carry: {', '.join(manifest['wheels'])}; {len(manifest['cache_dirs'])} tokenizers; the tree and "
          f"gpu_carry/ together {manifest['travelling_mib']} MiB (limit {LIMIT_MIB})")
    if size > LIMIT_MIB * 2**20:
        raise SystemExit(f"gpu_carry: {size / 2**20:.1f} MiB would travel, over {LIMIT_MIB} MiB: move large "
                         f"tracked files (superseded drafters, history records) out of the tree first")
    return manifest


def preflight(device: str) -> None:
    """Fail at once, naming what is wrong, unless the versions are right and every asset loads offline."""
    import torch
    import transformers
    from packaging.version import Version

    from xvocab import zoo
    from xvocab.runtime.kv import TRANSFORMERS_FLOOR

    print(f"python {sys.version.split()[0]}, torch {torch.__version__}, transformers {transformers.__version__} "
          f"(from {Path(transformers.__file__).parent})", flush=True)
    problems = []
    if Version(transformers.__version__) < Version(TRANSFORMERS_FLOOR):
        problems.append(f"transformers {transformers.__version__} < {TRANSFORMERS_FLOOR}: the carried wheels were "
                        f"not installed or not first on PYTHONPATH")
    if device.startswith("cuda") and not torch.cuda.is_available():
        problems.append("no CUDA device, but --device cuda")
    elif device.startswith("cuda"):
        print(f"device {torch.cuda.get_device_name(0)}, CUDA {torch.version.cuda}", flush=True)
    for name in tokenizers_needed():
        try:
            print(f"tokenizer {name}: {len(zoo.tokenizer(name))} ids", flush=True)
        except Exception as err:  # each missing asset is named, then the session stops
            problems.append(f"tokenizer {name}: {type(err).__name__}: {err}")
    if problems:
        raise SystemExit("preflight failed:\n  " + "\n  ".join(problems))
    print("preflight: ok", flush=True)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m experiments.gpu.carry", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preflight", action="store_true", help="check versions and assets (on the GPU machine)")
    parser.add_argument("--device", default="cuda")
    args = parser.parse_args(argv)
    preflight(args.device) if args.preflight else pack()


if __name__ == "__main__":
    main()
