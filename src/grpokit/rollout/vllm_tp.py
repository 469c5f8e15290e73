"""Colocated vLLM with tensor parallelism: one engine sharded over a group of trainer ranks.

``rollout.vllm_tensor_parallel_size = T > 1`` (TRL 1.16's ``vllm_tensor_parallel_size`` with
``vllm_mode="colocate"``). The K ranks form K/T groups of T consecutive ranks; every rank of a group
builds the same ``vllm.LLM(tensor_parallel_size=T, distributed_executor_backend="external_launcher",
seed=<the group's>)``, so vLLM runs one shard of the engine in each of those trainer processes and
does its own communication over the trainer's process group::

    8 ranks, T = 2:   [0 1] [2 3] [4 5] [6 7]   four engines, each on two GPUs

The shards of one engine compute one forward together, so every rank of the group must make the
same engine call at the same time, with the same prompts and sampling settings. Per call:

    gather   every rank's request (its prompt ids, their images, G, sampling settings) goes to
             every rank of the group (``all_gather_object`` on the group's process group)
    sample   the group's engine samples all the requests in one call, one SamplingParams per
             prompt (``merged_inputs``)
    keep     each rank keeps the outputs of its own prompts, in its order (``own_outputs``)

Ranks need not sample the same number of times in a step: episodes run different numbers of turns,
and a rank may have no prompt in a round of dynamic sampling. A rank done sampling therefore calls
``finish_sampling``, which sends "no request" and joins the group's engine calls (throwing their
outputs away) until every rank of the group is done. Once the step's last round is sampled the
trainer calls ``sleep_for_update``, and the engine sleeps as without TP.

Weights: after each update every rank sends the whole policy (``after_update``, as with T = 1);
vLLM's weight loaders keep each rank's shard of it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Callable

import torch.distributed as tdist

from grpokit.config.sections import ConfigError
from grpokit.types import Rollout

from .engine import SeparateEngine
from .hf import SamplingParams
from .vllm import VLLMColocated, make_colocated_engine, to_rollout, vllm_sampling_params
from .vllm_images import llm_inputs


@dataclass(frozen=True)
class Request:
    """One rank's part of a group's engine call: prompts (with their images or None), G and settings."""

    prompt_ids: list[list[int]]
    images: list[list] | None
    group_size: int
    params: SamplingParams


def tp_groups(world_size: int, tp: int) -> list[list[int]]:
    """The ranks of each engine, consecutive groups of ``tp``: tp_groups(8, 2) = [[0, 1], [2, 3], [4, 5], [6, 7]]."""
    if tp < 1 or world_size % tp:
        raise ConfigError(
            f"rollout.vllm_tensor_parallel_size={tp} must divide the {world_size} ranks; "
            f"use one of: {', '.join(str(d) for d in range(1, world_size + 1) if world_size % d == 0)}"
        )
    return [list(range(g * tp, (g + 1) * tp)) for g in range(world_size // tp)]


def merged_inputs(
    requests: list[Request | None],
) -> tuple[list[list[int]], list[list] | None, list[tuple[int, SamplingParams]]]:
    """The group's prompts in member order (None, a member done sampling, adds none), their images
    (None when no prompt has one) and each prompt's (G, settings)."""
    live = [q for q in requests if q is not None]
    prompt_ids = [ids for q in live for ids in q.prompt_ids]
    images = [imgs for q in live for imgs in (q.images if q.images is not None else [[]] * len(q.prompt_ids))]
    settings = [(q.group_size, q.params) for q in live for _ in q.prompt_ids]
    return prompt_ids, (images if any(images) else None), settings


def own_outputs(outputs: list, requests: list[Request | None], member: int) -> list:
    """Member ``member``'s outputs: those of its own prompts, in order, from the group's outputs
    (one per prompt, in the order of ``merged_inputs``)."""
    start = sum(len(q.prompt_ids) for q in requests[:member] if q is not None)
    return outputs[start : start + len(requests[member].prompt_ids)]


class TensorParallelEngine(SeparateEngine):
    """This rank's handle on its group's sharded engine; ``gather(obj)`` returns every member's obj."""

    def __init__(self, inner: VLLMColocated, gather: Callable[[Any], list], member: int):
        self.inner, self.gather, self.member = inner, gather, member

    def generate(
        self,
        prompt_ids: list[list[int]],
        group_size: int,
        params: SamplingParams | None = None,
        sleep: bool = True,
        images: list[list] | None = None,
    ) -> Rollout:
        """As ``VLLMColocated.generate``, sampled by the whole group at once (the module docstring)."""
        mine = Request(
            [list(p) for p in prompt_ids],
            None if images is None else list(images),
            group_size,
            params or self.inner.params,
        )
        requests = self.gather(mine)
        ro = to_rollout(own_outputs(self._sample(requests), requests, self.member), prompt_ids, group_size)
        if sleep:
            self.finish_sampling()
            self.sleep_for_update()
        return ro

    def _sample(self, requests: list[Request | None]) -> list:
        """One engine call, the same on every rank of the group (same inputs, same settings)."""
        prompt_ids, images, settings = merged_inputs(requests)
        if not prompt_ids:  # every member sees the same requests, so all of them skip together
            return []
        sps = [vllm_sampling_params(self.inner.sp_cls, p, n) for n, p in settings]
        return self.inner.llm.generate(llm_inputs(prompt_ids, images), sps, use_tqdm=False)

    def finish_sampling(self) -> None:
        """Keep the group company until every member is done with this round of sampling."""
        while True:
            requests = self.gather(None)
            if all(q is None for q in requests):
                break
            self._sample(requests)  # another member's call: take part, keep nothing

    def sleep_for_update(self) -> None:
        self.inner.sleep_for_update()

    def after_update(self, model, step: int) -> dict[str, float]:
        return self.inner.after_update(model, step)  # every rank loads the whole policy; vLLM keeps its shard

    def close(self) -> None:
        self.inner.close()


def group_gather(group, size: int) -> Callable[[Any], list]:
    """``all_gather_object`` within the process group ``group`` of ``size`` ranks, in member order."""

    def gather(obj: Any) -> list:
        out: list = [None] * size
        tdist.all_gather_object(out, obj, group=group)
        return out

    return gather


def make_tensor_parallel_engine(r, m, params: SamplingParams, device, seed: int, dist) -> TensorParallelEngine:
    """The engine of this rank's group (``dist``: the DistContext; ``seed``: the same on every rank of
    the group, as the shards must sample the same tokens). Every rank creates every group's process
    group first (a collective), as TRL does, then vLLM creates its own groups over the same ranks."""
    tp = r.vllm_tensor_parallel_size
    group, _ = tdist.new_subgroups_by_enumeration(tp_groups(dist.world_size, tp))
    for key, value in (("RANK", dist.rank), ("LOCAL_RANK", dist.local_rank), ("WORLD_SIZE", dist.world_size)):
        os.environ[key] = str(value)  # vLLM's external launcher reads this rank's place from the environment
    inner = make_colocated_engine(
        r, m, params, device, seed, tensor_parallel_size=tp, distributed_executor_backend="external_launcher"
    )
    return TensorParallelEngine(inner, group_gather(group, tp), tdist.get_rank(group))
