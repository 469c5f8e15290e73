"""Held-out evaluation counts only what it can grade: a prompt whose gold does not parse is left out of
accuracy and reward and counted as ``ungraded``, never scored wrong; held-out golds are checked at load."""

import math

import pytest
import torch

from grpokit.config import Config
from grpokit.config.sections import ConfigError
from grpokit.train.evaluate import _summary
from grpokit.train.run_data import check_gold_answers
from grpokit.types import Prompt
from helpers.reward_columns import spy_reward_columns


def test_an_ungraded_prompt_is_left_out_of_accuracy_and_reward_and_counted():
    prompts = [Prompt(text=str(i), ids=[i], columns={"kind": k}) for i, k in enumerate(["a", "a", "b", "b"])]
    nan = float("nan")
    out = _summary(prompts, [1.0, nan, 0.5, 0.0], [1.0, nan, 0.0, 0.0], [2, 4, 6, 8], [], [])
    # graded: prompts 0, 2, 3 -> accuracy 1/3 (only prompt 0 has full reward), reward (1 + 0.5 + 0) / 3 = 0.5;
    # before, the NaN counted 0: accuracy 1/4, reward 1.5/4. Lengths are every prompt's: 20 / 4 = 5.
    assert out["accuracy"] == pytest.approx(1 / 3) and out["reward"] == pytest.approx(0.5)
    assert (out["n"], out["ungraded"], out["mean_length"]) == (4.0, 1.0, 5.0)
    assert out["reward_a"] == 1.0 and out["reward_b"] == 0.25  # kind a: prompt 0 only; kind b: (0.5 + 0) / 2
    none = _summary(prompts[:1], [nan], [nan], [3], [], [])
    assert math.isnan(none["accuracy"]) and math.isnan(none["reward"]) and none["ungraded"] == 1.0


def _math_cfg() -> Config:
    cfg = Config()
    cfg.reward.functions = ["math_accuracy"]
    return cfg


def test_held_out_golds_are_checked_at_load_like_the_training_ones(capsys):
    rows = [{"prompt": "a", "answer": "70"}, {"prompt": "b", "answer": "???"}]
    check_gold_answers(_math_cfg(), rows, held_out=True)
    assert capsys.readouterr().out.startswith(
        "grpokit: warning: held-out data: 1 of 2 gold answers do not parse and will be skipped: #1 '???'"
    )
    with pytest.raises(ConfigError) as e:
        check_gold_answers(_math_cfg(), rows[1:] * 2, held_out=True)
    assert str(e.value).startswith("math_accuracy: none of the 2 held-out gold answers parses (")
    assert str(e.value).endswith("check data.answer_column and data.eval_dataset")
    check_gold_answers(_math_cfg(), [], held_out=True)  # no held-out set: nothing to check


def test_held_out_sampling_is_the_runs_own_at_temperature_0():
    from grpokit.rollout.sampling import SamplingParams
    from grpokit.train.evaluate import held_out_params

    cfg = Config()
    r = cfg.rollout
    r.max_new_tokens, r.stop, r.repetition_penalty, r.temperature, r.top_k = 24, ["</answer>"], 1.1, 0.7, 20
    # everything the rollout section says, but greedy (top-k is moot at temperature 0)
    assert held_out_params(r) == SamplingParams(
        max_new_tokens=24, temperature=0.0, top_k=20, stop=("</answer>",), repetition_penalty=1.1
    )


def test_the_held_out_evaluation_ends_completions_at_the_runs_stop_strings(tiny_model_dir, tmp_path):
    from grpokit.train import Trainer
    from helpers.runs import ROWS, tiny_cfg

    seen: list[str] = []

    def record(completions, **kw):
        seen.extend(completions)
        return [0.0] * len(completions)

    def held_out_completions(stop: str, out: str) -> list[str]:
        over = {"rollout.max_new_tokens": 12, "rollout.stop": f"[{stop!r}]" if stop else "[]"}
        cfg = tiny_cfg(tiny_model_dir, tmp_path / out, **over)
        cfg.data.dataset = ""
        tr = Trainer(cfg, reward_funcs=[record], train_rows=ROWS, eval_rows=ROWS[:4], quiet=True)
        seen.clear()
        tr._evaluate()  # the evaluation train() runs before the first step and after the last
        return list(seen)

    free = held_out_completions("", "free")
    stop = next(c[1] for c in free if len(c) > 2)  # the second character of a greedy completion
    # greedy is deterministic: with the stop string, each completion is the free one cut after its first stop
    # (kept, as training keeps it); before, the evaluation ignored rollout.stop and returned `free` again
    want = [c[: c.index(stop) + len(stop)] if stop in c else c for c in free]
    assert held_out_completions(stop, "stopped") == want != free


def test_the_held_out_evaluation_decodes_with_the_runs_generation_kwargs(tiny_model_dir, tmp_path):
    from grpokit.train import Trainer
    from helpers.runs import ROWS, tiny_cfg

    seen: list[str] = []

    def record(completions, **kw):
        seen.extend(completions)
        return [0.0] * len(completions)

    def held_out_completions(out: str, **over) -> list[str]:
        cfg = tiny_cfg(tiny_model_dir, tmp_path / out, **{"rollout.max_new_tokens": 12, **over})
        cfg.data.dataset = ""
        if over:  # what a run samples with: transformers' generate() and a setting only it has
            cfg.rollout.generation_kwargs = {"no_repeat_ngram_size": 1}
        tr = Trainer(cfg, reward_funcs=[record], train_rows=ROWS, eval_rows=ROWS[:4], quiet=True)
        seen.clear()
        tr._evaluate()  # the evaluation train() runs before the first step and after the last
        return list(seen)

    free = held_out_completions("free")
    assert any(len(set(c)) < len(c) for c in free)  # the tiny model's greedy completions repeat characters
    # no_repeat_ngram_size=1: no token twice in a sequence (one character a token), as training's completions;
    # before, the held-out evaluation decoded with grpokit's own loop and no generation_kwargs: `free` again
    banned = held_out_completions("generate", **{"rollout.engine": "generate"})
    assert banned != free and all(len(set(c)) == len(c) for c in banned)


def test_the_held_out_evaluation_hands_its_grader_no_prompt_column(monkeypatch):
    """The column "prompt" (rewards/inputs.py row_prompts, TRL's inputs[i]["prompt"]) is read only by a TRL
    _calculate_rewards override, training's runner (trl/contract/stages.py TrlRewards); the held-out grader is a
    plain RewardRunner, which passes it to no function (rewards/spec.py passed_columns). Before, the evaluation
    built it for every chunk under reward.convention=trl anyway; now its columns are the rows' own."""
    from grpokit.rewards.runner import RewardRunner
    from grpokit.rewards.spec import RewardSpec
    from grpokit.rollout.sampling import SamplingParams
    from grpokit.train.evaluate import _score_chunk
    from grpokit.types import Rollout

    seen = spy_reward_columns(monkeypatch)
    chunk = [Prompt(text="q", ids=[1], columns={"answer": "7"}, raw=[{"role": "user", "content": "q"}])]

    def sample(ids, G, params, vision=None):
        return Rollout([[1]], [[2]], [[0.0]], ["eos"], 1)

    class Tok:
        def decode(self, ids, skip_special_tokens=True):
            return "7"

    def right(completions, answer, **kw):  # TRL's convention: one assistant message per completion
        return [float(c[0]["content"] == a) for c, a in zip(completions, answer)]

    with RewardRunner([RewardSpec(right, "right")], num_workers=0, convention="trl") as runner:
        scored = _score_chunk(chunk, sample, None, SamplingParams(), Tok(), runner, "trl")
    assert scored.rewards == [1.0] and seen == [{"answer": ["7"]}]  # before: {"answer": [...], "prompt": [...]}


def test_the_held_out_evaluation_decodes_with_the_runs_own_hf_engine_and_its_own_generator(
    tiny_model_dir, tmp_path, monkeypatch
):
    # rollout.backend=hf: the engine sampling the run is the hf engine the evaluation decodes with, built once when
    # the run is (before: a new one at every evaluation); its draws come from a generator of the evaluation's own,
    # so training's sampling RNG is where it was and a resumed run samples as the uninterrupted one
    from grpokit.train import Trainer, engines
    from helpers.runs import ROWS, tiny_cfg

    cfg = tiny_cfg(tiny_model_dir, tmp_path / "run", **{"rollout.max_new_tokens": 4})
    cfg.data.dataset = ""
    tr = Trainer(
        cfg,
        reward_funcs=[lambda completions, **kw: [0.0] * len(completions)],
        train_rows=ROWS,
        eval_rows=ROWS[:2],
        quiet=True,
    )
    assert tr.engine is tr.hf
    built, samplers = [], []
    monkeypatch.setattr(engines, "hf_engine", lambda *a, **kw: built.append(a))
    turn_sampler = tr.hf.turn_sampler
    monkeypatch.setattr(tr.hf, "turn_sampler", lambda *a: samplers.append(a) or turn_sampler(*a))
    state = tr.generator.get_state()
    tr._evaluate()
    assert built == [] and len(samplers) == 1 and samplers[0][1] is not tr.generator
    assert torch.equal(tr.generator.get_state(), state)
