"""rollout/step_graphs.py CAPTURE_GUARD: the update's forwards and backwards run under the lock every CUDA graph
capture takes, so no draw from the default generator (dropout, NEFTune) meets a sampler thread's capture; sampling's
and pi_old's forwards do not hold it (an H200 run failed with "Offset increment outside graph capture encountered
unexpectedly" without it: tests/project/test_gpu.py)."""

from __future__ import annotations

import torch

from grpokit.rollout.step_graphs import CAPTURE_GUARD
from helpers.runs import make


def test_the_updates_forwards_hold_the_capture_guard_and_sampling_does_not(tiny_model_dir, tmp_path):
    tr = make(tiny_model_dir, tmp_path / "run", **{"train.steps": 1, "data.eval_size": 0, "algo.beta": 0.0})
    seen = []
    tr.model.get_input_embeddings().register_forward_hook(
        lambda m, a, out: seen.append((torch.is_grad_enabled(), CAPTURE_GUARD._is_owned()))
    )
    tr.train()
    with_grad = {locked for grad, locked in seen if grad}
    without = {locked for grad, locked in seen if not grad}
    assert with_grad == {True} and without == {False}
    assert not CAPTURE_GUARD._is_owned()
