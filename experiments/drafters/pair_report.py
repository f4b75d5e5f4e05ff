"""`python -m experiments.drafters.pair_report TARGET DRAFT` (or `--all`): how well two vocabularies align.

The first thing to run before choosing a pair. For each (target, draft):
* vocabulary sizes, and the byte-exact intersection (xvocab.alignment.intersection) as a
  share of each vocabulary: the ceiling on what TLI can propose;
* prefix share: how often a draft token's bytes start some target token (a draft
  token that starts no target token forces SLEM/SLRS to split it);
* target tokens per draft token after translation, on a fixed text sample (code,
  prose, CJK, whitespace runs): below 1 means the target's tokens are longer.
Names are zoo tokenizer or model names, hub ids or local directories. Output: a
Markdown table on stdout and, with --csv, a CSV file (written atomically).

`--cuts` measures instead, on HumanEval (prompt + canonical solution), how close the draft's
segmentation is to the target's (xvocab.alignment.aligned.cut_agreement): the share of target
tokens the draft vocabulary has, and the share of draft cuts that are target cuts, for the
draft's native and target-aligned encodings.
"""
from __future__ import annotations

import argparse
import csv
import io
import sys
import time
from dataclasses import asdict, dataclass
from functools import lru_cache
from pathlib import Path

from xvocab import zoo
from xvocab.alignment.intersection import intersection
from xvocab.alignment.tokens import codec
from xvocab.measure import records

SAMPLE = (
    'def fibonacci(n: int) -> int:\n    """Return the n-th Fibonacci number."""\n    if n < 2:\n        return n\n'
    "    return fibonacci(n - 1) + fibonacci(n - 2)\n\n\nclass Stack:\n\tdef push(self, x):\n\t\tself.items.append(x)\n"
    "The quick brown fox jumps over the lazy dog. In 2024, 3.5% of 1,234,567 readers wrote back!\n"
    "Les élèves étudient l'économie à Zürich; María y José leen «Cien años de soledad».\n"
    "机器学习是人工智能的一个分支。日本語のテキストも少し。한국어 문장도 있습니다.\n"
    "Emoji 😀🚀 and symbols ∑ ∫ √ ≠ → and    four spaces,\n\n\n three newlines, tabs\t\tend.\n"
)


@dataclass(frozen=True)
class PairRow:
    target: str
    draft: str
    target_vocab: int
    draft_vocab: int
    intersection: int
    share_of_target: float
    share_of_draft: float
    draft_starts_target: float
    target_per_draft_token: float


@lru_cache(maxsize=None)
def _prefixes(name: str) -> frozenset[bytes]:
    """Every non-empty prefix of every token of `name`."""
    out = set()
    for b in codec(zoo.tokenizer(name)).token_bytes:
        if b:
            out.update(b[:i] for i in range(1, len(b) + 1))
    return frozenset(out)


def pair_row(target: str, draft: str) -> PairRow:
    t_tok, d_tok = zoo.tokenizer(target), zoo.tokenizer(draft)
    size = intersection(t_tok, d_tok).size
    t_codec, d_codec = codec(t_tok), codec(d_tok)
    d_bytes = [b for b in d_codec.token_bytes if b]
    prefixes = _prefixes(target)
    starts = sum(b in prefixes for b in d_bytes) / len(d_bytes)
    n_target = len(t_codec.encode_exact(SAMPLE.encode()))
    n_draft = len(d_codec.encode_exact(SAMPLE.encode()))
    n_t, n_d = len(t_codec.token_bytes), len(d_codec.token_bytes)
    return PairRow(target, draft, n_t, n_d, size, size / n_t, size / n_d, starts, n_target / n_draft)


def to_markdown(rows: list[PairRow]) -> str:
    head = ("| target | draft | V target | V draft | intersection | % of target | % of draft | "
            "draft starts a target token | target tokens per draft token |")
    lines = [head, "|" + "---|" * 9]
    for r in rows:
        lines.append(f"| {r.target} | {r.draft} | {r.target_vocab:,} | {r.draft_vocab:,} | {r.intersection:,} | "
                     f"{100 * r.share_of_target:.1f} | {100 * r.share_of_draft:.1f} | "
                     f"{100 * r.draft_starts_target:.1f}% | {r.target_per_draft_token:.2f} |")
    return "\n".join(lines)


def write_csv(rows: list[PairRow], path: str) -> None:
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=list(asdict(rows[0])))
    writer.writeheader()
    writer.writerows(asdict(r) for r in rows)
    records.write_atomic(Path(path).absolute(), buf.getvalue())


def cuts_report(target: str, draft: str) -> dict:
    """Print and return cut_agreement of two named tokenizers on HumanEval prompts + canonical solutions."""
    from xvocab.alignment.aligned import ENCODINGS, cut_agreement

    texts = [r["prompt"] + r["canonical_solution"] for r in zoo.dataset("humaneval")]
    result = cut_agreement(zoo.tokenizer(target), zoo.tokenizer(draft), texts)
    print(f"{target} <- {draft} on {len(texts)} HumanEval prompts + solutions ({result['target_tokens']:,} target tokens)")
    print(f"target tokens the draft vocabulary has: {100 * result['target_in_intersection']:.1f}%")
    for enc in ENCODINGS:
        print(f"{enc:>7} draft encoding: {result[enc + '_draft_tokens']:,} tokens, "
              f"{100 * result[enc + '_cuts_on_target_cuts']:.1f}% of its cuts are target cuts")
    return result


def main(argv: list[str] | None = None) -> list[PairRow]:
    parser = argparse.ArgumentParser(prog="python -m experiments.drafters.pair_report", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("target", nargs="?")
    parser.add_argument("draft", nargs="?")
    parser.add_argument("--all", action="store_true", help="every ordered pair of zoo tokenizers and models")
    parser.add_argument("--csv", help="also write the rows to this CSV file")
    parser.add_argument("--cuts", action="store_true", help="segmentation agreement of TARGET and DRAFT on HumanEval")
    args = parser.parse_args(argv)
    if args.all == bool(args.target):
        parser.error("give TARGET and DRAFT, or --all")
    if args.target and not args.draft:
        parser.error("give both TARGET and DRAFT")
    if args.cuts:
        return [cuts_report(args.target, args.draft)]
    names = zoo.tokenizer_names() + zoo.model_names()
    pairs = [(t, d) for t in names for d in names if t != d] if args.all else [(args.target, args.draft)]
    start = time.perf_counter()
    rows = []
    for i, (t, d) in enumerate(pairs, 1):
        rows.append(pair_row(t, d))
        if args.all:
            print(f"\r{i}/{len(pairs)} pairs", end="", file=sys.stderr, flush=True)
    if args.all:
        print(f"\r{len(pairs)} pairs in {time.perf_counter() - start:.0f} s", file=sys.stderr)
    print(to_markdown(rows))
    if args.csv:
        write_csv(rows, args.csv)
    return rows


if __name__ == "__main__":
    main()
