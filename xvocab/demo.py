"""`python -m xvocab.demo`: the embedded default pair on a few HumanEval prompts.

Target gemma-3-270m, draft smollm2-135m (different families and vocabularies), greedy.
For `ar`, `slem` and `tli` it prints tokens/s, tau (tokens per target forward) and the
acceptance rate, and checks that every method's output equals the target alone.
"""
from __future__ import annotations

import argparse

import torch

import xvocab


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m xvocab.demo", description=__doc__)
    parser.add_argument("--prompts", type=int, default=3)
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--k", type=int, default=4)
    args = parser.parse_args(argv)
    torch.set_num_threads(2)
    target, tt, draft, dt = xvocab.load_pair("gemma-3-270m", "smollm2-135m")
    print(f"target gemma-3-270m ({len(tt)} ids), draft smollm2-135m ({len(dt)} ids), "
          f"byte-exact intersection {xvocab.intersection(tt, dt).size} ids, k={args.k}, greedy")
    print(f"{'prompt':<14}{'method':<7}{'tok/s':>7}{'tau':>6}{'accept':>8}  equals ar")
    for row in xvocab.zoo.dataset("humaneval")[: args.prompts]:
        ref = None
        for alg in ("ar", "slem", "tli"):
            out = xvocab.generate(row["prompt"], target=target, target_tokenizer=tt, draft=draft, draft_tokenizer=dt,
                                  algorithm=alg, k=args.k, max_new_tokens=args.max_new_tokens)
            ref = ref or out
            s = out.stats
            print(f"{row['id']:<14}{alg:<7}{s.tokens_per_second:>7.1f}{s.tau:>6.2f}{s.acceptance_rate:>8.2f}  "
                  f"{out.token_ids == ref.token_ids}")
    print("\nlast completion:\n" + ref.text)


if __name__ == "__main__":
    main()
