"""LoRA adapter-only weight sync to a vLLM server (``rollout.backend=vllm_server``, ``model.lora_rank`` > 0).

Only the adapters change during a LoRA run, so after one full sync of the *base* weights (unmerged,
rollout/vllm_client.py's ``grpokit_load_weights``) each step sends the adapter alone: rank 0 writes it
in PEFT's own format (``adapter_config.json`` and ``adapter_model.safetensors``, written by peft's
``get_peft_model_state_dict`` and ``LoraConfig.save_pretrained``, cast to the server's dtype) to
``{sync_dir}/step-N/adapter/``, and the server samples with base + adapter.

Two ways were weighed against vLLM's source (read for this module in a code index, not checked out at
the 0.10.2 and 0.33.0 tags: the runtime-LoRA routes, ``OpenAIServingModels``, ``LoRAConfig``, from the
releases whose ``LoadLoRAAdapterRequest`` has only ``lora_name``/``lora_path`` to 0.3x's with
``load_inplace``); the first is used:

* vLLM's stock runtime LoRA loading (chosen): ``POST /v1/unload_lora_adapter {"lora_name": previous}``,
  ``POST /v1/load_lora_adapter {"lora_name", "lora_path"}`` (served when the server runs with
  ``VLLM_ALLOW_RUNTIME_LORA_UPDATING`` and ``--enable-lora --max-lora-rank R``), and every sampling
  request names the adapter as its ``model``. vLLM reads the PEFT folder itself (its own name
  mapping, tensor-parallel slicing and ``lora_dtype`` cast), which is why this is the one chosen:
  grpokit ships no LoRA code inside vLLM. Each step's adapter gets a new name
  (``grpokit-<session>-step-N``) rather than ``load_inplace``, which older releases lack: one request shape
  serves the whole version range, and a new name is a new ``lora_int_id``, so no cached prefix of an
  older adapter can ever match. The previous adapter is unloaded *before* the new one is loaded: vLLM
  keeps ``max_cpu_loras`` (default ``max_loras`` = 1) adapters, and newer releases' unload (an engine
  ``remove_lora``) fails on one its cache already evicted. The prefix cache is still reset (blocks of
  the old adapter are freed at once).
* An in-place swap through grpokit's worker extension (``/collective_rpc`` writing into vLLM's LoRA
  layers, or merging ``W + s B A`` into the base): it would sample at merged-weight speed (vLLM's
  punica LoRA kernels cost extra time per decode step, not measured here), but would have to
  re-implement vLLM's per-layer LoRA packing (fused qkv / gate-up, tensor-parallel shards), which
  changes between versions, or keep a second copy of the base on the server to merge from.

Refused in one sentence: a server without ``--enable-lora`` or without runtime LoRA updating
(``grpokit vllm-serve --lora-rank R MODEL`` sets both), an adapter rank above the server's
``--max-lora-rank``, and (vllm_client.py) FSDP2 with LoRA.
"""

from __future__ import annotations

import copy
import os
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from grpokit.config.sections import ConfigError

VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
"""The values vLLM's ``--max-lora-rank`` accepts (``MaxLoRARanks`` in vllm/config/lora.py, 0.10.2 to 0.33)."""
LOAD, UNLOAD = "/v1/load_lora_adapter", "/v1/unload_lora_adapter"
RUNTIME_FLAG = "VLLM_ALLOW_RUNTIME_LORA_UPDATING"

if TYPE_CHECKING:  # grpokit vllm-serve imports this module: no torch import at start
    import torch


def serve_rank(rank: int) -> int:
    """The smallest ``--max-lora-rank`` vLLM accepts that holds an adapter of rank ``rank``."""
    for r in VLLM_LORA_RANKS:
        if rank <= r:
            return r
    raise ConfigError(
        f"grpokit vllm-serve --lora-rank {rank}: vLLM serves LoRA ranks up to {VLLM_LORA_RANKS[-1]}; "
        "train with a smaller model.lora_rank"
    )


def check_server_lora(url: str, infos: list[dict]) -> None:
    """Refuse a server whose workers (``grpokit_info`` answers) cannot take runtime LoRA adapters."""
    hint = "restart it with `grpokit vllm-serve --lora-rank R MODEL` (R = model.lora_rank)"
    for info in infos:
        lora = info.get("lora")
        if not isinstance(lora, dict):
            raise ConfigError(
                f"the vLLM server at {url} was not started with LoRA enabled, which model.lora_rank > 0 needs "
                f"(only the adapters are synced); {hint}"
            )
        if not lora.get("runtime_updating"):
            raise ConfigError(
                f"the vLLM server at {url} does not allow runtime LoRA loading ({RUNTIME_FLAG} is not set), "
                f"which model.lora_rank > 0 needs; {hint}"
            )


def peft_of(model) -> Any:
    """The PEFT model inside ``model`` (a DDP or compile wrapper keeps it as ``.module`` / ``._orig_mod``)."""
    m = model
    for _ in range(4):
        if hasattr(m, "peft_config"):
            return m
        m = getattr(m, "module", None) or getattr(m, "_orig_mod", None)
    raise ConfigError("model.lora_rank > 0 but the policy has no PEFT adapters to sync")


def adapter_rank(peft) -> tuple[str, int]:
    """(adapter name, largest rank) of the one active adapter; vLLM serves one adapter per request."""
    names = peft.active_adapters if isinstance(peft.active_adapters, list) else [peft.active_adapter]
    if len(names) != 1:
        raise ConfigError(f"rollout.backend=vllm_server syncs one LoRA adapter, but {len(names)} are active")
    cfg = peft.peft_config[names[0]]
    return names[0], max([int(cfg.r), *map(int, (cfg.rank_pattern or {}).values())])


def check_rank(url: str, infos: list[dict], rank: int) -> None:
    """Refuse an adapter rank above what the server was started for (vLLM would refuse the load)."""
    most = min(int(i["lora"]["max_lora_rank"]) for i in infos)
    if rank > most:
        raise ConfigError(
            f"model.lora_rank={rank} is above the vLLM server's --max-lora-rank {most} at {url}; restart it with "
            f"`grpokit vllm-serve --lora-rank {rank} MODEL`"
        )


def write_adapter(peft, name: str, folder: Path, dtype: torch.dtype | None) -> tuple[Path, int]:
    """Write adapter ``name`` of ``peft`` in PEFT's format to ``folder/adapter`` (atomically: a
    ``.partial`` folder, then renamed); returns the folder and the tensors' bytes. ``dtype``: the
    server's, to which floating tensors are cast (vLLM casts to its ``lora_dtype`` anyway)."""
    from peft import get_peft_model_state_dict
    from safetensors.torch import save_file

    state = get_peft_model_state_dict(peft, adapter_name=name, save_embedding_layers=False)
    tensors, nbytes = {}, 0
    for key, t in state.items():
        t = t.detach()
        if dtype is not None and t.is_floating_point():
            t = t.to(dtype)
        tensors[key] = t.contiguous().cpu()
        nbytes += t.numel() * t.element_size()
    out, tmp = folder / "adapter", folder / "adapter.partial"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    save_file(tensors, str(tmp / "adapter_model.safetensors"), metadata={"format": "pt"})
    cfg = copy.deepcopy(peft.peft_config[name])
    cfg.inference_mode = True  # as peft's save_pretrained writes it
    if cfg.base_model_name_or_path is None:
        cfg.base_model_name_or_path = getattr(peft.get_base_model(), "name_or_path", None) or None
    cfg.save_pretrained(str(tmp))
    shutil.rmtree(out, ignore_errors=True)
    os.replace(tmp, out)
    return out, nbytes


def lora_call(call: Callable, url: str, path: str, body: dict, timeout: float) -> None:
    """``POST`` vLLM's runtime LoRA endpoint ``path`` (it answers 200 with plain text, or an error
    object); one sentence for any failure, as the full sync's RPC gives."""
    a = call("POST", f"{url}{path}", body, timeout)
    if a.status == 200:
        return
    if a.status == 404 and a.message == "Not Found":  # the route itself is absent, not an unknown adapter
        raise ConfigError(
            f"the vLLM server at {url} has no {path} endpoint (runtime LoRA updating is off); restart it with "
            "`grpokit vllm-serve --lora-rank R MODEL` (R = model.lora_rank)"
        )
    if a.status == 0:
        raise RuntimeError(f"the vLLM server at {url} stopped answering during {path} ({a.text})")
    hint = "; the server must read rollout.vllm_sync_dir at the same path as the trainer" if path == LOAD else ""
    raise RuntimeError(
        f"the vLLM server at {url} failed {path} for {body.get('lora_name')} "
        f"(HTTP {a.status}: {a.message or 'see its log'}){hint}"
    )
