"""What a run reads of its data settings, decided where the rows are: a task beside one's own rows
(train/run_data.py resolve_run) and a periodic evaluation with no held-out rows (refuse_idle_evaluation)."""

import pytest

from grpokit.config import Config, ConfigError, apply_overrides
from grpokit.train.run_data import data_rows, refuse_idle_evaluation, resolve_run


def test_a_task_chosen_beside_ones_own_rows_is_refused():
    """data.dataset (or rows passed to the Trainer) replaces the task; a task other than the default beside it
    would be dropped unseen. The default, which nobody chose, is not refused."""
    with pytest.raises(ConfigError) as e:
        resolve_run(apply_overrides(Config(), ["data.task=calculator", "data.dataset=t.jsonl"]))
    assert str(e.value) == (
        "data.task='calculator' has no effect with data.dataset='t.jsonl', which replace the task's rows, reward and "
        "held-out set; leave data.task out, or data.dataset empty to train on the task"
    )
    with pytest.raises(ConfigError, match=r"^data.task='calculator' has no effect with the rows passed to the"):
        resolve_run(apply_overrides(Config(), ["data.task=calculator"]), own_rows=True)
    assert resolve_run(apply_overrides(Config(), ["data.dataset=t.jsonl"])).data.task == ""


def test_a_periodic_evaluation_without_held_out_rows_is_refused(tmp_path):
    """Before: data.dataset without data.eval_dataset and train.eval_every=1 ran, evaluated nothing
    (summary.json's eval_before and eval_after {}), exit 0."""
    data = tmp_path / "t.jsonl"
    data.write_text('{"prompt": "1+1=", "answer": "2"}\n')
    cfg = resolve_run(apply_overrides(Config(), [f"data.dataset={data}", "train.eval_every=1"]))
    _, held_out = data_rows(cfg, None, None)
    assert held_out == []
    with pytest.raises(ConfigError) as e:
        refuse_idle_evaluation(cfg, held_out)
    assert str(e.value) == (
        "train.eval_every=1 evaluates nothing: the run has no held-out rows (one's own data evaluates only "
        "data.eval_dataset); set data.eval_dataset (or pass eval rows) and data.eval_size > 0, or leave "
        "train.eval_every 0"
    )
    task = apply_overrides(Config(), ["data.eval_size=0", "train.eval_every=2"])
    with pytest.raises(ConfigError, match=r"^train.eval_every=2 evaluates nothing: .* \(data.eval_size=0\);"):
        refuse_idle_evaluation(task, data_rows(task, None, None)[1])
    refuse_idle_evaluation(apply_overrides(Config(), ["train.eval_every=2"]), [{"prompt": "p"}])  # rows: accepted
    cfg.train.eval_every = 0
    refuse_idle_evaluation(cfg, [])  # no periodic evaluation asked: nothing to refuse


def test_a_trainer_with_a_periodic_evaluation_and_no_held_out_rows_is_refused_before_training():
    from grpokit.train.loop import Trainer

    rows = [{"prompt": f"{a}+{a}=", "answer": str(2 * a)} for a in range(4)]
    cfg = apply_overrides(Config(), ["train.eval_every=1", "train.steps=1", "record.sinks=[]"])
    with pytest.raises(ConfigError, match=r"^train.eval_every=1 evaluates nothing"):
        Trainer(cfg, train_rows=rows, reward_funcs=[lambda completions, **kw: [0.0] * len(completions)])
