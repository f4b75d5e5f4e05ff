"""xvocab beside a peer (transformers: vs_hf) and beside itself (batch sizes, translation cost);
experiments/README.md."""
