"""`python -m experiments.vllm.serve_load`: `vllm serve` under load, for vLLM alone, its own speculative methods and
xvocab's proposer, at several concurrencies. Run it with the vLLM environment's Python (make vllm-setup).

What: for each variant in turn (or, with --together, for all at once), starts vLLM's OpenAI-compatible server on
127.0.0.1, waits for /health, warms it (WARMUP requests one at a time, then as many as the largest concurrency at
once, not timed: the first requests of an engine, and its first batch of a size, pay lazy initialisations), then for
each concurrency c sends the same prompts (HumanEval's and the prose stand-in's, interleaved) through a bounded
asynchronous client: at most c streaming /v1/completions requests in flight, a new one sent as one ends. Per request
it records the time to first token, the gaps between streamed chunks (vLLM streams a verified run of tokens as one
chunk), the tokens (usage) and the end-to-end seconds; per (variant, c) group the wall time, vLLM's spec_decode
counters (/metrics) and the proposer's own stats (its `stats_file`: draft memory, proposals skipped and why, the
load policy's choices). `--passes N` runs each group N times; `--together` holds every variant's server at once (as
much memory as they all need) and interleaves their groups pass by pass, the order rotating, so each ratio pairs a
variant's group with ar's of the same pass seconds apart (one server at a time, a ratio compares groups minutes
apart, and the same ar server's groups were seen to move 12% between runs). `--interleave N` goes finer: each
group's rows go in N parts, each part to every server in turn (their order rotating part by part), so the machine's
drift within a group (ar's own group moved 34% between two passes minutes apart) moves every variant alike; a part
holds at least 2c rows. Records append to OUT/records.jsonl one line per request and one per group; a group
already recorded for the same settings and pass is skipped, so a killed run resumes (a round, every server's group
of one c and pass, is recorded once whole). The report (`--report OUT`, also at the end of a run) writes
OUT/report.md and OUT/load.png: output tokens/s, requests/s, TTFT and chunk-gap p50/p90/p99 per group, acceptance
per position, and each variant's throughput over vLLM's ar at the same concurrency.

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

from experiments import sidebyside
from experiments.vllm.methods import OWN, parse, speculative_config
from xvocab.vllm.settings import served

WARMUP = 2
STOP = ["\ndef ", "\nclass ", "\nif __name__", "\nprint("]  # HumanEval's (vLLM's API takes 4); prose: max_tokens


def server_command(spec: str, model_dir: str, args, stats_file: Path, port: int) -> list[str]:
    """The `vllm serve` command line for one variant (experiments.vllm.methods.parse reads it; its `k` option, else
    --k, is the draft length)."""
    kind, draft, options = parse(spec)
    k = options.pop("k", args.k)
    asynchronous = options.pop("async_scheduling", None)
    command = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", model_dir,
               "--port", str(port), "--host", "127.0.0.1", "--dtype", args.dtype, "--enforce-eager",
               "--max-model-len", str(args.max_model_len), "--max-num-seqs", str(max(args.concurrency)),
               "--seed", "0", "--disable-uvicorn-access-log"]
    if kind in served():
        command += ["--speculative-config", json.dumps({"method": "custom_class", "model": "xvocab.vllm.Proposer",
                                                        "num_speculative_tokens": k}),
                    "--additional-config", json.dumps({"xvocab": {"draft": draft, "algorithm": kind,
                                                                  "stats_file": str(stats_file), **options}})]
    elif kind in OWN:
        command += ["--speculative-config", json.dumps(speculative_config(kind, draft, k))]
    if asynchronous is not None:
        command.append("--async-scheduling" if asynchronous else "--no-async-scheduling")
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
    gaps = [round(b - a, 6) for a, b in zip(chunks, chunks[1:])]  # (microseconds: finer is the clock's noise)
    return {"id": row["id"], "set": row["set"], "ttft": round(chunks[0] if chunks else end, 6), "e2e": round(end, 6),
            "tokens": tokens, "chunks": len(chunks), "gaps": gaps, "text": "".join(text)}


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


def schedule(variants: list[str], concurrency: list[int], passes: int, together: bool) -> list[tuple[str, int, int]]:
    """The order of the groups (variant, c, pass). Together (every server up at once): pass by pass, c by c, every
    variant, their order rotating from group to group, so a machine that drifts moves every variant alike and each
    ratio pairs a variant with ar's group of the same pass and c, seconds apart. One server at a time: variant by
    variant, its passes and concurrencies in turn (a ratio then compares groups minutes apart)."""
    if not together:
        return [(v, c, p) for v in variants for p in range(passes) for c in concurrency]
    order, turn = [], 0
    for p in range(passes):
        for c in concurrency:
            order += [(v, c, p) for v in sidebyside.rotated(turn, variants)]
            turn += 1
    return order


class _Server:
    """One variant's `vllm serve` (a session of its own, stopped in `stop`), warmed before its first timed group."""

    def __init__(self, spec: str, port: int, model_dir: str, args, env: dict, out: Path):
        self.spec, self.port, self.model_dir = spec, port, model_dir
        self.stats_file = Path(tempfile.mkdtemp()) / "xvocab_stats.json"
        name = "".join(ch if ch.isalnum() or ch in "-." else "_" for ch in spec)
        self.log = open(out / f"server-{name}.log", "w")
        self.process = subprocess.Popen(server_command(spec, model_dir, args, self.stats_file, port), stdout=self.log,
                                        stderr=subprocess.STDOUT, env=env, start_new_session=True)

    def ready(self, rows: list[dict], max_tokens: int, concurrency: int) -> None:
        """Wait for /health, then warm, untimed: WARMUP requests one at a time, then `concurrency` at once (a first
        batch of that size pays lazy initialisations of its own: a first group at c = 4 ran 40% slower than the
        next, on ar's server and the proposer's alike)."""
        from experiments.vllm.serve_check import wait_healthy

        wait_healthy(self.port, self.process)
        asyncio.run(drive(self.port, self.model_dir, rows[:WARMUP], 1, max_tokens))
        asyncio.run(drive(self.port, self.model_dir, rows[:concurrency], concurrency, max_tokens))

    def stop(self) -> None:
        os.killpg(self.process.pid, 15)
        try:
            self.process.wait(120)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, 9)
        self.log.close()


def split(rows: list[dict], c: int, parts: int) -> list[list[dict]]:
    """The rows in contiguous parts for interleaving: `parts` of them, fewer where a part would hold under 2c rows
    (a part ends in a drain, its last requests running with fewer than c in flight; two waves a part keep that
    small), at least one."""
    n = max(1, min(parts, len(rows) // (2 * c)))
    size, extra = divmod(len(rows), n)
    out, start = [], 0
    for i in range(n):
        end = start + size + (i < extra)
        out.append(rows[start:end])
        start = end
    return out


def _round(servers: list[_Server], rows: list[dict], c: int, max_tokens: int, parts: int) -> dict[str, tuple]:
    """One timed group per server at concurrency c over every row, the rows sent in parts (`split`), each part to
    every server in turn, their order rotating part by part (the servers' list order first): a machine that drifts
    within the group then moves every server's group alike. {spec: (request records, the group's summary and
    counters)}; a group's wall time is the sum of its parts'."""
    from xvocab.vllm.settings import STATS_EVERY

    before = {s.spec: (spec_counters(s.port), _read(s.stats_file)) for s in servers}
    results = {s.spec: [] for s in servers}
    walls = {s.spec: [] for s in servers}
    chunks = split(rows, c, parts)
    for j, chunk in enumerate(chunks):
        for server in sidebyside.rotated(j, servers):
            done, wall = asyncio.run(drive(server.port, server.model_dir, chunk, c, max_tokens))
            results[server.spec] += done
            walls[server.spec].append(wall)
    time.sleep(STATS_EVERY + 0.1)  # then one more request each: the proposer writes its stats file
    for server in servers:
        asyncio.run(drive(server.port, server.model_dir, rows[:1], 1, 2))
    time.sleep(1.0)
    out = {}
    for server in servers:
        after = (spec_counters(server.port), _read(server.stats_file))
        spec = server.spec
        group = summarize(results[spec], sum(walls[spec])) | dict(
            parts=len(chunks), part_walls=walls[spec], spec=_delta(before[spec][0], after[0]),
            proposer=_proposer_delta(before[spec][1], after[1]))
        out[spec] = (results[spec], group)
    return out


def rounds(groups: list[tuple[str, int, int]]) -> list[tuple[int, int, list[str]]]:
    """Consecutive groups of the same (c, pass) as one round: (c, pass, the variants in order)."""
    out: list[tuple[int, int, list[str]]] = []
    for spec, c, pass_ in groups:
        if out and out[-1][:2] == (c, pass_):
            out[-1][2].append(spec)
        else:
            out.append((c, pass_, [spec]))
    return out


def run(args) -> None:
    from xvocab.measure import records
    from xvocab.zoo.serving import serving_dir

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / "records.jsonl"
    settings = dict(target=args.target, dtype=args.dtype, k=args.k, prompts=args.prompts, max_tokens=args.max_tokens,
                    max_model_len=args.max_model_len, kv_gib=args.kv_gib, interleave=args.interleave)
    done = {(r["variant"], r["concurrency"], r.get("pass", 0)) for r in records.read(path)
            if r.get("kind") == "group" and r["settings"] == settings} if path.exists() else set()
    todo = [g for g in schedule(args.variants, args.concurrency, args.passes, args.together) if g not in done]
    rows = prompts(args.prompts)
    model_dir = str(serving_dir(args.target))
    env = os.environ | {"VLLM_CPU_KVCACHE_SPACE": str(args.kv_gib), "KMP_BLOCKTIME": "0",
                        "VLLM_CPU_OMP_THREADS_BIND": os.environ.get("VLLM_CPU_OMP_THREADS_BIND", "0-1")}
    base = dict(settings=settings, together=args.together, **records.environment())
    waves = [todo] if args.together else [[g for g in todo if g[0] == v] for v in args.variants]
    for wave in filter(None, waves):
        servers: dict[str, _Server] = {}
        try:
            for i, spec in enumerate(dict.fromkeys(v for v, _, _ in wave)):
                servers[spec] = _Server(spec, args.port + i, model_dir, args, env, out)
            for server in servers.values():
                server.ready(rows, args.max_tokens, max(args.concurrency))
            for c, pass_, specs in rounds(wave) if args.together else [(c, p, [v]) for v, c, p in wave]:
                done_ = _round([servers[spec] for spec in specs], rows, c, args.max_tokens, args.interleave)
                for spec in specs:  # (recorded once the round is whole: a killed round is run again)
                    results, group = done_[spec]
                    key = dict(variant=spec, concurrency=c, **{"pass": pass_})
                    for r in results:
                        records.append(path, dict(base, kind="request", **key, **r))
                    records.append(path, dict(base, kind="group", **key, **group))
                    print(f"{spec:40} c={c:2} pass {pass_}: {group['output_tokens_per_s']:.2f} tok/s, ttft p50 "
                          f"{group['ttft_p50']:.2f} s, errors {group['errors']}, parts {group['parts']}", flush=True)
        except RuntimeError as err:
            records.append(path, dict(base, kind="failure", variants=list(servers), error=str(err)))
            print(f"{', '.join(servers)}: {err} (see the server logs)", flush=True)
        finally:
            for server in servers.values():
                server.stop()


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


def aggregate(records_: list[dict]) -> list[dict]:
    """One row per (variant, c) over its passes: tok/s and req/s their medians; `ratios` each pass's tok/s over
    ar's of the same pass and c (paired: with --together, groups seconds apart); TTFT and chunk-gap percentiles over
    every request of every pass; acceptance per position weighted by each pass's drafts; skips summed; the proposer's
    memory and policy as the last pass left them (they are cumulative)."""
    groups = [r for r in records_ if r.get("kind") == "group"]
    requests = [r for r in records_ if r.get("kind") == "request" and "error" not in r]
    ar = {(r["concurrency"], r.get("pass", 0)): r["output_tokens_per_s"] for r in groups if r["variant"] == "ar"}
    rows = []
    for key in sorted({(r["variant"], r["concurrency"]) for r in groups}):
        passes = sorted((r for r in groups if (r["variant"], r["concurrency"]) == key), key=lambda r: r.get("pass", 0))
        mine = [r for r in requests if (r["variant"], r["concurrency"]) == key]
        row = dict(variant=key[0], concurrency=key[1], passes=len(passes),
                   output_tokens_per_s=statistics.median(r["output_tokens_per_s"] for r in passes),
                   requests_per_s=statistics.median(r["requests_per_s"] for r in passes),
                   ratios=[r["output_tokens_per_s"] / ar[key[1], r.get("pass", 0)] for r in passes
                           if ar.get((key[1], r.get("pass", 0)))],
                   errors=sum(r["errors"] for r in passes))
        for name, values in (("ttft", [r["ttft"] for r in mine]), ("gap", [g for r in mine for g in r["gaps"]])):
            for q in (50, 90, 99):
                row[f"{name}_p{q}"] = percentile(values, q)
        specs = [r["spec"] for r in passes if (r.get("spec") or {}).get("per_position")]
        drafts = sum(max(x.get("drafts", 0.0), 1.0) for x in specs)
        width = max((len(x["per_position"]) for x in specs), default=0)
        row["per_position"] = [sum(max(x.get("drafts", 0.0), 1.0) * x["per_position"][i] for x in specs
                                   if i < len(x["per_position"])) / drafts for i in range(width)]
        proposer = [r["proposer"] for r in passes if r.get("proposer")]
        row["skipped"] = {}
        for x in proposer:
            for why, n in (x.get("skipped") or {}).items():
                row["skipped"][why] = row["skipped"].get(why, 0) + n
        row["proposer"] = proposer[-1] if proposer else {}
        rows.append(row)
    return rows


def report(out: Path) -> None:
    from xvocab.measure import records

    every = list(records.read(out / "records.jsonl"))
    groups = [r for r in every if r.get("kind") == "group"]
    if not groups:
        raise SystemExit(f"no group records in {out}")
    cpu = groups[-1].get("cpu")
    rows = aggregate(every)
    together = any(r.get("together") for r in groups)
    interleave = groups[-1]["settings"].get("interleave", 1)
    lines = [f"# vllm serve under load ({cpu}, {groups[-1]['settings']['dtype']})", "",
             f"settings: {json.dumps(groups[-1]['settings'])}; "
             + ("servers up together, groups interleaved: each ratio pairs a pass with ar's of the same pass"
                + (f", each group sent in up to {interleave} parts, part by part to every server in turn"
                   if interleave > 1 else "")
                if together else "one server at a time: a ratio compares groups minutes apart"), "",
             "vs ar: the median of the passes' ratios [their range]; tok/s and req/s: medians; TTFT and gaps: every "
             "request of every pass.", "",
             "| variant | c | passes | tok/s | vs ar | req/s | TTFT p50/p90/p99 s | chunk gap p50/p90/p99 s | "
             "per position | skipped | draft MiB (budget) | policy |", "|" + "---|" * 12]
    fmt = lambda *v: "/".join(f"{x:.2f}" if x is not None else "-" for x in v)  # noqa: E731
    for r in rows:
        p = r["proposer"]
        skipped = {k: v for k, v in r["skipped"].items() if v}
        memory = (f"{p['draft_cache_bytes'] / 2**20:.0f} ({p['draft_memory_budget_bytes'] / 2**20:.0f})"
                  if p.get("draft_cache_bytes") else "")
        ratios = r["ratios"]
        ratio = (f"{statistics.median(ratios):.2f}x" + (f" [{min(ratios):.2f}-{max(ratios):.2f}]"
                                                        if len(ratios) > 1 else "")) if ratios else ""
        lines.append(f"| {r['variant']} | {r['concurrency']} | {r['passes']} | {r['output_tokens_per_s']:.2f} | "
                     f"{ratio} | {r['requests_per_s']:.3f} | {fmt(r['ttft_p50'], r['ttft_p90'], r['ttft_p99'])} | "
                     f"{fmt(r['gap_p50'], r['gap_p90'], r['gap_p99'])} | "
                     f"{', '.join(f'{x:.2f}' for x in r['per_position'])} | "
                     f"{skipped or ''} | {memory} | {(p.get('policy') or {}).get('chosen', '')} |")
    records.write_atomic(out / "report.md", "\n".join(lines) + "\n")
    print("\n".join(lines))
    try:
        _figure(rows, out / "load.png", f"{groups[-1]['settings']['target']}, {groups[-1]['settings']['dtype']}, {cpu}")
    except ImportError:  # (vLLM's environment has no matplotlib; the figure reads only the records)
        print(f"no figure here (matplotlib missing): .venv/bin/python -m experiments.vllm.serve_load --report {out}")


def _figure(rows: list[dict], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2), constrained_layout=True)
    for variant in sorted({r["variant"] for r in rows}):
        mine = sorted((r for r in rows if r["variant"] == variant), key=lambda r: r["concurrency"])
        cs = [r["concurrency"] for r in mine]
        left.plot(cs, [r["output_tokens_per_s"] for r in mine], marker="o", label=variant)
        right.plot(cs, [r["gap_p90"] or 0 for r in mine], marker="o", label=variant)
    for ax, name in ((left, "output tokens/s (median of passes)"), (right, "p90 gap between streamed chunks (s)")):
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
    parser.add_argument("--variants", nargs="+", default=["ar", "slem:smollm2-135m",
                                                          "slem:smollm2-135m,load_policy=off", "vllm-tli:smollm2-135m"])
    parser.add_argument("--concurrency", nargs="+", type=int, default=[1, 2, 4, 8, 16])
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--k", type=int, default=4)
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    parser.add_argument("--max-model-len", type=int, default=2048)
    parser.add_argument("--kv-gib", type=int, default=4)
    parser.add_argument("--passes", type=int, default=1, help="each (variant, c) group this many times")
    parser.add_argument("--together", action="store_true", help="every variant's server up at once, groups "
                        "interleaved (ratios paired pass by pass); memory must hold them all (two bf16 1.5B servers "
                        "with --kv-gib 2 fit 23 GiB)")
    parser.add_argument("--interleave", type=int, default=1, metavar="N", help="with --together, send each group's "
                        "rows in N parts, each part to every server in turn (order rotating), so drift within a "
                        "group moves every variant alike; a part holds at least 2c rows (fewer parts where it "
                        "would not)")
    parser.add_argument("--port", type=int, default=8331, help="the first server's (the others': the next ports)")
    parser.add_argument("--out", default="runs/vllm_serve_load")
    parser.add_argument("--report", metavar="DIR", help="write the report and figure of DIR's records, then exit")
    args = parser.parse_args(argv)
    exit_on_sigterm()
    if args.report:
        return report(Path(args.report))
    for spec in args.variants:
        parse(spec)
    if args.passes < 1:
        raise SystemExit(f"--passes {args.passes}: at least 1")
    if args.interleave < 1 or (args.interleave > 1 and not args.together):
        raise SystemExit(f"--interleave {args.interleave}: at least 1, and above 1 only with --together (it "
                         f"interleaves servers that are up at once)")
    run(args)
    report(Path(args.out))


if __name__ == "__main__":
    main()
