"""The graph path's traffic with the host, counted on the CPU (xvocab.runtime.host; _support.TransferCounter).

On CUDA every read of a device value, every upload from pageable memory and every index by a Python list
blocks the host: each costs about what a whole replayed drafter step does. The graph path must block once per
draft step (the drafted id) and once per verification (the target's choices), never inside a fixed-shape step
(a graph replay there: a blocking call would break its capture), and its fixed-shape inputs must keep their
addresses from capture to capture (a graph reads them by address).
"""
import pytest
import torch
from _support import count_transfers, mirrored_pairs

import xvocab
from xvocab.verification import verify as rules
from xvocab.runtime.batch_kv import BUCKETS, BatchDecoder, DecoderPool

PAIRS = [("starcoder", "refact"), ("qwen2", "llama-bpe")]


@pytest.fixture(scope="module")
def pairs():
    return mirrored_pairs(PAIRS)


def _decode_counted(monkeypatch, pair, alg, prompt="def f(x):\n    return", n=16):
    model, tt, draft, dt = pair
    counter, pool = count_transfers(monkeypatch), DecoderPool()
    with counter:
        out = xvocab.generate(prompt, target=model, target_tokenizer=tt, algorithm=alg, k=4, max_new_tokens=n,
                              cache="graph", decoders=pool,
                              **({} if alg == "ar" else {"draft": draft, "draft_tokenizer": dt}))
    counter.mark("end")
    counter.held = sum(d.held for d in pool.kept)  # logits a decoder answered from what it kept: read, no step
    return out, counter


@pytest.mark.parametrize("pair_name", PAIRS, ids="-".join)
@pytest.mark.parametrize("alg", ["ar", "slem", "tli"])
def test_greedy_graph_path_blocks_once_per_step(monkeypatch, pairs, alg, pair_name):
    out, counter = _decode_counted(monkeypatch, pairs[pair_name], alg)
    assert len(out.token_ids) == 16
    steps = [n for label, n in counter.intervals if label == "fixed"]
    between = [n for label, n in counter.intervals if label in ("between", "end")]
    # Every step took the fixed shapes: each forward the stats count, and the target prompt's prefill when drafting.
    # (ar's first token and the draft's first proposal read their prompt's prefill: counted as those forwards.)
    assert len(steps) == out.stats.target_forwards + out.stats.draft_forwards + (alg != "ar")
    assert counter.replayed == [], counter.replayed      # nothing in a replayed region needs the host
    assert steps == [0] * len(steps), counter.stray      # a fixed-shape step uploads without blocking
    # The first interval is the pair's setup (tables built once per pair, before any step); after it, each
    # interval between two steps holds at most one blocking transfer, and the decode reads once per logits it
    # gets: a step's, or kept ones (a draft re-synced to a prefix it read).
    assert max(between[1:]) <= 1, (counter.intervals, counter.stray)
    assert counter.blocking - between[0] <= len(steps) + counter.held


def test_the_counter_sees_a_blocking_upload(monkeypatch, pairs):
    """Negative control: verification that uploads the proposal again (as it did before) is seen: two blocking
    transfers between two steps."""
    verify = rules.verify_proposal

    def reuploading(logits, ids, *args, **kwargs):
        torch.tensor(ids, dtype=torch.long, device=logits.device)
        return verify(logits, ids, *args, **kwargs)

    monkeypatch.setattr(rules, "verify_proposal", reuploading)
    _, counter = _decode_counted(monkeypatch, pairs[PAIRS[0]], "slem")
    assert max(n for label, n in counter.intervals[1:] if label != "fixed") == 2
    assert any("torch.tensor" not in s and "tensor(device=)" in s for s in counter.stray)


def test_the_counter_sees_a_read_inside_a_replayed_step(monkeypatch, pairs):
    """Negative control: a value read inside the fixed-shape forward (which CUDA replays) is reported apart."""
    model, tt, _, _ = pairs[PAIRS[0]]
    forward = BatchDecoder._forward

    def peeking(self, ids, slots, keep):
        int(slots[0, 0])
        return forward(self, ids, slots, keep)

    monkeypatch.setattr(BatchDecoder, "_forward", peeking)
    counter = count_transfers(monkeypatch)
    with counter:
        xvocab.generate("x = 1", target=model, target_tokenizer=tt, algorithm="ar", max_new_tokens=3, cache="graph")
    assert counter.replayed and all(s.startswith("__int__") for s in counter.replayed)


def test_fixed_step_inputs_keep_their_identity_across_widths(pairs):
    """Every tensor a fixed-shape step hands the model (ids, slots, rows: what a captured graph reads by address)
    is the same object each time that width runs, whatever other widths ran between; rows is one tensor for all.
    Before, every capture made a new rows tensor and freed the previous one while earlier graphs still read it."""
    model, _, _, _ = pairs[PAIRS[0]]
    dec = BatchDecoder(model, 2, 64, graphs=True)
    rows0 = dec._all_rows
    seen: dict[int, tuple] = {}
    forward = dec._forward

    def recording(ids, slots, keep):
        got = (ids.data_ptr(), slots.data_ptr(), id(dec.plan["rows"]), id(dec.plan["slots"]))
        assert seen.setdefault(ids.shape[1], got) == got, f"width {ids.shape[1]}: inputs moved"
        assert dec.plan["rows"] is rows0
        return forward(ids, slots, keep)

    dec._forward = recording
    gen = torch.Generator().manual_seed(0)
    seq = torch.randint(5, 900, (60,), generator=gen).tolist()
    dec.step({0: (seq[:5], []), 1: (seq[:3], [])})
    at = 5
    for width in (1, 3, 8, 1, 5, 2, 8, 1):  # verifications of several widths, with rollbacks between
        dec.step({0: (seq[:at], seq[at:at + width - 1]), 1: (seq[:3 + width], [])})
        at += 1
    assert len(seen) >= 3 and set(seen) == set(dec._inputs) and set(seen) <= set(BUCKETS)


def test_growing_the_cache_drops_the_graphs_and_their_pool(pairs):
    model, _, _, _ = pairs[PAIRS[0]]
    dec = BatchDecoder(model, 1, 8, graphs=True)
    dec.step({0: ([1, 2, 3], [])})
    dec._graphs[1], dec._pool = ("a graph over the old buffers", None), "its pool"
    dec.step({0: (list(range(1, 12)), [])})  # past the 8 positions allocated: the buffers grow
    assert dec.capacity >= 12 and dec._graphs == {} and dec._pool is None


@pytest.mark.parametrize("alg", ["slem", "tli"])
def test_decoders_kept_between_calls_change_no_output(pairs, alg):
    """A DecoderPool hands the same decoders (and on CUDA their graphs) to every call: each call's output equals a
    call with fresh decoders, for prompts of other lengths, after capture_all, greedy and sampled alike."""
    from xvocab.runtime.batch_kv import DecoderPool

    model, tt, draft, dt = pairs[PAIRS[1]]
    kw = dict(target=model, target_tokenizer=tt, draft=draft, draft_tokenizer=dt, algorithm=alg, k=4,
              max_new_tokens=12, cache="graph")
    pool = DecoderPool()
    kept = None
    for i, (prompt, temperature) in enumerate([("def f(x):", 0.0), ("import os\nprint(os.sep)", 1.0),
                                               ("x", 0.0), ("class A:\n    pass\n" * 3, 1.0)]):
        fresh = xvocab.generate(prompt, temperature=temperature, seed=i, **kw)
        pooled = xvocab.generate(prompt, temperature=temperature, seed=i, decoders=pool, **kw)
        assert pooled.token_ids == fresh.token_ids, (prompt, temperature)
        decs = tuple(pool._kept.values())
        assert kept is None or decs == kept  # the same decoder objects, call after call
        kept = decs
        if i == 0:
            for dec in decs:
                dec.capture_all()
                assert set(dec._inputs) == set(BUCKETS)
    assert len(kept) == 2  # one for the target, one for the draft


def test_decoders_without_the_graph_cache_are_refused(pairs):
    from xvocab.errors import ConfigError
    from xvocab.runtime.batch_kv import DecoderPool

    model, tt, _, _ = pairs[PAIRS[0]]
    with pytest.raises(ConfigError, match="cache='graph'"):
        xvocab.generate("x", target=model, target_tokenizer=tt, algorithm="ar", decoders=DecoderPool())
