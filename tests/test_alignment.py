"""Token bytes, the intersection map and the incremental translator, on real zoo tokenizers."""
import itertools

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import xvocab
from xvocab.alignment import NO_TOKEN, Stream, intersection, reference_sync, sync
from xvocab.alignment.tokens import codec, token_bytes
from xvocab.alignment.translate import complete_utf8, propose

NAMES = xvocab.zoo.tokenizer_names()
# Byte-level and SentencePiece both ways, large and small vocabularies.
PAIRS = [("gemma-4", "gpt-2"), ("gpt-2", "gemma-4"), ("llama-bpe", "qwen2"), ("qwen2", "llama-bpe"),
         ("mistral-v7", "starcoder"), ("tekken-240911", "llama-spm"), ("phi-3", "deepseek-coder")]
TEXT = st.text(alphabet=st.characters(codec="utf-8"), max_size=40) | st.sampled_from([
    "    if x:\n        return 1\r\n", "3333333333", "      ", "😁🤷‍♀️", "e\u0301\u0308", "中文 日本語", "\t\t\n\n\n",
    "a \u2581b\u2581\u2581"])  # a literal U+2581, SentencePiece's space marker
FIXED = ["Hello world", "  two\n\n  spaces", "def f(x):\n\treturn x**2\r\n", "中文测试 emoji 😁🤷‍♀️",
         "a\u0301 é ½ ²", "<s> [INST] <|endoftext|>", "9999999 3.14", "   ", "\x00\x07", "Cửa Việt"]
SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck), database=None)


@pytest.mark.parametrize("name", NAMES)
def test_token_bytes_reproduce_the_encoded_text(name):
    tok = xvocab.zoo.tokenizer(name)
    c = codec(tok)
    assert len(token_bytes(tok)) == len(tok)
    for text in FIXED:
        ids = tok.encode(text, add_special_tokens=False, split_special_tokens=True)
        assert c.bytes_of(ids) == c.prefix + text.encode()
        assert tok.decode(ids) == text
        assert c.bytes_of(c.encode_continuation(text)) == text.encode()


def test_token_bytes_known_values():
    gpt2 = token_bytes(xvocab.zoo.tokenizer("gpt-2"))
    tok = xvocab.zoo.tokenizer("gpt-2")
    assert gpt2[tok.convert_tokens_to_ids("Ġhello")] == b" hello"
    assert gpt2[tok.convert_tokens_to_ids("Ċ")] == b"\n"
    assert gpt2[tok.eos_token_id] is None
    spm = xvocab.zoo.tokenizer("llama-spm")
    assert token_bytes(spm)[spm.convert_tokens_to_ids("<0xE9>")] == b"\xe9"  # a partial UTF-8 byte, kept raw
    assert token_bytes(spm)[spm.convert_tokens_to_ids("▁hello")] == b" hello"
    assert token_bytes(spm)[spm.bos_token_id] is None


@pytest.mark.parametrize("target,draft", PAIRS)
def test_intersection_maps_only_identical_bytes(target, draft):
    t_tok, d_tok = xvocab.zoo.tokenizer(target), xvocab.zoo.tokenizer(draft)
    vmap = intersection(t_tok, d_tok)
    tb, db = token_bytes(t_tok), token_bytes(d_tok)
    d2t, t2d = vmap.draft_to_target.tolist(), vmap.target_to_draft.tolist()
    assert len(d2t) == len(d_tok) and len(t2d) == len(t_tok)
    roles = {(getattr(t_tok, r), getattr(d_tok, r)) for r in ("bos_token_id", "eos_token_id", "pad_token_id")}
    for d, t in enumerate(d2t):
        if t != NO_TOKEN:
            assert t2d[t] == d  # a bijection on the intersection
            assert db[d] == tb[t] or (t, d) in roles
    # Completeness: every shared byte string is matched.
    shared = {b for b in tb if b} & {b for b in db if b}
    matched = {db[d] for d, t in enumerate(d2t) if t != NO_TOKEN and db[d]}
    assert matched == shared
    assert vmap.size == sum(t != NO_TOKEN for t in d2t)


def test_intersection_never_confuses_a_character_with_a_lone_byte():
    gemma, gpt2 = xvocab.zoo.tokenizer("gemma-4"), xvocab.zoo.tokenizer("gpt-2")
    vmap = intersection(gemma, gpt2)
    lone_e9 = [i for i, b in enumerate(token_bytes(gpt2)) if b == b"\xe9"]
    assert len(lone_e9) == 1
    target = vmap.draft_to_target[lone_e9[0]].item()
    assert token_bytes(gemma)[target] == b"\xe9"  # Gemma's <0xE9>, never its "é" (C3 A9)


@pytest.mark.parametrize("name", ["gpt-2", "llama-spm", "gemma-4", "tekken-240911", "deepseek-llm", "mistral-v7"])
def test_fast_sync_equals_reference_on_random_edits(name):
    c = codec(xvocab.zoo.tokenizer(name))

    @SETTINGS
    @given(TEXT, TEXT, st.integers(0, 40))
    def check(a, b, cut_at):
        # A stream spelling text `a`'s canonical tokens, then text grows (or is cut and regrows) to `b`.
        old = Stream.of(c, c.encode_continuation(a))
        text = a.encode()[:cut_at] + b.encode()
        fast, ref = sync(c, old, text), reference_sync(c, old, text)
        assert fast == ref
        new = old.apply(c, *fast)
        assert new.text == text[:complete_utf8(text)]

    check()


def test_fast_sync_widens_when_the_pre_tokenizer_reaches_back_across_the_window():
    # tekken's regex takes b":" + U+36AC1 (unassigned) as one piece, but U+36AC1 + b"m"
    # as one piece without the colon: a window starting after b":" whose first token
    # matches would still split the new text differently from the whole text's encoding.
    c = codec(xvocab.zoo.tokenizer("tekken-240911"))
    a = ":\U00036ac1"
    old = Stream.of(c, c.encode_continuation(a))
    text = (a + "m").encode()
    assert sync(c, old, text, window=4) == reference_sync(c, old, text) == (5, c.encode_exact(b"m"))


@pytest.mark.parametrize("target,draft", PAIRS[:4])
def test_propose_spells_the_draft_text_and_keeps_committed_ids(target, draft):
    tc = codec(xvocab.zoo.tokenizer(target))

    @SETTINGS
    @given(TEXT, TEXT)
    def check(committed, extra):
        stream = Stream.of(tc, tc.encode_continuation(committed))
        ids = propose(tc, stream, extra.encode())
        assert tc.bytes_of(ids) == extra.encode()

    check()


def test_sync_cost_does_not_grow_with_context():
    import time

    c = codec(xvocab.zoo.tokenizer("gpt-2"))
    base = "def f(x):\n    return x * 2 + 1  # comment\n" * 400
    timings = {}
    for n_tokens in (100, 4000):
        ids = c.encode_continuation(base)[:n_tokens]
        stream = Stream.of(c, ids)
        text = stream.text + b" more text"
        start = time.perf_counter()
        for _ in range(50):
            sync(c, stream, text)
        timings[n_tokens] = (time.perf_counter() - start) / 50
    # The long context re-encodes the same window: not 40x slower (generous bound against noise).
    assert timings[4000] < 10 * timings[100] + 1e-3, timings


def test_sync_reports_the_retokenized_tail():
    c = codec(xvocab.zoo.tokenizer("gpt-2"))
    old = Stream.of(c, c.encode_continuation("def f"))
    keep, append = sync(c, old, b"def fib(n):")
    assert keep == 1 and c.bytes_of(append) == b" fib(n):"
    assert list(itertools.chain(old.ids[:keep], append)) == c.encode_continuation("def fib(n):")


@pytest.mark.parametrize("name", NAMES)
def test_a_literal_space_marker_is_spelled_exactly(name):
    """SentencePiece normalizers read a literal U+2581 as a space; the continuation encoder spells it anyway."""
    c = codec(xvocab.zoo.tokenizer(name))
    for text in ["\u2581", "a\u2581b", "def f():\n \u2581\u2581 x", "é\u2581中"]:
        assert c.bytes_of(c.encode_continuation(text)) == text.encode()
        assert c.bytes_of(propose(c, Stream.of(c, c.encode_continuation("x = ")), text.encode())) == text.encode()
    if name in {"gemma-4", "llama-spm", "mistral-v1", "mistral-v3", "mistral-v7", "phi-3"}:
        # Control: the tokenizer's own encoding misspells it (a scan of every character: these, and only U+2581).
        own = c._raw.encode("a\u2581b", add_special_tokens=False).ids
        assert c.bytes_of(own) == b"a b"


def test_lossy_vocabulary_is_reported_not_silently_dropped():
    from xvocab.alignment.tokens import UnrepresentableTextError

    c = codec(xvocab.zoo.tokenizer("falcon"))  # has no token for the byte 0x1E
    assert 0x1E in c.missing_bytes and not codec(xvocab.zoo.tokenizer("gpt-2")).missing_bytes
    with pytest.raises(UnrepresentableTextError, match="cannot spell"):
        sync(c, Stream(), "a\x1eb".encode())


SLOW = settings(max_examples=400, deadline=None, suppress_health_check=list(HealthCheck), database=None)


@pytest.mark.slow
@pytest.mark.parametrize("name", [n for n in NAMES if n != "falcon"])
def test_fast_sync_equals_reference_large_run(name):
    c = codec(xvocab.zoo.tokenizer(name))

    @SLOW
    @given(TEXT, TEXT, st.integers(0, 40))
    def check(a, b, cut_at):
        assume(not c.missing_bytes.intersection((a + b).encode()))  # lossy vocabularies raise instead
        old = Stream.of(c, c.encode_continuation(a))
        text = a.encode()[:cut_at] + b.encode()
        assert sync(c, old, text) == reference_sync(c, old, text)

    check()


@pytest.mark.slow
@pytest.mark.parametrize("target,draft", [(t, d) for t in NAMES for d in NAMES if t != d and "falcon" not in (t, d)])
def test_propose_on_every_zoo_pair(target, draft):
    tc, dc = codec(xvocab.zoo.tokenizer(target)), codec(xvocab.zoo.tokenizer(draft))

    @settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck), database=None)
    @given(TEXT, TEXT)
    def check(committed, extra):
        assume(not (tc.missing_bytes | dc.missing_bytes).intersection((committed + extra).encode()))
        # The draft spells `extra` in its own tokens; the target re-tokenizes exactly those bytes.
        draft_bytes = dc.bytes_of(dc.encode_continuation(extra))
        stream = Stream.of(tc, tc.encode_continuation(committed))
        assert tc.bytes_of(propose(tc, stream, draft_bytes)) == draft_bytes

    check()


def test_pair_report_rows_agree_with_the_maps(tmp_path):
    from experiments.drafters import pair_report

    out = tmp_path / "pairs.csv"
    rows = pair_report.main(["gemma-3-270m", "smollm2-135m", "--csv", str(out)])
    (row,) = rows
    t_tok, d_tok = xvocab.zoo.tokenizer("gemma-3-270m"), xvocab.zoo.tokenizer("smollm2-135m")
    assert row.intersection == intersection(t_tok, d_tok).size
    assert row.target_vocab == 262144 and row.draft_vocab == 49152
    assert 0 < row.share_of_target < row.share_of_draft <= 1
    assert row.draft_starts_target >= row.share_of_draft  # a token equal to a target token starts one
    assert out.read_text().splitlines()[0].startswith("target,draft,")
    assert len(out.read_text().splitlines()) == 2


# ------------------------------------------------------------------ target-aligned draft encoding

def _cuts(c, ids) -> set[int]:
    """Byte offsets where the tokens of `ids` end."""
    return set(itertools.accumulate(len(c.token_bytes[i] or b"") for i in ids))


def _follows_target_cuts(target_c, t2d, draft_c, text: str) -> bool:
    """Every cut of the target's encoding is a cut of the draft's, and each target token with a
    draft counterpart is that one draft id (the aligned encoding's invariant, spelled slowly)."""
    t_ids, d_ids = target_c.encode_continuation(text), draft_c.encode_continuation(text)
    d_by_span, start = {}, 0
    for d in d_ids:
        end = start + len(draft_c.token_bytes[d] or b"")
        d_by_span[start, end] = d
        start = end
    start = 0
    for t in t_ids:
        end = start + len(target_c.token_bytes[t] or b"")
        if t2d[t] != NO_TOKEN and d_by_span.get((start, end)) != t2d[t]:
            return False
        start = end
    return _cuts(target_c, t_ids) <= _cuts(draft_c, d_ids)


ALIGNED_PAIRS = [("gemma-4", "deepseek-coder"), *PAIRS[:5]]


@pytest.mark.parametrize("target,draft", ALIGNED_PAIRS)
def test_aligned_encoding_spells_the_text_in_the_targets_cuts(target, draft):
    from xvocab.alignment.aligned import aligned_codec

    tt, dt = xvocab.zoo.tokenizer(target), xvocab.zoo.tokenizer(draft)
    a, t_c = aligned_codec(codec(tt), codec(dt)), codec(tt)
    t2d = intersection(tt, dt).target_to_draft.tolist()
    assert a.token_bytes == codec(dt).token_bytes  # draft ids: the draft model reads them unchanged

    @SETTINGS
    @given(TEXT)
    def check(text):
        assume(not set(text.encode()) & a.missing_bytes)  # the engine shows the draft a.view(text)
        ids = a.encode_continuation(text)
        assert a.bytes_of(ids) == text.encode() and max(ids, default=0) < len(dt)
        assert _follows_target_cuts(t_c, t2d, a, text)

    for text in FIXED:
        check.hypothesis.inner_test(text)
    check()


def test_aligned_invariant_check_fails_on_the_native_encoding():
    """Negative control: the draft's own tokenizer cuts code elsewhere than Gemma, and the check sees it."""
    tt, dt = xvocab.zoo.tokenizer("gemma-4"), xvocab.zoo.tokenizer("deepseek-coder")
    t2d = intersection(tt, dt).target_to_draft.tolist()
    code = "def f(x):\n    return x + 1\n"
    assert not _follows_target_cuts(codec(tt), t2d, codec(dt), code)
    assert [codec(dt).token_bytes[i] for i in codec(dt).encode_continuation(code)][5:8] == [b"\n", b"   ", b" return"]


@pytest.mark.parametrize("name", ["deepseek-coder", "gpt-2", "llama-spm"])
def test_fast_sync_equals_reference_with_the_aligned_encoding(name):
    from xvocab.alignment.aligned import aligned_codec

    c = aligned_codec(codec(xvocab.zoo.tokenizer("gemma-4")), codec(xvocab.zoo.tokenizer(name)))

    @SETTINGS
    @given(TEXT, TEXT, st.integers(0, 40))
    def check(a, b, cut_at):
        old = Stream.of(c, c.encode_continuation(a))
        text = a.encode()[:cut_at] + b.encode()
        assume(not set(text) & c.missing_bytes)
        fast = sync(c, old, text)
        assert fast == reference_sync(c, old, text)
        assert old.apply(c, *fast).text == text[:complete_utf8(text)]

    check()


def test_cut_agreement_counts_what_the_aligned_encoding_fixes():
    from experiments.drafters.pair_report import main as pair_report
    from xvocab.alignment.aligned import cut_agreement

    code = ["def f(x):\n    return x + 1\n", "    if a:\n        b = [1, 2]\n"]
    r = cut_agreement(xvocab.zoo.tokenizer("gemma-4"), xvocab.zoo.tokenizer("deepseek-coder"), code)
    assert 0 < r["target_in_intersection"] <= 1 and r["target_tokens"] > 10
    assert r["native_cuts_on_target_cuts"] < r["aligned_cuts_on_target_cuts"] == 1.0  # every token here is shared
    assert pair_report(["gemma-4", "deepseek-coder", "--cuts"])[0]["target_tokens"] > 10_000  # all of HumanEval
