"""`python -m experiments.lossless_sweep [--families A B ...] [--offsets 1 7]`: losslessness over many tokenizer pairs.

What: every zoo tokenizer family (or those named) as the target's, each paired with the families `offsets` places
after it in the list as the draft's. The target is a tiny random model over its tokenizer and the draft its mirror
over the other (xvocab.zoo.tiny.mirror_model: the same model re-expressed, so proposals are often accepted and long
accepted runs cross every boundary case). For each pair and each of the awkward prompts below it checks, token for
token:
  - greedy slem, tli and slrs, with the draft's own tokenization and with the target-aligned one, equal `ar`;
  - coupled slem at T = 1 equals coupled `ar` (the same seed), with both encodings;
  - the batched loop (xvocab.generate_batch, 4 rows at a time over all the prompts) equals `ar` on every row.
It prints one line per pair and every failure, and exits 1 if any.

Why: the test suite checks 8 pairs on 3 prompts; a new tokenizer family, or text with scripts, emoji, tabs, CRLF
and long digit runs, is where a boundary bug would hide. The sweep is the wide net: minutes on one CPU thread.
"""
from __future__ import annotations

import argparse
import sys
import time
import traceback

import torch

import xvocab
from xvocab.engine import generate
from xvocab.zoo.tiny import mirror_model

# Scripts, emoji with modifiers, tabs and superscripts, CRLF and digit runs, combining-looking accents and curly
# quotes, one character, whitespace alone.
PROMPTS = ["  def f(x):\n\treturn x**2  # ½ ²", "日本語のテキスト、そして emoji 🤖👍🏽!", "\r\n\r\n  1234567890 ...",
           "Ünïcödé café naïve — “quotes” ‘x’", "a", "    \n\n\n    "]
MODEL_TOKENIZERS = ["gemma-3-270m", "smollm2-135m"]  # the zoo models' own tokenizers, beside the families


def check_pair(target_name: str, draft_name: str, *, seed: int, max_new_tokens: int) -> list[tuple]:
    """Every failure of one (target tokenizer, draft tokenizer) pair, as tuples naming what differed."""
    tt, dt = xvocab.zoo.tokenizer(target_name), xvocab.zoo.tokenizer(draft_name)
    target = xvocab.zoo.tiny_model(tt, seed=seed)
    draft = mirror_model(target, tt, dt)
    both = dict(target=target, target_tokenizer=tt, max_new_tokens=max_new_tokens)
    pair = both | dict(draft=draft, draft_tokenizer=dt, k=4)
    fails = []
    refs = []
    for prompt in PROMPTS:
        ref = generate(prompt, algorithm="ar", **both).token_ids
        refs.append(ref)
        for alg in ("slem", "tli", "slrs"):
            for enc in ("native", "aligned"):
                if generate(prompt, algorithm=alg, draft_encoding=enc, **pair).token_ids != ref:
                    fails.append((alg, enc, "T=0", prompt))
        coupled = dict(temperature=1.0, coupling="gumbel", seed=11)
        cref = generate(prompt, algorithm="ar", **both, **coupled).token_ids
        for enc in ("native", "aligned"):
            if generate(prompt, algorithm="slem", draft_encoding=enc, **pair, **coupled).token_ids != cref:
                fails.append(("coupled slem", enc, "T=1", prompt))
    for alg in ("slem", "tli", "slrs"):
        outs = xvocab.generate_batch(PROMPTS, algorithm=alg, batch_size=4, **pair)
        fails += [(alg, "batched", "T=0", PROMPTS[i]) for i, o in enumerate(outs) if o.token_ids != refs[i]]
    return fails


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m experiments.lossless_sweep", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--families", nargs="+", default=None, help="target families to check (default: all)")
    parser.add_argument("--offsets", type=int, nargs="+", default=[1, 7],
                        help="each target's drafts: the families this many places later in the list")
    parser.add_argument("--max-new-tokens", type=int, default=20)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    names = sorted(xvocab.zoo.tokenizers.TOKENIZERS) + MODEL_TOKENIZERS
    unknown = sorted(set(args.families or []) - set(names))
    if unknown:
        parser.error(f"unknown families {unknown}; choose from {', '.join(names)}")
    fails, start = [], time.perf_counter()
    for i, target_name in enumerate(names):
        if args.families and target_name not in args.families:
            continue
        for offset in args.offsets:
            draft_name = names[(i + offset) % len(names)]
            try:
                found = check_pair(target_name, draft_name, seed=i + 3, max_new_tokens=args.max_new_tokens)
            except Exception:  # a crash is a finding too: report it and go on
                traceback.print_exc()
                found = [("crashed", "", "", "")]
            fails += [(target_name, draft_name) + f for f in found]
            print(f"{target_name} <- {draft_name}: {len(found)} failures ({time.perf_counter() - start:.0f} s)",
                  flush=True)
    for f in fails:
        print("FAIL", f)
    print(f"{len(fails)} failures")
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
