"""The code grpokit runs *inside* a stock vLLM server: a worker extension for weight sync.

vLLM (checked in the source of 0.10.2 and 0.33.0) lets a server mix a class into every GPU worker with
``--worker-extension-cls QUALNAME`` (``vllm/v1/worker/worker_base.py``, ``WorkerWrapperBase.init_worker``:
the class is appended to the worker's ``__bases__``; an attribute the worker already has is refused,
which is why every name here starts with ``grpokit_``). With ``VLLM_SERVER_DEV_MODE=1`` the server
exposes ``POST /collective_rpc {"method": NAME, "args": [...], "timeout": s}``, which calls
``worker.NAME(*args)`` on every worker (all tensor-parallel ranks) and answers
``{"results": [one JSON value per worker]}`` (``vllm/entrypoints/serve/dev/rpc/api_router.py`` in 0.33,
``vllm/entrypoints/openai/api_server.py`` in 0.10.2). ``grpokit vllm-serve`` sets both.

Two methods, called by the trainer (rollout/vllm_client.py):

* ``grpokit_info()``: what the trainer must know about the engine before it trusts it (protocol
  version, logprobs mode, the dtype the weights live in, and whether vLLM's LoRA is on: ``--enable-lora``
  gives the worker a ``vllm_config.lora_config``, ``VLLM_ALLOW_RUNTIME_LORA_UPDATING`` the load endpoints;
  a LoRA policy's adapter-only sync needs both, rollout/vllm_lora.py);
* ``grpokit_load_weights(folder)``: stream every tensor of ``folder/*.safetensors`` (Hugging Face names)
  into the live model through the model's own ``load_weights`` -- the same entry vLLM's loader uses,
  so name mapping (fused qkv / gate-up) and tensor-parallel sharding are vLLM's, not ours.

This module imports only the standard library, torch and safetensors (vLLM ships both), so it loads in
a vLLM worker and in tests without vLLM. Only unquantized checkpoints are supported: quantized layers
need vLLM's post-load processing, which ``load_weights`` alone does not run.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Iterator

PROTOCOL = 2
"""Bumped when the trainer/extension contract changes; the trainer refuses a server speaking another
(2: ``grpokit_info`` reports ``lora``, for adapter-only sync)."""
EXTENSION = "grpokit.rollout.vllm_worker.WeightSyncExtension"
"""The qualified name ``grpokit vllm-serve`` passes to ``--worker-extension-cls``."""
INFO_METHOD = "grpokit_info"
LOAD_METHOD = "grpokit_load_weights"


def safetensors_items(folder: str | Path) -> Iterator[tuple[str, Any]]:
    """``(name, tensor)`` for every tensor in ``folder/*.safetensors``, read one at a time on the CPU."""
    from safetensors import safe_open

    files = sorted(Path(folder).glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(
            f"no *.safetensors file in {folder}: the folder must be on a filesystem this server can read"
        )
    for f in files:
        with safe_open(str(f), framework="pt", device="cpu") as fh:
            for name in fh.keys():
                yield name, fh.get_tensor(name)


class WeightSyncExtension:
    """Mixed into vLLM's GPU worker (``self`` is the worker: ``self.model_runner``, ``self.vllm_config``)."""

    def grpokit_info(self) -> dict[str, Any]:
        mc = self.vllm_config.model_config
        return {
            "extension": "grpokit",
            "protocol": PROTOCOL,
            "logprobs_mode": str(getattr(mc, "logprobs_mode", "")),
            "dtype": str(mc.dtype).replace("torch.", ""),
            "rank": int(getattr(self, "rank", 0)),
            "lora": lora_info(getattr(self.vllm_config, "lora_config", None)),
        }

    def grpokit_load_weights(self, folder: str) -> dict[str, Any]:
        model = self.model_runner.get_model()  # unwraps vLLM's CUDA-graph wrapper (both model runners)
        counted: list[int] = [0, 0]

        def items():
            for name, tensor in safetensors_items(folder):
                counted[0] += 1
                counted[1] += tensor.numel() * tensor.element_size()
                yield name, tensor

        model.load_weights(items())  # copies each tensor into its (sharded) parameter on the GPU
        return {"tensors": counted[0], "bytes": counted[1], "rank": int(getattr(self, "rank", 0))}


def lora_info(lora_config: Any) -> dict[str, Any] | None:
    """vLLM's LoRA settings as the trainer needs them, or None without ``--enable-lora``. The runtime
    flag is read as vLLM's envs.py reads it ("1" or "true", any case); the workers inherit the
    server's environment."""
    if lora_config is None:
        return None
    flag = os.environ.get("VLLM_ALLOW_RUNTIME_LORA_UPDATING", "0").strip().lower()
    return {
        "max_lora_rank": int(lora_config.max_lora_rank),
        "max_loras": int(lora_config.max_loras),
        "runtime_updating": flag in ("1", "true"),
    }
