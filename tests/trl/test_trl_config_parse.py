"""grpokit.trl's GRPOConfig is a transformers TrainingArguments that every parser reads as TRL's.

TRL's example scripts' command lines and TRL-style YAML recipes (written here in our own words) are
parsed by grpokit's ``TrlParser((ScriptArguments, GRPOConfig, ModelConfig ...))`` and by TRL's own
parser over TRL's classes; the objects must be equal field for field. The names TRL scripts import
beside GRPOConfig come from grpokit.trl without TRL installed.
"""

from __future__ import annotations

import dataclasses
import subprocess
import sys
import textwrap

import pytest
from transformers import HfArgumentParser, TrainingArguments

from grpokit.config.base import ConfigError
from grpokit.trl import GRPOConfig, ModelConfig, ScriptArguments, TrlParser
from grpokit.trl.mapping import to_config

# TRL's GRPOConfig refuses bf16 on a CPU-only machine unless use_cpu is set (its bf16 default becomes True);
# grpokit's None is "auto" (bf16 on a GPU only). The comparison runs on CPU, so both get --bf16 False.
CPU = ["--bf16", "False"]
# the flags of TRL's example scripts' docstrings (examples/scripts/*.py, docs), model ids kept as text
COMMAND_LINES = {
    "gspo": "--model_name_or_path Qwen/Qwen3-0.6B --output_dir gspo-Qwen3-0.6B --learning_rate 1e-5 --dtype bfloat16 "
    "--max_completion_length 1024 --use_peft --lora_target_modules q_proj, v_proj --log_completions "
    "--per_device_train_batch_size 8 --num_generations 8 --importance_sampling_level sequence --epsilon 3e-4 "
    "--epsilon_high 4e-4 --beta 0.0 --loss_type grpo --gradient_accumulation_steps 2 --steps_per_generation 8",
    "grpo_vlm": "--model_name_or_path Qwen/Qwen2.5-VL-3B-Instruct --output_dir grpo-vl --learning_rate 1e-5 "
    "--dtype bfloat16 --max_completion_length 1024 --use_vllm --vllm_mode colocate --use_peft "
    "--lora_target_modules q_proj, v_proj --log_completions",
    "grpo_vlm_smol": "--model_name_or_path HuggingFaceTB/SmolVLM2-2.2B-Instruct --output_dir grpo-smol "
    "--learning_rate 1e-5 --dtype bfloat16 --max_completion_length 1024 --use_peft "
    "--lora_target_modules q_proj, v_proj --log_completions --per_device_train_batch_size 1 "
    "--gradient_accumulation_steps 2 --num_generations 2",
    "grpo_agent": "--model_name_or_path Qwen/Qwen3-1.7B --output_dir grpo_biogrid --push_to_hub True --use_vllm True "
    "--vllm_mode colocate --max_completion_length 1024 --report_to trackio --log_completions True --max_steps 400",
    # on one process (TRL refuses a generation batch of 8 for 32 generations) with a batch that holds a group
    "continuous_batching": "--model_name_or_path Qwen/Qwen3-1.7B --output_dir grpo-gsm8k --num_generations 32 "
    "--max_completion_length 1024 --use_peft --log_completions --per_device_train_batch_size 32",
    "lora_without_regret": "--model_name_or_path Qwen/Qwen3-0.6B --output_dir grpo-full --learning_rate 1.0e-6 "
    "--lr_scheduler_type cosine --warmup_steps 0.0 --max_grad_norm 1.0 --beta 0.0 "
    "--max_completion_length 4096 --num_generations 16 --generation_batch_size 16 "
    "--gradient_accumulation_steps 8 --per_device_train_batch_size 1 --num_train_epochs 1 --lora_r 1 "
    "--lora_alpha 32 --lora_dropout 0.0 --lora_target_modules all-linear --vllm_mode colocate "
    "--save_strategy steps --save_steps 50 --save_total_limit 1 --logging_steps 1 --max_steps 200",
    "peft_docs": "--model_name_or_path Qwen/Qwen2-0.5B --dataset_name trl-lib/math-reasoning --learning_rate 1.0e-5 "
    "--per_device_train_batch_size 2 --use_peft --lora_r 32 --lora_alpha 16 --output_dir Qwen2-0.5B-GRPO-LoRA "
    "--num_generations 2",  # on one process, a group must fit the batch of 2 (TRL refuses 8)
    "typed_values": "--output_dir o --reward_weights 1.0 0.5 --scale_rewards batch --report_to none "
    '--model_init_kwargs {"dtype":"bfloat16"} --generation_kwargs {"top_k":5} --eval_strategy steps '
    "--eval_steps 5 --per_device_eval_batch_size 8 --vllm_importance_sampling_clip_min 0.5 "
    '--log_level info --lr_scheduler_kwargs {"num_cycles":0.5} --lr_scheduler_type cosine',
}
RECIPES = {  # TRL-style YAML recipes of the kind TRL's CLI docs show, in our words
    "quick": """
        model_name_or_path: Qwen/Qwen2.5-0.5B
        dataset_name: my-org/math-problems
        reward_funcs: [accuracy_reward, think_format_reward]
        """,
    "mixture": """
        model_name_or_path: Qwen/Qwen2.5-0.5B
        datasets:
          - path: my-org/math-problems
          - path: my-org/more-math
            split: train
            columns: [prompt, solution]
        reward_funcs: [accuracy_reward]
        test_split_size: 0.1
        """,
    "tuned": """
        model_name_or_path: Qwen/Qwen3-0.6B
        dataset_name: my-org/math-problems
        reward_funcs: [reasoning_accuracy_reward, get_soft_overlong_punishment]
        learning_rate: 1.0e-6
        lr_scheduler_type: cosine_with_min_lr
        lr_scheduler_kwargs: {min_lr_rate: 0.1}
        num_generations: 8
        per_device_train_batch_size: 8
        gradient_accumulation_steps: 4
        max_completion_length: 256
        loss_type: dr_grpo
        scale_rewards: false
        reward_weights: [1.0, 0.5]
        beta: 0.04
        epsilon_high: 0.28
        mask_truncated_completions: true
        use_peft: true
        lora_r: 8
        lora_target_modules: [q_proj, v_proj]
        report_to: none
        logging_steps: 5
        save_strategy: "no"
        env:
          GRPOKIT_TEST_RECIPE_ENV: "1"
        """,
}


def _trl():
    return pytest.importorskip("trl")


def _same(ours, theirs) -> None:
    a = ours.to_dict() if isinstance(ours, TrainingArguments) else dataclasses.asdict(ours)
    b = theirs.to_dict() if isinstance(theirs, TrainingArguments) else dataclasses.asdict(theirs)
    assert set(a) == set(b)
    assert {k: v for k, v in a.items() if v != b[k]} == {}, type(ours).__name__


@pytest.mark.parametrize("name", sorted(COMMAND_LINES))
def test_trl_example_command_lines_parse_as_with_trl(name):
    trl = _trl()
    argv = COMMAND_LINES[name].split() + CPU
    ours = TrlParser((ScriptArguments, GRPOConfig, ModelConfig)).parse_args_and_config(argv)
    theirs = trl.TrlParser((trl.ScriptArguments, trl.GRPOConfig, trl.ModelConfig)).parse_args_and_config(argv)
    for a, b in zip(ours, theirs):
        _same(a, b)
    assert isinstance(ours[1], GRPOConfig) and isinstance(ours[1], TrainingArguments)


@pytest.mark.parametrize("name", sorted(RECIPES))
def test_trl_yaml_recipes_parse_as_with_trl(name, tmp_path, monkeypatch):
    _trl()  # skips without trl
    from trl.scripts.grpo import make_parser as trl_parser

    from grpokit.trl.scripts.trl_grpo import make_parser

    monkeypatch.delenv("GRPOKIT_TEST_RECIPE_ENV", raising=False)
    path = tmp_path / "recipe.yaml"
    path.write_text(textwrap.dedent(RECIPES[name]) + "bf16: false\n")  # see CPU above
    ours = make_parser().parse_args_and_config(["--config", str(path)])
    theirs = trl_parser().parse_args_and_config(["--config", str(path)])
    for a, b in zip(ours, theirs):
        _same(a, b)
    if name == "tuned":  # the env mapping reached the environment; a flag still wins over the file
        import os

        assert os.environ["GRPOKIT_TEST_RECIPE_ENV"] == "1"
        assert ours[1].scale_rewards == "none" and ours[1].reward_weights == [1.0, 0.5]
        again = make_parser().parse_args_and_config(["--config", str(path), "--learning_rate", "3e-6"])
        assert again[1].learning_rate == 3e-6


def test_help_lists_every_field(capsys):
    from grpokit.trl.scripts.trl_grpo import make_parser

    parser = make_parser()
    text = parser.format_help()
    for cls in parser.dataclass_types:
        for f in dataclasses.fields(cls):
            assert f"--{f.name}" in text, f.name
    assert "--reward_funcs" in text and "Peak AdamW learning rate" in text  # each field's own help


def test_hfargumentparser_reads_the_typed_fields_without_trl():
    (args,) = HfArgumentParser(GRPOConfig).parse_args_into_dataclasses(
        [
            "--output_dir",
            "o",
            "--reward_weights",
            "1",
            "0.5",
            "--report_to",
            "none",
            "--scale_rewards",
            "none",
            "--num_generations",
            "4",
            "--per_device_train_batch_size",
            "4",
            "--model_init_kwargs",
            '{"dtype": "bfloat16"}',
        ]
    )
    assert args.reward_weights == [1.0, 0.5] and args.report_to == [] and args.scale_rewards == "none"
    assert args.model_init_kwargs == {"dtype": "bfloat16"} and args.generation_batch_size == 4
    assert to_config(args, num_rows=8).model.dtype == "bfloat16"
    with pytest.raises(ConfigError, match="^GRPOConfig argument num_generations=1 is not valid"):
        HfArgumentParser(GRPOConfig).parse_args_into_dataclasses(["--num_generations", "1"])


def test_a_project_subclasses_it_with_its_own_fields():
    @dataclasses.dataclass
    class MyConfig(GRPOConfig):
        curriculum_start: float = dataclasses.field(default=0.5, metadata={"help": "share of easy prompts at first"})

    parser = HfArgumentParser(MyConfig)
    (args,) = parser.parse_args_into_dataclasses(
        ["--output_dir", "o", "--curriculum_start", "0.25", "--learning_rate", "2e-6"]
    )
    assert isinstance(args, MyConfig) and args.curriculum_start == 0.25 and args.learning_rate == 2e-6
    assert "--curriculum_start" in parser.format_help()
    assert to_config(args, num_rows=8).optim.lr == 2e-6  # the run reads the TRL arguments, the project its own
    with pytest.raises(ConfigError, match="^GRPOConfig argument deepspeed='ds.json' is not supported"):
        MyConfig(output_dir="o", deepspeed="ds.json")  # the base class's refusals hold in a subclass
    with pytest.raises(TypeError):
        MyConfig(output_dir="o", not_a_field=1)  # as TRL's subclasses: the dataclass's own error


def test_trainingarguments_attributes_scripts_read(monkeypatch):
    for key in ("RANK", "LOCAL_RANK", "WORLD_SIZE"):
        monkeypatch.delenv(key, raising=False)
    args = GRPOConfig("out", log_level="info", log_level_replica="error", seed=7)
    assert (args.process_index, args.local_process_index, args.world_size, args.n_gpu) == (0, 0, 1, 0)
    assert args.device.type == "cpu" and args.should_log and args.should_save
    assert args.get_process_log_level() == 20  # logging.INFO on the main process
    with args.main_process_first(desc="tokenize"):
        pass
    d = args.to_dict()
    assert d["seed"] == 7 and d["lr_scheduler_type"] == "linear" and d["hub_token"] == "<HUB_TOKEN>"
    assert '"num_generations": 8' in args.to_json_string() and "seed" in args.to_sanitized_dict()
    assert args.lr_scheduler_type == __import__("transformers").SchedulerType.LINEAR  # equal to transformers' enum
    assert args.get_warmup_steps(100) == 0 and args.train_batch_size == 8


def test_trl_names_import_from_grpokit_trl_without_trl():
    code = (
        "import sys; sys.modules['trl'] = None\n"  # any `import trl` now fails
        "from grpokit.trl import (GRPOConfig, GRPOTrainer, ModelConfig, ScriptArguments, TrlParser, get_peft_config,\n"
        "    get_quantization_config, get_kbit_device_map, get_dataset, DatasetMixtureConfig, init_zero_verbose,\n"
        "    RichProgressCallback)\n"
        "from grpokit.trl.rewards import (accuracy_reward, think_format_reward, reasoning_accuracy_reward,\n"
        "    get_soft_overlong_punishment, get_cosine_scaled_reward, get_repetition_penalty_reward)\n"
        "m = ModelConfig(model_name_or_path='x', use_peft=True, lora_target_modules=['q_proj', 'v_proj'])\n"
        "assert get_peft_config(m).r == 16 and get_quantization_config(m) is None\n"
        "assert get_quantization_config(ModelConfig(load_in_4bit=True)).load_in_4bit\n"
        "assert think_format_reward([[{'content': '<think>a</think>b'}]]) == [1.0]\n"
        "print('ok', 'trl' in sys.modules and sys.modules['trl'] is None)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split()[-2:] == ["ok", "True"]


def test_rich_progress_callback_counts_steps_and_is_accepted_by_the_trainer(capsys):
    from transformers import TrainerControl, TrainerState

    from grpokit.train.callbacks import Callbacks, RunState
    from grpokit.trl import RichProgressCallback

    cb = RichProgressCallback()
    Callbacks([cb], None, RunState())  # defines only events grpokit calls (a callback with others is refused)
    state, control = TrainerState(max_steps=4), TrainerControl()
    cb.on_train_begin(None, state, control)
    for step in (1, 2, 3):
        state.global_step = step
        cb.on_step_end(None, state, control)
    cb.on_log(None, state, control, logs={"loss": 0.123456, "step": 3})
    assert cb.bar.n == 3 and cb.bar.total == 4
    cb.on_train_end(None, state, control)
    assert cb.bar is None and "'loss': 0.1235" in capsys.readouterr().out


def test_disable_tqdm_none_follows_transformers_log_level_as_trl():
    from transformers.utils import logging as hf_logging

    before = hf_logging.get_verbosity()
    try:
        hf_logging.set_verbosity(hf_logging.WARNING)
        assert GRPOConfig("o").disable_tqdm is False and to_config(GRPOConfig("o"), num_rows=8).record.sinks == [
            "console"
        ]
        hf_logging.set_verbosity(hf_logging.ERROR)  # transformers quieted: no progress output, as transformers decides
        assert GRPOConfig("o").disable_tqdm is True and to_config(GRPOConfig("o"), num_rows=8).record.sinks == []
    finally:
        hf_logging.set_verbosity(before)


@pytest.mark.parametrize(
    "flag, text, expected",
    [
        ("epsilon_high", "none", None),  # float | None: TRL's 'none' / 'null' sentinel, any case
        ("epsilon_high", "NULL", None),
        ("epsilon_high", "0.28", 0.28),  # a number is still a number
        ("min_p", "None", None),
        ("save_total_limit", "null", None),  # int | None
        ("generation_batch_size", "none", 8),  # None, then GRPOConfig fills it: 8 per device * 1 step * 1 process
        ("report_to", "none", []),  # str-typed: 'none' stays text (transformers: no integrations)
        ("scale_rewards", "none", "none"),  # str: TRL's "none" scaling, a real value
        ("lora_target_modules", "none", "none"),  # list[str] | None: text, as TRL
    ],
)
def test_none_reads_as_none_for_an_optional_non_text_flag(flag, text, expected):
    from grpokit.trl.scripts.trl_grpo import make_parser

    objects = make_parser().parse_args_and_config(
        ["--output_dir", "o", "--per_device_train_batch_size", "8", *CPU, f"--{flag}", text]
    )
    assert [getattr(o, flag) for o in objects if hasattr(o, flag)] == [expected]


@pytest.mark.parametrize("argv", [["--reward_weights", "none"], ["--temperature", "none"], ["--use_vllm", "none"]])
def test_none_is_refused_where_trl_refuses_it(argv, capsys):
    # a list (reward_weights: list[float] | None), a float with a float default (temperature) and a bool flag are
    # not TRL's optional single values: argparse's "invalid ... value", exit 2, as under TRL
    from grpokit.trl.scripts.trl_grpo import make_parser

    with pytest.raises(SystemExit) as e:
        make_parser().parse_args_and_config(["--output_dir", "o", *CPU, *argv])
    assert e.value.code == 2 and "none" in capsys.readouterr().err.splitlines()[-1]


def test_none_parses_as_under_trls_parser_for_every_argument(capsys):
    _trl()  # skips without trl
    from trl.scripts.grpo import make_parser as trl_parser

    from grpokit.trl.scripts.trl_grpo import make_parser

    def read(parser, name):  # the parser's reading alone (the dataclasses' own checks differ: grpokit refuses more)
        try:
            value = getattr(parser.parse_known_args([f"--{name}", "none"])[0], name)
        except SystemExit:  # argparse's refusal ("invalid float value")
            return "refused"
        if isinstance(value, list):  # datasets: each its own module's DatasetConfig, compared by fields
            return [dataclasses.asdict(v) if dataclasses.is_dataclass(v) else v for v in value]
        return value

    ours, theirs = make_parser(), trl_parser()
    names = sorted({a.dest for a in theirs._actions if a.option_strings} - {"help"})
    both = {n: (read(ours, n), read(theirs, n)) for n in names}
    capsys.readouterr()
    assert {n: pair for n, pair in both.items() if pair[0] != pair[1]} == {}
    # what the rule gives (hand-checked): None for a float/int | None field, text for a str one, refused for a
    # float with a number default, a list and a bool
    assert both["epsilon_high"] == (None, None) and both["save_total_limit"] == (None, None)
    assert both["scale_rewards"] == ("none", "none") and both["temperature"] == ("refused", "refused")
    assert both["reward_weights"] == ("refused", "refused") and both["use_vllm"] == ("refused", "refused")
