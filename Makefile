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

# Measures here, into runs/main (git-ignored, resumable), and prints the committed reference beside it.
demo: setup
	$(PY) -m experiments.run --multirun +experiment=main
	$(PY) -m experiments.report runs/main --reference results/main

# Every asset first (in CI a missing one fails here), then the default suite (slow tests: -m slow).
test: setup
	$(PY) -m xvocab.zoo fetch
	$(PY) -m pytest -q

# What a GPU session carries (experiments/gpu_session.sh): transformers 5.24 and regex wheels, and the converted
# tokenizers tests/test_cuda.py and experiments.gpu_bench read. gpu_carry/ is git-ignored.
GPU_TOKENIZERS := starcoder refact gemma-4 llama-bpe qwen2 deepseek-coder
gpu-carry: setup
	$(PY) -m xvocab.zoo fetch
	rm -rf gpu_carry && mkdir -p gpu_carry/wheels
	$(PY) -m pip download --quiet --no-deps --dest gpu_carry/wheels transformers==5.24.0 regex
	cd $$($(PY) -c "from xvocab.zoo.cache import cache_dir; print(cache_dir())") && \
	  tar czf $(CURDIR)/gpu_carry/xvocab-cache.tar.gz $(foreach t,$(GPU_TOKENIZERS),$$(ls -d tokenizers/$(t)-*v3 | tail -1))
	du -sh gpu_carry

.PHONY: setup demo test gpu-carry
