"""`python -m xvocab.demo`: the embedded default pair on a few HumanEval prompts.

Target gemma-3-270m, draft smollm2-135m (different families and vocabularies).
Prints, per prompt, the target's greedy completion and its speed.
"""
from __future__ import annotations

import argparse
import time

import torch

from xvocab import zoo


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m xvocab.demo", description=__doc__)
    parser.add_argument("--prompts", type=int, default=3)
    parser.add_argument("--max-new-tokens", type=int, default=48)
    args = parser.parse_args(argv)
    torch.set_num_threads(2)
    target, target_tok = zoo.model("gemma-3-270m")
    draft, draft_tok = zoo.model("smollm2-135m")
    print(f"target gemma-3-270m: {len(target_tok)} ids; draft smollm2-135m: {len(draft_tok)} ids")
    for row in zoo.dataset("humaneval")[: args.prompts]:
        ids = target_tok(row["prompt"], add_special_tokens=False, return_tensors="pt").input_ids
        ids = torch.cat([torch.tensor([[target_tok.bos_token_id]]), ids], dim=1).to(target.device)
        start = time.perf_counter()
        out = target.generate(ids, max_new_tokens=args.max_new_tokens, do_sample=False)
        seconds = time.perf_counter() - start
        new = out[0, ids.shape[1]:]
        print(f"--- {row['id']}: {len(new)} tokens in {seconds:.2f} s ({len(new) / seconds:.1f} tok/s)")
        print(target_tok.decode(new))


if __name__ == "__main__":
    main()
