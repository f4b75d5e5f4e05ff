"""`python -m xvocab.zoo [list|fetch]`: show the zoo, or fetch and convert every asset now.

`fetch` is what CI runs before the tests, so a missing or corrupt asset fails loudly
there instead of being skipped.
"""
from __future__ import annotations

import argparse
import time

from xvocab import zoo


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m xvocab.zoo", description=__doc__)
    parser.add_argument("command", choices=["list", "fetch"], nargs="?", default="list")
    args = parser.parse_args(argv)
    if args.command == "list":
        print("tokenizers:", ", ".join(zoo.tokenizer_names()))
        print("models:    ", ", ".join(zoo.model_names()))
        print("drafters:  ", ", ".join(zoo.drafter_names()) or "(none)")
        print("datasets:  ", ", ".join(zoo.dataset_names()))
        print("cache:     ", zoo.cache_dir())
        return
    for name in zoo.tokenizer_names():
        start = time.perf_counter()
        tok = zoo.tokenizer(name)
        print(f"tokenizer {name:<14} {len(tok):>7} ids  {time.perf_counter() - start:5.1f} s", flush=True)
    for name in zoo.model_names():
        start = time.perf_counter()
        net, _ = zoo.model(name, device="cpu")
        n_params = sum(p.numel() for p in net.parameters())
        print(f"model     {name:<14} {n_params / 1e6:7.1f} M params  {time.perf_counter() - start:5.1f} s", flush=True)
    for name in zoo.drafter_names():  # committed in the repository; loading checks they are whole
        net, tok = zoo.model(name, device="cpu")
        n_params = sum(p.numel() for p in net.parameters())
        print(f"drafter   {name} {n_params / 1e6:.1f} M params, tokenizer of {len(tok)} ids", flush=True)
    for name in zoo.dataset_names():
        print(f"dataset   {name:<14} {len(zoo.dataset(name)):>7} rows", flush=True)


if __name__ == "__main__":
    main()
