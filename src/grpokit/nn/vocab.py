"""Passes over a (rows, vocabulary) logits tensor as one Triton kernel each, where torch runs several.

Both ends of a GRPO step touch every logit of every token: sampling draws a token from each row of
the decode step's (N, V) logits, and the update's output layer (train/head.py) turns each chunk of
(positions, V) logits into log-probabilities forward and their gradient backward. With a 151,936-token
vocabulary those passes, not the matmuls, set the time. An H100 profile (bench/RESULTS.md,
2026-11-27) counted 1.46 ms a decode step for sampling, against 5.28 ms for the whole decode graph,
and about 1.15 s of a 4.9 s update for the output layer's log-softmax and its backward. torch runs each
as a chain of full-size kernels: for sampling a float32 copy, the division by the temperature, a
softmax, the exponential noise and the division by it (the argmax reads it once more); for the head a
float32 copy, the log-softmax, and in the backward a subtraction, an exp and a product.

Each kernel here reads every logit once, in the dtype the matmul wrote (bf16 on a card), and keeps its
sums in float32 per lane of a block: the online log-sum-exp of Milakov & Gimelshein (arXiv
1805.02867), rescaling a running sum when its running maximum grows.

- ``sample``: one token per row from ``softmax(x / T)`` by the Gumbel-max trick (argmax of
  ``x / T + g``, ``g = -log(-log u)``, u uniform: Gumbel 1954; the same draw as torch.multinomial's
  argmax of p / q in distribution, not in its random stream) and the token's log-probability
  ``x_t / T - logsumexp(x / T)``. The uniforms come from Philox (Salmon et al., SC 2011) keyed by a
  seed drawn from the rollout's torch generator on the device (no host sync) plus the row, counted by
  the column: one generator state gives one set of tokens.
- ``logsumexp``: per row, ``logsumexp(x / T)``, the target's log-probability and optionally the
  entropy ``logsumexp - sum p x / T``.
- ``logit_grad_``: overwrites the logits with ``g (1[j = t] - p_j) / T``, the gradient of ``g logp_t``,
  in their own dtype.

Where: CUDA tensors, when Triton imports and ``model.vocab_kernels`` is not "torch" (``mark`` records
the choice on the output layer). Everywhere else, and for
float64 or greedy decoding, the callers keep their torch code, which the tests compare these kernels
with (on CPU through Triton's interpreter, TRITON_INTERPRET=1).
"""

from __future__ import annotations

import functools
import os

import torch

from grpokit.config.sections import ConfigError

# The attribute ``mark`` sets on a model's output layer: whether its logits may use these kernels.
MARK = "grpokit_vocab_kernels"
BLOCK = 2048  # logits a program reads at once: 8 KiB of float32 sums per lane set, a few loads in flight
DTYPES = (torch.bfloat16, torch.float16, torch.float32)
SEED_HIGH = 2**31 - 1  # seeds are drawn in [0, SEED_HIGH); adding a row keeps them in int64


MODES = ("auto", "triton", "torch")


def wanted(mode: str, device: torch.device) -> bool:
    """Resolve ``model.vocab_kernels`` for a model on ``device``. The kernels are compiled and run once
    on a few logits first: "auto" keeps torch's ops, with a printed line, where that fails (a Triton
    release that does not build them); "triton" refuses with the reason."""
    if mode == "torch":
        return False
    if device.type != "cuda" or not usable_for(torch.float32, device):  # never the interpreter in a run
        why = "Triton does not import here" if device.type == "cuda" else f"this run's device is {device.type}"
    else:
        why = probe(device)
    if why is None:
        return True
    if mode == "triton":
        raise ConfigError(
            f"model.vocab_kernels='triton' needs a CUDA device with Triton (pip install triton); {why}; "
            "set model.vocab_kernels=auto or torch"
        )
    if device.type == "cuda":
        print(f"grpokit: model.vocab_kernels=auto: {why}; torch's ops run", flush=True)
    return False


@functools.cache
def probe(device: torch.device) -> str | None:
    """Compile and run each kernel once on a few logits of ``device``: None, or why they failed."""
    try:
        x = torch.tensor([[0.0, 1.0, -1.0], [2.0, 0.0, float("-inf")]], device=device)
        t = torch.tensor([1, 0], device=device)
        sample(x.to(torch.bfloat16), 1.0, torch.Generator(device=device).manual_seed(0))
        lse, _, _ = logsumexp(x, t, 1.0, with_entropy=True)
        logit_grad_(x, t, lse, torch.ones(2, device=device), 1.0)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
    except Exception as e:  # a compile or launch failure: the caller keeps torch's ops
        return f"Triton could not build or run grpokit's kernels ({type(e).__name__}: {str(e)[:300]})"
    return None


def mark(model: torch.nn.Module, on: bool) -> None:
    """Record on ``model``'s output layer whether its logits may go through these kernels (copies of the
    model, the reference and a static decoder's, carry the attribute with the layer)."""
    head = _output_layer(model)
    if head is not None:
        setattr(head, MARK, on)


def marked(model_or_head: torch.nn.Module) -> bool:
    """Whether ``mark`` allowed these kernels for this model (or this output layer itself)."""
    head = _output_layer(model_or_head)
    head = model_or_head if head is None else head
    return bool(getattr(head, MARK, False))


def _output_layer(model: torch.nn.Module) -> torch.nn.Module | None:
    return model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None


def usable(x: torch.Tensor) -> bool:
    """Whether these kernels can read ``x``: rows of contiguous logits in a dtype they keep sums for, on
    a Triton-capable device (CUDA, or any under the interpreter), with Triton importable."""
    return x.dim() == 2 and x.stride(1) == 1 and usable_for(x.dtype, x.device)


def usable_for(dtype: torch.dtype, device: torch.device) -> bool:
    """``usable`` for logits of this dtype on this device, before they exist."""
    if dtype not in DTYPES or (device.type != "cuda" and os.environ.get("TRITON_INTERPRET") != "1"):
        return False
    return _kernels() is not None


def sample(x_NV: torch.Tensor, temperature: float, generator: torch.Generator | None):
    """``(tok (N,) int64, logp (N,) float32)``: one token per row of ``softmax(x_NV / temperature)``
    and its log-probability. A row holding NaN gets a NaN log-probability (the caller stops on it);
    logits at -inf are never drawn."""
    N, V = x_NV.shape
    seed = torch.randint(0, SEED_HIGH, (1,), generator=generator, device=x_NV.device)
    tok = torch.empty(N, dtype=torch.int64, device=x_NV.device)
    logp = torch.empty(N, dtype=torch.float32, device=x_NV.device)
    _kernels().sample[(N,)](x_NV, x_NV.stride(0), V, 1.0 / temperature, seed, tok, logp, BLOCK=BLOCK)
    return tok, logp


def logsumexp(z_KV: torch.Tensor, targets_K: torch.Tensor, temperature: float, with_entropy: bool):
    """``(lse, logp, entropy or None)``, each (K,) float32, of ``z_KV / temperature``: the
    log-sum-exp, the log-probability of ``targets_K``, the entropy."""
    K, V = z_KV.shape
    lse = torch.empty(K, dtype=torch.float32, device=z_KV.device)
    logp = torch.empty_like(lse)
    ent = torch.empty_like(lse) if with_entropy else lse  # not written without the flag
    k = _kernels().logsumexp
    k[(K,)](z_KV, z_KV.stride(0), V, 1.0 / temperature, targets_K, lse, logp, ent, WITH_ENT=with_entropy, BLOCK=BLOCK)
    return lse, logp, (ent if with_entropy else None)


def logit_grad_(z_KV: torch.Tensor, targets_K: torch.Tensor, lse_K: torch.Tensor, g_K: torch.Tensor, temperature):
    """Overwrite ``z_KV`` (the logits before the temperature) with ``d(g_k logp_k) / dz``:
    ``g (1[j = t] - softmax(z / T)_j) / T``, in ``z_KV``'s dtype. ``lse_K`` from ``logsumexp``."""
    K, V = z_KV.shape
    k = _kernels().logit_grad
    k[(K,)](z_KV, z_KV.stride(0), V, 1.0 / temperature, targets_K, lse_K, g_K.float().contiguous(), BLOCK=BLOCK)
    return z_KV


@functools.cache
def _kernels():
    """The jitted kernels, or None without Triton. Built on first use, so that TRITON_INTERPRET set
    by then (tests on CPU) takes effect; ``_kernels.cache_clear()`` rebuilds them."""
    try:
        import triton  # noqa: F401
    except ImportError:
        return None
    from grpokit.nn import vocab_kernels

    return vocab_kernels.build()
