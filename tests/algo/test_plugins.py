"""The plugin API: an advantage estimator, an objective and a token mask from the user's own
module (written here in tmp_path) run with every other stage, validate, log and resume like built-ins."""

import json
import sys
import textwrap

import pytest

from grpokit.config import Config, ConfigError
from grpokit.config.io import apply_overrides
from grpokit.train import Trainer
from grpokit.validation import validate
from helpers.runs import ROWS, killed_copy, likes_a

PLUGIN = '''
import torch
import grpokit.algo

CALLS = {"advantage": 0, "objective": 0, "mask": 0}


@grpokit.algo.register_advantage("sign_of_centred")
def sign_of_centred(ctx):
    """+1 above the group mean, -1 below, 0 at it."""
    CALLS["advantage"] += 1
    r = ctx.rewards_N.view(-1, ctx.group_size)
    adv = torch.sign(r - r.mean(dim=1, keepdim=True)).flatten()
    return adv, {"plugin/positive": float((adv > 0).float().mean())}


def plain_pg(ratio_NT, adv_NT, logp_NT, clip):
    """Unclipped importance-weighted policy gradient."""
    CALLS["objective"] += 1
    return ratio_NT * adv_NT


def first_two_tokens(ctx):
    """Train on each completion's first two tokens only."""
    CALLS["mask"] += 1
    keep = torch.zeros_like(ctx.mask_NT)
    keep[:, :2] = 1
    return ctx.mask_NT * keep
'''


@pytest.fixture
def plugin(tmp_path, monkeypatch):
    (tmp_path / "my_algo.py").write_text(textwrap.dedent(PLUGIN))
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "my_algo"
    sys.modules.pop("my_algo", None)


def _cfg(model_dir, out, steps=4):
    cfg = Config()
    return apply_overrides(
        cfg,
        [
            f"model.name_or_path={model_dir}",
            "data.task=",
            "reward.functions=[]",
            "rollout.group_size=4",
            "rollout.max_new_tokens=6",
            "train.prompts_per_step=2",
            f"train.steps={steps}",
            "train.save_every=2",
            "optim.lr=1e-2",
            "algo.num_iterations=2",
            "train.threads=1",
            "train.deterministic=true",
            "record.sinks=[jsonl]",
            "record.report=false",
            f"train.out={out}",
            "algo.advantage=my_algo:sign_of_centred",
            "algo.objective=my_algo:plain_pg",
            "algo.token_masks=[my_algo:first_two_tokens]",
        ],
    )


def _lines(run):
    return [json.loads(l) for l in (run / "metrics.jsonl").read_text().splitlines()]


def test_plugin_stages_train_log_and_resume_exactly(plugin, tiny_model_dir, tmp_path):
    ref = tmp_path / "ref"
    Trainer(_cfg(tiny_model_dir, ref), reward_funcs=[likes_a], train_rows=ROWS, eval_rows=[], quiet=True).train()
    lines = _lines(ref)
    assert len(lines) == 4 and all("plugin/positive" in l for l in lines)  # the plugin's metrics are logged
    calls = dict(sys.modules[plugin].CALLS)  # one advantage and one mask per step, mu = 2 objective calls per step
    assert calls == {"advantage": 4, "objective": 8, "mask": 4}
    saved = (ref / "config.yaml").read_text()
    assert "my_algo:sign_of_centred" in saved and "my_algo:plain_pg" in saved and "my_algo:first_two_tokens" in saved
    # "kill" after step 2: keep that checkpoint and the first two metric lines, then resume
    res = killed_copy(ref, tmp_path / "res")
    Trainer(
        _cfg(tiny_model_dir, res), reward_funcs=[likes_a], train_rows=ROWS, eval_rows=[], quiet=True, resume=res
    ).train()
    skip = ("time/", "per_second")
    strip = lambda l: {k: v for k, v in l.items() if not any(s in k for s in skip)}  # noqa: E731
    assert [strip(l) for l in _lines(res)] == [strip(l) for l in lines]  # bit-exact after resume


def test_decorator_name_selects_the_plugin(plugin):
    import importlib

    importlib.import_module(plugin)  # the decorator registers "sign_of_centred" on import
    cfg = validate(apply_overrides(Config(), ["algo.advantage=sign_of_centred"]))
    assert cfg.algo.advantage == "sign_of_centred"


@pytest.mark.parametrize(
    "override, message",
    [
        (
            "algo.advantage=nope",
            "algo.advantage='nope' is not valid; choose one of: group, process, gigpo, gagpo, gtpo, grpo_s",
        ),
        ("algo.objective=nope", "algo.objective='nope' is not valid; choose one of: clip, cispo, sapo, vespo"),
        ("algo.token_masks=[nope]", "algo.token_masks='nope' is not valid; choose one of: overlong, entropy_top"),
        (
            "algo.advantage=no_such_module_xyz:fn",
            "algo.advantage: advantage 'no_such_module_xyz:fn' could not be imported",
        ),
    ],
)
def test_unknown_stage_is_one_sentence(override, message):
    with pytest.raises(ConfigError) as e:
        validate(apply_overrides(Config(), [override]))
    assert str(e.value).startswith(message) and str(e.value).count(". ") == 0
