"""What the trainer asks of whatever samples its completions: the ``RolloutEngine`` protocol.

Every engine implements all of it, so the loop calls each method at its point of the step and never
asks which engine it holds:

* ``HFEngine`` (this module): the trainer's own model, with rollout/hf.py's decode loop
  (``rollout.engine`` auto, static or dynamic) or transformers' ``generate()`` (``generate``);
* ``VLLMColocated`` (rollout/vllm.py), ``TensorParallelEngine`` (rollout/vllm_tp.py) and
  ``VLLMServer`` (rollout/vllm_client.py): a vLLM engine holding its own copy of the weights;
* ``AsyncRollout`` (rollout/async_.py): a background thread sampling the next batch on a snapshot;
  ``ProcessRollout`` (rollout/async_process.py): the same schedule in worker processes.
"""

from __future__ import annotations

from typing import Callable, Protocol, runtime_checkable

import torch

from grpokit.types import Rollout

from .hf import SamplingParams, generate

TurnSampler = Callable[..., Rollout]
"""``(contexts, group_size, params, images=None) -> Rollout``: one batched decode of an episode's turn."""


@runtime_checkable
class RolloutEngine(Protocol):
    """The sampling side of a step, in the order the loop calls it."""

    def prefetched(self, n: int, group_size: int) -> tuple[list, Rollout] | None:
        """``(prompts, rollout)`` sampled ahead of time for the next ``n`` prompts, or None: the loop
        draws the prompts and samples them itself."""

    def turn_sampler(self, model: torch.nn.Module, generator: torch.Generator | None = None) -> TurnSampler:
        """The function the episode loop calls once per turn; ``model`` is the policy to sample with
        when the engine samples on the trainer's model, ``generator`` a sampling RNG of the caller's
        (the async sampler's thread has its own)."""

    def finish_sampling(self) -> None:
        """A round of sampling is over on this rank (a tensor-parallel group waits for every member)."""

    def sleep_for_update(self) -> None:
        """The step's sampling is over: release what the update needs (a colocated engine's memory)."""

    def after_update(self, model: torch.nn.Module, step: int) -> dict[str, float]:
        """The policy ``model`` has made ``step`` updates: sync the weights; returns metrics to log."""

    def close(self) -> None:
        """Release the engine at the end of the run."""


class HFEngine:
    """Sampling on the trainer's own model: nothing to prefetch, sync or release."""

    def __init__(
        self,
        *,
        eos_token_ids: set[int],
        pad_token_id: int,
        decode: Callable[[list[int]], str],
        generator: torch.Generator,
        decoder: str = "auto",
        generation_kwargs: dict | None = None,
        cuda_graphs: bool = True,
    ):
        """``decoder``: rollout/hf.py's ``engine`` argument (auto, static, dynamic, generate);
        ``generator``: the trainer's sampling RNG, used when a caller brings none; ``cuda_graphs``:
        whether the static decoder may replay CUDA graphs."""
        self.eos_token_ids, self.pad_token_id, self.decode = eos_token_ids, pad_token_id, decode
        self.generator, self.decoder = generator, decoder
        self.generation_kwargs, self.cuda_graphs = generation_kwargs or None, cuda_graphs

    def prefetched(self, n: int, group_size: int) -> None:
        return None

    def turn_sampler(self, model: torch.nn.Module, generator: torch.Generator | None = None) -> TurnSampler:
        """Sampling with ``generator`` (a caller's, e.g. the async sampler's per batch) or the trainer's.
        CUDA graphs on any thread: rollout/step_graphs.py captures them in ``thread_local`` mode, on the
        asynchronous sampler's own stream beside the update (rollout/async_.py)."""
        gen = generator if generator is not None else self.generator
        graphs = self.cuda_graphs

        def sample(contexts, group_size: int, params: SamplingParams, images=None, **kw) -> Rollout:
            return generate(
                model,
                contexts,
                group_size,
                params,
                eos_token_ids=self.eos_token_ids,
                decode=self.decode,
                pad_token_id=self.pad_token_id,
                engine=self.decoder,
                generation_kwargs=self.generation_kwargs,
                generator=gen,
                cuda_graphs=graphs,
                **kw,
            )

        return sample

    def finish_sampling(self) -> None:
        pass

    def sleep_for_update(self) -> None:
        pass

    def after_update(self, model: torch.nn.Module, step: int) -> dict[str, float]:
        return {}

    def close(self) -> None:
        pass


class SeparateEngine:
    """The protocol's defaults for an engine with its own copy of the weights (vLLM): it samples
    every turn through its own ``generate(prompt_ids, group_size, params, sleep, images)``, ignoring
    the trainer's model, and prefetches nothing."""

    def prefetched(self, n: int, group_size: int) -> None:
        return None

    def turn_sampler(self, model: torch.nn.Module, generator: torch.Generator | None = None) -> TurnSampler:
        return lambda contexts, group_size, params, images=None, **kw: self.generate(
            contexts, group_size, params=params, sleep=False, images=images
        )

    def finish_sampling(self) -> None:
        pass

    def sleep_for_update(self) -> None:
        pass

    def close(self) -> None:
        pass
