"""The RolloutEngine protocol: every engine implements all of it, the hf one included, and the
trainer holds an engine from the start (no None, no asking which engine it is)."""

import torch

from grpokit.config import Config
from grpokit.config.io import apply_overrides
from grpokit.rollout.async_ import AsyncRollout
from grpokit.rollout.engine import HFEngine, RolloutEngine
from grpokit.rollout.hf import SamplingParams, generate
from grpokit.rollout.vllm import VLLMColocated
from grpokit.rollout.vllm_client import VLLMServer
from grpokit.rollout.vllm_tp import TensorParallelEngine
from grpokit.train import Trainer

PROTOCOL = ["prefetched", "turn_sampler", "finish_sampling", "sleep_for_update", "after_update", "close"]


def test_every_engine_class_defines_the_whole_protocol():
    for cls in (HFEngine, VLLMColocated, TensorParallelEngine, VLLMServer, AsyncRollout):
        missing = [name for name in PROTOCOL if not callable(getattr(cls, name, None))]
        assert not missing, (cls.__name__, missing)
        assert isinstance(cls.__new__(cls), RolloutEngine), cls.__name__


def test_hf_engine_samples_what_generate_samples(tiny_model):
    params = SamplingParams(max_new_tokens=4)
    eng = HFEngine(eos_token_ids={2}, pad_token_id=0, decode=str, generator=torch.Generator().manual_seed(7))
    ro = eng.turn_sampler(tiny_model)([[3, 4], [5]], 2, params)
    want = generate(
        tiny_model,
        [[3, 4], [5]],
        2,
        params,
        eos_token_ids={2},
        pad_token_id=0,
        generator=torch.Generator().manual_seed(7),
        decode=str,
    )
    assert ro.completion_ids == want.completion_ids and ro.sampling_logprobs == want.sampling_logprobs
    own = torch.Generator().manual_seed(7)  # a caller's generator (the async thread) is used instead of the trainer's
    again = eng.turn_sampler(tiny_model, own)([[3, 4], [5]], 2, params)
    assert again.completion_ids == want.completion_ids
    assert eng.prefetched(2, 2) is None and eng.after_update(tiny_model, 1) == {}


def test_cuda_graphs_follow_the_setting_whoever_brings_the_generator(tiny_model, monkeypatch):
    """The async sampler's thread brings its own generator and still asks for CUDA graphs: rollout/static.py
    captures on any thread (thread_local mode, on the thread's own stream). Only rollout.cuda_graphs turns
    them off."""
    from grpokit.rollout import engine as engine_module

    asked = []
    monkeypatch.setattr(engine_module, "generate", lambda *a, cuda_graphs, **kw: asked.append(cuda_graphs))
    params = SamplingParams(max_new_tokens=2)
    for graphs in (True, False):
        eng = HFEngine(eos_token_ids={2}, pad_token_id=0, decode=str, generator=torch.Generator(), cuda_graphs=graphs)
        eng.turn_sampler(tiny_model)([[3]], 1, params)
        eng.turn_sampler(tiny_model, torch.Generator().manual_seed(1))([[3]], 1, params)
    assert asked == [True, True, False, False]


class _Recording(HFEngine):
    def __init__(self, inner: HFEngine):
        self.__dict__.update(inner.__dict__)
        self.calls: list[str] = []

    def sleep_for_update(self) -> None:
        self.calls.append("sleep_for_update")

    def finish_sampling(self) -> None:
        self.calls.append("finish_sampling")

    def after_update(self, model, step: int) -> dict[str, float]:
        self.calls.append(f"after_update {step}")
        return {}

    def close(self) -> None:
        self.calls.append("close")


def _trainer(model_dir, out) -> Trainer:
    cfg = apply_overrides(
        Config(),
        [
            f"model.name_or_path={model_dir}",
            "data.task=",
            "reward.functions=[]",
            "rollout.group_size=2",
            "rollout.max_new_tokens=3",
            "train.prompts_per_step=2",
            "train.steps=1",
            f"train.out={out}",
            "record.sinks=[]",
            "record.report=false",
            "train.threads=1",
        ],
    )
    rows = [{"prompt": p, "answer": "a"} for p in ("ab", "cd", "ef", "gh")]
    return Trainer(
        cfg,
        reward_funcs=[lambda prompts, completions, **kw: [float("a" in c) for c in completions]],
        train_rows=rows,
        eval_rows=[],
        quiet=True,
    )


def test_the_loop_calls_the_protocol_in_step_order(tiny_model_dir, tmp_path):
    tr = _trainer(tiny_model_dir, tmp_path / "run")
    assert isinstance(tr.engine, HFEngine)  # rollout.backend=hf: an engine like any other
    old, eng = tr.engine, _Recording(tr.engine)
    old_calls: list[str] = []
    old.close = lambda: old_calls.append("close")
    tr.use_engine(eng)
    assert old_calls == ["close"] and tr.engine is eng
    tr.train_step()
    assert eng.calls == ["finish_sampling", "sleep_for_update", "after_update 1"]
