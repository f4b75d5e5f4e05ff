"""xvocab's proposer inside vLLM (the CPU build, float32, tiny folded pairs over real tokenizers; xvocab.zoo.tiny):
greedy output equals vLLM's own ar token for token while the draft is accepted; sampled output follows the target's
exact law (chi-square at xvocab.checks.lossless.ALPHA), and the same test rejects a negative control; settings it cannot
keep exact stop the engine at start-up with xvocab's error.

Each engine takes 15-30 s to start on two cores: engines are built once per module and shared by the tests."""
from __future__ import annotations

import gc
import os

import pytest

os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")               # GiB per engine: tiny models need little
os.environ.setdefault("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")    # collective_rpc(xvocab.vllm.worker_stats)

import xvocab  # noqa: E402
import xvocab.vllm  # noqa: E402
from xvocab.alignment.roles import prompt_ids  # noqa: E402
from xvocab.checks.lossless import (  # noqa: E402
    ALPHA,
    PROMPT,
    SETTINGS,
    TOKENS,
    N,
    chi_square_pvalue,
    exact_distribution,
)
from xvocab.vllm import repairs  # noqa: E402
from xvocab.vllm.settings import served  # noqa: E402
from xvocab.zoo.tiny import servable_pair  # noqa: E402

vllm = pytest.importorskip("vllm")

PAIRS = [("mistral-v1", "qwen2"), ("deepseek-coder", "gemma-4")]  # SentencePiece <- byte-level BPE, and the reverse
PROMPTS = ["def fibonacci(n):", "The quick brown fox", "  x = [1, 2, 3]\n", "import os\n", "Once upon a time",
           "class Stack:\n    def push(self, x):"]
MAX_TOKENS = 32


@pytest.fixture(scope="module")
def pairs(tmp_path_factory):
    root = tmp_path_factory.mktemp("pairs")
    return {p: servable_pair(*p, root) for p in PAIRS}


@pytest.fixture(scope="module")
def engines(pairs):
    """engine(pair, name, **xvocab settings) -> a vllm.LLM over the pair's target, built once per module: name "ar"
    (vLLM alone) or an algorithm (xvocab's proposer drafting with the pair's draft, xvocab.vllm.Settings)."""
    built = {}

    def engine(pair, name, k=4, **settings):
        # Acceptance is what most tests here check: the load policy, which steps aside where drafting measures slower
        # (tiny models on two cores), is off unless a test asks for it (the fuzz engine runs it).
        settings = {"load_policy": "off"} | settings
        key = (pair, name, k, tuple(sorted(settings.items())))
        if key not in built:
            target_dir, draft_dir = pairs[pair]
            args = dict(model=str(target_dir), dtype="float32", enforce_eager=True, max_model_len=512,
                        max_num_seqs=8, seed=0)
            if name != "ar":
                args |= xvocab.vllm.engine_args(draft=str(draft_dir), algorithm=name, k=k, **settings)
            built[key] = vllm.LLM(**args)
        return built[key]

    yield engine
    for llm in built.values():
        llm.llm_engine.engine_core.shutdown()
    built.clear()
    gc.collect()


def token_prompts(target_dir, prompts):
    tt = xvocab.zoo.tokenizer(str(target_dir))
    return [{"prompt_token_ids": prompt_ids(tt, p)} for p in prompts]  # vLLM's TokensPrompt


def stats(llm) -> dict:
    """The proposer's cumulative stats in the engine's worker (xvocab.vllm.Proposer.stats)."""
    return llm.collective_rpc(xvocab.vllm.worker_stats)[0]


def greedy(llm, prompts):
    params = vllm.SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS)
    return [list(o.outputs[0].token_ids) for o in llm.generate(prompts, params, use_tqdm=False)]


REPEATING = ["for i in range(n):\n    x = f(i)\nfor j in range(n):\n    y = f(", "a b c a b c a b"]  # (lookup's runs)


@pytest.mark.parametrize("algorithm, pair", [*((a, PAIRS[0]) for a in served()),
                                             pytest.param("slem", PAIRS[1], marks=pytest.mark.slow)],
                         ids=lambda x: x if isinstance(x, str) else f"{x[0]}<-{x[1]}")
def test_greedy_output_equals_vllms_own_ar_and_the_draft_is_accepted(pairs, engines, algorithm, pair):
    """Every algorithm xvocab serves in vLLM (the registry's in_vllm entries)."""
    prompts = token_prompts(pairs[pair][0], PROMPTS + REPEATING)
    want = greedy(engines(pair, "ar"), prompts)
    llm = engines(pair, algorithm)
    before = stats(llm)
    got = greedy(llm, prompts)
    assert got == want
    run = xvocab.vllm.stats_delta(before, stats(llm))
    emitted = sum(map(len, got))  # the proposer saw every token vLLM sampled (a last step's may pass max_tokens)
    assert emitted <= run["tokens"] <= emitted + 4 * len(prompts)
    assert run["tau"] > 1.3, f"tau {run['tau']:.2f}: the draft was hardly accepted"
    assert run["proposed_tokens"] >= run["accepted"] > 0
    # ids looked up in the context are counted (those entries are the ones checked on text that repeats); of them,
    # no more accepted than proposed, nor than accepted in all
    looks_up = xvocab.algorithms.get(algorithm).control_case == "repeats"
    assert (run["context_proposed"] > 0) is looks_up
    assert run["context_accepted"] <= min(run["context_proposed"], run["accepted"])


def test_the_measured_load_policy_changes_how_much_is_proposed_never_what_is_emitted(pairs, engines):
    """xvocab.vllm.policy's invariant inside vLLM: with the policy measuring (it steps aside or drafts as the tiny
    pair's timings say), greedy rows equal vLLM's ar."""
    pair = PAIRS[0]
    prompts = token_prompts(pairs[pair][0], PROMPTS)
    llm = engines(pair, "slem", load_policy="measured")
    assert greedy(llm, prompts) == greedy(engines(pair, "ar"), prompts)
    assert stats(llm)["policy"]["mode"] == "measured" and not stats(llm)["failures"]


def test_the_proposer_matches_xvocabs_own_loop_on_the_same_pair(pairs, engines):
    """Inside vLLM, xvocab's TLI proposer accepts what xvocab's own greedy TLI accepts on the same prompts (the same
    drafter code over the same re-tokenized context; vLLM's rows differ from a lone sequence only by float
    reassociation, so the two taus agree closely, not necessarily to the last token)."""
    pair = PAIRS[0]
    target_dir, draft_dir = pairs[pair]
    target, tt = xvocab.zoo.model(str(target_dir))
    draft, dt = xvocab.zoo.model(str(draft_dir))
    outs = [xvocab.generate(p, target=target, target_tokenizer=tt, draft=draft, draft_tokenizer=dt, algorithm="tli",
                            k=4, max_new_tokens=MAX_TOKENS) for p in PROMPTS]
    own_tau = sum(o.stats.new_tokens for o in outs) / sum(o.stats.target_forwards for o in outs)
    llm = engines(pair, "tli")
    before = stats(llm)
    got = greedy(llm, token_prompts(target_dir, PROMPTS))
    assert got == [o.token_ids for o in outs]
    tau = xvocab.vllm.stats_delta(before, stats(llm))["tau"]
    # vLLM's prefill forward carries no proposal (xvocab's first forward verifies one): one forward more per request.
    own_in_vllm = sum(o.stats.new_tokens for o in outs) / sum(o.stats.target_forwards + 1 for o in outs)
    assert own_in_vllm - 0.05 <= tau <= own_tau + 0.05, (tau, own_in_vllm, own_tau)


def sampled_pvalue(llm, target_dir, params, n=N):
    """p-value of n sequences of TOKENS tokens sampled through `llm` (request i seeded i) against the target's law."""
    target, tt = xvocab.zoo.model(str(target_dir))
    exact = exact_distribution(target, tt, PROMPT, params, TOKENS)
    sampling = [vllm.SamplingParams(temperature=params.temperature, top_k=params.top_k or -1, top_p=params.top_p,
                                    max_tokens=TOKENS, ignore_eos=True, seed=i) for i in range(n)]
    prompt = token_prompts(target_dir, [PROMPT])[0]
    outs = llm.generate([prompt] * n, sampling, use_tqdm=False)
    import collections

    counts = collections.Counter(tuple(o.outputs[0].token_ids) for o in outs)
    return chi_square_pvalue(counts, exact, n)


def test_sampled_output_follows_the_target_and_the_negative_control_fails(pairs, engines):
    """At T = 0.7 over a top-p nucleus, vLLM verifies xvocab's point proposals with the target's probability: the
    sampled law is the target's, as vLLM's own ar's is. Negative control: the same proposer with vLLM's CPU sampler
    left as it ships (repair_vllm=False: xvocab.vllm.repairs) must fail, and does: vLLM 0.32's CPU build verifies
    every sampled draft under garbage temperatures and nuclei, whatever the proposer (its ngram too)."""
    pair, params = PAIRS[0], SETTINGS["T0.7-top_p0.95"]
    target_dir = pairs[pair][0]
    assert sampled_pvalue(engines(pair, "ar"), target_dir, params) >= ALPHA  # vLLM alone: the test's baseline
    llm = engines(pair, "slem")
    before = stats(llm)
    p = sampled_pvalue(llm, target_dir, params)
    assert p >= ALPHA, f"p = {p:.2e}: the sampled law is not the target's"
    assert xvocab.vllm.stats_delta(before, stats(llm))["accepted"] > 0  # proposals were accepted along the way
    assert repairs.KERNEL in stats(llm)["repaired"]  # (this vLLM has the defect: the control below shows it)
    control = engines(pair, "slem", repair_vllm=False)
    p_control = sampled_pvalue(control, target_dir, params)
    assert p_control < ALPHA, f"the control passed (p = {p_control:.2e}): the test cannot tell"


@pytest.mark.slow  # (each refusal is tested without vLLM in tests/test_vllm_proposer.py; here: it reaches the user)
def test_a_setting_it_cannot_keep_exact_stops_the_engine_at_start_up(pairs, capfd):
    target_dir, draft_dir = pairs[PAIRS[0]]
    args = xvocab.vllm.engine_args(draft=str(draft_dir), algorithm="slrs")
    with pytest.raises(Exception):
        vllm.LLM(model=str(target_dir), dtype="float32", enforce_eager=True, max_model_len=512, max_num_seqs=2, **args)
    captured = capfd.readouterr()  # (vLLM's workers log to stdout)
    assert "xvocab.errors.ConfigError: algorithm='slrs'" in captured.out + captured.err


def fuzz_requests(target_dir, n: int, seed: int = 0):
    """`n` (prompt, SamplingParams) pairs a server meets from clients it does not control (seeded): prompts of
    specials only (a lone BOS, UNK, BOS EOS), byte-fallback bytes, unicode edge cases (a lone combining mark, \\r\\n,
    astral characters, invalid UTF-8 as raw byte tokens), prompts longer than the draft's row, plain code and prose;
    with greedy and sampled requests side by side, top-p, top-k, max_tokens=1, stop strings, n > 1, an EOS forced
    as the first token (allowed_token_ids), seeds."""
    import random

    tt = xvocab.zoo.tokenizer(str(target_dir))
    rng = random.Random(seed)
    bos, eos, unk = tt.bos_token_id, tt.eos_token_id, tt.unk_token_id
    byte_ids = [tt.convert_tokens_to_ids(f"<0x{b:02X}>") for b in (0x00, 0x0A, 0xC3, 0xE2, 0xFF, 0x80)]
    texts = ["def fibonacci(n):", "The quick brown fox", "\u0301", "a\r\nb\r\n", "\U0001F600 \U00010348 ok",
             "é\u0301\u0302", "\t\t  \n\n", "import os\nimport sys\n", "x = 'unterminated", "Once upon a time",
             "class Stack:\n    def push(self, x):", "    " * 20, "\u200b\ufeff zero width", "日本語のテキスト"]
    kinds = ["bos", "unk", "bos_eos", "bytes", "text", "text", "text", "long", "mixed"]
    out = []
    for _ in range(n):
        kind = rng.choice(kinds)
        if kind == "bos":
            ids = [bos]
        elif kind == "unk":
            ids = [unk]
        elif kind == "bos_eos":
            ids = [bos, eos]
        elif kind == "bytes":
            ids = [bos] + [rng.choice(byte_ids) for _ in range(rng.randint(1, 6))]
        elif kind == "long":
            ids = prompt_ids(tt, "x = 1\n" * rng.randint(60, 75))  # past the draft's row (fuzz engine's budget)
        elif kind == "mixed":
            ids = prompt_ids(tt, rng.choice(texts)) + [rng.choice(byte_ids), eos] + prompt_ids(tt, rng.choice(texts))[1:]
        else:
            ids = prompt_ids(tt, rng.choice(texts))
        mode = rng.choice(["greedy", "greedy", "greedy", "sampled", "top_k", "top_k1", "hot", "one", "stop", "n2",
                           "eos_first"])
        max_tokens = rng.randint(1, 24)
        args = dict(temperature=0.0, max_tokens=max_tokens, seed=rng.randint(0, 10**6))
        if mode == "sampled":
            args |= dict(temperature=0.7, top_p=0.9)
        elif mode == "top_k":
            args |= dict(temperature=0.8, top_k=20)
        elif mode == "top_k1":
            args |= dict(temperature=1.0, top_k=1)
        elif mode == "hot":
            args |= dict(temperature=1.5, top_p=0.5, top_k=5)
        elif mode == "one":
            args |= dict(max_tokens=1)
        elif mode == "stop":
            args |= dict(stop=["\n", "e"], include_stop_str_in_output=rng.random() < 0.5)
        elif mode == "n2":
            args |= dict(temperature=0.9, n=2)
        elif mode == "eos_first":
            args |= dict(allowed_token_ids=[eos])
        out.append(({"prompt_token_ids": ids}, vllm.SamplingParams(**args), mode))
    return out


def fuzz(engines, pairs, n: int):
    """Send the fuzz requests to xvocab's proposer (a draft budget small enough that long prompts outgrow its rows)
    and the greedy ones to vLLM's ar too: the engine answers every request, greedy outputs equal ar's, and the
    proposer recorded no failure (an input it mishandled would be counted there, not end the engine)."""
    from xvocab.vllm import budget

    pair = PAIRS[0]
    target_dir, draft_dir = pairs[pair]
    per_token = budget.bytes_per_token(xvocab.zoo.model(str(draft_dir))[0], "float32")
    gib = 8 * 320 * per_token / budget.GIB  # 8 rows of 320 draft positions
    llm = engines(pair, "slem", draft_memory_gib=gib)  # (policy off: every request drafts, the counts below hold)
    requests = fuzz_requests(target_dir, n)
    before = stats(llm)
    outs = llm.generate([p for p, _, _ in requests], [s for _, s, _ in requests], use_tqdm=False)
    assert len(outs) == n and all(len(o.outputs) == s.n for o, (_, s, _) in zip(outs, requests))
    greedy_at = [i for i, (_, s, _) in enumerate(requests) if s.temperature == 0]
    want = engines(pair, "ar").generate([requests[i][0] for i in greedy_at], [requests[i][1] for i in greedy_at],
                                        use_tqdm=False)
    for i, w in zip(greedy_at, want):
        assert list(outs[i].outputs[0].token_ids) == list(w.outputs[0].token_ids), requests[i]
    after = stats(llm)
    assert after["failures"] == {}, after["failures"]
    run = xvocab.vllm.stats_delta(before, after)
    assert run["proposed_tokens"] > 0 and run["accepted"] > 0
    assert after["draft_cache_bytes"] <= after["draft_memory_budget_bytes"]
    assert after["skipped"]["draft_context_full"] > before["skipped"]["draft_context_full"]
    assert after["skipped"]["waiting_for_text"] > before["skipped"]["waiting_for_text"]
    alive = greedy(llm, token_prompts(target_dir, PROMPTS[:1]))  # the engine still serves
    assert alive == greedy(engines(pair, "ar"), token_prompts(target_dir, PROMPTS[:1]))


def test_fuzz_slice_no_request_takes_the_engine_down_and_greedy_rows_equal_ar(pairs, engines):
    fuzz(engines, pairs, 120)


@pytest.mark.slow
def test_fuzz_600_requests_no_request_takes_the_engine_down_and_greedy_rows_equal_ar(pairs, engines):
    fuzz(engines, pairs, 600)


def test_vllms_top_k_mask_fails_on_a_step_without_drafts_and_the_repair_passes_it_through():
    """The defect the fuzz test found (xvocab.vllm.repairs.check_and_repair's second): vLLM's own top-k mask raises on
    a batch of no rows (the control: this vLLM as it ships), the repaired one returns it, and masks any other batch
    exactly as vLLM's does."""
    import torch
    from vllm.v1.sample.ops import topk_topp_sampler

    original = topk_topp_sampler.apply_top_k_only
    if getattr(topk_topp_sampler.apply_top_k_only, "xvocab_repair", False):
        pytest.skip("repaired in this process already")  # (an engine in this process ran check_and_repair)
    with pytest.raises(RuntimeError):
        original(torch.zeros(0, 8), torch.zeros(0, dtype=torch.int64))
    guarded = repairs._top_k_guarded(original)
    empty = torch.zeros(0, 8)
    assert guarded(empty, torch.zeros(0, dtype=torch.int64)) is empty
    logits, k = torch.randn(3, 50, generator=torch.Generator().manual_seed(0)), torch.tensor([1, 5, 50])
    assert torch.equal(guarded(logits.clone(), k.clone()), original(logits.clone(), k.clone()))


@pytest.mark.slow
def test_tensor_parallel_2_greedy_output_equals_ar_at_tp_1(pairs, engines):
    """tensor_parallel_size=2 on vLLM's CPU backend (one core a rank): every rank builds the proposer and drafts the
    same proposal from the same committed ids (greedy drafting is deterministic on one machine); vLLM takes the output
    rank's and sends it to every rank to verify, so what is emitted is vLLM's verification of a deterministic
    proposal: lossless whichever rank's it was. Greedy rows equal TP = 1's ar."""
    import multiprocessing

    if multiprocessing.cpu_count() < 2:
        pytest.skip("tensor parallel 2 needs two cores")
    pair = PAIRS[0]
    target_dir, draft_dir = pairs[pair]
    prompts = token_prompts(target_dir, PROMPTS[:3])
    want = greedy(engines(pair, "ar"), prompts)
    old = os.environ.get("VLLM_CPU_OMP_THREADS_BIND")
    os.environ["VLLM_CPU_OMP_THREADS_BIND"] = "0|1"  # one core a rank
    try:
        llm = vllm.LLM(model=str(target_dir), dtype="float32", enforce_eager=True, max_model_len=512, max_num_seqs=4,
                       seed=0, tensor_parallel_size=2, distributed_executor_backend="mp",
                       **xvocab.vllm.engine_args(draft=str(draft_dir), algorithm="slem", load_policy="off"))
        try:
            got = greedy(llm, prompts)
            ranks = llm.collective_rpc(xvocab.vllm.worker_stats)
        finally:
            llm.llm_engine.engine_core.shutdown()
    finally:
        if old is None:
            os.environ.pop("VLLM_CPU_OMP_THREADS_BIND", None)
        else:
            os.environ["VLLM_CPU_OMP_THREADS_BIND"] = old
    assert got == want
    assert len(ranks) == 2 and all(r["proposed_tokens"] > 0 for r in ranks)  # every rank drafted
    assert ranks[0]["accepted"] > 0


@pytest.mark.slow
def test_vllm_serve_survives_the_fuzz_and_clients_that_disconnect_mid_stream(pairs, engines, tmp_path):
    """`vllm serve` with xvocab's proposer: 150 fuzz requests through the OpenAI-compatible API, streamed, a third of
    the clients hanging up after their first chunk; afterwards the server is healthy, its greedy answers equal vLLM's
    ar, and the proposer (its stats_file) recorded no failure."""
    import asyncio
    import json
    import random
    import subprocess
    import sys
    import urllib.request

    import aiohttp

    from experiments.vllm.serve_check import wait_healthy

    pair = PAIRS[0]
    target_dir, draft_dir = pairs[pair]
    stats_file = tmp_path / "stats.json"
    port = 8349
    command = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(target_dir), "--port",
               str(port), "--host", "127.0.0.1", "--dtype", "float32", "--enforce-eager", "--max-model-len", "512",
               "--max-num-seqs", "8", "--speculative-config",
               json.dumps({"method": "custom_class", "model": "xvocab.vllm.Proposer", "num_speculative_tokens": 4}),
               "--additional-config", json.dumps({"xvocab": {"draft": str(draft_dir), "stats_file": str(stats_file)}})]
    log = open(tmp_path / "server.log", "w")
    server = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    rng = random.Random(1)
    requests = fuzz_requests(target_dir, 150, seed=1)

    async def send(session, prompt, params, hang_up):
        body = {"model": str(target_dir), "prompt": prompt["prompt_token_ids"], "max_tokens": params.max_tokens,
                "temperature": params.temperature, "top_p": params.top_p, "top_k": params.top_k, "n": params.n,
                "stream": True, "seed": params.seed}
        if params.stop:
            body["stop"] = params.stop
        if params.allowed_token_ids:
            body["allowed_token_ids"] = params.allowed_token_ids
        async with session.post(f"http://127.0.0.1:{port}/v1/completions", json=body) as response:
            async for _ in response.content:
                if hang_up:
                    return "hung up"  # leaving the block closes the connection mid-stream
            return response.status

    async def drive():
        gate = asyncio.Semaphore(8)
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600)) as session:
            async def one(p, s):
                async with gate:
                    return await send(session, p, s, rng.random() < 1 / 3)
            return await asyncio.gather(*(one(p, s) for p, s, _ in requests), return_exceptions=True)

    try:
        wait_healthy(port, server, timeout=300)
        answers = asyncio.run(drive())
        assert all(a in (200, "hung up") for a in answers), [a for a in answers if a not in (200, "hung up")][:3]
        assert urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=10).status == 200
        prompts = token_prompts(target_dir, PROMPTS[:3])
        params = vllm.SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS)
        want = [o.outputs[0].text for o in engines(pair, "ar").generate(prompts, params, use_tqdm=False)]
        for p, w in zip(prompts, want):  # (vLLM's own detokenizer on both sides)
            body = json.dumps({"model": str(target_dir), "prompt": p["prompt_token_ids"], "max_tokens": MAX_TOKENS,
                               "temperature": 0}).encode()
            request = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", data=body,
                                             headers={"Content-Type": "application/json"})
            choice = json.loads(urllib.request.urlopen(request, timeout=120).read())["choices"][0]
            assert choice["text"] == w
        import time

        time.sleep(1)
        stats = json.loads(stats_file.read_text())
        assert stats["failures"] == {} and stats["proposed_tokens"] > 0
    finally:
        os.killpg(server.pid, 15)
        server.wait(60)
        log.close()
