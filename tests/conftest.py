"""Shared fixtures. In CI (CI=true) a missing asset is a failure; elsewhere the zoo fetches it."""
import os

import pytest
import torch

# Every decoder the suite builds checks the positions its callers count against the ids it holds
# (xvocab.runtime.kv.Ask): a rewind the loop, its commit or the vLLM proposer forgot to count fails the test that hit
# it, where it would otherwise decode from a stale state. Set before any decoder exists, and inherited by vLLM's
# engine processes.
os.environ.setdefault("XVOCAB_CHECK_POSITIONS", "1")


def pytest_collection_modifyitems(config, items):
    # XVOCAB_TEST_DEVICE=cpu runs the gpu-marked tests on the CPU: a dry run of their logic before a GPU session
    # (no graph is captured there; experiments/gpu/session.sh sets it with DEVICE=cpu).
    if torch.cuda.is_available() or os.environ.get("XVOCAB_TEST_DEVICE") == "cpu":
        return
    skip_gpu = pytest.mark.skip(reason="needs CUDA (or XVOCAB_TEST_DEVICE=cpu for a dry run of the tests' logic)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)


@pytest.fixture(autouse=True)
def _threads():
    # The cores are shared among pytest-xdist's workers (`-n N`), so N workers never oversubscribe them.
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    torch.set_num_threads(max(1, min(2, os.cpu_count() or 1) // workers))
