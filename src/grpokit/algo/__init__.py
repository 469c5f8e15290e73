"""Stages 4-5, the math: group-relative advantages, step-level credit, objectives, KL, token masks
and the named variants. Pure tensor functions: no config objects, no I/O."""

from .registry import (  # noqa: F401  (the plugin API)
    ObjectiveSpec,
    StageSpec,
    register_advantage,
    register_objective,
    register_token_mask,
)
