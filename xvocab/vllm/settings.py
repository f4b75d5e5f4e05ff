"""What xvocab's vLLM proposer is asked to do, read from vLLM's own configuration and checked before any model loads.

What: vLLM builds a `custom_class` proposer from its `VllmConfig` alone, so xvocab's settings travel in vLLM's
`additional_config` under the key "xvocab" (`LLM(..., additional_config={"xvocab": {...}})`, or
`vllm serve ... --additional-config '{"xvocab": {...}}'`); the draft length is vLLM's own
`num_speculative_tokens`. `Settings.from_vllm_config` reads them and refuses, with an xvocab error naming the
fix, every configuration the proposer cannot keep lossless or cannot honour: no draft named, an unknown key,
an algorithm vLLM's custom-class path cannot verify, or a rejection-sampling mode of vLLM's that is not exact.

Why these refusals: vLLM verifies a custom proposer's tokens as point proposals (`draft_probs=None`: accept
t with probability p(t), else resample from p without t), which is exact for any proposal that is a
deterministic function of the committed text. SLEM and TLI with greedy drafting are; SLRS needs its psi
distribution verified and `sd` one vocabulary (vLLM's own `draft_model` method does that). vLLM's
"synthetic" sampler accepts by a schedule, not by p, and its "block" verifier was never checked here with
point proposals: both refused.

Invariant: a Settings value is complete and valid; every default comes from xvocab.defaults.
"""
from __future__ import annotations

from dataclasses import dataclass, fields

from xvocab import algorithms, defaults
from xvocab.alignment.aligned import ENCODINGS
from xvocab.errors import ConfigError
from xvocab.vllm.kernels import CHOICES as KERNELS
from xvocab.vllm.policy import MODES as POLICY_MODES

KEY = "xvocab"                 # the additional_config entry the settings live under

def served() -> tuple[str, ...]:
    """The registered algorithms vLLM's custom-class path can verify (point proposals, module docstring), as of now."""
    return algorithms.names(in_vllm=True)

DTYPES = ("float32", "bfloat16", "float16")
MAX_ROWS = 32                  # draft KV rows held at once (requests beyond them decode without proposals)
STATS_EVERY = 0.5              # seconds between two writes of stats_file
PREFILL_CHUNK = 512            # a new request's draft prompt is fed this many tokens a step, alone (vLLM chunks too)


@dataclass(frozen=True)
class Settings:
    draft: str                                   # zoo model or drafter name, hub id or local directory
    k: int                                       # vLLM's num_speculative_tokens: target ids proposed at most
    algorithm: str = defaults.ALGORITHM
    draft_steps: int | None = None               # draft tokens generated per proposal (None: k); SLEM's text may
                                                 # take more target ids than draft tokens, cut at k
    draft_encoding: str | None = None            # None: what the drafter was trained on (its config), else native
    draft_dtype: str | None = None               # None: the target's dtype in vLLM
    draft_kernels: str = "auto"                  # the draft's linears: vLLM's CPU kernels where they apply, or
                                                 # "vllm" (required), "torch" (stock) (xvocab.vllm.kernels)
    draft_confidence: float = defaults.DRAFT_CONFIDENCE
    draft_window: int = defaults.DRAFT_WINDOW
    target_tokenizer: str | None = None          # None: the served model's own (vLLM's tokenizer path)
    max_rows: int = MAX_ROWS
    repair_vllm: bool = True                     # repair vLLM defects that break sampled output (xvocab.vllm.repairs)
    draft_memory_gib: float | None = None        # the draft's KV budget (None: derived from vLLM's; xvocab.vllm.budget)
    load_policy: str = "measured"                # the draft length per step: measured here, or "off" (always k)
    draft_lengths: dict | None = None            # {batch size: k}, as vLLM's per-batch-size lengths (overrides policy)
    prefill_chunk: int = PREFILL_CHUNK           # draft prompt tokens prefilled per step, in a forward of their own
    stats_file: str | None = None                # where the worker writes stats() as JSON (atomically, at most
                                                 # every STATS_EVERY seconds while it serves): a server's stats
    step_trace: str | None = None                # a JSONL file the worker appends one line a step to: the batch, the
                                                 # policy's choice, the interval it was timed on and what the step
                                                 # paid for besides drafting (a diagnosis aid: a write a step)
    plugins: str | None = None                   # modules that register algorithms (comma-separated), imported
                                                 # wherever the settings are read, vLLM's workers included

    @staticmethod
    def from_vllm_config(vllm_config) -> "Settings":
        spec = vllm_config.speculative_config
        extra = getattr(vllm_config, "additional_config", None) or {}
        given = dict(extra.get(KEY) or {}) if isinstance(extra, dict) else {}
        names = [f.name for f in fields(Settings) if f.name != "k"]
        unknown = sorted(set(given) - set(names))
        if unknown:
            raise ConfigError(f"additional_config['{KEY}'] has unknown key(s) {unknown}; the keys are {names}")
        if not given.get("draft"):
            raise ConfigError(f"no draft model named: pass additional_config={{'{KEY}': {{'draft': NAME}}}} with a zoo "
                              f"name (python -m xvocab.zoo list), hub id or local directory; e.g. vllm serve TARGET "
                              f"--speculative-config '{{\"method\": \"custom_class\", \"model\": "
                              f"\"xvocab.vllm.Proposer\", \"num_speculative_tokens\": 4}}' --additional-config "
                              f"'{{\"{KEY}\": {{\"draft\": \"smollm2-135m\"}}}}'")
        algorithms.load_plugins(given.get("plugins") or "")  # (XVOCAB_PLUGINS was imported with xvocab itself)
        settings = Settings(k=int(spec.num_speculative_tokens), **given)
        settings.check()
        return settings

    def check(self) -> None:
        if self.algorithm not in served():
            spec = algorithms.REGISTRY.get(self.algorithm)  # what the entry says decides the reason
            why = ("it is not an algorithm xvocab serves in vLLM" if spec is None else
                   "it proposes nothing: vLLM's ar is the engine without a speculative_config" if not spec.proposes
                   else "it reads no draft model: vLLM's own method='ngram' serves context lookup" if not spec.uses_draft
                   else "one shared vocabulary is vLLM's own draft_model method" if spec.one_vocabulary else
                   "it verifies against a distribution, and vLLM's custom-class path verifies point proposals")
            raise ConfigError(f"algorithm={self.algorithm!r}: {why}; choose one of {', '.join(served())} (an algorithm "
                              f"of your own: name its module in plugins)")
        if self.draft_encoding not in (None, *ENCODINGS):
            raise ConfigError(f"draft_encoding={self.draft_encoding!r}; choose one of {', '.join(ENCODINGS)}, or "
                              f"leave it out (the drafter's own)")
        if self.draft_dtype not in (None, *DTYPES):
            raise ConfigError(f"draft_dtype={self.draft_dtype!r}; choose one of {', '.join(DTYPES)}, or leave it out "
                              f"(the target's)")
        if self.draft_kernels not in KERNELS:
            raise ConfigError(f"draft_kernels={self.draft_kernels!r}; choose one of {', '.join(KERNELS)} "
                              f"(auto: vLLM's CPU kernels for a bfloat16/float16 draft on a CPU, else torch's)")
        if not 0 <= self.draft_confidence <= 1:
            raise ConfigError(f"draft_confidence={self.draft_confidence} is outside [0, 1]; 0 always drafts k tokens")
        if self.draft_memory_gib is not None and (isinstance(self.draft_memory_gib, bool) or
                                                  not isinstance(self.draft_memory_gib, (int, float)) or
                                                  self.draft_memory_gib <= 0):
            raise ConfigError(f"draft_memory_gib={self.draft_memory_gib!r} must be a positive number of GiB, or left "
                              f"out (derived from vLLM's KV cache size)")
        if self.load_policy not in POLICY_MODES:
            raise ConfigError(f"load_policy={self.load_policy!r}; choose one of {', '.join(POLICY_MODES)} (measured: "
                              f"the draft length per step from what each length measured here; off: always k)")
        if self.draft_lengths is not None:
            lengths = self.draft_lengths
            if not isinstance(lengths, dict) or not lengths or not all(
                    _int_like(b) and int(b) >= 1 and isinstance(n, int) and not isinstance(n, bool) and 0 <= n <= self.k
                    for b, n in lengths.items()):
                raise ConfigError(f"draft_lengths={lengths!r} must map batch sizes (>= 1) to draft lengths in "
                                  f"[0, k={self.k}], e.g. {{\"1\": {self.k}, \"8\": 2, \"16\": 0}}")
        for name in ("k", "max_rows", "prefill_chunk"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"{name}={value!r} must be a positive int")
        if self.draft_steps is not None and (isinstance(self.draft_steps, bool) or not isinstance(self.draft_steps, int)
                                             or not 1 <= self.draft_steps <= self.k):
            raise ConfigError(f"draft_steps={self.draft_steps!r} must be an int in [1, k={self.k}] (vLLM's "
                              f"num_speculative_tokens bounds what is proposed; raise it to draft longer)")
        if isinstance(self.draft_window, bool) or not isinstance(self.draft_window, int) or self.draft_window < 0:
            raise ConfigError(f"draft_window={self.draft_window!r} must be an int >= 0 (0: the whole prompt)")


def _int_like(value) -> bool:
    """An int, or a JSON object key that spells one ("8": --additional-config passes keys as strings)."""
    if isinstance(value, bool):
        return False
    return isinstance(value, int) or (isinstance(value, str) and value.isdigit())


def check_runner(vllm_config) -> None:
    """Refuse a vLLM whose model runner cannot host a custom_class proposer (its second runner, MRV2, takes
    speculators of another interface: CONTRIBUTING.md, "vLLM's second model runner")."""
    try:
        v2 = bool(vllm_config.use_v2_model_runner)
    except Exception:  # (a config without the property: an older vLLM, or a test's stand-in): the V1 runner
        v2 = False
    if v2:
        raise ConfigError("vLLM chose its second model runner (MRV2), whose speculators implement BaseSpeculator; "
                          "xvocab's proposer is a custom_class proposer of the V1 runner: set "
                          "VLLM_USE_V2_MODEL_RUNNER=0 in the engine's environment")


def check_verification(spec) -> None:
    """Refuse a vLLM speculative configuration whose verification would not keep the target's distribution."""
    if spec is None or spec.method != "custom_class":
        raise ConfigError("xvocab.vllm.Proposer is vLLM's custom_class proposer: pass speculative_config="
                          "{'method': 'custom_class', 'model': 'xvocab.vllm.Proposer', 'num_speculative_tokens': K}")
    method = getattr(spec, "rejection_sample_method", "standard")
    if method != "standard":
        raise ConfigError(f"speculative_config rejection_sample_method={method!r}: "
                          + ("'synthetic' accepts proposals by a fixed schedule, not by the target's probability, "
                             "so the output would not follow the target" if method == "synthetic" else
                             f"{method!r} was never checked exact with point proposals")
                          + "; use rejection_sample_method='standard' (vLLM's default)")
    for name in ("synthetic_acceptance_rates", "synthetic_acceptance_length"):
        if getattr(spec, name, None) is not None:
            raise ConfigError(f"speculative_config {name} is set: synthetic acceptance does not keep the target's "
                              f"distribution; leave it out")
