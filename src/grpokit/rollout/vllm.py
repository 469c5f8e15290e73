"""Stage 2 on vLLM: a fast GPU sampler, colocated with the trainer or behind an HTTP server.

Colocated (``rollout.backend=vllm``). One ``vllm.LLM`` lives in the trainer's process on the same
GPU, started with sleep mode. Per step:

    generate  -> engine samples G completions per prompt (token ids + the sampler's logprobs)
    sleep(2)  -> the engine frees its weights and KV cache: the update gets the memory
    update    -> the trainer's forward/backward/optimizer step
    wake_up(["weights"]); load_weights(new policy); wake_up(["kv_cache"]); reset_prefix_cache()

Weights go to the engine by name through ``LLM.apply_model(lambda m: m.load_weights(items))``, which
needs the engine in this process (we set ``VLLM_ENABLE_V1_MULTIPROCESSING=0``). LoRA policies are
sent merged (``W + (alpha/r) B A``, computed without touching the live weights).

Tensor parallelism (``rollout.vllm_tensor_parallel_size`` > 1): one engine sharded over a group of
trainer ranks, which samples the group's prompts together (rollout/vllm_tp.py).

Server (``rollout.backend=vllm_server``), on other GPUs: stock vLLM started by ``grpokit vllm-serve``,
driven over HTTP by rollout/vllm_client.py (its docstring has the protocol; rollout/vllm_worker.py is
the part that runs inside vLLM).

The sampler's numerics differ from the trainer's, so its logprobs are kept in ``Rollout`` and the
loss is corrected by truncated importance sampling (tis.py). We ask vLLM for *processed* logprobs
(after temperature), the distribution that actually sampled.
"""

from __future__ import annotations

import os
from typing import Any

import torch

from grpokit.config.sections import ConfigError
from grpokit.types import Rollout

from .engine import SeparateEngine
from .hf import SamplingParams
from .static import unwrapped
from .vllm_images import llm_inputs


def policy_weights(model, merge: bool = True) -> dict[str, torch.Tensor]:
    """The policy's weights under plain Hugging Face names; LoRA adapters merged in (no mutation), or
    with ``merge=False`` the base weights alone (the adapters are synced on their own)."""
    base = unwrapped(model)
    out: dict[str, torch.Tensor] = {}
    for key, value in base.state_dict().items():
        if "lora_" in key:
            continue
        if ".base_layer." in key:
            path, leaf = key.split(".base_layer.")
            if leaf == "weight" and merge:
                layer = base.get_submodule(path)
                for name in layer.active_adapters:
                    value = value + layer.get_delta_weight(name).to(value.dtype)
            key = f"{path}.{leaf}"
        out[key] = value.detach()
    return out


def finish_reason(reason: str | None, stop_reason: Any) -> str:
    """vLLM's (finish_reason, stop_reason) as grpokit's "eos" | "stop" | "length". Only vLLM's "stop" ended
    by itself; what else came back ("length", "abort", none) was cut before its end, as TRL's last-token rule
    (rollout/finish.py) counts a completion without EOS last."""
    if reason != "stop":
        return "length"
    return "stop" if isinstance(stop_reason, str) else "eos"


def to_rollout(outputs: list[Any], prompt_ids: list[list[int]], group_size: int) -> Rollout:
    """Convert ``vllm.LLM.generate`` outputs (one per prompt, each with G samples) into a Rollout."""
    comps, logps, reasons = [], [], []
    for out in outputs:
        samples = sorted(out.outputs, key=lambda c: c.index)
        if len(samples) != group_size:
            raise RuntimeError(f"vLLM returned {len(samples)} samples for a prompt, expected {group_size}")
        for c in samples:
            ids = list(c.token_ids)
            comps.append(ids)
            logps.append(
                [float(step[t].logprob) for t, step in zip(ids, c.logprobs or [])] if c.logprobs else [0.0] * len(ids)
            )
            reasons.append(finish_reason(c.finish_reason, getattr(c, "stop_reason", None)))
    return Rollout([list(p) for p in prompt_ids], comps, logps, reasons, group_size)


def vllm_sampling_params(sp_cls, p: SamplingParams, group_size: int):
    """vLLM's ``SamplingParams`` (class ``sp_cls``) for G = ``group_size`` samples with the settings ``p``."""
    return sp_cls(
        n=group_size,
        temperature=p.temperature,
        top_p=p.top_p,
        top_k=p.top_k if p.top_k > 0 else -1,
        min_p=p.min_p,
        repetition_penalty=p.repetition_penalty,
        max_tokens=p.max_new_tokens,
        stop=list(p.stop) or None,
        logprobs=0,
        include_stop_str_in_output=True,
    )  # as the hf engine: a tag-format tool call keeps its closing tag


class VLLMColocated(SeparateEngine):
    """A ``vllm.LLM`` on the trainer's GPU that sleeps during the update."""

    def __init__(self, llm, sampling_params_cls, params: SamplingParams, *, sleep: bool):
        self.llm, self.sp_cls, self.params, self.sleep = llm, sampling_params_cls, params, sleep
        self.asleep = False

    def generate(
        self,
        prompt_ids: list[list[int]],
        group_size: int,
        params: SamplingParams | None = None,
        sleep: bool = True,
        images: list[list] | None = None,
    ) -> Rollout:
        """Sample; ``params`` overrides the run's (an episode's turn adds a stop string). The episode
        loop calls this once per turn with ``sleep=False``, then ``finish_sampling``; the trainer calls
        ``sleep_for_update`` once the step's last round is sampled. ``images``:
        each prompt's PIL images (image prompts; rollout/vllm_images.py)."""
        sp = vllm_sampling_params(self.sp_cls, params or self.params, group_size)
        outs = self.llm.generate(llm_inputs(prompt_ids, images), sp, use_tqdm=False)
        ro = to_rollout(outs, prompt_ids, group_size)
        if sleep:
            self.sleep_for_update()
        return ro

    def sleep_for_update(self) -> None:
        """The step's sampling is over, every dynamic-sampling round included: sleep (if configured) so
        the update gets the memory. Not after each round: a later round would meet an engine whose
        weights level 2 threw away."""
        if self.sleep and not self.asleep:  # weights are re-sent after the update anyway (level 2)
            self.llm.sleep(level=2)
            self.asleep = True

    def after_update(self, model, step: int) -> dict[str, float]:
        if self.asleep:
            self.llm.wake_up(tags=["weights"])
        items = list(policy_weights(model).items())
        self.llm.apply_model(lambda m: m.load_weights(items))
        if self.asleep:
            self.llm.wake_up(tags=["kv_cache"])
            self.asleep = False
        self.llm.reset_prefix_cache()  # cached prefixes were computed by the old weights
        return {"rollout/weight_sync_step": float(step)}


def make_colocated_engine(r, m, params: SamplingParams, device, seed: int, **engine_args: Any) -> VLLMColocated:
    """The ``rollout.backend=vllm`` engine from the rollout section ``r``, the model section ``m`` (its
    ``name_or_path`` a folder or hub id: the caller resolves "demo" and named models), the run's
    sampling settings, device and seed (vllm needs CUDA and the vllm package); ``engine_args`` go to
    ``vllm.LLM`` as well (a tensor-parallel group's, rollout/vllm_tp.py). A resumed run's caller
    then sends the policy's weights with ``after_update`` (the engine loads the base checkpoint)."""
    if device.type != "cuda":
        raise ConfigError(
            f"rollout.backend=vllm needs a CUDA GPU but the device is {device.type}; use rollout.backend=hf"
        )
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # engine in-process: apply_model can load weights
    try:
        import vllm
    except ImportError:
        raise ConfigError(
            "rollout.backend=vllm needs the vllm package (pip install 'grpokit[vllm]'); or use rollout.backend=hf"
        ) from None
    llm = vllm.LLM(
        model=m.name_or_path,
        gpu_memory_utilization=r.vllm_gpu_memory_utilization,
        enable_sleep_mode=r.vllm_sleep,
        dtype="bfloat16",
        seed=seed,
        logprobs_mode="processed_logprobs",
        trust_remote_code=m.trust_remote_code,
        max_model_len=r.vllm_max_model_len or None,
        **engine_args,
    )  # None: vLLM takes the model's own length
    return VLLMColocated(llm, vllm.SamplingParams, params, sleep=r.vllm_sleep)
