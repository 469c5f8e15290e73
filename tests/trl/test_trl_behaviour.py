"""What TRL 1.16 accepts and grpokit.trl handles as TRL does, not refused: image placeholders for rows with
images, continuous batching, reporting arguments nothing reports with, environments whose reset is
random, an environment_factory without train_dataset, save_strategy="no", and the arguments TRL's
GRPO itself ignores. Where a run is cheap the same test body runs under ``trl`` too (the oracle),
so the expectation is TRL's, not ours."""

from __future__ import annotations

import dataclasses
import importlib
import random
from pathlib import Path

import pytest
from datasets import Dataset

from grpokit.config import ConfigError
from grpokit.data import vision
from grpokit.trl import GRPOConfig, GRPOTrainer
from grpokit.trl.mapping import to_config
from helpers.trl_models import make_chat_model, make_tool_chat_model, small_args

BACKENDS = ["grpokit.trl", pytest.param("trl", marks=pytest.mark.slow)]


@pytest.fixture(scope="module")
def chat_model(tmp_path_factory):
    return str(make_chat_model(tmp_path_factory.mktemp("chat-model")))


@pytest.fixture(scope="module")
def tool_model(tmp_path_factory):
    """TRL recognises tool calling by its bundled templates; without trl installed grpokit reads the same file."""
    trl = pytest.importorskip("trl")
    template = (Path(trl.__file__).parent / "chat_templates" / "qwen3.jinja").read_text()
    return str(make_tool_chat_model(tmp_path_factory.mktemp("qwen3"), template))


def small(module, out, **kw):
    base = dict(max_steps=2, num_generations=2, report_to="none", logging_steps=1)
    return small_args(module.GRPOConfig, out, **{**base, **kw})


def length(completions, **kwargs):
    return [float(len(c[0]["content"])) for c in completions]


DATA = Dataset.from_dict({"prompt": [[{"role": "user", "content": f"say {w}"}] for w in ("ab", "cd", "ef", "gh")]})

# ---------------------------------------------------------------- image placeholders


CASES = [  # prompts as TRL's VLM scripts write them: string contents, a system turn first, several user turns
    [{"role": "user", "content": "What is it?"}],
    [{"role": "system", "content": "Think."}, {"role": "user", "content": "Count."}],
    [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}, {"role": "user", "content": "c"}],
    [{"role": "user", "content": [{"type": "text", "text": "given"}]}, {"role": "user", "content": "then"}],
]


@pytest.mark.parametrize("prompt", CASES)
@pytest.mark.parametrize("n_images", [0, 1, 2])
def test_image_placeholders_are_placed_as_trl_places_them(prompt, n_images):
    trl_data = pytest.importorskip("trl.data_utils")
    want = trl_data.prepare_multimodal_messages(prompt, images=[object()] * n_images)
    for m in want:  # TRL fills each placeholder with its image; grpokit passes the images to the processor apart
        m["content"] = [{k: v for k, v in part.items() if k != "image"} for part in m["content"]]
    assert vision.vision_messages(prompt, n_images) == want


def test_a_vlm_rows_string_prompt_gets_its_images_tokens():
    """TRL's grpo_vlm.py: a system turn and a string user turn, the image in its own column."""
    from grpokit.data.tasks import shapes

    proc = vision.load_processor(str(shapes.shapes_model_path()))
    row = {
        "prompt": [{"role": "system", "content": "Answer."}, {"role": "user", "content": "how many?"}],
        "image": shapes.train_rows(1)[0]["image"],
    }
    text, ids, pixels = vision.encode_prompt(row, 0, proc)
    # 64x64 image, 8 px patches, 2x2 merge: 16 image tokens, in the user turn, before its text
    assert ids.count(proc.tokenizer.convert_tokens_to_ids("<|image_pad|>")) == 16
    assert pixels["image_grid_thw"].tolist() == [[1, 8, 8]]
    assert text.index("<|image_pad|>") < text.index("how many?") and text.index("Answer.") < text.index("<|image_pad|>")


# ---------------------------------------------------------------- checkpoints and reporting arguments


@pytest.mark.parametrize("backend", BACKENDS)
def test_save_strategy_no_writes_no_checkpoint(backend, chat_model, tmp_path):
    mod = importlib.import_module(backend)
    out = tmp_path / "run"
    trainer = mod.GRPOTrainer(
        chat_model, reward_funcs=length, args=small(mod, out, save_strategy="no"), train_dataset=DATA
    )
    trainer.train()
    assert trainer.state.global_step == 2
    assert not list(out.glob("checkpoint-*")) and not (out / "checkpoints").exists()


def test_trackio_arguments_need_no_trackio_unless_it_reports():
    cfg = to_config(GRPOConfig(trackio_space_id="me/dash", trackio_bucket_id="me/logs", report_to="none"), num_rows=8)
    assert "trackio" not in cfg.record.sinks
    with pytest.raises(
        ConfigError,
        match=r"^GRPOConfig argument trackio_space_id='me/dash' is not supported by grpokit; "
        r"valid: None with report_to trackio",
    ):
        to_config(GRPOConfig(trackio_space_id="me/dash", report_to="trackio"), num_rows=8)


NO_EFFECT = dict(
    label_smoothing_factor=0.1,
    liger_kernel_config={"rope": True},
    prediction_loss_only=True,
    eval_do_concat_batches=False,
    eval_use_gather_object=True,
    eval_accumulation_steps=4,
    include_for_metrics=["inputs"],
    batch_eval_metrics=True,
    dataloader_drop_last=True,
    dataloader_multiprocessing_context="spawn",
    label_names=["labels"],
    train_sampling_strategy="sequential",
    length_column_name="n",
    ds3_gather_for_generation=False,
    local_rank=0,
    trackio_static_space_id="me/static",
    log_on_each_node=False,
    dataloader_in_order=False,
    ddp_find_unused_parameters=True,
    ddp_bucket_cap_mb=50,
    ddp_broadcast_buffers=False,
    ddp_static_graph=True,
)


def test_arguments_trls_grpo_ignores_are_accepted_and_change_nothing():
    """Each is read only by code TRL's GRPOTrainer replaces (compute_loss, the sampler, prediction_step)
    or by DeepSpeed/trackio, which are not in use: the resolved grpokit Config is the default's."""
    base = dataclasses.asdict(to_config(GRPOConfig("o"), num_rows=8))
    for name, value in NO_EFFECT.items():
        assert dataclasses.asdict(to_config(GRPOConfig("o", **{name: value}), num_rows=8)) == base, name


def test_cache_implementation_picks_the_decode_loop_as_trls_generation_config():
    rollout = lambda **kw: to_config(GRPOConfig(**kw), num_rows=8).rollout
    assert rollout(cache_implementation="static").engine == "static"
    assert rollout(cache_implementation="dynamic").engine == "dynamic"
    r = rollout(cache_implementation="offloaded")
    assert (r.engine, r.generation_kwargs) == ("generate", {"cache_implementation": "offloaded"})
    r = rollout(
        cache_implementation="static", generation_kwargs={"cache_implementation": "offloaded"}
    )  # TRL: kwargs win
    assert (r.engine, r.generation_kwargs) == ("generate", {"cache_implementation": "offloaded"})
    assert rollout(cache_implementation="offloaded", use_vllm=True).engine == rollout().engine  # vLLM keeps its own


# ---------------------------------------------------------------- continuous batching


def test_continuous_batching_trains_and_is_refused_where_trl_refuses(chat_model, tmp_path):
    """TRL samples through transformers' generate_batch (checked by hand: it ran 2 steps on this model, too
    slow on a CPU for the suite); grpokit's own decode loop drops finished rows from its batch."""
    trainer = GRPOTrainer(
        chat_model,
        reward_funcs=length,
        train_dataset=DATA,
        args=small(importlib.import_module("grpokit.trl"), tmp_path / "a", use_transformers_continuous_batching=True),
    )
    trainer.train()
    assert trainer.state.global_step == 2
    a = GRPOConfig(str(tmp_path / "b"), use_transformers_paged=True)
    with pytest.warns(FutureWarning, match="use_transformers_paged"):
        GRPOTrainer(chat_model, reward_funcs=length, train_dataset=DATA, args=a)
    assert a.use_transformers_continuous_batching is True
    with pytest.raises(
        ConfigError, match="^GRPOConfig argument transformers_continuous_batching_config=.*unexpected keyword"
    ):
        GRPOTrainer(
            chat_model,
            reward_funcs=length,
            train_dataset=DATA,
            args=GRPOConfig(str(tmp_path / "c"), transformers_continuous_batching_config={"max_memory_pct": 0.5}),
        )
    from grpokit.data.tasks import shapes

    with pytest.raises(ConfigError, match="^`use_transformers_continuous_batching` does not support multimodal models"):
        GRPOTrainer(
            str(shapes.shapes_model_path()),
            reward_funcs=length,
            train_dataset=DATA,
            args=GRPOConfig(str(tmp_path / "d"), use_transformers_continuous_batching=True),
        )


# ---------------------------------------------------------------- environments


class IncrementEnv:
    """TRL's documented environment that owns its data: reset() draws the task at random."""

    def reset(self, **kwargs) -> str:
        self.counter, self.target = 0, random.randint(1, 6)
        return f"Increment the counter by {self.target}."

    def get_reward(self) -> float:
        return float(self.counter == self.target)

    def increment(self, step: int) -> int:
        """
        Increment the counter.

        Args:
            step: Value to add to the counter.

        Returns:
            The updated counter value.
        """
        self.counter += step
        return self.counter


@pytest.mark.filterwarnings("ignore:the environment's reset")
@pytest.mark.parametrize("backend", BACKENDS)
def test_environment_without_dataset_and_random_reset_train(backend, tool_model, tmp_path):
    mod = importlib.import_module(backend)
    random.seed(0)
    args = small(mod, tmp_path / "run", max_completion_length=8, chat_template_kwargs={"enable_thinking": False})
    trainer = mod.GRPOTrainer(tool_model, args=args, environment_factory=IncrementEnv)
    trainer.train()
    assert trainer.state.global_step == 2
    assert any("reward" in entry for entry in trainer.state.log_history)


def test_environment_without_dataset_needs_max_steps_and_one_environment(tool_model, tmp_path):
    with pytest.raises(ConfigError, match=r"^When training without a `train_dataset`.*`max_steps` must be set"):
        GRPOTrainer(tool_model, args=GRPOConfig(str(tmp_path)), environment_factory=IncrementEnv)
    with pytest.raises(
        ConfigError, match=r"^A `dict` `environment_factory` \(multiple environments\) requires a `train_dataset`"
    ):
        GRPOTrainer(tool_model, args=GRPOConfig(str(tmp_path), max_steps=1), environment_factory={"a": IncrementEnv})
    with pytest.raises(ConfigError, match=r"^`train_dataset` is required unless an `environment_factory` is provided"):
        GRPOTrainer(tool_model, reward_funcs=length, args=GRPOConfig(str(tmp_path), max_steps=1))
