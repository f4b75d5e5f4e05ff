"""Checks over many cases: losslessness over tokenizer pairs, other libraries' sampling, the import graph;
experiments/README.md."""
