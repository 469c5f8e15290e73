"""The fake vLLM server's runtime LoRA: ``/v1/load_lora_adapter``, ``/v1/unload_lora_adapter``, adapters
named as a request's ``model`` and listed by ``/v1/models``.

Read in vLLM 0.33.0: ``entrypoints/serve/lora/api_router.py`` (the routes exist only with
``VLLM_ALLOW_RUNTIME_LORA_UPDATING``; success is a 200 with plain text, failure an error object),
``entrypoints/openai/models/serving.py`` (``OpenAIServingModels``: a name already loaded is refused
unless ``load_inplace``, a new name gets the next ``lora_int_id``; unload asks the engine to
``remove_lora`` and answers 500 when its cache no longer holds it), ``lora/worker_manager.py``
(``LRUCacheWorkerLoRAManager``: ``max_cpu_loras`` adapters, default ``max_loras``, the oldest
evicted; the files are read when the adapter is added). 0.10.2 answers a failed add with 400
``BadRequestError`` instead of 500. The adapter is applied with peft (base + adapter, as vLLM's
LoRA layers compute it), on top of the fake's current base weights.
"""

from __future__ import annotations

import copy
import os
from pathlib import Path


def runtime_lora_enabled() -> bool:
    """vLLM's envs.VLLM_ALLOW_RUNTIME_LORA_UPDATING, read as vLLM reads it."""
    return os.environ.get("VLLM_ALLOW_RUNTIME_LORA_UPDATING", "0").strip().lower() in ("1", "true")


class FakeLoRA:
    """The server-side LoRA state; ``max_lora_rank`` None = started without ``--enable-lora``."""

    def __init__(self, max_lora_rank: int | None, max_loras: int = 1, flavor: str = "0.33.0"):
        self.max_lora_rank, self.max_loras, self.flavor = max_lora_rank, max_loras, flavor
        self.requests: dict[str, dict] = {}  # lora_name -> {"id", "path"}: OpenAIServingModels.lora_requests
        self.cache: dict[int, tuple] = {}  # lora_int_id -> (peft config, tensors): the workers' LRU, oldest first
        self.counter = 0

    def config(self):
        """What a worker's ``vllm_config.lora_config`` holds (None without --enable-lora)."""
        if self.max_lora_rank is None:
            return None
        from types import SimpleNamespace

        return SimpleNamespace(max_lora_rank=self.max_lora_rank, max_loras=self.max_loras)

    def load(self, body, error_body):
        name, path = (body or {}).get("lora_name"), (body or {}).get("lora_path")
        if not name or not path:
            return 400, error_body("Both 'lora_name' and 'lora_path' must be provided.", "InvalidUserInput", 400)
        if name in self.requests and not body.get("load_inplace"):
            return 400, error_body(
                f"The lora adapter '{name}' has already been loaded. If you want to load the adapter in place, "
                "set 'load_inplace' to True.",
                "InvalidUserInput",
                400,
            )
        lora_id = self.requests[name]["id"] if name in self.requests else self.counter + 1
        self.counter = max(self.counter, lora_id)
        try:
            self.add(lora_id, name, path)
        except FileNotFoundError:  # vllm/exceptions.py LoRAAdapterNotFoundError -> 404
            return 404, error_body(f"Loading lora {name} failed: No adapter found for {path}", "NotFoundError", 404)
        except Exception as e:  # noqa: BLE001 - models/serving.py: any other failure of add_lora
            code, kind = (400, "BadRequestError") if self.flavor == "0.10.2" else (500, "InternalServerError")
            return code, error_body(str(e), kind, code)
        self.requests[name] = {"id": lora_id, "path": path}
        return 200, f"Success: LoRA adapter '{name}' added successfully."

    def add(self, lora_id: int, name: str, path: str) -> None:
        """The engine's add_lora: a worker reads the PEFT folder into its LRU cache."""
        if self.max_lora_rank is None:
            raise RuntimeError("LoRA is not enabled.")  # v1/worker/lora_model_runner_mixin.py
        from peft import LoraConfig
        from safetensors.torch import load_file

        folder = Path(path)
        if not (folder / "adapter_config.json").exists():
            raise FileNotFoundError(path)
        cfg = LoraConfig.from_pretrained(str(folder))
        if cfg.r > self.max_lora_rank:  # lora/peft_helper.py validate_legal
            raise ValueError(f"LoRA rank {cfg.r} is greater than max_lora_rank {self.max_lora_rank}.")
        tensors = load_file(str(folder / "adapter_model.safetensors"))
        self.cache.pop(lora_id, None)
        while len(self.cache) >= self.max_loras:  # max_cpu_loras defaults to max_loras: evict the oldest
            self.cache.pop(next(iter(self.cache)))
        self.cache[lora_id] = (cfg, tensors)

    def unload(self, body, error_body):
        name = (body or {}).get("lora_name")
        if not name:
            return 400, error_body(
                "'lora_name' needs to be provided to unload a LoRA adapter.", "InvalidUserInput", 400
            )
        if name not in self.requests:
            return 404, error_body(f"The lora adapter '{name}' cannot be found.", "NotFoundError", 404)
        if self.cache.pop(self.requests[name]["id"], None) is None:  # engine remove_lora returned False
            return 500, error_body(
                f"Failed to remove lora adapter '{name}' from the engine.", "InternalServerError", 500
            )
        del self.requests[name]
        return 200, f"Success: LoRA adapter '{name}' removed successfully."

    def cards(self, base: str) -> list[dict]:
        """``/v1/models`` lists each loaded adapter after the base model."""
        return [
            {"id": n, "object": "model", "root": r["path"], "parent": base, "owned_by": "vllm"}
            for n, r in self.requests.items()
        ]

    def model_for(self, name: str, base_model):
        """The model a request naming adapter ``name`` samples with: base + adapter (None: no such adapter)."""
        from peft import get_peft_model, set_peft_model_state_dict

        req = self.requests.get(name)
        if req is None:
            return None
        if req["id"] not in self.cache:  # evicted: the worker reads the folder again
            self.add(req["id"], name, req["path"])
        cfg, tensors = self.cache[req["id"]]
        pm = get_peft_model(copy.deepcopy(base_model), copy.deepcopy(cfg))
        result = set_peft_model_state_dict(pm, tensors)
        assert not result.unexpected_keys, result.unexpected_keys
        return pm.eval()
