"""No tensor of a training step is left in a reference cycle: such a tensor lives until Python's cycle collector runs,
not until its last use. The static decoder's KV cache did (decoder -> its CUDA graphs -> the decoder's bound forward ->
decoder, rollout/step_graphs.py): on an H200 it held 3.8 GB of the 0.5B workload into the update on alternate steps
(bench/RESULTS.md, 2026-11-30). The run's steps go with the collector off; what it then finds in cycles is named."""

from __future__ import annotations

import gc

import pytest
import torch

from helpers.runs import make


@pytest.mark.parametrize(
    "over",
    [
        {},
        {"algo.beta": 0.04, "rollout.engine": "dynamic"},
        {"rollout.async_staleness": 1, "model.cpu_matmul": "onednn"},
    ],
    ids=["static", "dynamic+kl", "async snapshots"],  # a snapshot a step, oneDNN's forwards bound to its linears
)
def test_a_steps_tensors_are_freed_by_reference_counting_alone(tiny_model_dir, tmp_path, over):
    tr = make(tiny_model_dir, tmp_path / "run", **{"train.steps": 2, "data.eval_size": 0, **over})
    gc.collect()
    gc.disable()
    try:
        tr.train()
        gc.set_debug(gc.DEBUG_SAVEALL)
        gc.collect()
        cyclic = [o for o in gc.garbage if isinstance(o, torch.Tensor)]
        holders = sorted({type(o).__name__ for o in gc.garbage if not isinstance(o, (dict, tuple, list))})
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        gc.enable()
    assert not cyclic, f"{len(cyclic)} tensors in reference cycles with {holders}"


def test_a_weakly_bound_forward_computes_as_the_method_and_copies_with_its_module():
    import copy

    from grpokit.nn.models import WeakBound, unbind_cycles

    lin = torch.nn.Linear(3, 2)
    lin.forward = (lambda self, x: torch.nn.functional.linear(x, self.weight) * 2).__get__(lin)
    x = torch.ones(1, 3)
    want = lin(x)
    assert unbind_cycles(lin) == 1 and isinstance(vars(lin)["forward"], WeakBound)
    assert torch.equal(lin(x), want)
    twin = copy.deepcopy(lin)
    twin.weight.data.zero_()
    assert vars(twin)["forward"]._module() is twin and torch.equal(twin(x), torch.zeros(1, 2))
    assert torch.equal(lin(x), want)
