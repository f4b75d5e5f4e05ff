"""Per-prompt result records: one JSON line each, appended atomically, with the environment.

A sweep may be killed at any moment and rerun: `append` writes a whole line in one
`write` under an exclusive lock and fsyncs it, and `read` ignores a trailing partial
line (a write cut off by a kill), so a rerun skips exactly the records already there
and loses nothing. Records carry the config, its hash, the git revision, device,
dtype and library versions, so figures made from them say what they measured.
"""
from __future__ import annotations

import fcntl
import hashlib
import json
import os
import platform
import subprocess
import tempfile
from functools import lru_cache
from pathlib import Path


def config_hash(config: dict) -> str:
    """Stable short hash of a JSON-able config (key order does not matter)."""
    return hashlib.sha256(json.dumps(config, sort_keys=True, default=str).encode()).hexdigest()[:16]


def append(path: str | Path, record: dict) -> None:
    """Append one record as a JSON line: one write, under an exclusive lock, fsynced."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    line = (json.dumps(record, sort_keys=True, default=str) + "\n").encode()
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        size = os.fstat(fd).st_size
        if size:  # a previous writer was killed mid-line: start on a fresh line
            with open(path, "rb") as fh:
                fh.seek(size - 1)
                if fh.read(1) != b"\n":
                    line = b"\n" + line
        os.write(fd, line)
        os.fsync(fd)
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


def write_atomic(path: str | Path, text: str) -> None:
    """Replace the file at `path` with `text` (UTF-8, no newline translation) through a temporary file and
    a rename: a reader, or a run killed mid-write, sees the old file or the new one, never half of one."""
    path = Path(path)
    with tempfile.NamedTemporaryFile("w", dir=path.parent, delete=False, suffix=".tmp", encoding="utf-8",
                                     newline="") as fh:
        fh.write(text)
    os.replace(fh.name, path)


def changed_settings(stored: dict, asked: dict) -> dict:
    """{key: (stored value, asked value)} for every key whose value differs (a missing key counts as None):
    what a resumed run would silently mix, for the error that refuses it."""
    return {k: (stored.get(k), asked.get(k)) for k in sorted(set(stored) | set(asked)) if stored.get(k) != asked.get(k)}


def read(path: str | Path) -> list[dict]:
    """All complete records of a file (a partial line left by a kill is skipped); a file kept compressed beside
    the name (`records.jsonl.gz`, as results/ keeps superseded records) is read in its place."""
    path = Path(path)
    packed = path.with_name(path.name + ".gz")
    if not path.exists() and packed.exists():
        import gzip

        text = gzip.decompress(packed.read_bytes()).decode("utf-8")
    elif path.exists():
        text = path.read_text(encoding="utf-8")
    else:
        return []
    out = []
    for line in text.splitlines():
        if not line.strip():
            continue
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return out


_VECTOR_FLAGS = ("avx2", "avx512f", "avx512_bf16", "avx512_vnni", "amx_tile", "amx_bf16", "asimd", "sve")


@lru_cache(maxsize=1)
def cpu_name() -> str:
    """The CPU model and the vector extensions that decide a CPU forward's cost, e.g.
    "AMD EPYC [avx2]" or "Intel(R) Xeon(R) Platinum 8488C [avx2 avx512f avx512_bf16 amx_tile amx_bf16]".
    Machines of one project differ (a Gemma forward: 62 ms with AMX, 162 ms with AVX2 only): every
    figure carries this."""
    model, flags = platform.processor() or platform.machine(), set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name" and value.strip():
                model = value.strip()
            elif key.strip() in ("flags", "Features"):
                flags = set(value.split())
                break
    except OSError:
        pass
    return f"{model} [{' '.join(f for f in _VECTOR_FLAGS if f in flags)}]"


@lru_cache(maxsize=1)
def environment() -> dict:
    """Where a record was measured: git revision, machine, library versions."""
    import torch
    import transformers

    try:
        repo = Path(__file__).resolve().parent.parent
        rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=repo, capture_output=True, text=True,
                             timeout=5).stdout.strip() or None
        dirty = bool(subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=repo,
                                    capture_output=True, text=True, timeout=5).stdout.strip())
    except (OSError, subprocess.SubprocessError):
        rev, dirty = None, None
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    return {"git_revision": rev, "git_dirty": dirty, "host": platform.node(), "cpu_count": os.cpu_count(),
            "cpu": cpu_name(), "gpu": gpu, "python": platform.python_version(), "torch": torch.__version__,
            "transformers": transformers.__version__}
