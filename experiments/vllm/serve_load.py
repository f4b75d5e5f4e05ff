"""`python -m experiments.vllm.serve_load`: `vllm serve` under load, for vLLM alone, its own speculative methods and
xvocab's proposer, at several concurrencies. Run it with the vLLM environment's Python (make vllm-setup).

What: for each variant in turn (one server at a time: two 1.5B servers do not fit a 24 GiB machine with their KV
caches), starts vLLM's OpenAI-compatible server on 127.0.0.1, waits for /health, warms it (WARMUP requests, not
timed: the first requests of an engine pay its lazy initialisations), then for each concurrency c sends the same
prompts (HumanEval's and the prose stand-in's, interleaved) through a bounded asynchronous client: at most c
streaming /v1/completions requests in flight, a new one sent as one ends. Per request it records the time to
first token, the gaps between streamed chunks (vLLM streams a verified run of tokens as one chunk), the tokens
(usage) and the end-to-end seconds; per (variant, c) group the wall time, vLLM's spec_decode counters (/metrics)
and the proposer's own stats (its `stats_file`: draft memory, proposals skipped and why, the load policy's
choices). Records append to OUT/records.jsonl one line per request and one per group; a group already recorded
for the same settings is skipped, so a killed run resumes. The report (`--report OUT`, also at the end of a run)
writes OUT/report.md and OUT/load.png: output tokens/s, requests/s, TTFT and chunk-gap p50/p90/p99 per group,
acceptance per position, and each variant's throughput over vLLM's ar at the same concurrency.

Variants (as experiments.vllm.bench's): `ar`; vLLM's own methods (experiments.vllm.methods: `vllm-tli:DRAFT`, its
cross-vocabulary draft; `sd:DRAFT`, its draft_model with one vocabulary; `ngram`; `suffix`); xvocab's proposer with
any served algorithm (`slem:DRAFT`, `tli:DRAFT`, `lookup_slem:DRAFT`), options after commas
(`slem:smollm2-135m,load_policy=off`).

    LD_PRELOAD=.venv-vllm/lib/libiomp5.so .venv-vllm/bin/python -m experiments.vllm.serve_load \\
        --variants ar slem:smollm2-135m slem:smollm2-135m,load_policy=off vllm-tli:smollm2-135m \\
        --concurrency 1 2 4 8 16 --prompts 16 --out results/vllm/serve_load
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from experiments.vllm.methods import OWN, parse, speculative_config
from xvocab.vllm.settings import served

WARMUP = 2
STOP = ["\ndef ", "\nclass ", "\nif __name__", "\nprint("]  # HumanEval's (vLLM's API takes 4); prose: max_tokens


def server_command(spec: str, model_dir: str, args, stats_file: Path) -> list[str]:
    """The `vllm serve` command line for one variant (experiments.vllm.methods.parse reads it; its `k` option, else
    --k, is the draft length)."""
    kind, draft, options = parse(spec)
    k = options.pop("k", args.k)
    command = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", model_dir,
               "--port", str(args.port), "--host", "127.0.0.1", "--dtype", args.dtype, "--enforce-eager",
               "--max-model-len", str(args.max_model_len), "--max-num-seqs", str(max(args.concurrency)),
               "--seed", "0", "--disable-uvicorn-access-log"]
    if kind in served():
        command += ["--speculative-config", json.dumps({"method": "custom_class", "model": "xvocab.vllm.Proposer",
                                                        "num_speculative_tokens": k}),
                    "--additional-config", json.dumps({"xvocab": {"draft": draft, "algorithm": kind,
                                                                  "stats_file": str(stats_file), **options}})]
    elif kind in OWN:
        command += ["--speculative-config", json.dumps(speculative_config(kind, draft, k))]
    return command


def prompts(n: int) -> list[dict]:
    """n prompts, HumanEval's and prose's alternating ({id, prompt, set})."""
    from experiments.datasets import load

    code = [dict(r, set="humaneval") for r in load("humaneval", n)]
    prose = [dict(r, set="prose_summary") for r in load("prose_summary", n)]
    mixed = [x for pair in zip(code, prose) for x in pair]
    return mixed[:n]


async def one_request(session, url: str, model: str, row: dict, max_tokens: int) -> dict:
    body = {"model": model, "prompt": row["prompt"], "max_tokens": max_tokens, "temperature": 0.0, "stream": True,
            "stream_options": {"include_usage": True}}
    if row["set"] == "humaneval":
        body["stop"] = STOP
    start = time.perf_counter()
    chunks, tokens, text = [], 0, []
    async with session.post(url, json=body) as response:
        if response.status != 200:
            return {"id": row["id"], "error": f"HTTP {response.status}: {(await response.text())[:300]}"}
        async for raw in response.content:
            line = raw.decode().strip()
            if not line.startswith("data:") or line == "data: [DONE]":
                continue
            event = json.loads(line[5:])
            if event.get("usage"):
                tokens = event["usage"]["completion_tokens"]
            for choice in event.get("choices") or []:
                if choice.get("text"):
                    chunks.append(time.perf_counter() - start)
                    text.append(choice["text"])
    end = time.perf_counter() - start
    gaps = [b - a for a, b in zip(chunks, chunks[1:])]
    return {"id": row["id"], "set": row["set"], "ttft": chunks[0] if chunks else end, "e2e": end, "tokens": tokens,
            "chunks": len(chunks), "gaps": gaps, "text": "".join(text)}


async def drive(port: int, model: str, rows: list[dict], concurrency: int, max_tokens: int) -> tuple[list, float]:
    """Every row sent with at most `concurrency` in flight; (results in row order, wall seconds)."""
    import aiohttp

    url = f"http://127.0.0.1:{port}/v1/completions"
    gate = asyncio.Semaphore(concurrency)
    timeout = aiohttp.ClientTimeout(total=3600)

    async with aiohttp.ClientSession(timeout=timeout) as session:
        async def gated(row):
            async with gate:
                return await one_request(session, url, model, row, max_tokens)
        start = time.perf_counter()
        results = await asyncio.gather(*(gated(r) for r in rows))
        return list(results), time.perf_counter() - start


def spec_counters(port: int) -> dict:
    """vLLM's spec_decode counters from /metrics (the per-position one as a list)."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    out: dict = {"per_position": {}}
    for line in text.splitlines():
        if not line.startswith("vllm:spec_decode_num_"):
            continue
        name, value = line.split("{")[0].split(" ")[0], float(line.rsplit(" ", 1)[1])
        if "per_pos" in name:
            pos = int(line.split('position="')[1].split('"')[0])
            out["per_position"][pos] = out["per_position"].get(pos, 0.0) + value
        else:
            out[name.removeprefix("vllm:spec_decode_num_").removesuffix("_total")] = out.get(name, 0.0) + value
    return out


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    values = sorted(values)
    return values[min(len(values) - 1, int(round(q / 100 * (len(values) - 1))))]


def run(args) -> None:
    from experiments.vllm.serve_check import wait_healthy
    from xvocab.vllm.settings import STATS_EVERY
    from xvocab.measure import records
    from xvocab.zoo.serving import serving_dir

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / "records.jsonl"
    settings = dict(target=args.target, dtype=args.dtype, k=args.k, prompts=args.prompts, max_tokens=args.max_tokens,
                    max_model_len=args.max_model_len, kv_gib=args.kv_gib)
    done = {(r["variant"], r["concurrency"]) for r in records.read(path)
            if r.get("kind") == "group" and r["settings"] == settings} if path.exists() else set()
    rows = prompts(args.prompts)
    model_dir = str(serving_dir(args.target))
    env = os.environ | {"VLLM_CPU_KVCACHE_SPACE": str(args.kv_gib), "KMP_BLOCKTIME": "0",
                        "VLLM_CPU_OMP_THREADS_BIND": os.environ.get("VLLM_CPU_OMP_THREADS_BIND", "0-1")}
    base = dict(settings=settings, **records.environment())
    for spec in args.variants:
        todo = [c for c in args.concurrency if (spec, c) not in done]
        if not todo:
            continue
        stats_file = Path(tempfile.mkdtemp()) / "xvocab_stats.json"
        command = server_command(spec, model_dir, args, stats_file)
        log = open(out / ("server-" + "".join(ch if ch.isalnum() or ch in "-." else "_" for ch in spec) + ".log"), "w")
        server = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        try:
            wait_healthy(args.port, server)
            asyncio.run(drive(args.port, model_dir, rows[:WARMUP], 1, args.max_tokens))  # warm, untimed
            for c in todo:
                before = (spec_counters(args.port), _read(stats_file))
                results, wall = asyncio.run(drive(args.port, model_dir, rows, c, args.max_tokens))
                time.sleep(STATS_EVERY + 0.1)  # then one more request: the proposer writes its stats file
                asyncio.run(drive(args.port, model_dir, rows[:1], 1, 2))
                time.sleep(1.0)
                after = (spec_counters(args.port), _read(stats_file))
                for r in results:
                    records.append(path, dict(base, kind="request", variant=spec, concurrency=c, **r))
                group = summarize(results, wall) | dict(spec=_delta(before[0], after[0]),
                                                         proposer=_proposer_delta(before[1], after[1]))
                records.append(path, dict(base, kind="group", variant=spec, concurrency=c, **group))
                print(f"{spec:40} c={c:2}: {group['output_tokens_per_s']:.2f} tok/s, ttft p50 "
                      f"{group['ttft_p50']:.2f} s, errors {group['errors']}", flush=True)
        except RuntimeError as err:
            records.append(path, dict(base, kind="failure", variant=spec, error=str(err)))
            print(f"{spec}: {err} (see the server log)", flush=True)
        finally:
            os.killpg(server.pid, 15)
            try:
                server.wait(120)
            except subprocess.TimeoutExpired:
                os.killpg(server.pid, 9)
            log.close()


def exit_on_sigterm() -> None:
    """Make SIGTERM (a `kill`, a job scheduler's stop) raise SystemExit, so the `finally` that stops the variant's
    server runs: by default Python dies without unwinding, and the server (a session of its own) kept running."""
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))


def _read(stats_file: Path) -> dict | None:
    try:
        return json.loads(stats_file.read_text())
    except (OSError, json.JSONDecodeError):
        return None


def _delta(before: dict, after: dict) -> dict:
    out = {k: after.get(k, 0.0) - before.get(k, 0.0) for k in after if k != "per_position"}
    drafts = max(out.get("drafts", 0.0), 1.0)
    positions = sorted(after["per_position"])
    out["per_position"] = [(after["per_position"][p] - before["per_position"].get(p, 0.0)) / drafts for p in positions]
    return out


def _proposer_delta(before: dict | None, after: dict | None) -> dict | None:
    if after is None:
        return None
    before = before or {}
    keep = ("draft_memory_budget_bytes", "draft_cache_bytes", "draft_rows", "draft_positions_per_row", "policy",
            "failures")
    out = {k: after.get(k) for k in keep}
    out["skipped"] = {k: v - (before.get("skipped") or {}).get(k, 0) for k, v in (after.get("skipped") or {}).items()}
    for k in ("proposed_tokens", "accepted", "drafts", "tokens", "forwards"):
        out[k] = after.get(k, 0) - before.get(k, 0)
    return out


def summarize(results: list[dict], wall: float) -> dict:
    ok = [r for r in results if "error" not in r]
    tokens = sum(r["tokens"] for r in ok)
    gaps = [g for r in ok for g in r["gaps"]]
    ttft = [r["ttft"] for r in ok]
    out = dict(requests=len(results), errors=len(results) - len(ok), wall_s=wall, output_tokens=tokens,
               output_tokens_per_s=tokens / wall, requests_per_s=len(ok) / wall)
    for name, values in (("ttft", ttft), ("gap", gaps)):
        for q in (50, 90, 99):
            out[f"{name}_p{q}"] = percentile(values, q)
    return out


def report(out: Path) -> None:
    from xvocab.measure import records

    groups = [r for r in records.read(out / "records.jsonl") if r.get("kind") == "group"]
    if not groups:
        raise SystemExit(f"no group records in {out}")
    cpu = groups[-1].get("cpu")
    base = {r["concurrency"]: r["output_tokens_per_s"] for r in groups if r["variant"] == "ar"}
    lines = [f"# vllm serve under load ({cpu}, {groups[-1]['settings']['dtype']})", "",
             f"settings: {json.dumps(groups[-1]['settings'])}", "",
             "| variant | c | tok/s | vs ar | req/s | TTFT p50/p90/p99 s | chunk gap p50/p90/p99 s | per position | "
             "skipped | draft MiB (budget) | policy |", "|" + "---|" * 11]
    for r in sorted(groups, key=lambda r: (r["variant"], r["concurrency"])):
        p = r.get("proposer") or {}
        skipped = {k: v for k, v in (p.get("skipped") or {}).items() if v}
        memory = (f"{p['draft_cache_bytes'] / 2**20:.0f} ({p['draft_memory_budget_bytes'] / 2**20:.0f})"
                  if p.get("draft_cache_bytes") else "")
        ratio = r["output_tokens_per_s"] / base[r["concurrency"]] if base.get(r["concurrency"]) else None
        fmt = lambda *v: "/".join(f"{x:.2f}" if x is not None else "-" for x in v)  # noqa: E731
        lines.append(f"| {r['variant']} | {r['concurrency']} | {r['output_tokens_per_s']:.2f} | "
                     f"{'' if ratio is None else f'{ratio:.2f}x'} | {r['requests_per_s']:.3f} | "
                     f"{fmt(r['ttft_p50'], r['ttft_p90'], r['ttft_p99'])} | "
                     f"{fmt(r['gap_p50'], r['gap_p90'], r['gap_p99'])} | "
                     f"{', '.join(f'{x:.2f}' for x in (r.get('spec') or {}).get('per_position', []))} | "
                     f"{skipped or ''} | {memory} | {(p.get('policy') or {}).get('chosen', '')} |")
    records.write_atomic(out / "report.md", "\n".join(lines) + "\n")
    print("\n".join(lines))
    try:
        _figure(groups, out / "load.png", f"{groups[-1]['settings']['target']}, {groups[-1]['settings']['dtype']}, {cpu}")
    except ImportError:  # (vLLM's environment has no matplotlib; the figure reads only the records)
        print(f"no figure here (matplotlib missing): .venv/bin/python -m experiments.vllm.serve_load --report {out}")


def _figure(groups: list[dict], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2), constrained_layout=True)
    for variant in sorted({r["variant"] for r in groups}):
        rows = sorted((r for r in groups if r["variant"] == variant), key=lambda r: r["concurrency"])
        cs = [r["concurrency"] for r in rows]
        left.plot(cs, [r["output_tokens_per_s"] for r in rows], marker="o", label=variant)
        right.plot(cs, [r["gap_p90"] or 0 for r in rows], marker="o", label=variant)
    for ax, name in ((left, "output tokens/s"), (right, "p90 gap between streamed chunks (s)")):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("concurrent requests")
        ax.set_title(name, fontsize=10)
        ax.grid(alpha=0.3)
    left.legend(fontsize=7)
    import textwrap  # a long CPU name (its flags, any caps) is wrapped to the figure's width, never cut off

    fig.suptitle("\n".join(textwrap.wrap(f"vllm serve under load: {title}", 150)), fontsize=9)
    fig.savefig(path, dpi=120)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", default="qwen2.5-coder-1.5b")
    parser.add_argument("--variants", nargs="+", default=["ar", "slem:smollm2-135m", "slem:smollm2-135m,load_policy=off",
                                                          "vllm-tli:smollm2-135m"])
    parser.add_argument("--concurrency", nargs="+", type=int, default=[1, 2, 4, 8, 16])
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--k", type=int, default=4)
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    parser.add_argument("--max-model-len", type=int, default=2048)
    parser.add_argument("--kv-gib", type=int, default=4)
    parser.add_argument("--port", type=int, default=8331)
    parser.add_argument("--out", default="runs/vllm_serve_load")
    parser.add_argument("--report", metavar="DIR", help="write the report and figure of DIR's records, then exit")
    args = parser.parse_args(argv)
    exit_on_sigterm()
    if args.report:
        return report(Path(args.report))
    for spec in args.variants:
        parse(spec)
    run(args)
    report(Path(args.out))


if __name__ == "__main__":
    main()
