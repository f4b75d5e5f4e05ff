# Two entry points, both from a fresh clone: `make demo` (main job) and `make test`.
PY := .venv/bin/python

.venv/done: pyproject.toml
	python3 -m venv .venv
	.venv/bin/pip install --quiet torch==2.13.0
	.venv/bin/pip install --quiet -e ".[experiments,test]"
	$(PY) -m xvocab.zoo fetch
	touch .venv/done

setup: .venv/done

demo: setup
	$(PY) -m experiments.run --multirun +experiment=main
	$(PY) -m experiments.report results/main

test: setup
	$(PY) -m pytest -q

.PHONY: setup demo test
