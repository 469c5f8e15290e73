"""The Triton kernels behind nn/vocab.py (imported only where Triton is; see that module's docstring).

One program per row, reading the row ``BLOCK`` logits at a time. Running sums are kept per lane (a
running maximum ``m`` and ``s = sum exp(x - m)``, rescaled by ``exp(m_old - m_new)`` when the maximum
grows) and merged across lanes once at the end, so the loop has no cross-lane reduction. Running
maxima start at -3e38, a finite floor: a logit at -inf (a masked lane, a hidden token) then adds
``exp(-inf - floor) = 0``, where a -inf start would give ``exp(-inf + inf) = NaN``. A NaN logit makes
its row's sum NaN, so the row's log-probability is NaN, as torch's softmax makes it.
"""

from __future__ import annotations

import types

import triton
import triton.language as tl


@triton.jit
def _merge(m_vec, s_vec):
    """A row's maximum and ``sum exp(x - max)`` from the per-lane ones, and each lane's rescale factor."""
    m = tl.max(m_vec, 0)
    scale = tl.exp(m_vec - m)
    return m, tl.sum(s_vec * scale, 0), scale


@triton.jit
def sample_kernel(x_ptr, stride, V, inv_t, seed_ptr, tok_ptr, logp_ptr, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    base = x_ptr + row.to(tl.int64) * stride
    seed = tl.load(seed_ptr) + row  # one Philox key per row; the column is the counter
    lanes = tl.arange(0, BLOCK)
    m_vec = tl.full([BLOCK], -3.0e38, tl.float32)
    s_vec = tl.zeros([BLOCK], dtype=tl.float32)
    best = tl.full([BLOCK], float("-inf"), tl.float32)
    best_i = tl.zeros([BLOCK], dtype=tl.int32)
    for start in range(0, V, BLOCK):
        cols = start + lanes
        x = tl.load(base + cols, mask=cols < V, other=float("-inf")).to(tl.float32) * inv_t
        m_new = tl.maximum(m_vec, x)
        s_vec = s_vec * tl.exp(m_vec - m_new) + tl.exp(x - m_new)
        m_vec = m_new
        # Gumbel-max: argmax(x / T + g), g = -log(-log u); u = 0 gives g = -inf, never drawn
        score = x - tl.log(-tl.log(tl.rand(seed, cols)))
        take = score > best
        best = tl.where(take, score, best)
        best_i = tl.where(take, cols, best_i)
    m, s, _ = _merge(m_vec, s_vec)
    tok = tl.min(tl.where(best == tl.max(best, 0), best_i, V), 0)  # the first column of the largest score
    x_tok = tl.load(base + tok).to(tl.float32) * inv_t
    tl.store(tok_ptr + row, tok.to(tl.int64))
    tl.store(logp_ptr + row, x_tok - m - tl.log(s))


@triton.jit
def logsumexp_kernel(
    z_ptr, stride, V, inv_t, tgt_ptr, lse_ptr, logp_ptr, ent_ptr, WITH_ENT: tl.constexpr, BLOCK: tl.constexpr
):
    row = tl.program_id(0)
    base = z_ptr + row.to(tl.int64) * stride
    lanes = tl.arange(0, BLOCK)
    m_vec = tl.full([BLOCK], -3.0e38, tl.float32)
    s_vec = tl.zeros([BLOCK], dtype=tl.float32)
    w_vec = tl.zeros([BLOCK], dtype=tl.float32)  # sum exp(x - m) x, for the entropy
    for start in range(0, V, BLOCK):
        cols = start + lanes
        x = tl.load(base + cols, mask=cols < V, other=float("-inf")).to(tl.float32) * inv_t
        m_new = tl.maximum(m_vec, x)
        rescale = tl.exp(m_vec - m_new)
        e = tl.exp(x - m_new)
        s_vec = s_vec * rescale + e
        if WITH_ENT:
            w_vec = w_vec * rescale + tl.where(e > 0, e * x, 0.0)  # e x is NaN at x = -inf, e = 0
        m_vec = m_new
    m, s, scale = _merge(m_vec, s_vec)
    lse = m + tl.log(s)
    x_t = tl.load(base + tl.load(tgt_ptr + row)).to(tl.float32) * inv_t
    tl.store(lse_ptr + row, lse)
    tl.store(logp_ptr + row, x_t - lse)
    if WITH_ENT:  # H = -sum p (x - lse) = lse - sum p x
        tl.store(ent_ptr + row, lse - tl.sum(w_vec * scale, 0) / s)


@triton.jit
def logit_grad_kernel(z_ptr, stride, V, inv_t, tgt_ptr, lse_ptr, g_ptr, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    base = z_ptr + row.to(tl.int64) * stride
    lanes = tl.arange(0, BLOCK)
    lse = tl.load(lse_ptr + row)
    g = tl.load(g_ptr + row) * inv_t
    t = tl.load(tgt_ptr + row)
    for start in range(0, V, BLOCK):
        cols = start + lanes
        ok = cols < V
        x = tl.load(base + cols, mask=ok, other=0.0).to(tl.float32)
        p = tl.exp(x * inv_t - lse)
        d = g * (tl.where(cols == t, 1.0, 0.0) - p)  # d(g logp_t)/dz = g (1[j = t] - p_j) / T
        tl.store(base + cols, d.to(z_ptr.dtype.element_ty), mask=ok)


def build() -> types.SimpleNamespace:
    return types.SimpleNamespace(sample=sample_kernel, logsumexp=logsumexp_kernel, logit_grad=logit_grad_kernel)
