"""Scoring a batch: call every reward function, contain failures, weight and sum.

Unit of work. Each reward function is called once per *group* (the G completions of one prompt), so
group-relative rewards (e.g. the Kimi length penalty) see their whole group, and groups run in parallel
in worker processes; with ``whole_batch`` (grpokit.trl, as TRL) once per batch, so a function that looks
across completions sees every completion TRL would show it. If a group call raises, each completion of
that group is called alone (with `group_size=1`) so that only the offending completions get
`failure_value`, and the others are scored together again in one call, keeping what the function computes
across them (rewards/retries.py). A group call that times out is not retried: all of its completions get
`failure_value` (retrying would cost G more timeouts). A call that returns anything but one value per
completion (rewards/spec.py `as_values`: a wrong count, a text, a 2-D array) stops the run with a
`RewardError` naming the function, what it returned and for how many completions: a broken contract is no
completion's failure, and is never retried (TRL raises too).

Timeouts. Every call has a deadline that holds in every mode and measures the call's own work: it starts
when the call begins (a worker's start-up and the reward module's imports are not in it) and stops while
the call runs start-up (`grpokit.rewards.calls.startup`: a verifier pool warming, the sandbox probe). In
worker processes it is a SIGKILL: the worker is killed and replaced; a call that ran out of time only
because the machine was slow, or whose worker died, is retried once (rewards/pool.py).
In the trainer's process (`num_workers=0`, the default, or a function that cannot be pickled: a lambda, a
closure) the call runs in the main thread under a SIGALRM deadline, which stops Python code but not one
long C call (rewards/inproc.py); called from another thread it is soft but cannot block exit or pile up
threads. Define reward functions at module level and set `num_workers >= 1` for a deadline that nothing can outlast.

Zeros. What a completion itself causes (its verification out of budget, its program tampering with the
sandbox, crashing the verifier, passing a size limit) is scored 0 by the function and reported by kind
(grpokit.rewards.calls): counted in `rewards/<name>/timeouts`, `tampering`, `crashes`, `limits` (and their
sum, `zeroed`), never a failure: a completion cannot escape its 0 by stalling or breaking the checker.

Failures. Every failure of the function (exception, `sys.exit`, a `KeyboardInterrupt` the function raises
itself, timeout, a value that is not a number or None, NaN, infinite or beyond float32
such as 1e300, an `ItemFailure` the function returns for one completion it could not score) or of the machine
(a worker that died twice or never began the call, `machine_failures`) is counted per function
(`rewards/<name>/failures`, with `timeouts` and `nonfinite` among the kinds); the first `max_logged_errors`
are logged with the offending completion. A failed item gets `failure_value` in the total and is left out of the
function's mean and std. When more than `max_failure_fraction` of a batch fails for one function, `score` raises
`RewardError`. `rewards/failed_fraction` (failed items / all items of the step) feeds a health alarm.
Under ``convention="trl"`` a returned NaN is None (not applicable), as TRL reads it, not a failure.

Infrastructure failures are not counted: a `RewardInfrastructureError` (a worker pool that cannot start
or keeps dying, a verifier that cannot be imported, a sandbox that does not isolate), raised by the
machinery or by a reward function, in a worker or in a thread, stops `score` at once.
"""

from __future__ import annotations

import functools
import logging
import math
import pickle
import time
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Sequence

import torch

from .calls import COMPLETION_KINDS, MACHINE
from .errors import ItemFailure
from .inproc import InProcessCaller
from .pool import Outcome, WorkerPool
from .retries import take_apart
from .spec import (
    CONVENTIONS,
    LOGGING_KEYWORDS,
    RUNNER_KEYWORDS,
    RewardError,
    RewardInfrastructureError,
    RewardSpec,
    call_reward,
    passed_columns,
    passes_group_size,
)
from .values import NonFiniteReward, check_value, value_stats

log = logging.getLogger("grpokit.rewards")


@dataclass
class RewardResult:
    """Scores of one batch of N completions and F reward functions."""

    rewards_NF: torch.Tensor  # (N, F) float32; NaN where the function returned None (not applicable)
    total_N: torch.Tensor  # (N,) sum over applicable functions of weight * reward (0 where none applied)
    names: list[str]
    weights: list[float]
    metrics: dict[str, float]
    extra: dict[str, list] = field(
        default_factory=dict
    )  # log_extra columns, one entry per completion (None: not logged)
    failed_NF: torch.Tensor | None = None  # (N, F) bool: the function failed there (it holds failure_value)


@dataclass
class _Tally:
    """What one function did on one batch: (row, message) per failed completion, and counts by kind.

    ``kinds`` counts ``timeouts``, ``tampering``, ``crashes``, ``limits`` (grpokit.rewards.calls) and
    ``machine``, whatever the item scored: a completion's own fault keeps the 0 its function gave it,
    a failure of the function or the machine gets ``failure_value``."""

    errors: list[tuple[int, str]] = field(default_factory=list)
    nonfinite: int = 0
    zeroed: int = 0
    kinds: dict[str, int] = field(default_factory=dict)

    def fail(self, rows: list[int], message: str, *, kind: str | None = None, nonfinite: bool = False) -> None:
        self.errors.extend((i, message) for i in rows)
        self.nonfinite += len(rows) * nonfinite
        if kind is not None:
            self.kinds[kind] = self.kinds.get(kind, 0) + len(rows)

    def noted(self, kind: str, value: Any) -> None:
        """A completion's own fault: counted by kind, and in ``zeroed`` when it scored 0 for it."""
        self.zeroed += value == 0
        self.kinds[kind] = self.kinds.get(kind, 0) + 1


def _kind(out: Outcome) -> str | None:
    return out.kind or ("timeouts" if out.timed_out else None)


class _Logs:
    """What reward functions logged with ``log_metric`` / ``log_extra`` during one ``score``."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.metrics: dict[str, list[float]] = {}
        self.extra: dict[str, list] = {}

    def keep(self, idx: list[int], value: Any) -> None:
        for name, vals in getattr(value, "metrics", {}).items():
            self.metrics.setdefault(name, []).extend(vals)
        for column, vals in getattr(value, "extra", {}).items():
            if len(vals) == len(idx):  # one value per completion of the call, as TRL asks
                col = self.extra.setdefault(column, [None] * self.n)
                for i, v in zip(idx, vals):
                    col[i] = v


class RewardRunner:
    """Scores completions with weighted reward functions; see the module docstring for the rules.

    num_workers: worker processes (0 = call functions in this process, under a SIGALRM deadline).
    timeout_s: limit for one call of one function on one group.
    failure_value: the reward a completion gets when its reward call fails.
    max_failure_fraction: stop the run when a function fails on more than this fraction of a batch.
    max_logged_errors: how many failures per function are logged with their input (per runner).
    convention: reward.convention; under "trl" a returned NaN means None (not applicable) and a user's function
        gets exactly TRL's keywords (rewards/spec.py), as in TRL.
    """

    def __init__(
        self,
        specs: Sequence[RewardSpec],
        num_workers: int = 2,
        timeout_s: float = 10.0,
        failure_value: float = 0.0,
        max_failure_fraction: float = 0.5,
        max_logged_errors: int = 3,
        convention: str = "grpokit",
    ) -> None:
        if convention not in CONVENTIONS:
            raise ValueError(f"convention must be one of {', '.join(CONVENTIONS)}, got {convention!r}.")
        self.convention = convention
        if not specs:
            raise RewardError("RewardRunner needs at least one RewardSpec.")
        if not 0.0 <= max_failure_fraction <= 1.0:
            raise ValueError(f"max_failure_fraction must be in [0, 1], got {max_failure_fraction}.")
        if not timeout_s > 0 or not math.isfinite(timeout_s):
            raise ValueError(f"timeout_s must be a finite number > 0, got {timeout_s}.")
        self.specs = list(specs)
        names = [s.name for s in self.specs]
        if len(set(names)) != len(names):
            raise RewardError(
                f"Reward names must be unique (they name the metrics), got {names}; give each function its own "
                "__name__ (a functools.partial is named after the function it binds, a callable object after its class)"
            )
        self.timeout_s = float(timeout_s)
        self.failure_value = float(failure_value)
        self.max_failure_fraction = float(max_failure_fraction)
        self.max_logged_errors = max_logged_errors
        self._logged: dict[str, int] = {n: 0 for n in names}
        self._in_process = [self._runs_in_process(spec, num_workers) for spec in self.specs]
        # whether each function gets group_size (TRL's convention passes none but to grpokit's own that read it)
        self._gets_group_size = [passes_group_size(spec.fn, convention) for spec in self.specs]
        self._num_workers = num_workers if num_workers > 0 and not all(self._in_process) else 0
        self._pool: WorkerPool | None = None
        self.reopen()
        self._caller = InProcessCaller()
        self.whole_batch = False
        """Call each function once per batch (TRL's unit; grpokit.trl sets it), not once per group."""
        self.logged_names: set[str] = set()
        """The metrics reward functions have logged with ``log_metric`` (grpokit.trl's evaluate() reports them)."""

    def reopen(self) -> None:
        """Start the worker processes again after ``close()`` (TRL's ``evaluate()`` after ``train()``)."""
        if self._num_workers and self._pool is None:
            self._pool = WorkerPool(self._num_workers, name="reward")

    def set_function(self, f: int, fn: Any) -> None:
        """Function ``f`` becomes ``fn``, its name and weight kept (grpokit.trl's ``reward_funcs[i] = fn`` during
        training: TRL calls the new one from the next batch); it runs in this process when it cannot be pickled."""
        self.specs[f] = replace(self.specs[f], fn=fn)
        self._in_process[f] = self._runs_in_process(self.specs[f], self._num_workers)
        self._gets_group_size[f] = passes_group_size(fn, self.convention)

    def _runs_in_process(self, spec: RewardSpec, num_workers: int) -> bool:
        if num_workers == 0:
            return True
        try:
            pickle.dumps(spec.fn)
            return False
        except Exception as exc:
            log.warning(
                "Reward '%s' runs in the trainer process because it cannot be pickled (%s; define it at "
                "module level): its %g s timeout is a SIGALRM in the main thread, which cannot stop one long "
                "C call, and soft (the call is abandoned) in other threads.",
                spec.name,
                type(exc).__name__,
                self.timeout_s,
            )
            return True

    # -- running calls -------------------------------------------------------------------------------
    def _run(self, f: int, calls: list[dict[str, Any]]) -> list[Outcome]:
        fn, name = self.specs[f].fn, self.specs[f].name
        if not self._in_process[f]:
            assert self._pool is not None
            outcomes = self._pool.run([(call_reward, (fn, c), {}) for c in calls], self.timeout_s)
        else:
            outcomes = [self._caller.call(name, call_reward, (fn, c), self.timeout_s) for c in calls]
        for out in outcomes:
            if out.fatal:
                raise RewardInfrastructureError(f"Reward '{name}' cannot be computed: {out.error}")
        return outcomes

    def _score_function(
        self, f: int, groups: list[list[int]], kwargs_for, logs: _Logs, rewards_NF: torch.Tensor, group_size: int
    ) -> _Tally:
        """Fill column f of rewards_NF; a call of several completions (a group, or the whole batch) that
        raised is taken apart (rewards/retries.py): each completion alone, then the healthy ones together."""
        if not self._gets_group_size[f]:  # TRL's convention: TRL passes no group_size
            kwargs_for = functools.partial(_without_group_size, kwargs_for)
        tally = _Tally()
        raised: list[list[int]] = []
        errors: list[str] = []
        for idx, out in zip(groups, self._run(f, [kwargs_for(idx, group_size) for idx in groups])):
            if out.ok or out.timed_out or len(idx) == 1:  # a timed-out group is not retried (G more timeouts)
                self._take(f, idx, out, "", logs, rewards_NF, tally)
            else:
                raised.append(idx)
                errors.append(out.error or "failed")
        for idx, out, call in take_apart(lambda calls: self._run(f, calls), raised, errors, kwargs_for, group_size):
            self._take(f, idx, out, call, logs, rewards_NF, tally)
        return tally

    def _take(self, f: int, idx: list[int], out: Outcome, call: str, logs: _Logs, rewards_NF, tally: _Tally) -> None:
        """One call's outcome into column f: its failure, or its values. Values that are not one per completion
        stop the run (a broken contract, no completion's failure; TRL raises too), naming what the call was."""
        if not out.ok:
            tally.fail(idx, out.error or "failed", kind=_kind(out))
            return
        if out.value.broken:
            raise RewardError(
                f"Reward '{self.specs[f].name}' {out.value.broken}{f' ({call})' if call else ''}; a reward function "
                "returns one number (or None) per completion it is given, in their order"
            )
        logs.keep(idx, out.value)
        self._store_all(rewards_NF, idx, f, out.value, tally)

    def _store_all(self, rewards_NF: torch.Tensor, idx: list[int], f: int, values: Any, tally: _Tally) -> None:
        """Store one call's values; the faults it reported (rewards/calls.py) are counted by kind: a
        completion's own keeps its score (0), the machine's is a failure (``failure_value``)."""
        faults = getattr(values, "faults", {})
        for j, (i, v) in enumerate(zip(idx, values)):
            kind, reason = faults.get(j, (None, ""))
            if kind == MACHINE:
                tally.fail([i], reason, kind=MACHINE)
                continue
            if kind is not None:
                tally.noted(kind, v)
            self._store(rewards_NF, i, f, v, tally)

    def _store(self, rewards_NF: torch.Tensor, i: int, f: int, v: Any, tally: _Tally) -> None:
        if isinstance(v, ItemFailure):  # the function could not score this one (a user's verifier's time-out)
            tally.fail([i], v.reason, kind="timeouts" if v.timed_out else None)
            return
        try:
            value = check_value(v, self.convention)
        except (TypeError, ValueError) as exc:
            tally.fail([i], str(exc), nonfinite=isinstance(exc, NonFiniteReward))
            return
        rewards_NF[i, f] = float("nan") if value is None else value

    def _contain(
        self, f: int, tally: _Tally, rewards_NF: torch.Tensor, failed_NF: torch.Tensor, completions: list
    ) -> dict[str, float]:
        """Give failed completions failure_value, log the first few, stop on too many; the metrics."""
        name, n = self.specs[f].name, len(completions)
        for i, message in tally.errors:
            failed_NF[i, f] = True
            rewards_NF[i, f] = self.failure_value
            if self._logged[name] < self.max_logged_errors:
                self._logged[name] += 1
                log.warning(
                    "Reward '%s' failed on completion %d (%s); it gets %g. Completion: %r",
                    name,
                    i,
                    message,
                    self.failure_value,
                    str(completions[i])[:300],
                )
        if len(tally.errors) > self.max_failure_fraction * n:
            row, first = tally.errors[0]
            raise RewardError(
                f"Reward '{name}' failed on {len(tally.errors)} of {n} completions, more than "
                f"max_failure_fraction={self.max_failure_fraction:g}; first error, on completion {row}: {first}"
            )
        return {
            **value_stats(rewards_NF[:, f], failed_NF[:, f], name),
            f"rewards/{name}/failures": float(len(tally.errors)),
            f"rewards/{name}/nonfinite": float(tally.nonfinite),
            f"rewards/{name}/not_applicable": float(rewards_NF[:, f].isnan().sum().item()),
            f"rewards/{name}/zeroed": float(tally.zeroed),
            **{f"rewards/{name}/{k}": float(tally.kinds.get(k, 0)) for k in COMPLETION_KINDS},
            f"rewards/{name}/machine_failures": float(tally.kinds.get(MACHINE, 0)),
        }

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
        columns = passed_columns(columns or {}, self.convention)
        n = len(completions)
        _check_batch(n, group_size, prompts, completion_ids, columns)

        def kwargs_for(idx: list[int], g: int | None) -> dict[str, Any]:
            """A call's keywords: the completions ``idx``, and ``group_size`` g unless None."""
            kw: dict[str, Any] = {k: [v[i] for i in idx] for k, v in columns.items()}
            kw.update(
                prompts=[prompts[i] for i in idx],
                completions=[completions[i] for i in idx],
                completion_ids=[completion_ids[i] for i in idx],
                trainer_state=trainer_state,
            )
            return kw if g is None else {**kw, "group_size": g}

        groups = [list(range(s, s + group_size)) for s in range(0, n, group_size)]
        if self.whole_batch and n:  # one call for the batch (TRL's unit), group_size still G
            groups = [list(range(n))]
        num_f = len(self.specs)
        rewards_NF = torch.full((n, num_f), float("nan"))
        failed_NF = torch.zeros((n, num_f), dtype=torch.bool)
        logs = _Logs(n)
        metrics: dict[str, float] = {}
        for f in range(num_f):
            tally = self._score_function(f, groups, kwargs_for, logs, rewards_NF, group_size) if groups else _Tally()
            metrics.update(self._contain(f, tally, rewards_NF, failed_NF, completions))
        weights = torch.tensor([s.weight for s in self.specs])
        total_N = (rewards_NF * weights).nansum(dim=1)  # None (NaN) is skipped, not counted as zero
        unscored_N = (rewards_NF.isnan() & ~failed_NF).all(dim=1)  # every function answered None: no reward
        _warn_unscored(unscored_N, prompts, completions)
        metrics["rewards/failed_fraction"] = failed_NF.sum().item() / (n * num_f) if n else 0.0
        metrics["rewards/scored"] = float(n)  # the completions these counts are of (summed over a step's rounds)
        metrics["rewards/unscored"] = float(unscored_N.sum().item())
        metrics["reward"] = total_N.mean().item()
        metrics["reward_std"] = total_N.std(unbiased=False).item()
        metrics["time/reward"] = time.perf_counter() - start
        logged = {k: sum(v) / len(v) for k, v in logs.metrics.items() if v and k not in metrics}
        self.logged_names.update(logged)
        metrics.update(logged)
        names = [s.name for s in self.specs]
        return RewardResult(rewards_NF, total_N, names, weights.tolist(), metrics, logs.extra, failed_NF)

    def close(self) -> None:
        """Stop worker processes (abandoned soft-timeout daemon threads are not waited for)."""
        if self._pool is not None:
            self._pool.close()
            self._pool = None

    def __enter__(self) -> "RewardRunner":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _check_batch(n: int, group_size: int, prompts: list, completion_ids: list, columns: dict[str, list]) -> None:
    if group_size < 1 or n % group_size:
        raise ValueError(f"group_size must divide the number of completions ({n}), got {group_size}.")
    clash = [k for k in columns if k in RUNNER_KEYWORDS or k in LOGGING_KEYWORDS]
    if clash:  # the runner's own value would replace the column's (rows are checked at load: data/prompts.py)
        raise ValueError(
            f"the column {clash[0]!r} has the name of a keyword grpokit passes reward functions itself; rename it"
        )
    for what, seq in [("prompts", prompts), ("completion_ids", completion_ids), *columns.items()]:
        if len(seq) != n:
            raise ValueError(f"'{what}' has {len(seq)} entries but there are {n} completions; give one per completion.")


def _warn_unscored(unscored_N: torch.Tensor, prompts: list, completions: list) -> None:
    """A completion every function answered None for (``unscored_N``) is unscorable: its total is 0 (the sum
    of nothing), but the advantage stage leaves it out of its group's statistics and gives it advantage 0
    (algo/pipeline.py, TRL's rule); say so once a batch with its prompt and completion (TRL's warning begins
    with the same words). Their count is the metric ``rewards/unscored``, which the doctor reads."""
    unscored = unscored_N.nonzero()
    if len(unscored):
        i = int(unscored[0, 0])
        log.warning(
            "All reward functions returned None for the following kwargs: %r; %d completion(s) of this batch "
            "have no reward: a training step gives them advantage 0 and leaves them out of their group's mean and "
            "std (the logged reward counts them as 0), a held-out evaluation leaves such prompts out (its ungraded "
            "count); return a number from at least one function",
            {"prompt": prompts[i], "completion": completions[i]},
            len(unscored),
        )


def _without_group_size(kwargs_for: Callable[[list[int], int | None], dict], idx: list[int], g: int) -> dict:
    """The call's keywords without ``group_size``, for a function that does not get it."""
    return kwargs_for(idx, None)
