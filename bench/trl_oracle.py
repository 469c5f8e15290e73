"""TRL's GRPO loss as a test oracle: the same fixed batch through TRL's own ``_compute_loss``.

We do not re-implement TRL here. ``GRPOTrainer._compute_loss`` is called unbound on a stand-in
object that carries only the attributes the method reads, and whose
``_get_per_token_logps_and_entropies`` returns the fixed log-probabilities we hand it. So TRL's
arithmetic (ratio, clipping, k3 KL, aggregation) runs unchanged on exactly our tensors, and
grpokit's ``policy_loss`` must produce the same number.

Both KL settings: ``bias_correction`` is TRL's ``use_bias_correction_kl`` (its default, True) and
grpokit's ``algo.kl_bias_correction``. ``entropy_NT`` with ``entropy_coef`` turns on TRL's entropy
bonus, a plain token mean, which grpokit computes with ``entropy_aggregation="token-mean"``.

Aggregation names (TRL ``loss_type`` -> grpokit ``aggregation``):
  grpo -> seq-mean-token-mean, bnpo/dapo -> token-mean, dr_grpo -> seq-mean-token-sum-norm.
Two loss types are other objectives (grpokit ``algo.objective``), with the aggregation TRL gives them:
  cispo -> objective cispo + token-mean (TRL's ``epsilon_high`` is the weight's cap itself, so
  grpokit's ``clip_high`` is ``epsilon_high - 1``); sapo -> objective sapo + seq-mean-token-mean
  (``sapo_temperature_pos/neg`` -> ``sapo_tau_pos/neg``); vespo -> objective vespo at trajectory ratio
  level + token-mean (``vespo_k/lambda_pos/neg`` -> ``vespo_pos/neg``). luspo is no new objective:
  the clipped surrogate with seq-mean-token-sum.
"""

from __future__ import annotations

from collections import defaultdict
from types import SimpleNamespace

import torch

TRL_TO_GRPOKIT = {
    "grpo": "seq-mean-token-mean",
    "bnpo": "token-mean",
    "dapo": "token-mean",
    "dr_grpo": "seq-mean-token-sum-norm",
}
TRL_OBJECTIVES = {"cispo": "token-mean", "sapo": "seq-mean-token-mean", "vespo": "token-mean"}  # other objectives
# luspo is the clipped surrogate summed over each completion's tokens, then averaged over completions


class _Accelerator:
    num_processes = 1
    sync_gradients = True

    def gather(self, x):
        return x

    gather_for_metrics = gather

    def reduce(self, x, reduction="sum"):
        return x

    def pad_across_processes(self, x, dim=0, pad_index=0):
        return x


def trl_loss(
    logp_NT,
    old_logp_NT,
    ref_logp_NT,
    advantages_N,
    mask_NT,
    *,
    loss_type: str,
    beta: float,
    epsilon_low: float = 0.2,
    epsilon_high: float = 0.2,
    max_completion_length: int | None = None,
    bias_correction: bool = False,
    level: str = "token",
    entropy_NT=None,
    entropy_coef: float = 0.0,
    delta: float | None = None,
    metrics: dict | None = None,
    tau_pos: float = 1.0,
    tau_neg: float = 1.05,
    vespo: tuple = (2.0, 3.0, 3.0, 2.0),
    is_ratio=None,
    top_entropy_quantile: float = 1.0,
    off_policy_threshold: float | None = None,
) -> torch.Tensor:
    """TRL's scalar GRPO loss (evaluation mode: no gradient-accumulation scaling) on fixed tensors.
    ``delta``: TRL's two-sided clipping bound. ``metrics``: receives TRL's logged metrics (``kl`` ...).
    ``is_ratio``: TRL's vLLM importance sampling ratio ((N, T) or (N, 1), ``trl_is_ratio``), which TRL
    multiplies into the per-token loss. ``top_entropy_quantile`` < 1: TRL's entropy mask over ``entropy_NT``
    (its ``get_high_entropy_mask``); ``off_policy_threshold``: TRL's off-policy sequence mask (drift from
    ``old_logp_NT``, TRL's choice without vLLM)."""
    from trl import GRPOTrainer

    T = logp_NT.shape[1]
    fake = _stand_in(
        training=False,
        importance_sampling_level=level,
        beta=beta,
        loss_type=loss_type,
        epsilon_low=epsilon_low,
        epsilon_high=epsilon_high,
        use_vllm=is_ratio is not None,
        vllm_importance_sampling_correction=is_ratio is not None,
        max_completion_length=max_completion_length or T,
        entropy_coef=entropy_coef,
        use_adaptive_entropy=False,
        _entropy_bonus_enabled=entropy_coef != 0.0,
        top_entropy_quantile=top_entropy_quantile,
        off_policy_mask_threshold=off_policy_threshold,
        get_off_policy_mask=GRPOTrainer.get_off_policy_mask,
        args=dict(
            use_bias_correction_kl=bias_correction,
            delta=delta,
            sapo_temperature_pos=tau_pos,
            sapo_temperature_neg=tau_neg,
            vespo_k_pos=vespo[0],
            vespo_lambda_pos=vespo[1],
            vespo_k_neg=vespo[2],
            vespo_lambda_neg=vespo[3],
        ),
    )
    entropy_NT = torch.ones_like(logp_NT) if entropy_NT is None else entropy_NT
    fake.get_high_entropy_mask = lambda e, m, t: GRPOTrainer.get_high_entropy_mask(fake, e, m, t)
    fake._get_per_token_logps_and_entropies = lambda *a, **k: (logp_NT, entropy_NT, None)
    inputs = _loss_inputs(logp_NT, old_logp_NT, advantages_N, mask_NT, ref_per_token_logps=ref_logp_NT)
    if is_ratio is not None:
        inputs["importance_sampling_ratio"] = is_ratio
    loss = GRPOTrainer._compute_loss(fake, None, inputs)
    if metrics is not None:
        metrics.update({k: v[-1] for k, v in fake._metrics["eval"].items()})
    return loss


def _stand_in(*, training: bool, args: dict, **attrs) -> SimpleNamespace:
    """A stand-in GRPOTrainer holding the attributes ``_compute_loss`` reads: one process, no gradient
    accumulation, token-level ratios clipped at 0.2 on both sides, no KL; ``attrs`` and ``args`` (its
    ``self.args``) set the rest."""
    from trl import GRPOTrainer

    base = dict(
        aux_loss_enabled=False,
        top_entropy_quantile=1.0,
        off_policy_mask_threshold=None,
        importance_sampling_level="token",
        beta=0.0,
        epsilon_low=0.2,
        epsilon_high=0.2,
        use_vllm=False,
        vllm_importance_sampling_correction=False,
        current_gradient_accumulation_steps=1,
        accelerator=_Accelerator(),
        _metrics=defaultdict(lambda: defaultdict(list)),
        get_gamma_weights=GRPOTrainer.get_gamma_weights,
    )
    return SimpleNamespace(
        **{**base, **attrs},
        model=SimpleNamespace(training=training),
        args=SimpleNamespace(steps_per_generation=1, **args),
    )


def _loss_inputs(logp_NT, old_logp_NT, advantages_N, mask_NT, **more) -> dict:
    """The batch ``_compute_loss`` reads: one placeholder prompt token per row, the given tensors."""
    N, T = logp_NT.shape
    dev = logp_NT.device
    return {
        "prompt_ids": torch.zeros((N, 1), dtype=torch.long, device=dev),
        "prompt_mask": torch.ones((N, 1), dtype=torch.long, device=dev),
        "completion_ids": torch.zeros((N, T), dtype=torch.long, device=dev),
        "completion_mask": mask_NT,
        "advantages": advantages_N,
        "old_per_token_logps": old_logp_NT,
        **more,
        "num_items_in_batch": mask_NT.sum(),
    }


def trl_adaptive_entropy_stand_in(
    coef: float, target: float, delta: float, lo: float, hi: float, loss_type: str = "dapo"
):
    """A stand-in GRPOTrainer in training mode with TRL's adaptive entropy control on (one process,
    gradient_accumulation_steps=1): pass it to ``trl_adaptive_step`` step after step; TRL's own code
    moves its ``entropy_coef`` and ``_last_world_entropy``."""
    return _stand_in(
        training=True,
        loss_type=loss_type,
        max_completion_length=None,
        entropy_coef=coef,
        use_adaptive_entropy=True,
        _entropy_bonus_enabled=True,
        _last_world_entropy=float("inf"),
        _entropy_window_stats=None,
        args=dict(
            use_bias_correction_kl=False,
            delta=None,
            entropy_target=target,
            entropy_coef_delta=delta,
            entropy_coef_min=lo,
            entropy_coef_max=hi,
        ),
    )


def trl_adaptive_step(fake, logp_NT, old_logp_NT, advantages_N, mask_NT, entropy_NT) -> torch.Tensor:
    """One optimizer step's loss through TRL's ``_compute_loss`` on ``fake`` (which it updates)."""
    from trl import GRPOTrainer

    fake.max_completion_length = logp_NT.shape[1]
    fake._get_per_token_logps_and_entropies = lambda *a, **k: (logp_NT, entropy_NT, None)
    return GRPOTrainer._compute_loss(fake, None, _loss_inputs(logp_NT, old_logp_NT, advantages_N, mask_NT))


def grpokit_loss(
    logp_NT,
    old_logp_NT,
    ref_logp_NT,
    advantages_N,
    mask_NT,
    *,
    loss_type: str,
    beta: float,
    epsilon_low: float = 0.2,
    epsilon_high: float = 0.2,
    max_completion_length: int | None = None,
    bias_correction: bool = False,
    level: str = "token",
    entropy_NT=None,
    entropy_coef: float = 0.0,
    delta: float | None = None,
    metrics: dict | None = None,
    tau_pos: float = 1.0,
    tau_neg: float = 1.05,
    vespo: tuple = (2.0, 3.0, 3.0, 2.0),
    is_weights=None,
    top_entropy_quantile: float = 1.0,
    off_policy_threshold: float | None = None,
) -> torch.Tensor:
    """grpokit's loss as grpokit.trl maps TRL's arguments (``level``: TRL's ``importance_sampling_level``);
    ``is_weights``: ``(N, T)`` sampler-correction weights (``tis.tis_weights``), applied as the
    TIS pipeline stage does, a factor of each token's policy term. ``top_entropy_quantile`` < 1: the entropy
    top-fraction's policy mask (``masks.entropy_token_mask`` over ``entropy_NT``, as the pipeline's
    ``entropy_top`` stage); ``off_policy_threshold``: ``algo.offpolicy_delta``."""
    from grpokit.algo.loss import policy_loss
    from grpokit.algo.masks import entropy_token_mask
    from grpokit.trl.args.loss import TRL_RATIO_LEVELS

    extra = {}
    if is_weights is not None and loss_type == "vespo":  # the pipeline's vespo_sampler_weight: into VESPO's log w
        from grpokit.algo.vespo import sampler_log_weight

        extra["sampler_log_weight_N"] = sampler_log_weight(is_weights)
    elif is_weights is not None:
        extra["policy_weight_NT"] = is_weights  # the pipeline's tis policy weight: a factor of the policy term
    objective = loss_type if loss_type in TRL_OBJECTIVES else "clip"
    aggregation = TRL_OBJECTIVES.get(loss_type) or TRL_TO_GRPOKIT.get(loss_type) or "seq-mean-token-sum"  # luspo
    # TRL's level as grpokit.trl maps it (sequence: sequence_whole, GSPO's sequence objective)
    level = "trajectory" if loss_type == "vespo" else TRL_RATIO_LEVELS[level]
    if objective == "cispo":  # TRL caps the weight at epsilon_high itself; grpokit at 1 + clip_high
        epsilon_high = epsilon_high - 1.0
    # TRL's delta caps the ratio; with delta > 1 + epsilon_high that is dual-clip PPO's bound for A < 0
    if top_entropy_quantile < 1.0:  # the entropy_top stage's policy mask (pipeline.token_masks)
        extra["policy_mask_NT"] = entropy_token_mask(entropy_NT, mask_NT, top_entropy_quantile)

    loss, m = policy_loss(
        logp_NT,
        old_logp_NT,
        advantages_N,
        mask_NT,
        clip_low=epsilon_low,
        clip_high=epsilon_high,
        ref_logp_NT=ref_logp_NT,
        beta=beta,
        kl_estimator="k3",
        kl_bias_correction=bias_correction,
        dual_clip=delta,
        ratio_level=level,
        aggregation=aggregation,
        objective=objective,
        sapo_tau_pos=tau_pos,
        sapo_tau_neg=tau_neg,
        vespo_pos=vespo[:2],
        vespo_neg=vespo[2:],
        norm_constant=float(max_completion_length or logp_NT.shape[1]),
        entropy_NT=entropy_NT,
        entropy_coef=entropy_coef,
        entropy_aggregation="token-mean",
        offpolicy_delta=off_policy_threshold,
        **extra,
    )
    if metrics is not None:
        metrics.update(m)
    return loss


def _trl_block(start: str, end: str) -> str:
    """The lines of TRL's ``_generate_and_score_completions`` from the one holding ``start`` up to the
    one holding ``end``, dedented: TRL's own code, run unchanged by ``trl_is_ratio``."""
    import inspect
    import textwrap

    from trl import GRPOTrainer

    lines = inspect.getsource(GRPOTrainer._generate_and_score_completions).splitlines()
    i = next(k for k, line in enumerate(lines) if start in line)
    j = next(k for k in range(i + 1, len(lines)) if end in lines[k])
    return textwrap.dedent("\n".join(lines[i:j]))


def trl_advantages(rewards_NF, weights, group_size: int, scale_rewards: str, aggregation: str):
    """TRL's advantages of ``rewards_NF`` (N, F; NaN where a function returned None), by running the block of
    TRL's sampling method that computes them (unscorable rows, both multi_objective_aggregation modes, every
    scale_rewards) unchanged on these tensors, one process."""
    import trl.trainer.grpo_trainer as module

    fake = SimpleNamespace(
        multi_objective_aggregation=aggregation,
        scale_rewards=scale_rewards,
        reward_weights=torch.tensor(weights, dtype=torch.float32),
        num_generations=group_size,
        reward_funcs=[None] * rewards_NF.shape[1],
    )
    scope = {"self": fake, "rewards_per_func": rewards_NF.clone(), "num_generations": group_size, "device": "cpu"}
    exec(_trl_block("unscorable_mask = torch.isnan", "# Slice to keep only the local part"), dict(vars(module)), scope)  # noqa: S102
    return scope["advantages"]


def trl_is_ratio(old_logp_NT, sampler_logp_NT, mask_NT, mode: str, clip_min, clip_max):
    """``(ratio, metrics)``: TRL's vLLM importance sampling ratio and its logged ``sampling/*`` metrics,
    by running the two blocks of TRL's sampling method that compute them on these tensors."""
    import trl.trainer.grpo_trainer as module

    fake = SimpleNamespace(
        use_vllm=True,
        vllm_importance_sampling_correction=True,
        vllm_importance_sampling_mode=mode,
        vllm_importance_sampling_clip_min=clip_min,
        vllm_importance_sampling_clip_max=clip_max,
        accelerator=_Accelerator(),
        _metrics=defaultdict(lambda: defaultdict(list)),
    )
    scope = {
        "self": fake,
        "old_per_token_logps": old_logp_NT,
        "sampling_per_token_logps": sampler_logp_NT,
        "completion_mask": mask_NT,
        "tool_mask": None,
        "device": old_logp_NT.device,
        "mode": "train",
    }
    for start, end in (
        (
            "# Compute the importance sampling ratio when using vLLM",
            "# Compute the per-token log probabilities for the reference",
        ),
        ("delta = torch.abs(old_per_token_logps - sampling_per_token_logps)", "output = {"),
    ):
        exec(_trl_block(start, end), dict(vars(module)), scope)  # noqa: S102  (TRL's installed source, a test oracle)
    return scope["vllm_importance_sampling_ratio"], {k: v[-1] for k, v in fake._metrics["train"].items()}


def fixed_batch(N: int = 6, T: int = 7, seed: int = 0):
    """A batch with ragged lengths, ratios inside and outside the clip range, both advantage signs."""
    g = torch.Generator().manual_seed(seed)
    logp = -torch.rand((N, T), generator=g) * 3
    old = logp + 0.4 * torch.randn((N, T), generator=g)  # ratios exp(+-0.4): many clipped
    ref = logp + 0.3 * torch.randn((N, T), generator=g)
    adv = torch.randn((N,), generator=g)
    lengths = torch.randint(1, T + 1, (N,), generator=g)
    mask = (torch.arange(T)[None] < lengths[:, None]).float()
    return logp, old, ref, adv, mask


def check_all(beta: float = 0.04, device: str = "cpu") -> dict[str, tuple[float, float]]:
    """``{loss_type/bias_correction: (trl, grpokit)}`` on the fixed batch (on ``device``), for every
    mapped loss type and both KL settings."""
    out = {}
    for lt in TRL_TO_GRPOKIT:
        for bc in (False, True):
            args = [t.to(device) for t in fixed_batch()]
            kw = dict(loss_type=lt, beta=beta, max_completion_length=9, bias_correction=bc)
            out[f"{lt}/bc={bc}"] = (float(trl_loss(*args, **kw)), float(grpokit_loss(*args, **kw)))
    return out


if __name__ == "__main__":
    for lt, (a, b) in check_all().items():
        print(f"{lt:14s} trl={a:.8f} grpokit={b:.8f} diff={abs(a - b):.2e}")
