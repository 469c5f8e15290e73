"""One table (config/data_sources.py SOURCE_FIELDS) says which data.* fields each source of rows reads; a field
only unused sources read is refused in one sentence (before: data.split=validation with the built-in task, or
data.task_params beside data.dataset, trained the same weights and exited 0)."""

import dataclasses

import pytest

from grpokit.config import Config, ConfigError, DataConfig, apply_overrides
from grpokit.config.data_sources import SOURCE_FIELDS, sources, unread_fields
from grpokit.validation import validate


def test_the_table_names_data_fields_and_what_each_source_leaves_unread():
    names = {f.name for f in dataclasses.fields(DataConfig)}
    assert {n for fields in SOURCE_FIELDS.values() for n in fields} <= names
    task = DataConfig()  # data.task=arithmetic, nothing else: the task reads task_params only
    assert sources(task) == ("task",)
    assert unread_fields(task) == {
        "split": ("dataset",),
        "prompt_column": ("dataset", "eval_dataset"),
        "answer_column": ("dataset", "eval_dataset"),
        "eval_split": ("eval_dataset",),
    }
    own = DataConfig(dataset="t.jsonl")  # the file's split and columns read; the task's params and eval_split not
    assert sources(own) == ("dataset",)
    assert unread_fields(own) == {"task_params": ("task",), "eval_split": ("eval_dataset",)}
    held = DataConfig(eval_dataset="e.jsonl")  # the task plus a held-out file: its columns and split are read
    assert unread_fields(held) == {"split": ("dataset",)}
    rows = DataConfig(task="")  # rows passed to the Trainer: none of them read
    assert sources(rows) == () and set(unread_fields(rows)) == {
        "task_params",
        "split",
        "prompt_column",
        "answer_column",
        "eval_split",
    }
    assert unread_fields(DataConfig(domains={"a": {"task": "arithmetic"}})) == {}  # BESIDE_DOMAINS governs


CASES = [  # (the settings, the sentence); the repro's data.split, eval_split and columns beside the built-in task
    (
        ["data.split=validation"],
        "data.split='validation' has no effect with the built-in task 'arithmetic' (only data.dataset reads it); "
        "use that, or leave it 'train'",
    ),
    (
        ["data.eval_split=dev"],
        "data.eval_split='dev' has no effect with the built-in task 'arithmetic' and no data.eval_dataset (only "
        "data.eval_dataset reads it); use that, or leave it 'test'",
    ),
    (
        ["data.prompt_column=question"],
        "data.prompt_column='question' has no effect with the built-in task 'arithmetic' and no data.eval_dataset "
        "(only data.dataset or data.eval_dataset reads it); use that, or leave it 'prompt'",
    ),
    (
        ["data.dataset=t.jsonl", "data.task_params={min_terms: 3}"],
        "data.task_params={'min_terms': 3} has no effect with data.dataset='t.jsonl' (only a built-in task "
        "(data.task, with data.dataset empty) reads it); use that, or leave it {}",
    ),
    (
        ["data.dataset=t.jsonl", "data.eval_split=dev"],
        "data.eval_split='dev' has no effect with data.dataset='t.jsonl' and no data.eval_dataset (only "
        "data.eval_dataset reads it); use that, or leave it 'test'",
    ),
    (
        ["data.task=", "data.answer_column=sol"],
        "data.answer_column='sol' has no effect with the rows passed to the Trainer and no data.eval_dataset (only "
        "data.dataset or data.eval_dataset reads it); use that, or leave it 'answer'",
    ),
]


@pytest.mark.parametrize("settings, sentence", CASES, ids=[" ".join(c[0]) for c in CASES])
def test_a_data_field_of_a_source_not_in_use_is_refused(settings, sentence, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "t.jsonl").write_text('{"prompt": "1+1=", "answer": "2"}\n')
    with pytest.raises(ConfigError) as e:
        validate(apply_overrides(Config(), settings))
    assert str(e.value) == sentence


def test_the_same_fields_are_accepted_where_their_source_reads_them(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "t.jsonl").write_text('{"q": "1+1=", "a": "2"}\n')
    validate(apply_overrides(Config(), ["data.dataset=t.jsonl", "data.split=validation", "data.prompt_column=q"]))
    validate(apply_overrides(Config(), ["data.eval_dataset=t.jsonl", "data.eval_split=dev", "data.answer_column=a"]))
    validate(apply_overrides(Config(), ["data.task=reasoning_gym:chain_sum", "data.task_params={min_terms: 3}"]))
    validate(apply_overrides(Config(), ["data.split=train", "data.eval_split=test"]))  # the defaults: nothing asked


def test_a_preset_fills_no_data_field_of_a_source_the_run_does_not_use(tmp_path, monkeypatch):
    """smollm2-math sets data.task and data.task_params: a run on data.dataset gets neither (before: the preset's
    task_params would be refused, a value the user never gave), and still the rest of the recipe."""
    from grpokit.config import presets
    from grpokit.train.run_data import resolve_run

    monkeypatch.chdir(tmp_path)
    (tmp_path / "t.jsonl").write_text('{"prompt": "1+1=", "answer": "2"}\n')
    cfg = presets.apply("smollm2-math", apply_overrides(Config(), ["data.dataset=t.jsonl"]))
    assert (cfg.data.task, cfg.data.task_params, cfg.rollout.group_size) == ("arithmetic", {}, 8)
    # its train.eval_every=6 neither: no data.eval_dataset, no held-out rows (before: refused at build, naming a
    # field the user never set); with one it is filled
    assert cfg.train.eval_every == 0
    held = ["data.dataset=t.jsonl", "data.eval_dataset=t.jsonl"]
    assert presets.apply("smollm2-math", apply_overrides(Config(), held)).train.eval_every == 6
    validate(resolve_run(cfg))
    assert cfg.data.task == ""
