"""`python -m experiments.vllm.vocab`: vLLM's token-level intersection (normalized token strings) against xvocab's
(exact bytes), measured on zoo pairs with vLLM's own VocabMapping. Run it with the vLLM environment's Python.

What: for each (target, draft) pair, vLLM's `VocabMapping` (vllm/v1/spec_decode/vocab_mapping.py: a token's string
with its leading space marker, `Ġ` or `▁`, read as a space; strings compared as they are otherwise) and xvocab's
`intersection` (xvocab.alignment.intersection: the bytes each token spells, specials apart) are built over the same
two tokenizers; every draft id is then counted by what the two maps say of it:
  both_same                 both map it, to the same target id
  exact_only                only xvocab maps it: the same bytes under different strings (a newline is `Ċ` in
                            byte-level BPE and `<0x0A>` in SentencePiece): TLI can never propose it in vLLM, and
                            vLLM's draft reads UNK where the target wrote it
  vllm_wrong_bytes          vLLM maps it to a target token spelling other bytes (equal strings, different bytes: a
                            byte-level BPE `¡` is the byte 0xA1, a SentencePiece `¡` is U+00A1): a proposal the target
                            can accept only by chance, and, target -> draft, a context token the draft misreads
  vllm_same_bytes_other_id  vLLM maps it to another target id with the same bytes (a duplicate spelling)
  vllm_special              vLLM maps it where either side is a special token (`<s>`, `<unk>`, chat markers)
Writes `<out>/vocab.json` and `<out>/vocab.md`.

    .venv-vllm/bin/python -m experiments.vllm.vocab --out results/vllm/vocab
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

PAIRS = [("qwen2.5-coder-1.5b", "smollm2-135m"), ("qwen2.5-coder-1.5b", "gemma-3-270m"),
         ("qwen2.5-coder-1.5b", "deepseek-coder"), ("gemma-3-270m", "smollm2-135m"), ("llama-spm", "gpt-2"),
         ("mistral-v1", "qwen2"), ("phi-3", "llama-bpe"), ("llama-spm", "mistral-v1")]


def compare(target_name: str, draft_name: str) -> dict:
    """The counts of the module docstring for one pair."""
    from vllm.v1.spec_decode.vocab_mapping import VocabMapping

    from xvocab import zoo
    from xvocab.alignment.intersection import NO_TOKEN, intersection
    from xvocab.alignment.tokens import codec

    tt, dt = zoo.tokenizer(target_name), zoo.tokenizer(draft_name)
    t_bytes, d_bytes = codec(tt).token_bytes, codec(dt).token_bytes
    exact = intersection(tt, dt).draft_to_target.tolist()
    theirs = VocabMapping(tt, dt, len(tt), len(dt), "cpu").draft_to_target_ids.tolist()
    counts = dict(both_same=0, exact_only=0, vllm_wrong_bytes=0, vllm_same_bytes_other_id=0, vllm_special=0)
    examples: dict[str, list] = {key: [] for key in counts}
    for d in range(len(dt)):
        mine = exact[d] if d < len(exact) and exact[d] != NO_TOKEN and d_bytes[d] is not None else None
        vllm_t = theirs[d] if d < len(theirs) and theirs[d] >= 0 else None
        special = vllm_t is not None and (d_bytes[d] is None or vllm_t >= len(t_bytes) or t_bytes[vllm_t] is None)
        if vllm_t is not None and vllm_t == mine:
            key = "both_same"
        elif vllm_t is not None and special:
            key = "vllm_special"
        elif vllm_t is not None and t_bytes[vllm_t] != d_bytes[d]:
            key = "vllm_wrong_bytes"
        elif vllm_t is not None:
            key = "vllm_same_bytes_other_id"
        elif mine is not None:
            key = "exact_only"
        else:
            continue
        counts[key] += 1
        if len(examples[key]) < 4 and key != "both_same":
            t = vllm_t if vllm_t is not None else mine
            examples[key].append({"draft": dt.convert_ids_to_tokens(d), "draft_bytes": repr(d_bytes[d]),
                                  "target": tt.convert_ids_to_tokens(t) if t is not None else None,
                                  "target_bytes": repr(t_bytes[t]) if t is not None and t < len(t_bytes) else None})
    exact_n = sum(1 for d in range(len(dt)) if d < len(exact) and exact[d] != NO_TOKEN and d_bytes[d] is not None)
    vllm_n = sum(1 for d in range(len(dt)) if d < len(theirs) and theirs[d] >= 0)
    return dict(target=target_name, draft=draft_name, draft_ids=len(dt), exact=exact_n, vllm=vllm_n, **counts,
                examples=examples)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pairs", nargs="*", help="TARGET:DRAFT zoo names (default: the module's PAIRS)")
    parser.add_argument("--out", default="runs/vllm_vocab")
    args = parser.parse_args(argv)
    from xvocab.measure import records

    pairs = [tuple(p.split(":", 1)) for p in args.pairs] if args.pairs else PAIRS
    rows = [compare(t, d) for t, d in pairs]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    env = records.environment()
    records.write_atomic(out / "vocab.json", json.dumps({"pairs": rows, **env}, indent=1, ensure_ascii=False) + "\n")
    lines = ["| target <- draft | draft ids | xvocab (exact bytes) | vLLM (strings) | same map | xvocab only | "
             "vLLM: other bytes | vLLM: same bytes, other id | vLLM: specials |", "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['target']} <- {r['draft']} | {r['draft_ids']:,} | {r['exact']:,} | {r['vllm']:,} | "
                     f"{r['both_same']:,} | {r['exact_only']:,} | {r['vllm_wrong_bytes']:,} | "
                     f"{r['vllm_same_bytes_other_id']:,} | {r['vllm_special']:,} |")
    text = "\n".join(lines) + "\n"
    records.write_atomic(out / "vocab.md", text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
