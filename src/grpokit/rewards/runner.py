"""Scoring a batch: call every reward function, contain failures, weight and sum.

Unit of work. Each reward function is called once per *group* (the G completions of one prompt), so
group-relative rewards (e.g. the Kimi length penalty) see their whole group, and groups run in parallel
in worker processes. If a group call raises, each completion of that group is retried alone (with
`group_size=1`) so that only the offending completions get `failure_value`. A group call that times out
is not retried: all of its completions get `failure_value` (retrying would cost G more timeouts).

Timeouts. In worker processes the timeout is hard: the worker is killed and replaced. A function that
cannot be pickled (a lambda, a closure) runs in a thread of this process instead, with a logged reason;
its timeout is then *soft*: the result is abandoned and counted as a failure, but Python cannot stop the
thread, which keeps running in the background. Define reward functions at module level to get hard
timeouts.

Failures. Every failure (exception, timeout, wrong return length, a value that is not a number or None,
NaN or infinite) is counted per function; the first `max_logged_errors` are logged with the offending
completion. A failed item gets `failure_value` in the total and is left out of the function's mean and
std. When more than `max_failure_fraction` of a batch fails for one function, `score` raises
`RewardError`. `rewards/failed_fraction` (failed items / all items of the step) feeds a health alarm.

Infrastructure failures are not counted: a `RewardInfrastructureError` (a worker pool that cannot start
or keeps dying, a verifier that cannot be imported, a sandbox that does not isolate), raised by the
machinery or by a reward function, in a worker or in a thread, stops `score` at once.
"""
from __future__ import annotations

import concurrent.futures as cf
import logging
import math
import pickle
import time
from dataclasses import dataclass, field
from typing import Any, Sequence

import torch

from .pool import Outcome, WorkerPool
from .spec import RewardError, RewardInfrastructureError, RewardSpec, call_reward

log = logging.getLogger("grpokit.rewards")


@dataclass
class RewardResult:
    """Scores of one batch of N completions and F reward functions."""

    rewards_NF: torch.Tensor  # (N, F) float32; NaN where the function returned None (not applicable)
    total_N: torch.Tensor  # (N,) sum over applicable functions of weight * reward
    names: list[str]
    weights: list[float]
    metrics: dict[str, float]
    extra: dict[str, list] = field(default_factory=dict)  # log_extra columns, one entry per completion (None: not logged)


class NonFiniteReward(ValueError):
    """A reward function returned NaN or an infinity: counted as a failure, never summed in."""


def _check_value(value: Any) -> float | None:
    """None stays None; bools and real numbers become float; anything else (NaN, inf too) is an error."""
    if value is None:
        return None
    if isinstance(value, torch.Tensor) and value.numel() == 1:
        value = value.item()
    if isinstance(value, bool) or isinstance(value, (int, float)) or hasattr(value, "__float__"):
        out = float(value)
        if not math.isfinite(out):
            raise NonFiniteReward(f"reward is {out}")
        return out
    raise TypeError(f"reward must be a number or None, got {type(value).__name__}")


class RewardRunner:
    """Scores completions with weighted reward functions; see the module docstring for the rules.

    num_workers: worker processes (0 = call functions in this process, with soft thread timeouts).
    timeout_s: limit for one call of one function on one group.
    failure_value: the reward a completion gets when its reward call fails.
    max_failure_fraction: stop the run when a function fails on more than this fraction of a batch.
    max_logged_errors: how many failures per function are logged with their input (per runner).
    """

    def __init__(
        self,
        specs: Sequence[RewardSpec],
        num_workers: int = 2,
        timeout_s: float = 10.0,
        failure_value: float = 0.0,
        max_failure_fraction: float = 0.5,
        max_logged_errors: int = 3,
    ) -> None:
        if not specs:
            raise RewardError("RewardRunner needs at least one RewardSpec.")
        if not 0.0 <= max_failure_fraction <= 1.0:
            raise ValueError(f"max_failure_fraction must be in [0, 1], got {max_failure_fraction}.")
        if timeout_s <= 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s}.")
        self.specs = list(specs)
        names = [s.name for s in self.specs]
        if len(set(names)) != len(names):
            raise RewardError(f"Reward names must be unique (they name the metrics), got {names}.")
        self.timeout_s = float(timeout_s)
        self.failure_value = float(failure_value)
        self.max_failure_fraction = float(max_failure_fraction)
        self.max_logged_errors = max_logged_errors
        self._logged: dict[str, int] = {n: 0 for n in names}
        self._in_process: list[bool] = []
        for spec in self.specs:
            reason = None
            if num_workers == 0:
                reason = "num_workers=0"
            else:
                try:
                    pickle.dumps(spec.fn)
                except Exception as exc:
                    reason = f"it cannot be pickled ({type(exc).__name__}); define it at module level"
            if reason is not None and num_workers > 0:
                log.warning("Reward '%s' runs in threads of the trainer process because %s; its %g s "
                            "timeout is soft (an abandoned call keeps running).", spec.name, reason, timeout_s)
            self._in_process.append(reason is not None)
        needs_pool = num_workers > 0 and not all(self._in_process)
        self._pool = WorkerPool(num_workers, name="reward") if needs_pool else None
        self._threads = cf.ThreadPoolExecutor(max_workers=max(1, num_workers), thread_name_prefix="reward")

    # -- running calls -------------------------------------------------------------------------------
    def _run(self, f: int, calls: list[dict[str, Any]]) -> list[Outcome]:
        fn, name = self.specs[f].fn, self.specs[f].name
        if not self._in_process[f]:
            assert self._pool is not None
            outcomes = self._pool.run([(call_reward, (fn, c), {}) for c in calls], self.timeout_s)
            for out in outcomes:
                if out.fatal:
                    raise RewardInfrastructureError(f"Reward '{name}' cannot be computed: {out.error}")
            return outcomes
        futures = [self._threads.submit(call_reward, fn, c) for c in calls]
        deadline = time.monotonic() + self.timeout_s
        outcomes = []
        for fut in futures:
            try:
                outcomes.append(Outcome(True, fut.result(timeout=max(0.0, deadline - time.monotonic()))))
            except cf.TimeoutError:
                outcomes.append(Outcome(False, error=f"timed out after {self.timeout_s:g} s (soft)", timed_out=True))
            except RewardInfrastructureError as exc:
                for other in futures:
                    other.cancel()
                raise RewardInfrastructureError(f"Reward '{name}' cannot be computed: {exc}") from None
            except Exception as exc:
                outcomes.append(Outcome(False, error=f"{type(exc).__name__}: {exc}"))
        return outcomes

    def score(
        self,
        prompts: list[str],
        completions: list[str],
        completion_ids: list[list[int]],
        group_size: int,
        columns: dict[str, list] | None = None,
        trainer_state: Any = None,
    ) -> RewardResult:
        """Score N completions (N = P * group_size, grouped contiguously) with every reward function.

        ``prompts`` and ``completions`` are passed on as given (texts, or chat messages in TRL's
        conversational convention); ``trainer_state`` reaches every function as its keyword. What
        functions log with ``log_metric`` becomes a metric of that name (the mean of the values);
        ``log_extra`` columns come back in ``RewardResult.extra``."""
        start = time.perf_counter()
        columns = columns or {}
        n = len(completions)
        if group_size < 1 or n % group_size:
            raise ValueError(f"group_size must divide the number of completions ({n}), got {group_size}.")
        for what, seq in [("prompts", prompts), ("completion_ids", completion_ids), *columns.items()]:
            if len(seq) != n:
                raise ValueError(f"'{what}' has {len(seq)} entries but there are {n} completions; give one per completion.")

        def kwargs_for(idx: list[int], g: int) -> dict[str, Any]:
            kw: dict[str, Any] = {k: [v[i] for i in idx] for k, v in columns.items()}
            kw.update(prompts=[prompts[i] for i in idx], completions=[completions[i] for i in idx],
                      completion_ids=[completion_ids[i] for i in idx], group_size=g, trainer_state=trainer_state)
            return kw

        logged: dict[str, list[float]] = {}
        extra: dict[str, list] = {}

        def keep_logs(idx: list[int], value: Any) -> None:  # what log_metric / log_extra collected in one call
            for name, vals in getattr(value, "metrics", {}).items():
                logged.setdefault(name, []).extend(vals)
            for column, vals in getattr(value, "extra", {}).items():
                if len(vals) == len(idx):  # one value per completion of the call, as TRL asks
                    col = extra.setdefault(column, [None] * n)
                    for i, v in zip(idx, vals):
                        col[i] = v

        groups = [list(range(s, s + group_size)) for s in range(0, n, group_size)]
        num_f = len(self.specs)
        rewards_NF = torch.full((n, num_f), float("nan"))
        failed_NF = torch.zeros((n, num_f), dtype=torch.bool)
        metrics: dict[str, float] = {}
        num_failed = 0
        for f, spec in enumerate(self.specs):
            errors: list[tuple[int, str]] = []
            nonfinite = 0
            outcomes = self._run(f, [kwargs_for(idx, group_size) for idx in groups])
            retry: list[int] = []
            for idx, out in zip(groups, outcomes):
                if out.ok:
                    keep_logs(idx, out.value)
                    for i, v in zip(idx, out.value):
                        try:
                            value = _check_value(v)
                            rewards_NF[i, f] = float("nan") if value is None else value
                        except (TypeError, ValueError) as exc:
                            nonfinite += isinstance(exc, NonFiniteReward)
                            errors.append((i, str(exc)))
                elif out.timed_out or group_size == 1:
                    errors.extend((i, out.error or "failed") for i in idx)
                else:
                    retry.extend(idx)
            if retry:  # find which completions of the failing groups are at fault
                for i, out in zip(retry, self._run(f, [kwargs_for([i], 1) for i in retry])):
                    try:
                        if not out.ok:
                            raise RuntimeError(out.error)
                        keep_logs([i], out.value)
                        value = _check_value(out.value[0])
                        rewards_NF[i, f] = float("nan") if value is None else value
                    except Exception as exc:
                        nonfinite += isinstance(exc, NonFiniteReward)
                        errors.append((i, str(exc)))
            for i, message in errors:
                failed_NF[i, f] = True
                rewards_NF[i, f] = self.failure_value
                if self._logged[spec.name] < self.max_logged_errors:
                    self._logged[spec.name] += 1
                    log.warning("Reward '%s' failed on completion %d (%s); it gets %g. Completion: %r",
                                spec.name, i, message, self.failure_value, completions[i][:300])
            if len(errors) > self.max_failure_fraction * n:
                raise RewardError(
                    f"Reward '{spec.name}' failed on {len(errors)} of {n} completions, more than "
                    f"max_failure_fraction={self.max_failure_fraction:g}; first error, on completion {errors[0][0]} "
                    f"(prompt {errors[0][0] // group_size} of the batch): {errors[0][1]}")
            scored = rewards_NF[:, f][~failed_NF[:, f] & ~rewards_NF[:, f].isnan()]
            metrics[f"rewards/{spec.name}/mean"] = scored.mean().item() if len(scored) else float("nan")
            metrics[f"rewards/{spec.name}/std"] = scored.std(unbiased=False).item() if len(scored) else float("nan")
            metrics[f"rewards/{spec.name}/failures"] = float(len(errors))
            metrics[f"rewards/{spec.name}/nonfinite"] = float(nonfinite)
            num_failed += len(errors)
            metrics[f"rewards/{spec.name}/not_applicable"] = float(rewards_NF[:, f].isnan().sum().item())
        weights = torch.tensor([s.weight for s in self.specs])
        total_N = (rewards_NF * weights).nansum(dim=1)  # None (NaN) is skipped, not counted as zero
        metrics["rewards/failed_fraction"] = num_failed / (n * num_f) if n else 0.0
        metrics["reward"] = total_N.mean().item()
        metrics["reward_std"] = total_N.std(unbiased=False).item()
        metrics["time/reward"] = time.perf_counter() - start
        metrics.update({name: sum(vals) / len(vals) for name, vals in logged.items() if vals and name not in metrics})
        return RewardResult(rewards_NF, total_N, [s.name for s in self.specs], weights.tolist(), metrics, extra)

    def close(self) -> None:
        """Stop worker processes and threads (abandoned soft-timeout threads are not waited for)."""
        if self._pool is not None:
            self._pool.close()
            self._pool = None
        self._threads.shutdown(wait=False, cancel_futures=True)

    def __enter__(self) -> "RewardRunner":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
