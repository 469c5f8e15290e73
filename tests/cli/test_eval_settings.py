"""grpokit eval: a run evaluated as trained, the grader named and unambiguous, overrides eval does not
read refused, and every flag checked in one sentence (cli/eval_settings.py)."""

import json
import re
import sys

import pytest

from grpokit.cli import eval as eval_cli
from grpokit.cli.eval_settings import Target, check_overrides, eval_config, grader, run_of
from grpokit.config import Config, ConfigError, presets
from grpokit.config.io import apply_overrides
from grpokit.data.tasks import get_task
from grpokit.rollout import engine as rollout_engine
from grpokit.train.resume import write_config
from grpokit.types import Rollout
from grpokit.validation import validate

CSV = "question,answer\nWhat is 3+4?,7\nWhat is 1+1?,2\nWhat is 2+5?,7\n"


def _run(tmp_path, *overrides):
    """A run folder as training leaves it (config.yaml, checkpoints/step-000001/model/) trained on its own CSV."""
    data = tmp_path / "d.csv"
    data.write_text(CSV)
    cfg = apply_overrides(
        Config(),
        [
            "data.task=",
            f"data.dataset={data}",
            "data.prompt_column=question",
            "reward.functions=[evalmod:always_one]",
            "rollout.max_new_tokens=7",
            "rollout.temperature=0.5",
            "rollout.top_k=5",
            *overrides,
        ],
    )
    run = tmp_path / "run"
    (run / "checkpoints" / "step-000001" / "model").mkdir(parents=True)
    write_config(run, cfg, None)
    return run, data


def _settings(argv, run):
    return eval_config(eval_cli.parse_args(argv), "m", run)


def test_a_checkpoint_knows_its_run(tmp_path):
    run, _ = _run(tmp_path)
    step = run / "checkpoints" / "step-000001"
    assert run_of(step / "model") == run and run_of(step) == run
    assert run_of(tmp_path) is None and run_of(tmp_path / "elsewhere" / "model") is None


def test_a_run_is_evaluated_on_its_own_data_grader_and_sampling(tmp_path, capsys):
    run, data = _run(tmp_path)
    cfg, sampling, target = _settings(["--model", str(run)], run)
    # the run's own CSV (read whole, at the run's own data.split), its prompt column, its first reward, its sampling
    assert target == Target(task=None, dataset=str(data), split="train", reward="evalmod:always_one")
    assert cfg.data.prompt_column == "question" and cfg.data.task == ""
    assert (sampling.max_new_tokens, sampling.temperature, sampling.top_k, sampling.top_p) == (7, 0.5, 5, 1.0)
    assert "has no held-out set (data.eval_dataset is empty), so its training data" in capsys.readouterr().err
    # flags override the run's settings one by one
    argv = ["--model", str(run), "--task", "arithmetic", "--temperature", "0", "--k", "1"]
    cfg, sampling, target = _settings(argv, run)
    assert target == Target(task="arithmetic", dataset=None, split=None, reward="task")
    assert (sampling.temperature, sampling.max_new_tokens) == (0.0, 7)  # 0: greedy, valid for evaluation


def test_a_runs_held_out_set_is_what_it_evaluated(tmp_path):
    held = tmp_path / "held.jsonl"
    held.write_text('{"question": "What is 2+2?", "answer": "4"}\n')
    run, _ = _run(tmp_path, f"data.eval_dataset={held}")
    _, _, target = _settings(["--model", str(run)], run)
    assert target == Target(task=None, dataset=str(held), split="test", reward="evalmod:always_one")


def test_without_a_run_the_defaults_stay(tmp_path):
    cfg, sampling, target = _settings([], None)
    assert target == Target(task="arithmetic", dataset=None, split=None, reward="task")
    assert (sampling.max_new_tokens, sampling.temperature, sampling.top_p) == (16, 1.0, 1.0)


def test_reward_grades_on_a_tasks_rows_too(tmp_path, monkeypatch):
    (tmp_path / "evalmod.py").write_text("def always_one(completions, **kw):\n    return [1.0 for _ in completions]\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    cfg, _, target = _settings(["--reward", "evalmod:always_one"], None)
    assert target == Target(task="arithmetic", dataset=None, split=None, reward="evalmod:always_one")
    assert grader(cfg, explicit=True)(completions=["x"]) == [1.0]
    cfg, _, _ = _settings([], None)
    assert grader(cfg, explicit=False) is get_task("arithmetic").reward_fn
    monkeypatch.delitem(sys.modules, "evalmod", raising=False)


def _scripted(monkeypatch, answer_of):
    """generate replaced by a script: every completion is <answer>answer_of(gold)</answer>."""
    rows = get_task("arithmetic").held_out_rows(2)

    def fake_generate(model, prompt_ids, n, params, *, eos_token_ids, pad_token_id, generator=None, decode=None, **kw):
        from grpokit.config import ModelConfig
        from grpokit.train.models import load_tokenizer

        tok = load_tokenizer(ModelConfig())
        texts = [f"<answer>{answer_of(rows[p]['answer'])}</answer>" for p in range(len(prompt_ids)) for _ in range(n)]
        ids = [tok(t)["input_ids"] + [tok.eos_token_id] for t in texts]
        return Rollout(prompt_ids, ids, [[0.0] * len(i) for i in ids], ["eos"] * len(ids), n)

    monkeypatch.setattr(rollout_engine, "generate", fake_generate)


def test_the_given_reward_grades_not_the_tasks_verifier(monkeypatch, tmp_path):
    (tmp_path / "evalmod2.py").write_text("def always_one(completions, **kw):\n    return [1.0 for _ in completions]\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    _scripted(monkeypatch, lambda gold: int(gold) + 1)  # every answer wrong by one
    out = tmp_path / "r.json"
    # the task's verifier: 0 of 2 right on both prompts -> pass@1 = 0; always_one: 2 of 2 -> pass@1 = 1
    assert eval_cli.main(["--limit", "2", "--k", "1,2", "--out", str(out)]) == 0
    assert json.loads(out.read_text())["pass@1"] == 0.0
    assert eval_cli.main(["--limit", "2", "--k", "1,2", "--reward", "evalmod2:always_one", "--out", str(out)]) == 0
    res = json.loads(out.read_text())
    assert (res["pass@1"], res["reward"], res["task"]) == (1.0, "evalmod2:always_one", "arithmetic")


@pytest.mark.parametrize(
    "override, message",
    [
        ("rollout.max_new_tokens=1", "grpokit eval sets rollout.max_new_tokens with --max-new-tokens, not an override"),
        ("rollout.temperature=0.01", "sets rollout.temperature with --temperature, not an override"),
        ("rollout.generation_kwargs={}", "sets rollout.generation_kwargs with --generation-kwargs, not an override"),
        ("data.task=calculator", "sets data.task with --task"),
        ("data.eval_dataset=x.jsonl", "sets data.eval_dataset with --dataset"),
        ("reward.functions=[x:y]", "sets reward.functions with --reward"),
        ("train.seed=3", "sets train.seed with --seed"),
        ("rollout.group_size=4", "grpokit eval does not read rollout.group_size (it reads model.{dtype"),
        ("algo.beta=0.1", "grpokit eval does not read algo.beta"),
        ("data.shuffle=false", "grpokit eval does not read data.shuffle"),
        ("model.lora_rank=4", "grpokit eval does not read model.lora_rank"),
    ],
)
def test_overrides_eval_does_not_read_are_refused(override, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        check_overrides([override])


def test_a_run_is_evaluated_with_its_generation_kwargs_unless_the_flag_gives_others(tmp_path, monkeypatch, capsys):
    # a run sampled by transformers' generate() with no_repeat_ngram_size 2: eval decodes the same way and says so
    # (before: grpokit's own loop without them, silently)
    run, _ = _run(tmp_path, "rollout.engine=generate", "rollout.generation_kwargs={no_repeat_ngram_size: 2}")
    assert _settings(["--model", str(run)], run)[1].engine == "generate"
    assert _settings(["--model", str(run)], run)[1].generation_kwargs == {"no_repeat_ngram_size": 2}
    none = _settings(["--model", str(run), "--generation-kwargs", "{}"], run)[1]  # '{}': grpokit's own loop
    assert (none.engine, none.generation_kwargs) == ("auto", {})
    beams = _settings(["--generation-kwargs", '{"num_beams": 2}', "--k", "1"], None)[1]  # without a run too
    assert (beams.engine, beams.generation_kwargs) == ("generate", {"num_beams": 2})
    # each one a sentence: not JSON, a key with a flag of its own, a key generate() would not read, and repeated
    # greedy completions (do_sample false) as k > 1 samples
    for argv, message in (
        (["--generation-kwargs", "[1]"], "--generation-kwargs '[1]' is not a JSON object; give one, e.g. "),
        (["--generation-kwargs", '{"temperature": 1}'], "--generation-kwargs keys ['temperature'] are set elsewhere"),
        (["--generation-kwargs", '{"num_beam": 2}'], "--generation-kwargs key 'num_beam' is not a setting of "),
        (["--generation-kwargs", '{"do_sample": false}'], "--generation-kwargs {'do_sample': False} decodes without "),
    ):
        with pytest.raises(ConfigError, match="^" + re.escape(message)):
            _settings(argv, None)
    # what the sampler is handed, and the output's line
    seen = []
    _scripted(monkeypatch, lambda gold: gold)
    scripted = rollout_engine.generate
    monkeypatch.setattr(rollout_engine, "generate", lambda *a, **kw: seen.append(kw) or scripted(*a, **kw))
    argv = ["--limit", "1", "--k", "1", "--generation-kwargs", '{"no_repeat_ngram_size": 3}']
    assert eval_cli.main(argv) == 0
    assert seen and all(
        (kw["engine"], kw["generation_kwargs"]) == ("generate", {"no_repeat_ngram_size": 3}) for kw in seen
    )
    assert "new tokens, generate() with {'no_repeat_ngram_size': 3}" in capsys.readouterr().out


def test_no_generation_kwargs_keep_the_runs_own_decoder(tmp_path):
    # '{}' drops generate()'s settings: a run on generate() is evaluated by grpokit's own loop ("auto"), one on the
    # static or dynamic decoder keeps it (before: "auto" whatever the run used)
    for engine, expected in (("static", "static"), ("dynamic", "dynamic"), ("generate", "auto")):
        (tmp_path / engine).mkdir()
        run, _ = _run(tmp_path / engine, f"rollout.engine={engine}")
        assert _settings(["--model", str(run), "--generation-kwargs", "{}"], run)[1].engine == expected, engine
        assert _settings(["--model", str(run)], run)[1].engine == engine  # without the flag: the run's


def test_overrides_eval_reads_pass():
    check_overrides(["data.system_prompt=Be brief.", "model.dtype=float32", "env.max_turns=2", "reward.params={}"])


def test_columns_are_a_datasets_and_task_params_a_tasks(tmp_path):
    with pytest.raises(ConfigError) as e:
        _settings(["data.prompt_column=q"], None)
    assert str(e.value) == (
        "data.prompt_column is read only with data.dataset or data.eval_dataset, but grpokit eval evaluates the "
        "held-out rows of the task 'arithmetic'; leave it out"
    )
    run, data = _run(tmp_path)
    with pytest.raises(ConfigError) as e:
        _settings(["--model", str(run), "data.task_params.x=1"], run)
    assert str(e.value) == (
        "data.task_params.x is read only with a built-in task (data.task, with data.dataset empty), but grpokit eval "
        f"evaluates the dataset {data}; leave it out"
    )
    with pytest.raises(ConfigError, match="reward.params is not read: the task's verifier grades"):
        _settings(["reward.params.task={}"], None)


@pytest.mark.parametrize("rows", ["task", "dataset"])
def test_which_row_overrides_eval_refuses_is_the_data_sources_table(tmp_path, rows, monkeypatch):
    """Every data.* field eval takes as an override and config/data_sources.py's SOURCE_FIELDS gives a source: read
    where the evaluated rows' source reads it (a task's: data.task_params; a dataset's: the two columns), refused
    elsewhere. The table decides, so a field it gives to one source is refused for the others' rows: with
    data.system_prompt made a task's alone (a change of the table only), eval refuses it beside a dataset's rows
    (before, eval's own two rows of the table let it through)."""
    from grpokit.cli.eval_settings import READ
    from grpokit.config import data_sources

    data = tmp_path / "d.csv"
    data.write_text(CSV)
    base = ["--dataset", str(data), "--reward", "evalmod:always_one"] if rows == "dataset" else []
    source = "dataset" if rows == "dataset" else "task"
    table = {**data_sources.SOURCE_FIELDS, "task": ("task_params", "system_prompt")}
    monkeypatch.setattr(data_sources, "SOURCE_FIELDS", table)
    values = {"task_params": "{}", "prompt_column": "question", "answer_column": "answer", "system_prompt": "Hi."}
    for field in {f for fields in table.values() for f in fields} & set(READ["data"]):
        if field in table[source] or (source == "dataset" and field in table["eval_dataset"]):
            _settings([*base, f"data.{field}={values[field]}"], None)
        else:
            with pytest.raises(ConfigError, match=rf"^data\.{field} is read only with .*, but grpokit eval evaluates"):
                _settings([*base, f"data.{field}={values[field]}"], None)


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--temperature", "-1"], "--temperature -1.0 must be >= 0 (0 = greedy)"),
        (["--max-new-tokens", "0"], "--max-new-tokens 0 must be at least 1"),
        (["--top-p", "0"], "--top-p 0.0 must be in (0, 1]"),
        (["--top-k", "-1"], "--top-k -1 must be >= 0 (0 = off)"),
        (["--min-p", "1"], "--min-p 1.0 must be in [0, 1)"),
        (["--repetition-penalty", "0"], "--repetition-penalty 0.0 must be > 0 (1.0 = off)"),
        (["--stop", ""], "--stop '' is empty, so every completion would stop at once"),
        (["--limit", "-5"], "--limit -5 must be >= 0 (0 = all prompts)"),
        (["--samples", "-2"], "--samples -2 must be >= 1, or 0 for the largest k"),
        (["--k", "a"], "--k 'a' must list positive integers, e.g. 1,4,8"),
        (["--k", "0,2"], "--k '0,2' must list positive integers"),
        (["--split", "train"], "--split 'train' picks a split of --dataset, but the task 'arithmetic' is evaluated"),
        (["--task", "arithmetic", "--dataset", "x.csv"], "--task 'arithmetic' and --dataset 'x.csv' both name"),
        (["--task", ""], "--task '' evaluates --dataset instead of a task, but no --dataset is given"),
        (["--reward", "a:b", "--reward", "c:d"], "--reward is given 2 times (a:b, c:d); one function grades"),
        # greedy decoding repeats one completion: k > 1 would count it k times (before: pass@4 printed as if drawn)
        (
            ["--temperature", "0", "--k", "1,4"],
            "--temperature 0 decodes greedily, so the 4 samples of --k 1,4 would be one completion repeated, not "
            "independent draws; give --k 1 for greedy accuracy, or leave --temperature 0 out",
        ),
        (["--top-k", "1"], "--top-k 1 decodes greedily, so the 8 samples of --k 1,4,8 would be one completion"),
    ],
)
def test_each_flag_is_checked_before_any_work(argv, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        eval_cli.run_eval(eval_cli.parse_args(argv))


def test_a_runs_own_greedy_setting_is_refused_for_k_above_1(tmp_path):
    # training accepts rollout.top_k=1 (temperature 0.5 > 0): evaluated with the default --k 1,4,8, the 8 samples
    # would be one completion repeated. Before, only the flags were checked (--top-k was not given): pass@8 printed.
    run, _ = _run(tmp_path, "rollout.top_k=1")
    with pytest.raises(ConfigError) as e:
        _settings(["--model", str(run)], run)
    assert str(e.value) == (
        "the run's rollout.top_k=1 decodes greedily, so the 8 samples of --k 1,4,8 would be one completion repeated, "
        "not independent draws; give --k 1 for greedy accuracy, or give --top-k 0 for pass@k and maj@k with k > 1"
    )
    # the settings used decide: --top-k 0 samples (k = 8 is valid), --k 1 is greedy accuracy (valid)
    assert _settings(["--model", str(run), "--top-k", "0"], run)[1].top_k == 0
    assert _settings(["--model", str(run), "--k", "1"], run)[1].top_k == 1
    # and a run that samples is refused when a flag makes it greedy, the flag named
    (tmp_path / "other").mkdir()
    run, _ = _run(tmp_path / "other")
    with pytest.raises(ConfigError, match=r"^--temperature 0 decodes greedily, so the 4 samples of --k 1,4 "):
        _settings(["--model", str(run), "--temperature", "0", "--k", "1,4"], run)


def test_a_split_of_a_local_file_is_refused(tmp_path):
    (tmp_path / "d.csv").write_text(CSV)
    cfg, _, target = _settings(["--dataset", str(tmp_path / "d.csv"), "--split", "train"], None)
    with pytest.raises(ConfigError, match=r"^--split='train' names a split, but '.*d\.csv' is a single file with no "):
        eval_cli._rows(cfg, target, "train")  # a file has no splits: only the default is read (data/prompts.py)


def test_eval_and_training_share_the_sampling_rules():
    # the same rule, named as each side names it (validation/rollout.py check_sampling)
    with pytest.raises(ConfigError, match=r"^rollout\.top_p=0\.0 must be in \(0, 1\]$"):
        validate(apply_overrides(Config(), ["rollout.top_p=0"]))
    with pytest.raises(ConfigError, match=r"^--top-p 0\.0 must be in \(0, 1\]$"):
        _settings(["--top-p", "0"], None)


def test_a_trained_run_is_evaluated_on_its_own_csv(tmp_path, monkeypatch, capsys):
    """A real run (the demo model, one step on its own CSV): eval scores its 3 rows with its own reward."""
    from grpokit.train import Trainer

    (tmp_path / "evalmod3.py").write_text("def always_one(completions, **kw):\n    return [1.0 for _ in completions]\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / "d.csv").write_text(CSV)
    run = tmp_path / "run"
    cfg = apply_overrides(
        Config(),
        [
            "data.task=",
            f"data.dataset={tmp_path / 'd.csv'}",
            "data.prompt_column=question",
            "reward.functions=[evalmod3:always_one]",
            "rollout.group_size=2",
            "rollout.max_new_tokens=4",
            "train.steps=1",
            "train.prompts_per_step=2",
            "record.sinks=[]",
            "record.report=false",
            f"train.out={run}",
        ],
    )
    Trainer(cfg, quiet=True).train()
    assert eval_cli.main(["--model", str(run), "--limit", "10", "--k", "1", "--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    # before: 10 prompts of the arithmetic task, graded by its verifier, 16 new tokens
    # now: the CSV's 3 rows, each completion given 1.0 by the run's reward -> pass@1 = 3/3 = 1.0
    assert (res["prompts"], res["dataset"], res["task"], res["reward"]) == (
        3,
        str(tmp_path / "d.csv"),
        None,
        "evalmod3:always_one",
    )
    assert (res["pass@1"], res["max_new_tokens"]) == (1.0, 4)


def test_the_runs_settings_of_rows_not_evaluated_are_dropped(tmp_path):
    """A run trained on its CSV (data.prompt_column=question) evaluated on a task's held-out rows: the column is
    read by no source of those rows (config/data_sources.py), so eval leaves it at its default instead of
    validation refusing the run's own setting; evaluated on its CSV, the column stays."""
    run, data = _run(tmp_path, "data.split=train")
    cfg, _, target = _settings(["--model", str(run), "--task", "arithmetic", "--reward", "math_accuracy"], run)
    assert (target.task, cfg.data.prompt_column, cfg.data.dataset) == ("arithmetic", "prompt", "")
    cfg, _, target = _settings(["--model", str(run)], run)
    assert (target.dataset, cfg.data.prompt_column) == (str(data), "question")


def test_a_dapo_or_edge_run_is_evaluated_by_its_grader_alone(tmp_path):
    """A run's reward section holds training's judge (reward.judge, read by dynamic sampling and EDGE-GRPO's error
    correction), but eval grades with one function under its own algo section. Before, eval copied the whole
    section and validation refused the judge nothing in eval reads ("reward.judge=['task'] has no effect unless
    algo.dynamic_sampling=true ..."): every DAPO and EDGE run. Now eval takes the grader's fields only
    (REWARD_FROM_RUN: functions, params, convention)."""
    from grpokit.algo.variants import VARIANTS

    dapo = presets.apply("dapo", apply_overrides(Config(), ["rollout.max_new_tokens=7"]))
    assert (dapo.reward.judge, dapo.algo.dynamic_sampling) == (["task"], True)
    edge = apply_overrides(Config(), VARIANTS["edge-grpo"][1])
    assert edge.reward.judge == ["task"] and edge.algo.error_correction == "gold"
    for name, trained in (("dapo", dapo), ("edge", edge)):
        run = tmp_path / name
        (run / "checkpoints" / "step-000001" / "model").mkdir(parents=True)
        write_config(run, trained, None)
        cfg, _, target = _settings(["--model", str(run)], run)
        assert target == Target(task="arithmetic", dataset=None, split=None, reward="task")
        assert cfg.reward.judge == [] and cfg.reward.functions == trained.reward.functions
        assert cfg.reward.params == trained.reward.params  # the grader's keyword arguments, as trained


def test_an_earlier_run_with_dynamic_sampling_on_is_evaluated(tmp_path):
    """The config.yaml of a run from before reward.judge (algo.dynamic_sampling_on: [task], no checksum line) is
    read with the old spelling as reward.judge; eval, which reads no judge, evaluates it (before: refused)."""
    import yaml

    from grpokit.config.io import to_dict

    old = to_dict(apply_overrides(Config(), ["algo.dynamic_sampling=true"]))
    del old["reward"]["judge"]
    old["algo"]["dynamic_sampling_on"] = ["task"]
    run = tmp_path / "run"
    (run / "checkpoints" / "step-000001" / "model").mkdir(parents=True)
    (run / "config.yaml").write_text(yaml.safe_dump(old, sort_keys=False))
    cfg, _, target = _settings(["--model", str(run)], run)
    assert target.reward == "task" and cfg.reward.judge == []
