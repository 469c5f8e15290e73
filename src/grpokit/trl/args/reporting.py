"""TRL's logging arguments -> grpokit's record section: report_to, logging_strategy / logging_steps,
log_completions, num_completions_to_print, log_multimodal, disable_tqdm, run_name, project and Trackio's, with
the checks of log_level, log_level_replica and include_num_input_tokens_seen (GRPOTrainer carries those out:
by_trainer.py).

Each argument's mapping rule and its single-value check live here together.
"""

from __future__ import annotations

import math
from typing import Any, Callable

from grpokit.record.trackers import NAMED_RUNS

from .batch import epoch_rounds
from .predicates import is_int, is_number
from .rule import Rule, TrlArgs, every_steps, refuse


def _logging(a: TrlArgs, ctx: dict) -> dict[str, Any]:
    reports = [a.report_to] if isinstance(a.report_to, str) or a.report_to is None else list(a.report_to)
    reports = [r for r in reports if r not in (None, "none")]
    trackers = ("tensorboard", "wandb", "mlflow", "trackio")
    bad = [r for r in reports if r not in trackers]
    if bad:
        raise refuse("report_to", a.report_to, "none or a list of " + ", ".join(trackers))
    hosted = {
        n: getattr(a, n) for n in ("trackio_space_id", "trackio_bucket_id", "trackio_static_space_id") if getattr(a, n)
    }
    if hosted and "trackio" in reports:  # without trackio reporting transformers never reads them, nor does grpokit
        name, value = next(iter(hosted.items()))
        raise refuse(
            name,
            value,
            "None with report_to trackio (grpokit's Trackio sink logs to the local database "
            "only, it hosts no Space or bucket); drop trackio from report_to to keep the value",
        )
    if a.logging_strategy not in ("steps", "epoch", "no"):
        raise refuse("logging_strategy", a.logging_strategy, "steps, epoch, no")
    every = epoch_rounds(a, ctx) if a.logging_strategy == "epoch" else every_steps(a.logging_steps, ctx["steps"])
    return {
        "record.sinks": ([] if a.disable_tqdm else ["console"]) + reports,
        "record.console_every": every,
        "record.run_name": (a.run_name or "") if set(reports) & set(NAMED_RUNS) else "",  # read by those only
        "record.project": a.project if "trackio" in reports else "",
        "record.samples_every": every if a.log_completions else 0,
    }


def _samples(a: TrlArgs, ctx: dict) -> dict[str, Any]:
    n = a.num_completions_to_print
    if not a.log_completions:  # TRL reads both only when it logs completions (record.samples_every=0: none)
        return {}
    # <= 0: TRL prints none; grpokit prints no completions anyway and keeps its samples.jsonl
    out = {"record.samples_images": bool(a.log_multimodal)}
    return out if n is None or n <= 0 else {**out, "record.samples_prompts": math.ceil(n / a.num_generations)}


LOGGING = Rule(
    (
        "report_to",
        "logging_steps",
        "log_completions",
        "disable_tqdm",
        "run_name",
        "logging_strategy",
        "project",
        "trackio_space_id",
        "trackio_bucket_id",
        "trackio_static_space_id",
    ),
    ("record.sinks", "record.console_every", "record.samples_every", "record.run_name", "record.project"),
    "report_to trackers join the console, fed log_history's entries at TRL's steps (see Callbacks); "
    "log_completions writes samples.jsonl every logging_steps; project is "
    "the Trackio project with report_to trackio (as transformers; other trackers keep grpokit's); run_name "
    "names the runs of wandb, mlflow and trackio (tensorboard's and no tracker's read none, as transformers); "
    "trackio_space_id, "
    "trackio_bucket_id and trackio_static_space_id are accepted when nothing reports to trackio "
    "(transformers reads "
    "them in its Trackio callback only), refused with it (grpokit's Trackio sink hosts no Space); "
    "logging_strategy=epoch "
    "logs at the end of every epoch and of training (logging_first_step still logs step 1, as transformers)",
    _logging,
)

SAMPLES = Rule(
    ("num_completions_to_print", "log_multimodal"),
    ("record.samples_prompts", "record.samples_images"),
    "whole groups: ceil(num_completions_to_print / num_generations) prompts per sample dump (None or <= 0: "
    "grpokit's 2; TRL prints none at <= 0, grpokit prints no completions to the console); log_multimodal: "
    "image prompts' sample rows get their image (images/*.png, an image column), as TRL logs them with its "
    "completions; False: text only; both read only with log_completions, as TRL",
    _samples,
)


LOG_LEVELS = ("passive", "detail", "debug", "info", "warning", "error", "critical")  # transformers' log_level values


CHECKS: dict[str, tuple[Callable[[Any], bool], str]] = {  # single-value checks (checks.py runs them)
    "logging_steps": (  # transformers: below 1 is ceil(steps * value), a negative period read as its size
        lambda x: is_number(x) and x != 0,
        "a number other than 0 (below 1: a fraction of the steps)",
    ),
    "num_completions_to_print": (lambda x: x is None or is_int(x), "None or an integer (<= 0: print none, as TRL)"),
    "project": (lambda x: isinstance(x, str) and x.strip() != "", "a non-empty project name"),
    "log_level": (lambda x: x in LOG_LEVELS, "one of " + ", ".join(LOG_LEVELS)),
    "log_level_replica": (lambda x: x in LOG_LEVELS, "one of " + ", ".join(LOG_LEVELS)),
    "include_num_input_tokens_seen": (
        lambda x: x in ("no", "all", "non_padding") or isinstance(x, bool),
        "'no', 'all', 'non_padding', True or False",
    ),
}
