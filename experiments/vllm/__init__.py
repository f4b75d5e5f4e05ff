"""The vLLM harnesses: xvocab's proposer inside vLLM against vLLM alone and its own methods; experiments/README.md."""
