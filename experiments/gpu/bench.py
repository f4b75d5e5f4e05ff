"""`python -m experiments.gpu.bench`: eager against graph-replayed decoding, per model shape and per pair.

Random weights at real shapes (a config is enough; the weights do not fit a GPU session's upload), so the
figures are costs, not acceptance. Every model is built once, directly on the device. In one process:

1. per shape: one decode step of 1 and of k + 1 tokens after `--context` cached tokens, eager through
   `xvocab.runtime.kv.Decoder` (DynamicCache, the reference) and replayed from CUDA graphs through
   `xvocab.runtime.batch_kv.BatchDecoder(graphs=True)` (every width captured first, its time reported apart); median ms
   of `--reps`, and the largest logit difference between the two (fp32 ~1e-5; bf16 a few ulps);
2. per pair (TARGET:DRAFT): tokens/s of `ar`, `slem`, `tli`, `slrs` with cache=dynamic and cache=graph on
   `--prompts` random prompts, the graph rows through one DecoderPool per pair (graphs captured once, before the
   timed calls, capture time apart), tau, c and v from part 1, the bound tau / (k c + v) and the efficiency
   (speedup over the same path's `ar` / bound); after every pair's rows, transformers' own `generate` as
   anchors, each warmed by the very call it then times (compile time reported apart): dynamic cache, static
   cache with a fixed `max_cache_len` without compiling and with its default compile, and assisted generation
   drafting exactly k tokens per round (`num_assistant_tokens=k`, constant schedule, no confidence stop, as
   xvocab drafts).

Every record is appended to OUT/records.jsonl the moment it exists and OUT/gpu_bench.md is rewritten after
each one, so a run cut short keeps what it measured. On a CPU (`--device cpu --small`, two-layer variants)
it runs the same code paths eagerly, to check the script before a GPU session:

    python -m experiments.gpu.bench --device cpu --small --tokens 8 --prompts 1 --reps 2 --out runs/gpu_bench_cpu
    python -m experiments.gpu.bench --out $OUT      # on the GPU: bf16, all shapes and both pairs (a few minutes)
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

import xvocab
from xvocab import algorithms, defaults, zoo
from xvocab.measure import records
from xvocab.runtime.batch_kv import BatchDecoder, DecoderPool
from xvocab.runtime.kv import Decoder

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
    """(model with random weights at the shape, its tokenizer), built directly on `device` (an 8B shape through
    the CPU's random generator would take minutes); `small`: two layers, for a CPU dry run."""
    from transformers import (
        AutoConfig,
        AutoModelForCausalLM,
        Gemma3ForCausalLM,
        Gemma3TextConfig,
        LlamaConfig,
        LlamaForCausalLM,
        Qwen2Config,
        Qwen2ForCausalLM,
    )

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
    devices = [torch.device(device)] if torch.device(device).type == "cuda" else []
    with torch.random.fork_rng(devices=devices), torch.device(device):
        torch.manual_seed(0)
        model = build(config, dtype=dtype)
    return model.eval(), tok


# Untimed calls before each median: the first H200 run's eager 1-token step, timed after two, read slower than
# its 5-token step (35.8 vs 25.3 ms on the Llama-3.1-8B shape).
WARMUP = 5


def _median_ms(call, reset, reps: int, device) -> tuple[float, torch.Tensor]:
    times = []
    for _ in range(reps + WARMUP):  # the first WARMUP are not timed
        sync(device)
        start = time.perf_counter()
        out = call()
        sync(device)
        times.append(time.perf_counter() - start)
        reset()
    return 1000 * statistics.median(times[WARMUP:]), out


@torch.inference_mode()
def step_costs(model, *, k: int, context: int, reps: int, device: str) -> dict:
    """Median ms of 1- and (k+1)-token steps, eager (Decoder) and graph-replayed (BatchDecoder, every width
    captured before timing: `capture_s`), and the largest logit difference between the two on the same inputs."""
    gen = torch.Generator().manual_seed(0)
    vocab = model.get_input_embeddings().weight.shape[0]
    prefix = torch.randint(vocab, (context,), generator=gen).tolist()
    extra = torch.randint(vocab, (k,), generator=gen).tolist()
    eager, graph = Decoder(model), BatchDecoder(model, 1, context + 64, graphs=True)
    eager.step(prefix[:-1])
    graph.step({0: (prefix[:-1], [])})
    sync(device)
    start = time.perf_counter()
    graph.capture_all()
    sync(device)
    out = {"capture_s": time.perf_counter() - start}
    for n in (1, k + 1):
        ask = (prefix, extra[:n - 1])
        ms_e, logits_e = _median_ms(lambda: eager.step(*ask), lambda: eager.crop(context - 1), reps, device)
        ms_g, logits_g = _median_ms(lambda: graph.step({0: ask})[0], lambda: graph.ids.__setitem__(0, prefix[:-1]),
                                    reps, device)
        out |= {f"eager_{n}_ms": ms_e, f"graph_{n}_ms": ms_g,
                f"max_diff_{n}": float((logits_e.float() - logits_g.float()).abs().max())}
    return out


def _hf_generate(model, prompt_ids, tokens, **kw) -> tuple[float, int]:
    ids = torch.tensor([prompt_ids], device=model.device)
    sync(model.device)
    start = time.perf_counter()
    out = model.generate(ids, max_new_tokens=tokens, min_new_tokens=tokens, do_sample=False, **kw)
    sync(model.device)
    return time.perf_counter() - start, out.shape[1] - ids.shape[1]


def hf_anchors(target, tt, draft, dt, *, prompts: list[str], tokens: int, k: int):
    """Rows for transformers' generate: each setting warmed by the very call it then times (the first prompt,
    the same lengths: a static cache of one fixed `max_cache_len` never recompiles), warm-up seconds reported."""
    from xvocab.alignment.roles import prompt_ids

    ids = [prompt_ids(tt, p) for p in prompts]
    cache_len = max(map(len, ids)) + tokens + 8
    settings = (
        ("transformers generate (dynamic cache)", {}),
        ("transformers generate (static cache, no compile)",
         {"cache_implementation": "static", "max_cache_len": cache_len, "disable_compile": True}),
        ("transformers generate (static cache, compiled)", {"cache_implementation": "static", "max_cache_len": cache_len}),
        ("transformers assisted (k tokens, no confidence stop)",
         {"assistant_model": draft, "tokenizer": tt, "assistant_tokenizer": dt, "num_assistant_tokens": k,
          "num_assistant_tokens_schedule": "constant", "assistant_confidence_threshold": 0.0}),
    )
    for name, kw in settings:
        try:
            warm, _ = _hf_generate(target, ids[0], tokens, **kw)
            wall = n = 0
            for p in ids:
                w, m = _hf_generate(target, p, tokens, **kw)
                wall, n = wall + w, n + m
            yield {"method": name, "cache": "", "tokens": n, "tokens_per_s": n / wall, "tau": None, "warmup_s": warm}
        except Exception as err:  # an anchor that cannot run here is reported, not fatal
            yield {"method": name, "cache": "", "error": f"{type(err).__name__}: {err}"[:200]}


def pair_speeds(target, tt, draft, dt, *, prompts: list[str], tokens: int, k: int, device: str):
    """tokens/s and tau of every algorithm on both paths (one row at a time, as each is measured); the graph rows
    through one DecoderPool, every width captured before the timed calls (`capture_s`)."""
    pool = DecoderPool()
    for cache in ("dynamic", "graph"):
        for alg in ("ar",) + algorithms.names(cross_vocabulary=True):  # the baseline, then every cross-vocabulary one
            kw = dict(target=target, target_tokenizer=tt, algorithm=alg, k=k, max_new_tokens=tokens, cache=cache)
            if algorithms.get(alg).uses_draft:
                kw.update(draft=draft, draft_tokenizer=dt)
            if cache == "graph":
                kw["decoders"] = pool
            sync(device)
            start = time.perf_counter()
            # Warm-up on the longest prompt: the pool's decoders are then sized for every timed call (a later,
            # longer prompt would grow them, and growing recaptures the graphs inside the timed region).
            xvocab.generate(max(prompts, key=lambda p: len(tt.encode(p, add_special_tokens=False))), **kw)
            capture = 0.0
            if cache == "graph":
                begin = time.perf_counter()
                for dec in pool._kept.values():
                    dec.capture_all()
                sync(device)
                capture = time.perf_counter() - begin
            warm = time.perf_counter() - start
            sync(device)
            start, n, forwards = time.perf_counter(), 0, 0
            for p in prompts:
                out = xvocab.generate(p, **kw)
                n, forwards = n + len(out.token_ids), forwards + out.stats.target_forwards
            sync(device)
            wall = time.perf_counter() - start
            yield {"method": f"xvocab {alg}", "cache": cache, "tokens": n, "tokens_per_s": n / wall,
                   "tau": n / forwards, "warmup_s": warm, "capture_s": capture}


class Report:
    """The markdown tables, rewritten whole (atomically) after every row, beside the records appended as they come."""

    def __init__(self, out: Path, header: str):
        self.out, self.header, self.tables = out, header, {}

    def add(self, table: str, head: list[str], line: str) -> None:
        self.tables.setdefault(table, head)
        self.tables[table] = self.tables[table] + [line]
        print(line, flush=True)
        body = "\n\n".join("\n".join(lines) for lines in self.tables.values())
        records.write_atomic(self.out / "gpu_bench.md", self.header + body + "\n")


STEP_HEAD = ["| shape | eager 1 ms | eager k+1 ms | graph 1 ms | graph k+1 ms | max diff 1 | max diff k+1 | capture s |",
             "|---|---|---|---|---|---|---|---|"]


def _pair_line(r: dict, costs: dict, t_name: str, d_name: str, k: int, ar: dict) -> str:
    if "error" in r:
        return f"| {r['method']} | | failed: {r['error']} | | | | | | | |"
    if r["cache"] and not r["method"].endswith(" ar"):
        key = "eager" if r["cache"] == "dynamic" else "graph"
        ct, cd = costs[t_name], costs[d_name]
        c = cd[f"{key}_1_ms"] / ct[f"{key}_1_ms"]
        v = ct[f"{key}_{k + 1}_ms"] / ct[f"{key}_1_ms"]
        bound = r["tau"] / (k * c + v)
        speedup = r["tokens_per_s"] / ar[r["cache"]]
        return (f"| {r['method']} | {r['cache']} | {r['tokens_per_s']:.1f} | {r['tau']:.2f} | {c:.3f} | {v:.2f} | "
                f"{bound:.2f} | {speedup:.2f} | {speedup / bound:.2f} | {r['warmup_s']:.1f} |")
    base = ar.get(r["cache"]) or ar.get("graph")  # transformers' rows: against xvocab's graph ar
    tau = "" if r["tau"] is None else f"{r['tau']:.2f}"
    return (f"| {r['method']} | {r['cache']} | {r['tokens_per_s']:.1f} | {tau} | | | | {r['tokens_per_s'] / base:.2f} "
            f"| | {r['warmup_s']:.1f} |")


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(prog="python -m experiments.gpu.bench", description=__doc__,
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
    parser.add_argument("--no-anchors", action="store_true", help="skip transformers' generate rows")
    parser.add_argument("--out", default="runs/gpu_bench")
    args = parser.parse_args(argv)
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print("gpu_bench: no CUDA device here; run it on a GPU, or with --device cpu --small to check it", file=sys.stderr)
        raise SystemExit(2)
    dtype = getattr(torch, args.dtype)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    env = records.environment()
    command = " ".join(sys.argv[1:] if argv is None else argv)
    report = Report(out, f"# gpu_bench: {env['gpu'] or env['cpu']}\n\nCommand: python -m experiments.gpu.bench "
                         f"{command}\n\ntorch {env['torch']}, transformers {env['transformers']}, {args.dtype}\n\n")
    models, costs = {}, {}
    for name in dict.fromkeys(args.shapes + [s for p in args.pairs for s in p.split(":")]):
        start = time.perf_counter()
        models[name] = shaped(name, small=args.small, device=args.device, dtype=dtype)
        built = time.perf_counter() - start
        c = costs[name] = step_costs(models[name][0], k=args.k, context=args.context, reps=args.reps,
                                     device=args.device)
        records.append(out / "records.jsonl", {"part": "step", "shape": name, "build_s": built, **c, **vars(args), **env})
        n = args.k + 1
        report.add("steps", STEP_HEAD, f"| {name} | {c['eager_1_ms']:.2f} | {c[f'eager_{n}_ms']:.2f} | {c['graph_1_ms']:.2f} "
                   f"| {c[f'graph_{n}_ms']:.2f} | {c['max_diff_1']:.2g} | {c[f'max_diff_{n}']:.2g} | {c['capture_s']:.2f} |")
    # Every pair's xvocab rows first, transformers' anchors after (the compiled one alone can take a minute): a
    # session cut short by its time limit has still measured every pair (the first H200 session was cut after one).
    gen, pairs = torch.Generator().manual_seed(0), {}
    for pair in args.pairs:
        t_name, d_name = pair.split(":")
        tt = models[t_name][1]
        words = [tt.decode([i]) for i in torch.randint(1000, 20000, (args.prompts * 24,), generator=gen).tolist()]
        pairs[pair] = (t_name, d_name, ["".join(words[i * 24:(i + 1) * 24]) for i in range(args.prompts)], {})
    parts = [(pair, "xvocab") for pair in args.pairs] + ([] if args.no_anchors else [(p, "anchors") for p in args.pairs])
    for pair, part in parts:
        t_name, d_name, prompts, ar = pairs[pair]  # ar: {cache: xvocab ar's tokens/s}, filled by the xvocab part
        (target, tt), (draft, dt) = models[t_name], models[d_name]
        head = [f"{pair} ({args.dtype}, random weights, {args.tokens} tokens, k={args.k}, {args.prompts} prompts)\n",
                "| method | cache | tok/s | tau | c | v | bound tau/(kc+v) | speedup over ar | efficiency | warm-up s |",
                "|---|---|---|---|---|---|---|---|---|---|"]
        kw = dict(prompts=prompts, tokens=args.tokens, k=args.k)
        rows = (pair_speeds(target, tt, draft, dt, device=args.device, **kw) if part == "xvocab"
                else hf_anchors(target, tt, draft, dt, **kw))
        for r in rows:
            records.append(out / "records.jsonl", {"part": "pair", "pair": pair, **r, **vars(args), **env})
            if r["method"] == "xvocab ar":
                ar[r["cache"]] = r["tokens_per_s"]
            report.add(pair, head, _pair_line(r, costs, t_name, d_name, args.k, ar))
    return costs


if __name__ == "__main__":
    main()
