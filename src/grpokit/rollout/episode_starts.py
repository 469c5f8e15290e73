"""Where a prompt's G episodes start: their environments built and reset, observations joined.

``EpisodeRunner.run`` (rollout/episodes.py) calls ``EpisodeStarts.reset_all`` once per batch, before
the first turn. Every environment is built and reset in a call thread within ``reset_timeout_s``
(env/calls.py); a reset that raises or runs over is contained (that prompt's episodes start from
the bare prompt) and counted, and past ``max_failure_fraction`` of a batch the run stops.

Each episode starts from its own context: the prompt with its own observation joined, the same for
the G episodes of a prompt unless their resets returned different observations (a random reset, which
TRL accepts: each is then its own prompt, as TRL's). Each episode also keeps its prompt with its observation
(``ObservedPrompt``: the rendered text and TRL's form, the observation appended to the last message), which
the reward functions get as ``prompts``, as TRL passes them. An observation takes TRL's forms, a string or a
list of text content parts (data/observations.py); any other value stops the run with one sentence.
"""

from __future__ import annotations

import functools
import logging
import warnings
from dataclasses import dataclass
from typing import Any, Callable

from grpokit.data.observations import Observation, observation_of, observation_text, with_observation
from grpokit.env.calls import EnvironmentFailure, call_many, check_failures
from grpokit.env.tools import CUT_MARK, cap_text, is_cut
from grpokit.types import ObservedPrompt, Prompt

log = logging.getLogger("grpokit.env")
Factory = Callable[[], Any]


@dataclass
class Started:
    """A batch's episodes as ``EpisodeStarts.reset_all`` leaves them, before their first turn."""

    envs: list  # N: each episode's environment (None without one, or where its reset failed)
    contexts: list[list[int]]  # N: the ids each episode starts from (its prompt with its observation)
    failed: list[bool]  # P: its resets raised or ran over (its episodes start from the bare prompt)
    cut: list[bool]  # N: its observation was cut at max_observation_chars
    observed: list[ObservedPrompt | None]  # N: its prompt with its observation; None: the bare prompt


def probe_environment(name: str | None, factory: Factory, timeout_s: float) -> Any:
    """One environment built, when the runner is made, to list its tools: in a call thread within
    ``timeout_s`` (env.reset_timeout_s), so a constructor that hangs or raises stops the run with
    one sentence instead of a silent wait or a traceback."""
    out = call_many("environment-probe", [factory], timeout_s)[0]
    if not out.ok:
        label = f"environment {name!r}" if name else "the environment"
        raise EnvironmentFailure(
            f"{label} could not be built to list its tools: {out.error} "
            f"(building it is bounded by env.reset_timeout_s={timeout_s:g})"
        )
    return out.value


class EpisodeStarts:
    """Builds and resets the environments of a batch's episodes and renders their starts.

    ``factories``: environment name -> factory (None: the single unnamed one; empty: no environment);
    ``route_key``: the row column that chose a named environment (not passed to ``reset``);
    ``render_prompt``: (raw prompt, observation, schemas) -> the rendered text, or None to append the
    observation's tokens; ``schemas_for(name)``: the tool schemas a prompt of environment ``name`` is rendered with.
    """

    def __init__(
        self,
        spec,
        tokenizer,
        factories: dict[str | None, Factory],
        named: bool,
        route_key: str,
        render_prompt: Callable[..., str] | None,
        schemas_for: Callable[[str | None], list[dict] | None],
    ):
        self.spec, self.tokenizer = spec, tokenizer
        self.factories, self.named, self.route_key = factories, named, route_key
        self.render_prompt, self.schemas_for = render_prompt, schemas_for
        self.warned_random_reset = False  # one warning per run when reset() observations differ within a group
        self.warned_cut = False  # one warning per run when observations are cut at max_observation_chars

    def reset_all(self, prompts: list[Prompt], names: list[str | None], G: int) -> Started:
        """Build and reset the G environments of every prompt, all at once, each within
        ``reset_timeout_s`` (env/calls.py: daemon threads, a bounded number abandoned); their
        observation (if any) joins the prompt: each episode's context (``_observed``). A prompt whose resets
        raise or run over starts from the bare prompt (its ``failed`` entry True), never a crash or a hang;
        past ``max_failure_fraction`` of the batch's episodes the run stops (EnvironmentFailure). ``cut`` says,
        per episode, whether its observation was cut at ``max_observation_chars`` (warned about once)."""
        N = len(prompts) * G
        bare = [list(p.ids) for p in prompts for _ in range(G)]
        started = Started([None] * N, bare, [False] * len(prompts), [False] * N, [None] * N)
        if not self.factories:
            return started
        rows = [self._reset_row(p) for p in prompts]
        calls = [
            functools.partial(_build_and_reset, self.factories[names[k]], rows[k])
            for k in range(len(prompts))
            for _ in range(G)
        ]
        kinds = sorted({getattr(self.factories[n], "__qualname__", "environment") for n in names})
        outs = call_many("environment-reset-" + "+".join(kinds), calls, self.spec.reset_timeout_s)
        started.envs = [o.value[0] if o.ok else None for o in outs]
        started.failed = [not all(o.ok for o in outs[k * G : (k + 1) * G]) for k in range(len(prompts))]
        for k, p in enumerate(prompts):
            if not started.failed[k]:
                obs = [o.value[1] for o in outs[k * G : (k + 1) * G]]
                started.contexts[k * G : (k + 1) * G] = self._observed(p, rows[k], obs, names[k], started, k)
        self._report_failures(outs, started.failed, G)
        self._warn_cut(started.cut)
        return started

    def _warn_cut(self, cut: list[bool]) -> None:
        """One warning per run when observations were cut (each counted in episodes/observations_truncated)."""
        if any(cut) and not self.warned_cut:
            self.warned_cut = True
            log.warning(
                "grpokit: warning: %d of %d reset() observations were longer than env.max_observation_chars=%d "
                "and were cut (the model sees the start and a ...[truncated] mark; counted in "
                "episodes/observations_truncated); raise env.max_observation_chars to show more (0 = no cap)",
                sum(cut),
                len(cut),
                self.spec.max_observation_chars,
            )

    def _report_failures(self, outs: list, failed: list[bool], G: int) -> None:
        """Warn about failed resets; stop the run past ``max_failure_fraction`` of the batch's episodes."""
        errors = [o.error for o in outs if not o.ok]
        if errors:
            log.warning(
                "grpokit: warning: %d of %d environment resets failed (first: %s); their prompts' episodes start from "
                "the bare prompt",
                len(errors),
                len(outs),
                errors[0],
            )
        check_failures(
            "environment reset() failed",
            sum(failed) * G,
            len(outs),
            self.spec.max_failure_fraction,
            f"first error: {errors[0]}" if errors else "",
        )

    def _reset_row(self, prompt: Prompt) -> dict[str, Any]:
        row = {"prompt": prompt.raw if prompt.raw is not None else prompt.text, **prompt.columns}
        if self.named:  # the routing column chose the environment; it is no row data of it (as TRL)
            row.pop(self.route_key, None)
        return row

    def _observed(
        self, prompt: Prompt, row: dict[str, Any], obs: list, name: str | None, started: Started, k: int
    ) -> list[list[int]]:
        """The contexts prompt ``k``'s G episodes start from after their resets: the prompt with each one's
        observation. When the observations differ (a random reset, which TRL accepts) each episode starts from
        its own, as TRL's (one warning); an episode whose reset() returned None starts from the bare prompt, as
        TRL's. Marks in ``started`` each episode's observation cut and its prompt with the observation."""
        G, bare = len(obs), [list(prompt.ids) for _ in obs]
        if all(o is None for o in obs):
            return bare
        cap = self.spec.max_observation_chars
        raw = [observation_of(o) for o in obs]  # TRL's forms (a string, text parts); anything else refused
        texts = [None if t is None else capped(t, cap) for t in raw]
        for g, t in enumerate(raw):
            started.cut[k * G + g] = t is not None and is_cut(observation_text(t), cap)
        if len(set(texts)) > 1 and not self.warned_random_reset:
            self.warned_random_reset = True
            warnings.warn(
                "the environment's reset() returned different observations for the episodes of one prompt; each "
                "episode starts from its own (as TRL), so GRPO's group baseline compares episodes that started apart",
                stacklevel=2,
            )
        joined = {t: self._with_observation(prompt, row["prompt"], t, name) for t in set(texts) if t is not None}
        for g, t in enumerate(texts):
            started.observed[k * G + g] = None if t is None else joined[t][1]
        return [list(prompt.ids) if t is None else list(joined[t][0]) for t in texts]

    def _with_observation(
        self, prompt: Prompt, raw: Any, observation: Observation, name: str | None
    ) -> tuple[list[int], ObservedPrompt]:
        """The prompt's ids with a reset observation joined (appended to the last user turn when rendered), and
        the prompt with it as the reward functions get it (the text the model saw; TRL's form)."""
        shown = with_observation(raw, observation)
        if self.render_prompt is None:
            text = observation_text(observation)
            ids = list(self.tokenizer(text, add_special_tokens=False)["input_ids"])
            return list(prompt.ids) + ids, ObservedPrompt(prompt.text + text, shown)
        rendered = self.render_prompt(raw, observation, self.schemas_for(name))
        ids = list(self.tokenizer(rendered, add_special_tokens=False)["input_ids"])
        return ids, ObservedPrompt(rendered, shown)


def capped(observation: Observation, max_chars: int) -> Observation:
    """The observation cut at ``max_chars`` characters in all (0 = no cap), marked where cut (``cap_text``): a
    list's parts are kept up to the one the cap falls in, which is cut, and the rest dropped.
    Example: ("abc", "defg", "h") at 5 -> ("abc", "de...[truncated]")."""
    if isinstance(observation, str):
        return cap_text(observation, max_chars)
    if not is_cut(observation_text(observation), max_chars):
        return observation
    kept, left = [], max_chars
    for text in observation:
        if len(text) > left:  # the cap falls in this part (left may be 0: the mark alone)
            kept.append(text[:left] + CUT_MARK)
            break
        kept.append(text)
        left -= len(text)
    return tuple(kept)


def _build_and_reset(factory: Factory, row: dict[str, Any]) -> tuple[Any, Any]:
    """One episode's environment, built and reset in a call thread (a constructor may hang too)."""
    env = factory()
    return env, env.reset(**row)
