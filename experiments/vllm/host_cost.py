"""`python -m experiments.vllm.host_cost`: what xvocab's vLLM proposer spends outside the draft's forwards, per proposed
token, at a short and a long context, side by side.

What: two requests, one with a `--short` (64) and one with a `--long` (4,096) token prompt of the served target's
ids (HumanEval prompts run together), each handed to its own xvocab.vllm.Proposer the way vLLM's V1 model runner
calls it (`propose(sampled, counts, token_ids_cpu)` from a caller holding `input_batch.req_ids`, so the proposer
tracks the request by id). Each step commits the next 1-3 ids of a real continuation (HumanEval's solutions) as
vLLM's sampled tokens, and the proposer drafts k = 4 with the real draft; the target itself never runs (vLLM's
verification is not the proposer's cost). Steps alternate between the two contexts in rotating order
(experiments.sidebyside). Per step the proposer's own seconds minus its draft forwards' (stats: propose_seconds -
draft_seconds) over the tokens it proposed is its host cost per proposed token; the request's first steps (its
view opened, its draft prompt prefilled) are reported apart from the steady state.

Target (issue 56): the steady-state cost at 4,096 within 1.5x of the cost at 64.

    .venv/bin/python -m experiments.vllm.host_cost --target qwen2.5-coder-1.5b --draft smollm2-135m \\
        --out results/vllm/host_cost
"""
from __future__ import annotations

import argparse
import json
import sys
import statistics
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import torch

from experiments import sidebyside


class Runner:
    """The part of vLLM's V1 model runner xvocab.vllm.requests.runner_batch reads: the caller of propose."""

    def __init__(self, proposer, req_id: str, width: int):
        self.drafter = proposer
        self.input_batch = SimpleNamespace(token_ids_cpu=np.zeros((1, width), dtype=np.int32), req_ids=[req_id])

    def propose_draft_token_ids(self, scheduler_output, sampled, counts):
        return self.drafter.propose(sampled, counts, self.input_batch.token_ids_cpu)


def config(target_dir: Path, draft: str, k: int, max_model_len: int, dtype: str):
    """A VllmConfig stand-in with what xvocab.vllm.Proposer reads (tests/test_vllm_proposer.py builds the same)."""
    from transformers import AutoConfig

    vocab = AutoConfig.from_pretrained(target_dir).vocab_size
    spec = SimpleNamespace(method="custom_class", model="xvocab.vllm.Proposer", num_speculative_tokens=k,
                           rejection_sample_method="standard", synthetic_acceptance_rates=None,
                           synthetic_acceptance_length=None)
    model = SimpleNamespace(tokenizer=str(target_dir), max_model_len=max_model_len, dtype=getattr(torch, dtype),
                            get_vocab_size=lambda: vocab)
    return SimpleNamespace(speculative_config=spec, model_config=model, device_config=SimpleNamespace(device="cpu"),
                           additional_config={"xvocab": {"draft": draft, "load_policy": "off"}},
                           scheduler_config=SimpleNamespace(max_num_seqs=1))


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", default="qwen2.5-coder-1.5b")
    parser.add_argument("--draft", default="smollm2-135m")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--short", type=int, default=64)
    parser.add_argument("--long", type=int, default=4096)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--warm", type=int, default=5, help="first steps of each request reported apart")
    parser.add_argument("--out", type=Path, default=Path("runs/vllm_host_cost"))
    args = parser.parse_args(argv)

    from experiments.datasets import load
    from xvocab import zoo
    from xvocab.measure.records import environment
    from xvocab.vllm import Proposer
    from xvocab.zoo.serving import serving_dir

    torch.set_num_threads(max(1, torch.get_num_threads()))
    target_dir = serving_dir(args.target)
    tt = zoo.tokenizer(args.target)
    rows = load("humaneval", None)
    context = [i for r in rows for i in tt.encode(r["prompt"], add_special_tokens=False)]
    solution = [i for r in rows for i in tt.encode(r.get("canonical_solution") or r["prompt"],
                                                   add_special_tokens=False)]
    lengths = {"short": args.short, "long": args.long}
    width = args.long + 4 * args.steps + 64
    runs = {}
    for name, n in lengths.items():
        proposer = Proposer(config(target_dir, args.draft, 4, width, args.dtype))
        runner = Runner(proposer, name, width)
        runner.input_batch.token_ids_cpu[0, :n] = context[:n]
        runs[name] = dict(proposer=proposer, runner=runner, n=n, fed=0, steps=[])
    rng = np.random.default_rng(0)
    commits = [int(c) for c in rng.integers(1, 4, size=args.steps)]
    for step in range(args.steps):
        for name in sidebyside.rotated(step, list(runs)):
            r = runs[name]
            new = solution[r["fed"]:r["fed"] + commits[step]]
            r["fed"] += len(new)
            r["runner"].input_batch.token_ids_cpu[0, r["n"]:r["n"] + len(new)] = new
            r["n"] += len(new)
            before = r["proposer"].stats()
            r["runner"].propose_draft_token_ids(None, [new], np.array([r["n"]], dtype=np.int32))
            after = r["proposer"].stats()
            host = (after["propose_seconds"] - before["propose_seconds"]) - (after["draft_seconds"]
                                                                             - before["draft_seconds"])
            r["steps"].append({"host_s": host, "proposed": after["proposed_tokens"] - before["proposed_tokens"],
                               "by_identity": after["by_identity"] - before["by_identity"]})
    given = sys.argv[1:] if argv is None else argv
    out = {**environment(), "command": " ".join(["python -m experiments.vllm.host_cost", *given]),
           "args": {k: str(v) for k, v in vars(args).items()}, "contexts": {}}
    for name, r in runs.items():
        steady = [s for s in r["steps"][args.warm:] if s["proposed"]]
        first = r["steps"][:args.warm]
        out["contexts"][name] = {
            "context_tokens": lengths[name],
            "steady_ms_per_proposed_token": 1e3 * sum(s["host_s"] for s in steady) / max(1, sum(s["proposed"] for s in steady)),
            "steady_median_step_ms_per_token": 1e3 * statistics.median(s["host_s"] / s["proposed"] for s in steady),
            "first_steps_ms": [round(1e3 * s["host_s"], 3) for s in first],
            "slowest_steady_steps_ms": sorted((round(1e3 * s["host_s"], 3) for s in steady), reverse=True)[:5],
            "steps_by_identity": sum(s["by_identity"] for s in r["steps"]), "steps": len(r["steps"]),
            "proposed_tokens": sum(s["proposed"] for s in r["steps"])}
    short, long = (out["contexts"][n]["steady_ms_per_proposed_token"] for n in ("short", "long"))
    out["ratio_long_over_short"] = long / short
    args.out.mkdir(parents=True, exist_ok=True)
    tmp = args.out / "host_cost.json.tmp"
    tmp.write_text(json.dumps(out, indent=2))
    tmp.replace(args.out / "host_cost.json")
    for name, c in out["contexts"].items():
        print(f"{name:5} {c['context_tokens']:5} tokens: {c['steady_ms_per_proposed_token']:.3f} ms per proposed token "
              f"(median step {c['steady_median_step_ms_per_token']:.3f}); first steps {c['first_steps_ms']} ms; "
              f"by id {c['steps_by_identity']}/{c['steps']}")
    print(f"long / short: {out['ratio_long_over_short']:.2f}x  (target: <= 1.5x)  CPU: {out['cpu']}")


if __name__ == "__main__":
    main()
