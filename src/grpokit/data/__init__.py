"""Stage 1, prompts: rows from a dataset (``prompts.py``: local JSONL/Parquet/CSV or the hub, column
mapping, chat template; ``prompt_sampler.py`` the seeded batches) or from a built-in verifiable task (``tasks/``)."""

from grpokit.data.observations import with_observation
from grpokit.data.prompt_sampler import PromptSampler
from grpokit.data.prompts import (
    FILE_BUILDERS,
    load_rows,
    rename_columns,
    render_prompt,
    to_prompts,
)
from grpokit.types import repeat_columns

__all__ = [
    "FILE_BUILDERS",
    "PromptSampler",
    "load_rows",
    "rename_columns",
    "render_prompt",
    "repeat_columns",
    "to_prompts",
    "with_observation",
]
