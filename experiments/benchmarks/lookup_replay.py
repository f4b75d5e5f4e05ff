"""`python -m experiments.benchmarks.lookup_replay DIR [DIR ...]`: what rules of context lookup would accept on a
target's own greedy text, replayed without the target.

Why: whether a suffix tree (longer matches, the most frequent continuation, earlier requests' outputs) would pay
over xvocab's prompt lookup is a question about the text alone. A greedy row is the target's own continuation
(lossless), and a lookup proposal is a function of the committed ids, so replaying a rule over a recorded row gives
the exact rounds a real run with that rule would take: each round proposes from the prompt and the ids emitted so
far, keeps the longest prefix equal to the recorded continuation, and emits one id more (the target's own).

Rules, each proposing at most k ids:
- `lookup`: xvocab's rule (`xvocab.algorithms.lookup.find_match`: the latest earlier occurrence of the longest
  recurring suffix of 2-4 ids; vLLM's `ngram` proposes the same way);
- `longest`: the earlier occurrence sharing the longest suffix with the context (up to MAX_MATCH ids, at least 2;
  the latest among equals), as a suffix tree finds it;
- `frequent`: the occurrences of that longest suffix, then the most frequent next id among them, id by id, while it
  holds at least MIN_SHARE of them (suffix decoding's walk, as arctic-inference and vLLM's `suffix` do it);
- `frequent+outputs`: the same over the context and the outputs of the requests before it in DIR (suffix decoding's
  tree of earlier responses).

Reads DIR/records.jsonl written by `experiments.vllm.bench` (its `ar` rows: `prompt`, `token_ids`, and the target
and dataset in `settings`), rebuilding each prompt's ids from the dataset and the target's tokenizer. Prints per DIR
and rule: tau (emitted ids per target forward, over every round: the bench's tau of vLLM's `ngram` and `suffix`,
ids per engine step, printed where DIR holds them; theirs are means over prompts, these pooled) and tau per
proposing round (1 + accepted ids per round that proposed: vLLM's "mean acceptance length").

    python -m experiments.benchmarks.lookup_replay \
        results/vllm/lookup_bf16_2026-12-07/{code_edit,prose_summary,humaneval}
"""
from __future__ import annotations

import argparse
from collections import Counter
from pathlib import Path

from experiments import datasets
from xvocab import zoo
from xvocab.algorithms.lookup import find_match
from xvocab.alignment.roles import prompt_ids
from xvocab.errors import ConfigError
from xvocab.measure import records

MAX_MATCH = 32   # the longest suffix a suffix tree is searched for here (ids)
MIN_MATCH = 2    # as xvocab's lookup: a single id recurs too often to pay
MIN_SHARE = 0.1  # the frequent walk stops where its next id holds less of the occurrences (arctic's min_token_prob)


def match_lengths(texts: list[list[int]], ids: list[int]) -> list[tuple[int, list[int], int]]:
    """(m, text, a) for every position a of every text with an id after an earlier occurrence: m ids before a equal
    the last m of `ids` (at most MAX_MATCH; in `ids` itself only occurrences ending before its last id)."""
    out = []
    for text in texts:
        for a in range(1, len(text) if text is ids else len(text) + 1):
            m = 0
            while m < MAX_MATCH and m < a and text[a - 1 - m] == ids[len(ids) - 1 - m]:
                m += 1
            if m:
                out.append((m, text, a))
    return out


def longest(ids: list[int], k: int, earlier: list[list[int]]) -> list[int]:
    """The run after the earlier occurrence sharing the longest suffix with `ids` (the latest among equals)."""
    best = max(match_lengths([ids], ids), key=lambda x: (x[0], x[2]), default=(0, ids, 0))
    return list(ids[best[2]:best[2] + k]) if best[0] >= MIN_MATCH else []


def frequent(ids: list[int], k: int, earlier: list[list[int]]) -> list[int]:
    """Suffix decoding's walk from the longest matched suffix over `ids` and the `earlier` outputs (module
    docstring)."""
    found = match_lengths([ids, *earlier], ids)
    m = max((x[0] for x in found), default=0)
    if m < MIN_MATCH:
        return []
    at = [(text, a) for n, text, a in found if n == m]
    run: list[int] = []
    while len(run) < k and at:
        counts = Counter(text[a] for text, a in at if a < len(text))
        if not counts:
            break
        nxt, c = counts.most_common(1)[0]
        if c < MIN_SHARE * len(at):
            break
        run.append(nxt)
        at = [(text, a + 1) for text, a in at if a < len(text) and text[a] == nxt]
    return run


RULES = {
    "lookup": lambda ids, k, earlier: find_match(ids, k)[1],
    "longest": longest,
    "frequent": lambda ids, k, earlier: frequent(ids, k, []),
    "frequent+outputs": frequent,
}


def replay(rule, prompt: list[int], out: list[int], k: int, earlier: list[list[int]]) -> tuple[int, int, int]:
    """(target forwards, rounds that proposed, ids accepted) of decoding `out` after `prompt` with `rule`."""
    i = forwards = proposing = accepted = 0
    while i < len(out):
        run = rule(prompt + out[:i], k, earlier)
        a = 0
        while a < len(run) and i + a < len(out) and run[a] == out[i + a]:
            a += 1
        i, forwards, proposing, accepted = i + a + 1, forwards + 1, proposing + bool(run), accepted + a
    return forwards, proposing, accepted


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("dirs", nargs="+", type=Path)
    ap.add_argument("--k", type=int, nargs="+", default=[4])
    args = ap.parse_args(argv)
    for d in args.dirs:
        rows = records.read(d / "records.jsonl")
        ar = [r for r in rows if r.get("variant") == "ar" and not r.get("failed") and "token_ids" in r]
        if not ar or "target" not in ar[0].get("settings", {}):
            raise ConfigError(f"{d}/records.jsonl has no `ar` rows of experiments.vllm.bench (`settings` naming the "
                              f"target); point at a folder that `python -m experiments.vllm.bench` wrote")
        settings = {"dataset": "humaneval"} | ar[0]["settings"]  # (the bench's default, before it was recorded)
        tokenizer = zoo.tokenizer(settings["target"])
        text = {r["id"]: r["prompt"] for r in datasets.load(settings["dataset"], None)}
        outs = {}
        for r in ar:
            outs.setdefault(r["prompt"], r["token_ids"])  # (prompt order as recorded: earlier outputs before later)
        prompts = {p: prompt_ids(tokenizer, text[p]) for p in outs}
        tokens = sum(map(len, outs.values()))
        print(f"\n{d} ({settings['dataset']}, {len(outs)} prompts, {tokens} ids)\n")
        print("| rule | k | tau | tau per proposing round | rounds proposing |\n|---|---|---|---|---|")
        for name, rule in RULES.items():
            for k in args.k:
                forwards = proposing = accepted = 0
                for n, (p, out) in enumerate(outs.items()):
                    f, q, a = replay(rule, prompts[p], out, k, list(outs.values())[:n])
                    forwards, proposing, accepted = forwards + f, proposing + q, accepted + a
                print(f"| {name} | {k} | {tokens / forwards:.2f} | {1 + accepted / max(proposing, 1):.2f} | "
                      f"{proposing} of {forwards} |")
        for variant in ("ngram", "suffix"):
            taus = [r["tau"] for r in rows if r.get("variant") == variant and r.get("tau")]
            if taus:
                print(f"\nvLLM's `{variant}` measured: tau {sum(taus) / len(taus):.2f} (ids per engine step, the mean "
                      f"over {len(taus)} prompts)")


if __name__ == "__main__":
    main()
