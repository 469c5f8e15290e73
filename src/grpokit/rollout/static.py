"""A lean decode step for Llama-shaped models (Llama, Qwen2, Mistral without a sliding window, and
the language model of Qwen2-VL / Qwen2.5-VL) over a key/value cache pre-allocated once for the whole
rollout.

Why: on a CPU with a small model, one decode step is a few tiny matmuls, and transformers'
general forward (building a 4-D mask, ``DynamicCache`` concatenating the whole cache on every
token, output dataclasses) costs more than the matmuls. Here each layer's cache is one tensor
``(n, kv_heads, S, d)`` allocated at the final length ``S = prompt width + max_new_tokens``; a new
token's key/value is written in place at column ``t`` and attention reads columns ``< t + 1``.
Left-padding columns of the prompt are excluded by an additive ``-inf`` bias.

What is *not* ours: the norms, the activation and the rotary tables are the model's own modules,
called directly, and the projections are the model's linears. Only the single-query attention over
the cache, the rotation of the rotary embedding and the gated MLP's wiring (``down(act(gate) * up)``,
the Llama/Qwen2/Mistral MLP) are written here. So the step computes the same function as
``model(...)`` (tests/rollout/test_rollout.py compares both paths token for token under greedy and seeded
sampling).

Kernels: on a GPU a decode step's cost is mostly the count of its small kernels, so where one op can
do the work of two with every rounding unchanged, the step uses it (tests/rollout/test_static_step.py
checks the step against its plain formulation bit for bit). The rotary embedding ``x * cos +
rotate_half(x) * sin`` is one broadcast product with a table ``[cos; sine laid out for a roll]``, a roll
and an add (``rotate``: three kernels, not five); the attention's scale and padding bias are one add
where that is exact (``scale_folds``); the softmax casts its input with ``dtype=float32`` (one
kernel for float16 scores on CUDA; bfloat16 scores are still cast by a kernel of their own).

When the model's linears run on oneDNN (``model.cpu_matmul``, nn/kernels.py), the step's projections
use ``kernels.fused_linear``: q/k/v and gate/up each become one matmul over weights reordered once
per rollout (the copy is freed with the decoder). Otherwise each projection module is called as is
(GPU, LoRA and quantised layers included); q/k/v are joined (the rotary embedding takes q and k in one
pass), gate and up are not (the MLP reads them apart).

On CUDA the step is replayed as CUDA graphs (``graphs=True``): a decode step of a 0.5B model is a
few hundred small kernels, and launching them one by one from Python costs more than running them.
A graph needs fixed shapes and addresses, so the graphed step differs from the eager one in two
places only: the new key/value is written at a column held in a device tensor (``index_copy_``), and
attention reads a fixed-width window of the cache (the next multiple of step_graphs' ``GRAPH_COLUMNS``) with the
columns not yet written hidden by the bias. Masked columns weigh exactly 0 (their cache starts at
zero, so no uninitialised NaN can leak in as 0 * NaN), so both compute the same
function; tests/project/test_gpu.py checks the graphed, eager and ``model.generate`` paths sample the same
tokens. One graph is captured per (rows, window) pair seen in a rollout and dropped with the decoder.
The graphs themselves (capture, replay, streams) are rollout/step_graphs.py's; they are captured on
whichever thread decodes, the asynchronous sampler's included.

Vision-language models (Qwen2-VL, Qwen2.5-VL): the images only enter the prefill, which is the model's
own forward (rollout/hf.py); its cache, images included, is copied here once per group. Decoding is
then text only, and for a text token M-RoPE's three axes (time, row, column) hold the same position,
so the model's rotary module gives the plain 1-D tables (transformers 5.17's takes the three axes'
positions, equal: ``rotary_axes``): the step is the text decoder's. What differs
is the position: it continues from the prompt's largest M-RoPE position + 1 (an image's tokens share
positions, so that is smaller than the token count; Qwen2-VL's ``rope_deltas``), and the caller
passes it in ``pos_n``.
"""

from __future__ import annotations

import functools
import weakref

import torch

from grpokit.nn import kernels
from grpokit.nn.models import has_sliding_window

from .step_graphs import StepGraphs

SUPPORTED = ("llama", "qwen2", "mistral", "qwen2_vl", "qwen2_5_vl")
STATIC_ROPE = ("default", "linear", "llama3")  # frequencies fixed, whatever the sequence length
# The single-query attention: "matmul" (two batched matmuls and a float32 softmax) or "sdpa"
# (torch's scaled_dot_product_attention with grouped-query heads). Both compute the same function
# (tests/rollout/test_rollout.py); bench/gpu_bench.py measures each (bench/RESULTS.md).
ATTENTION = "matmul"


def unwrapped(model: torch.nn.Module) -> torch.nn.Module:
    """The model under a PEFT wrapper (``get_base_model()``: its linears carry the LoRA adapters, so the
    decode computes the adapted policy), or ``model`` itself."""
    get = getattr(model, "get_base_model", None)
    return get() if callable(get) else model


def text_model(model: torch.nn.Module):
    """The decoder stack (``embed_tokens``, ``layers``, ``norm``, ``rotary_emb``): ``model.model``, or
    for a vision-language model its ``language_model``."""
    inner = getattr(model, "model", None)
    return getattr(inner, "language_model", inner)


def text_config(model: torch.nn.Module):
    """The language model's config (a vision-language config's ``text_config``; a text config itself)."""
    cfg = model.config
    return cfg.get_text_config() if hasattr(cfg, "get_text_config") else cfg


def supports(model: torch.nn.Module) -> bool:
    """True when ``StaticDecoder`` can run ``model``: a supported family, plain causal attention. A PEFT
    model (LoRA, QLoRA's 4-bit base) qualifies: its adapted and quantised layers are called as they are."""
    if not isinstance(model, torch.nn.Module):  # wrappers (e.g. lockstep sampling) must see every forward
        return False
    model = unwrapped(model)
    cfg = getattr(model, "config", None)
    if cfg is None or getattr(cfg, "model_type", None) not in SUPPORTED:
        return False
    if has_sliding_window(cfg) or has_sliding_window(text_config(model)):
        return False
    m = text_model(model)
    if not (hasattr(m, "layers") and hasattr(m, "rotary_emb") and hasattr(model, "lm_head")):
        return False
    if rotary_axes(m.rotary_emb) is None:
        return False
    return all(
        all(hasattr(layer.mlp, n) for n in ("gate_proj", "up_proj", "down_proj", "act_fn")) for layer in m.layers
    )


def rotary_axes(rotary: torch.nn.Module) -> int | None:
    """How ``rotary`` takes text positions for its one (batch, positions, d) table: 0 where it takes 2-D
    positions (every family here, and M-RoPE in later transformers, which broadcasts them over its three
    axes), 3 where M-RoPE takes only its (3, batch, positions) positions (transformers 5.17's Qwen2-VL):
    at a text position the three axes hold the same number. None: neither (the dynamic engine runs the
    model). Probed with one position, once per module (``supports`` asks at every rollout)."""
    if rotary not in _ROTARY_AXES:
        _ROTARY_AXES[rotary] = _probe_rotary(rotary)
    return _ROTARY_AXES[rotary]


_ROTARY_AXES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _probe_rotary(rotary: torch.nn.Module) -> int | None:
    inv_freq = getattr(rotary, "inv_freq", None)
    device = inv_freq.device if isinstance(inv_freq, torch.Tensor) else torch.device("cpu")
    x, pos = torch.zeros(1, 1, 1, device=device), torch.zeros(1, 1, dtype=torch.long, device=device)
    for axes in (0, 3):
        try:
            cos, _ = rotary(x, pos[None].expand(axes, 1, 1) if axes else pos)
        except (IndexError, RuntimeError):
            continue
        if cos.dim() == 3:
            return axes
    return None


def text_rotary(rotary: torch.nn.Module, axes: int, x: torch.Tensor, pos: torch.Tensor):
    """``rotary``'s (cos, sin) at 2-D text positions ``pos``, each (batch, positions, d) (``rotary_axes``)."""
    return rotary(x, pos[None].expand(axes, *pos.shape) if axes else pos)


def _projection(modules):
    """``x -> the modules' outputs side by side`` (one tensor): one fused oneDNN matmul where
    kernels allows it, else each module called and the outputs joined."""
    fused = kernels.fused_linear(modules)
    if fused is not None:
        return fused
    if len(modules) == 1:
        return modules[0]
    return lambda x: torch.cat([m(x) for m in modules], dim=-1)


def _two_projections(first, second):
    """``x -> (first(x), second(x))``: the halves of one fused oneDNN matmul where kernels allows it,
    else each module called. Not joined: the gated MLP reads gate and up apart, so a concatenation
    would only be a copy (a kernel a layer on a GPU, of the layer's widest activations)."""
    fused = kernels.fused_linear([first, second])
    if fused is not None:
        return lambda x: fused(x).chunk(2, dim=-1)
    return lambda x: (first(x), second(x))


class StaticDecoder:
    """Decode state for ``n`` rows: per-layer ``(n, kvh, S, d)`` key and value tensors, the column
    bias that hides prompt padding, and the next column to write.

    Build it from the prefill's cache with ``from_prefill``; then ``step(tok_n, pos_n)`` returns the
    next logits ``(n, V)`` and ``select(idx)`` keeps only rows ``idx`` (finished rows leave).
    """

    def __init__(self, model, keys, values, bias, start: int, graphs: bool = False):
        model = self.model = unwrapped(model)
        self.backbone = text_model(model)  # the decoder stack (a VLM's language model)
        self.keys, self.values = keys, values  # per layer (n, kvh, S, d)
        self.bias = bias  # (n, 1, 1, S): 0 where a column may be attended, -inf on prompt padding
        self.t = start  # next column to write
        self._columns = torch.arange(keys[0].shape[2], device=keys[0].device)  # a graphed step's column numbers
        attn = self.backbone.layers[0].self_attn
        self.head_dim = attn.head_dim
        self.scaling = attn.scaling
        self.groups = attn.num_key_value_groups
        self.heads = text_config(model).num_attention_heads
        self.kv_heads = text_config(model).num_key_value_heads
        self.linears = [
            (
                _projection([layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj]),
                _projection([layer.self_attn.o_proj]),
                _two_projections(layer.mlp.gate_proj, layer.mlp.up_proj),
                _projection([layer.mlp.down_proj]),
            )
            for layer in self.backbone.layers
        ]
        self.head = _projection([model.lm_head])
        self.norms = [
            (kernels.rms_norm_of(layer.input_layernorm), kernels.rms_norm_of(layer.post_attention_layernorm))
            for layer in self.backbone.layers
        ]
        self.final_norm = kernels.rms_norm_of(self.backbone.norm)
        self._rotary = None  # rotary_table (2, positions, d), built on first use where the frequencies are static
        self._axes = (
            rotary_axes(self.backbone.rotary_emb) or 0
        )  # known here, eagerly: never probed inside a graph capture
        self.graphs = graphs and graphable(model, keys[0].device)
        self._step_graphs = StepGraphs(self._forward)  # the step's CUDA graphs, captured on first use

    @classmethod
    def from_prefill(
        cls, model, cache, prompt_mask_PW: torch.Tensor, group_size: int, max_new_tokens: int, graphs: bool = False
    ):
        """Copy the prefill cache (P rows, width W) into tensors of width ``W + max_new_tokens``,
        each prompt's row repeated ``group_size`` times. ``graphs``: replay the step as CUDA graphs
        where ``graphable`` allows it."""
        P, W = prompt_mask_PW.shape
        S = W + max_new_tokens
        graphs = graphs and graphable(model, prompt_mask_PW.device)
        keys, values = [], []
        for layer in cache.layers:
            k, v = layer.keys, layer.values  # (P, kvh, W, d)
            # columns >= W are written before the eager step reads them; a graphed step reads its
            # whole window, masked, and 0 * (uninitialised NaN) is NaN: there they start at zero
            alloc = k.new_zeros if graphs else k.new_empty
            kk = alloc((P * group_size, k.shape[1], S, k.shape[3]))
            vv = alloc(kk.shape)
            kk[:, :, :W] = k.repeat_interleave(group_size, dim=0)
            vv[:, :, :W] = v.repeat_interleave(group_size, dim=0)
            keys.append(kk)
            values.append(vv)
        valid = torch.ones((P, S), dtype=torch.bool, device=prompt_mask_PW.device)
        valid[:, :W] = prompt_mask_PW.bool()
        bias = torch.zeros((P, S), dtype=keys[0].dtype, device=keys[0].device).masked_fill(~valid, float("-inf"))
        bias = bias.repeat_interleave(group_size, dim=0)[:, None, None, :]
        return cls(model, keys, values, bias, W, graphs)

    def select(self, idx: torch.Tensor) -> None:
        """Keep rows ``idx`` only (compute on finished rows stops here). Only the filled columns
        ``< t`` are copied: the rest are written before they are read (zeros when graphed)."""

        def pick(cache: torch.Tensor) -> torch.Tensor:
            alloc = cache.new_zeros if self.graphs else cache.new_empty  # see from_prefill
            out = alloc((idx.numel(),) + tuple(cache.shape[1:]))
            torch.index_select(cache[:, :, : self.t], 0, idx, out=out[:, :, : self.t])
            return out

        self.keys = [pick(k) for k in self.keys]
        self.values = [pick(v) for v in self.values]
        self.bias = self.bias.index_select(0, idx)
        self._step_graphs.reset()  # captured on the old tensors

    def _rotary_at(self, x: torch.Tensor, pos_n: torch.Tensor) -> torch.Tensor:
        """The model's rotary tables at positions ``pos_n`` (n, 1), as ``rotary_table(cos, sin)`` (2, n, 1, d).

        For rope types whose frequencies do not depend on the sequence length, the table for every
        position of the rollout is computed once from the model's own ``rotary_emb`` (elementwise per
        position, so the values are the same) and indexed per step (one gather for both rows); others
        call it every step."""
        rotary = self.backbone.rotary_emb  # M-RoPE (Qwen2-VL): 2-D positions are the 3 axes alike, as text tokens are
        if getattr(rotary, "rope_type", None) not in STATIC_ROPE:
            return rotary_table(*text_rotary(rotary, self._axes, x, pos_n))
        if self._rotary is None:
            S = self.keys[0].shape[2]
            cos, sin = text_rotary(rotary, self._axes, x, torch.arange(S, device=x.device)[None])  # (1, S, d)
            self._rotary = rotary_table(cos[0], sin[0])  # (2, S, d)
        return self._rotary[:, pos_n]

    def step(self, tok_n: torch.Tensor, pos_n: torch.Tensor) -> torch.Tensor:
        """Feed one token per row (``tok_n`` (n,), positions ``pos_n`` (n, 1)); return logits (n, V)."""
        if self.graphs:
            logits = self._step_graphs.replay(tok_n, pos_n, self.t, self.keys[0].shape[2])
        else:
            logits = self._forward(tok_n, pos_n, self.t, self.t + 1)
        self.t += 1
        return logits

    def _forward(self, tok_n: torch.Tensor, pos_n: torch.Tensor, col, width: int) -> torch.Tensor:
        """One decode step writing column ``col`` and attending to columns ``< width``.

        Eager: ``col`` is the int ``t`` and ``width = t + 1``. Graphed: ``col`` is a (1,) device
        tensor and ``width`` a fixed window; columns after ``col`` are hidden by the bias."""
        m = self.backbone
        n = tok_n.shape[0]
        H, kvh, d, g = self.heads, self.kv_heads, self.head_dim, self.groups
        x = m.embed_tokens(tok_n)  # (n, h)
        table = self._rotary_at(x, pos_n)  # (2, n, 1, d)
        bias = self.bias[..., :width]  # (n, 1, 1, width)
        if isinstance(col, torch.Tensor):  # graphed: hide the columns not written yet
            bias = bias.masked_fill(self._columns[:width] > col, float("-inf"))  # (no arange kernel in the graph)
        for i, (layer, (qkv_proj, o_proj, gate_up_proj, down_proj), (norm1, norm2)) in enumerate(
            zip(m.layers, self.linears, self.norms)
        ):
            qkv = qkv_proj(norm1(x))  # (n, (H + 2 kvh) d): q, k, v side by side
            qk = qkv[:, : (H + kvh) * d].view(n, H + kvh, d)
            qk = rotate(qk, table)  # rotary embedding of q and k in one pass: qk * cos + rotate_half(qk) * sin
            _write(self.keys[i], col, qk[:, H:])
            _write(self.values[i], col, qkv[:, (H + kvh) * d :].view(n, kvh, d))
            K, V = self.keys[i][:, :, :width], self.values[i][:, :, :width]  # (n, kvh, width, d)
            if ATTENTION == "sdpa":
                q = qk[:, :H].unsqueeze(2)  # (n, H, 1, d)
                mixed = torch.nn.functional.scaled_dot_product_attention(
                    q, K.to(q.dtype), V.to(q.dtype), attn_mask=bias.to(q.dtype), scale=self.scaling, enable_gqa=True
                )
            else:
                qg = qk[:, :H].reshape(n, kvh, g, d)  # query heads grouped under their shared kv head
                scores = torch.matmul(qg, K.transpose(2, 3))  # (n, kvh, g, width)
                if scores.dtype == bias.dtype and scale_folds(scores.dtype, self.scaling):
                    scores = torch.add(bias, scores, alpha=self.scaling)  # scores * scaling + bias in one kernel
                else:  # (autocast: bf16 scores and a float32 bias; their sum is float32, softmax casts nothing)
                    scores = scores * self.scaling + bias
                mixed = torch.matmul(torch.softmax(scores, dim=-1, dtype=torch.float32).to(qkv.dtype), V)
            x = x + o_proj(mixed.reshape(n, H * d))
            gate, up = gate_up_proj(norm2(x))  # (n, I) each
            x = x + down_proj(layer.mlp.act_fn(gate) * up)
        return self.head(self.final_norm(x))


def rotary_table(cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """``cos`` and ``sin`` (..., d) stacked as ``(2, ..., d)`` for ``rotate``: ``cos``, then the sine laid
    out for a roll, ``cat(sin[d/2:], -sin[:d/2])``.

    Why that layout: Llama's ``rotate_half(x) = cat(-x2, x1)`` (x1, x2 the halves of the last dimension)
    is ``roll(x, d/2)`` with the first half negated, so ``rotate_half(x) * sin`` equals
    ``roll(x * cat(sin2, -sin1), d/2)``: each output is the same product of one entry of x and one of the
    sine, with the sign carried by the sine (``-(a * b) == a * (-b)`` exactly in IEEE arithmetic) and
    moved into place after the product. Example, d = 4, x = [1, 2, 3, 4], sin = [.1, .2, .3, .4]:
    ``rotate_half(x) * sin = [-3 * .1, -4 * .2, 1 * .3, 2 * .4]``; the table's row is [.3, .4, -.1, -.2],
    ``x *`` it is [.3, .8, -.3, -.8], rolled by 2: [-.3, -.8, .3, .8]."""
    h = sin.shape[-1] // 2
    return torch.stack((cos, torch.cat((sin[..., h:], -sin[..., :h]), dim=-1)))


def rotate(x: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
    """The rotary embedding ``x * cos + rotate_half(x) * sin`` of ``x`` (n, heads, d), with
    ``table = rotary_table(cos, sin)`` (2, n, 1, d): the same products, each rounded in the model's dtype
    (not one fused multiply-add, which rounds once: the trainer's forward rounds each product), and the
    same sum, bit for bit.

    Kernels: three (one broadcast product makes both ``x * cos`` and the sine products, a roll, an add)
    where ``rotate_half`` takes five (mul, neg, cat, mul, add). The roll moves the products, which are
    contiguous, rather than ``x``, a strided slice of the q/k/v projection that CUDA's roll would first
    copy (a sixth kernel)."""
    prod = table * x  # (2, n, heads, d): [0] x * cos, [1] x * the sine laid out for the roll
    return prod[0] + torch.roll(prod[1], x.shape[-1] // 2, dims=-1)


@functools.lru_cache(maxsize=None)
def scale_folds(dtype: torch.dtype, scale: float) -> bool:
    """Whether ``torch.add(bias, s, alpha=scale)`` (one kernel) equals ``s * scale + bias`` (two) bit for
    bit for scores ``s`` of ``dtype`` and an attention ``bias`` of 0 and -inf.

    Both round the product ``s * scale`` once to the dtype (reduced precision: computed in float32, then
    rounded); adding 0 then changes nothing, adding -inf gives -inf, or NaN where the product is +inf or
    NaN, in both. What may differ is the scale: in float32 and float64 both kernels multiply by the scale
    rounded to the dtype, but in bfloat16 and float16 on CPU the add rounds ``alpha`` to the dtype where
    the mul keeps a float32 scale, so the scale must be a number of the dtype (2**-k: head_dim 16, 64,
    256; not 128's 0.0884). A scale above 1 is left alone: its product may overflow to inf, where
    inf + -inf is NaN but a fused multiply-add of s, scale and -inf is -inf."""
    if scale > 1:
        return False
    if dtype in (torch.float32, torch.float64):
        return True
    return torch.tensor(scale, dtype=dtype).item() == scale


def _write(cache: torch.Tensor, col, new: torch.Tensor) -> None:
    """``cache[:, :, col] = new`` for an int column (eager) or a (1,) device tensor (graphed)."""
    if isinstance(col, torch.Tensor):
        cache.index_copy_(2, col, new.unsqueeze(2).to(cache.dtype))  # autocast: bf16 values, fp32 cache
    else:
        cache[:, :, col] = new


def graphable(model, device: torch.device) -> bool:
    """CUDA graphs replay fixed kernels: a CUDA device and rotary tables fixed per position. A 4-bit quantised
    base (QLoRA) is captured too: bitsandbytes' layers replayed in a graph drew the eager decode's tokens with
    log-probabilities equal to the bit on an H200 (tests/project/test_gpu.py, bench/RESULTS.md 2026-11-30)."""
    model = unwrapped(model)
    rope = getattr(getattr(text_model(model), "rotary_emb", None), "rope_type", None)
    return device.type == "cuda" and rope in STATIC_ROPE
