"""The two real Qwen2.5-Coder models: a target memory-bound on a CPU (1.5B) and its same-family draft (0.5B).

Their tokenizers come from their own GGUF files and must equal the qwen2 family's exactly (llama.cpp's reference
vectors, and the zoo's `qwen2` tokenizer on every vector and a code corpus); their roles are the Instruct models'
(no BOS, both <|im_end|> and <|endoftext|> end a sequence, the chat and fill-in-the-middle markers are single
special ids). What needs the 1.5B's weights runs once by default: greedy decoding with its same-family draft
(`sd`) and a cross-family one (`slem`) equals `ar` token for token.
"""
import pytest
import torch

import xvocab
from xvocab.alignment.roles import eos_ids, prompt_ids
from xvocab.alignment.tables import same_vocabulary
from xvocab.alignment.tokens import codec

# Under pytest-xdist (`make test` runs two workers) this module stays on one worker, so the 1.5B and the 0.5B are
# never in memory twice.
pytestmark = pytest.mark.xdist_group("qwen")
QWEN = ["qwen2.5-coder-1.5b", "qwen2.5-coder-0.5b"]
PROMPT = 'def fibonacci(n):\n    """Return the n-th Fibonacci number."""\n'
CODE = [PROMPT, "import numpy as np\nx = np.arange(10) ** 2\n", "    for i in range(len(xs) - 1):\n\t\tpass\r\n",
        "résumé 中文 😁 1234567 3.14", "<|im_start|>user\nhi<|im_end|>", "a  b   c\n\n\n", ""]


@pytest.mark.parametrize("name", QWEN)
def test_model_tokenizer_is_the_qwen2_family_exactly(name):
    tok, family = xvocab.zoo.tokenizer(name), xvocab.zoo.tokenizer("qwen2")
    vectors = xvocab.zoo.reference_vectors("qwen2")
    assert [t for t, ids in vectors if tok.encode(t, add_special_tokens=False) != ids] == []
    for text in [t for t, _ in vectors] + CODE:
        assert tok.encode(text, add_special_tokens=False) == family.encode(text, add_special_tokens=False), text
    # The same 151,643 byte-level tokens; the model's GGUF adds the Instruct model's special tokens after them
    ordinary = {piece: i for piece, i in family.get_vocab().items() if i < 151643}
    assert len(ordinary) == 151643 and {p: i for p, i in tok.get_vocab().items() if i < 151643} == ordinary
    assert len(tok) == 151936


def test_the_two_models_share_one_vocabulary():
    assert same_vocabulary(codec(xvocab.zoo.tokenizer(QWEN[0])), codec(xvocab.zoo.tokenizer(QWEN[1])))  # so `sd` pairs them
    assert not same_vocabulary(codec(xvocab.zoo.tokenizer(QWEN[0])), codec(xvocab.zoo.tokenizer("qwen2")))  # specials differ


def test_the_reference_check_can_fail():
    """Negative control: another byte-level BPE family fails the qwen2 vectors."""
    tok = xvocab.zoo.tokenizer("llama-bpe")
    assert sum(tok.encode(t, add_special_tokens=False) != ids for t, ids in xvocab.zoo.reference_vectors("qwen2")) > 10


@pytest.mark.parametrize("name", QWEN)
def test_roles_are_the_instruct_models(name):
    tok = xvocab.zoo.tokenizer(name)
    assert prompt_ids(tok, "x = 1") == tok.encode("x = 1", add_special_tokens=False)  # no BOS, as Qwen reads
    markers = {t: tok.convert_tokens_to_ids(t) for t in ("<|endoftext|>", "<|im_start|>", "<|im_end|>",
                                                          "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>")}
    assert markers["<|endoftext|>"] == 151643 and markers["<|im_start|>"] == 151644 and markers["<|im_end|>"] == 151645
    assert all(tok.encode(t, add_special_tokens=False) == [i] for t, i in markers.items())
    assert tok.eos_token == "<|im_end|>"


def test_both_eos_end_a_sequence_and_same_family_greedy_is_known_good():
    model, tok = xvocab.zoo.model("qwen2.5-coder-0.5b", device="cpu")
    assert set(eos_ids(model, tok)) == {151643, 151645}
    ids = torch.tensor([prompt_ids(tok, PROMPT)])
    out = model.generate(ids, max_new_tokens=16, do_sample=False)
    # Recorded once (float32, CPU, transformers 5.24): "    if n <= 0:\n        return 0\n    elif n =="
    assert out[0, ids.shape[1]:].tolist() == [262, 421, 308, 2651, 220, 15, 510, 286, 470, 220, 15, 198, 262, 4409,
                                              308, 621]


_RECORDED = [262, 421, 308, 2651, 220, 16, 510, 286, 470, 308, 198, 262, 770, 510, 286, 470]
# The 1.5B's greedy continuation of PROMPT, recorded once (float32, CPU, transformers 5.24):
# "    if n <= 1:\n        return n\n    else:\n        return"
DRAFTER = "qwen2.5-coder-1.5b-drafter-deepseek-coder-aligned-v4"  # shipped; its embedding is v5's (shared)


def _equals_ar_with(drafts):
    model, tok = xvocab.zoo.model("qwen2.5-coder-1.5b", device="cpu")
    ref = xvocab.generate(PROMPT, target=model, target_tokenizer=tok, algorithm="ar", max_new_tokens=16).token_ids
    assert ref == _RECORDED
    for alg, draft_name in drafts:
        draft, dt = xvocab.zoo.model(draft_name, device="cpu")
        out = xvocab.generate(PROMPT, target=model, target_tokenizer=tok, draft=draft, draft_tokenizer=dt,
                              algorithm=alg, k=4, max_new_tokens=16)
        assert out.token_ids == ref, alg
        assert out.stats.target_forwards < 16, alg  # drafts were accepted: the comparison covered proposals


def test_greedy_on_the_real_target_is_known_good_and_equals_ar_with_same_and_cross_family_drafts():
    """The one default test that loads the 1.5B: its greedy continuation as recorded, and `sd` with its 0.5B
    sibling and `slem` with the drafter made for it (DeepSeek-Coder's vocabulary: another family) emit exactly
    that, having accepted drafts."""
    _equals_ar_with([("sd", "qwen2.5-coder-0.5b"), ("slem", DRAFTER)])


@pytest.mark.slow
def test_greedy_on_the_real_target_equals_ar_with_off_the_shelf_and_tli_drafts():
    """The same with SmolLM2 (an off-the-shelf draft of another family) and TLI over the drafter."""
    _equals_ar_with([("slem", "smollm2-135m"), ("tli", DRAFTER)])
