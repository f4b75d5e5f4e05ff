"""Every default of xvocab, in one place.

`xvocab.generate` takes its keyword defaults from here; conf/config.yaml leaves these keys null,
meaning "the library's default", and experiments.sweep.runner fills them from here (`fill`); the scripts'
options default to these names. An experiment that wants another value sets it explicitly in its
config or on the command line.
"""
from __future__ import annotations

ALGORITHM = "slem"
K = 4                   # draft length: tokens proposed per verification
MAX_NEW_TOKENS = 128
TEMPERATURE = 0.0       # 0: greedy
TOP_K = 0               # 0: off
TOP_P = 1.0             # 1: off
SEED = 0
DRAFT_CONFIDENCE = 0.0  # > 0: stop a draft after a token the draft gives less probability (0: always k)
DRAFT_WINDOW = 0        # > 0: the draft reads only the last this many ids of its prompt (0: the whole prompt)
CACHE = "dynamic"       # where states live: dynamic (the reference) | static (pre-allocated, for CUDA graphs)
THREADS = 2             # CPU threads experiments pin, so timings compare across runs
DRAFT_TEMPERATURE = None  # the draft samples at the target's temperature unless told otherwise
COUPLING = "none"       # "gumbel": slem's draft and the target's samples race on shared noise (verification.coupling)
BATCH_SIZE = 1          # prompts an experiment decodes together (xvocab.generate_batch above 1)
POLICY = False          # experiments: choose k per round from costs and acceptance (xvocab.measure.policy)
# The default pair: Gemma 3 270M and the drafter distilled for it, shipped in xvocab/zoo/drafters/.
TARGET = "gemma-3-270m"
DRAFT = "gemma-3-270m-drafter-deepseek-coder-aligned-v5"

# Run-config keys that mean the library's default when null.
RUN_KEYS = {"k": K, "max_new_tokens": MAX_NEW_TOKENS, "temperature": TEMPERATURE, "top_k": TOP_K, "top_p": TOP_P,
            "seed": SEED, "draft_confidence": DRAFT_CONFIDENCE, "draft_window": DRAFT_WINDOW,
            "draft_temperature": DRAFT_TEMPERATURE,
            "coupling": COUPLING, "threads": THREADS, "cache": CACHE, "batch_size": BATCH_SIZE, "policy": POLICY}


def fill(cfg: dict) -> dict:
    """`cfg` with every null RUN_KEYS entry replaced by the library's default."""
    return cfg | {key: value for key, value in RUN_KEYS.items() if cfg.get(key) is None}
