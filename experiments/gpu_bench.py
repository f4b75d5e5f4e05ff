"""`python -m experiments.gpu_bench`: eager against graph-replayed decoding, per model shape and per pair.

Random weights at real shapes (a config is enough; the weights do not fit a GPU session's upload), so the
figures are costs, not acceptance. In one process:

1. per shape: one decode step of 1 and of k + 1 tokens after `--context` cached tokens, eager through
   `xvocab.kv.Decoder` (DynamicCache, the reference) and replayed from CUDA graphs through
   `xvocab.batch_kv.BatchDecoder(graphs=True)`; median ms of `--reps`, and the largest logit difference
   between the two (fp32 should be ~1e-5; bf16 a few ulps);
2. per pair (TARGET:DRAFT): tokens/s of `ar`, `slem`, `tli`, `slrs` with cache=dynamic and cache=graph on
   `--prompts` random prompts, tau, c and v from part 1, the bound tau / (k c + v) and the efficiency
   (speedup over the same path's `ar` / bound), beside transformers' own `generate` (static cache, its
   default compile on CUDA) and assisted generation (`assistant_model=`, with both tokenizers) as anchors.

Prints markdown tables and writes OUT/gpu_bench.md and OUT/records.jsonl. On a CPU (`--device cpu --small`,
two-layer variants) it runs the same code paths eagerly, to check the script before a GPU session:

    python -m experiments.gpu_bench --device cpu --small --tokens 8 --prompts 1 --reps 2 --out runs/gpu_bench_cpu
    python -m experiments.gpu_bench --out $OUT      # on the GPU: bf16, all shapes and both pairs (a few minutes)
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

import xvocab
from xvocab import defaults, records, zoo
from xvocab.batch_kv import BatchDecoder
from xvocab.kv import Decoder

# shape -> (architecture, config fields, the zoo tokenizer of its vocabulary)
SHAPES = {
    "llama-3.1-8b": ("llama", dict(vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                                   num_attention_heads=32, num_key_value_heads=8, rope_theta=500000.0,
                                   max_position_embeddings=8192), "llama-bpe"),
    "qwen2.5-0.5b": ("qwen2", dict(vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                                   num_attention_heads=14, num_key_value_heads=2, tie_word_embeddings=True,
                                   max_position_embeddings=8192), "qwen2"),
    "gemma-3-270m": ("gemma3", dict(vocab_size=262144, hidden_size=640, intermediate_size=2048, num_hidden_layers=18,
                                    num_attention_heads=4, num_key_value_heads=1, head_dim=256, sliding_window=512,
                                    max_position_embeddings=8192), "gemma-4"),   # Gemma 3 and 4 share the 262k vocabulary
    "drafter": ("drafter", {}, None),
}
PAIRS = ("gemma-3-270m:drafter", "llama-3.1-8b:qwen2.5-0.5b")


def sync(device) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def shaped(name: str, *, small: bool, device: str, dtype: torch.dtype):
    """(model with random weights at the shape, its tokenizer); `small`: two layers, for a CPU dry run."""
    from transformers import (AutoConfig, AutoModelForCausalLM, Gemma3ForCausalLM, Gemma3TextConfig, LlamaConfig,
                              LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM)

    kind, fields, tok_name = SHAPES[name]
    if kind == "drafter":
        path = zoo.models.DRAFTERS_DIR / defaults.DRAFT
        config, tok = AutoConfig.from_pretrained(path), zoo.tokenizer(defaults.DRAFT)
        build = AutoModelForCausalLM.from_config
    else:
        fields = dict(fields, **({"num_hidden_layers": 2} if small else {}))
        config_cls, build = {"llama": (LlamaConfig, LlamaForCausalLM), "qwen2": (Qwen2Config, Qwen2ForCausalLM),
                             "gemma3": (Gemma3TextConfig, Gemma3ForCausalLM)}[kind]
        config, tok = config_cls(**fields), zoo.tokenizer(tok_name)
        build = build._from_config
    config.eos_token_id = tok.eos_token_id
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = build(config, dtype=dtype)
    return model.to(device).eval(), tok


@torch.inference_mode()
def step_costs(model, *, k: int, context: int, reps: int, device: str) -> dict:
    """Median ms of 1- and (k+1)-token steps, eager (Decoder) and graph-replayed (BatchDecoder), and the
    largest logit difference between the two paths on the same inputs."""
    gen = torch.Generator().manual_seed(0)
    vocab = model.get_input_embeddings().weight.shape[0]
    prefix = torch.randint(vocab, (context,), generator=gen).tolist()
    extra = torch.randint(vocab, (k,), generator=gen).tolist()
    out = {}
    eager, graph = Decoder(model), BatchDecoder(model, 1, context + 64, graphs=True)
    eager.step(prefix[:-1])
    graph.step({0: (prefix[:-1], [])})
    for n in (1, k + 1):
        ask = (prefix, extra[:n - 1])
        for name, call, back in (("eager", lambda: eager.step(*ask), lambda: eager.crop(context - 1)),
                                 ("graph", lambda: graph.step({0: ask})[0], lambda: graph.ids.__setitem__(0, prefix[:-1]))):
            times = []
            for _ in range(reps + 3):  # three untimed: warm-up and (graph) capture
                sync(device)
                start = time.perf_counter()
                logits = call()
                sync(device)
                times.append(time.perf_counter() - start)
                back()
            out[f"{name}_{n}_ms"] = 1000 * statistics.median(times[3:])
            out[f"{name}_{n}_logits"] = logits.float()
        out[f"max_diff_{n}"] = float((out.pop(f"eager_{n}_logits") - out.pop(f"graph_{n}_logits")).abs().max())
    return out


def _hf_generate(model, tok, prompt_ids, tokens, **kw) -> tuple[float, int]:
    ids = torch.tensor([prompt_ids], device=model.device)
    start = time.perf_counter()
    out = model.generate(ids, max_new_tokens=tokens, min_new_tokens=tokens, do_sample=False, **kw)
    sync(model.device)
    return time.perf_counter() - start, out.shape[1] - ids.shape[1]


def pair_speeds(target, tt, draft, dt, *, prompts: list[str], tokens: int, k: int, device: str) -> list[dict]:
    """tokens/s and tau of every algorithm on both paths, and of transformers' generate and assisted generation."""
    rows = []
    for cache in ("dynamic", "graph"):
        for alg in ("ar", "slem", "tli", "slrs"):
            kw = dict(target=target, target_tokenizer=tt, algorithm=alg, k=k, max_new_tokens=tokens, cache=cache)
            if alg != "ar":
                kw.update(draft=draft, draft_tokenizer=dt)
            xvocab.generate(prompts[0], **{**kw, "max_new_tokens": min(tokens, 8)})  # warm-up (and capture)
            sync(device)
            start, n, forwards = time.perf_counter(), 0, 0
            for p in prompts:
                out = xvocab.generate(p, **kw)
                n, forwards = n + len(out.token_ids), forwards + out.stats.target_forwards
            sync(device)
            wall = time.perf_counter() - start
            rows.append({"method": f"xvocab {alg}", "cache": cache, "tokens": n, "tokens_per_s": n / wall,
                         "tau": n / forwards})
    from xvocab.roles import prompt_ids

    for name, kw in (("transformers generate (static cache)", {"cache_implementation": "static"}),
                     ("transformers assisted", {"assistant_model": draft, "tokenizer": tt, "assistant_tokenizer": dt})):
        try:
            _hf_generate(target, tt, prompt_ids(tt, prompts[0]), min(tokens, 8), **kw)  # warm-up / compile
            wall = n = 0
            for p in prompts:
                w, m = _hf_generate(target, tt, prompt_ids(tt, p), tokens, **kw)
                wall, n = wall + w, n + m
            rows.append({"method": name, "cache": "", "tokens": n, "tokens_per_s": n / wall, "tau": None})
        except Exception as err:  # an anchor that cannot run here is reported, not fatal
            rows.append({"method": name, "cache": "", "error": f"{type(err).__name__}: {err}"[:200]})
    return rows


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(prog="python -m experiments.gpu_bench", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shapes", nargs="+", default=list(SHAPES), choices=list(SHAPES))
    parser.add_argument("--pairs", nargs="*", default=list(PAIRS))
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--small", action="store_true", help="two-layer variants (a CPU dry run)")
    parser.add_argument("--k", type=int, default=defaults.K)
    parser.add_argument("--context", type=int, default=256)
    parser.add_argument("--reps", type=int, default=30)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--prompts", type=int, default=3)
    parser.add_argument("--out", default="runs/gpu_bench")
    args = parser.parse_args(argv)
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print("gpu_bench: no CUDA device here; run it on a GPU, or with --device cpu --small to check it", file=sys.stderr)
        raise SystemExit(2)
    dtype = getattr(torch, args.dtype)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    env = records.environment()
    costs = {}
    lines = ["| shape | eager 1 ms | eager k+1 ms | graph 1 ms | graph k+1 ms | max diff 1 | max diff k+1 |",
             "|---|---|---|---|---|---|---|"]
    for name in dict.fromkeys(args.shapes + [s for p in args.pairs for s in p.split(":")]):
        model, _ = shaped(name, small=args.small, device=args.device, dtype=dtype)
        c = costs[name] = step_costs(model, k=args.k, context=args.context, reps=args.reps, device=args.device)
        records.append(out / "records.jsonl", {"part": "step", "shape": name, **c, **vars(args), **env})
        lines.append(f"| {name} | {c['eager_1_ms']:.2f} | {c[f'eager_{args.k + 1}_ms']:.2f} | {c['graph_1_ms']:.2f} | "
                     f"{c[f'graph_{args.k + 1}_ms']:.2f} | {c['max_diff_1']:.2g} | {c[f'max_diff_{args.k + 1}']:.2g} |")
        print(lines[-1], flush=True)
        del model
    tables = ["\n".join(lines)]
    gen = torch.Generator().manual_seed(0)
    for pair in args.pairs:
        t_name, d_name = pair.split(":")
        target, tt = shaped(t_name, small=args.small, device=args.device, dtype=dtype)
        draft, dt = shaped(d_name, small=args.small, device=args.device, dtype=dtype)
        words = [tt.decode([i]) for i in torch.randint(1000, 20000, (args.prompts * 24,), generator=gen).tolist()]
        prompts = ["".join(words[i * 24:(i + 1) * 24]) for i in range(args.prompts)]
        rows = pair_speeds(target, tt, draft, dt, prompts=prompts, tokens=args.tokens, k=args.k, device=args.device)
        lines = [f"\n{pair} ({args.dtype}, random weights, {args.tokens} tokens, k={args.k})\n",
                 "| method | cache | tok/s | tau | c | v | bound tau/(kc+v) | speedup over ar | efficiency |",
                 "|---|---|---|---|---|---|---|---|---|"]
        ar = {r["cache"]: r["tokens_per_s"] for r in rows if r["method"] == "xvocab ar"}
        for r in rows:
            records.append(out / "records.jsonl", {"part": "pair", "pair": pair, **r, **vars(args), **env})
            if "error" in r:
                lines.append(f"| {r['method']} | | failed: {r['error']} | | | | | | |")
                continue
            cost_key = "eager" if r["cache"] == "dynamic" else "graph"
            if r["cache"] and not r["method"].endswith(" ar"):
                ct, cd = costs[t_name], costs[d_name]
                c = cd[f"{cost_key}_1_ms"] / ct[f"{cost_key}_1_ms"]
                v = ct[f"{cost_key}_{args.k + 1}_ms"] / ct[f"{cost_key}_1_ms"]
                bound = r["tau"] / (args.k * c + v)
                speedup = r["tokens_per_s"] / ar[r["cache"]]
                lines.append(f"| {r['method']} | {r['cache']} | {r['tokens_per_s']:.1f} | {r['tau']:.2f} | {c:.3f} | "
                             f"{v:.2f} | {bound:.2f} | {speedup:.2f} | {speedup / bound:.2f} |")
            else:
                base = ar.get(r["cache"]) or ar.get("graph")  # transformers' rows: against xvocab's graph ar
                tau = "" if r["tau"] is None else f"{r['tau']:.2f}"
                lines.append(f"| {r['method']} | {r['cache']} | {r['tokens_per_s']:.1f} | {tau} | | | | "
                             f"{r['tokens_per_s'] / base:.2f} | |")
        tables.append("\n".join(lines))
        print(tables[-1], flush=True)
        del target, draft
    text = (f"# gpu_bench: {env['gpu'] or env['cpu']}\n\nCommand: python -m experiments.gpu_bench "
            f"{' '.join(sys.argv[1:] if argv is None else argv)}\n\n" + "\n".join(tables) + "\n")
    records.write_atomic(out / "gpu_bench.md", text)
    print(text)
    return costs


if __name__ == "__main__":
    main()
