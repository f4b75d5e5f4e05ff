"""Tiny random-weight causal LMs over real vocabularies, for exactness tests.

`tiny_model(tokenizer, seed=0)` builds a small Llama-architecture model whose
vocabulary size equals `len(tokenizer)`, with weights drawn from a generator seeded
by `seed` (the same seed gives bit-identical weights on every machine and call).
Random weights make no acceptance or speed claim; they make losslessness tests
cheap on real tokenizers of any size.
"""
from __future__ import annotations

import torch


def tiny_model(tokenizer, *, seed: int = 0, n_layers: int = 2, hidden_size: int = 64,
               n_heads: int = 4, max_position_embeddings: int = 4096, logit_scale: float = 8.0,
               sliding_window: int | None = None):
    """A deterministic random LlamaForCausalLM with `len(tokenizer)` output logits.

    `logit_scale` multiplies the output head so that next-token distributions are
    peaked enough for greedy runs to be stable and for drafts to be accepted often.
    `sliding_window` set: a Gemma3ForCausalLM instead, its layers alternating sliding-window
    (that many positions) and full attention, as Gemma 3's do.
    """
    kw = dict(vocab_size=len(tokenizer), hidden_size=hidden_size, intermediate_size=hidden_size * 2,
              num_hidden_layers=n_layers, num_attention_heads=n_heads, num_key_value_heads=n_heads,
              max_position_embeddings=max_position_embeddings, tie_word_embeddings=False,
              bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
              pad_token_id=tokenizer.pad_token_id)
    if sliding_window is None:
        from transformers import LlamaConfig as Config, LlamaForCausalLM as Model
    else:
        from transformers import Gemma3ForCausalLM as Model, Gemma3TextConfig as Config

        kw |= dict(sliding_window=sliding_window, head_dim=hidden_size // n_heads,
                   layer_types=["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(n_layers)])
    with torch.device("cpu"):
        net = Model(Config(**kw))
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for _, param in sorted(net.named_parameters()):
            if param.ndim == 1:  # norms
                param.fill_(1.0)
            else:
                param.copy_(torch.randn(param.shape, generator=gen) * (param.shape[-1] ** -0.5))
        net.lm_head.weight.mul_(logit_scale)
    return net.eval()


def mirror_model(model, model_tokenizer, tokenizer, *, seed: int = 0):
    """`model` re-expressed over another vocabulary: draft id d reads and predicts the target id with d's bytes.

    Rows of ids outside the byte intersection are random (reads) and strongly negative
    (predictions). The result is a cross-vocabulary draft that agrees with `model` wherever
    both tokenizers segment text alike: the acceptance paths of SLEM/TLI/SLRS are then
    exercised on real tokenizers without training anything.
    """
    import copy

    from xvocab.alignment.intersection import intersection

    d2t = intersection(model_tokenizer, tokenizer).draft_to_target  # [V_new]
    hit = d2t >= 0
    gen = torch.Generator().manual_seed(seed)
    mirror = copy.deepcopy(model)
    emb_in, emb_out = model.get_input_embeddings().weight, model.get_output_embeddings().weight
    n, h = len(tokenizer), emb_in.shape[1]
    new_in = torch.randn((n, h), generator=gen) * emb_in.std()
    new_out = -emb_out.abs().mean() * torch.ones((n, h))
    new_in[hit], new_out[hit] = emb_in[d2t[hit]], emb_out[d2t[hit]]
    mirror.resize_token_embeddings(n, mean_resizing=False)
    with torch.no_grad():
        mirror.get_input_embeddings().weight.copy_(new_in)
        mirror.get_output_embeddings().weight.copy_(new_out)
    mirror.config.vocab_size = n
    return mirror.eval()
