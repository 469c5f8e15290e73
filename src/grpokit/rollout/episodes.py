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
called a tool ("turns"), when the environment's reply would pass ``max_episode_tokens`` or a model
turn would (the turn is cut at the cap; "length"), or when its tools have used ``episode_timeout_s`` seconds ("timeout").

Environments and tools are untrusted code, and every call into them has a deadline: tools
``tool_timeout_s`` (env/tools.py), ``reset`` ``reset_timeout_s`` (the trainer's main thread is
interrupted with SIGALRM, as for in-process rewards: rewards/inproc.py). A ``reset`` that raises or
runs over is contained: that prompt's episodes start from the bare prompt, counted in
``episodes/reset_failures``; its observation is cut at ``max_observation_chars`` characters (10 MB
would have been a 10-million-token prompt). Limits and defaults: docs/FAULTS.md.

The single-turn rollout is this loop with no tools and no environment: one turn, no parsing, and
the sampler's Rollout comes back unchanged (``episodes`` None). The sampler is a function
``sample(contexts, group_size, params) -> Rollout``: ``rollout.hf.generate`` on a model, or a vLLM
engine, so every backend runs the same loop.

Environments follow TRL: one instance per episode, ``reset(**row)`` before the first turn (a
returned string is appended to the prompt; when the G episodes of a prompt get different observations,
a random start as in TRL's 2048 example, each starts from its own: the group shares the common prefix
of their contexts and each episode begins with the rest as environment tokens, with one warning),
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
import hashlib
import warnings
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Callable

from grpokit.config.sections import ConfigError
from grpokit.data.vision import prompt_images
from grpokit.env.parse import CALL_CLOSE, MAX_DEPTH, ToolCall, assistant_message, parse_tool_calls, tag_result_text, template_suffix_ids
from grpokit.env.tools import ToolResult, call_tool, cap_text, environment_tools, tool_name, tool_schema
from grpokit.rewards.inproc import InProcessCaller
from grpokit.types import Episode, Prompt, Rollout
from .hf import SamplingParams

Sampler = Callable[[list[list[int]], int, SamplingParams], Rollout]
TOOL_THREADS = 8  # rows whose tool calls run at once (tools mostly wait: on a sandbox, a service, a timer)


@dataclass
class EpisodeSpec:
    """Budgets and format of episodes (the ``env`` config section, resolved)."""

    max_turns: int = 1
    max_episode_tokens: int = 8192  # model + environment tokens after the prompt (0 = no cap)
    tool_timeout_s: float = 10.0
    episode_timeout_s: float = 60.0
    max_tool_output_chars: int = 1000
    tool_format: str = "tags"  # "tags" | "chat_template" (resolved, not "auto")
    max_tool_nesting: int = MAX_DEPTH  # brackets in a call's arguments / levels of a tool's result (0 = no cap)
    reset_timeout_s: float = 30.0  # time limit of one environment reset()
    max_observation_chars: int = 8000  # longest reset() observation joined to the prompt (0 = no cap)


@dataclass
class _Row:
    """One running episode."""

    ids: list[int] = field(default_factory=list)
    logps: list[float] = field(default_factory=list)
    mask: list[int] = field(default_factory=list)
    turn_ids: list[int] = field(default_factory=list)
    state_keys: list[str] = field(default_factory=list)
    messages: list[dict[str, Any]] = field(default_factory=list)
    tool_calls: int = 0
    tool_errors: int = 0
    tool_seconds: float = 0.0
    tool_timeouts: int = 0
    finish: str | None = None


Factory = Callable[[], Any]


class EpisodeRunner:
    """Runs batches of episodes; holds the tools, the environment factories and the tokenizer."""

    def __init__(self, spec: EpisodeSpec, tokenizer, *, tools: list[Callable] | None = None,
                 environment_factory: Factory | dict[str, Factory] | None = None,
                 render_prompt: Callable[..., list[int]] | None = None, route_key: str = "environment"):
        self.spec, self.tokenizer = spec, tokenizer
        self.tools = list(tools or [])
        self.factory = environment_factory  # as given: one factory, a dict of named ones, or None
        self.named = isinstance(environment_factory, dict)
        self.factories: dict[str | None, Factory] = (dict(environment_factory) if self.named else
                                                     {None: environment_factory} if environment_factory else {})
        self.route_key = route_key
        self.render_prompt = render_prompt  # (raw prompt, observation, schemas) -> ids, for reset() observations
        self.env_tools: dict[str | None, list[Callable]] = {}  # name -> the tools its rows see
        for name, factory in self.factories.items():
            self.env_tools[name] = self.tools + environment_tools(factory())  # a probe: its tools
        every = list(self.tools)  # the union: whatever any row may call
        for fns in self.env_tools.values():
            every += [t for t in fns if tool_name(t) not in {tool_name(u) for u in every}]
        self.tool_names = [tool_name(t) for t in every]
        self.schemas = self._schemas(every)
        self._caller = InProcessCaller()
        self._warned_random_reset = False  # one warning per run when reset() observations differ within a group

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
            raise ConfigError(f"Example has `{self.route_key}={name!r}`, which is not among the environments passed to "
                              f"`environment_factory`. Expected one of: {list(self.factories)}.")
        return name

    def row_schemas(self, row: dict[str, Any]) -> list[dict] | None:
        """The tool schemas a row's prompt shows (its environment's methods plus the standalone tools)."""
        if not self.named:
            return self.schemas or None
        return self._schemas(self.env_tools[self.route(row)]) or None

    def run(self, sample: Sampler, prompts: list[Prompt], group_size: int, params: SamplingParams) -> Rollout:
        """G episodes for each prompt; row p*G + g is episode g of prompt p."""
        G, s = group_size, self.spec
        if not self.multi_turn:  # the one-turn episode: the sampler's rollout as it is
            if prompts and prompts[0].vision is not None:  # image prompts: the hf engines' prefill takes the
                # processor's tensors, vLLM the PIL images; the training passes read the tensors off the rollout
                ro = sample([p.ids for p in prompts], G, params, vision=[p.vision for p in prompts],
                            images=[prompt_images(p) for p in prompts])
                return ro if ro.vision is not None else dataclasses.replace(ro, vision=[p.vision for p in prompts for _ in range(G)])
            return sample([p.ids for p in prompts], G, params)
        names = [self.route(p.columns) for p in prompts]
        envs = [self.factories[n]() if self.factories else None for n in names for _ in range(G)]
        reset_failed: list[bool] = []
        starts = [self._reset(p, envs[k * G:(k + 1) * G], reset_failed, names[k]) for k, p in enumerate(prompts)]
        prompt_ids = [shared for shared, _ in starts]
        turn_params = params
        if s.tool_format == "tags":  # a tag-format call ends the model's turn
            turn_params = dataclasses.replace(params, stop=tuple(params.stop) + (CALL_CLOSE,))
        rows = [_Row() for _ in envs]
        for i, row in enumerate(rows):  # a random reset: the part of its observation the group does not share
            own = starts[i // G][1][i % G]
            row.ids, row.logps, row.mask, row.turn_ids = list(own), [0.0] * len(own), [0] * len(own), [0] * len(own)
        active = list(range(len(rows)))
        for turn in range(s.max_turns):
            if turn == 0 and not any(row.ids for row in rows):
                ro = sample(prompt_ids, G, turn_params)
            else:
                ro = sample([prompt_ids[i // G] + rows[i].ids for i in active], 1, turn_params)
            calls = {i: self._turn(rows[i], prompt_ids[i // G], turn, ro.completion_ids[j], ro.sampling_logprobs[j],
                                   ro.finish_reasons[j]) for j, i in enumerate(active)}
            calling = [i for i in active if calls[i]]
            # the rows' tool calls run side by side (a row's own calls in order, on its own environment)
            with ThreadPoolExecutor(max_workers=max(1, min(TOOL_THREADS, len(calling)))) as pool:
                results = dict(zip(calling, pool.map(lambda i: [self._call(rows[i], envs[i], c) for c in calls[i]], calling)))
            for i in calling:
                self._reply(rows[i], envs[i], turn, results[i])
            active = [i for i in active if rows[i].finish is None]
            if not active:
                break
        for i in active:  # still calling tools after the last allowed turn
            rows[i].finish = "turns"
        episodes = [Episode(r.mask, r.turn_ids, r.state_keys, r.messages, r.tool_calls, r.tool_errors, env,
                            r.tool_timeouts, reset_failed[k // G]) for k, (r, env) in enumerate(zip(rows, envs))]
        return Rollout(prompt_ids, [r.ids for r in rows], [r.logps for r in rows], [r.finish for r in rows], G, episodes)

    # ------------------------------------------------------------------ one turn of one episode

    def _turn(self, row: _Row, prompt: list[int], turn: int, ids: list[int], logps: list[float], reason: str) -> list[ToolCall]:
        """Append the model's turn; return its tool calls (none: the episode is over)."""
        row.state_keys.append(_state_key(prompt, row.ids))
        cap = self.spec.max_episode_tokens
        cut = bool(cap) and len(row.ids) + len(ids) > cap
        if cut:  # a later turn runs past the episode's cap: keep what fits, and the episode ends there (as TRL truncates)
            keep = max(0, cap - len(row.ids))
            ids, logps, reason = ids[:keep], logps[:keep], "length"
        row.ids += ids
        row.logps += logps
        row.mask += [1] * len(ids)
        row.turn_ids += [turn] * len(ids)
        text = self.tokenizer.decode(ids, skip_special_tokens=True)
        calls = parse_tool_calls(text, self.tool_names, self.spec.max_tool_nesting) if self.tool_names and not cut else []
        row.messages.append(assistant_message(text, calls))
        if not calls:
            row.finish = reason  # an answer: "eos", "stop" or "length"
        return calls

    def _reply(self, row: _Row, env, turn: int, results: list[ToolResult]) -> None:
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
        elif env is not None and _done(env):
            row.finish = "done"

    def _call(self, row: _Row, env, call: ToolCall) -> ToolResult:
        s = self.spec
        row.tool_calls += 1
        left = s.episode_timeout_s - row.tool_seconds
        if not call.name:
            why = f" ({call.error})" if call.error else ""
            text = str({"error": f"could not read the tool call{why}: {str(call.arguments)[:200]!r}"})
            result = ToolResult("", cap_text(text, s.max_tool_output_chars), error=True)
        elif left <= 0:
            result = ToolResult(call.name, str({"error": "the episode's tool time is used up"}), error=True)
        else:
            tools = {tool_name(t): t for t in self.tools}
            if env is not None:
                tools.update({tool_name(t): t for t in environment_tools(env)})
            result = call_tool(tools, call.name, call.arguments, timeout_s=min(s.tool_timeout_s, left),
                               max_chars=s.max_tool_output_chars, max_depth=s.max_tool_nesting)
            row.tool_timeouts += int(result.error and "timed out after" in result.content)
        row.tool_seconds += result.seconds
        row.tool_errors += int(result.error)
        return result

    def _reply_ids(self, results: list[ToolResult], env) -> list[int]:
        if self.spec.tool_format == "tags":
            return list(self.tokenizer(tag_result_text([r.content for r in results]), add_special_tokens=False)["input_ids"])
        messages = [{"role": "tool", "name": r.name, "content": r.content} for r in results]
        return template_suffix_ids(self.tokenizer, messages, self._env_schemas(env))

    def _env_schemas(self, env) -> list[dict] | None:
        """The schemas the episode's prompt was rendered with (its environment's tools)."""
        if not self.named or env is None:
            return self.schemas or None
        return self._schemas(self.tools + environment_tools(env)) or None

    def _reset(self, prompt: Prompt, envs: list, failed: list[bool], name: str | None = None) -> tuple[list[int], list[list[int]]]:
        """Reset the G environments of one prompt with its row; their observation (if any) joins the prompt.
        Returns the prompt the G episodes share and each episode's own start: empty when the observations
        agree; when they differ (a random reset, which TRL accepts), each episode's context is the prompt
        rendered with its own observation, the group sharing their common prefix and each episode starting
        with the rest as environment tokens (never trained on). A reset that raises or runs over leaves the
        bare prompt (``failed`` gets True), never a crash or a hang."""
        failed.append(False)
        bare = (list(prompt.ids), [[] for _ in envs])
        if not self.factories:
            return bare
        row = {"prompt": prompt.raw if prompt.raw is not None else prompt.text, **prompt.columns}
        if self.named:  # the routing column chose the environment; it is no row data of it (as TRL)
            row.pop(self.route_key, None)
        outs = [self._caller.call("reset", lambda e=env: e.reset(**row), (), self.spec.reset_timeout_s) for env in envs]
        if not all(o.ok for o in outs):
            failed[-1] = True
            return bare
        obs = [o.value for o in outs]
        if all(o is None for o in obs):
            return bare
        try:
            texts = [cap_text(str(o), self.spec.max_observation_chars) for o in obs]
        except Exception:  # an observation whose str() raises: the bare prompt, as for a failed reset
            failed[-1] = True
            return bare
        if len(set(texts)) > 1 and not self._warned_random_reset:
            self._warned_random_reset = True
            warnings.warn("the environment's reset() returned different observations for the episodes of one prompt; each "
                          "episode starts from its own (as TRL), so GRPO's group baseline compares episodes that started apart",
                          stacklevel=2)
        contexts = {t: self._with_observation(prompt, row["prompt"], t, name) for t in set(texts)}
        shared = _common_prefix([contexts[t] for t in texts])
        return shared, [contexts[t][len(shared):] for t in texts]

    def _with_observation(self, prompt: Prompt, raw: Any, text: str, name: str | None) -> list[int]:
        """The prompt's ids with a reset observation joined (appended to the last user turn when rendered)."""
        if self.render_prompt is None:
            return list(prompt.ids) + list(self.tokenizer(text, add_special_tokens=False)["input_ids"])
        return self.render_prompt(raw, text, self._schemas(self.env_tools[name]) or None)


def _common_prefix(seqs: list[list[int]]) -> list[int]:
    """The longest list of ids every sequence starts with."""
    first = seqs[0]
    n = min(len(q) for q in seqs)
    for k in range(n):
        if any(q[k] != first[k] for q in seqs):
            return list(first[:k])
    return list(first[:n])


def _done(env: Any) -> bool:
    """The environment's ``done``; one that cannot be read (a property that raises) ends the episode."""
    try:
        return bool(getattr(env, "done", False))
    except Exception:
        return True


def _state_key(prompt: list[int], ids: list[int]) -> str:
    """The state a turn starts from: a digest of the whole context (prompt + episode so far), so two
    episodes share a key exactly when the model saw the same tokens (GiGPO's identical states)."""
    h = hashlib.blake2b(digest_size=12)
    h.update(repr((prompt, ids)).encode())
    return h.hexdigest()


def episode_metrics(ro: Rollout) -> dict[str, float]:
    """Per-step metrics of a batch of episodes (empty for plain completions). Names of the same
    concept follow TRL: ``tools/call_frequency`` (calls per episode), ``tools/failure_frequency``."""
    if ro.episodes is None:
        return {}
    eps, n = ro.episodes, max(1, len(ro.episodes))
    calls = sum(e.tool_calls for e in eps)
    model_tokens = sum(sum(e.model_mask) for e in eps)
    out = {
        "episodes/turns_mean": sum(e.turns for e in eps) / n,
        "episodes/turns_max": float(max(e.turns for e in eps)),
        "episodes/tool_use_rate": sum(e.tool_calls > 0 for e in eps) / n,
        "episodes/tool_calls_mean": calls / n,
        "episodes/tool_errors_mean": sum(e.tool_errors for e in eps) / n,
        "episodes/model_tokens_mean": model_tokens / n,
        "episodes/env_tokens_mean": sum(e.env_tokens for e in eps) / n,
        "episodes/truncated_by_turns": ro.finish_reasons.count("turns") / n,
        "tools/call_frequency": calls / n,
        "tools/failure_frequency": sum(e.tool_errors for e in eps) / calls if calls else 0.0,
        "episodes/tool_timeouts_mean": sum(e.tool_timeouts for e in eps) / n,
        "episodes/reset_failures": float(sum(e.reset_failed for e in eps)),
    }
    for reason in ("done", "tool_error", "timeout"):
        out[f"episodes/finished_{reason}"] = ro.finish_reasons.count(reason) / n
    return out
