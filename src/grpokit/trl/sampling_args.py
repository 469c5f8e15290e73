"""TRL's vLLM arguments -> grpokit's vLLM backends (rollout.backend, rollout.vllm_*) and its TIS stage
(rollout.tis_mode, tis_cap, tis_min).

Part of mapping.py's table (its vLLM rule calls ``vllm_fields``); kept apart so each file stays
readable. The importance sampling weights, metrics, loss and gradient are checked against TRL's own
code in tests/trl/test_trl_importance_sampling.py.
"""

from __future__ import annotations

import math
from typing import Any

from grpokit.algo.tis import TIS_MODES
from grpokit.config.sections import ConfigError

from .config import GRPOConfig


def _refuse(name: str, value: Any, valid: str) -> ConfigError:
    return ConfigError(f"GRPOConfig argument {name}={value!r} is not supported by grpokit; valid: {valid}")


def vllm_fields(a: GRPOConfig, ctx: dict) -> dict[str, Any]:
    """use_vllm and the vllm_* arguments; ``ctx["world_size"]``: the number of trainer processes."""
    if not a.use_vllm:
        return {"rollout.backend": "hf"}
    if a.vllm_mode not in ("colocate", "server"):
        raise _refuse("vllm_mode", a.vllm_mode, "colocate, server")
    tp = (
        a.vllm_tensor_parallel_size if a.vllm_mode == "colocate" else 1
    )  # server mode: the server's own flag decides (as TRL)
    world = ctx["world_size"]
    if world % tp:  # as TRL: every group of tp consecutive processes shares one engine
        valid = ", ".join(str(d) for d in range(1, world + 1) if world % d == 0)
        raise ConfigError(
            f"GRPOConfig argument vllm_tensor_parallel_size={tp} must divide the {world} training processes "
            f"with vllm_mode='colocate' (each group of {tp} shares one vLLM engine); valid: {valid}"
        )
    url = a.vllm_server_base_url or f"http://{a.vllm_server_host}:{a.vllm_server_port}"
    return {
        "rollout.backend": "vllm" if a.vllm_mode == "colocate" else "vllm_server",
        "rollout.vllm_url": url,
        "rollout.vllm_startup_timeout": a.vllm_server_timeout,
        **importance_sampling_fields(a),
        "rollout.vllm_gpu_memory_utilization": a.vllm_gpu_memory_utilization,
        "rollout.vllm_sleep": a.vllm_enable_sleep_mode,
        # TRL hands it to the colocated engine only (checks.GATES); a server sets its own
        "rollout.vllm_max_model_len": (a.vllm_max_model_length or 0) if a.vllm_mode == "colocate" else 0,
        "rollout.vllm_tensor_parallel_size": tp,
    }


def importance_sampling_fields(a: GRPOConfig) -> dict[str, Any]:
    """TRL's vLLM importance sampling as grpokit's TIS stage: the mode by name, clip_max (or the deprecated
    cap, which replaces it when set) as tis_cap and clip_min as tis_min; None is no bound (inf, 0)."""
    if not a.vllm_importance_sampling_correction:
        return {"rollout.tis_cap": 0.0}
    if a.vllm_importance_sampling_mode not in TIS_MODES:
        raise _refuse("vllm_importance_sampling_mode", a.vllm_importance_sampling_mode, ", ".join(TIS_MODES))
    name = (
        "vllm_importance_sampling_cap"
        if a.vllm_importance_sampling_cap is not None
        else "vllm_importance_sampling_clip_max"
    )
    cap = math.inf if getattr(a, name) is None else getattr(a, name)
    if not cap >= 1:  # a weight bound below 1 shrinks every on-policy token's gradient
        raise _refuse(name, cap, "None or a number >= 1")
    floor = a.vllm_importance_sampling_clip_min
    if floor is not None and not (floor <= cap and math.isfinite(floor)):
        raise _refuse(
            "vllm_importance_sampling_clip_min", floor, f"None or a finite number up to the upper bound {cap}"
        )
    # ratios are > 0, so a bound at or below 0 bounds nothing, as TRL's None
    return {
        "rollout.tis_cap": cap,
        "rollout.tis_mode": a.vllm_importance_sampling_mode,
        "rollout.tis_min": max(floor or 0.0, 0.0),
    }
