"""Prompt sets for experiments: HumanEval and two prose stand-ins offline; CNN/DailyMail and SCROLLS through `datasets`.

The paper's other two datasets need the Hugging Face hub. Offline, `prose_summary` (for CNN/DailyMail) and
`prose_qa` (for SCROLLS) take long English prose that ships with every CPython: the language reference's topics
in `pydoc_data.topics` (79 documents, 0.2-62k characters; the text is that of the running Python's version,
which each record names). Their templates:

* prose_summary (summarization of a news-length article): the topics of 1,500-8,000 characters, each as
  "Summarize the following article.\n\n{document}\n\nSummary:" (the CNN/DailyMail template above).
* code_edit (an edit that keeps most of its input, where outputs repeat inputs): each HumanEval problem's complete
  function (prompt and canonical solution) shown in a code block, and asked back with one change, rotating over
  the problems: type hints on every parameter and the return value; its first parameter renamed (`x` to
  `x_value`); its docstring cut to one line; a comment above each loop and branch. The prompt opens the answer's
  code block ("...Reply with the complete function only.\n\n```python\n"), and `stop: code_edit` ends the
  completion where the model closes it.
* prose_qa (question answering over a long document): the topics of more than 8,000 characters, cut at a
  paragraph end before 12,000 characters (about 3k tokens), each with a question on one of its section
  headings (the middle one): "{document}\n\nQuestion: According to the document above, what does the section
  \"{heading}\" explain?\nAnswer:".
"""
from __future__ import annotations

from experiments.datasets import humaneval
from xvocab import zoo
from xvocab.errors import ConfigError

EDIT_STOP = ("\n```",)  # code_edit: the completion ends with the code block
STOPS = {"humaneval": humaneval.STOP, "code_edit": EDIT_STOP}  # a dataset's standard stop strings (`stop: humaneval`)
TINY = [{"id": "tiny/0", "prompt": "def add(a, b):\n    return"},
        {"id": "tiny/1", "prompt": "The capital of France is"}]


def load(name: str, limit: int | None) -> list[dict]:
    """[{id, prompt, ...}] for a dataset name, the first `limit` rows (all if None)."""
    if name not in LOADERS:
        raise ConfigError(f"unknown dataset {name!r}; choose one of {', '.join(OFFLINE)} (offline), "
                          f"{', '.join(n for n in LOADERS if n not in OFFLINE)} (through the hub)")
    rows = LOADERS[name](limit)
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


def _headings(text: str) -> list[str]:
    """Section headings of a pydoc topic: a line underlined by a line of '=', '-' or '*' of its length."""
    lines = text.splitlines()
    return [a.strip() for a, b in zip(lines, lines[1:])
            if a.strip() and len(b) >= 3 and set(b.strip()) <= set("=-*~") and len(b.strip()) >= len(a.strip()) - 1]


def prose(name: str) -> list[dict]:
    """The rows of `prose_summary` or `prose_qa` (module docstring), in the topics' name order."""
    from pydoc_data.topics import topics

    rows = []
    for key in sorted(topics):
        text = topics[key].strip()
        if name == "prose_summary" and 1500 <= len(text) <= 8000:
            rows.append({"id": f"prose_summary/{key}", "prompt": f"Summarize the following article.\n\n{text}\n\nSummary:"})
        elif name == "prose_qa" and len(text) > 8000:
            cut = text.rfind("\n\n", 0, 12000)
            document = text[: cut if cut > 0 else 12000]
            headings = _headings(document)[1:]  # the first is the topic's own title
            if not headings:
                continue
            heading = headings[len(headings) // 2]
            rows.append({"id": f"prose_qa/{key}", "prompt": f"{document}\n\nQuestion: According to the document above, "
                                                            f"what does the section \"{heading}\" explain?\nAnswer:"})
    return rows


EDITS = ("with type hints on every parameter and on the return value",
         "with its parameter `{param}` renamed to `{param}_value` everywhere",
         "with its docstring shortened to a single line",
         "with a short comment above each loop and each `if`")


def code_edit() -> list[dict]:
    """The rows of `code_edit` (module docstring), one per HumanEval problem, in HumanEval's order."""
    import ast

    rows = []
    for i, problem in enumerate(zoo.dataset("humaneval")):
        function = (problem["prompt"] + problem["canonical_solution"]).strip("\n") + "\n"
        defs = [n for n in ast.walk(ast.parse(function)) if isinstance(n, ast.FunctionDef)
                and n.name == problem["entry_point"]]
        params = [a.arg for a in defs[0].args.args] if defs else []
        edit = EDITS[i % len(EDITS)]
        if "{param}" in edit:
            edit = edit.format(param=params[0]) if params else EDITS[0]
        rows.append({"id": f"code_edit/{problem['id'].split('/')[-1]}", "edit": edit,
                     "prompt": f"Here is a Python function.\n\n```python\n{function}```\n\nRewrite it {edit}. "
                               f"Reply with the complete function only.\n\n```python\n"})
    return rows


# name -> loader(limit) -> [{"id": unique str, "prompt": str, ...}]: a new dataset is a loader here and
# conf/dataset/<name>.yaml (README, "Adding a dataset").
LOADERS = {
    "humaneval": lambda limit: zoo.dataset("humaneval"),
    "prose_summary": lambda limit: prose("prose_summary"),
    "prose_qa": lambda limit: prose("prose_qa"),
    "code_edit": lambda limit: code_edit(),
    "tiny": lambda limit: TINY,
    "cnn_dailymail": lambda limit: _from_hub("cnn_dailymail", limit),
    "scrolls": lambda limit: _from_hub("scrolls", limit),
}
OFFLINE = ("humaneval", "code_edit", "prose_summary", "prose_qa", "tiny")  # the loaders that need no hub access
