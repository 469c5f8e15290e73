"""Stage 2 as episodes: each of the G samples of a prompt is an episode of up to ``max_turns`` turns.

    turn 0   the G rows of every prompt are sampled in one batched decode (the prompt's cache shared)
    then     per row: parse tool calls from the turn's text; none -> the episode ends (an answer);
             else run them (rows side by side, up to TOOL_THREADS at once) and append the results
             as environment tokens (model_mask 0)
    turn k   the rows still running are sampled in one batched decode, each from its own context
             (prompt + everything so far); finished episodes have left the batch

An episode ends when the model answers without a tool call (finish reason of that turn: "eos",
"stop" or "length"), when its environment sets ``done`` ("done"), when a tool raises
``TerminalToolError`` ("tool_error"), when ``max_turns`` turns have run and the last one still
called a tool ("turns": that turn's calls are not run, as TRL leaves the calls of its last
generation after ``max_tool_calling_iterations`` rounds; ``max_turns`` 0 is no turn limit), when the
environment's reply would pass ``max_episode_tokens`` or a model turn would (the turn is cut at the cap;
"length"), or when its tools have used ``episode_timeout_s`` seconds ("timeout").

Environments and tools are untrusted code, and every call into them has a deadline: tools
``tool_timeout_s`` (env/tools.py), ``reset`` ``reset_timeout_s`` (the trainer's main thread is
interrupted with SIGALRM, as for in-process rewards: rewards/inproc.py). A ``reset`` that raises or
runs over is contained: that prompt's episodes start from the bare prompt, counted in
``episodes/reset_failures``; its observation is cut at ``max_observation_chars`` characters (10 MB
would have been a 10-million-token prompt) and a tool's result at ``max_tool_output_chars``, each cut
marked in the text, counted (``episodes/observations_truncated``, ``tools/truncated_frequency``) and
warned about once per run. Limits and defaults: docs/FAULTS.md.

The single-turn rollout is this loop with no tools and no environment: one turn, no parsing, and
the sampler's Rollout comes back unchanged (``episodes`` None). The sampler is a function
``sample(contexts, group_size, params) -> Rollout``: ``rollout.hf.generate`` on a model, or a vLLM
engine, so every backend runs the same loop.

Environments follow TRL: one instance per episode, ``reset(**row)`` before the first turn (a
returned string is appended to the prompt; when the G episodes of a prompt get different observations,
a random start as in TRL's 2048 example, each starts from its own, its own prompt as in TRL (the
Rollout's ``row_prompt_ids``), with one warning; the reward functions get each episode's prompt with its
observation, as TRL's),
public methods as tools, ``done`` read after each turn.
Unlike TRL, which pools instances and resets them again in later batches, each episode gets a
fresh instance: the async sampler runs the next batch's episodes while this batch's rewards still
read its environments (``get_reward``), so a reused instance could be reset under them.

Named environments (TRL's ``environment_factory`` as a dict): a mapping name -> factory, and each
row's ``route_key`` column ("environment") names the environment of its episodes. That row's prompt
shows, and its episodes may call, only the standalone tools plus that environment's methods; the
routing column is not passed to ``reset``. One factory is the special case of one unnamed (None)
environment that every row uses.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import logging
from dataclasses import dataclass
from typing import Any, Callable

from grpokit.config.sections import ConfigError
from grpokit.data.vision import prompt_images
from grpokit.env.calls import call_many, check_failures
from grpokit.env.parse import (
    CALL_CLOSE,
    MAX_DEPTH,
    ToolCall,
    assistant_message,
    parse_tool_calls,
    tag_result_text,
    template_suffix_ids,
)
from grpokit.env.tools import (
    ToolResult,
    call_tool,
    cap_text,
    check_tool_names,
    environment_tools,
    is_cut,
    tool_name,
    tool_schema,
)
from grpokit.env.workers import run_all
from grpokit.types import Prompt, Rollout, gather_rows

from .episode_rows import Row, env_done, episodes_rollout, state_key
from .episode_starts import EpisodeStarts, Factory, probe_environment
from .hf import SamplingParams

log = logging.getLogger("grpokit.env")
Sampler = Callable[[list[list[int]], int, SamplingParams], Rollout]
TOOL_THREADS = 8  # rows whose tool calls run at once (tools mostly wait: on a sandbox, a service, a timer)


@dataclass
class EpisodeSpec:
    """Budgets and format of episodes (the ``env`` config section, resolved)."""

    max_turns: int = 1  # 0 = no turn limit (max_episode_tokens bounds the episode)
    max_episode_tokens: int = 8192  # model + environment tokens after the prompt (0 = no cap)
    tool_timeout_s: float = 10.0
    episode_timeout_s: float = 60.0
    max_tool_output_chars: int = 1000
    tool_format: str = "tags"  # "tags" | "chat_template" (resolved, not "auto")
    max_tool_nesting: int = MAX_DEPTH  # brackets in a call's arguments / levels of a tool's result (0 = no cap)
    reset_timeout_s: float = 30.0  # time limit of one environment reset()
    max_observation_chars: int = 8000  # longest reset() observation joined to the prompt (0 = no cap)
    max_failure_fraction: float = 0.5  # stop the run when resets or tool time-outs fail more of a batch's episodes


class EpisodeRunner:
    """Runs batches of episodes; holds the tools, the environment factories and the tokenizer."""

    def __init__(
        self,
        spec: EpisodeSpec,
        tokenizer,
        *,
        tools: list[Callable] | None = None,
        environment_factory: Factory | dict[str, Factory] | None = None,
        render_prompt: Callable[..., str] | None = None,
        route_key: str = "environment",
        template_kwargs: dict[str, Any] | None = None,
    ):
        self.spec, self.tokenizer = spec, tokenizer
        # apply_chat_template's extra keywords for the tool results (data.chat_template_kwargs): the same as the
        # prompts', so a later turn's assistant header is the first turn's (Qwen3's enable_thinking=False)
        self.template_kwargs = dict(template_kwargs or {})
        self.tools = list(tools or [])
        self.factory = environment_factory  # as given: one factory, a dict of named ones, or None
        self.named = isinstance(environment_factory, dict)
        self.factories: dict[str | None, Factory] = (
            dict(environment_factory) if self.named else {None: environment_factory} if environment_factory else {}
        )
        self.route_key = route_key
        # (ids, prefix ids) -> the turn's message under the TRL convention (env/responses.py); None: its text
        self.parse_message: Callable[[list[int], list[int]], dict[str, Any]] | None = None
        self.warned_cut = False  # one warning per run when tool results are cut at max_tool_output_chars
        check_tool_names(self.tools)
        self.env_tools: dict[str | None, list[Callable]] = {}  # name -> the tools its rows see
        for name, factory in self.factories.items():
            probe = probe_environment(name, factory, spec.reset_timeout_s)  # built once: its tools
            self.env_tools[name] = self.tools + environment_tools(probe, self.tools)
        every = list(self.tools)  # the union: whatever any row may call
        for fns in self.env_tools.values():
            every += [t for t in fns if tool_name(t) not in {tool_name(u) for u in every}]
        self.tool_names = [tool_name(t) for t in every]
        self.schemas = self._schemas(every)
        self.starts = EpisodeStarts(
            spec,
            tokenizer,
            self.factories,
            self.named,
            route_key,
            render_prompt,
            lambda name: self._schemas(self.env_tools[name]) or None,
        )  # environments built and reset, observations joined to the prompt

    @property
    def render_prompt(self) -> Callable[..., str] | None:
        """(raw prompt, observation, schemas) -> the rendered text, for reset() observations (None: the
        observation's tokens are appended); held by ``starts``, so that setting it after construction reaches
        the resets."""
        return self.starts.render_prompt

    @render_prompt.setter
    def render_prompt(self, fn: Callable[..., str] | None) -> None:
        self.starts.render_prompt = fn

    def _schemas(self, fns: list[Callable]) -> list[dict]:
        return [tool_schema(t) for t in fns] if self.spec.tool_format == "chat_template" else []

    @property
    def multi_turn(self) -> bool:
        """False when an episode is exactly one plain completion (no tools, no environment)."""
        return bool(self.tool_names) or bool(self.factories)

    def route(self, columns: dict[str, Any]) -> str | None:
        """The environment name of a row (None: the single unnamed one); an unknown name is a user's mistake."""
        if not self.named:
            return None
        name = columns.get(self.route_key)
        if name not in self.factories:  # TRL's words: scripts match on them
            raise ConfigError(
                f"Example has `{self.route_key}={name!r}`, which is not among the environments passed to "
                f"`environment_factory`. Expected one of: {list(self.factories)}."
            )
        return name

    def row_schemas(self, row: dict[str, Any]) -> list[dict] | None:
        """The tool schemas a row's prompt shows (its environment's methods plus the standalone tools)."""
        if not self.named:
            return self.schemas or None
        return self._schemas(self.env_tools[self.route(row)]) or None

    def run(self, sample: Sampler, prompts: list[Prompt], group_size: int, params: SamplingParams) -> Rollout:
        """G episodes for each prompt; row p*G + g is episode g of prompt p."""
        G = group_size
        if not self.multi_turn:  # the one-turn episode: the sampler's rollout as it is
            return _one_turn(sample, prompts, G, params)
        names = [self.route(p.columns) for p in prompts]
        started = self.starts.reset_all(prompts, names, G)
        envs, contexts = started.envs, started.contexts  # each episode's prompt with its own observation
        turn_params = params
        if self.spec.tool_format == "tags":  # a tag-format call ends the model's turn
            turn_params = dataclasses.replace(params, stop=tuple(params.stop) + (CALL_CLOSE,))
        rows = [Row() for _ in envs]
        active = list(range(len(rows)))
        # max_turns 0: no turn limit; each turn that calls a tool adds tokens, so max_episode_tokens ends it
        for turn in range(self.spec.max_turns) if self.spec.max_turns else itertools.count():
            active = self._run_turn(sample, turn, rows, envs, contexts, active, G, turn_params)
            if not active:
                break
        self._check_hung_tools(rows)
        self._warn_cut_results(rows)
        return episodes_rollout(contexts, rows, started, G)

    def _run_turn(
        self,
        sample: Sampler,
        turn: int,
        rows: list[Row],
        envs: list,
        contexts: list[list[int]],
        active: list[int],
        G: int,
        params: SamplingParams,
    ) -> list[int]:
        """Turn ``turn`` of the ``active`` rows: one batched decode, their tool calls side by side, the
        environments' replies; returns the rows still running. ``contexts[i]``: the prompt row i started from."""
        if turn == 0:
            ro = _first_turn(sample, contexts, G, params)
        else:
            ro = sample([contexts[i] + rows[i].ids for i in active], 1, params)
        calls = {
            i: self._turn(
                rows[i], contexts[i], turn, ro.completion_ids[j], ro.sampling_logprobs[j], ro.finish_reasons[j]
            )
            for j, i in enumerate(active)
        }
        calling = [i for i in active if calls[i]]
        if turn == self.spec.max_turns - 1:  # the last allowed turn: its calls are not run (as TRL's last
            for i in calling:  # max_tool_calling_iterations), so the episode ends on the model's turn, not a result
                rows[i].finish = "turns"
            return []
        # the rows' tool calls run side by side (a row's own calls in order, on its own environment)
        work = [functools.partial(self._calls, rows[i], envs[i], calls[i]) for i in calling]
        results = dict(zip(calling, run_all("episode-tools", work, TOOL_THREADS)))
        done = self._done_all([envs[i] for i in calling])
        for i, d in zip(calling, done):
            self._reply(rows[i], envs[i], turn, results[i], d)
        return [i for i in active if rows[i].finish is None]

    def _warn_cut_results(self, rows: list[Row]) -> None:
        """One warning per run when tool results were cut (each counted in tools/truncated_frequency)."""
        cut = sum(r.tool_truncated for r in rows)
        if cut and not self.warned_cut:
            self.warned_cut = True
            log.warning(
                "grpokit: warning: %d of %d tool results were longer than env.max_tool_output_chars=%d and were cut "
                "(the model sees the start and a ...[truncated] mark; TRL does not cut them; counted in "
                "tools/truncated_frequency); raise env.max_tool_output_chars to show more (0 = no cap)",
                cut,
                sum(r.tool_calls for r in rows),
                self.spec.max_tool_output_chars,
            )

    def _check_hung_tools(self, rows: list[Row]) -> None:
        """Stop the run when tool calls that ran past env.tool_timeout_s exceed the batch's allowance."""
        check_failures(
            "tool calls ran past env.tool_timeout_s",
            sum(r.tool_hung for r in rows),
            len(rows),
            self.spec.max_failure_fraction,
            "fix the tool that hangs, or raise env.tool_timeout_s for a slow one",
        )

    # ------------------------------------------------------------------ one turn of one episode

    def _turn(
        self, row: Row, prompt: list[int], turn: int, ids: list[int], logps: list[float], reason: str
    ) -> list[ToolCall]:
        """Append the model's turn; return its tool calls (none: the episode is over)."""
        row.state_keys.append(state_key(prompt, row.ids))
        cap = self.spec.max_episode_tokens
        cut = bool(cap) and len(row.ids) + len(ids) > cap
        if (
            cut
        ):  # a later turn runs past the episode's cap: keep what fits, and the episode ends there (as TRL truncates)
            keep = max(0, cap - len(row.ids))
            ids, logps, reason = ids[:keep], logps[:keep], "length"
        before = prompt + row.ids  # what the turn continues (TRL parses each turn after it)
        row.ids += ids
        row.logps += logps
        row.mask += [1] * len(ids)
        row.turn_ids += [turn] * len(ids)
        text = self.tokenizer.decode(ids, skip_special_tokens=True)
        calls = (
            parse_tool_calls(text, self.tool_names, self.spec.max_tool_nesting) if self.tool_names and not cut else []
        )
        row.messages.append(self.parse_message(ids, before) if self.parse_message else assistant_message(text, calls))
        if not calls:
            row.finish = reason  # an answer: "eos", "stop" or "length"
        return calls

    def _done_all(self, envs: list) -> list[bool]:
        """Each environment's ``done`` after a turn, read side by side within ``tool_timeout_s`` (a
        property is untrusted code too); one that raises or runs over ends its episode."""
        if not any(e is not None for e in envs):
            return [False] * len(envs)
        kinds = sorted({type(e).__qualname__ for e in envs if e is not None})
        outs = call_many(
            "environment-done-" + "+".join(kinds),
            [functools.partial(env_done, e) for e in envs],
            self.spec.tool_timeout_s,
        )
        return [e is not None and (not o.ok or bool(o.value)) for e, o in zip(envs, outs)]

    def _reply(self, row: Row, env, turn: int, results: list[ToolResult], done: bool = False) -> None:
        """Append the environment's reply to the turn's calls, and see whether the episode goes on."""
        s = self.spec
        for r in results:
            row.messages.append({"role": "tool", "name": r.name, "content": r.content})
        reply = self._reply_ids(results, env)
        if s.max_episode_tokens and len(row.ids) + len(reply) > s.max_episode_tokens:
            row.finish = "length"  # the reply does not fit: the episode ends before it (as TRL rolls it back)
            row.messages = row.messages[: len(row.messages) - len(results)]
            return
        row.ids += reply
        row.logps += [0.0] * len(reply)
        row.mask += [0] * len(reply)
        row.turn_ids += [turn] * len(reply)
        if any(r.terminal for r in results):
            row.finish = "tool_error"
        elif row.tool_seconds >= s.episode_timeout_s:
            row.finish = "timeout"
        elif done:
            row.finish = "done"

    def _calls(self, row: Row, env, calls: list[ToolCall]) -> list[ToolResult]:
        return [self._call(row, env, c) for c in calls]

    def _call(self, row: Row, env, call: ToolCall) -> ToolResult:
        s = self.spec
        row.tool_calls += 1
        left = s.episode_timeout_s - row.tool_seconds
        if not call.name:
            why = f" ({call.error})" if call.error else ""
            text = str({"error": f"could not read the tool call{why}: {str(call.arguments)[:200]!r}"})
            result = ToolResult(
                "", cap_text(text, s.max_tool_output_chars), error=True, truncated=is_cut(text, s.max_tool_output_chars)
            )
        elif left <= 0:
            result = ToolResult(call.name, str({"error": "the episode's tool time is used up"}), error=True)
        else:
            tools = {tool_name(t): t for t in self.tools}
            if env is not None:
                tools.update({tool_name(t): t for t in environment_tools(env)})
            result = call_tool(
                tools,
                call.name,
                call.arguments,
                timeout_s=min(s.tool_timeout_s, left),
                max_chars=s.max_tool_output_chars,
                max_depth=s.max_tool_nesting,
            )
            row.tool_timeouts += int(result.timed_out)
            row.tool_hung |= result.timed_out and left >= s.tool_timeout_s
        row.tool_seconds += result.seconds
        row.tool_errors += int(result.error)
        row.tool_truncated += int(result.truncated)
        return result

    def _reply_ids(self, results: list[ToolResult], env) -> list[int]:
        if self.spec.tool_format == "tags":
            return list(
                self.tokenizer(tag_result_text([r.content for r in results]), add_special_tokens=False)["input_ids"]
            )
        messages = [{"role": "tool", "name": r.name, "content": r.content} for r in results]
        return template_suffix_ids(self.tokenizer, messages, self._env_schemas(env), **self.template_kwargs)

    def _env_schemas(self, env) -> list[dict] | None:
        """The schemas the episode's prompt was rendered with (its environment's tools)."""
        if not self.named or env is None:
            return self.schemas or None
        return self._schemas(self.tools + environment_tools(env)) or None


def _first_turn(sample: Sampler, contexts: list[list[int]], G: int, params: SamplingParams) -> Rollout:
    """Turn 0 of every row (in row order): the groups whose G rows start from one context (their resets agree)
    as G completions of that prompt, one cache; the others (a random reset) row by row. One decode when every
    group is of one kind, else two, the shared groups' first (a seeded run draws them in a fixed order)."""
    starts = range(0, len(contexts), G)
    shared = [p for p in starts if all(contexts[i] == contexts[p] for i in range(p + 1, p + G))]
    if len(shared) == len(starts):
        return sample(contexts[::G], G, params)
    if not shared:
        return sample(contexts, 1, params)
    own = sorted(set(range(len(contexts))) - {p + g for p in shared for g in range(G)})
    together = sample([contexts[p] for p in shared], G, params)
    alone = sample([contexts[i] for i in own], 1, params)
    where = {p + g: (together, k * G + g) for k, p in enumerate(shared) for g in range(G)}
    where.update({i: (alone, k) for k, i in enumerate(own)})
    return gather_rows([where[i] for i in range(len(contexts))], 1)


def _one_turn(sample: Sampler, prompts: list[Prompt], G: int, params: SamplingParams) -> Rollout:
    """The sampler's rollout as it is: G completions of every prompt in one batched decode."""
    if prompts and prompts[0].vision is not None:  # image prompts: the hf engines' prefill takes the
        # processor's tensors, vLLM the PIL images; the training passes read the tensors off the rollout
        ro = sample(
            [p.ids for p in prompts],
            G,
            params,
            vision=[p.vision for p in prompts],
            images=[prompt_images(p) for p in prompts],
        )
        return (
            ro
            if ro.vision is not None
            else dataclasses.replace(ro, vision=[p.vision for p in prompts for _ in range(G)])
        )
    return sample([p.ids for p in prompts], G, params)
