"""`python -m experiments.vllm.draft_speed`: what one draft forward costs on the kernels xvocab's vLLM proposer can
use, side by side. Run it with the vLLM environment's Python (make vllm-setup), LD_PRELOAD as vLLM runs.

What: for each draft, two copies of the model held at once, one on torch's stock layers (float32 on
xvocab.runtime.packed_linear) and one on vLLM's CPU GEMM kernels (xvocab.vllm.kernels, bfloat16/float16 only), each in
an xvocab BatchDecoder as the proposer runs it (one row, the cache spanning the context). Each copy reads the same
HumanEval prompt and then decodes greedily one token per forward; rounds rotate which copy goes first
(experiments.sidebyside), so a machine that drifts moves both alike. Prints and writes (OUT/draft_speed.md and .jsonl, atomically) the median
milliseconds per one-token forward per kernel and their ratio, with the CPU.

Why: the draft's forward bounds the proposer's speedup (xvocab.vllm.kernels says by how much); this is the number
to measure on a new machine before choosing `draft_kernels`, k or a smaller draft.

    LD_PRELOAD=.venv-vllm/lib/libiomp5.so .venv-vllm/bin/python -m experiments.vllm.draft_speed \\
        --drafts smollm2-135m gemma-3-270m --dtype bfloat16 --out results/vllm/draft_speed
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

from experiments import sidebyside


def _decoders(name: str, dtype: str) -> dict:
    """{kernel: (BatchDecoder, tokenizer)} for the kernels that apply to `dtype` here."""
    from xvocab import zoo
    from xvocab.runtime.batch_kv import BatchDecoder
    from xvocab.vllm.kernels import NotAvailable, use_vllm_linears

    out = {}
    model, tok = zoo.model(name, dtype=dtype, device="cpu")
    out["torch"] = (BatchDecoder(model, 1, capacity=512), tok)
    other, _ = zoo.model(name, dtype=dtype, device="cpu")
    try:
        use_vllm_linears(other)
        out["vllm"] = (BatchDecoder(other, 1, capacity=512), tok)
    except NotAvailable as err:
        print(f"{name} {dtype}: vLLM's kernels do not apply ({err})")
    return out


def _forwards(decoder, ids: list[int], n: int) -> tuple[list[float], list[int]]:
    """Seconds of each of n one-token greedy forwards after reading `ids`, and the ids it chose."""
    decoder.drop(0)
    decoder.step({0: (ids, [])})
    seq, seconds = list(ids), []
    for _ in range(n):
        start = time.perf_counter()
        logits = decoder.step({0: (seq, [])})[0]
        seq.append(int(logits[-1].argmax()))
        seconds.append(time.perf_counter() - start)
    return seconds, seq[len(ids):]


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--drafts", nargs="+", default=["smollm2-135m", "gemma-3-270m"])
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--tokens", type=int, default=32, help="one-token forwards timed per round and kernel")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, default=Path("runs/vllm_draft_speed"))
    args = parser.parse_args(argv)
    run(args)


def run(args) -> list[dict]:
    import torch

    from xvocab import zoo
    from xvocab.measure import records

    torch.set_num_threads(args.threads)
    prompts = [p["prompt"] for p in zoo.dataset("humaneval")[: args.rounds]]
    rows, env = [], records.environment()
    lines = [f"Draft forward, one row, {args.dtype}, {args.threads} threads, {env['cpu']}", "",
             "| draft | torch ms | vLLM kernels ms | ratio (torch / vLLM) | same greedy tokens |", "|---|---|---|---|---|"]
    for name in args.drafts:
        decoders = _decoders(name, args.dtype)
        seconds = {kernel: [] for kernel in decoders}
        same = 0
        for r, prompt in enumerate(prompts):
            order = sidebyside.rotated(r, list(decoders))
            chosen = {}
            for kernel in order:
                dec, tok = decoders[kernel]
                took, chosen[kernel] = _forwards(dec, tok(prompt)["input_ids"], args.tokens)
                seconds[kernel] += took
            same += len(set(map(tuple, chosen.values()))) == 1
        ms = {kernel: 1e3 * statistics.median(s) for kernel, s in seconds.items()}
        row = dict(draft=name, dtype=args.dtype, threads=args.threads, ms=ms, rounds=len(prompts),
                   tokens=args.tokens, same_tokens_rounds=same)
        rows.append(row)
        vllm_ms = ms.get("vllm")
        fast = ("—", "—") if vllm_ms is None else (f"{vllm_ms:.1f}", f"{ms['torch'] / vllm_ms:.2f}x")
        lines.append(f"| {name} | {ms['torch']:.1f} | {fast[0]} | {fast[1]} | {same} of {len(prompts)} |")
        del decoders
    text = "\n".join(lines)
    print(text)
    args.out.mkdir(parents=True, exist_ok=True)
    records.write_atomic(args.out / "draft_speed.md", text + "\n")
    records.write_atomic(args.out / "draft_speed.jsonl",
                         "".join(json.dumps(row | env | {"args": vars(args) | {"out": str(args.out)}}) + "\n"
                                 for row in rows))
    return rows


if __name__ == "__main__":
    main()
