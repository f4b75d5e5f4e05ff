"""`python -m experiments.vllm.memory_check`: many long requests at once through vLLM with xvocab's proposer: no
out-of-memory, and the draft's cache within its budget. Run it with the vLLM environment's Python.

What: `--requests` (32) prompts of `--prompt-tokens` (2,048) target ids each (the prose stand-in's long documents,
cut), all submitted together to one vllm.LLM (max_num_seqs = requests) with xvocab's proposer, greedy,
`--max-tokens` new tokens each. A thread samples the resident memory of the process tree (the engine's workers
included) every half second. Writes OUT/memory_check.json atomically: peak RSS, the proposer's stats (its slab's
bytes against its budget, rows, positions, proposals skipped and why), vLLM's spec_decode acceptance, wall time,
the machine. Exit status 1 if the slab exceeds the budget or a request is missing.

    LD_PRELOAD=.venv-vllm/lib/libiomp5.so .venv-vllm/bin/python -m experiments.vllm.memory_check \\
        --out results/vllm/memory_check_2026-12-07
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from pathlib import Path


def _tree_rss(pid: int) -> int:
    import psutil

    try:
        root = psutil.Process(pid)
        return sum(p.memory_info().rss for p in [root, *root.children(recursive=True)])
    except psutil.Error:
        return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", default="qwen2.5-coder-1.5b")
    parser.add_argument("--draft", default="smollm2-135m")
    parser.add_argument("--requests", type=int, default=32)
    parser.add_argument("--prompt-tokens", type=int, default=2048)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--kv-gib", type=int, default=6)
    parser.add_argument("--load-policy", default="off")
    parser.add_argument("--out", default="runs/vllm_memory_check")
    args = parser.parse_args(argv)
    os.environ["VLLM_CPU_KVCACHE_SPACE"] = str(args.kv_gib)
    os.environ.setdefault("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")
    os.environ.setdefault("KMP_BLOCKTIME", "0")

    import vllm

    import xvocab.vllm
    from experiments.datasets import load
    from xvocab import zoo
    from xvocab.measure import records
    from xvocab.vllm.metrics import acceptance, spec_counts
    from xvocab.zoo.serving import serving_dir

    tt = zoo.tokenizer(args.target)
    text = " ".join(r["prompt"] for r in load("prose_qa", None))
    ids = tt.encode(text, add_special_tokens=False)
    need = args.requests * args.prompt_tokens
    ids = (ids * (need // len(ids) + 1))[:need]
    prompts = [{"prompt_token_ids": ids[i * args.prompt_tokens:(i + 1) * args.prompt_tokens]}
               for i in range(args.requests)]
    peak, stop = [0], threading.Event()

    def sample():
        while not stop.is_set():
            peak[0] = max(peak[0], _tree_rss(os.getpid()))
            time.sleep(0.5)

    threading.Thread(target=sample, daemon=True).start()
    start = time.perf_counter()
    llm = vllm.LLM(model=str(serving_dir(args.target)), dtype=args.dtype, enforce_eager=True, seed=0,
                   max_model_len=args.prompt_tokens + args.max_tokens + 16, max_num_seqs=args.requests,
                   disable_log_stats=False,
                   **xvocab.vllm.engine_args(draft=args.draft, algorithm="slem", load_policy=args.load_policy))
    ready = time.perf_counter() - start
    before = spec_counts(llm)
    t0 = time.perf_counter()
    outs = llm.generate(prompts, vllm.SamplingParams(temperature=0.0, max_tokens=args.max_tokens), use_tqdm=True)
    wall = time.perf_counter() - t0
    tokens = sum(len(o.outputs[0].token_ids) for o in outs)
    stats = llm.collective_rpc(xvocab.vllm.worker_stats)[0]
    rates = acceptance(before, spec_counts(llm), tokens)
    stop.set()
    keep = ("draft_memory_budget_bytes", "draft_cache_bytes", "draft_rows", "draft_positions_per_row",
            "draft_memory_derived", "skipped", "failures", "proposed_tokens", "accepted", "draft_prefill_tokens",
            "rows_in_use")
    result = {"command": " ".join(["python -m experiments.vllm.memory_check", *(sys.argv[1:] if argv is None
                                                                               else argv)]),
              "args": vars(args), "answered": len(outs), "output_tokens": tokens, "seconds_to_ready": round(ready, 1),
              "generate_seconds": round(wall, 1), "peak_rss_gib": round(peak[0] / 2**30, 2),
              "proposer": {k: stats.get(k) for k in keep}, "per_position": rates["per_position"],
              **records.environment()}
    ok = len(outs) == args.requests and stats["draft_cache_bytes"] <= stats["draft_memory_budget_bytes"]
    result["ok"] = ok
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    records.write_atomic(out / "memory_check.json", json.dumps(result, indent=1, default=str) + "\n")
    print(json.dumps({k: result[k] for k in ("answered", "output_tokens", "generate_seconds", "peak_rss_gib", "ok")}
                     | {"proposer": result["proposer"]}, default=str))
    llm.llm_engine.engine_core.shutdown()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
