"""GPU memory metrics (with a fake provider, on CPU) and the automatic memory plan (hand-worked)."""

from __future__ import annotations

import pytest

from grpokit.train.memory import GB, MemoryProvider, plan_memory
from grpokit.train.timer import Timer


class FakeCuda:
    """A caching allocator we drive by hand: ``use(n)`` allocates n bytes, ``free(n)`` releases them."""

    def __init__(self):
        self.allocated, self.peak, self.reserved = 0, 0, 0

    def use(self, n):
        self.allocated += n
        self.peak, self.reserved = max(self.peak, self.allocated), max(self.reserved, self.allocated)

    def free(self, n):
        self.allocated -= n

    def provider(self):
        return MemoryProvider(lambda: (self.allocated, self.reserved, self.peak), self._reset)

    def _reset(self):
        self.peak = self.allocated


def test_peaks_per_phase_nested_and_repeated():
    cuda = FakeCuda()
    cuda.use(1 * GB)  # the weights
    timer = Timer(cuda.provider())
    with timer("rollout"):
        cuda.use(3 * GB)
        cuda.free(3 * GB)
    with timer("update"):
        cuda.use(2 * GB)
        with timer("logprobs"):  # nested: its 5 GB peak also counts for "update"
            cuda.use(2 * GB)
            cuda.free(2 * GB)
        cuda.free(2 * GB)
    with timer("rollout"):  # repeated: the larger peak stays
        cuda.use(1 * GB)
        cuda.free(1 * GB)
    m = timer.metrics()
    assert m["gpu/rollout/memory_peak_gb"] == 4.0  # 1 weights + 3
    assert m["gpu/update/memory_peak_gb"] == 5.0 and m["gpu/logprobs/memory_peak_gb"] == 5.0
    assert m["gpu/memory_peak_gb"] == 5.0
    assert m["gpu/memory_allocated_gb"] == 1.0 and m["gpu/memory_reserved_gb"] == 5.0
    assert "time/rollout" in m


def test_the_process_peak_survives_the_per_phase_resets(monkeypatch):
    # CUDA's allocator, faked: grpokit's provider resets the peak at each phase boundary, which hid a
    # 20.2 GB update from a reader of max_memory_allocated() after the step (4.45 GB: the last phase)
    import torch

    import grpokit.train.memory as memory

    allocator = {"peak": 0}
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda device=None: allocator["peak"])
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda device=None: allocator.update(peak=0))
    monkeypatch.setattr(memory, "_PEAKS_BEFORE_RESET", {})
    provider = memory.cuda_provider(torch.device("cuda"))
    for phase_peak in (9 * GB, 20 * GB, 4 * GB):  # rollout, update, rewards
        allocator["peak"] = phase_peak
        provider.reset_peak()
    allocator["peak"] = 3 * GB
    assert torch.cuda.max_memory_allocated() == 3 * GB
    assert memory.peak_allocated_bytes("cuda") == 20 * GB
    assert memory.peak_allocated_bytes("cpu") == 0


def test_no_provider_no_gpu_metrics():
    with Timer()("update"):
        pass
    assert not [k for k in Timer().metrics() if k.startswith("gpu/")]


def test_plan_hand_worked():
    # 8 rows x 100 tokens x 1 MB = 800 MB > 512 MB budget -> checkpointing; 8 x 100 x 0.1 MB = 80 MB after
    p = plan_memory(
        per_token_bytes=2**20,
        checkpointed_token_bytes=2**20 // 10,
        budget_mb=512,
        rows=8,
        max_len=100,
        param_bytes=GB,
        trainable_bytes=GB,
        reference_copy=True,
        device_bytes=80 * GB,
    )
    assert p.checkpointing and not p.offload_reference  # state 1 + 3 x 1 = 4 GB + 1 GB ref, far under 40 GB
    assert "activation checkpointing on (8 rows x 100 tokens" in p.line()
    # 7B-shaped in bf16: 14 GB weights, state 14 + 3 x 14 = 56 GB + 14 GB reference > 40 GB
    p = plan_memory(
        per_token_bytes=2**20,
        checkpointed_token_bytes=1,
        budget_mb=512,
        rows=4,
        max_len=100,
        param_bytes=14 * GB,
        trainable_bytes=14 * GB,
        reference_copy=True,
        device_bytes=80 * GB,
    )
    assert not p.checkpointing and p.offload_reference and "reference model on CPU" in p.line()
    assert (
        plan_memory(
            per_token_bytes=2**20,
            checkpointed_token_bytes=1,
            budget_mb=0,
            rows=4,
            max_len=100,
            param_bytes=1,
            trainable_bytes=1,
            reference_copy=False,
            device_bytes=0,
        ).line()
        == "grpokit: memory: nothing to change"
    )


def test_trainer_turns_checkpointing_on_when_the_budget_is_exceeded(tiny_model_dir, tmp_path, capsys):
    from helpers.runs import make

    # tiny Llama: (10 x 32 + 4 x 64) values x 2 layers x 4 B = 4.5 KiB a token, so 1 MB holds 227 tokens;
    # 8 rows x (2 prompt tokens + 40 new) = 336 > 227 -> checkpointing
    big = {"train.activation_memory_mb": 1, "rollout.max_new_tokens": 40, "train.prompts_per_step": 2}
    tr = make(tiny_model_dir, tmp_path / "a", **big, **{"algo.beta": 0.04, "train.steps": 1})
    assert tr.memory_plan.checkpointing and "activation checkpointing on" in capsys.readouterr().out
    assert getattr(tr.model, "is_gradient_checkpointing", False)
    m = tr.train_step()  # still trains (and the reference pass runs)
    assert m["loss"] == m["loss"] and not [k for k in m if k.startswith("gpu/")]  # no GPU: no memory metrics
    tr = make(tiny_model_dir, tmp_path / "b", **big, **{"train.memory_plan": "manual"})
    assert not tr.memory_plan.checkpointing and "memory" not in capsys.readouterr().out


def test_offloaded_reference_moves_in_for_its_pass_and_back_out_even_on_error():
    import torch

    from grpokit.train.reference import reference_logprobs

    class Ref(torch.nn.Linear):
        def to(self, *a, **kw):
            moves.append(str(a[0]))
            return self

    moves, ref = [], Ref(2, 2)
    ref.grpokit_offloaded = True
    batch = type("B", (), {"input_ids": torch.zeros(1, 3, dtype=torch.long, device="meta")})()
    out = reference_logprobs(None, ref, batch, lambda m, b: (moves.append("pass") or torch.ones(1), None))
    assert moves == ["meta", "pass", "cpu"] and out.tolist() == [1.0]  # in to the batch's device, pass, out to CPU
    moves.clear()
    with pytest.raises(RuntimeError):
        reference_logprobs(None, ref, batch, lambda m, b: (_ for _ in ()).throw(RuntimeError("oom")))
    assert moves == ["meta", "cpu"]
    moves.clear()
    ref.grpokit_offloaded = False
    reference_logprobs(None, ref, batch, lambda m, b: (torch.ones(1), None))
    assert moves == []  # kept where it is


def test_trainer_applies_a_reference_offload_plan_with_its_log_line(tiny_model_dir, tmp_path, capsys, monkeypatch):
    import grpokit.train.memory as M
    from helpers.runs import make

    # a GPU plan on CPU: the planner (hand-worked above) says "offload"; the trainer must act on it
    seen = {}

    def plan(**kw):
        seen.update(kw)
        return M.MemoryPlan(False, kw["reference_copy"], ["reference model on CPU between its passes (test)"])

    monkeypatch.setattr(M, "plan_memory", plan)
    tr = make(tiny_model_dir, tmp_path / "a", **{"algo.beta": 0.04, "train.steps": 1})
    assert seen["reference_copy"] and tr.ref_model.grpokit_offloaded
    assert "grpokit: memory: reference model on CPU between its passes (test)" in capsys.readouterr().out
    m = tr.train_step()
    assert m["kl"] == m["kl"] and next(tr.ref_model.parameters()).device.type == "cpu"
    tr = make(tiny_model_dir, tmp_path / "b", **{"algo.beta": 0.0, "train.steps": 1})
    assert not seen["reference_copy"] and tr.ref_model is None  # beta = 0: no reference to offload


def test_smollm2_on_a_24_gb_machine_keeps_its_activations():
    # SmolLM2-135M (hidden 576, intermediate 1536, 30 layers, float32) keeps (10 x 576 + 4 x 1536) x 30 x 4 B
    # = 1,428,480 B a token; 32 rows x 100 tokens = 4.26 GB. A fixed 512 MB budget would turn checkpointing on
    # on a machine with 24 GB free; a quarter of the free memory (6 GB) keeps the activations,
    # a quarter of 8 GB free (2 GB) does not.
    from types import SimpleNamespace

    from grpokit.train.token_budget import per_token_bytes

    shape = SimpleNamespace(hidden_size=576, intermediate_size=1536, num_hidden_layers=30)
    per_token = per_token_bytes(shape, 4)
    assert per_token == 1_428_480
    plan = lambda free_gb: plan_memory(
        per_token_bytes=per_token,
        checkpointed_token_bytes=per_token_bytes(shape, 4, True),
        budget_mb=free_gb * 1024 // 4,
        rows=32,
        max_len=100,
        param_bytes=GB // 2,
        trainable_bytes=GB // 2,
        reference_copy=False,
        device_bytes=0,
    )
    assert not plan(24).checkpointing and plan(24).line() == "grpokit: memory: nothing to change"
    assert plan(8).checkpointing and "~4.3 GB of activations, over the 2.0 GB budget" in plan(8).line()
