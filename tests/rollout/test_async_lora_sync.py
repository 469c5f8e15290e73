"""Adapter-only sync for the own engines: the async sampler's snapshot of a LoRA policy shares the frozen
base and copies only the adapters (nn/models.py sampling_snapshot), and samples what a full copy samples."""

import json

import pytest
import torch

from grpokit.nn.models import frozen_copy, sampling_snapshot
from grpokit.rollout.hf import SamplingParams, generate
from helpers.models import tiny_qwen2
from helpers.runs import make

pytest.importorskip("peft")


def _lora(seed: int = 2):
    from grpokit.config.sections import ModelConfig
    from grpokit.train.lora import add_adapters

    model = add_adapters(tiny_qwen2(seed=seed), ModelConfig(lora_rank=4))
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():  # B non-zero, so the adapters change the policy
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=g) * 0.5)
    return model


def _sample(model):
    g = torch.Generator().manual_seed(0)
    ro = generate(
        model,
        [[1, 5, 6, 7], [1, 9]],
        3,
        SamplingParams(max_new_tokens=8),
        eos_token_ids={2},
        pad_token_id=0,
        generator=g,
    )
    return ro.completion_ids, ro.sampling_logprobs


def _bytes(tensors):
    return sum(t.numel() * t.element_size() for t in tensors)


def test_a_lora_snapshot_copies_only_the_adapters_and_samples_what_a_full_copy_samples():
    live = _lora()
    snap, moved = sampling_snapshot(live)
    adapters = [p for p in live.parameters() if p.requires_grad]
    assert adapters and moved == _bytes(adapters) + _bytes(live.buffers())
    assert moved < _bytes(live.parameters()) / 4  # the tiny base is most of the bytes
    base = dict(live.named_parameters())
    for name, p in snap.named_parameters():  # the frozen base is shared, the adapters are the snapshot's own
        assert (p.data_ptr() == base[name].data_ptr()) == (not base[name].requires_grad), name
        assert not p.requires_grad
    before = _sample(snap)
    assert before == _sample(frozen_copy(live))  # the same samples as the full-weight sync, same seed
    with torch.no_grad():  # an update of the live adapters (what the optimizer does)
        for p in adapters:
            p.add_(0.3)
    assert _sample(snap) == before  # the snapshot keeps the weights it was taken with
    after = _sample(sampling_snapshot(live)[0])
    assert after == _sample(frozen_copy(live)) and after != before


def test_a_fully_trained_model_is_copied_whole():
    live = tiny_qwen2()
    snap, moved = sampling_snapshot(live)
    assert moved == _bytes(live.parameters()) + _bytes(live.buffers())
    assert all(p.data_ptr() != q.data_ptr() for p, q in zip(snap.parameters(), live.parameters()))


def test_an_async_lora_run_logs_the_bytes_of_each_sync(tiny_model_dir, tmp_path):
    tr = make(
        tiny_model_dir,
        tmp_path / "run",
        **{"rollout.async_staleness": 1, "train.steps": 2, "data.eval_size": 0, "model.lora_rank": 4},
    )
    tr.train()
    adapters = _bytes(p for p in tr.model.parameters() if p.requires_grad) + _bytes(tr.model.buffers())
    steps = [json.loads(l) for l in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines() if '"reward"' in l]
    assert [s["rollout/weight_sync_bytes"] for s in steps] == [adapters, adapters]
    assert adapters < _bytes(tr.model.parameters()) / 2
