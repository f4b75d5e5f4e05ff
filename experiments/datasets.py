"""Prompt sets for experiments: HumanEval offline; CNN/DailyMail and SCROLLS through `datasets`."""
from __future__ import annotations

from xvocab import zoo
from xvocab.errors import ConfigError

OFFLINE = ("humaneval", "tiny")
TINY = [{"id": "tiny/0", "prompt": "def add(a, b):\n    return"},
        {"id": "tiny/1", "prompt": "The capital of France is"}]


def load(name: str, limit: int | None) -> list[dict]:
    """[{id, prompt, ...}] for a dataset name, the first `limit` rows (all if None)."""
    if name == "humaneval":
        rows = zoo.dataset("humaneval")
    elif name == "tiny":
        rows = TINY
    elif name in ("cnn_dailymail", "scrolls"):
        rows = _from_hub(name, limit)
    else:
        raise ConfigError(f"unknown dataset {name!r}; choose humaneval, tiny, cnn_dailymail or scrolls")
    return rows[:limit] if limit else rows


def _from_hub(name: str, limit: int | None) -> list[dict]:
    try:
        import datasets

        if name == "cnn_dailymail":
            split = datasets.load_dataset("cnn_dailymail", "3.0.0", split=f"test[:{limit or 11490}]")
            return [{"id": f"cnn/{r['id']}", "prompt": f"Summarize the following article.\n\n{r['article']}\n\nSummary:"}
                    for r in split]
        split = datasets.load_dataset("tau/scrolls", "gov_report", split=f"validation[:{limit or 973}]",
                                      trust_remote_code=True)
        return [{"id": f"scrolls/{r['id']}", "prompt": f"{r['input']}\n\nSummary:"} for r in split]
    except Exception as exc:  # no hub access, missing package, gated dataset...
        raise ConfigError(f"dataset {name!r} could not be loaded through `datasets` ({type(exc).__name__}: "
                          f"{str(exc)[:200]}). It needs access to the Hugging Face hub; the datasets that work "
                          f"offline are: {', '.join(OFFLINE)}.") from exc
