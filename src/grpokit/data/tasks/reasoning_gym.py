"""reasoning-gym's procedural tasks as grpokit tasks: ``data.task=reasoning_gym:<name>``.

reasoning-gym (PyPI ``reasoning-gym``) generates ~100 verifiable tasks offline, each a dataset whose
item ``i`` is a pure function of (config, seed, i) and whose ``score_answer(answer, entry)`` grades
an answer string. Here:

* **Names and mixtures.** ``reasoning_gym:basic_arithmetic`` is one task;
  ``reasoning_gym:chain_sum=2,leg_counting=1`` mixes tasks with weights (each row is drawn from one
  task, chosen by a seeded draw in proportion to the weights).
* **Config.** ``data.task_params`` is the task's reasoning-gym config (its dataclass fields, e.g.
  ``{min_digits: 2, max_digits: 2}``); for a mixture, one mapping per task name. The key
  ``instruction`` is grpokit's own: the sentence appended to every question (default
  ``DEFAULT_INSTRUCTION``).
* **Splits.** The held-out rows are drawn with a fixed seed (``HELD_OUT_SEED``): every run of the
  same task and config evaluates on the same questions. Training rows come from a seed derived from
  ``train.seed`` and skip every question text of the held-out pool (``HELD_OUT_POOL`` rows), so the
  splits are disjoint even for tasks with few distinct questions.
* **Reward.** ``reasoning_gym_accuracy`` is the task's own verifier under grpokit's one-answer rule
  (grpokit.rewards.answers): the completion's one final answer is found (answer tags, a box, "the
  answer is X", else the last line); candidates that disagree, or an answer naming more values than
  the gold answer does ("85 or 86"), score 0, where reasoning-gym's scorers would pay partial credit
  for a hedge. For a numeric gold answer the last number of that one answer is scored
  ("47 + 38 = 85" answers 85). Then ``score_answer`` grades it.

Each row carries ``rg_source`` (JSON: task, config, seed, dataset size, index) so the reward regenerates the exact
entry in any process, and TRL users get the same rows and reward from ``dataset`` and
``reasoning_gym_accuracy`` (docs/TASKS.md).
"""

from __future__ import annotations

import functools
import json
import random
import re
import zlib
from typing import Any

from grpokit.config.sections import ConfigError
from grpokit.rewards.answers import count_values, final_answer
from grpokit.rewards.math import completion_text

PREFIX = "reasoning_gym:"
DEFAULT_INSTRUCTION = "Think briefly, then give the final answer on the last line."
"""Appended to every question unless ``data.task_params.instruction`` says otherwise."""
HELD_OUT_SEED = 20261127
"""The seed of every held-out split (fixed: runs of one task and config evaluate on the same rows)."""
HELD_OUT_POOL = 2000
"""Questions of this many held-out rows are never used for training (data.eval_size up to this many are disjoint)."""
_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")
_INT_GOLD = re.compile(r"^-?\d+(?:\.\d+)?$")


def parse_mix(task: str) -> dict[str, float]:
    """``reasoning_gym:a=2,b`` -> ``{"a": 2.0, "b": 1.0}``, each name checked against reasoning-gym."""
    names = _registry()
    mix: dict[str, float] = {}
    for part in task.removeprefix(PREFIX).split(","):
        name, _, weight = part.strip().partition("=")
        if name not in names or name == "composite":
            raise ConfigError(
                f"data.task={task!r}: {name!r} is not a reasoning-gym task; valid: "
                f"{', '.join(n for n in names if n != 'composite')}"
            )
        try:
            mix[name] = float(weight) if weight else 1.0
        except ValueError:
            raise ConfigError(f"data.task={task!r}: the weight of {name!r} must be a number, got {weight!r}") from None
        if mix[name] <= 0:
            raise ConfigError(f"data.task={task!r}: the weight of {name!r} must be > 0")
    return mix


def _registry() -> list[str]:
    try:
        import reasoning_gym
    except ImportError:
        raise ConfigError(
            "data.task=reasoning_gym:... needs the PyPI package reasoning-gym; install it with: "
            "pip install reasoning-gym"
        ) from None
    return sorted(reasoning_gym.factory.DATASETS)


def split_params(mix: dict[str, float], params: dict) -> tuple[dict[str, dict], str]:
    """Each task's reasoning-gym config and the instruction, from ``data.task_params``."""
    params = dict(params or {})
    instruction = str(params.pop("instruction", DEFAULT_INSTRUCTION))
    if len(mix) == 1:
        configs = {next(iter(mix)): params}
    else:
        stray = [k for k in params if k not in mix]
        if stray:
            raise ConfigError(
                f"data.task_params of a mixture maps each task name to its config; {', '.join(stray)} "
                f"is not one of {', '.join(mix)}"
            )
        configs = {name: dict(params.get(name) or {}) for name in mix}
    for name, config in configs.items():
        _dataset(name, json.dumps(config, sort_keys=True), 0, 1)  # a bad field: one sentence here, not in a worker
    return configs, instruction


def _size(index: int) -> int:
    """The dataset size item ``index`` is drawn from: a power of two above it (at least 256). Some
    reasoning-gym datasets generate all their items up front, so the size must stay near what is used;
    each row records its size, so the reward rebuilds exactly the dataset it came from."""
    return max(256, 1 << (index + 1).bit_length())


@functools.lru_cache(maxsize=64)
def _dataset(name: str, config_json: str, seed: int, size: int = 256):
    import reasoning_gym

    try:
        return reasoning_gym.create_dataset(name, seed=seed, size=size, **json.loads(config_json))
    except (TypeError, AssertionError, ValueError) as e:
        raise ConfigError(
            f"data.task_params for reasoning-gym's {name!r} is not a valid config ({e}); "
            "give fields of its config dataclass"
        ) from None


def _seed(*parts: Any) -> int:
    return zlib.crc32(json.dumps(parts).encode())


def make_rows(
    mix: dict[str, float],
    configs: dict[str, dict],
    instruction: str,
    n: int,
    seed: int,
    exclude: frozenset[str] = frozenset(),
    distinct: bool = False,
    short_ok: bool = False,
) -> list[dict[str, Any]]:
    """``n`` rows ``{"prompt", "answer", "rg_task", "rg_source"}``, deterministic in the arguments;
    rows whose question is in ``exclude`` (or, when ``distinct``, already taken) are skipped and
    replaced by later items. ``short_ok``: fewer rows when the task has fewer distinct questions."""
    pick = random.Random(_seed("mix", seed, sorted(mix.items())))
    names, weights = list(mix), list(mix.values())
    rows, index, taken = [], {name: 0 for name in mix}, set()
    while len(rows) < n:
        name = pick.choices(names, weights)[0] if len(names) > 1 else names[0]
        row = _next_row(
            name, configs[name], instruction, _seed(name, seed), index, exclude, taken if distinct else None
        )
        if row is None:  # this task ran out of questions outside the exclusions
            if short_ok:
                return rows
            raise ConfigError(
                f"reasoning-gym's {name!r} with this config has too few distinct questions outside the "
                f"held-out set for {n} rows; widen data.task_params (e.g. more digits or terms)"
            )
        rows.append(row)
    return rows


def _next_row(
    name: str,
    config: dict,
    instruction: str,
    task_seed: int,
    index: dict[str, int],
    exclude: frozenset[str],
    taken: set[str] | None,
    tries: int = 1000,
) -> dict[str, Any] | None:
    """The task's next item whose question is neither excluded nor (``taken`` given) taken already;
    a skipped item is replaced from the same task, so exclusions never change a mixture's shares."""
    config_json = json.dumps(config, sort_keys=True)
    for _ in range(tries):
        i = index[name]
        index[name] += 1
        entry = _dataset(name, config_json, task_seed, _size(i))[i]
        question = entry["question"].strip()
        if question in exclude or (taken is not None and question in taken):
            continue
        if taken is not None:
            taken.add(question)
        source = {"task": name, "config": config, "seed": task_seed, "size": _size(i), "index": i}
        return {
            "prompt": f"{question} {instruction}".strip(),
            "answer": str(entry["answer"]),
            "rg_task": name,
            "rg_source": json.dumps(source, sort_keys=True),
        }
    return None


def _entry(source: str) -> tuple[Any, dict]:
    s = json.loads(source)
    ds = _dataset(s["task"], json.dumps(s["config"], sort_keys=True), s["seed"], s["size"])
    return ds, ds[s["index"]]


def one_answer(text: str, gold: str, prompt: str | None = None) -> str | None:
    """The completion's one final answer as reasoning-gym should see it, or None for no answer or a
    hedge (see the module docstring)."""
    found = final_answer(text, prompt)
    if found.text is None or found.others:
        return None
    answer = found.text.strip()
    if count_values(answer) > max(1, count_values(gold)):
        return None
    if _INT_GOLD.match(gold.strip()):
        numbers = _NUMBER.findall(answer.replace(",", ""))
        return numbers[-1] if numbers else None
    return answer


def reasoning_gym_accuracy(
    completions: list, rg_source: list[str], prompts: list | None = None, answer: list | None = None, **kwargs: Any
) -> list[float]:
    """TRL-convention reward: reasoning-gym's ``score_answer`` on each completion's one answer (0.0
    for none or a hedge). ``rg_source`` is the dataset column every row of this module carries."""
    out = []
    for i, (completion, source) in enumerate(zip(completions, rg_source)):
        ds, entry = _entry(source)
        prompt = prompts[i] if prompts is not None else None
        gold = str(entry["answer"])
        # a grid answer (rotate_matrix, n_queens, arc_agi) may rightly repeat rows of the question:
        # the echo rule (lines copied from the prompt are not the answer) holds for one-line golds only
        prompt_text = prompt if isinstance(prompt, str) and "\n" not in gold.strip() else None
        pred = one_answer(completion_text(completion), gold, prompt_text)
        out.append(0.0 if pred is None else float(ds.score_answer(pred, entry)))
    return out


def dataset(
    task: str, n: int, seed: int = 0, params: dict | None = None, split: str = "train", conversational: bool = True
):
    """A ``datasets.Dataset`` of ``n`` rows for TRL's GRPOTrainer (and grpokit.trl's): ``prompt``
    (chat messages when ``conversational``), ``answer``, ``rg_task``, ``rg_source``; pair it with
    ``reasoning_gym_accuracy`` as the reward function. ``split="held_out"`` gives the held-out rows."""
    from datasets import Dataset

    tr, held = rows_for(task, params or {})
    rows = held(n) if split == "held_out" else tr(n, seed)
    if conversational:
        rows = [{**r, "prompt": [{"role": "user", "content": r["prompt"]}]} for r in rows]
    return Dataset.from_list(rows)


def rows_for(task: str, params: dict):
    """(train_rows(n, seed), held_out_rows(n)) of a ``reasoning_gym:...`` task with its params."""
    mix = parse_mix(task)
    configs, instruction = split_params(mix, params)

    @functools.lru_cache(maxsize=2)
    def pool() -> tuple[dict[str, Any], ...]:
        return tuple(make_rows(mix, configs, instruction, HELD_OUT_POOL, HELD_OUT_SEED, distinct=True, short_ok=True))

    def held_out_rows(n: int | None = None) -> list[dict[str, Any]]:
        """Distinct questions; beyond HELD_OUT_POOL they may overlap the training rows."""
        if n is not None and n > HELD_OUT_POOL:
            return make_rows(mix, configs, instruction, n, HELD_OUT_SEED, distinct=True)
        return [dict(r) for r in pool()[:n]]

    def train_rows(n: int, seed: int = 0) -> list[dict[str, Any]]:
        exclude = frozenset(r["prompt"].removesuffix(f" {instruction}") for r in pool())
        return make_rows(mix, configs, instruction, n, seed + 1, exclude)

    return train_rows, held_out_rows
