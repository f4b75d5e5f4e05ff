"""`python -m experiments.checks.lossless_sweep [--families A B ...] [--offsets 1 7] [--sampling]`: losslessness over
many tokenizer pairs.

What: every zoo tokenizer family (or those named) as the target's, each paired with the families `offsets` places
after it in the list as the draft's. Each pair is checked with two tiny random drafts (`greedy_drafts`): the
target's mirror over the other vocabulary (xvocab.zoo.tiny.mirror_model: long accepted runs where the two tokenizers
cut text alike, but on most pairs they cut the prompt apart and it is almost never accepted), and a biased pair
(xvocab.zoo.tiny.biased_pair: accepted on every pair). For each, and each of the awkward prompts below, it checks,
token for token:
  - greedy slem, tli and slrs, with the draft's own tokenization and with the target-aligned one, equal `ar`;
  - coupled slem at T = 1 equals coupled `ar` (the same seed), with both encodings;
  - the batched loop (xvocab.generate_batch, 4 rows at a time over all the prompts) equals `ar` on every row.
With `--sampling` it checks distributions instead: the pair is xvocab.zoo.tiny.biased_pair (a target and a draft
that agree often whatever the segmentation, with most of the draft's mass outside the intersection), and slem, tli
and slrs each sample `--samples` sequences of 3 tokens (xvocab.checks.lossless) in both settings of
xvocab.checks.lossless.SETTINGS:
at T = 1 with top-k 3 through `generate` with the draft's own tokenization, at T = 0.7 with top-p 0.95 through
`generate_batch` with the aligned one. Each sample is tested against the target's exact law by the chi-square
test of the suite (tests/test_distributions.py, whose negative controls show it rejecting each algorithm's known
bugs); each test fails a lossless sampler with probability ALPHA = 1e-6, so the 252 of a whole sweep together
fail it with probability about 2.5e-4. Each pair's line gives the lowest p-value and the draft's mean tau per
algorithm (1 would mean no proposal was ever accepted and only the rejection path ran).
It prints one line per pair (with greedy slem's mean tau per draft, or the sampling summary) and every failure, and
exits 1 if any.

Why: the test suite checks 8 pairs on 3 prompts; a new tokenizer family, or text with scripts, emoji, tabs, CRLF
and long digit runs, is where a boundary bug would hide. The sweep is the wide net: about 35 minutes on one CPU
thread for all 42 pairs (greedy), about two hours with `--sampling` (split the families over processes with
`--families`; EXPERIMENTS.md, twenty-fifth session).
"""
from __future__ import annotations

import argparse
import sys
import time
import traceback

import torch

import xvocab
from xvocab import algorithms
from xvocab.checks.lossless import ALPHA, PROMPT, SETTINGS, TOKENS, exact_distribution, sampled_pvalue
from xvocab.decode.doors import generate
from xvocab.zoo.tiny import GREEDY_BIAS, biased_pair, mirror_model

# Scripts, emoji with modifiers, tabs and superscripts, CRLF and digit runs, combining-looking accents and curly
# quotes, one character, whitespace alone.
PROMPTS = ["  def f(x):\n\treturn x**2  # ½ ²", "日本語のテキスト、そして emoji 🤖👍🏽!", "\r\n\r\n  1234567890 ...",
           "Ünïcödé café naïve — “quotes” ‘x’", "a", "    \n\n\n    "]
MODEL_TOKENIZERS = ["gemma-3-270m", "smollm2-135m"]  # the zoo models' own tokenizers, beside the families


def greedy_drafts(target_tokenizer, draft_tokenizer, seed: int):
    """(name, target, draft) of the greedy checks: a tiny target with its mirror (long accepted runs where the two
    tokenizers cut text alike), and the biased pair (accepted on any pair, through text the target writes from a
    few dozen favoured ids: repeats and merges across token boundaries)."""
    target = xvocab.zoo.tiny_model(target_tokenizer, seed=seed)
    yield "mirror", target, mirror_model(target, target_tokenizer, draft_tokenizer)
    yield ("biased", *biased_pair(target_tokenizer, draft_tokenizer, seed=seed, **GREEDY_BIAS))


def check_pair(target_name: str, draft_name: str, *, seed: int, max_new_tokens: int) -> tuple[list[tuple], str]:
    """Every failure of one (target tokenizer, draft tokenizer) pair, as tuples naming what differed, and a summary:
    the mean tau of greedy slem per draft (1 would mean no proposal was ever accepted)."""
    tt, dt = xvocab.zoo.tokenizer(target_name), xvocab.zoo.tokenizer(draft_name)
    fails, summary = [], []
    for kind, target, draft in greedy_drafts(tt, dt, seed):
        both = dict(target=target, target_tokenizer=tt, max_new_tokens=max_new_tokens)
        pair = both | dict(draft=draft, draft_tokenizer=dt, k=4)
        refs, taus = [], []
        for prompt in PROMPTS:
            ref = generate(prompt, algorithm="ar", **both).token_ids
            refs.append(ref)
            for alg in algorithms.names(cross_vocabulary=True):  # read when the sweep runs: plugins included
                for enc in ("native", "aligned"):
                    out = generate(prompt, algorithm=alg, draft_encoding=enc, **pair)
                    taus += [out.stats.tau] if alg == "slem" else []
                    if out.token_ids != ref:
                        fails.append((alg, enc, "T=0", kind, prompt))
            coupled = dict(temperature=1.0, coupling="gumbel", seed=11)
            cref = generate(prompt, algorithm="ar", **both, **coupled).token_ids
            for enc in ("native", "aligned"):
                if generate(prompt, algorithm="slem", draft_encoding=enc, **pair, **coupled).token_ids != cref:
                    fails.append(("coupled slem", enc, "T=1", kind, prompt))
        for alg in algorithms.names(cross_vocabulary=True):
            outs = xvocab.generate_batch(PROMPTS, algorithm=alg, batch_size=4, **pair)
            fails += [(alg, "batched", "T=0", kind, PROMPTS[i]) for i, o in enumerate(outs) if o.token_ids != refs[i]]
        summary.append(f"{kind} slem tau {sum(taus) / len(taus):.2f}")
    return fails, ", ".join(summary)


# (setting, draft encoding, rows per generate_batch call: 0 = one generate call per sample)
SAMPLING_RUNS = [("T1-top_k3", "native", 0), ("T0.7-top_p0.95", "aligned", 50)]
SAMPLING_ALGORITHMS = None  # None: every cross-vocabulary algorithm registered when the sweep runs


def check_pair_sampling(target_name: str, draft_name: str, *, seed: int, samples: int) -> tuple[list[tuple], str]:
    """Every failure of one pair's distribution checks, and a summary: the lowest p-value and mean tau per
    algorithm."""
    tt, dt = xvocab.zoo.tokenizer(target_name), xvocab.zoo.tokenizer(draft_name)
    target, draft = biased_pair(tt, dt, seed=seed)
    # The target's exact law per setting, enumerated once for all three algorithms.
    exact = {setting: exact_distribution(target, tt, PROMPT, SETTINGS[setting], TOKENS)
             for setting, _, _ in SAMPLING_RUNS}
    fails, summary = [], []
    for alg in SAMPLING_ALGORITHMS or algorithms.names(cross_vocabulary=True):
        pvalues, taus = [], []
        for setting, encoding, batch in SAMPLING_RUNS:
            p = sampled_pvalue((target, tt, draft, dt), alg, SETTINGS[setting], n=samples, batch=batch,
                               draft_encoding=encoding, taus=taus, exact=exact[setting])
            pvalues.append(p)
            if p <= ALPHA:
                fails.append((alg, encoding + (" batched" if batch else ""), setting, f"p={p:.2g}"))
        summary.append(f"{alg} p>={min(pvalues):.2g} tau {sum(taus) / len(taus):.2f}")
    return fails, ", ".join(summary)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m experiments.checks.lossless_sweep", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--families", nargs="+", default=None, help="target families to check (default: all)")
    parser.add_argument("--offsets", type=int, nargs="+", default=[1, 7],
                        help="each target's drafts: the families this many places later in the list")
    parser.add_argument("--max-new-tokens", type=int, default=20)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--sampling", action="store_true",
                        help="check sampled distributions (xvocab.checks.lossless) instead of greedy and "
                             "coupled outputs")
    parser.add_argument("--samples", type=int, default=xvocab.checks.lossless.N, help="sequences per distribution test")
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
            summary = ""
            try:
                if args.sampling:
                    found, summary = check_pair_sampling(target_name, draft_name, seed=i + 3, samples=args.samples)
                else:
                    found, summary = check_pair(target_name, draft_name, seed=i + 3, max_new_tokens=args.max_new_tokens)
                summary = f"; {summary}"
            except Exception:  # a crash is a finding too: report it and go on
                traceback.print_exc()
                found = [("crashed", "", "", "")]
            fails += [(target_name, draft_name) + f for f in found]
            print(f"{target_name} <- {draft_name}: {len(found)} failures{summary} "
                  f"({time.perf_counter() - start:.0f} s)", flush=True)
    for f in fails:
        print("FAIL", f)
    print(f"{len(fails)} failures")
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
