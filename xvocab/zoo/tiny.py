"""Tiny random-weight causal LMs over real vocabularies, for exactness tests.

`tiny_model(tokenizer, seed=0)` builds a small Llama-architecture model whose
vocabulary size equals `len(tokenizer)`, with weights drawn from a generator seeded
by `seed` (the same seed gives bit-identical weights on every machine and call).
Random weights make no acceptance or speed claim; they make losslessness tests
cheap on real tokenizers of any size. Drafts for them: `mirror_model` (the target
re-expressed over another vocabulary: it agrees where both tokenizers cut text alike)
and `biased_pair` (a target and draft that agree on any pair of tokenizers).
"""
from __future__ import annotations

from pathlib import Path

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
        from transformers import LlamaConfig as Config
        from transformers import LlamaForCausalLM as Model
    else:
        from transformers import Gemma3ForCausalLM as Model
        from transformers import Gemma3TextConfig as Config

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


# biased_pair set for greedy text: the target's own head varies its choices more (context), the draft's noise is
# small and it prefers the target's spellings (longer < 0), so its proposals are accepted on any pair (tau 1.1-4 of
# 5 at k = 4 on lossless_sweep's prompts) through text the target writes from a few dozen ids (repeats, merges).
GREEDY_BIAS = dict(longer=-1.0, noise=0.3, context=0.3, spread=1.0)


def biased_pair(target_tokenizer, draft_tokenizer, *, seed: int = 0, topic: tuple[int, int] = (24, 2),
                lift: float = 16.0, spread: float = 1.5, base: float = 1.5, context: float = 0.05, longer: float = 1.0,
                noise: float = 1.5, n_heads: int = 4):
    """(target, draft): a tiny target and a draft over another vocabulary that agree often on ANY tokenizer pair.

    Why: a mirror (`mirror_model`) agrees with its target only where the two tokenizers cut the context alike; on
    most pairs the mirror's proposals are then never accepted and a sampling test would exercise rejection alone.
    Here a context-free bias (in logits) dominates both models, so they agree whatever the segmentation:
      - target: noise of std `base` on every id, and a topic of `topic` = (m shared, m' unshared) ids lifted to
        `lift` (std `spread`), so its choices are a few dozen ids, some with no draft counterpart (the target
        emits tokens the draft cannot propose). Half the shared ones are ids that unshared draft ids start with
        (where SLRS's psi sums several draft ids). Its own head, scaled by `context`, adds a smaller
        context-dependent part: each position's law differs (a verifier reading the wrong one shows);
      - draft: the mirror of that head, and the target's bias on shared ids; each unshared draft id gets its first
        target token's bias plus `longer` (the draft prefers the longer spellings its vocabulary has, as a draft with
        whole words where the target has pieces does: most of q lies outside the intersection, so TLI's
        renormalization and SLRS's psi matter), and every id noise of std `noise` (the draft disagrees with the
        target's order: both verifier paths run, and a verifier that trusts q where it should not shows).
    `n_heads`: the models' attention heads (vLLM's CPU attention takes head sizes of 32 and up: n_heads=2).
    Same seed, same pair: bit-identical models.
    """
    from xvocab.alignment.intersection import NO_TOKEN, intersection
    from xvocab.alignment.tables import first_target_token, pair_tables
    from xvocab.alignment.tokens import codec

    target = tiny_model(target_tokenizer, seed=seed, n_heads=n_heads)
    gen = torch.Generator().manual_seed(seed + 1)
    vocab = intersection(target_tokenizer, draft_tokenizer)
    n_t = len(vocab.target_to_draft)
    shared = vocab.target_to_draft >= 0                                       # [V_target] bool
    with torch.no_grad():
        target.lm_head.weight.mul_(context)
        draft = mirror_model(target, target_tokenizer, draft_tokenizer, seed=seed)
        n = draft.lm_head.weight.shape[0]
        d2t = torch.full((n,), NO_TOKEN)                                      # [V_draft] the same bytes
        d2t[: len(vocab.draft_to_target)] = vocab.draft_to_target[:n]
        first = pair_tables(codec(target_tokenizer), codec(draft_tokenizer), n_t, n)[first_target_token].to_target  # [V_draft]
        hit = d2t != NO_TOKEN
        copies = ~hit & (first != NO_TOKEN)
        copied = torch.zeros(n_t, dtype=torch.bool)                           # [V_target] starts an unshared draft id
        copied[first[copies]] = True

        def pick(mask, m):
            ids = mask.nonzero().flatten()
            return ids[torch.randperm(len(ids), generator=gen)[:m]]

        m, m_unshared = topic
        favoured = pick(shared & copied, m // 2)
        favoured = torch.cat([favoured, pick(shared & ~torch.isin(torch.arange(n_t), favoured), m - len(favoured))])
        rare = pick(~shared, m_unshared)                                      # the target emits, the draft cannot
        lifted = torch.cat([favoured, rare])
        bias_t = torch.randn(n_t, generator=gen) * base                       # [V_target]
        bias_t[lifted] = lift + torch.randn(len(lifted), generator=gen) * spread
        bias_t[rare] -= spread                                                # chosen less often than the rest
        target.lm_head.bias = torch.nn.Parameter(bias_t)

        bias_d = torch.randn(n, generator=gen) * base                         # [V_draft]
        bias_d[hit] = bias_t[d2t[hit]]
        bias_d[copies] = bias_t[first[copies]] + longer
        bias_d += torch.randn(n, generator=gen) * noise
        draft.lm_head.bias = torch.nn.Parameter(bias_d)
    return target.eval(), draft.eval()


def fold_head_bias(model, *, width: int = 8, strength: float = 0.02):
    """A LlamaForCausalLM without an output bias that carries `model`'s (biased_pair's) in its weights, so that an
    engine whose Llama has no head bias (vLLM) serves what biased_pair designs: a pair that agrees on any tokenizers.

    How: `width` hidden dimensions are added; the embeddings write a constant in the first (no layer writes to the
    new dimensions: zero rows in o_proj and down_proj, zero columns wherever a layer reads), so the residual stream
    carries it to the final norm, where the head reads the bias from it (lm_head column = bias / its normalized
    value). The constant is `strength` times the residual stream's typical norm, so RMS normalization still scales
    the rest alike at every position; the result is a close relative of `model`, not a copy (its logits differ a
    little), which is all a test over the served model needs: the same weights on both sides of every comparison.
    Same model in, bit-identical model out.
    """
    from transformers import LlamaConfig, LlamaForCausalLM

    config = model.config
    d, v = config.hidden_size, config.vocab_size
    d_new = d + width
    bias = model.lm_head.bias.detach() if model.lm_head.bias is not None else torch.zeros(v)
    # The residual stream's typical norm at each RMS norm's input, over random text (seeded): the constant is
    # `strength` times the largest (the final norm's), and each norm's weights are scaled to undo, at its typical
    # input, the shrinking the constant causes.
    seen: dict[str, list[float]] = {}
    hooks = [m.register_forward_hook(lambda m, i, o, n=n: seen.setdefault(n, []).append(float(i[0].norm(dim=-1).mean())))
             for n, m in model.named_modules() if n.endswith("norm")]
    with torch.no_grad():
        model(torch.randint(0, v, (4, 64), generator=torch.Generator().manual_seed(0)))
    for h in hooks:
        h.remove()
    typical = {n: sum(x) / len(x) for n, x in seen.items()}
    constant = strength * min(typical.values())
    kept = constant / (constant ** 2 + typical["model.norm"] ** 2) ** 0.5 * d_new ** 0.5  # the constant, normalized
    kw = config.to_dict() | dict(hidden_size=d_new, head_dim=config.hidden_size // config.num_attention_heads)
    for key in ("architectures", "transformers_version", "dtype", "torch_dtype", "_name_or_path"):
        kw.pop(key, None)
    with torch.device("cpu"):
        new = LlamaForCausalLM(LlamaConfig(**kw))
    old = dict(model.named_parameters())

    def widen(w, rows: bool, cols: bool):
        out = torch.zeros((w.shape[0] + (width if rows else 0),) + ((w.shape[1] + (width if cols else 0),)
                                                                     if w.ndim == 2 else ()))
        out[tuple(slice(0, n) for n in w.shape)] = w
        return out

    with torch.no_grad():
        for name, p in new.named_parameters():
            w = old[name].detach()
            if name == "model.embed_tokens.weight":
                p.copy_(widen(w, False, True))
                p[:, d] = constant
            elif name == "lm_head.weight":
                p.copy_(widen(w, False, True))
                p[:, d] = bias / kept
            elif name.endswith("norm.weight"):
                r = typical[name.removesuffix(".weight")]
                p.copy_(torch.cat([w * ((d / d_new) * (constant ** 2 + r ** 2) / r ** 2) ** 0.5, torch.ones(width)]))
            elif name.endswith(("o_proj.weight", "down_proj.weight")):
                p.copy_(widen(w, True, False))
            elif name.endswith(("q_proj.weight", "k_proj.weight", "v_proj.weight", "gate_proj.weight",
                                "up_proj.weight")):
                p.copy_(widen(w, False, True))
            else:
                raise ValueError(f"fold_head_bias: unexpected parameter {name} (a LlamaForCausalLM from tiny_model)")
    new.generation_config = model.generation_config
    return new.eval()


def servable_pair(target_tokenizer: str, draft_tokenizer: str, directory, *, seed: int = 0) -> tuple[Path, Path]:
    """(target_dir, draft_dir): biased_pair's greedy pair for two zoo tokenizers, folded (`fold_head_bias`) and saved
    under `directory` as checkpoints another engine serves (xvocab.zoo.serving: tokenizer files with roles, EOS).
    Two heads of 32 dimensions (the smallest head vLLM's CPU attention takes). Built once per directory: written
    whole or not at all."""
    from xvocab.alignment.roles import eos_ids
    from xvocab.zoo.cache import atomic_dir
    from xvocab.zoo.names import tokenizer
    from xvocab.zoo.serving import write_tokenizer_files

    root = Path(directory) / f"{target_tokenizer}--{draft_tokenizer}-seed{seed}"
    if not (root / "draft" / "tokenizer_config.json").exists():
        tt, dt = tokenizer(target_tokenizer), tokenizer(draft_tokenizer)
        target, draft = biased_pair(tt, dt, seed=seed, n_heads=2, **GREEDY_BIAS)
        for model, tok in ((target, tt), (draft, dt)):  # (a mirror keeps its target's special ids)
            for role in ("bos", "eos", "pad"):
                setattr(model.config, f"{role}_token_id", getattr(tok, f"{role}_token_id"))
                setattr(model.generation_config, f"{role}_token_id", getattr(tok, f"{role}_token_id"))
        with atomic_dir(root) as tmp:
            for name, model, tok in (("target", fold_head_bias(target), tt), ("draft", fold_head_bias(draft), dt)):
                (tmp / name).mkdir()
                model.save_pretrained(tmp / name)
                write_tokenizer_files(tmp / name, tok, eos_ids(model, tok))
    return root / "target", root / "draft"
