"""The doctor's advice worded by the run's own config (record/doctor.py): a change to try names the setting and
what it is now, and a setting the run already has is never advised (dynamic sampling to a run that samples
dynamically, truncation masking to a run whose zero gradients it caused, gradient clipping "kept on" in a run
that has it off). A run read without its config (a TRL output_dir, TensorBoard files) gets the general
advice, worded so it cannot contradict what it does not know.
"""

from __future__ import annotations

from .report_data import Run
from .run_series import config_value


def masks_truncated(run: Run) -> bool | None:
    """Whether completions cut at the length limit are left out of the loss (algo.mask_truncated, DAPO's
    overlong filtering; TRL's mask_truncated_completions maps to it); None when the config does not say."""
    on = config_value(run, "algo.mask_truncated", None)
    return on if isinstance(on, bool) else None


def clipping(run: Run) -> str:
    """Gradient clipping as the run has it: kept on, turned on where it is off (optim.max_grad_norm 0)."""
    limit = config_value(run, "optim.max_grad_norm", None)
    if isinstance(limit, (int, float)) and not isinstance(limit, bool):
        if limit > 0:
            return f"keep gradient clipping on (optim.max_grad_norm={limit:g}, lower to clip harder)"
        return "turn gradient clipping on (optim.max_grad_norm is 0: off; 1.0 is usual)"
    return "clip gradients (optim.max_grad_norm)"


def precision(run: Run) -> str:
    """bf16 over fp16, said only to a run that trains in float16 or whose dtype is not known."""
    dtype = config_value(run, "model.dtype", None)
    if dtype is None:
        return "prefer bf16 over fp16"
    return "train in bfloat16 rather than float16 (model.dtype=bfloat16)" if dtype == "float16" else ""


def dynamic_sampling(run: Run) -> str:
    """DAPO dynamic sampling: advised where it is off; where on, its rounds (algo.max_sampling_rounds) ran out."""
    if config_value(run, "algo.dynamic_sampling", None) is True:
        return (
            "dynamic sampling is on (algo.dynamic_sampling=true) and still found too few groups with signal: raise "
            f"algo.max_sampling_rounds (now {config_value(run, 'algo.max_sampling_rounds')})"
        )
    return "use dynamic sampling (algo.dynamic_sampling=true, DAPO)"


def fewer_iterations(run: Run) -> str:
    """Fewer updates per batch, said only where there are several (algo.num_iterations > 1) or their count is
    not known."""
    n = config_value(run, "algo.num_iterations", None)
    if isinstance(n, int) and not isinstance(n, bool) and n <= 1:
        return ""
    return f"fewer updates per batch (algo.num_iterations={config_value(run, 'algo.num_iterations')})"


def joined(*parts: str) -> str:
    """The non-empty parts, comma-separated."""
    return ", ".join(p for p in parts if p)
