"""`python -m experiments.vllm.bench`: vLLM alone, vLLM's own speculative methods, vLLM with xvocab's proposer and
xvocab's own loop, side by side on the same prompts, machine and dtype. Run it with the vLLM environment's Python
(make vllm-setup): `.venv-vllm/bin/python -m experiments.vllm.bench ...`.

What: each variant runs in a worker process of its own that holds its engine (models loaded once); the driver sends
the prompts one at a time, interleaved: prompt i goes to every held variant before prompt i + 1, the variants'
order rotating from prompt to prompt, so a machine that drifts moves every variant alike. Where memory does not hold
every engine at once (`--hold`), the variants run in groups, each group interleaved with vLLM's ar, and every
ratio is taken against the ar of its own group. Where it holds only one (`--hold 1`: float32 1.5B targets on 23 GiB),
the prompts run in `--blocks` blocks and each engine runs a block alone, ar's included, so a prompt's ratio compares
decodes minutes apart (the report says which mode each run used). `--groups ar+A B+C` names the groups outright, each
holding ar only where named: a group without ar (B+C, where memory holds two engines) compares its variants with
its first one, prompt by prompt. Every engine decodes one untimed prompt (`--warmup-task`,
outside the timed ones) before its first timed prompt, so no variant is timed cold. One JSON line per (variant, prompt) goes to
`<out>/records.jsonl` (xvocab.measure.records: atomic, resumable: a rerun skips what is there), with the CPU, versions
and git revision; `python -m experiments.vllm.bench --report <out>` prints and writes the table (`<out>/table.md`) and a figure.

Variants (`--variants`; DRAFT a zoo name, drafter name or directory):
    ar                   vLLM alone (the baseline of every ratio)
    vllm-tli:DRAFT       vLLM's own cross-vocabulary drafting (draft_model, use_heterogeneous_vocab)
    sd:DRAFT             vLLM's draft_model with a same-family draft
    ngram, suffix        vLLM's prompt lookup and suffix decoding, no draft model (experiments.vllm.methods)
    slem:DRAFT, tli:DRAFT, lookup_slem:DRAFT   vLLM with xvocab's proposer (xvocab.vllm; any served algorithm)
    xvocab-ar, xvocab-NAME[:DRAFT]   xvocab's own loop (xvocab.generate), any registered algorithm
A proposing variant takes options after commas: `slem:smollm2-135m,k=3,draft_kernels=torch` (k: its draft length,
else --k; xvocab's proposer: any xvocab.vllm.settings key).

Prompts (`--dataset`): HumanEval (the default), code_edit or prose_summary (experiments.datasets), each with its
standard stop strings; each dataset is a run of its own, reported on its own.

Columns: tokens/s (the prompt's tokens over its wall time), TTFT, tau (emitted tokens per target forward; vLLM's
own methods: tokens over the engine steps vLLM counted (its iteration histogram; one request at a time, a step is
one target forward); xvocab's proposer: the forwards it saw; xvocab's loop: Stats.tau), acceptance per position
(accepted at position i over drafts, vLLM's definition, for every variant; SLEM in xvocab's own loop may propose
more target tokens than k), equal / tie / differs against ar of the same engine (xvocab.checks.ties' bfloat16
rule; greedy runs only), for xvocab's proposer the cost outside the draft's forwards per proposed token, and for
xvocab's proposer and loop how many proposed ids came from the context (lookup) and how many of those were accepted.
`--temperature T` samples instead, each prompt seeded by its index in every variant alike.

    .venv-vllm/bin/python -m experiments.vllm.bench --dtype bfloat16 --prompts 20 --out runs/vllm_bench/bf16
    .venv-vllm/bin/python -m experiments.vllm.bench --report runs/vllm_bench/bf16
    .venv-vllm/bin/python -m experiments.vllm.bench --combine all.png runs/x/code_edit runs/x/humaneval  # a panel each
"""
from __future__ import annotations

import argparse
import functools
import multiprocessing as mp
import os
import sys
import time
from pathlib import Path

from experiments import sidebyside
from experiments.vllm import methods
from experiments.vllm.methods import OWN as VLLM_OWN
from experiments.vllm.methods import TAKES_DRAFT, speculative_config
from xvocab import algorithms
from xvocab.vllm.settings import served

DEFAULT_VARIANTS = ("ar", "vllm-tli:smollm2-135m", "slem:smollm2-135m", "tli:smollm2-135m", "slem:gemma-3-270m",
                    "slem:qwen2.5-coder-1.5b-drafter-deepseek-coder-aligned-v4", "sd:qwen2.5-coder-0.5b",
                    "xvocab-ar", "xvocab-slem:smollm2-135m")
DATASETS = ("humaneval", "code_edit", "prose_summary")  # offline, each with its stop strings (experiments.datasets)


def _loop_kinds() -> tuple[str, ...]:
    """xvocab's own loop: `xvocab-` and any registered algorithm's name, read when used."""
    return tuple(f"xvocab-{name}" for name in algorithms.names())


def _takes_draft(kind: str) -> bool:
    if kind in VLLM_OWN:
        return TAKES_DRAFT[kind]
    if kind in _loop_kinds():
        return algorithms.get(kind.removeprefix("xvocab-")).uses_draft
    return kind in served()


def parse(spec: str) -> tuple[str, str | None, dict]:
    """A variant as experiments.vllm.methods.parse reads it, xvocab's own loop (xvocab-NAME) among the kinds."""
    return methods.parse(spec, {kind: _takes_draft(kind) for kind in _loop_kinds()})


# ------------------------------------------------------------------ worker side: one engine per process


def _engine(spec: str, args) -> tuple:
    """run(prompt_ids, text, seed) -> a record's fields, for a variant, its models built once in its worker."""
    import torch

    import xvocab
    from experiments.datasets import STOPS
    from xvocab.zoo.serving import serving_dir

    kind, draft, options = parse(spec)
    k = options.pop("k", args.k)
    asynchronous = options.pop("async_scheduling", None)
    stop = list(STOPS.get(args.dataset, ()))
    if kind in _loop_kinds():
        torch.set_num_threads(args.threads)
        target, tt = xvocab.zoo.model(args.target, dtype=args.dtype, device="cpu")
        d_model, dt = xvocab.zoo.model(draft, dtype=args.dtype, device="cpu") if draft else (None, None)
        algorithm = kind.removeprefix("xvocab-")

        def run(ids, text, seed):
            kw = algorithms.draft_arguments(algorithm, d_model, dt)
            start = time.perf_counter()
            out = xvocab.generate(text, target=target, target_tokenizer=tt, algorithm=algorithm, k=k,
                                  max_new_tokens=args.max_new_tokens, stop=stop or None,
                                  temperature=args.temperature, seed=seed, **kw)
            s = out.stats
            return dict(token_ids=out.token_ids, seconds=time.perf_counter() - start, ttft=s.ttft_seconds,
                        tau=s.tau, per_position=s.per_draft_acceptance, accepted_per_step=s.accepted,
                        proposed_per_step=s.proposed, proposed=sum(s.proposed), context_proposed=s.context_proposed,
                        context_accepted=s.context_accepted)
        return run

    import vllm

    import xvocab.vllm
    from xvocab.vllm.metrics import acceptance, spec_counts

    engine = dict(model=str(serving_dir(args.target)), dtype=args.dtype, enforce_eager=True,
                  max_model_len=args.max_model_len, max_num_seqs=1, seed=0, disable_log_stats=False)
    if asynchronous is not None:
        engine["async_scheduling"] = asynchronous
    if kind in served():
        engine |= xvocab.vllm.engine_args(draft=draft, algorithm=kind, k=k, **options)
    elif kind in VLLM_OWN:
        engine["speculative_config"] = speculative_config(kind, draft, k)
    llm = vllm.LLM(**engine)
    def run(ids, text, seed):
        params = vllm.SamplingParams(temperature=args.temperature, seed=seed, max_tokens=args.max_new_tokens,
                                     stop=stop or None)
        before = spec_counts(llm) if kind in VLLM_OWN else None
        mine = llm.collective_rpc(xvocab.vllm.worker_stats)[0] if kind in served() else None
        start = time.perf_counter()
        out = llm.generate([{"prompt_token_ids": ids}], params, use_tqdm=False)[0]
        seconds = time.perf_counter() - start
        tokens = list(out.outputs[0].token_ids)
        metrics = getattr(out, "metrics", None)
        rec = dict(token_ids=tokens, seconds=seconds,
                   ttft=getattr(metrics, "first_token_latency", None) or None)
        if kind in VLLM_OWN:  # forwards: the engine steps vLLM counted (one request at a time: one forward each)
            rates = acceptance(before, spec_counts(llm), len(tokens))
            rec |= dict(tau=rates["tau"], per_position=rates["per_position"])
        elif kind in served():
            run_stats = xvocab.vllm.stats_delta(mine, llm.collective_rpc(xvocab.vllm.worker_stats)[0])
            rec |= dict(tau=len(tokens) / max(run_stats["forwards"], 1), per_position=run_stats["per_position"],
                        proposed=run_stats["proposed_tokens"], context_proposed=run_stats.get("context_proposed"),
                        context_accepted=run_stats.get("context_accepted"),
                        overhead_ms_per_token=run_stats["overhead_ms_per_proposed_token"],
                        arms={str(arm): n for arm, n in sorted(run_stats["policy_chosen"].items())},
                        draft_ms_per_forward=1e3 * run_stats["draft_seconds"] / max(run_stats["draft_forwards"], 1))
        else:
            rec |= dict(tau=1.0, per_position=[])
        return rec
    return run


def _worker(spec: str, args, conn) -> None:
    os.setpgrp()  # the worker leads a process group: the driver ends it with the engine processes it started
    os.environ.setdefault("KMP_BLOCKTIME", "0")  # an idle engine's OpenMP threads must not spin on the cores
    try:
        run = _engine(spec, args)
        run(*args.warmup)  # untimed: first-call costs (kernels, allocator, the proposer's first views) paid here
        conn.send(("ready", None))
    except Exception as err:  # reported to the driver, which records the failure and goes on without the variant
        conn.send(("failed", f"{type(err).__name__}: {err}"))
        return
    while True:
        job = conn.recv()
        if job is None:
            return
        try:
            conn.send(("ok", run(*job)))
        except Exception as err:
            conn.send(("failed", f"{type(err).__name__}: {err}"))


# ------------------------------------------------------------------ driver


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--target", default="qwen2.5-coder-1.5b")
    parser.add_argument("--variants", nargs="+", default=list(DEFAULT_VARIANTS))
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    parser.add_argument("--dataset", default="humaneval", choices=DATASETS, help="the prompts, with their stop strings")
    parser.add_argument("--prompts", type=int, default=20, help="the dataset's first N prompts (HumanEval's: never\n"
                        "trained on)")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--k", type=int, default=4)
    parser.add_argument("--temperature", type=float, default=0.0, help="0: greedy (rows compared with ar's); > 0:\n"
                        "sampled, each prompt seeded by its index alike in every variant (no token comparison)")
    parser.add_argument("--hold", type=int, default=2, help="engines held at once, ar included (three bf16 1.5B engines\n"
                        "with their drafts exhausted 24 GiB here); 1: one engine at a time, in --blocks blocks")
    parser.add_argument("--blocks", type=int, default=4, help="with --hold 1: the prompts in this many blocks, each\n"
                        "engine started once per block")
    parser.add_argument("--groups", nargs="+", metavar="A+B", help="explicit groups instead of --variants and --hold:\n"
                        "each a '+'-joined list of variants held and interleaved together, ar only where\n"
                        "named (ar+slem:X; slem:DRAFTER+sd:qwen2.5-coder-0.5b compares two variants directly)")
    parser.add_argument("--warmup-task", help="the prompt id every engine decodes once, untimed, before its first\n"
                        "timed prompt (not one of the timed prompts; default: the dataset's last)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--max-model-len", type=int, default=2048)
    parser.add_argument("--out", default="runs/vllm_bench/bf16")
    parser.add_argument("--report", metavar="DIR", help="print and write the table of DIR's records, then exit")
    parser.add_argument("--combine", nargs="+", metavar=("PNG", "DIR"), help="one figure of several runs (a dataset\n"
                        "each): --combine OUT.png DIR [DIR ...], then exit")
    args = parser.parse_args(argv)
    if args.report:
        return report(Path(args.report))
    if args.combine:
        if len(args.combine) < 2:
            raise SystemExit("--combine OUT.png DIR [DIR ...]: name the figure, then at least one run directory")
        return combined_figure([Path(d) for d in args.combine[1:]], Path(args.combine[0]))
    if args.groups:
        args.groups = [g.split("+") for g in args.groups]
        args.variants = list(dict.fromkeys(v for g in args.groups for v in g))
    for spec in args.variants:
        parse(spec)
    if "ar" not in args.variants and not args.groups:
        raise SystemExit("the variants must include ar: ratios are taken against vLLM's ar (--groups may leave it out: "
                         "a group without ar is compared with its first variant)")
    run(args)
    report(Path(args.out))


def run(args) -> None:
    from experiments import datasets
    from experiments.datasets import STOPS
    from xvocab import zoo
    from xvocab.alignment.roles import prompt_ids
    from xvocab.measure import records

    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB per engine: ample at batch 1 and 2,048 positions
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", f"0-{args.threads - 1}")
    os.environ.setdefault("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")
    out = Path(args.out)
    path = out / "records.jsonl"
    settings = dict(target=args.target, dtype=args.dtype, max_new_tokens=args.max_new_tokens, k=args.k,
                    stop=args.dataset if args.dataset in STOPS else None, threads=args.threads)
    if args.dataset != "humaneval":  # (HumanEval's records predate the option and resume as they are)
        settings["dataset"] = args.dataset
    if args.temperature > 0:  # (greedy records predate the option and resume as they are)
        settings["temperature"] = args.temperature
    done = {(r["variant"], r["prompt"]) for r in records.read(path) if r["settings"] == settings
            and not r.get("failed")} if path.exists() else set()  # (a failed decode runs again)
    rows = datasets.load(args.dataset, None)
    tt = zoo.tokenizer(args.target)
    prompts = [(p["id"], prompt_ids(tt, p["prompt"]), p["prompt"]) for p in rows[: args.prompts]]
    args.warmup_task = args.warmup_task or rows[-1]["id"]
    warm = {p["id"]: p["prompt"] for p in rows}.get(args.warmup_task)
    if warm is None or args.warmup_task in {task for task, _, _ in prompts}:
        raise SystemExit(f"--warmup-task {args.warmup_task!r}: name a {args.dataset} prompt outside the timed prompts "
                         f"(--prompts takes the first {args.prompts} of {len(rows)})")
    args.warmup = (prompt_ids(tt, warm), warm, 0)
    # one id per invocation: a group's ratios are taken against the ar of the same invocation and group, so a
    # later run that adds variants to the same directory never borrows an earlier run's ar
    base = dict(settings=settings, run=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), warmed=args.warmup_task,
                **records.environment())
    others = [v for v in args.variants if v != "ar"]
    if args.hold == 1:
        return _sequential(others, prompts, done, path, base, args)
    size = (args.hold or len(args.variants)) - 1
    groups = (args.groups if args.groups else  # explicit groups hold ar only where named
              [["ar"] + others[i:i + size] for i in range(0, len(others), max(size, 1))] or [["ar"]])
    for g, group in enumerate(groups):
        if all((v, task) in done for v in group if v != "ar" for task, _, _ in prompts) and group != ["ar"]:
            continue
        workers = _start(group, path, dict(base, group=g), args)
        try:
            _interleave(workers, prompts, path, dict(base, group=g), f"group {g + 1}/{len(groups)}")
        finally:
            _stop(workers)


def _sequential(others: list, prompts: list, done: set, path: Path, base: dict, args) -> None:
    """--hold 1, where memory holds one engine (two float32 1.5B engines do not fit 23 GiB): the prompts in
    --blocks blocks; per block every variant still to run, and ar, each started alone, run over the block and
    stopped, the variants' order rotating from block to block. A prompt's ratio compares two decodes of the same
    block, minutes apart, not a whole run apart; every engine start is paid once per block."""
    n = max(1, min(args.blocks, len(prompts)))
    blocks = [prompts[i * len(prompts) // n:(i + 1) * len(prompts) // n] for i in range(n)]
    for b, block in enumerate(blocks):
        pending = [v for v in others if any((v, task) not in done for task, _, _ in block)]
        if others and not pending:
            continue
        for spec in sidebyside.rotated(b, ["ar"] + pending):
            workers = _start([spec], path, dict(base, group=0, block=b), args)  # (ar failing to start ends the run)
            try:
                _interleave(workers, block, path, dict(base, group=0, block=b),
                            f"block {b + 1}/{n} {spec}")
            finally:
                _stop(workers)


def _start(variants: list, path: Path, base: dict, args) -> dict:
    """{spec: (process, pipe)} for each variant whose engine started; one that fails is recorded and left out."""
    from xvocab.measure import records

    ctx = mp.get_context("spawn")
    workers = {}
    for spec in variants:  # one at a time: two engines starting at once on two cores both crawl
        parent, child = ctx.Pipe()
        proc = ctx.Process(target=_worker, args=(spec, args, child))  # (not daemonic: vLLM starts processes)
        proc.start()
        status, detail = parent.recv()
        if status != "ready":
            print(f"{spec}: could not start ({detail}); recorded and skipped", flush=True)
            records.append(path, dict(variant=spec, prompt=None, failed=detail, **base))
            proc.join(5)
            continue
        workers[spec] = (proc, parent)
    if "ar" in variants and "ar" not in workers:
        _stop(workers)
        raise SystemExit("vLLM's ar did not start (recorded in records.jsonl): no baseline for this group")
    return workers


def _stop(workers: dict) -> None:
    """End every worker and the engine processes it started (its process group): vLLM's engine core outlives a
    worker that merely returns."""
    import signal

    for proc, conn in workers.values():
        try:
            conn.send(None)
        except (BrokenPipeError, OSError):
            pass
    for proc, _ in workers.values():
        proc.join(10)
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.join(10)


def _interleave(workers: dict, prompts: list, path: Path, base: dict, desc: str) -> None:
    """Every prompt through every held variant, the order rotating from prompt to prompt (module docstring)."""
    from tqdm import tqdm

    from xvocab.measure import records

    bar = tqdm(total=len(prompts) * len(workers), desc=desc, unit="decode")
    for i, (task, ids, text) in enumerate(prompts):
        for spec in sidebyside.rotated(i, list(workers)):  # no variant always runs first
            proc, conn = workers[spec]
            conn.send((ids, text, i))  # the prompt's index seeds a sampled request (every variant alike)
            status, rec = conn.recv()
            bar.update(1)
            if status != "ok":
                print(f"{spec} on {task}: {rec}", flush=True)
                records.append(path, dict(variant=spec, prompt=task, failed=rec, **base))
                continue
            records.append(path, dict(variant=spec, prompt=task, **rec, **base))
    bar.close()


def report(out: Path) -> None:
    """The table of `out`'s records: per variant, pooled tokens/s, its ratio to the ar of the same group (and the
    median per-prompt ratio), TTFT, tau, acceptance per position, equal / tie / differs against ar."""
    import statistics

    from xvocab.measure import records

    rows = [r for r in records.read(out / "records.jsonl") if not r.get("failed")]
    failed = [r for r in records.read(out / "records.jsonl") if r.get("failed")]
    if not rows:
        raise SystemExit(f"no records in {out}")
    verdicts = _verdicts(rows, out)
    settings = rows[0]["settings"]
    sampling = f"T = {settings['temperature']}, seeded per prompt" if settings.get("temperature") else "greedy"
    lines = [f"CPU: {rows[0]['cpu']}, {settings['threads']} threads; {settings['dtype']}; "
             f"target {settings['target']}; {settings.get('dataset', 'humaneval')}; k = {settings['k']}; up to "
             f"{settings['max_new_tokens']} new tokens{' or its stop strings' if settings['stop'] else ''}; "
             f"{sampling}; vLLM "
             f"{rows[0].get('vllm', '0.32.0')}, transformers {rows[0]['transformers']}, git {rows[0]['git_revision']}",
             "", "Timing: " + "; ".join(_mode(rows, run) for run in dict.fromkeys(r.get("run", "") for r in rows)),
             "", "| variant | prompts | tokens/s | vs vLLM ar (pooled) | per-prompt median (quartiles) | TTFT s | tau | "
             "accepted per position | equal / tie / differs vs ar | proposer overhead ms/token | "
             "proposed ids from the context (accepted) |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    by = {}
    for r in rows:  # a group is (invocation, group): an added run's variants meet the ar of their own run
        by.setdefault((_group(r), r["variant"]), []).append(r)
    groups = sorted({g for g, _ in by})
    order = list(dict.fromkeys(r["variant"] for r in rows))
    bars = []  # (variant, (q1, median, q3) of per-prompt ratios, tau) for the figure
    lines_ref = []
    for variant in order:
        for (g, v), rs in sorted(by.items()):
            if v != variant:
                continue
            ref = "ar" if (g, "ar") in by else next(v2 for (g2, v2) in by if g2 == g)  # a group without ar: its first
            if v == ref and ref != "ar":
                lines_ref.append(f"Group {groups.index(g) + 1} holds no ar: its ratios are to {ref}, prompt by prompt")
            ar = {r["prompt"]: r for r in by.get((g, ref), [])}
            tokens, seconds = sum(len(r["token_ids"]) for r in rs), sum(r["seconds"] for r in rs)
            ar_rs = [ar[r["prompt"]] for r in rs if r["prompt"] in ar]
            ar_tps = sum(len(r["token_ids"]) for r in ar_rs) / max(sum(r["seconds"] for r in ar_rs), 1e-9)
            ratios = sidebyside.paired_ratios({r["prompt"]: len(r["token_ids"]) / r["seconds"] for r in rs},
                                              {p: len(a["token_ids"]) / a["seconds"] for p, a in ar.items()
                                               if a["seconds"] > 0})
            ttft = [r["ttft"] for r in rs if r.get("ttft")]
            pos = [r["per_position"] for r in rs if r.get("per_position")]
            # per draft (vLLM's definition): a decode that never drafted as deep as position j accepted nothing there
            per_pos = [statistics.mean(p[j] if len(p) > j else 0.0 for p in pos)
                       for j in range(max(map(len, pos), default=0))]
            counts = verdicts.get(variant, {})
            overhead = [r["overhead_ms_per_token"] for r in rs if r.get("overhead_ms_per_token") is not None]
            tau = sum(r["tau"] for r in rs) / len(rs)
            quartiles = sidebyside.spread(ratios) if ratios else None
            label = f"{variant} (group {groups.index(g) + 1})" if len(groups) > 1 else variant
            if variant != ref and quartiles:
                bars.append((label if ref == "ar" else f"{label} vs {ref}", quartiles, tau))
            cells = [label, str(len(rs)), f"{tokens / seconds:.2f}", f"{(tokens / seconds) / ar_tps:.2f}x",
                     f"{quartiles[1]:.2f}x ({quartiles[0]:.2f}-{quartiles[2]:.2f})" if quartiles else "—",
                     f"{statistics.mean(ttft):.2f}" if ttft else "—",
                     f"{tau:.2f}",
                     " ".join(f"{x:.2f}" for x in per_pos) or "—",
                     "—" if variant in ("ar", "xvocab-ar") or not verdicts else
                     f"{counts.get('equal', 0)} / {counts.get('tie', 0)} / {counts.get('differs', 0)}"
                     + (f" ({counts['unjudged']} unjudged)" if counts.get("unjudged") else ""),
                     f"{statistics.mean(overhead):.2f}" if overhead else "—",
                     _from_context(rs)]
            lines.append("| " + " | ".join(cells) + " |")
    lines += [f"\n{line}" for line in lines_ref]
    for r in failed:
        lines.append(f"\nFailed: {r['variant']} on {r['prompt']}: {r['failed']}")
    text = "\n".join(lines) + "\n"
    records.write_atomic(out / "table.md", text)
    print(text)
    _figure(out, bars, lines[0])


def _from_context(rs: list[dict]) -> str:
    """'c of n (a)': of the n ids a variant proposed, c were looked up in the context and a of those accepted (xvocab's
    proposer and loop count them; vLLM's own methods do not say)."""
    counted = [r for r in rs if r.get("context_proposed") is not None and r.get("proposed") is not None]
    if not counted:
        return "—"
    return (f"{sum(r['context_proposed'] for r in counted)} of {sum(r['proposed'] for r in counted)} "
            f"({sum(r['context_accepted'] for r in counted)})")


def ratios_by_variant(rows: list[dict]) -> dict[str, tuple[tuple[float, float, float], float]]:
    """{variant: ((q1, median, q3) of its per-prompt tokens/s over its group's vLLM ar, mean tau)} for one run's
    records (a variant run in several groups: its prompts pooled, each against its own group's ar)."""
    rows = [r for r in rows if not r.get("failed")]
    by = {}  # variant -> {(group, prompt): record}
    for r in rows:
        by.setdefault(r["variant"], {})[_group(r), r["prompt"]] = r
    ar = {key: len(r["token_ids"]) / r["seconds"] for key, r in by.pop("ar", {}).items()}
    out = {}
    for v, mine in by.items():
        ratios = sidebyside.paired_ratios({key: len(r["token_ids"]) / r["seconds"] for key, r in mine.items()}, ar)
        if ratios:
            taus = [r["tau"] for key, r in mine.items() if key in ar]
            out[v] = (sidebyside.spread(ratios), sum(taus) / len(taus))
    return out


def combined_figure(dirs: list[Path], path: Path) -> None:
    """One panel per run directory (a dataset each): every variant's per-prompt median speed over vLLM's ar of its
    group, whiskers at the quartiles, tau beside it; the same variants in the same order in every panel."""
    import textwrap

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from xvocab.measure import records

    read = [records.read(d / "records.jsonl") for d in dirs]
    runs = [(rows[0], ratios_by_variant(rows)) for rows in read]
    order = list(dict.fromkeys(v for _, got in runs for v in got))
    short = {v: v.replace("qwen2.5-coder-1.5b-drafter-deepseek-coder-aligned-v4", "v4 drafter") for v in order}
    fig, axes = plt.subplots(1, len(runs), figsize=(4.2 * len(runs), 1.4 + 0.4 * len(order)), sharey=True,
                             squeeze=False)
    y = list(range(len(order)))[::-1]
    for ax, (first, got) in zip(axes[0], runs):
        for yy, v in zip(y, order):
            if v not in got:
                continue
            (q1, med, q3), tau = got[v]
            ax.barh(yy, med, color="#4c72b0" if v.split(":")[0] in served() else "#999999",
                    xerr=[[med - q1], [q3 - med]], error_kw=dict(ecolor="black", elinewidth=0.8, capsize=2))
            ax.text(q3 + 0.05, yy, f"{med:.2f}x  tau {tau:.2f}", va="center", fontsize=7)
        ax.axvline(1.0, color="black", linewidth=0.8)
        ax.set_xlim(0, max((g[0][2] for g in got.values()), default=1.0) * 1.45)
        ax.set_title(first["settings"].get("dataset", "humaneval"), fontsize=9)
        ax.set_xlabel("tokens/s over vLLM's ar, per-prompt median", fontsize=7)
    axes[0][0].set_yticks(y, [short[v] for v in order], fontsize=7)
    first = runs[0][0]
    caption = (f"{first['cpu']}, {first['settings']['threads']} threads, {first['settings']['dtype']}, target "
               f"{first['settings']['target']}, k = {first['settings']['k']}, batch 1, every engine warmed; blue: "
               f"xvocab's proposer inside vLLM, grey: vLLM's own methods; git {first['git_revision']}")
    fig.suptitle("\n".join(textwrap.wrap(caption, 40 * len(runs))), fontsize=7, x=0.01, ha="left")
    fig.tight_layout()
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)


def _mode(rows: list, run: str) -> str:
    """How one invocation timed its variants: engines held together and interleaved per prompt, or one at a time."""
    mine = [r for r in rows if r.get("run", "") == run]
    blocks = {r["block"] for r in mine if "block" in r}
    name = f"run {run}" if run else "first run"
    if blocks:
        return f"{name}: one engine at a time, {len(blocks)} blocks of prompts (each prompt's decodes minutes apart)"
    return f"{name}: engines held together, interleaved prompt by prompt"


def _group(record: dict) -> tuple:
    """(invocation, group) of a record; records written before runs were named carry no run id."""
    return record.get("run", ""), record["group"]


def _figure(out: Path, bars: list, caption: str) -> None:
    """speedup.png: each variant's median over prompts of its tokens/s over its group's vLLM ar on the same prompt
    (one decode disturbed by other work moves one ratio, not the bar), the quartiles as a whisker, tau written
    beside it; the caption wrapped to the figure's width (skipped where matplotlib is not installed)."""
    import textwrap

    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    names = [b[0].replace("qwen2.5-coder-1.5b-drafter-deepseek-coder-aligned-v4", "drafter v4") for b in bars]
    q1, med, q3 = (list(x) for x in zip(*(b[1] for b in bars))) if bars else ([], [], [])
    fig, ax = plt.subplots(figsize=(9, 1.6 + 0.45 * len(names)))
    colours = ["#4c72b0" if n.startswith(served()) else "#999999" for n in names]
    y = list(range(len(names)))[::-1]
    ax.barh(y, med, color=colours, xerr=[[m - a for m, a in zip(med, q1)], [b - m for m, b in zip(med, q3)]],
            error_kw=dict(ecolor="black", elinewidth=0.8, capsize=3))
    ax.set_yticks(y, names)
    ax.axvline(1.0, color="black", linewidth=0.8)
    for yy, m, hi, b in zip(y, med, q3, bars):
        ax.text(hi + 0.03, yy, f"{m:.2f}x  tau {b[2]:.2f}", va="center", fontsize=8)
    ax.set_xlabel("tokens/s over vLLM's ar of the same group (or the variant named after 'vs'), per-prompt median "
                  "(whiskers: quartiles)\n"
                  "blue: xvocab's proposer inside vLLM; grey: vLLM's own methods and xvocab's loop", fontsize=8)
    ax.set_xlim(0, max(q3, default=1.0) * 1.3)
    ax.set_title("\n".join(textwrap.wrap(caption, 110)), fontsize=7, loc="left")
    fig.savefig(out / "speedup.png", dpi=120, bbox_inches="tight")
    plt.close(fig)


def _verdicts(rows: list[dict], out: Path) -> dict:
    """{variant: {equal, tie, differs}} against ar of the same engine family (vLLM variants against vLLM's ar,
    xvocab's loop against xvocab-ar); float32 runs need equality, bfloat16 differences are judged by
    xvocab.checks.ties."""
    from xvocab.checks import ties

    if rows[0]["settings"].get("temperature"):  # sampled: a variant's draws need not be ar's (the law is checked
        return {}                               # by the distribution suites, not token by token)
    dtype = rows[0]["settings"]["dtype"]
    ar = {(r["prompt"], _group(r)): r for r in rows if r["variant"] == "ar"}
    own_ar = {r["prompt"]: r for r in rows if r["variant"] == "xvocab-ar"}
    judge = functools.cache(lambda: _judge(rows[0]["settings"]))
    out_counts: dict = {}
    for r in rows:
        if r["variant"] in ("ar", "xvocab-ar"):
            continue
        ref = (own_ar.get(r["prompt"]) if r["variant"].startswith("xvocab-") else ar.get((r["prompt"], _group(r))))
        if ref is None:
            continue
        # (the judge loads the target once, and only for a bfloat16 difference)
        verdict = ties.verdict(ref["token_ids"], r["token_ids"], dtype, lambda task=r["prompt"]: judge()(task))
        out_counts.setdefault(r["variant"], {}).setdefault(verdict, 0)
        out_counts[r["variant"]][verdict] += 1
    return out_counts


def _judge(settings: dict):
    """prompt task id -> logits_at for xvocab.checks.ties.classify (None where no float32 copy fits: "unjudged"): the
    target's bfloat16 weights read in float32, through xvocab.checks.ties.Float32Judge (the runner's judge too)."""
    import torch

    from xvocab import zoo
    from xvocab.alignment.roles import prompt_ids
    from xvocab.checks import ties

    from experiments import datasets

    model, tok = zoo.model(settings["target"], dtype=torch.bfloat16, device="cpu")
    judge = ties.Float32Judge(model)
    problems = {p["id"]: p["prompt"] for p in datasets.load(settings.get("dataset", "humaneval"), None)}
    return lambda task: judge.for_prompt(prompt_ids(tok, problems[task]))


if __name__ == "__main__":
    sys.exit(main())
