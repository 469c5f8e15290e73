"""verifiers (0.4, ``verifiers.v1``) environments under grpokit (``pip install 'grpokit[verifiers]'``).

A verifiers environment is a ``Taskset`` (its tasks: a prompt, a system prompt and the task's own
fields), a ``Task`` class whose ``@vf.reward`` methods score a finished rollout (a ``Trace``),
and tools: ``Toolset`` classes whose ``@vf.tool`` methods the model calls. grpokit takes each part
where its own stage has it:

    taskset_rows(taskset, n)     the tasks as dataset rows (stage 1): "prompt" (the task's text, or
                                 its messages when it has a system prompt or is a chat), and the
                                 task's data as the column "vf_task"
    rubric_rewards(taskset)      one reward function per @vf.reward method (stage 3), named after
                                 it, so each is its own logged component (rewards/<name>/mean);
                                 rubric_weights(...) the methods' weights, for reward.weights.
                                 Each call rebuilds the task's data and a Trace of the episode
                                 (the prompt, then the model's turns and the tools' replies) and
                                 runs the method as verifiers' own Task.score would
    toolset_environment(cls)     a Toolset as the episode's environment (stage 2): a fresh toolset
                                 per episode, its @vf.tool methods the tools, called in process

Not supported (yet): an ``Env`` subclass's own ``run(task, agents)`` protocol (user simulators,
TextArena through verifiers: the environment drives the model through an inference client;
grpokit's episode loop drives the environment), harnesses and runtimes (sandboxed agents), judges
(LLM-scored rewards), ``@vf.metric``, ``@vf.stop`` and keyed (dict) reward results, and toolsets
reached over MCP (they are called in process here). Tests: tests/env/test_hubs_verifiers.py.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import uuid
from collections.abc import Callable
from typing import Any

from . import require

TASK_COLUMN = "vf_task"


def taskset_rows(taskset: Any, n: int | None = None) -> list[dict[str, Any]]:
    """The first ``n`` tasks of ``taskset`` (all of a finite one when None) as grpokit rows."""
    require("verifiers.v1", "verifiers")
    if n is None and not taskset.bounded:
        raise ValueError(f"{type(taskset).__name__} is infinite; pass n, the number of tasks to take")
    rows = []
    for task in taskset.take(n) if n is not None else taskset:
        d = task.data
        if isinstance(d.prompt, str) and d.system_prompt is None:
            prompt: Any = d.prompt
        else:
            prompt = ([{"role": "system", "content": d.system_prompt}] if d.system_prompt else []) + (
                [{"role": "user", "content": d.prompt}]
                if isinstance(d.prompt, str)
                else [m.model_dump(mode="json", exclude_none=True) for m in d.prompt or []]
            )
        rows.append({"prompt": prompt, TASK_COLUMN: {"type": type(task).__name__, "data": d.model_dump(mode="json")}})
    return rows


def rubric_rewards(taskset: Any) -> list[Callable]:
    """One reward function per ``@vf.reward`` method of the taskset's task class, in verifiers'
    order (priority, then name); each returns that method's value for every completion."""
    task = _first_task(taskset)
    hooks = task.hooks("reward")
    if not hooks:
        raise ValueError(f"{type(task).__name__} has no @vf.reward method: verifiers' rubric is what grpokit trains on")
    return [RubricReward(type(task), task.config, fn.__name__) for fn in hooks]


def rubric_weights(taskset: Any) -> list[float]:
    """The weights of ``rubric_rewards(taskset)``, in the same order (``@vf.reward(weight=...)``)."""
    return [float(getattr(fn, "_vf_weight", 1.0)) for fn in _first_task(taskset).hooks("reward")]


class RubricReward:
    """A verifiers reward method as a grpokit reward function (TRL's convention)."""

    def __init__(self, task_cls: type, task_config: Any, method: str):
        self.task_cls, self.task_config, self.method = task_cls, task_config, method
        self.__name__ = method

    def __call__(self, prompts, completions, **kwargs) -> list[float | None]:
        tasks = kwargs.get(TASK_COLUMN)
        if tasks is None:
            raise ValueError(
                f"the reward {self.method!r} needs the dataset column {TASK_COLUMN!r}; "
                "build the rows with grpokit.env.hubs.verifiers_env.taskset_rows"
            )
        return [self._one(p, c, t) for p, c, t in zip(prompts, completions, tasks)]

    def _one(self, prompt: Any, completion: Any, stored: dict) -> float | None:
        from verifiers.v1.utils.decorators import invoke

        data = self.task_cls.data_type().model_validate(stored["data"])
        task = self.task_cls(data, self.task_config)
        trace = build_trace(task, prompt, completion)
        fn = next(h for h in task.hooks("reward") if h.__name__ == self.method)
        value = invoke(fn, {"task": data, "trace": trace})
        if inspect.isawaitable(value):
            value = asyncio.run(_await(value))
        if isinstance(value, dict):
            raise ValueError(
                f"the reward {self.method!r} returned keyed scores; grpokit takes one number per reward method"
            )
        return None if value is None else float(value)


def build_trace(task: Any, prompt: Any, completion: Any) -> Any:
    """A verifiers ``Trace`` of one episode: the prompt's messages, then the model's turns (sampled)
    and the tools' replies. ``completion`` is a string (one turn) or grpokit's list of messages."""
    import verifiers.v1 as vf
    from verifiers.v1.trace import AgentInfo, TraceTask

    msgs = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else list(prompt or [])
    turns = [{"role": "assistant", "content": completion}] if isinstance(completion, str) else list(completion)
    nodes, call_ids = [], []
    for m, sampled in [(m, False) for m in msgs] + [(m, True) for m in turns]:
        nodes.append(
            vf.MessageNode(
                parent=len(nodes) - 1 if nodes else None,
                message=_message(m, call_ids),
                sampled=sampled and m.get("role") == "assistant",
            )
        )
    return vf.Trace(
        task=TraceTask(type=type(task).__name__, data=task.data, key=task.key, hash=task.hash),
        agent=AgentInfo(config=vf.AgentConfig()),
        nodes=nodes,
    )


def _message(m: dict, call_ids: list[str]) -> Any:
    """grpokit's chat message as verifiers' typed message (tool calls get ids, and replies the ids)."""
    import verifiers.v1 as vf

    role, content = m.get("role"), m.get("content") or ""
    if role == "assistant":
        calls = []
        for c in m.get("tool_calls") or []:
            fn = c.get("function", c)
            args = fn.get("arguments", {})
            call_ids.append(uuid.uuid4().hex[:12])
            calls.append(
                vf.ToolCall(
                    id=call_ids[-1],
                    name=fn.get("name", ""),
                    arguments=args if isinstance(args, str) else json.dumps(args),
                )
            )
        return vf.AssistantMessage(content=content, tool_calls=calls or None)
    if role == "tool":
        return vf.ToolMessage(
            tool_call_id=call_ids.pop(0) if call_ids else "", content=str(content), name=m.get("name")
        )
    if role == "system":
        return vf.SystemMessage(content=content)
    return vf.UserMessage(content=content)


def toolset_environment(toolset_cls: type, config: Any = None, name: str | None = None) -> type:
    """An environment class whose episodes each get a fresh ``toolset_cls(config)``; its ``@vf.tool``
    methods are the episode's tools (same names; their docstrings describe them to the model)."""
    require("verifiers.v1", "verifiers")
    from verifiers.v1.utils.decorators import discover_decorated

    make_config = (lambda: config) if config is not None else _default_config(toolset_cls)
    probe = toolset_cls(make_config())
    methods = {getattr(fn, "tool_name", None) or fn.__name__: fn.__name__ for fn in discover_decorated(probe, "tool")}
    if not methods:
        raise ValueError(f"{toolset_cls.__name__} has no @vf.tool method")

    def reset(self, **row: Any) -> None:
        self.toolset = toolset_cls(make_config())

    body: dict[str, Any] = {"reset": reset, "__doc__": f"An episode with a fresh {toolset_cls.__name__}."}
    for tool, attr in methods.items():
        body[tool] = _forward(tool, attr, getattr(probe, attr))
    return type(name or toolset_cls.__name__, (), body)


def _forward(tool: str, attr: str, bound: Callable) -> Callable:
    """A method calling the episode's toolset, with the tool's signature and an Args docstring
    (what tool schemas are built from: env/tools.py)."""
    sig = inspect.signature(bound)

    def method(self, *args: Any, **kwargs: Any) -> Any:
        return getattr(self.toolset, attr)(*args, **kwargs)

    method.__name__ = method.__qualname__ = tool
    method.__signature__ = sig.replace(
        parameters=[inspect.Parameter("self", inspect.Parameter.POSITIONAL_ONLY), *sig.parameters.values()]
    )
    method.__annotations__ = dict(getattr(bound, "__annotations__", {}))
    summary = (inspect.getdoc(bound) or f"The {tool} tool.").split("\n\nArgs:")[0].strip()
    args = "".join(f"\n    {p}: the {p}." for p in sig.parameters)
    method.__doc__ = summary + (f"\n\nArgs:{args}" if args else "")
    return method


def _default_config(toolset_cls: type) -> Callable[[], Any]:
    from verifiers.v1.mcp import ToolsetConfig

    return ToolsetConfig


def _first_task(taskset: Any) -> Any:
    require("verifiers.v1", "verifiers")
    for task in taskset.take(1):
        return task
    raise ValueError(f"{type(taskset).__name__} has no tasks")


async def _await(value):
    return await value
