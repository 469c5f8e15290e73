"""grpokit.trl's GRPOConfig: TRL 1.16's names and defaults (TRL is the oracle), refusals in one
sentence, the mapping onto Config worked out by hand, and docs/TRL.md generated from it."""

from __future__ import annotations

import dataclasses
import importlib.util
import re
import sys
from pathlib import Path

import pytest

from grpokit.config import Config, ConfigError
from grpokit.trl.config import SUPPORTED, UNSUPPORTED, GRPOConfig
from grpokit.trl.mapping import to_config
from grpokit.validation import validate
from helpers.paths import ROOT


def _trl_fields() -> dict:
    trl = pytest.importorskip("trl")
    out = {}
    for f in dataclasses.fields(trl.GRPOConfig):
        if f.init:
            out[f.name] = f.default if f.default is not dataclasses.MISSING else f.default_factory()
    return out


def test_every_trl_argument_is_known_with_trls_default():
    trl = _trl_fields()
    ours = {
        f.name: f.default if f.default is not dataclasses.MISSING else f.default_factory()
        for f in dataclasses.fields(GRPOConfig)
        if f.init
    }
    assert set(ours) == set(trl)  # nothing TRL has is unknown, nothing extra is invented
    assert SUPPORTED | set(UNSUPPORTED) == set(trl) and not SUPPORTED & set(UNSUPPORTED)
    for name, value in ours.items():
        assert value == trl[name], name


def test_unsupported_or_unknown_arguments_are_refused_with_one_sentence():
    GRPOConfig(deepspeed=None, per_device_eval_batch_size=8)  # at TRL's default: accepted
    for kwargs, words in [
        ({"deepspeed": "ds.json"}, "deepspeed='ds.json'"),
        ({"delta": 0.5}, "delta=0.5"),
        ({"num_generation": 8}, "'num_generation'"),
    ]:
        with pytest.raises(ConfigError) as e:
            GRPOConfig(**kwargs)
        assert words in str(e.value) and str(e.value).count(". ") == 0
    with pytest.raises(ConfigError, match="loss_type='vespo' with beta=0.04"):
        to_config(GRPOConfig(loss_type="vespo", beta=0.04), num_rows=4)  # TRL's per-token KL weight
    with pytest.raises(ConfigError, match="vllm_importance_sampling_mode='token_clip'"):
        to_config(GRPOConfig(use_vllm=True, vllm_importance_sampling_mode="token_clip"), num_rows=4)  # not a TRL mode
    with pytest.raises(ConfigError, match="not a multiple of num_generations=3"):
        to_config(GRPOConfig(per_device_train_batch_size=4, num_generations=3), num_rows=4)


def test_mapping_worked_by_hand():
    a = GRPOConfig(
        "out",
        per_device_train_batch_size=8,
        gradient_accumulation_steps=2,
        num_generations=4,
        max_steps=10,
        num_iterations=2,
        loss_type="dr_grpo",
        scale_rewards=False,
        epsilon=0.2,
        epsilon_high=0.28,
        learning_rate=5e-6,
        lr_scheduler_type="cosine",
        warmup_steps=0.1,
        save_steps=2,
        save_total_limit=None,
        report_to=["tensorboard"],
        logging_steps=5,
        log_completions=True,
        bf16=True,
        beta=0.04,
        generation_kwargs={"stop_strings": "</answer>", "top_k": 20, "repetition_penalty": 1.1},
        disable_tqdm=False,
    )  # None would follow transformers' log level, which other tests may have raised
    c = to_config(a, num_rows=100, world_size=1)
    # 8 completions per micro-batch x 2 accumulated = 16 completions a step = 4 prompts x G=4
    assert (c.train.prompts_per_step, c.train.micro_batch_size, c.rollout.group_size) == (4, 8, 4)
    # 10 optimizer updates at mu=2 updates per sampled batch = 5 grpokit steps; warm-up 10% of 10 updates = 1
    assert (c.train.steps, c.algo.num_iterations, c.optim.warmup_steps, c.optim.schedule) == (5, 2, 1, "cosine")
    assert (c.algo.aggregation, c.algo.norm_constant, c.algo.scale) == ("seq-mean-token-sum-norm", 512.0, "none")
    assert (c.algo.clip_low, c.algo.clip_high, c.algo.beta, c.algo.kl_bias_correction) == (0.2, 0.28, 0.04, True)
    assert (c.optim.lr, c.optim.adam_beta2, c.train.seed, c.model.autocast) == (5e-6, 0.999, 42, "bfloat16")
    # save_steps=2 TRL steps = 2 // mu=2 = every grpokit step; keep them all: one per grpokit step at most, 5
    assert (c.train.save_every, c.train.keep_checkpoints, c.train.out) == (1, 5, "out")
    assert c.record.sinks == ["console", "tensorboard"] and (c.record.console_every, c.record.samples_every) == (5, 5)
    assert c.rollout.stop == ["</answer>"] and c.rollout.top_k == 20 and c.rollout.max_new_tokens == 512
    assert c.rollout.repetition_penalty == 1.1
    assert (
        to_config(GRPOConfig(repetition_penalty=1.2), num_rows=4).rollout.repetition_penalty == 1.2
    )  # TRL's own argument
    assert (c.reward.convention, c.data.chat_template, c.data.task, c.reward.functions) == (
        "trl",
        "conversational",
        "",
        [],
    )


def test_epochs_set_the_steps_when_max_steps_is_unset():
    # 3 epochs over 10 prompts at 8 completions / G=8 = 1 prompt a step: 30 steps
    assert to_config(GRPOConfig(), num_rows=10, world_size=1).train.steps == 30
    # 2 processes double the batch: 2 prompts a step, 15 steps
    c = to_config(GRPOConfig(), num_rows=10, world_size=2)
    assert (c.train.steps, c.train.prompts_per_step) == (15, 2)


def test_scale_rewards_booleans_and_loss_names():
    assert to_config(GRPOConfig(scale_rewards=True), num_rows=1).algo.scale == "group"
    assert to_config(GRPOConfig(scale_rewards="batch"), num_rows=1).algo.scale == "batch"
    for name, agg in [("grpo", "seq-mean-token-mean"), ("dapo", "token-mean"), ("bnpo", "token-mean")]:
        assert to_config(GRPOConfig(loss_type=name), num_rows=1).algo.aggregation == agg


def test_dr_grpo_divides_by_max_completion_length_whatever_generation_kwargs_sample():
    # TRL samples up to generation_kwargs' max_new_tokens (16) but divides dr_grpo's loss by
    # max_completion_length (64); the other loss types read no constant
    c = to_config(
        GRPOConfig(loss_type="dr_grpo", max_completion_length=64, generation_kwargs={"max_new_tokens": 16}), num_rows=1
    )
    assert (c.rollout.max_new_tokens, c.algo.norm_constant) == (16, 64.0)
    for name in ("grpo", "dapo", "bnpo", "luspo", "cispo", "sapo"):
        assert to_config(GRPOConfig(loss_type=name, max_completion_length=64), num_rows=1).algo.norm_constant == 0.0


def test_docs_table_is_generated_from_the_mapping():
    import transformers
    from trl_values import recorded_transformers

    if transformers.__version__ != recorded_transformers():  # the tables list this version's fields and defaults
        pytest.skip(
            f"docs/TRL.md is rendered with transformers {recorded_transformers()}, not {transformers.__version__}"
        )
    spec = importlib.util.spec_from_file_location("make_trl_docs", ROOT / "scripts" / "make_trl_docs.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["make_trl_docs"] = module
    spec.loader.exec_module(module)
    text = (ROOT / "docs" / "TRL.md").read_text()
    assert module.render(text) == text, "docs/TRL.md is stale: run PYTHONPATH=src python scripts/make_trl_docs.py"
    for name in GRPOConfig().to_dict():
        assert f"`{name}`" in text, name


def test_cispo_and_sapo_loss_types_map_onto_grpokit_objectives():
    # TRL 1.16: cispo clamps the IS weight at epsilon_high itself (5.0 -> grpokit clip_high 4.0) and
    # normalises as dapo (token-mean); sapo normalises as grpo and keeps its two gate temperatures
    cfg = to_config(GRPOConfig(loss_type="cispo", epsilon_high=5.0), num_rows=4)
    assert (cfg.algo.objective, cfg.algo.aggregation, cfg.algo.clip_high) == ("cispo", "token-mean", 4.0)
    cfg = to_config(GRPOConfig(loss_type="sapo", sapo_temperature_pos=0.5, sapo_temperature_neg=2.0), num_rows=4)
    assert (cfg.algo.objective, cfg.algo.aggregation, cfg.algo.sapo_tau_pos, cfg.algo.sapo_tau_neg) == (
        "sapo",
        "seq-mean-token-mean",
        0.5,
        2.0,
    )
    # unset, TRL's code caps the weight at epsilon (0.2): grpokit's cap 1 + clip_high = 0.2, so clip_high = -0.8
    cfg = to_config(GRPOConfig(loss_type="cispo"), num_rows=4)
    assert cfg.algo.clip_high == pytest.approx(-0.8)
    validate(cfg)  # CISPO alone may cap below 1
    with pytest.raises(ConfigError, match="algo.clip_high"):  # the clipped surrogate may not
        validate(dataclasses.replace(cfg, algo=dataclasses.replace(cfg.algo, objective="clip")))


def test_arguments_read_and_set_after_construction_behave_as_constructor_arguments():
    a = GRPOConfig("out")
    # TRL's own grpo.py reads training_args.resume_from_checkpoint: every TRL argument is readable, at TRL's default
    assert (a.resume_from_checkpoint, a.run_name, a.per_device_eval_batch_size, a.include_for_metrics) == (
        None,
        None,
        8,
        [],
    )
    a.model_init_kwargs = {"dtype": "bfloat16"}  # as TRL's grpo.py sets it after parsing
    a.scale_rewards = False  # the boolean form is normalised as in the constructor
    a.deepspeed = None  # an unsupported argument at its default is accepted
    assert to_config(a, num_rows=4).model.dtype == "bfloat16" and a.scale_rewards == "none"
    with pytest.raises(ConfigError, match=r"^GRPOConfig argument deepspeed=.ds.json. is not supported by grpokit;"):
        a.deepspeed = "ds.json"
    with pytest.raises(ConfigError, match=r"^GRPOConfig got 'learing_rate', which is not an argument"):
        a.learing_rate = 1e-3  # a misspelt name is not silently a new attribute
    assert not hasattr(a, "learing_rate") and a.deepspeed is None


def test_model_init_kwargs_as_trls_grpo_script_passes_them():
    # TRL's grpo.py: dict(revision=..., trust_remote_code=..., attn_implementation=..., dtype=...), defaults None
    kw = dict(revision=None, trust_remote_code=False, attn_implementation=None, dtype=None)
    c = to_config(GRPOConfig(model_init_kwargs=kw), num_rows=4)
    assert (c.model.dtype, c.model.trust_remote_code) == ("float32", False)  # TRL loads float32 unless told
    assert (
        to_config(GRPOConfig(), num_rows=4).model.dtype == "float32"
    )  # no model_init_kwargs: float32 too, not bf16 on GPU
    c = to_config(
        GRPOConfig(model_init_kwargs={"torch_dtype": "torch.float16", "trust_remote_code": True, "revision": "main"}),
        num_rows=4,
    )
    assert (c.model.dtype, c.model.trust_remote_code) == ("float16", True)
    assert c.model.attn_implementation == "auto"  # None: transformers' own choice
    c = to_config(GRPOConfig(model_init_kwargs={"attn_implementation": "eager", "dtype": "bfloat16"}), num_rows=4)
    assert (c.model.attn_implementation, c.model.dtype) == ("eager", "bfloat16")
    with pytest.raises(
        ConfigError,
        match=r"model_init_kwargs=\{'attn_implementation': 'flash'\} .*valid: attn_implementation eager, sdpa",
    ):
        to_config(GRPOConfig(model_init_kwargs={"attn_implementation": "flash"}), num_rows=4)
    with pytest.raises(ConfigError, match=r"model_init_kwargs=\{'device_map': 'auto'\}"):
        to_config(GRPOConfig(model_init_kwargs={"device_map": "auto"}), num_rows=4)


def test_tool_episodes_are_capped_at_max_completion_length():
    # TRL caps a tool episode's whole completion (model turns and tool results) at max_completion_length;
    # generation_kwargs' max_new_tokens changes one generation's length, not that cap
    c = to_config(GRPOConfig(max_completion_length=96, generation_kwargs={"max_new_tokens": 32}), num_rows=4)
    assert (c.rollout.max_new_tokens, c.env.max_episode_tokens) == (32, 96)


def test_a_repetition_penalty_that_is_not_positive_is_refused():
    from grpokit.validation import validate

    with pytest.raises(ConfigError, match=r"^rollout.repetition_penalty=0.0 must be > 0 \(1.0 = off\)$"):
        validate(to_config(GRPOConfig(generation_kwargs={"repetition_penalty": 0.0}), num_rows=4))


@pytest.mark.parametrize(
    "name,value",
    [
        ("learning_rate", float("inf")),
        ("reward_weights", [1.0, float("nan")]),
        ("num_generations", 0),
        ("num_generations", 1),
        ("per_device_train_batch_size", 0),
        ("top_p", 0.0),
        ("temperature", -1.0),
        ("num_iterations", 0),
        ("logging_steps", 0),
        ("max_completion_length", 0),
    ],
)
def test_a_value_no_run_can_use_is_refused_naming_the_argument(name, value):
    # each was silently accepted or ended in a Python error (num_generations=0: ZeroDivisionError) before
    with pytest.raises(ConfigError, match=rf"^GRPOConfig argument {name}=.* is not valid; use "):
        GRPOConfig("out", **{name: value})
    args = GRPOConfig("out")
    with pytest.raises(ConfigError, match=rf"^GRPOConfig argument {name}="):  # set after construction too
        setattr(args, name, value)


@pytest.mark.parametrize(
    "name,value,valid",
    [
        ("fp16", "yes", "True or False"),
        ("bf16", "yes", "None, True or False"),
        ("use_vllm", "x", "True or False"),
        ("mask_truncated_completions", 1, "True or False"),
        ("output_dir", 123, "None or a string"),
        ("run_name", 7, "None or a string"),
        ("vllm_mode", "nope", "'colocate' or 'server'"),
        ("importance_sampling_level", "word", "'token' or 'sequence'"),
        (
            "vllm_importance_sampling_mode",
            "nope",
            "one of token_truncate, token_mask, sequence_truncate, sequence_mask",
        ),
    ],
)
def test_a_value_of_the_wrong_kind_is_refused_naming_the_argument(name, value, valid):
    # each was accepted as truthy, named a grpokit field, or raised a KeyError (bf16="yes") before
    with pytest.raises(
        ConfigError, match=rf"^GRPOConfig argument {name}={value!r} is not valid; use {re.escape(valid)}$"
    ):
        GRPOConfig(**{"output_dir": "out", name: value})


def test_paths_and_enum_strings_pass_the_kind_checks():
    from transformers.trainer_utils import IntervalStrategy

    args = GRPOConfig(Path("out"), eval_strategy=IntervalStrategy.STEPS, bf16=None, run_name=None)
    assert args.eval_strategy == "steps"


def test_valid_edge_values_are_accepted():
    GRPOConfig("out", max_steps=0, learning_rate=1e-9, top_p=1.0, save_total_limit=None, reward_weights=[0.0, 2])
    GRPOConfig(
        "out", gradient_checkpointing_kwargs={"use_reentrant": False}, run_name="r1", per_device_eval_batch_size=4
    )
    with pytest.raises(
        ConfigError,
        match=r"^GRPOConfig argument gradient_checkpointing_kwargs=\{'use_reentrant': True\} is not supported",
    ):
        to_config(GRPOConfig("out", gradient_checkpointing_kwargs={"use_reentrant": True}), num_rows=8)
    # run_name names a tracker's runs (wandb, mlflow, trackio): mapped there; with no such tracker nothing reads it
    assert to_config(GRPOConfig("out", run_name="r1", report_to=["wandb"]), num_rows=8).record.run_name == "r1"
    assert to_config(GRPOConfig("out", run_name="r1"), num_rows=8).record.run_name == ""


def test_steps_per_generation_and_generation_batch_size_worked_by_hand():
    a = GRPOConfig(
        "out",
        per_device_train_batch_size=2,
        gradient_accumulation_steps=2,
        steps_per_generation=4,
        num_generations=4,
        max_steps=6,
    )
    c = to_config(a, num_rows=100, world_size=1)
    # generation batch 2 * 4 = 8 completions = 2 prompts of G=4; 4 / 2 accumulation steps = 2 updates per batch;
    # 6 TRL steps / 2 updates per grpokit step = 3 grpokit steps; warm-up etc. count 3 * 2 = 6 updates
    assert (c.train.prompts_per_step, c.train.micro_batch_size, c.train.updates_per_batch, c.train.steps) == (
        2,
        2,
        2,
        3,
    )
    b = to_config(
        GRPOConfig("out", per_device_train_batch_size=2, generation_batch_size=8, num_generations=4, max_steps=8),
        num_rows=100,
        world_size=1,
    )
    # generation_batch_size 8 / (2 per device * 1 process) = steps_per_generation 4, accumulation 1: 4 updates a batch
    assert (b.train.prompts_per_step, b.train.updates_per_batch, b.train.steps) == (2, 4, 2)
    with pytest.raises(
        ConfigError, match=r"^GRPOConfig arguments steps_per_generation and generation_batch_size are both set"
    ):
        to_config(GRPOConfig("out", steps_per_generation=2, generation_batch_size=16), num_rows=8)
    # steps_per_generation 4 not a multiple of gradient_accumulation_steps 3: TRL's rolling window. The batch of
    # 2 * 4 = 8 completions is cut into 4 slices (updates_per_batch), 3 consecutive slices make an update;
    # max_steps 3 needs 3 * 3 = 9 slices = ceil(9 / 4) = 3 batches and stops after update 3 (max_updates);
    # max_steps 2 needs 6 slices = 2 batches
    for max_steps, rounds in ((3, 3), (2, 2)):
        r = to_config(
            GRPOConfig(
                "out",
                per_device_train_batch_size=2,
                gradient_accumulation_steps=3,
                steps_per_generation=4,
                num_generations=4,
                max_steps=max_steps,
            ),
            num_rows=100,
            world_size=1,
        )
        assert (
            r.train.prompts_per_step,
            r.train.micro_batch_size,
            r.train.updates_per_batch,
            r.train.accumulation_slices,
            r.train.steps,
            r.train.max_updates,
        ) == (2, 2, 4, 3, rounds, max_steps)
    # a multiple: one slice, one update; max_updates = max_steps in every run (the end may fall inside a batch)
    assert c.train.accumulation_slices == 1 and c.train.max_updates == 6


def test_update_slices_cut_rows_in_order_and_shift_sequence_weights():
    import torch

    from grpokit.algo.pipeline import UpdateInputs
    from grpokit.train.update import update_slices
    from grpokit.types import TokenBatch

    ids = torch.arange(8).view(4, 2)  # 4 rows, row r holds 2r, 2r + 1
    batch = TokenBatch(ids, torch.ones(4, 2), ids, ids, torch.ones(4, 2))
    inputs = UpdateInputs(
        batch,
        torch.tensor([1.0, 2.0, 3.0, 4.0]),
        torch.ones(4, 2),
        None,
        None,
        seq_weights=lambda rows: torch.arange(4.0)[rows],
    )
    first, second = update_slices(inputs, 2)
    assert second.batch.input_ids.tolist() == [[4, 5], [6, 7]] and second.advantages.tolist() == [3.0, 4.0]
    assert first.old_logp is None and second.seq_weights(slice(0, 2)).tolist() == [2.0, 3.0]  # rows 2, 3 of the batch
    assert update_slices(inputs, 1) == [inputs]


# -- arguments TRL scripts set that grpokit carries out


def test_new_loss_types_and_two_sided_clipping_by_hand():
    luspo = to_config(GRPOConfig(loss_type="luspo", importance_sampling_level="sequence", delta=1.5), num_rows=4).algo
    # LUSPO = the clipped surrogate summed per completion; delta 1.5 > 1 + 0.2 is dual-clip's bound; TRL's
    # sequence level is GSPO's sequence objective (the ratio's gradient on every token): sequence_whole
    assert (luspo.objective, luspo.aggregation, luspo.ratio_level, luspo.dual_clip) == (
        "clip",
        "seq-mean-token-sum",
        "sequence_whole",
        1.5,
    )
    v = to_config(GRPOConfig(loss_type="vespo", vespo_k_pos=1.0, vespo_lambda_neg=4.0), num_rows=4).algo
    assert (v.objective, v.aggregation, v.ratio_level, v.vespo_pos, v.vespo_neg) == (
        "vespo",
        "token-mean",
        "trajectory",
        [1.0, 3.0],
        [3.0, 4.0],
    )
    assert to_config(GRPOConfig(), num_rows=4).algo.dual_clip == 0.0  # delta None: off
    with pytest.raises(ConfigError, match="delta=1.1 must exceed 1 \\+ epsilon_high = 1.2"):
        to_config(GRPOConfig(delta=1.1), num_rows=4)  # a cap of 1.1 would also clip A > 0 at 1.1, not dual-clip
    with pytest.raises(ConfigError, match="not loss_type='sapo'"):
        to_config(GRPOConfig(delta=1.5, loss_type="sapo"), num_rows=4)


def test_multi_objective_aggregation_maps_to_component_normalisation():
    c = to_config(GRPOConfig(multi_objective_aggregation="normalize_then_sum", scale_rewards="group"), num_rows=4)
    assert (c.reward.normalize_components, c.algo.scale) == (True, "batch_whiten")
    c = to_config(GRPOConfig(), num_rows=4)
    assert (c.reward.normalize_components, c.algo.scale) == (False, "group")
    with pytest.raises(ConfigError, match="multi_objective_aggregation='mean'"):
        to_config(GRPOConfig(multi_objective_aggregation="mean"), num_rows=4)


def test_normalize_then_sum_equals_trl_formula():
    # TRL 1.16: z_k = (r_k - mean_group r_k) / (std_group r_k + 1e-4), s = sum_k w_k z_k,
    # A = (s - mean_batch s) / (std_batch s + 1e-4). grpokit: normalize_components, then batch_whiten.
    import torch

    from grpokit.algo.advantages import group_advantages, normalize_components

    rewards_PGF = torch.tensor([[[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]], [[0.0, 0.5], [1.0, 0.0], [0.0, 0.0]]])
    w = torch.tensor([1.0, 2.0])
    g = rewards_PGF
    z = (g - g.mean(1, keepdim=True)) / (g.std(1, keepdim=True) + 1e-4)
    s = (z * w).sum(-1).flatten()
    trl = (s - s.mean()) / (s.std() + 1e-4)
    summed = normalize_components(rewards_PGF, w)
    ours, _ = group_advantages(summed, scale="batch_whiten")
    assert torch.allclose(ours.flatten(), trl, atol=1e-5)


def test_accepted_no_op_and_small_arguments():
    c = to_config(
        GRPOConfig(
            use_liger_kernel=True,
            torch_compile=True,
            pad_to_multiple_of=8,
            optim_args="foo=1",
            accelerator_config={"dispatch_batches": False},
            log_unique_prompts=True,
            num_completions_to_print=5,
            num_generations=4,
            per_device_train_batch_size=4,
            fsdp="full_shard auto_wrap",
            fsdp_config={"fsdp_version": 2},
            lr_scheduler_type="cosine",
            lr_scheduler_kwargs={"num_cycles": 0.5},
        ),
        num_rows=4,
    )
    assert c.record.samples_prompts == 2 and c.train.fsdp and c.optim.schedule == "cosine"  # ceil(5 / 4) = 2 groups
    assert c.model.kernels == "auto"  # use_liger_kernel: liger's kernels where they can run
    assert to_config(GRPOConfig(num_generations=4, per_device_train_batch_size=4), num_rows=4).model.kernels == "torch"
    for kwargs, words in [
        ({"fsdp": "offload"}, "'cpu_offload': True"),
        ({"fsdp_config": {"cpu_offload": True}}, "fsdp_config="),
        ({"lr_scheduler_kwargs": {"num_cycles": 1.0}}, "lr_scheduler_kwargs="),
    ]:
        with pytest.raises(ConfigError) as e:
            to_config(GRPOConfig(**kwargs), num_rows=4)
        assert words in str(e.value)
    with pytest.raises(ConfigError, match="pad_to_multiple_of"):
        GRPOConfig(pad_to_multiple_of=0)


def test_sync_ref_model_mixes_at_trls_steps():
    # 2 iterations per sampled batch: TRL's 8 optimizer steps are 4 grpokit steps
    a = to_config(GRPOConfig(beta=0.04, sync_ref_model=True, ref_model_sync_steps=8, num_iterations=2), num_rows=4).algo
    assert (a.ref_refresh_every, a.ref_mixup_alpha) == (4, 0.6)  # TRL's default alpha 0.6 mixes, not copies
    assert to_config(GRPOConfig(), num_rows=4).algo.ref_refresh_every == 0
    GRPOConfig(ref_model_mixup_alpha=1.5)  # TRL reads it only with sync_ref_model (checks.GATES): inert here
    with pytest.raises(ConfigError, match=r"ref_model_mixup_alpha=1.5 .*read because sync_ref_model=True"):
        GRPOConfig(ref_model_mixup_alpha=1.5, sync_ref_model=True)


def test_refresh_reference_mixes_by_hand():
    import torch

    from grpokit.train.models import refresh_reference

    ref, pol = torch.nn.Linear(1, 1), torch.nn.Linear(1, 1)
    with torch.no_grad():
        ref.weight.fill_(1.0), pol.weight.fill_(3.0), ref.bias.fill_(0.0), pol.bias.fill_(-2.0)
    refresh_reference(ref, pol, 0.6)  # 0.6 * 3 + 0.4 * 1 = 2.2; 0.6 * -2 + 0.4 * 0 = -1.2
    assert ref.weight.item() == pytest.approx(2.2) and ref.bias.item() == pytest.approx(-1.2)
    refresh_reference(ref, pol, 1.0)  # a copy
    assert ref.weight.item() == 3.0 and ref.bias.item() == -2.0


def test_entropy_and_model_forward_arguments_map_onto_grpokit_fields():
    cfg = to_config(
        GRPOConfig(
            entropy_coef=0.01,
            use_adaptive_entropy=True,
            entropy_target=15.0,
            entropy_coef_delta=0.02,
            entropy_coef_min=0.001,
            entropy_coef_max=0.5,
        ),
        num_rows=4,
    )
    a = cfg.algo
    assert (
        a.entropy_coef,
        a.entropy_adaptive,
        a.entropy_target,
        a.entropy_coef_delta,
        a.entropy_coef_min,
        a.entropy_coef_max,
        a.entropy_aggregation,
    ) == (0.01, True, 15.0, 0.02, 0.001, 0.5, "token-mean")
    m = to_config(
        GRPOConfig(), num_rows=4
    ).model  # TRL's defaults: no fp32 head, no noise, the MoE config's own router weight
    assert (m.lm_head_fp32, m.neftune_noise_alpha, m.router_aux_loss_coef) == (False, 0.0, -1.0)
    m = to_config(
        GRPOConfig(cast_lm_head_to_fp32=True, neftune_noise_alpha=5.0, router_aux_loss_coef=0.0), num_rows=4
    ).model
    assert (m.lm_head_fp32, m.neftune_noise_alpha, m.router_aux_loss_coef) == (True, 5.0, 0.0)
    for bad in (
        {"neftune_noise_alpha": -1.0},
        {"router_aux_loss_coef": -0.5},
        {"entropy_coef_delta": float("nan"), "use_adaptive_entropy": True},
    ):
        with pytest.raises(ConfigError, match=f"GRPOConfig argument {next(iter(bad))}="):
            GRPOConfig(**bad)


def test_colocated_vllm_tensor_parallel_size_maps_to_the_rollout_field():
    vllm = dict(use_vllm=True, vllm_importance_sampling_mode="token_truncate")
    c = to_config(GRPOConfig("o", **vllm, vllm_mode="colocate", vllm_tensor_parallel_size=2), num_rows=64, world_size=4)
    assert (c.rollout.backend, c.rollout.vllm_tensor_parallel_size) == ("vllm", 2)  # groups [0 1] [2 3], as TRL
    validate(c)
    assert to_config(GRPOConfig("o", **vllm), num_rows=64, world_size=4).rollout.vllm_tensor_parallel_size == 1
    # server mode: the server's own --tensor-parallel-size decides (TRL ignores the argument), so 1 here
    c = to_config(GRPOConfig("o", **vllm, vllm_mode="server", vllm_tensor_parallel_size=2), num_rows=64, world_size=3)
    assert (c.rollout.backend, c.rollout.vllm_tensor_parallel_size) == ("vllm_server", 1)
    # TRL: "tensor_parallel_size (2) must divide world size (3) evenly"
    with pytest.raises(ConfigError) as e:
        to_config(GRPOConfig("o", **vllm, vllm_tensor_parallel_size=2), num_rows=64, world_size=3)
    assert str(e.value) == (
        "GRPOConfig argument vllm_tensor_parallel_size=2 must divide the 3 training processes with "
        "vllm_mode='colocate' (each group of 2 shares one vLLM engine); valid: 1, 3"
    )


def test_max_tool_calling_iterations_maps_to_model_turns():
    """TRL runs at most N tool rounds, each followed by a model turn (``while ... iteration_num < N``): N + 1
    model turns; a negative N runs no round, as 0; None is no limit in TRL, env.max_turns=0 here (the episode
    bounded by max_completion_length = env.max_episode_tokens), where it was 4 turns before."""
    turns = {
        n: to_config(GRPOConfig(max_tool_calling_iterations=n, max_completion_length=64), num_rows=8).env
        for n in (None, -1, 0, 2)
    }
    assert {n: e.max_turns for n, e in turns.items()} == {None: 0, -1: 1, 0: 1, 2: 3}
    assert turns[None].max_episode_tokens == 64


def test_log_multimodal_decides_whether_samples_carry_their_images():
    # TRL logs a batch's images beside its completions unless log_multimodal=False; it reads log_multimodal only when
    # it logs completions (log_completions), as grpokit writes samples only then (record.samples_every > 0)
    logged = {"log_completions": True}
    assert to_config(GRPOConfig("o", **logged), num_rows=8).record.samples_images is True
    assert to_config(GRPOConfig("o", log_multimodal=False, **logged), num_rows=8).record.samples_images is False
    assert to_config(GRPOConfig("o", log_multimodal=False), num_rows=8).record.samples_images is True  # unread


def test_the_trl_layer_trains_the_vision_tower_as_trl():
    # TRL freezes nothing; grpokit's own default keeps the tower frozen (docs/VISION.md)
    assert to_config(GRPOConfig("o"), num_rows=8).model.freeze_vision is False
    assert Config().model.freeze_vision is True


def test_trls_kl_and_entropy_settings_map_only_where_trl_reads_them():
    """TRL's defaults are beta 0 with use_bias_correction_kl True and entropy_coef 0: TRL reads neither the
    correction nor its token-mean entropy aggregation then, and grpokit refuses such inert values, so the TRL layer
    maps them only with a KL term or an entropy bonus (before: every default GRPOConfig set both, inert)."""
    bare = to_config(GRPOConfig(), num_rows=4).algo
    assert (bare.beta, bare.kl_bias_correction, bare.entropy_aggregation) == (0.0, False, "loss")
    on = to_config(GRPOConfig(beta=0.04, entropy_coef=0.01), num_rows=4).algo
    assert (on.kl_bias_correction, on.entropy_aggregation) == (True, "token-mean")
    adaptive = to_config(GRPOConfig(use_adaptive_entropy=True), num_rows=4).algo
    assert adaptive.entropy_aggregation == "token-mean"


def test_fp16_on_the_cpu_trains_in_float32_and_is_refused_on_a_gpu(monkeypatch, caplog):
    """accelerate turns native fp16 on only off the CPU, so TRL's fp16=True CPU run is a float32 run (its
    grad_norm equals fp32's exactly); grpokit mapped it to float16 autocast with no loss scaler (grad_norm
    26% low at beta 1e-5). On a GPU TRL adds a GradScaler, which grpokit has not: refused in one sentence."""
    import logging

    import torch

    from grpokit.trl.contract.surface import warn_like_trl

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    a = GRPOConfig("out", fp16=True, max_steps=1)
    assert to_config(a, num_rows=8, world_size=1).model.autocast == "off"
    with caplog.at_level(logging.WARNING, logger="grpokit.trl"):
        warn_like_trl(a)
    assert "fp16=True on the CPU" in caplog.text
    on_cpu = GRPOConfig("out", fp16=True, use_cpu=True, max_steps=1)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # a GPU present (after building the configs)
    with pytest.raises(ConfigError, match=r"^GRPOConfig argument fp16=True is not supported by grpokit; valid: bf16"):
        to_config(a, num_rows=8, world_size=1)
    assert to_config(on_cpu, num_rows=8, world_size=1).model.autocast == "off"  # use_cpu: a CPU run


def test_native_float16_autocast_is_refused_for_want_of_loss_scaling():
    from grpokit.validation import validate

    cfg = Config()
    cfg.model.autocast = "float16"
    with pytest.raises(ConfigError, match=r"^model.autocast='float16' is not supported: grpokit has no float16 loss"):
        validate(cfg)
