"""Config()'s defaults are a real run's; the demo's settings apply only to the demo; one's own data
never keeps the task's reward or held-out set; presets fill what the user left unset, at the run's
scale. Everything here builds configs (and at most a Trainer on the 0.26M demo model): no steps."""

import pytest

from grpokit.cli.train_command import build_config, parse_train_args, train_parser
from grpokit.config import Config, ConfigError, presets
from grpokit.config.io import apply_overrides, assigned, load_yaml
from grpokit.data.tasks import get_task
from grpokit.train import reward_setup, run_data
from helpers.paths import ROOT


def cli_config(*argv: str) -> Config:
    """What `grpokit train ARGV` trains: the CLI's layers, then the run's own resolution."""
    return run_data.resolve_run(build_config(parse_train_args(list(argv))))


def test_config_defaults_are_a_real_run():
    cfg = Config()
    # TRL 1.16's GRPOConfig: max_completion_length=512, learning_rate=1e-6 (DeepSeekMath's too)
    assert (cfg.rollout.max_new_tokens, cfg.optim.lr) == (512, 1e-6)
    assert (cfg.train.steps, cfg.train.save_every, cfg.train.eval_every) == (500, 100, 0)
    assert cfg.data.eval_dataset == "" and assigned(cfg) == set()


def test_overrides_may_stand_before_and_after_the_options():
    """``grpokit train a=1 --out R b=2``: both overrides count (a plain parse stopped at b=2)."""
    cfg = cli_config("train.steps=3", "--out", "somewhere", "rollout.group_size=4")
    assert (cfg.train.steps, cfg.rollout.group_size, cfg.train.out) == (3, 4, "somewhere")


def test_the_demo_fills_only_what_nobody_set():
    demo = get_task("arithmetic").demo
    assert dict(demo) == {"rollout.max_new_tokens": 8, "optim.lr": 3e-4, "train.steps": 60, "train.save_every": 0}
    cfg = run_data.resolve_run(Config())  # `grpokit train` with no arguments: the demo with its own settings
    assert (cfg.rollout.max_new_tokens, cfg.optim.lr, cfg.train.steps, cfg.train.save_every) == (8, 3e-4, 60, 0)
    cfg = Config()
    cfg.rollout.max_new_tokens = 512  # set explicitly, even to the default value: kept
    apply_overrides(cfg, ["optim.lr=1e-3"])
    cfg = run_data.resolve_run(cfg)
    assert (cfg.rollout.max_new_tokens, cfg.optim.lr, cfg.train.steps) == (512, 1e-3, 60)


def test_a_users_model_keeps_the_real_run_defaults_and_the_task():
    cfg = cli_config("model.name_or_path=Qwen/Qwen2.5-0.5B-Instruct")
    assert (cfg.rollout.max_new_tokens, cfg.optim.lr, cfg.train.steps, cfg.train.save_every) == (512, 1e-6, 500, 100)
    assert cfg.data.task == "arithmetic"  # a built-in task on one's own model: its rows, reward and held-out set


def test_the_readme_own_model_example_is_a_real_run(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.jsonl").write_text('{"question": "1+1?", "solution": "2"}\n')
    cfg = cli_config(
        "model.name_or_path=Qwen/Qwen2.5-0.5B-Instruct",
        "data.dataset=train.jsonl",
        "data.prompt_column=question",
        "data.answer_column=solution",
        "reward.functions=[math_accuracy,strict_format]",
        "reward.weights=[1.0,0.5]",
    )
    assert (cfg.rollout.max_new_tokens, cfg.optim.lr) == (512, 1e-6)
    assert cfg.data.task == ""  # data.task was not cleared: one's own data replaces it anyway
    assert [s.name for s in reward_setup.reward_specs(cfg, None)] == ["math_accuracy", "strict_format"]


def test_own_dataset_never_keeps_the_task_reward_or_eval_set(tmp_path):
    data = tmp_path / "d.jsonl"
    data.write_text('{"prompt": "x", "answer": "1"}\n')
    cfg = run_data.resolve_run(apply_overrides(Config(), [f"data.dataset={data}"]))  # data.task left at "arithmetic"
    with pytest.raises(
        ConfigError,
        match=r"^reward.functions names 'task' \(the built-in task's reward\) but the run "
        r"trains on its own data; name its reward instead",
    ):
        reward_setup.reward_specs(cfg, None)
    train, held_out = run_data.data_rows(cfg, None, None)
    assert train == [{"prompt": "x", "answer": "1"}] and held_out == []  # no arithmetic prompts
    assert cfg.rollout.max_new_tokens == 512  # the demo model on one's own data is not the demo


def test_trainer_with_train_rows_does_not_evaluate_on_arithmetic(tmp_path):
    from grpokit.train import Trainer

    def reward(completions, **kw):
        return [0.0] * len(completions)

    cfg = apply_overrides(Config(), [f"train.out={tmp_path / 'run'}", "record.sinks=[]", "record.report=false"])
    tr = Trainer(cfg, reward_funcs=[reward], train_rows=[{"prompt": "1+2=", "answer": "3"}], quiet=True)
    assert tr.eval_prompts == [] and [s.name for s in tr.runner.specs] == ["reward"]
    assert tr.cfg.data.task == "" and tr.cfg.optim.lr == 1e-6  # config.yaml says what ran


def test_preset_on_the_demo_runs_at_the_demos_scale():
    cfg = cli_config("--preset", "dapo")
    # the recipe: group 16, clip-higher, token-mean, dynamic sampling, task reward + overlong penalty
    assert (cfg.rollout.group_size, cfg.algo.clip_high, cfg.algo.aggregation, cfg.algo.dynamic_sampling) == (
        16,
        0.28,
        "token-mean",
        True,
    )
    assert cfg.reward.functions == ["task", "overlong_penalty"]
    # the run's scale: the demo's batch of 16 prompts, 8 tokens, lr 3e-4 (not 512 x 20,480 at 1e-6)
    assert (cfg.train.prompts_per_step, cfg.rollout.max_new_tokens, cfg.optim.lr) == (16, 8, 3e-4)
    # the overlong window follows max_new_tokens: max_length 8, cache round(0.2 * 8) = 2
    assert reward_setup.reward_params(cfg, "overlong_penalty") == {"max_length": 8, "cache_length": 2}


def test_paper_scale_is_one_flag_and_the_window_is_then_the_papers():
    cfg = cli_config("--preset", "dapo", "--paper-scale")
    assert (cfg.train.prompts_per_step, cfg.rollout.max_new_tokens, cfg.optim.lr) == (512, 20480, 1e-6)
    # DAPO: L_max = 20,480 and L_cache = 4,096 = 0.2 * 20,480
    assert reward_setup.reward_params(cfg, "overlong_penalty") == {"max_length": 20480, "cache_length": 4096}
    with pytest.raises(ConfigError, match="--paper-scale applies a preset's"):
        cli_config("--paper-scale")


def test_user_settings_win_over_a_preset_and_the_window_can_be_set():
    cfg = cli_config(
        "--preset",
        "dapo",
        "algo.clip_high=0.3",
        "rollout.max_new_tokens=64",
        "reward.params={overlong_penalty: {cache_length: 16}}",
    )
    assert cfg.algo.clip_high == 0.3 and cfg.rollout.max_new_tokens == 64
    assert reward_setup.reward_params(cfg, "overlong_penalty") == {"cache_length": 16, "max_length": 64}


def test_presets_use_the_runs_own_reward(tmp_path):
    data = tmp_path / "d.jsonl"
    data.write_text('{"prompt": "x", "answer": "1"}\n')
    # r1-zero: [task, strict_format] weighted [1.0, 0.5]; the user's reward takes the place of "task"
    cfg = cli_config("--preset", "r1-zero", f"data.dataset={data}", "reward.functions=[math_accuracy]")
    assert (cfg.reward.functions, cfg.reward.weights) == (["math_accuracy", "strict_format"], [1.0, 0.5])
    # two functions of the user's, weighted 2 and 1: each times the preset's 1.0 for "task"
    cfg = cli_config(
        "--preset",
        "r1-zero",
        f"data.dataset={data}",
        "reward.functions=[math_accuracy,tag_count]",
        "reward.weights=[2,1]",
    )
    assert (cfg.reward.functions, cfg.reward.weights) == (
        ["math_accuracy", "tag_count", "strict_format"],
        [2.0, 1.0, 0.5],
    )
    cfg = cli_config("--preset", "dapo", f"data.dataset={data}", "reward.functions=[math_accuracy]")
    assert [s.name for s in reward_setup.reward_specs(cfg, None)] == ["math_accuracy", "overlong_penalty"]


def test_the_command_lines_preset_leaves_out_a_clip_range_the_objective_does_not_read():
    """grpokit train --preset dapo algo.objective=vespo: the command line hands the preset every unread rule,
    the objectives' declared clip fields included, so DAPO's clip_high 0.28 (which VESPO would not read) stays
    at the default and the run is not refused for a value the user never gave; the rest of DAPO fills."""
    from grpokit.validation import validate

    cfg = cli_config("--preset", "dapo", "algo.objective=vespo", "algo.ratio_level=trajectory")
    assert (cfg.algo.clip_low, cfg.algo.clip_high, cfg.algo.dynamic_sampling) == (0.2, 0.2, True)
    validate(cfg)


def test_preset_from_python_with_passed_reward_functions(tmp_path):
    cfg = Config()
    cfg.reward.functions = []  # the README's way: the passed callables are the reward
    presets.apply("dapo", cfg)
    assert cfg.reward.functions == ["overlong_penalty"] and cfg.reward.weights == [1.0]


def test_resume_keeps_the_saved_config(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    from grpokit.config.io import save_yaml

    save_yaml(run_data.resolve_run(Config()), run / "config.yaml")  # what a demo run saved
    cfg = cli_config("--resume", str(run))
    assert (cfg.rollout.max_new_tokens, cfg.optim.lr) == (8, 3e-4)
    assert load_yaml(run / "config.yaml").train.steps == 60


def test_version(capsys):

    import tomllib

    from grpokit.cli import main

    assert main(["--version"]) == 0
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert capsys.readouterr().out == f"grpokit {version}\n"


def test_train_help_shows_the_real_run_defaults(capsys):
    with pytest.raises(SystemExit):
        train_parser().parse_args(["--help"])
    out = capsys.readouterr().out
    assert "rollout.max_new_tokens = 512" in out and "optim.lr = 1e-06" in out and "--paper-scale" in out


def test_presets_command_marks_the_paper_scale(capsys):
    from grpokit.cli import main

    assert main(["presets", "dapo"]) == 0
    out = capsys.readouterr().out
    assert "    algo.clip_high = 0.28\n" in out
    assert "    train.prompts_per_step = 512   (paper scale: only with --paper-scale)\n" in out
    assert "overlong_penalty: {" not in out  # no fixed window: it follows max_new_tokens


def test_a_preset_with_resume_is_accepted_where_it_changes_nothing_and_refused_otherwise(tmp_path):
    """A job that passes the same line on every start (--preset dapo, its own reward, --resume RUN) resumes with
    the config it started with: the preset is not applied a second time (the reward list was once doubled). A
    preset the run did not start from, or whose fields the start's line changed, is refused in one sentence:
    applied to a resumed config it used to fill only what config.yaml lacked, half a recipe."""
    from grpokit.config.io import save_yaml

    def start(run, *line):
        run.mkdir()
        cfg = cli_config(*line, "--out", str(run))
        save_yaml(cfg, run / "config.yaml")  # what the run's start saved
        return cfg

    line = ("--preset", "dapo", "reward.functions=[math_accuracy]")
    first = start(tmp_path / "job", *line)
    again = cli_config(*line, "--resume", str(tmp_path / "job"))
    assert again.reward.functions == first.reward.functions == ["math_accuracy", "overlong_penalty"]
    assert again.reward.weights == first.reward.weights and again.algo.clip_high == 0.28

    start(tmp_path / "plain")
    with pytest.raises(ConfigError) as e:
        cli_config("--resume", str(tmp_path / "plain"), "--preset", "dapo")
    assert str(e.value).startswith(
        "--preset dapo with --resume of a run whose config differs from it: rollout.group_size=8 (the preset: 16), "
        "algo.clip_high=0.2 (the preset: 0.28), "
    )
    assert str(e.value).endswith(
        "...; a preset applies at a run's start, so drop --preset (the run keeps its own config), give the fields "
        "to change as overrides (kept in config_history.yaml), or start a new run"
    )

    start(tmp_path / "own", *line, "algo.clip_high=0.3")  # the start's line changed one of the preset's fields
    with pytest.raises(ConfigError, match=r"differs from it: algo.clip_high=0.3 \(the preset: 0.28\); a preset"):
        cli_config(*line, "--resume", str(tmp_path / "own"))
    assert cli_config(*line, "algo.clip_high=0.3", "--resume", str(tmp_path / "own")).algo.clip_high == 0.3


def test_a_preset_fills_no_data_field_that_domains_replace(tmp_path):
    """smollm2-math carries data.task and data.task_params, which data.domains replace (each domain has its own,
    and the run's are refused beside them): a run with domains gets neither from it (before: both were filled,
    and the run then refused data.task_params, which the user never set), and its inherited data.eval_size (200)
    and the rest of the recipe as ever. Resumed with the same line, the preset changes nothing."""
    from grpokit.config.io import save_yaml
    from grpokit.train.domain_setup import refuse_beside_domains

    line = ("--preset", "smollm2-math", "data.domains.add.task=arithmetic", "--out", str(tmp_path / "run"))
    cfg = cli_config(*line)
    assert cfg.data.task == "arithmetic" and cfg.data.task_params == {}  # Config()'s, not the preset's
    assert cfg.data.eval_size == 200 and cfg.rollout.group_size == 8
    refuse_beside_domains(cfg, own_rows=False)
    cfg.data.task = ""  # as settle_domains saves it
    (tmp_path / "run").mkdir()
    save_yaml(cfg, tmp_path / "run" / "config.yaml")
    assert cli_config(*line, "--resume", str(tmp_path / "run")).data.domains == {"add": {"task": "arithmetic"}}
