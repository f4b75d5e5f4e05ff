"""Helpers shared by the test modules: tiny mirrored pairs over real tokenizers, resized heads, made-up policy
costs. The exact-reference chi-square every sampled-sequence test uses is xvocab.checks.lossless (one place for its
rule)."""
from __future__ import annotations

import copy
import dataclasses

import torch

import xvocab
from xvocab import algorithms
from xvocab.measure.policy import Costs, Policy
from xvocab.zoo.tiny import mirror_model

# The suites' algorithm lists, from the registry (a new algorithm joins every suite that runs these).
CROSS = algorithms.names(cross_vocabulary=True)   # every algorithm over two vocabularies: slem, tli, slrs, rdk, lookup_slem, lookup_tli
ALL = ("ar",) + CROSS                             # with the baseline


def patch_drafter(monkeypatch, name: str, draft) -> None:
    """Swap the drafter of the registry's entry `name` (the one place an algorithm's drafter lives) for `draft`,
    undone after the test."""
    monkeypatch.setitem(algorithms.REGISTRY, name, dataclasses.replace(algorithms.get(name), draft=draft))


drafting = algorithms.draft_arguments  # generate()'s draft arguments for an algorithm (none for ar and lookup)


def mirrored_pairs(pairs, seed=1) -> dict:
    """{(target, draft): (tiny target over the target tokenizer, its tokenizer, its mirror over the draft
    tokenizer, that tokenizer)}: a cross-vocabulary pair that agrees wherever the tokenizers do."""
    out = {}
    for target, draft in pairs:
        tt, dt = xvocab.zoo.tokenizer(target), xvocab.zoo.tokenizer(draft)
        model = xvocab.zoo.tiny_model(tt, seed=seed)
        out[target, draft] = (model, tt, mirror_model(model, tt, dt), dt)
    return out


def resized(model, n_rows, seed=0):
    """A copy of `model` with n_rows embedding/head rows (a checkpoint whose head is padded past its
    tokenizer, or cut): new input rows random, new output rows strongly negative, as padding rows of a
    real checkpoint are never predicted."""
    out = copy.deepcopy(model)
    old = out.get_output_embeddings().weight.shape[0]
    if n_rows == old:
        return out
    out.resize_token_embeddings(n_rows, mean_resizing=False)
    with torch.no_grad():
        if n_rows > old:
            out.get_output_embeddings().weight[old:] = -out.get_output_embeddings().weight[:old].abs().mean()
            gen = torch.Generator().manual_seed(seed)
            emb = out.get_input_embeddings().weight
            emb[old:] = torch.randn(n_rows - old, emb.shape[1], generator=gen) * emb[:old].std()
    out.config.vocab_size = n_rows
    return out.eval()


def policy_costs(draft_s, target_s, k=4, sizes=(1, 4)):
    """Made-up xvocab.measure.policy.Costs: draft and target seconds growing with the batch size and the target's
    tokens."""
    return Costs(draft={b: draft_s * b ** 0.5 for b in sizes},
                 target={b: {n: target_s * (1 + 0.1 * n) * b ** 0.5 for n in range(1, k + 2)} for b in sizes})


def flipping_policy() -> Policy:
    """A policy whose choice swings with the last round's acceptance: k = 0, short and long drafts all occur."""
    return Policy(policy_costs(0.25, 1.0, sizes=(1, 2, 4)), prior=0.5, window=1, probe_every=2)


# ------------------------------------------------------------------ host <-> device traffic, counted on the CPU

class TransferCounter(torch.overrides.TorchFunctionMode):
    """Counts, on the CPU, every call that would block the host on CUDA (xvocab.runtime.host):

    * reads: xvocab.runtime.host.read / argmax_ids, one each (the tensor operations inside them are that read);
    * stray: any other read of a tensor's values (item, tolist, bool, int, float, index, numpy, cpu), an upload of
      Python data (torch.tensor / as_tensor given a device) or indexing with a Python list (an index upload);
    * replayed: stray calls inside xvocab.runtime.host.device_side(), which on CUDA is a graph replay: any there would
      break capture (and cannot happen at replay, so they are kept apart from the step's count).

    `marks` split the count into intervals: `mark(label)` closes the running interval under that label."""

    READS = {torch.Tensor.item, torch.Tensor.tolist, torch.Tensor.__bool__, torch.Tensor.__int__,
             torch.Tensor.__float__, torch.Tensor.__index__, torch.Tensor.numpy, torch.Tensor.cpu}
    UPLOADS = {torch.tensor, torch.as_tensor}

    def __init__(self):
        super().__init__()
        self.stray: list[str] = []
        self.replayed: list[str] = []
        self.intervals: list[tuple[str, int]] = []  # (label, blocking transfers since the previous mark)
        self._reads0 = self._open = 0

    def __enter__(self):
        from xvocab.runtime import host

        self._reads0 = host.STATE.reads
        return super().__enter__()

    @property
    def reads(self) -> int:
        from xvocab.runtime import host

        return host.STATE.reads - self._reads0

    @property
    def blocking(self) -> int:
        return self.reads + len(self.stray)

    def mark(self, label: str) -> None:
        self.intervals.append((label, self.blocking - self._open))
        self._open = self.blocking

    def __torch_function__(self, func, types, args=(), kwargs=None):
        from xvocab.runtime import host

        kwargs = kwargs or {}
        if not host.STATE.reading:
            what = None
            if func in self.READS:
                what = func.__name__
            elif func in self.UPLOADS and kwargs.get("device") is not None:
                what = f"{func.__name__}(device=)"
            elif func is torch.Tensor.__getitem__ and _holds_list(args[1]):
                what = "index with a list"
            if what is not None:
                import traceback

                frame = next((f for f in reversed(traceback.extract_stack()[:-1]) if "/xvocab/" in f.filename),
                             None)
                where = f"{what} at {frame.filename.rsplit('/xvocab/', 1)[-1]}:{frame.lineno}" if frame else what
                (self.replayed if host.STATE.device_side else self.stray).append(where)
        return func(*args, **kwargs)


def _holds_list(index) -> bool:
    return isinstance(index, list) or (isinstance(index, tuple) and any(isinstance(i, list) for i in index))


def count_transfers(monkeypatch) -> TransferCounter:
    """A TransferCounter (use it as a context manager) whose intervals end at every BatchDecoder.step: an
    interval labelled "fixed" is one fixed-shape step (a graph replay on CUDA), "wide" one wider step (a
    prompt's prefill, run eagerly everywhere), "between" what happened since the previous step (a drafter
    reading its token, a verification reading the target's choices, the host's own work)."""
    from xvocab.runtime.batch_kv import BatchDecoder

    counter = TransferCounter()
    step, fixed = BatchDecoder.step, BatchDecoder._fixed
    calls = [0]

    def counted_fixed(self, *args):
        calls[0] += 1
        return fixed(self, *args)

    def counted(self, asks):
        counter.mark("between")
        before = calls[0]
        out = step(self, asks)
        counter.mark("fixed" if calls[0] > before else "wide")
        return out

    monkeypatch.setattr(BatchDecoder, "step", counted)
    monkeypatch.setattr(BatchDecoder, "_fixed", counted_fixed)
    return counter
