"""tests/vllm_engine/ runs xvocab's proposer inside vLLM: only where vLLM is installed (its own environment, `make
test-vllm`, part of `make test`). XVOCAB_REQUIRE_VLLM=1 (set by the Makefile) makes a missing vLLM an error rather
than a skipped directory, so CI cannot pass without running them."""
import importlib.util
import os

# (vllm.entrypoints, not vllm: a directory named vllm on sys.path would pass for the package)
if importlib.util.find_spec("vllm") is None or importlib.util.find_spec("vllm.entrypoints") is None:
    if os.environ.get("XVOCAB_REQUIRE_VLLM") == "1":
        raise RuntimeError("XVOCAB_REQUIRE_VLLM=1 but vLLM is not installed in this environment: run make vllm-setup")
    collect_ignore_glob = ["*.py"]  # the main environment has no vLLM: nothing here to run there
