"""The two passes of the forward KL on the teacher's top-k (algo.distill_top_k, algo/distill.py), each
reading whole-vocabulary distributions a block of positions at a time, so at most one (chunk, V) block
of logits exists at once, as the student's log-probability pass (logprobs.py) does.

* The teacher's pass (no gradient) keeps, per completion position, its k likeliest token ids and their
  log-probabilities, and the sampled token's log-probability (what algo.beta's KL to the teacher reads,
  in the reference's place), from one forward.
* The student's pass (the update's forward) gives what ``completion_logprobs`` gives (the sampled tokens'
  log-probabilities and entropies) plus the log-probabilities of the teacher's ids, from the same
  logits; under gradient each block is recomputed in the backward pass (activation checkpointing).

Both run one padded forward (no length buckets, packing or prefix tree: those only save compute, the
values are the same) at the loss temperature (algo.loss_temperature; by default rollout.temperature, so both
distributions are the ones that sampled).
"""

from __future__ import annotations

from typing import Callable

import torch
from torch.utils.checkpoint import checkpoint

from grpokit.algo.distill import TeacherTopK
from grpokit.types import TokenBatch

from .hidden_states import completion_logits, completion_states, sharded
from .logprobs import GPU_LOGITS_CHUNK_ELEMENTS, LOGITS_CHUNK_ELEMENTS


def teacher_top_k(
    teacher: torch.nn.Module, batch: TokenBatch, k: int, temperature: float, coef: float, rows: int = 0
) -> tuple[torch.Tensor, TeacherTopK]:
    """``(logp (N, T), top)``: the teacher's log-probabilities of the sampled tokens and its ``k``
    likeliest ids with their log-probabilities ``(N, T, k)`` (``k`` capped at the vocabulary), ``rows``
    sequences a forward (0: all; train.micro_batch_size)."""
    offloaded = getattr(teacher, "grpokit_offloaded", False)  # on CPU between its passes (memory_plan.py)
    if offloaded:
        teacher.to(batch.input_ids.device)
    N, T = batch.completion_ids.shape
    try:
        with torch.no_grad():
            step = rows or N
            parts = [_teacher_rows(teacher, batch.rows(slice(s, s + step)), k, temperature) for s in range(0, N, step)]
    finally:
        if offloaded:
            teacher.to("cpu")
    logp, ids, top_logp = (torch.cat([p[i] for p in parts]) for i in range(3))
    K = ids.shape[-1]
    return logp.view(N, T), TeacherTopK(ids=ids.view(N, T, K), logp=top_logp.view(N, T, K), coef=coef)


def _teacher_rows(teacher, batch: TokenBatch, k: int, temperature: float):
    """``(logp (n*T,), ids (n*T, k), top_logp (n*T, k))`` of one forward over ``batch``'s rows."""
    x, head = _final_states(teacher, batch)
    t = batch.completion_ids.reshape(-1)
    parts = [
        _teacher_block(head(x[s : s + c]), t[s : s + c], k, temperature)
        for s, c in _blocks(x.shape[0], _vocab(head, x), x.device)
    ]
    return tuple(torch.cat([p[i] for p in parts]) for i in range(3))


def student_logprobs(
    model: torch.nn.Module, batch: TokenBatch, ids_NTK: torch.Tensor, temperature: float, entropy_grad: bool
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(logp (N, T), entropy (N, T), top_logp (N, T, K))``: the student's log-probabilities of the sampled
    tokens, its entropies (gradient only with ``entropy_grad``) and its log-probabilities of ``ids_NTK``."""
    x, head = _final_states(model, batch)
    N, T = batch.completion_ids.shape
    K = ids_NTK.shape[-1]
    t, ids = batch.completion_ids.reshape(N * T), ids_NTK.to(x.device).reshape(N * T, K)

    def block(x_c, t_c, ids_c):
        return _student_block(head(x_c), t_c, ids_c, temperature, entropy_grad)

    parts = []
    for s, c in _blocks(x.shape[0], _vocab(head, x), x.device):
        args = (x[s : s + c], t[s : s + c], ids[s : s + c])
        parts.append(checkpoint(block, *args, use_reentrant=False) if torch.is_grad_enabled() else block(*args))
    logp, ent, top = (torch.cat([p[i] for p in parts]) for i in range(3))
    return logp.view(N, T), ent.view(N, T), top.view(N, T, K)


def _final_states(model, batch: TokenBatch) -> tuple[torch.Tensor, Callable]:
    """``(x (N*T, D), head)``: the hidden states that predict the completion tokens and the output layer,
    or (models whose logits need more than a linear head) the completion positions' logits and identity."""
    if batch.vision is not None:
        raise ValueError(
            "algo.distill_top_k does not run on image prompts (the top-k pass has no multimodal forward); set it to 0"
        )
    N, T = batch.completion_ids.shape
    share = not sharded(next(model.parameters()))
    h = completion_states(model, batch, share)
    if h is not None:
        return h.reshape(N * T, h.shape[-1]), model.get_output_embeddings()
    logits = completion_logits(model, batch)
    return logits.reshape(N * T, logits.shape[-1]), lambda z: z


def _vocab(head, x: torch.Tensor) -> int:
    weight = getattr(head, "weight", None)
    return int(weight.shape[0]) if weight is not None else int(x.shape[-1])


def _blocks(K: int, V: int, device: torch.device) -> list[tuple[int, int]]:
    """``(start, size)`` of the position blocks: a (size, V) block of logits stays within logprobs.py's budget."""
    budget = LOGITS_CHUNK_ELEMENTS if device.type == "cpu" else GPU_LOGITS_CHUNK_ELEMENTS
    size = max(1, budget // max(V, 1))
    return [(s, min(size, K - s)) for s in range(0, K, size)]


def _log_softmax(z: torch.Tensor, temperature: float) -> torch.Tensor:
    z = z if z.dtype == torch.float64 else z.float()  # half precision: log-softmax in float32
    return torch.log_softmax(z / temperature if temperature != 1.0 else z, dim=-1)


def _teacher_block(z, t, k: int, temperature: float):
    logp_all = _log_softmax(z, temperature)
    top = logp_all.topk(min(k, logp_all.shape[-1]), dim=-1)
    return logp_all.gather(-1, t[:, None])[:, 0], top.indices, top.values


def _student_block(z, t, ids, temperature: float, entropy_grad: bool):
    logp_all = _log_softmax(z, temperature)
    src = logp_all if entropy_grad else logp_all.detach()
    return logp_all.gather(-1, t[:, None])[:, 0], -(src.exp() * src).sum(dim=-1), logp_all.gather(-1, ids)
