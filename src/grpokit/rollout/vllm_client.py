"""Stage 2 on a vLLM server on other GPUs (``rollout.backend=vllm_server``): the trainer's side.

The server is stock vLLM started by ``grpokit vllm-serve`` (rollout/vllm_serve.py), which adds
``VLLM_SERVER_DEV_MODE=1``, grpokit's worker extension (rollout/vllm_worker.py) and
``--logprobs-mode processed_logprobs``. The protocol, every endpoint being stock vLLM's (read in the
source of vLLM 0.10.2 and 0.33.0):

1. Readiness: ``GET /health`` until it answers 200 (the HTTP server only listens once the engine is
   up), then ``GET /v1/models`` for the served model name, then
   ``POST /collective_rpc {"method": "grpokit_info"}``: the extension must answer on every worker, speak
   our protocol version and report ``processed_logprobs`` (the sampler's logprobs feed TIS).
2. Sampling: ``POST /v1/completions`` with ``prompt`` = the list of token-id lists, ``n`` = G,
   ``logprobs: 0`` and ``return_tokens_as_token_ids: true``; every sampling field is sent, so the
   model's ``generation_config.json`` (which vLLM applies to fields a request leaves out) cannot change
   them. Choice ``index`` ``i*G + g`` is sample g of prompt i; its ``logprobs.tokens`` are
   ``"token_id:<id>"`` strings and ``logprobs.token_logprobs`` the sampler's logprobs. Image
   prompts go one request each to ``/v1/chat/completions/render`` (the images, as PNG data URLs)
   and ``/inference/v1/generate`` (our token ids with the rendered image features), as TRL 1.16's
   client does; rollout/vllm_images.py has the details.
3. Weight sync after every update (and once at start, so the server samples from exactly the
   trainer's weights from the first step on): rank 0 writes the policy (Hugging Face names, cast
   to the server's dtype) to ``{sync_dir}/step-N/model.safetensors`` on a filesystem
   both machines see, ``POST /collective_rpc {"method": "grpokit_load_weights", "args": [folder]}``,
   then ``POST /reset_prefix_cache`` (cached prefixes hold the old weights' keys and values) and
   deletes the previous step's folder; other ranks wait at a barrier. Under FSDP2 every rank
   first takes part in gathering the full weights to rank 0's CPU (a collective). There is no NCCL
   path: the shared filesystem costs one write and one read of the weights per step. With LoRA
   (``model.lora_rank`` > 0) the first sync writes the *base* weights (adapters not merged) and
   every sync then writes only the adapter, which vLLM's own LoRA loading serves by name
   (rollout/vllm_lora.py says how and why). ``rollout/weight_sync_bytes`` logs the bytes written.
"""

from __future__ import annotations

import os
import shutil
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable

import torch

from grpokit.config.sections import ConfigError
from grpokit.types import Rollout

from .engine import SeparateEngine
from .hf import SamplingParams
from .vllm import finish_reason, policy_weights
from .vllm_http import HTTPAnswer, http_call, parse_choices, reply_budget, sampling_fields
from .vllm_images import GENERATE, RENDER, generate_body, parse_generate, place, render_body
from .vllm_lora import LOAD, UNLOAD, adapter_rank, check_rank, check_server_lora, lora_call, peft_of, write_adapter
from .vllm_worker import EXTENSION, INFO_METHOD, LOAD_METHOD, PROTOCOL

IMAGE_REQUESTS = 16  # image prompts in flight at once (one request each, as TRL's client sends them)
MAX_PROMPTS_PER_REQUEST = (
    1024  # vLLM 0.33 refuses more prompts per request by default (envs.VLLM_MAX_COMPLETION_PROMPTS)
)
START_HINT = "start it with `grpokit vllm-serve MODEL` (docs/SCALING.md)"


class VLLMServer(SeparateEngine):
    """A vLLM server elsewhere, reached over HTTP (protocol in the module docstring)."""

    def __init__(
        self,
        url: str,
        params: SamplingParams,
        sync_dir: Path,
        *,
        startup_timeout: float = 600.0,
        request_timeout: float = 3600.0,
        is_main: bool = True,
        barrier: Callable[[], None] = lambda: None,
        call: Callable[[str, str, dict | None, float], HTTPAnswer] = http_call,
        gather: bool = False,
        image_token_id: int | None = None,
        lora: bool = False,
    ):
        self.url, self.params, self.sync_dir = url.rstrip("/"), params, Path(sync_dir)
        self.image_token_id = image_token_id  # image prompts: where their images sit in the prompt ids
        self.gather = gather  # FSDP2: the policy is sharded; every rank joins the full-weights gather
        self.startup_timeout, self.request_timeout = startup_timeout, request_timeout
        self.is_main, self.barrier, self.call = is_main, barrier, call
        self.last_folder: Path | None = None
        self.infos: list[dict] = []  # the workers' grpokit_info answers
        self.model_name, self.dtype = self.connect()
        # LoRA: adapter-only sync (rollout/vllm_lora.py); each adapter's name is new, this session's
        self.lora, self.adapter, self.session = lora, None, uuid.uuid4().hex[:8]
        self.base_synced = False
        if lora:
            check_server_lora(self.url, self.infos)

    # ------------------------------------------------------------------ readiness

    def connect(self) -> tuple[str, torch.dtype | None]:
        """Wait for the server, then check it is one grpokit can drive; returns (served model, weight dtype)."""
        deadline, last = time.monotonic() + self.startup_timeout, "no answer yet"
        while True:
            a = self.call("GET", f"{self.url}/health", None, 10.0)
            if a.status == 200:
                break
            last = f"HTTP {a.status}" if a.status else a.text
            if time.monotonic() >= deadline:
                raise ConfigError(
                    f"rollout.vllm_url: no vLLM server became ready at {self.url} within "
                    f"{self.startup_timeout:g} s (rollout.vllm_startup_timeout; {last}); {START_HINT} on the server "
                    "node, or fix rollout.vllm_url"
                )
            time.sleep(min(1.0, max(0.05, deadline - time.monotonic())))
        models = self.call("GET", f"{self.url}/v1/models", None, 30.0)
        data = models.body.get("data") if isinstance(models.body, dict) else None
        if models.status != 200 or not data:
            raise ConfigError(
                f"rollout.vllm_url: {self.url}/v1/models did not list a model (HTTP {models.status}); is this a "
                "vLLM server?"
            )
        infos = self.rpc(INFO_METHOD, [], 60.0)
        for info in infos:
            if not isinstance(info, dict) or info.get("protocol") != PROTOCOL:
                raise ConfigError(
                    f"the vLLM server at {self.url} runs grpokit weight-sync protocol "
                    f"{info.get('protocol') if isinstance(info, dict) else info!r}, "
                    f"this trainer speaks {PROTOCOL}; install the same grpokit version on both machines"
                )
            if info.get("logprobs_mode") != "processed_logprobs":
                raise ConfigError(
                    f"the vLLM server at {self.url} returns {info.get('logprobs_mode')!r} logprobs, but TIS needs the "
                    "sampler's processed_logprobs; restart it with --logprobs-mode processed_logprobs (grpokit "
                    "vllm-serve sets it)"
                )
        self.infos = infos
        dtype = getattr(torch, str(infos[0].get("dtype", "")), None)
        if not isinstance(data, list) or not isinstance(data[0], dict) or not isinstance(data[0].get("id"), str):
            raise ConfigError(
                f"rollout.vllm_url: {self.url}/v1/models answered without a model id ({models.text[:100]!r}); is "
                "this a vLLM server?"
            )
        return data[0]["id"], dtype if isinstance(dtype, torch.dtype) else None

    def rpc(self, method: str, args: list[str], timeout: float) -> list[Any]:
        """``POST /collective_rpc``: run ``method(*args)`` on every vLLM worker; one result per worker."""
        a = self.call(
            "POST", f"{self.url}/collective_rpc", {"method": method, "args": args, "timeout": timeout}, timeout + 60.0
        )
        if a.status == 404:
            raise ConfigError(
                f"the vLLM server at {self.url} has no /collective_rpc endpoint (it runs without "
                f"VLLM_SERVER_DEV_MODE=1); {START_HINT}"
            )
        if a.status == 0:
            raise RuntimeError(f"the vLLM server at {self.url} stopped answering during {method} ({a.text})")
        if a.status != 200 and method == INFO_METHOD:
            raise ConfigError(
                f"the vLLM server at {self.url} lacks grpokit's worker extension {EXTENSION} "
                f"(HTTP {a.status}: {a.message or 'no message'}); {START_HINT}"
            )
        if a.status != 200:
            hint = (
                "; the server must read rollout.vllm_sync_dir at the same path as the trainer"
                if method == LOAD_METHOD
                else ""
            )
            raise RuntimeError(
                f"the vLLM server at {self.url} failed {method} (HTTP {a.status}: {a.message or 'see its log'}){hint}"
            )
        results = a.body.get("results") if isinstance(a.body, dict) else None
        if not isinstance(results, list) or not results:
            raise RuntimeError(f"the vLLM server at {self.url} answered {method} without results: {a.text[:200]!r}")
        return results

    # ------------------------------------------------------------------ sampling

    @property
    def served(self) -> str:
        """What requests name as ``model``: the current adapter once one is loaded, else the base."""
        return self.adapter or self.model_name

    def generate(
        self,
        prompt_ids: list[list[int]],
        group_size: int,
        params: SamplingParams | None = None,
        sleep: bool = True,
        images: list[list] | None = None,
    ) -> Rollout:
        """G completions per prompt. ``params``: an episode's turn may add stop strings; ``sleep`` is
        the colocated engine's (a server has nothing to release); ``images``: each prompt's PIL
        images (image prompts go one request each, rollout/vllm_images.py)."""
        if images is not None:
            return self._generate_images(prompt_ids, images, group_size, params or self.params)
        comps, logps, reasons = [], [], []
        for start in range(0, len(prompt_ids), MAX_PROMPTS_PER_REQUEST):
            chunk = prompt_ids[start : start + MAX_PROMPTS_PER_REQUEST]
            for ids, lps, reason in self._complete(chunk, group_size, params or self.params):
                comps.append(ids)
                logps.append(lps)
                reasons.append(reason)
        return Rollout([list(x) for x in prompt_ids], comps, logps, reasons, group_size)

    def _complete(
        self, prompt_ids: list[list[int]], group_size: int, p: SamplingParams
    ) -> list[tuple[list[int], list[float], str]]:
        body = {
            "model": self.served,
            "prompt": [list(x) for x in prompt_ids],
            **sampling_fields(group_size, p),
            "return_tokens_as_token_ids": True,
        }
        n = len(prompt_ids) * group_size
        if self.call is http_call:  # a reply is bounded by what was asked for (a 1 GiB answer is refused)
            a = http_call(
                "POST", f"{self.url}/v1/completions", body, self.request_timeout, reply_budget(n, p.max_new_tokens)
            )
        else:
            a = self.call("POST", f"{self.url}/v1/completions", body, self.request_timeout)
        if a.status != 200:
            why = a.text if a.status == 0 else f"HTTP {a.status}: {a.message}"
            raise RuntimeError(f"the vLLM server at {self.url} failed to sample ({why})")
        return [(ids, lps, finish_reason(fin, stop)) for _, ids, lps, fin, stop in parse_choices(a.body, n)]

    def _generate_images(self, prompt_ids: list[list[int]], images: list[list], G: int, p: SamplingParams) -> Rollout:
        with ThreadPoolExecutor(max_workers=max(1, min(IMAGE_REQUESTS, len(prompt_ids)))) as pool:
            per_prompt = list(
                pool.map(lambda k: self._complete_images(prompt_ids[k], images[k], G, p), range(len(prompt_ids)))
            )
        rows = [row for rows in per_prompt for row in rows]
        return Rollout(
            [list(x) for x in prompt_ids],
            [r[0] for r in rows],
            [r[1] for r in rows],
            [finish_reason(r[2], None) for r in rows],
            G,
        )

    def _complete_images(
        self, ids: list[int], images: list, G: int, p: SamplingParams
    ) -> list[tuple[list[int], list[float], Any]]:
        """One image prompt's G samples: its images rendered by the server, then generated from our ids
        (a row without images among image rows: no render, no features, as TRL's client sends it)."""
        if not images:
            return self._generate_features(ids, None, G, p)
        if self.image_token_id is None:
            raise ConfigError(
                "rollout.backend=vllm_server got image prompts but the model's config has no image_token_id; "
                "use a vision-language model whose config names it, or rollout.backend=hf"
            )
        a = self.call("POST", f"{self.url}{RENDER}", render_body(self.model_name, images), self.request_timeout)
        if a.status == 404:
            raise ConfigError(
                f"the vLLM server at {self.url} has no {RENDER} endpoint, which image prompts need; "
                f"run vLLM >= 0.30 with --enable-scale-out ({START_HINT})"
            )
        if a.status != 200:
            raise RuntimeError(
                f"the vLLM server at {self.url} failed to process a prompt's images "
                f"({a.text if a.status == 0 else f'HTTP {a.status}: {a.message}'})"
            )
        features = place(a.body.get("features") if isinstance(a.body, dict) else None, ids, self.image_token_id)
        return self._generate_features(ids, features, G, p)

    def _generate_features(
        self, ids: list[int], features: dict | None, G: int, p: SamplingParams
    ) -> list[tuple[list[int], list[float], Any]]:
        """G samples of one prompt's ids with its rendered image features (None: a prompt without images)."""
        body = generate_body(self.served, ids, features, G, p)
        if self.call is http_call:  # a reply is bounded by what was asked for
            a = http_call(
                "POST", f"{self.url}{GENERATE}", body, self.request_timeout, reply_budget(G, p.max_new_tokens)
            )
        else:
            a = self.call("POST", f"{self.url}{GENERATE}", body, self.request_timeout)
        if a.status != 200:
            raise RuntimeError(
                f"the vLLM server at {self.url} failed to sample "
                f"({a.text if a.status == 0 else f'HTTP {a.status}: {a.message}'})"
            )
        return parse_generate(a.body, G)

    # ------------------------------------------------------------------ weight sync

    def after_update(self, model, step: int) -> dict[str, float]:
        metrics = {"rollout/weight_sync_step": float(step)}
        t0 = time.perf_counter()
        full = full_weights(model) if self.gather else None  # collective: every rank, before rank 0 writes
        if self.is_main:
            folder, nbytes = (self.sync_dir / f"step-{step:06d}").resolve(), 0
            if not self.lora or not self.base_synced:  # LoRA: the base once, unmerged
                nbytes += self.load_full(model, step, full)
                self.base_synced = True
            if self.lora:
                nbytes += self.load_adapter(model, step, folder)
            self.reset_prefix_cache()
            if self.last_folder is not None and self.last_folder != folder:
                shutil.rmtree(self.last_folder, ignore_errors=True)
            self.last_folder = folder
            metrics["time/weight_sync"] = time.perf_counter() - t0
            metrics["rollout/weight_sync_bytes"] = float(nbytes)
        self.barrier()  # no rank samples before the server holds the new weights
        return metrics

    def load_full(self, model, step: int, full: dict[str, torch.Tensor] | None) -> int:
        """Write the policy's full weights (LoRA: the base, adapters not merged) and have every vLLM
        worker load them; returns the bytes written."""
        folder, n_written, nbytes = self.write_weights(model, step, full)
        for r in self.rpc(LOAD_METHOD, [str(folder)], self.request_timeout):
            if not isinstance(r, dict) or r.get("tensors") != n_written:
                raise RuntimeError(f"the vLLM server loaded {r!r} from {folder}, expected {n_written} tensors")
        return nbytes

    def load_adapter(self, model, step: int, folder: Path) -> int:
        """Write the policy's LoRA adapter in PEFT's format, unload the previous one, load this one
        under a new name that sampling requests then name; returns the bytes written."""
        peft = peft_of(model)
        name, rank = adapter_rank(peft)
        check_rank(self.url, self.infos, rank)
        path, nbytes = write_adapter(peft, name, folder, self.dtype)
        if self.adapter is not None:  # first: vLLM's LRU keeps max_cpu_loras (1) adapters (vllm_lora.py)
            lora_call(self.call, self.url, UNLOAD, {"lora_name": self.adapter}, self.request_timeout)
            self.adapter = None
        new = f"grpokit-{self.session}-step-{step:06d}"
        lora_call(self.call, self.url, LOAD, {"lora_name": new, "lora_path": str(path)}, self.request_timeout)
        self.adapter = new
        return nbytes

    def write_weights(self, model, step: int, full: dict[str, torch.Tensor] | None = None) -> tuple[Path, int, int]:
        """Write the policy (``full``: its gathered weights, else ``model``'s own; LoRA adapters merged
        unless they are synced on their own) to ``{sync_dir}/step-N/model.safetensors`` (atomically:
        temp name, then rename); returns the folder, the number of tensors and their bytes."""
        from safetensors.torch import save_file

        folder = (self.sync_dir / f"step-{step:06d}").resolve()
        folder.mkdir(parents=True, exist_ok=True)
        weights, seen, nbytes = {}, set(), 0
        for name, t in (full if full is not None else policy_weights(model, merge=not self.lora)).items():
            key = (t.data_ptr(), tuple(t.shape))
            if key in seen:  # tied weights (lm_head = embed_tokens): vLLM skips the alias
                continue
            seen.add(key)
            if self.dtype is not None and t.is_floating_point():
                t = t.to(self.dtype)  # the server casts anyway; this halves the bytes of fp32 masters
            weights[name] = t.contiguous().cpu()
            nbytes += t.numel() * t.element_size()
        tmp = folder / "model.safetensors.partial"
        save_file(weights, str(tmp))
        os.replace(tmp, folder / "model.safetensors")
        return folder, len(weights), nbytes

    def reset_prefix_cache(self) -> None:
        # vLLM 0.33 answers {"success": false} while blocks are still held (serve/dev/cache/api_router.py): retry
        for _ in range(10):
            a = self.call("POST", f"{self.url}/reset_prefix_cache", None, 60.0)
            if a.status != 200:
                raise RuntimeError(
                    f"the vLLM server at {self.url} failed /reset_prefix_cache (HTTP {a.status}: {a.message})"
                )
            if not isinstance(a.body, dict) or a.body.get("success", True):
                return
            time.sleep(0.5)
        raise RuntimeError(
            f"the vLLM server at {self.url} kept refusing to reset its prefix cache (blocks still in use)"
        )


def full_weights(model) -> dict[str, torch.Tensor]:
    """An FSDP2-sharded policy's full weights on rank 0's CPU under Hugging Face names (empty on the
    other ranks); a tied output head is left out, as vLLM loads it with the embeddings."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if full and head is not None and getattr(model.config, "tie_word_embeddings", False):
        full.pop(next(n for n, m in model.named_modules() if m is head) + ".weight", None)
    return full


def make_server_engine(
    r, params: SamplingParams, run_dir: Path, dist, lora: bool = False, image_token_id: int | None = None
) -> VLLMServer:
    """The ``rollout.backend=vllm_server`` engine from the rollout section ``r``, the run's sampling
    settings, its folder (default home of the weight files), the distributed context ``dist``,
    whether the policy has LoRA adapters (then only they are synced after the first sync, and the
    server must have LoRA enabled) and the model's image token (image prompts); the caller pushes the
    policy's weights once with ``after_update``."""
    if dist.fsdp and lora:
        raise ConfigError(
            "rollout.backend=vllm_server with train.fsdp=true does not support model.lora_rank > 0 yet "
            "(sharded adapters are not merged for sync); set model.lora_rank=0 or train.fsdp=false"
        )
    sync_dir = Path(r.vllm_sync_dir) / run_dir.name if r.vllm_sync_dir else run_dir / "vllm-weights"
    return VLLMServer(
        r.vllm_url,
        params,
        sync_dir,
        startup_timeout=r.vllm_startup_timeout,
        request_timeout=r.vllm_request_timeout,
        is_main=dist.is_main,
        barrier=dist.barrier,
        gather=dist.fsdp,
        image_token_id=image_token_id,
        lora=lora,
    )
