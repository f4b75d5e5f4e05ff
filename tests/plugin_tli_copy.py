"""An algorithm plugin as a research script writes one (README, "Adding an algorithm"): a module that registers an
entry when imported. Named in XVOCAB_PLUGINS, or in the vLLM proposer's `plugins` setting, it reaches every process
that imports xvocab (tests/test_registry.py, tests/test_vllm_proposer.py)."""
import dataclasses

from xvocab.algorithms import get, register

# TLI under another name, served by vLLM as TLI is: proposals are the intersection's greedy point proposals.
register(dataclasses.replace(get("tli"), name="tli-copy", summary="tli, registered by a plugin module"))
