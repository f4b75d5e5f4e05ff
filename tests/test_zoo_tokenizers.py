"""Every zoo tokenizer reproduces its reference exactly (100% of vectors, no tolerance)."""
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import xvocab
from xvocab.errors import UnknownNameError
from xvocab.zoo.tokenizers import TOKENIZERS

GGUF = [n for n in xvocab.zoo.tokenizer_names() if TOKENIZERS[n].kind == "gguf"]
MISTRAL = [n for n in xvocab.zoo.tokenizer_names() if TOKENIZERS[n].kind != "gguf"]

# A varied corpus for the Mistral tokenizers, whose references are libraries, not vectors.
CORPUS = [
    "Hello world", " leading space", "  two spaces", "trailing   ", "def f(x):\n    return x**2\n\n",
    "中文测试，日本語のテキスト、한국어", "emoji 😁🎉🤷‍♀️ ok", "tabs\tand\r\nCRLF\r\n", "1234567890 3.14159 -0.5e10",
    "", " ", "   ", "\n", "\n\n\n", "Ünïcödé ßtraße", "a\u0301 combining e\u0308", "x" * 80,
    "    indented\n\tcode\n        deeper", "ied 4 ½ months", "Cửa Việt", "\x00\x07 control", "a  b   c    d",
    "9999999999999", "ℌ𝔢𝔩𝔩𝔬 𝕨𝕠𝕣𝕝𝕕", "\u200b zero width", "ŉ ǰ", "<s> [INST] literal markers",
    "import numpy as np\nprint(np.arange(10))", "¡¿ Qué tal? «Très bien» — ok…", "Ελληνικά Русский עברית العربية",
]


def test_at_least_fifteen_families():
    assert len(xvocab.zoo.tokenizer_names()) >= 15


@pytest.mark.parametrize("name", GGUF)
def test_gguf_family_matches_reference_vectors(name):
    tok = xvocab.zoo.tokenizer(name)
    vectors = xvocab.zoo.reference_vectors(name)
    assert len(vectors) >= 40
    failures = [(text, ids, tok.encode(text, add_special_tokens=False)) for text, ids in vectors
                if tok.encode(text, add_special_tokens=False) != ids]
    assert failures == []


@pytest.mark.parametrize("name", MISTRAL)
def test_mistral_family_matches_reference_library(name):
    tok = xvocab.zoo.tokenizer(name)
    ref = xvocab.zoo.reference_encoder(name)
    failures = [t for t in CORPUS if tok.encode(t, add_special_tokens=False, split_special_tokens=True) != ref(t)]
    assert failures == []


@pytest.mark.parametrize("name", MISTRAL)
def test_mistral_family_matches_reference_on_random_text(name):
    tok = xvocab.zoo.tokenizer(name)
    ref = xvocab.zoo.reference_encoder(name)
    # Literal special-token strings are excluded: the original libraries never parse them from text.
    text_st = st.text(alphabet=st.characters(codec="utf-8", exclude_characters="<>[]"), max_size=60)

    @settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
    @given(text_st)
    def check(text):
        assert tok.encode(text, add_special_tokens=False) == ref(text)

    check()


def test_reference_check_can_fail():
    """Negative control: a different family's tokenizer must fail the same vectors."""
    tok = xvocab.zoo.tokenizer("gpt-2")
    vectors = xvocab.zoo.reference_vectors("llama-bpe")
    assert sum(tok.encode(t, add_special_tokens=False) != ids for t, ids in vectors) > 10


def test_special_token_roles_land_on_vocabulary_ids():
    tok = xvocab.zoo.tokenizer("deepseek-llm")  # the raw conversion puts BOS/EOS on new ids
    assert tok.bos_token_id < 102400 and tok.eos_token_id < 102400
    assert len(xvocab.zoo.tokenizer("llama-bpe")) == 128256  # no spurious id past the vocabulary


def test_unknown_name_lists_valid_names():
    with pytest.raises(UnknownNameError) as err:
        xvocab.zoo.tokenizer("gtp-2")
    assert "gpt-2" in str(err.value) and "llama-bpe" in str(err.value)
