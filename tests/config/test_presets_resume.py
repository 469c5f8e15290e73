"""presets.plan is the one account of what a preset fills in a run: presets.apply sets its fields at a run's start,
presets.resumed holds a resumed run to them (before, resumed recomputed the preset's values, the merge of the
user's reward functions and the fields left unread beside apply, a second copy of its rules). For every preset
and a set of command lines, the config a start gives resumes with the same line unchanged, and a run differing in
any one field plan fills is refused naming that field."""

import copy

import pytest

from grpokit.config import Config, ConfigError, apply_overrides, presets
from grpokit.config.io import assigned, to_dict
from grpokit.validation import unread_rules

LINES = [
    (),  # Config()'s own: every recipe field filled
    ("reward.functions=[math_accuracy]",),  # the user's reward in "task"'s place (weights, judge: dapo's [task])
    ("data.curriculum=frontier",),  # a reader of reward.judge: dapo fills its judge with dynamic sampling off too
    ("algo.beta=0.04", "algo.dynamic_sampling=false"),  # trl-default's KL settings read; dapo's judge not
    ("data.domains.add.task=arithmetic",),  # smollm2-math's task and task_params left to the domains
    ("data.task=", "data.dataset=train.jsonl", "algo.entropy_coef=0.01"),  # a task's fields unread; an entropy bonus
]


def _value(cfg, dotted):
    section, name = dotted.split(".", 1)
    return getattr(getattr(cfg, section), name)


@pytest.mark.parametrize("line", LINES, ids=lambda line: " ".join(line) or "defaults")
@pytest.mark.parametrize("name", presets.names())
def test_apply_and_resumed_agree_for_every_preset(name, line):
    for paper_scale in (False, True) if not line else (False,):
        agree(name, line, paper_scale)


def agree(name: str, line: tuple[str, ...], paper_scale: bool) -> None:
    rules = unread_rules()

    def fresh():
        return apply_overrides(Config(), list(line))

    fill = presets.plan(name, fresh(), paper_scale, rules)
    started = presets.apply(name, fresh(), paper_scale=paper_scale, rules=rules)
    assert {k: _value(started, k) for k in fill} == fill  # apply sets exactly plan's values ...
    untouched = {k for k in to_dict_flat(started) if k not in fill and k not in assigned(fresh())}
    assert all(_value(started, k) == _value(Config(), k) for k in untouched)  # ... and nothing else
    again = presets.resumed(name, copy.deepcopy(started), fresh(), paper_scale, rules)
    assert to_dict(again) == to_dict(started)
    given = assigned(fresh())
    for key in [k for k in fill if k not in given]:
        run = copy.deepcopy(started)
        section, field = key.split(".", 1)
        object.__setattr__(getattr(run, section), field, "other")  # a run that started with something else there
        with pytest.raises(ConfigError, match=rf"^--preset {name} with --resume .*: {key}='other' \(the preset: "):
            presets.resumed(name, run, fresh(), paper_scale, rules)


def to_dict_flat(cfg: Config) -> dict:
    return {f"{s}.{k}": v for s, fields in to_dict(cfg).items() for k, v in fields.items()}
