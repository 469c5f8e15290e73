"""The output layer, log-softmax and target pick as one autograd function, a chunk of positions at a time.

What ``log_softmax(h W^T + b)[target]`` costs when autograd runs it as written (checkpointed per
chunk, so it is also recomputed): the logits in float32, the whole (chunk, V) log-softmax written
out, and in the backward pass a (chunk, V) zero tensor scattered into by the gather's backward,
then log-softmax's backward over it. With a 151,936-token vocabulary those are ~50 bytes moved per
logit; an H100 profile of one 0.5B update (bench/RESULTS.md) spent 1.2 of its 4.9 GPU seconds in
them. The gradient needs none of it: for ``logp = z_t - logsumexp(z)`` with ``z = (h W^T + b) / T``,

    d logp / d z_j = (1[j = t] - p_j) / T,    p = exp(z - logsumexp(z)),

so the forward keeps one float per position (the log-sum-exp) and the backward recomputes each
chunk's logits and turns them into ``dz`` with three passes (a subtraction that reads the bf16
logits and writes float32, an exp, and a product written in the model's dtype): the same head
matmuls as checkpointing, no full-size log-softmax backward or scatter target.

Measured (bench/RESULTS.md, H100, 2026-11-27): a first form, whose forward used torch.logsumexp
(four passes where log_softmax is one kernel) and whose backward cast dz separately, left the 0.5B
update's time unchanged (5.13 against 5.18 s; by the passes counted, the forward's extra passes
took what the backward's saved; not profiled). The forward is log_softmax's again since; that form
is not measured on a card yet.

Where the head is marked for nn/vocab.py's kernels (``model.vocab_kernels``), each of those chains
is one Triton kernel instead: the forward reads the chunk's logits once (log-sum-exp, the target's
log-probability, the entropy), the backward writes ``dz`` over the logits in their dtype.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from grpokit.nn import vocab

# Devices where the fused function is used. On CPU the head is a float32 nn.Linear that
# grpokit.nn.kernels may route through oneDNN, which this function's plain matmuls would bypass;
# there the autograd path stays (tests switch CPU on to compare the two).
FUSED_DEVICES = ("cuda",)


def fusable(head: torch.nn.Module, h: torch.Tensor) -> bool:
    """Whether ``head`` is a plain linear layer this function can stand in for: exactly
    ``nn.Linear`` (not a quantised or adapter subclass), no hooks (offloading, PEFT), weights
    that are ordinary tensors (not FSDP shards), on a device of ``FUSED_DEVICES``, autocast off."""
    if type(head) is not torch.nn.Linear or h.device.type not in FUSED_DEVICES:
        return False
    if torch.is_autocast_enabled(h.device.type):  # the backward would recompute outside autocast
        return False
    if head._forward_hooks or head._forward_pre_hooks or hasattr(head, "_hf_hook"):
        return False
    return type(head.weight) in (torch.Tensor, torch.nn.Parameter)


def head_logprobs(
    head: torch.nn.Linear, h: torch.Tensor, targets: torch.Tensor, chunk: int, temperature: float, with_entropy: bool
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``(K,)`` float32 log-probabilities of ``targets`` under ``softmax(head(h) / temperature)`` for
    ``h`` (K, hidden), ``chunk`` positions at a time; and the entropies (no gradient) when asked. The
    passes over each chunk's logits are nn/vocab.py's Triton kernels where the head is marked for them
    (``model.vocab_kernels``) and they can read its dtype, torch's ops otherwise."""
    triton = vocab.marked(head) and vocab.usable_for(h.dtype, h.device)
    logp, ent = HeadLogprobs.apply(
        h, head.weight, head.bias, targets, float(temperature), int(chunk), with_entropy, triton
    )
    return logp, (ent if with_entropy else None)


def _scaled(z, temperature):
    """``z / temperature`` in float32 (float64 stays): a fresh tensor the caller may overwrite."""
    if z.dtype in (torch.float32, torch.float64):
        return z.div_(temperature) if temperature != 1.0 else z
    return z.float().div_(temperature) if temperature != 1.0 else z.float()


def _probs(z, temperature, lse_c):
    """``softmax(z / temperature)`` from the saved log-sum-exp, in its float precision: the
    subtraction reads the half-precision logits and writes float32 in one pass."""
    p = torch.sub(z, lse_c) if temperature == 1.0 else torch.sub(z, lse_c * temperature).div_(temperature)
    return p.exp_()


def _forward_chunk(z, t, temperature, with_entropy, triton):
    """``(lse, logp, entropy or None)`` of one chunk's logits ``z`` (before the temperature)."""
    if triton:  # one kernel reads the logits in their own dtype (nn/vocab.py)
        return vocab.logsumexp(z, t, temperature, with_entropy)
    # log_softmax is one kernel (torch.logsumexp would be four passes: amax, a written x - max, exp,
    # sum); the log-sum-exp the backward needs is z_t - logp_t
    z = _scaled(z, temperature)
    logp_all = torch.log_softmax(z, dim=-1)
    logp = logp_all.gather(1, t[:, None])[:, 0]
    ent = -torch.linalg.vecdot(logp_all.exp(), logp_all) if with_entropy else None  # H = -sum_j p_j log p_j
    return z.gather(1, t[:, None])[:, 0] - logp, logp, ent


def _logit_grad(z, t, lse_c, grad_c, temperature, triton, dtype):
    """``dz = g (onehot(t) - p) / T`` of one chunk, in ``dtype``."""
    if triton:  # written over the logits, in their dtype, by one kernel
        return vocab.logit_grad_(z, t, lse_c, grad_c, temperature)
    p = _probs(z, temperature, lse_c[:, None])
    p.scatter_add_(1, t[:, None], torch.ones_like(lse_c[:, None]).neg_())  # p - onehot
    g = grad_c.to(p.dtype)[:, None] / temperature
    # the product written straight in the model's dtype: one pass, no float32 dz
    return torch.mul(p, -g, out=p if p.dtype == dtype else torch.empty(p.shape, dtype=dtype, device=p.device))


class HeadLogprobs(torch.autograd.Function):
    """``(logp, entropy)`` of ``F.linear(h, weight, bias) / temperature``; see the module docstring."""

    @staticmethod
    def forward(ctx, h, weight, bias, targets, temperature, chunk, with_entropy, triton):
        K = h.shape[0]
        acc = torch.float64 if h.dtype == torch.float64 else torch.float32
        logp = torch.empty(K, dtype=acc, device=h.device)
        lse = torch.empty(K, dtype=acc, device=h.device)
        ent = torch.empty(K if with_entropy else 0, dtype=acc, device=h.device)
        for s in range(0, K, chunk):
            z = F.linear(h[s : s + chunk], weight, bias)
            lse[s : s + chunk], logp[s : s + chunk], e = _forward_chunk(
                z, targets[s : s + chunk], temperature, with_entropy, triton
            )
            if with_entropy:
                ent[s : s + chunk] = e
        ctx.save_for_backward(h, weight, bias, targets, lse)
        ctx.temperature, ctx.chunk, ctx.triton = temperature, chunk, triton
        ctx.mark_non_differentiable(ent)
        return logp, ent

    @staticmethod
    def backward(ctx, grad_logp, _grad_ent):
        h, weight, bias, targets, lse = ctx.saved_tensors
        need_h, need_w, need_b = ctx.needs_input_grad[:3]
        grad_h = torch.empty(h.shape, dtype=h.dtype, device=h.device) if need_h else None
        grad_w = torch.zeros_like(weight) if need_w else None
        grad_b = torch.zeros(bias.shape, dtype=lse.dtype, device=bias.device) if need_b else None
        for s in range(0, h.shape[0], ctx.chunk):
            h_c, sl = h[s : s + ctx.chunk], slice(s, s + ctx.chunk)
            z = F.linear(h_c, weight, bias)
            dz = _logit_grad(z, targets[sl], lse[sl], grad_logp[sl], ctx.temperature, ctx.triton, h.dtype)
            if need_b:
                grad_b += dz.sum(dim=0, dtype=grad_b.dtype)
            if need_h:
                torch.mm(dz, weight, out=grad_h[sl])
            if need_w:
                grad_w.addmm_(dz.t(), h_c)
        return grad_h, grad_w, (grad_b.to(bias.dtype) if need_b else None), None, None, None, None, None
