"""The colocated vLLM backend without vLLM: a fake engine records the sleep / wake / weight-sync calls
and returns vLLM-shaped outputs, which must become grpokit Rollouts; the trainer then applies TIS.
(The server backend is tested against a fake HTTP server in test_vllm_server.py.)"""

import types

import pytest
import torch

from grpokit.config import ConfigError
from grpokit.rollout.hf import SamplingParams
from grpokit.rollout.vllm import VLLMColocated, finish_reason, policy_weights, to_rollout
from helpers.runs import make


def completion(index, ids, logps, reason, stop_reason=None):
    steps = [{t: types.SimpleNamespace(logprob=lp)} for t, lp in zip(ids, logps)]
    return types.SimpleNamespace(
        index=index, token_ids=ids, logprobs=steps, finish_reason=reason, stop_reason=stop_reason
    )


class FakeLLM:
    """Records calls; each prompt gets G completions [prompt[0], g+3, 1] (1 = eos), logprob -0.5 each."""

    def __init__(self):
        self.calls, self.loaded = [], None

    def generate(self, prompts, sp, use_tqdm=False):
        self.calls.append(("generate", sp.n))
        outs = []
        for p in prompts:
            ids = p["prompt_token_ids"]
            samples = [
                completion(g, [ids[0] % 20 + 3, g + 3, 1], [-0.5, -0.5, -0.5], "stop") for g in reversed(range(sp.n))
            ]
            outs.append(types.SimpleNamespace(outputs=samples))
        return outs

    def sleep(self, level):
        self.calls.append(("sleep", level))

    def wake_up(self, tags=None):
        self.calls.append(("wake_up", tuple(tags or ())))

    def apply_model(self, fn):
        model = types.SimpleNamespace(load_weights=lambda items: setattr(self, "loaded", dict(items)))
        self.calls.append(("apply_model",))
        return fn(model)

    def reset_prefix_cache(self):
        self.calls.append(("reset_prefix_cache",))


class FakeSP:
    def __init__(self, **kw):
        self.__dict__.update(kw)


def test_finish_reasons_map_to_grpokit():
    assert finish_reason("length", None) == "length"
    assert finish_reason("stop", None) == "eos"  # vLLM: stopped on the EOS token
    assert finish_reason("stop", "</answer>") == "stop"  # a stop string
    assert finish_reason("stop", 7) == "eos"  # a stop token id
    # an aborted request or none given did not end by itself: cut, as a completion without EOS last in TRL
    assert finish_reason("abort", None) == "length" and finish_reason(None, None) == "length"


def test_outputs_become_a_rollout_in_sample_order():
    outs = [
        types.SimpleNamespace(
            outputs=[completion(1, [5, 6], [-1.0, -2.0], "length"), completion(0, [7, 1], [-0.1, -0.2], "stop")]
        )
    ]
    ro = to_rollout(outs, [[3, 4]], 2)
    assert ro.completion_ids == [[7, 1], [5, 6]]  # sorted by sample index
    assert ro.sampling_logprobs == [[-0.1, -0.2], [-1.0, -2.0]]
    assert ro.finish_reasons == ["eos", "length"] and ro.prompt_ids == [[3, 4]]


def test_colocated_engine_sleeps_for_the_update_and_syncs_weights(tiny_model):
    llm = FakeLLM()
    eng = VLLMColocated(llm, FakeSP, SamplingParams(max_new_tokens=3), sleep=True)
    ro = eng.generate([[3, 4], [5]], 2)
    assert ro.num_sequences == 4 and ro.finish_reasons == ["eos"] * 4
    assert llm.calls == [("generate", 2), ("sleep", 2)]
    m = eng.after_update(tiny_model, 1)
    assert llm.calls[2:] == [
        ("wake_up", ("weights",)),
        ("apply_model",),
        ("wake_up", ("kv_cache",)),
        ("reset_prefix_cache",),
    ]
    assert m == {"rollout/weight_sync_step": 1.0}
    assert set(llm.loaded) == set(tiny_model.state_dict())
    assert torch.equal(llm.loaded["lm_head.weight"], tiny_model.lm_head.weight)


def test_lora_policy_is_sent_merged_under_base_names(tiny_model):
    from peft import LoraConfig, get_peft_model

    base_names = set(tiny_model.state_dict())
    x = torch.tensor([[3, 4, 5]])
    peft_model = get_peft_model(tiny_model, LoraConfig(r=2, lora_alpha=4, target_modules="all-linear"))
    with torch.no_grad():
        for n, p in peft_model.named_parameters():
            if "lora_B" in n:
                p.fill_(0.1)
        expected = peft_model(input_ids=x).logits
    weights = policy_weights(peft_model)
    assert set(weights) == base_names
    from helpers.models import tiny_llama

    plain = tiny_llama()
    plain.load_state_dict(weights)
    with torch.no_grad():
        assert torch.allclose(plain(input_ids=x).logits, expected, atol=1e-5)
    assert any(p.abs().sum() > 0 for n, p in peft_model.named_parameters() if "lora_B" in n)  # untouched


def test_vllm_on_cpu_is_one_clear_sentence(tiny_model_dir, tmp_path):
    with pytest.raises(ConfigError, match="rollout.backend=vllm needs a CUDA GPU"):
        make(tiny_model_dir, tmp_path / "v", **{"rollout.backend": "vllm"})


def test_trainer_with_a_fake_colocated_engine_applies_tis(tiny_model_dir, tmp_path):
    tr = make(tiny_model_dir, tmp_path / "run", **{"train.steps": 1, "rollout.tis_cap": 2.0})
    llm = FakeLLM()
    tr.use_engine(VLLMColocated(llm, FakeSP, tr.params, sleep=True))
    tr.cfg.rollout.backend = "vllm"  # as if built on a GPU
    m = tr.train_step()
    for key in ("tis/logp_abs_diff_mean", "tis/ratio_max", "tis/capped_fraction", "rollout/weight_sync_step"):
        assert key in m, key
    assert m["tis/logp_abs_diff_mean"] > 0  # the fake's -0.5 is not the tiny model's logprob
    assert [c[0] for c in llm.calls] == ["generate", "sleep", "wake_up", "apply_model", "wake_up", "reset_prefix_cache"]
    assert torch.equal(llm.loaded["lm_head.weight"], tr.model.lm_head.weight)  # the engine holds the updated policy


def test_dynamic_sampling_rounds_all_sample_before_the_engine_sleeps(tiny_model_dir, tmp_path):
    # a group's G completions are one text, so every group is flat and DAPO samples again, up to
    # max_sampling_rounds; the engine used to sleep (level 2: weights dropped) after round 1, so
    # rounds 2 and 3 sampled from an engine without weights
    class SameLLM(FakeLLM):
        def generate(self, prompts, sp, use_tqdm=False):
            outs = super().generate(prompts, sp, use_tqdm)
            for o in outs:
                o.outputs = [completion(s.index, o.outputs[-1].token_ids, [-0.5] * 3, "stop") for s in o.outputs]
            return outs

    tr = make(
        tiny_model_dir,
        tmp_path / "run",
        **{"train.steps": 1, "algo.dynamic_sampling": True, "algo.max_sampling_rounds": 3},
    )
    llm = SameLLM()
    tr.use_engine(VLLMColocated(llm, FakeSP, tr.params, sleep=True))
    tr.cfg.rollout.backend = "vllm"
    tr.train_step()
    kinds = [c[0] for c in llm.calls]
    # 3 rounds and no more: every round was flat, so the step trains on the last one (rollout/collect.py never
    # samples past algo.max_sampling_rounds); then the engine sleeps and takes the new weights
    assert kinds == ["generate"] * 3 + ["sleep", "wake_up", "apply_model", "wake_up", "reset_prefix_cache"]


@pytest.mark.parametrize(
    "field, value, backend, was",
    [
        ("vllm_gpu_memory_utilization", 0.5, "vllm", "0.3"),
        ("vllm_sleep", False, "vllm", "True"),
        ("vllm_url", "http://10.0.0.7:8000", "vllm_server", "'http://127.0.0.1:8000'"),
        ("vllm_request_timeout", 60.0, "vllm_server", "3600.0"),
    ],
)
def test_a_vllm_setting_the_hf_engines_never_read_is_refused_naming_the_backend_that_does(field, value, backend, was):
    """Set without rollout.backend, a vLLM setting would leave the run on the hf engines with exit 0."""
    from helpers.config_errors import section_error

    assert section_error(rollout={field: value}) == (
        f"rollout.{field}={value!r} has no effect with rollout.backend=hf; set rollout.backend={backend} (which "
        f"reads it), or leave it {was}"
    )
