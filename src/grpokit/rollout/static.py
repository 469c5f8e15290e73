"""A lean decode step for Llama-shaped models (Llama, Qwen2, Mistral without a sliding window)
over a key/value cache pre-allocated once for the whole rollout.

Why: on a CPU with a small model, one decode step is a few tiny matmuls, and transformers'
general forward (building a 4-D mask, ``DynamicCache`` concatenating the whole cache on every
token, output dataclasses) costs more than the matmuls. Here each layer's cache is one tensor
``(n, kv_heads, S, d)`` allocated at the final length ``S = prompt width + max_new_tokens``; a new
token's key/value is written in place at column ``t`` and attention reads columns ``< t + 1``.
Left-padding columns of the prompt are excluded by an additive ``-inf`` bias.

What is *not* ours: the projections, norms, MLP, rotary tables and ``apply_rotary_pos_emb`` are the
model's own modules, called directly; only the single-query attention over the cache is written
here. So the step computes the same function as ``model(...)`` (tests/test_rollout.py compares both
paths token for token under greedy and seeded sampling).
"""

from __future__ import annotations

import importlib

import torch

SUPPORTED = ("llama", "qwen2", "mistral")


def supports(model: torch.nn.Module) -> bool:
    """True when ``StaticDecoder`` can run ``model``: a supported family, plain causal attention."""
    if not isinstance(model, torch.nn.Module):  # wrappers (e.g. lockstep sampling) must see every forward
        return False
    cfg = getattr(model, "config", None)
    if cfg is None or getattr(cfg, "model_type", None) not in SUPPORTED:
        return False
    if getattr(cfg, "use_sliding_window", False) or (cfg.model_type == "mistral" and getattr(cfg, "sliding_window", None)):
        return False
    return hasattr(model, "model") and hasattr(model.model, "layers") and hasattr(model.model, "rotary_emb")


class StaticDecoder:
    """Decode state for ``n`` rows: per-layer ``(n, kvh, S, d)`` key and value tensors, the column
    bias that hides prompt padding, and the next column to write.

    Build it from the prefill's cache with ``from_prefill``; then ``step(tok_n, pos_n)`` returns the
    next logits ``(n, V)`` and ``select(idx)`` keeps only rows ``idx`` (finished rows leave).
    """

    def __init__(self, model, keys, values, bias, start: int):
        self.model = model
        self.keys, self.values = keys, values  # per layer (n, kvh, S, d)
        self.bias = bias  # (n, 1, 1, S): 0 where a column may be attended, -inf on prompt padding
        self.t = start  # next column to write
        mod = importlib.import_module(type(model).__module__)
        self._rope = mod.apply_rotary_pos_emb
        attn = model.model.layers[0].self_attn
        self.head_dim = attn.head_dim
        self.scaling = attn.scaling
        self.groups = attn.num_key_value_groups

    @classmethod
    def from_prefill(cls, model, cache, prompt_mask_PW: torch.Tensor, group_size: int, max_new_tokens: int):
        """Copy the prefill cache (P rows, width W) into tensors of width ``W + max_new_tokens``,
        each prompt's row repeated ``group_size`` times."""
        P, W = prompt_mask_PW.shape
        S = W + max_new_tokens
        keys, values = [], []
        for layer in cache.layers:
            k, v = layer.keys, layer.values  # (P, kvh, W, d)
            kk = k.new_zeros((P * group_size, k.shape[1], S, k.shape[3]))
            vv = torch.zeros_like(kk)
            kk[:, :, :W] = k.repeat_interleave(group_size, dim=0)
            vv[:, :, :W] = v.repeat_interleave(group_size, dim=0)
            keys.append(kk)
            values.append(vv)
        valid = torch.ones((P, S), dtype=torch.bool, device=prompt_mask_PW.device)
        valid[:, :W] = prompt_mask_PW.bool()
        bias = torch.zeros((P, S), dtype=keys[0].dtype, device=keys[0].device).masked_fill(~valid, float("-inf"))
        bias = bias.repeat_interleave(group_size, dim=0)[:, None, None, :]
        return cls(model, keys, values, bias, W)

    def select(self, idx: torch.Tensor) -> None:
        """Keep rows ``idx`` only (compute on finished rows stops here). Only the filled columns
        ``< t`` are copied: the rest are written before they are read."""
        def pick(cache: torch.Tensor) -> torch.Tensor:
            out = cache.new_empty((idx.numel(),) + tuple(cache.shape[1:]))
            torch.index_select(cache[:, :, : self.t], 0, idx, out=out[:, :, : self.t])
            return out

        self.keys = [pick(k) for k in self.keys]
        self.values = [pick(v) for v in self.values]
        self.bias = self.bias.index_select(0, idx)

    def step(self, tok_n: torch.Tensor, pos_n: torch.Tensor) -> torch.Tensor:
        """Feed one token per row (``tok_n`` (n,), positions ``pos_n`` (n, 1)); return logits (n, V)."""
        m = self.model.model
        n, t = tok_n.shape[0], self.t
        x = m.embed_tokens(tok_n[:, None])  # (n, 1, h)
        cos, sin = m.rotary_emb(x, pos_n)
        bias = self.bias[..., : t + 1]  # (n, 1, 1, t+1)
        d, g = self.head_dim, self.groups
        for i, layer in enumerate(m.layers):
            a = layer.self_attn
            h = layer.input_layernorm(x)
            q = a.q_proj(h).view(n, 1, -1, d).transpose(1, 2)  # (n, H, 1, d)
            k = a.k_proj(h).view(n, 1, -1, d).transpose(1, 2)  # (n, kvh, 1, d)
            v = a.v_proj(h).view(n, 1, -1, d).transpose(1, 2)
            q, k = self._rope(q, k, cos, sin)
            self.keys[i][:, :, t:t + 1] = k
            self.values[i][:, :, t:t + 1] = v
            K, V = self.keys[i][:, :, : t + 1], self.values[i][:, :, : t + 1]  # (n, kvh, t+1, d)
            kvh = K.shape[1]
            qg = q.reshape(n, kvh, g, d)  # query heads grouped under their shared kv head
            scores = torch.matmul(qg, K.transpose(2, 3)) * self.scaling + bias  # (n, kvh, g, t+1)
            probs = torch.softmax(scores.float(), dim=-1).to(q.dtype)
            o = torch.matmul(probs, V).reshape(n, 1, -1)  # (n, 1, H*d)
            x = x + a.o_proj(o)
            x = x + layer.mlp(layer.post_attention_layernorm(x))
        self.t += 1
        return self.model.lm_head(m.norm(x))[:, -1]
