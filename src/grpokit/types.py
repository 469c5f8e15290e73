"""The small records that flow between pipeline stages."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, overload

import torch


@dataclass(frozen=True)
class Prompt:
    """One training prompt: its text, its token ids, and the dataset's other columns (answer ...)."""

    text: str
    ids: list[int]
    columns: dict[str, Any] = field(default_factory=dict)
    raw: Any = None  # the dataset's prompt as given (text or chat messages), for environments' reset(**row)
    vision: dict[str, Any] | None = (
        None  # the processor's image inputs (pixel_values, image_grid_thw ...), data/vision.py
    )
    pool_index: int | None = None  # its place in the pool of the sampler serving it, where that sampler keeps state
    # per prompt (data/curriculum.py numbers its pool): a copy keeps it where object identity would not (an
    # asynchronous checkpoint's in-flight prompts come back unpickled); None: numbered by no sampler


@dataclass(frozen=True, eq=False)
class OneVersion(Sequence[int]):
    """The versions of a row whose every token one policy version drew: ``length`` times ``version``, kept as
    one int (rollout/staleness.py ages the row as ``tokens * (step - version)``, no list per token). It reads,
    iterates and compares (``==``) as that list: ``OneVersion(2, 3) == [2, 2, 2]``."""

    version: int
    length: int

    def __len__(self) -> int:
        return self.length

    @overload
    def __getitem__(self, i: int) -> int: ...
    @overload
    def __getitem__(self, i: slice) -> list[int]: ...
    def __getitem__(self, i: int | slice) -> int | list[int]:
        if isinstance(i, slice):
            return [self.version] * len(range(*i.indices(self.length)))
        if not -self.length <= i < self.length:
            raise IndexError(f"token {i} of a row of {self.length}")
        return self.version

    def __eq__(self, other: object) -> bool:
        if isinstance(other, OneVersion):
            return (self.version, self.length) == (other.version, other.length)
        if isinstance(other, (list, tuple)):
            return len(other) == self.length and all(v == self.version for v in other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]  # equal to a list, so unhashable like one


@dataclass
class Rollout:
    """Stage 2's output: G completions for each of P prompts, grouped consecutively (N = P*G).

    ``completion_ids[i]`` has no padding; it ends with the EOS token when ``finish_reasons[i]`` is
    "eos". ``sampling_logprobs[i][t]`` is the log-probability the sampler gave token t (after
    temperature, top-k/p, min-p: with truncation, renormalised over the tokens it kept).

    Multi-turn episodes (rollout/episodes.py) put everything after the prompt in ``completion_ids``:
    the model's turns and the environment's replies in between. ``episodes[i].model_mask`` says
    which token is which (1: the model sampled it, 0: the environment wrote it; its sampling
    logprob is 0.0). ``episodes`` is None for plain completions (every token is the model's).
    """

    prompt_ids: list[list[int]]  # P: each group's prompt (its first row's where row_prompt_ids gives each row's)
    completion_ids: list[list[int]]  # N
    sampling_logprobs: list[list[float]]  # N
    finish_reasons: list[
        str
    ]  # N: "eos" | "length" | "stop" (episodes also "turns" | "done" | "tool_error" | "timeout")
    group_size: int
    episodes: list["Episode"] | None = None  # N, or None for single-turn completions
    vision: list[dict[str, Any]] | None = None  # N: each row's prompt image inputs (data/vision.py), or None
    sampling_versions: list[Sequence[int] | None] | None = None  # N: per token, the policy version (steps) that
    # drew it (an asynchronous sampler's batches); a row one version drew is a OneVersion (one int, not a list per
    # token), a partial rollout's row spanning versions a list; a row None, or the whole field None: drawn by the
    # policy the step trains from (rollout/staleness.py: age 0)
    row_prompt_ids: list[list[int]] | None = None  # N: each row's own prompt where the rows of a group were sampled
    # from different prompts (a rollout_func's prompt_ids, one per completion, as TRL trains them); None: every row's
    # prompt is its group's, prompt_ids[i // group_size]

    @property
    def num_sequences(self) -> int:
        return len(self.completion_ids)

    def prompt_of(self, i: int) -> list[int]:
        """The prompt row i continues: its own where the rows of its group differ, else its group's."""
        return self.row_prompt_ids[i] if self.row_prompt_ids is not None else self.prompt_ids[i // self.group_size]

    def model_mask(self, i: int) -> list[int]:
        """1 for each completion token of row i the model sampled, 0 for environment tokens."""
        return self.episodes[i].model_mask if self.episodes is not None else [1] * len(self.completion_ids[i])

    def model_lengths(self) -> list[int]:
        """Tokens the model sampled, per row (environment tokens not counted)."""
        return [sum(self.model_mask(i)) for i in range(self.num_sequences)]

    def rows(self, rows: list[int], group_size: int) -> "Rollout":
        """Completions ``rows`` regrouped, ``group_size`` per group (each group's prompt: its first row's)."""
        return gather_rows([(self, i) for i in rows], group_size)


def grouped_prompts(prompts_N: list[list[int]], group_size: int) -> tuple[list[list[int]], list[list[int]] | None]:
    """Every row's prompt (N) as a Rollout holds them: each group's (its first row's) and, where the rows of
    some group differ, every row's (``row_prompt_ids``); None when each group's rows share theirs."""
    apart = any(prompts_N[i] != prompts_N[i - i % group_size] for i in range(len(prompts_N)))
    return [list(p) for p in prompts_N[::group_size]], [list(p) for p in prompts_N] if apart else None


def gather_rows(sources: list[tuple["Rollout", int]], group_size: int) -> Rollout:
    """A Rollout whose completion k is row ``sources[k][1]`` of rollout ``sources[k][0]`` (every
    per-row field travels together, the episode records included). Its prompts come from the rows too
    (``grouped_prompts``): each group's is its first row's, and ``row_prompt_ids`` is kept only while the rows
    of some new group still differ."""
    eps = [ro.episodes[i] if ro.episodes is not None else None for ro, i in sources]
    if any(e is not None for e in eps):  # a mixed batch: plain rows become one-turn episodes
        eps = [e if e is not None else Episode.single(len(ro.completion_ids[i])) for e, (ro, i) in zip(eps, sources)]
    vision = [ro.vision[i] for ro, i in sources] if sources and sources[0][0].vision is not None else None
    versions = [ro.sampling_versions[i] if ro.sampling_versions is not None else None for ro, i in sources]
    prompt_ids, own = grouped_prompts([ro.prompt_of(i) for ro, i in sources], group_size)
    return Rollout(
        prompt_ids,
        [ro.completion_ids[i] for ro, i in sources],
        [ro.sampling_logprobs[i] for ro, i in sources],
        [ro.finish_reasons[i] for ro, i in sources],
        group_size,
        eps if any(e is not None for e in eps) else None,
        vision,
        versions if any(v is not None for v in versions) else None,  # a refill's rows: None, the step's own policy
        own,
    )


@dataclass(frozen=True)
class ObservedPrompt:
    """An episode's prompt with its environment's reset() observation joined (rollout/episode_starts.py), as the
    reward functions and the samples get it."""

    text: str  # the text the model saw: the prompt rendered with the observation (grpokit's convention, samples)
    raw: Any  # the dataset's prompt with the observation appended to its last message's content (TRL's convention)


@dataclass
class Episode:
    """One multi-turn episode of a Rollout row (see rollout/episodes.py).

    Token-aligned with the row's ``completion_ids``: ``model_mask[t]`` is 1 when the model sampled
    token t, 0 when the environment wrote it; ``turn_ids[t]`` is the model turn (0, 1, ...) token t
    belongs to (environment tokens carry the turn they answer). ``state_keys[k]`` identifies the
    state the model acted from at turn k (equal keys = identical states, GiGPO's anchor states).
    """

    model_mask: list[int]
    turn_ids: list[int]
    state_keys: list[str] = field(default_factory=list)
    messages: list[dict[str, Any]] = field(default_factory=list)  # the conversation after the prompt (TRL form)
    tool_calls: int = 0
    tool_errors: int = 0
    environment: Any = None  # the environment instance of this episode (environment_factory), or None
    tool_timeouts: int = 0  # calls of tool_errors that ran past env.tool_timeout_s
    reset_failed: bool = (
        False  # reset() raised or ran past env.reset_timeout_s: the episode started from the bare prompt
    )
    tool_results_truncated: int = 0  # tool results cut at env.max_tool_output_chars
    observation_truncated: bool = False  # its reset() observation was cut at env.max_observation_chars
    observed: ObservedPrompt | None = None  # its prompt with its reset() observation; None: it started from the
    # bare prompt (no environment, no observation, or a reset that failed)

    @property
    def turns(self) -> int:
        return max(self.turn_ids) + 1 if self.turn_ids else 1

    @property
    def env_tokens(self) -> int:
        return len(self.model_mask) - sum(self.model_mask)

    @classmethod
    def single(cls, n_tokens: int) -> "Episode":
        return cls([1] * n_tokens, [0] * n_tokens)


@dataclass
class TokenBatch:
    """Prompt + completion tokens of N sequences as tensors, ready for a forward pass.

    Prompts are left-padded to a common width, completions right-padded to width T, so completion
    token t of every row sits at column ``prompt_width + t``. A row's real completion tokens are the
    attention mask's 1s after the prompt; ``completion_mask`` is the subset the loss trains on.
    """

    input_ids: torch.Tensor  # (N, Lp + T)
    attention_mask: torch.Tensor  # (N, Lp + T)
    position_ids: torch.Tensor  # (N, Lp + T)
    completion_ids: torch.Tensor  # (N, T)
    completion_mask: torch.Tensor  # (N, T) float, 1 on completion tokens the model sampled (the loss's tokens);
    # 0 on padding and on environment tokens of multi-turn episodes (those are in the context, not in the loss)
    vision: list[dict[str, Any]] | None = None  # N: each row's image inputs (prompt images), or None

    def rows(self, idx: slice) -> "TokenBatch":
        return TokenBatch(
            *(
                t[idx]
                for t in (
                    self.input_ids,
                    self.attention_mask,
                    self.position_ids,
                    self.completion_ids,
                    self.completion_mask,
                )
            ),
            vision=self.vision[idx] if self.vision is not None else None,
        )

    @property
    def width(self) -> int:
        return self.completion_ids.shape[1]


@dataclass
class ScoredBatch:
    """P groups of G completions with their rewards; rows p*G .. p*G+G-1 belong to prompt p."""

    prompts: list[Prompt]
    rollout: Rollout
    texts: list[str]
    rewards_NF: torch.Tensor  # (N, F) per function, NaN = not applicable
    total_N: torch.Tensor  # (N,) weighted sum
    names: list[str]
    metrics: dict[str, float] = field(default_factory=dict)
    extra: dict[str, list] = field(default_factory=dict)  # reward functions' log_extra columns, one entry per row
    failed_NF: torch.Tensor | None = None  # (N, F) bool: that function failed on that row (None: unknown, none)

    @property
    def group_size(self) -> int:
        return self.rollout.group_size

    @property
    def scored_N(self) -> torch.Tensor:
        """Boolean ``(N,)``: the completions at least one reward function scored. False marks an unscorable
        completion (every function returned None): its ``total_N`` is 0, the sum of nothing, but the advantage
        stage leaves it out of every statistic and gives it advantage 0 (algo/pipeline.py)."""
        if self.rewards_NF.dim() != 2 or self.rewards_NF.shape[1] == 0:  # no reward function: nothing to miss
            return torch.ones(self.total_N.shape[0], dtype=torch.bool)
        return ~self.rewards_NF.isnan().all(dim=1)

    def judged(self, columns: list[int] | None) -> tuple[torch.Tensor, torch.Tensor]:
        """What says whether each completion is right (reward.judge): the sum of the ``columns`` of rewards_NF
        (the judge's functions' own values, unweighted; one that gave no value adds nothing) and whether any of
        them scored the row; None: ``total_N`` and ``scored_N``, the reward as trained. Two ``(N,)`` tensors,
        read alike by dynamic sampling, the frontier curriculum and EDGE-GRPO's error correction."""
        if columns is None:
            return self.total_N, self.scored_N
        cols = self.rewards_NF[:, columns]  # (N, J), NaN where a function gave no value
        return cols.nansum(dim=1), ~cols.isnan().all(dim=1)


def repeat_columns(prompts: list[Prompt], group_size: int = 1) -> dict[str, list[Any]]:
    """The dataset's extra columns, one entry per completion (each prompt's value repeated G times):
    what reward functions receive as keyword arguments."""
    if not prompts:
        return {}
    keys = dict.fromkeys(k for p in prompts for k in p.columns)  # every prompt's (domains differ in columns)
    return {k: [p.columns.get(k) for p in prompts for _ in range(group_size)] for k in keys}
