#!/usr/bin/env bash
# One GPU session (issue 14): the gpu-marked tests, then experiments.gpu_bench, in one go (a few minutes on one GPU).
#
# Here first:   make gpu-carry       # gpu_carry/: transformers 5.24 + regex wheels, the tokenizers the tests and
#                                    #   the benchmark read (git-ignored; about 20 MB)
# On the GPU (the device tool, from the repository root, carrying gpu_carry):
#               OUT=$OUT bash experiments/gpu_session.sh
# OUT receives versions.txt, gpu_tests.txt, gpu_bench.md/.txt and records.jsonl.
set -uo pipefail
OUT=${OUT:-runs/gpu_session}
mkdir -p "$OUT" /tmp/site /tmp/xvocab-cache
if ls gpu_carry/wheels/*.whl > /dev/null 2>&1; then
  pip install -q --no-index --no-deps --target /tmp/site gpu_carry/wheels/*.whl
fi
if [ -f gpu_carry/xvocab-cache.tar.gz ]; then
  tar xzf gpu_carry/xvocab-cache.tar.gz -C /tmp/xvocab-cache
  export XVOCAB_CACHE=/tmp/xvocab-cache
fi
export PYTHONPATH=/tmp/site:$PWD
python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__,
torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'no CUDA')" | tee "$OUT/versions.txt"
timeout 240 python3 -m pytest -q -m gpu tests/test_cuda.py -p no:cacheprovider -s 2>&1 | tail -40 | tee "$OUT/gpu_tests.txt"
timeout 330 python3 -m experiments.gpu_bench --out "$OUT" 2>&1 | tail -60 | tee "$OUT/gpu_bench.txt"
