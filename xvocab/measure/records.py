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
import time
from functools import lru_cache
from pathlib import Path


def config_hash(config: dict) -> str:
    """Stable short hash of a JSON-able config (key order does not matter)."""
    return hashlib.sha256(json.dumps(config, sort_keys=True, default=str).encode()).hexdigest()[:16]


def equals_ar_by_construction(config: dict) -> bool:
    """Whether a record made at sweep point `config` must hold exactly the tokens `ar` emits at that point (so the
    runner and the report check `equals_ar`): every greedy algorithm (each is lossless), and at T > 0 slem with
    coupling=gumbel, which races `ar coupling=gumbel` on the same noise tape (same seed, same prompt index) and
    emits the target's own samples, whatever it drafts (xvocab.verification.coupling). Other sampled rows are other
    samples of the same distribution: tests/test_distributions.py proves those."""
    from xvocab import algorithms  # (here: reading and writing records needs no model code)

    spec = algorithms.get(config["algorithm"])
    if not spec.proposes:  # ar itself is the reference
        return False
    return config["temperature"] == 0 or (spec.couples and config.get("coupling") == "gumbel")


def reference_tape(config: dict):
    """What an `ar` record must share with a row besides the point's baseline to be the output that row must
    equal: nothing when greedy ("greedy"); at T > 0 the coupled noise tape, i.e. its seed (the prompt index is the
    prompt's). None where no `ar` record can be a reference (uncoupled, T > 0)."""
    if config["temperature"] == 0:
        return "greedy"
    return ("gumbel", config["seed"]) if config.get("coupling") == "gumbel" else None


def _beside(path: str | Path) -> Path:
    """`<stem>.d/` beside a records file: its writers' files and the claims of the jobs sharing it."""
    path = Path(path)
    return path.parent / f"{path.stem}.d"


def writer_file(path: str | Path, writer: str) -> Path:
    """The file one writer of `path`'s records appends to alone: `<stem>.d/<writer>.jsonl` beside it."""
    return _beside(path) / f"{writer}.jsonl"


def append(path: str | Path, record: dict, writer: str | None = None) -> None:
    """Append one record as a JSON line: one write, under an exclusive lock, fsynced. With `writer` (one per
    process of a sweep, e.g. host and pid), the line goes to that writer's own file (`writer_file`), which no
    other process writes: sound where file locks do not hold (a cluster's shared filesystem); `read` reads it."""
    path = Path(path) if writer is None else writer_file(path, writer)
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
    os.chmod(fh.name, 0o644)  # a temporary file is private (0600); the file it replaces was not
    os.replace(fh.name, path)


def changed_settings(stored: dict, asked: dict) -> dict:
    """{key: (stored value, asked value)} for every key whose value differs (a missing key counts as None):
    what a resumed run would silently mix, for the error that refuses it."""
    return {k: (stored.get(k), asked.get(k)) for k in sorted(set(stored) | set(asked)) if stored.get(k) != asked.get(k)}


def read(path: str | Path) -> list[dict]:
    """All complete records of a file and of its writers' files (`writer_file`; a partial line left by a kill is
    skipped); a file kept compressed beside the name (`records.jsonl.gz`, as results/ keeps superseded records)
    is read in its place."""
    path = Path(path)
    writers = _beside(path)
    mine = _read_one(path)
    return mine + [r for f in sorted(writers.glob("*.jsonl")) for r in _read_one(f)] if writers.is_dir() else mine


def claim(path: str | Path, key: str, stale_after_s: float = 6 * 3600) -> bool:
    """Claim the work `key` names (say a config hash and a prompt id) for this process, for the jobs of one sweep
    sharing `path`'s records: True if it is now this process's to do, False if another live process holds it.

    The claim is a file created with O_EXCL (atomic on local filesystems and on NFS v3 or later). A claim whose
    process has died (same host: its pid is gone; another host: older than `stale_after_s`) is taken over,
    so a rerun after a kill is never blocked. Call `release` once the work's record is written (or abandoned)."""
    target = _beside(path) / "claims" / _safe(key)
    target.parent.mkdir(parents=True, exist_ok=True)
    me = f"{platform.node()} {os.getpid()}"
    for _ in range(2):
        try:
            fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            try:
                holder = target.read_text().split()
                age = time.time() - target.stat().st_mtime
            except (FileNotFoundError, ValueError):
                continue  # released meanwhile: try again
            if len(holder) == 2 and f"{holder[0]} {holder[1]}" == me:
                return True
            if not _dead(holder, age, stale_after_s):
                return False
            target.unlink(missing_ok=True)  # its process is gone: take it over
            continue
        with os.fdopen(fd, "w") as fh:
            fh.write(me)
        return True
    return False


def release(path: str | Path, key: str) -> None:
    """Drop this process's claim on `key` (see `claim`)."""
    (_beside(path) / "claims" / _safe(key)).unlink(missing_ok=True)


def _safe(key: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in key)


def _dead(holder: list[str], age: float, stale_after_s: float) -> bool:
    if not holder:  # created, its holder not yet written (or it died in between)
        return age > 60
    if len(holder) != 2 or not holder[1].isdigit():
        return True  # not a claim this code wrote
    if holder[0] != platform.node():
        return age > stale_after_s
    try:
        os.kill(int(holder[1]), 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


def _read_one(path: Path) -> list[dict]:
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


# Environment variables that cap the instruction set torch's kernels, oneDNN and MKL use below what the CPU has: a
# machine with AVX-512 BF16 runs as an AVX2-only one (bfloat16 products emulated) under
# ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2 (CONTRIBUTING.md, "CPU kinds").
ISA_CAPS = ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA", "MKL_ENABLE_INSTRUCTIONS")


@lru_cache(maxsize=1)
def cpu_name() -> str:
    """The CPU model and the vector extensions that decide a CPU forward's cost, e.g.
    "AMD EPYC [avx2]" or "Intel(R) Xeon(R) Platinum 8488C [avx2 avx512f avx512_bf16 amx_tile amx_bf16]", and the caps
    set on them (ISA_CAPS: "... capped ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2"). Machines of one project
    differ (a Gemma forward: 62 ms with AMX, 162 ms with AVX2 only): every figure carries this."""
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
    caps = " ".join(f"{k}={os.environ[k]}" for k in ISA_CAPS if os.environ.get(k))
    return f"{model} [{' '.join(f for f in _VECTOR_FLAGS if f in flags)}]" + (f" capped {caps}" if caps else "")


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
