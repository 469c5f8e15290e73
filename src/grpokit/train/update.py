"""Stage 6: the optimizer step over micro-batches with gradient accumulation.

The loss functions take the whole batch's normalisers (sequence and token counts), so summing the
micro-batches' gradients gives exactly the whole batch's gradient (tests/test_loss.py proves it on
tensors, tests/test_train.py on a model).
"""

from __future__ import annotations

import contextlib
import math
import warnings
import dataclasses

import torch

from grpokit.config.sections import AlgoConfig, OptimConfig
from .logprobs import completion_logprobs
from grpokit.algo.loss import objective_loss
from grpokit.algo.pipeline import UpdateInputs, loss_settings
from grpokit.algo.settings import LossTensors
from grpokit.types import TokenBatch


def make_optimizer(model: torch.nn.Module, cfg: OptimConfig, total_steps: int):
    params = [p for p in model.parameters() if p.requires_grad]
    # fused: one kernel over all parameters (CPU and CUDA); on a 33M-parameter model on CPU the step
    # takes ~26 ms instead of ~120 ms. Sharded (DTensor) parameters keep the default implementation.
    fused = bool(params) and all(p.device.type in ("cpu", "cuda") and p.is_floating_point() and type(p.data) is torch.Tensor
                                 for p in params)
    opt = torch.optim.AdamW(params, lr=cfg.lr, betas=(cfg.adam_beta1, cfg.adam_beta2), eps=cfg.adam_eps,
                            weight_decay=cfg.weight_decay, fused=fused or None)

    def factor(step: int) -> float:  # linear warm-up, then constant or cosine to 0
        if step < cfg.warmup_steps:
            return (step + 1) / (cfg.warmup_steps + 1)
        progress = min(1.0, (step - cfg.warmup_steps) / max(1, total_steps - cfg.warmup_steps))
        if cfg.schedule == "cosine":
            return 0.5 * (1.0 + math.cos(math.pi * progress))
        if cfg.schedule == "linear":
            return 1.0 - progress
        return 1.0

    return opt, torch.optim.lr_scheduler.LambdaLR(opt, factor)


def micro_batches(row_tokens: list[int], max_rows: int = 0, max_tokens: int = 0) -> list[slice]:
    """Cut rows ``0 .. N-1``, in order, into consecutive slices of at most ``max_rows`` rows and at
    most ``max_tokens`` tokens (``row_tokens[i]``: real tokens of row i; 0 = no limit). A row longer
    than the budget gets a slice of its own. Rows stay in order, so the G completions of a prompt
    stay together and share its forward (logprobs.py).

    Balanced: the fewest slices the limits allow, and among those the smallest largest slice, so a
    batch just over the budget becomes two halves, not a full slice and a sliver.
    Example: tokens [4] * 6, max_tokens 20 -> two slices are needed; a budget of 12 still gives two,
    11 would give three -> [0:3], [3:6] (12 tokens each) rather than [0:5], [5:6].
    """
    def cut(budget: int) -> list[slice]:
        out, start, tokens = [], 0, 0
        for i, n in enumerate(row_tokens):
            if (max_rows and i - start >= max_rows) or (budget and i > start and tokens + n > budget):
                out.append(slice(start, i))
                start, tokens = i, 0
            tokens += n
        return out + [slice(start, len(row_tokens))] if row_tokens else out

    best = cut(max_tokens)
    if not max_tokens or len(best) == len(cut(0)):  # the token budget does not bind: rows alone decide
        return best
    lo, hi = max(row_tokens), max_tokens  # the slice count only grows as the budget shrinks
    while lo < hi:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if len(cut(mid)) == len(best) else (mid + 1, hi)
    return cut(lo)


CPU_ACTIVATION_MB = 512  # train.activation_memory_mb=-1 on CPU


def activation_memory_mb(setting: int, device: torch.device) -> int:
    """Resolve ``train.activation_memory_mb``: -1 (auto) is 512 MB on CPU and a quarter of the
    device's memory on CUDA; other values are returned as they are (0 = no budget)."""
    if setting != -1:
        return setting
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).total_memory // 4 // 2**20
    return CPU_ACTIVATION_MB


def token_budget(model_config, memory_mb: int, bytes_per_value: int, max_tokens: int = 0) -> int:
    """Tokens per micro-batch: ``max_tokens``, lowered so the activations kept for backward fit in
    ``memory_mb`` (0 for either: no limit from it; 0 returned: no limit at all).

    A Llama-style layer keeps about 10 x hidden + 4 x intermediate values per token for its backward
    (norm inputs and outputs, q/k/v, attention output, residuals, gate, up, activation, product).
    Example: hidden 512, intermediate 1536, 8 layers, float32 -> 11,264 values x 8 x 4 B = 352 KiB a
    token, so 512 MB holds 1,489 tokens.
    """
    if not memory_mb:
        return max_tokens
    hidden = getattr(model_config, "hidden_size", None) or getattr(model_config, "n_embd", 0)
    layers = getattr(model_config, "num_hidden_layers", None) or getattr(model_config, "n_layer", 0)
    if not hidden or not layers:
        return max_tokens  # an unknown shape: no estimate
    inter = getattr(model_config, "intermediate_size", None) or 4 * hidden
    per_token = (10 * hidden + 4 * inter) * layers * bytes_per_value
    fit = max(1, memory_mb * 2**20 // per_token)
    return min(max_tokens, fit) if max_tokens else fit


def policy_update(model, optimizer, scheduler, inputs: UpdateInputs, algo: AlgoConfig, optim: OptimConfig,
                  *, temperature: float, micro_batch_size: int, norm_constant: float, dist=None,
                  autocast=None, micro_batch_tokens: int = 0) -> dict[str, float]:
    """One optimizer step: forward/backward every micro-batch, clip the gradient norm, step.

    Micro-batches hold at most ``micro_batch_size`` rows and ``micro_batch_tokens`` tokens (0: no
    limit); their gradients add up to the whole batch's, since every normaliser is the batch's own.
    ``dist`` (a ``distributed.DistContext``): normalisers become global counts and gradients are
    summed over ranks before clipping. ``autocast``: a context manager factory for the forwards.
    """
    N = inputs.batch.input_ids.shape[0]
    row_tokens = inputs.batch.attention_mask.sum(dim=1).tolist() if micro_batch_tokens else [0] * N
    num_tokens = float(inputs.loss_mask.sum().item())
    num_sequences = float(N)
    if dist is not None:  # data parallel: every rank divides by the whole batch's counts
        num_tokens, num_sequences = dist.sum_float(num_tokens), dist.sum_float(num_sequences)
    settings, norms = (inputs.loss, inputs.norms) if inputs.loss is not None else loss_settings(algo)
    norms = dataclasses.replace(norms, num_sequences=num_sequences, num_tokens=num_tokens,
                                norm_constant=norms.norm_constant if inputs.norms is not None else norm_constant)
    model.train()
    optimizer.zero_grad(set_to_none=True)
    sums: dict[str, float] = {}
    loss_total, ent_sum, ent_tok = 0.0, 0.0, 0.0
    for rows in micro_batches(row_tokens, micro_batch_size, micro_batch_tokens):
        mb = inputs.batch.rows(rows)
        with (autocast() if autocast is not None else contextlib.nullcontext()):
            logp, entropy = completion_logprobs(model, mb, temperature=temperature, with_entropy=True,
                                                entropy_grad=settings.entropy.coef != 0.0)
        old = inputs.old_logp[rows] if inputs.old_logp is not None else logp.detach()
        ref = inputs.ref_logp[rows] if inputs.ref_logp is not None else None
        loss, m = objective_loss(LossTensors(
            logp, old, inputs.advantages[rows], inputs.loss_mask[rows], ref_logp=ref, entropy=entropy,
            turn_ids=inputs.turn_ids[rows] if inputs.turn_ids is not None else None,
            seq_weights=inputs.seq_weights(rows) if inputs.seq_weights is not None else None), settings, norms)
        loss.backward()
        loss_total += loss.item()
        n_tok = m.pop("num_tokens")
        for k, v in m.items():  # token-weighted means over micro-batches
            sums[k] = sums.get(k, 0.0) + (v if k.startswith("offpolicy/") else v * n_tok)
        # entropy over every completion token, also those a variant leaves out of the loss
        ent_sum += float((entropy.detach() * mb.completion_mask).sum().item())
        ent_tok += float(mb.completion_mask.sum().item())
    params = [p for g in optimizer.param_groups for p in g["params"]]
    if dist is not None and dist.active:  # sum gradients and the metric sums over ranks
        dist.sync_grads(params)
        loss_total, ent_sum, ent_tok = (dist.sum_float(v) for v in (loss_total, ent_sum, ent_tok))
        sums = {k: dist.sum_float(v) for k, v in sorted(sums.items())}
    max_norm = optim.max_grad_norm if optim.max_grad_norm > 0 else float("inf")
    grad_norm = float(torch.nn.utils.clip_grad_norm_(params, max_norm))
    metrics = {k: (v if k.startswith("offpolicy/") else v / max(num_tokens, 1.0)) for k, v in sums.items()}
    metrics.update(loss=loss_total, grad_norm=grad_norm, learning_rate=scheduler.get_last_lr()[0],
                   entropy=ent_sum / max(ent_tok, 1.0))
    if not (math.isfinite(loss_total) and math.isfinite(grad_norm)):
        optimizer.zero_grad(set_to_none=True)  # a non-finite step is skipped, never applied
        metrics["skipped_nonfinite"] = 1.0
        with warnings.catch_warnings():  # the schedule still advances, so a resumed run stays aligned
            warnings.simplefilter("ignore", UserWarning)
            scheduler.step()
    else:
        optimizer.step()
        metrics["skipped_nonfinite"] = 0.0
        scheduler.step()
    return metrics
