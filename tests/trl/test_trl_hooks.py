"""TRL's extension contract (grpokit/trl/contract/hooks.py): every method of TRL's GRPOTrainer exists on grpokit.trl's
with TRL's parameters, and a subclass's override of any of them (or of transformers' Trainer methods) is
honoured where TRL calls it, or refused at construction in one sentence naming it."""

from __future__ import annotations

import inspect

import pytest
import torch
from datasets import Dataset

from grpokit.config import ConfigError
from grpokit.trl import GRPOConfig, GRPOTrainer
from grpokit.trl.contract import hooks
from helpers.trl_models import small_args

DATA = Dataset.from_list([{"prompt": [{"role": "user", "content": f"say {w}"}]} for w in ("ab", "cd", "ef")])


def short(completions, **kwargs):
    return [-len(c[0]["content"]) / 10 for c in completions]


def test_every_method_of_trls_grpotrainer_exists_with_trls_parameters():
    trl = pytest.importorskip("trl")
    for name, value in vars(trl.GRPOTrainer).items():
        if not callable(value) and not isinstance(value, staticmethod):
            continue
        ours = inspect.getattr_static(GRPOTrainer, name, None)
        assert ours is not None, f"grpokit.trl.GRPOTrainer lacks TRL's {name}"
        theirs_params = list(inspect.signature(getattr(trl.GRPOTrainer, name)).parameters)
        our_params = list(inspect.signature(getattr(GRPOTrainer, name)).parameters)
        if name == "_get_per_token_logps_and_entropies":  # TRL's vision keywords arrive as **vision
            theirs_params = theirs_params[: len(our_params) - 1]
            our_params = our_params[:-1]
        if not isinstance(value, staticmethod):  # the instance's own name (self)
            theirs_params, our_params = theirs_params[1:], our_params[1:]
        assert our_params == theirs_params, name


def test_every_trl_and_transformers_method_is_honoured_or_refused_naming_it():
    names = hooks.trl_method_names()
    assert {"_calculate_rewards", "compute_loss", "training_step", "create_optimizer", "_inner_training_loop"} <= set(
        names
    )
    for name in names:
        sub = type("Sub", (GRPOTrainer,), {name: lambda self, *a, **k: None})
        if name in hooks.HONOURED:
            assert hooks.check(sub, GRPOTrainer._own_methods) == [name]
        else:
            with pytest.raises(ConfigError, match=rf"^GRPOTrainer subclass overrides {name}, which grpokit.trl cannot"):
                hooks.check(sub, GRPOTrainer._own_methods)


def test_a_refused_override_stops_construction_before_any_work(tmp_path):
    class Wraps(GRPOTrainer):
        def _generate(self, prompts):
            return super()._generate(prompts)

    with pytest.raises(ConfigError, match=r"overrides _generate, .*rollout_func="):
        Wraps("no-such-model", reward_funcs=[short], train_dataset=DATA)
    assert not (tmp_path / "run").exists()


def test_a_trl_machinery_method_called_directly_stops_in_one_sentence(chat_model, tmp_path):
    tr = GRPOTrainer(
        chat_model, reward_funcs=[short], train_dataset=DATA, args=small_args(GRPOConfig, tmp_path / "run")
    )
    with pytest.raises(ConfigError, match=r"^GRPOTrainer.get_train_dataloader is TRL's own machinery"):
        tr.get_train_dataloader()
    ids, images, fields = tr._tokenize_prompts([[{"role": "user", "content": "say ab"}]])
    assert tr.processing_class.decode(ids[0]) == "<user>say ab\n<assistant>" and images is None and fields == {}


def test_tokenize_prompts_renders_with_chat_template_kwargs(chat_model, tmp_path):
    """TRL's _tokenize_prompts passes chat_template_kwargs to the template (before: dropped)."""
    args = small_args(GRPOConfig, tmp_path / "run", chat_template_kwargs={"brief": True})
    tr = GRPOTrainer(chat_model, reward_funcs=[short], train_dataset=DATA, args=args)
    # the chat model's template, with a generation prompt that shows the keyword
    tr.processing_class.chat_template = (
        "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}\n{% endfor %}"
        "{% if add_generation_prompt %}<assistant>{% if brief %}brief {% endif %}{% endif %}"
    )
    ids, _, _ = tr._tokenize_prompts([[{"role": "user", "content": "say ab"}]])
    assert tr.processing_class.decode(ids[0]) == "<user>say ab\n<assistant>brief "


def test_a_subclass_log_sees_every_entry_and_super_writes_it(chat_model, tmp_path):
    class Tagged(GRPOTrainer):
        seen: list = []

        def log(self, logs, start_time=None):
            self.seen.append((dict(logs), start_time is not None))
            super().log({**logs, "mine": 1.0}, start_time)

    tr = Tagged(
        chat_model,
        reward_funcs=[short],
        train_dataset=DATA,
        args=small_args(GRPOConfig, tmp_path / "run", max_steps=2, logging_steps=1),
    )
    tr.train()
    history = tr.state.log_history
    assert len(tr.seen) == len(history) == 3  # two steps' entries and the final one
    assert all(entry["mine"] == 1.0 for entry in history)
    assert [training for _, training in tr.seen] == [True, True, False]  # a step's entry carries start_time
    # as TRL's: a step's logs are transformers' own (loss, grad_norm, learning_rate); GRPOTrainer.log, the
    # super() call, adds _metrics["train"]'s means (reward ...) to the entry it writes
    assert set(tr.seen[0][0]) == {"loss", "grad_norm", "learning_rate"} and "reward" in history[0]
    assert "train_loss" in tr.seen[-1][0]


# ---------------------------------------------------------------- stage 3: rewards


def sizes_of(calls):
    def recorded(completions, **kwargs):
        calls.append((len(completions), sorted(k for k in kwargs if k not in ("trainer_state",))))
        return [float(len(c[0]["content"])) for c in completions]

    return recorded


def test_reward_functions_are_called_once_per_generation_batch_as_trl_calls_them(chat_model, tmp_path):
    """Two prompts of G=2 a step: TRL calls each function once with the 4 completions, not once per group."""
    trl = pytest.importorskip("trl")
    seen = {}
    for name, module in (("trl", trl), ("grpokit", __import__("grpokit.trl").trl)):
        calls = seen[name] = []
        args = small_args(module.GRPOConfig, tmp_path / name, max_steps=2, num_generations=2, report_to="none")
        module.GRPOTrainer(chat_model, reward_funcs=[sizes_of(calls)], train_dataset=DATA, args=args).train()
    assert [n for n, _ in seen["grpokit"]] == [n for n, _ in seen["trl"]] == [4, 4]
    assert {"completion_ids", "prompts", "log_extra", "log_metric"} <= set(seen["grpokit"][0][1])


class Ranked(GRPOTrainer):
    """Replaces every completion's reward by its rank in the batch (0, 1, 2, 3)."""

    calls: list = []

    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        base = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
        self.calls.append((len(inputs), inputs[0]["prompt"], base.shape))
        return torch.arange(len(prompts), dtype=torch.float32)[:, None]


class Flat(GRPOTrainer):
    """Every completion the same reward: no advantage, so no update moves a weight."""

    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        return torch.ones(len(prompts), len(self.reward_funcs))


def test_calculate_rewards_override_is_the_reward_stage_and_reaches_the_advantages(chat_model, tmp_path):
    args = small_args(GRPOConfig, tmp_path / "ranked", max_steps=2, num_generations=4, logging_steps=1)
    tr = Ranked(chat_model, reward_funcs=[short], train_dataset=DATA, args=args)
    tr.train()
    assert len(Ranked.calls) == 2  # once per generation batch, with TRL's inputs; super() gave (N, 1)
    assert Ranked.calls[0] == (4, [{"role": "user", "content": "say ab"}], (4, 1))
    rewards = [e["reward"] for e in tr.state.log_history if "reward" in e]
    assert rewards == [1.5, 1.5]  # the mean of 0, 1, 2, 3: the override's rewards, not short()'s
    # TRL's logged advantage, the one trained, of ranks 0..3 in one group of 4: (r - 1.5) / (std + 1e-4) with the
    # Bessel std sqrt(5 / 3) = 1.29099: -1.16181, -0.38727, 0.38727, 1.16181 (not r - mean: -1.5, -0.5 ...)
    assert list(tr._logs["advantages"])[-4:] == pytest.approx([-1.16181, -0.38727, 0.38727, 1.16181], abs=1e-4)

    flat = Flat(
        chat_model,
        reward_funcs=[short],
        train_dataset=DATA,
        args=small_args(GRPOConfig, tmp_path / "flat", max_steps=2),
    )
    before = {k: v.clone() for k, v in flat.model.state_dict().items()}
    flat.train()
    assert all(torch.equal(before[k], v) for k, v in flat.model.state_dict().items())  # zero advantage: no step


def test_a_calculate_rewards_override_of_the_wrong_shape_stops_in_one_sentence(chat_model, tmp_path):
    class Wrong(GRPOTrainer):
        def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
            return [1.0] * len(prompts)

    tr = Wrong(
        chat_model, reward_funcs=[short], train_dataset=DATA, args=small_args(GRPOConfig, tmp_path / "w", max_steps=1)
    )
    with pytest.raises(ConfigError, match=r"^_calculate_rewards returned list; TRL's contract is a tensor of shape"):
        tr.train()


# ---------------------------------------------------------------- stage 5: the loss

TRL_KEYS = {"prompt_ids", "prompt_mask", "completion_ids", "completion_mask", "advantages", "num_items_in_batch"}


class Zeroed(GRPOTrainer):
    """The loss scaled by 0: if it is the one back-propagated, no weight moves."""

    batches: list = []

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        self.batches.append({k: tuple(v.shape) for k, v in inputs.items()})
        return super().compute_loss(model, inputs, return_outputs, num_items_in_batch) * 0.0


class Through(GRPOTrainer):
    """The log-probabilities overridden, only calling super(): TRL's loss path, grpokit's math."""

    logp_calls = 0

    def _get_per_token_logps_and_entropies(self, *args, **kwargs):
        type(self).logp_calls += 1
        return super()._get_per_token_logps_and_entropies(*args, **kwargs)


def loss_args(out, **kw):
    return small_args(GRPOConfig, out, max_steps=2, num_generations=4, per_device_train_batch_size=2, **kw)


def test_the_loss_compute_loss_returns_is_the_one_back_propagated(chat_model, tmp_path):
    args = loss_args(tmp_path / "zero", gradient_accumulation_steps=2, learning_rate=1e-2)
    tr = Zeroed(chat_model, reward_funcs=[short], train_dataset=DATA, args=args)
    before = {k: v.clone() for k, v in tr.model.state_dict().items()}
    tr.train()
    assert all(torch.equal(before[k], v) for k, v in tr.model.state_dict().items())
    # two steps of one update each, cut into TRL's micro-batches of 2 rows: 4 calls with TRL's keys and shapes
    assert len(Zeroed.batches) == 4 and TRL_KEYS <= set(Zeroed.batches[0])
    b = Zeroed.batches[0]
    assert b["advantages"] == (2,) and b["completion_ids"] == b["completion_mask"] and b["completion_ids"][0] == 2
    assert b["prompt_ids"] == b["prompt_mask"] and b["num_items_in_batch"] == ()


@pytest.mark.parametrize("iterations", [1, 2])
def test_compute_loss_through_super_trains_as_grpokits_own_loss(chat_model, tmp_path, iterations):
    """The TRL-order path (micro-batches through compute_loss and _get_per_token_logps_and_entropies) gives
    the update grpokit's own loss gives: same seed, same completions, the same weights after two steps
    (with num_iterations=2 the second update's ratio reads pi_old, as TRL's)."""
    Through.logp_calls = 0
    args = dict(gradient_accumulation_steps=2, learning_rate=1e-2, seed=3, logging_steps=1, num_iterations=iterations)
    plain = GRPOTrainer(chat_model, reward_funcs=[short], train_dataset=DATA, args=loss_args(tmp_path / "a", **args))
    before = [v.clone() for v in plain.model.state_dict().values()]
    plain.train()
    through = Through(chat_model, reward_funcs=[short], train_dataset=DATA, args=loss_args(tmp_path / "b", **args))
    through.train()
    # every micro-batch's log-probabilities came from the (overridden) method, and with num_iterations=2 the
    # generation batch's pi_old too (one no-grad pass, as TRL's old_per_token_logps): 4 + (iterations - 1)
    assert Through.logp_calls == 4 + (iterations - 1)
    for (name, a), b in zip(plain.model.state_dict().items(), through.model.state_dict().values()):
        torch.testing.assert_close(a, b, atol=2e-5, rtol=1e-4, msg=name)
    assert any(not torch.equal(a, b) for a, b in zip(before, plain.model.state_dict().values()))  # they moved
    losses = [[e["loss"] for e in t.state.log_history if "loss" in e] for t in (plain, through)]
    assert len(losses[0]) == 2 and losses[0] == pytest.approx(losses[1], abs=1e-5)


def test_a_compute_loss_override_runs_under_the_capture_guard(chat_model, tmp_path):
    """A subclass's compute_loss (and its backward) holds rollout/step_graphs.py's CAPTURE_GUARD as grpokit's own
    loss does: a dropout draw there beside an asynchronous sampler's CUDA graph capture would break it."""
    from grpokit.rollout.step_graphs import CAPTURE_GUARD

    held = []

    class Watches(GRPOTrainer):
        def compute_loss(self, model, inputs, **kwargs):
            held.append(CAPTURE_GUARD._is_owned())
            return super().compute_loss(model, inputs, **kwargs)

    args = loss_args(tmp_path / "run", gradient_accumulation_steps=2)
    Watches(chat_model, reward_funcs=[short], train_dataset=DATA, args=args).train()
    assert held and all(held) and not CAPTURE_GUARD._is_owned()


# ---------------------------------------------------------------- stages 1-4: _generate_and_score_completions


class NoAdvantage(GRPOTrainer):
    """Zeroes the advantages of the batch super() returns: if its dict is what trains, no weight moves."""

    seen: list = []

    def _generate_and_score_completions(self, inputs):
        out = super()._generate_and_score_completions(inputs)
        self.seen.append((len(inputs), inputs[0]["prompt"], sorted(out)))
        return {**out, "advantages": torch.zeros_like(out["advantages"])}


def test_generate_and_score_completions_override_gives_the_batch_the_update_trains_on(chat_model, tmp_path):
    args = loss_args(tmp_path / "gen", learning_rate=1e-2, logging_steps=1, gradient_accumulation_steps=2)
    tr = NoAdvantage(chat_model, reward_funcs=[short], train_dataset=DATA, args=args)
    before = {k: v.clone() for k, v in tr.model.state_dict().items()}
    tr.train()
    assert len(NoAdvantage.seen) == 2  # once per generation batch (a step: one prompt, G=4)
    n, prompt, keys = NoAdvantage.seen[0]
    assert n == 4 and prompt == [{"role": "user", "content": "say ab"}] and TRL_KEYS <= set(keys)
    assert all(torch.equal(before[k], v) for k, v in tr.model.state_dict().items())
    assert len(tr._buffered_inputs) == 2 and tr._buffered_inputs[0]["completion_ids"].shape[0] == 2
    assert [e["reward"] for e in tr.state.log_history if "reward" in e]  # the step is recorded from super()'s scoring


def test_generate_and_score_completions_called_directly_returns_trls_batch(chat_model, tmp_path):
    tr = GRPOTrainer(
        chat_model,
        reward_funcs=[short],
        train_dataset=DATA,
        args=loss_args(tmp_path / "direct", gradient_accumulation_steps=2),
    )
    rows = [{"prompt": [{"role": "user", "content": "say cd"}]}] * 4
    out = tr._generate_and_score_completions(rows)
    assert TRL_KEYS <= set(out) and out["completion_ids"].shape[0] == 4 and out["advantages"].shape == (4,)
    assert out["num_items_in_batch"] == out["completion_mask"].sum()


# ---------------------------------------------------------------- stage 2: _generate_single_turn


class Fixed(GRPOTrainer):
    """Wraps _generate_single_turn: keeps super()'s call, replaces every completion by "zz"."""

    calls: list = []

    def _generate_single_turn(self, prompt_ids, images, multimodal_fields, num_generations, has_tool_images=False):
        completion_ids, logprobs = super()._generate_single_turn(prompt_ids, images, multimodal_fields, num_generations)
        self.calls.append((len(prompt_ids), num_generations, len(completion_ids)))
        zz = self.processing_class.encode("zz", add_special_tokens=False)
        return [zz] * len(completion_ids), None


def test_generate_single_turn_override_is_the_sampling_stage(chat_model, tmp_path):
    tr = Fixed(
        chat_model, reward_funcs=[short], train_dataset=DATA, args=small_args(GRPOConfig, tmp_path / "zz", max_steps=2)
    )
    tr.train()
    assert Fixed.calls == [(4, 4, 4), (4, 4, 4)]  # TRL's rows: one per completion, once per generation batch
    assert set(tr._logs["completion"]) == {"zz"}  # the completions trained on are the override's

    class WithTools(Fixed):
        pass

    with pytest.raises(ConfigError, match=r"overrides _generate_single_turn / _tokenize_prompts with tools"):
        WithTools(chat_model, reward_funcs=[short], train_dataset=DATA, tools=[short])


# ---------------------------------------------------------------- TRL's attributes and accelerator


def trl_init_attributes(trl_module) -> set[str]:
    """Every ``self.<name> = ...`` in TRL's GRPOTrainer.__init__ (read from its source)."""
    import ast
    import textwrap

    tree = ast.parse(textwrap.dedent(inspect.getsource(trl_module.GRPOTrainer.__init__)))
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
                for e in ast.walk(target):
                    if isinstance(e, ast.Attribute) and isinstance(e.value, ast.Name) and e.value.id == "self":
                        names.add(e.attr)
    return names


def test_trls_init_attributes_exist_with_trls_values(chat_model, tmp_path):
    trl = pytest.importorskip("trl")
    names = trl_init_attributes(trl)
    assert len(names) > 70
    kw = dict(max_steps=2, num_generations=4, beta=0.04, epsilon=0.3, top_k=5, report_to="none")
    ours = GRPOTrainer(
        chat_model, reward_funcs=[short], train_dataset=DATA, args=small_args(GRPOConfig, tmp_path, **kw)
    )
    theirs = trl.GRPOTrainer(
        chat_model, reward_funcs=[short], train_dataset=DATA, args=small_args(trl.GRPOConfig, tmp_path / "t", **kw)
    )
    assert sorted(n for n in names if not hasattr(ours, n)) == []
    plain = (bool, int, float, str, type(None), list, dict)
    same = [  # the values TRL set on this run (some only under conditions); tools: TRL normalises them apart
        n for n in sorted(names) if hasattr(theirs, n) and isinstance(getattr(theirs, n), plain) and n != "tools"
    ]
    assert {"beta", "epsilon_low", "epsilon_high", "num_generations", "_step", "_is_vlm", "use_vllm"} <= set(same)
    assert {n: getattr(ours, n) for n in same} == {n: getattr(theirs, n) for n in same}
    assert ours.accelerator.device == theirs.accelerator.device
    t = torch.tensor([1.0, 2.0])
    assert torch.equal(ours.accelerator.gather(t), theirs.accelerator.gather(t))
    assert ours.accelerator.state.num_processes == theirs.accelerator.state.num_processes == 1
    with pytest.raises(ConfigError, match=r"^GRPOTrainer.beta is read from GRPOConfig.beta"):
        ours.beta = 0.5


def test_what_trl_lets_a_subclass_assign_is_assigned_with_trls_meaning_or_refused_in_one_sentence(chat_model, tmp_path):
    import copy

    trl = pytest.importorskip("trl")
    tr = GRPOTrainer(
        chat_model, reward_funcs=[short], train_dataset=DATA, args=small_args(GRPOConfig, tmp_path, beta=0.04)
    )
    for name in sorted(trl_init_attributes(trl)):
        try:
            setattr(tr, name, getattr(tr, name))  # never "property has no setter": kept, or one sentence
        except ConfigError as e:
            assert str(e).startswith(f"GRPOTrainer.{name} ") and "\n" not in str(e), name
    teacher = copy.deepcopy(tr.model)
    tr.ref_model = teacher  # TRL's: the KL term's reference (a subclass's teacher, as sdpo-rl sets it)
    assert tr.ref_model is teacher and tr._get().ref_model is teacher  # the one the loop's KL pass reads
    assert tr.accelerator.prepare(teacher) is teacher and tr.accelerator.prepare(1, teacher) == (1, teacher)
    fresh = GRPOTrainer(chat_model, reward_funcs=[short], train_dataset=DATA, args=small_args(GRPOConfig, tmp_path))

    def longer(completions, **kwargs):
        return [len(c[0]["content"]) / 10 for c in completions]

    fresh.reward_funcs = [longer]
    assert fresh.reward_funcs == [longer] and fresh.reward_func_names == ["longer"]
    assert fresh._get().runner is not None and fresh._kwargs["reward_funcs"] == [longer]


def test_a_config_subclass_may_fill_a_none_in_its_post_init_before_grpokits_checks(tmp_path):
    import dataclasses

    @dataclasses.dataclass
    class Budgeted(GRPOConfig):  # as trl-cgrpo's CGRPOConfig: num_generations=None means max(budget_grid)
        budget_grid: list = dataclasses.field(default_factory=lambda: [2, 4])

        def __post_init__(self):
            self.num_generations = self.num_generations or max(self.budget_grid)
            super().__post_init__()

    assert small_args(Budgeted, tmp_path, num_generations=None).num_generations == 4
    with pytest.raises(ConfigError, match=r"num_generations=None is not valid"):
        small_args(GRPOConfig, tmp_path, num_generations=None)  # left None, it is checked as before


class Metered(GRPOTrainer):
    def log(self, logs, start_time=None):
        if start_time is not None:  # a training entry: TRL's subclasses add to _metrics before it is averaged
            self._metrics["train"]["mine"].append(2.0)
        super().log(logs, start_time)


def test_trls_state_stays_current_and_metrics_added_to_metrics_are_logged(chat_model, tmp_path):
    args = small_args(GRPOConfig, tmp_path / "m", max_steps=2, logging_steps=1)
    tr = Metered(chat_model, reward_funcs=[short], train_dataset=DATA, args=args)
    assert tr._step == 0 and tr._total_train_tokens == 0
    tr.train()
    assert tr._step == 2 and tr._total_train_tokens == tr.state.num_input_tokens_seen > 0
    assert tr.model_wrapped is tr.model and tr.generation_config.max_new_tokens == 4
    assert [e.get("mine") for e in tr.state.log_history if "reward" in e] == [2.0, 2.0]  # in the entry, as TRL


# ---------------------------------------------------------------- callbacks: TRL's events with TRL's keywords


def recorder(trl_events):
    from transformers import TrainerCallback

    class Everything(TrainerCallback):
        def __init__(self):
            self.seen = []

    def make(event):
        def handler(self, args, state, control, **kw):
            present = sorted(k for k, v in kw.items() if v is not None)
            self.seen.append((event, state.global_step, tuple(present)))

        return handler

    for event in trl_events:
        setattr(Everything, event, make(event))
    return Everything()


def test_callback_events_fire_at_trls_points_with_trls_keywords(chat_model, tmp_path):
    """One run of 2 steps (2 micro-batches each, an evaluation every step) under TRL and grpokit.trl: the same
    events in the same order, with the same keyword arguments given (model, processing_class, optimizer,
    lr_scheduler, train_dataloader, eval_dataloader once an evaluation ran, metrics, logs)."""
    trl = pytest.importorskip("trl")
    from grpokit.trl.default_callbacks import TRL_EVENTS

    seen = {}
    for name, module in (("trl", trl), ("grpokit", __import__("grpokit.trl").trl)):
        cb = recorder(TRL_EVENTS)
        args = small_args(
            module.GRPOConfig,
            tmp_path / name,
            max_steps=2,
            num_generations=2,
            per_device_train_batch_size=2,
            gradient_accumulation_steps=2,
            per_device_eval_batch_size=2,
            eval_strategy="steps",
            eval_steps=1,
            logging_steps=1,
            save_strategy="no",
            report_to="none",
        )
        tr = module.GRPOTrainer(
            chat_model, reward_funcs=[short], train_dataset=DATA, eval_dataset=DATA, args=args, callbacks=[cb]
        )
        tr.train()
        seen[name] = cb.seen
    assert seen["grpokit"] == seen["trl"]


@pytest.mark.parametrize(
    "rounds",
    [
        dict(num_iterations=2, gradient_accumulation_steps=1, max_steps=4, prompts=3),  # a round: 2 updates, 1 batch
        dict(steps_per_generation=2, gradient_accumulation_steps=1, max_steps=3, prompts=3),  # 2 updates, 2 slices
        # a round of 4 slices, 2 micro-batches an update: 2 updates, each with an on_substep_end between its two
        dict(steps_per_generation=4, gradient_accumulation_steps=2, max_steps=3, prompts=8),
    ],
    ids=["num_iterations", "steps_per_generation", "accumulation"],
)
def test_callbacks_fire_around_each_optimizer_update_of_a_round_as_trl(chat_model, tmp_path, rounds):
    """When one sampling round makes several optimizer updates, TRL fires on_step_begin .. on_step_end and
    on_log around each update with global_step advanced per update: grpokit.trl's loop fires them from each
    update (the last step's round cut short by max_steps, as TRL's)."""
    trl = pytest.importorskip("trl")
    from grpokit.trl.default_callbacks import TRL_EVENTS

    seen, history = {}, {}
    rounds = dict(rounds)  # a generation batch of 4 slices of 2 completions needs 4 prompts
    data = Dataset.from_list(
        [{"prompt": [{"role": "user", "content": f"say {i}"}]} for i in range(rounds.pop("prompts"))]
    )
    for name, module in (("trl", trl), ("grpokit", __import__("grpokit.trl").trl)):
        cb = recorder(TRL_EVENTS)
        args = small_args(
            module.GRPOConfig,
            tmp_path / name,
            num_generations=2,
            per_device_train_batch_size=2,
            logging_steps=1,
            save_strategy="no",
            report_to="none",
            **rounds,
        )
        tr = module.GRPOTrainer(chat_model, reward_funcs=[short], train_dataset=data, args=args, callbacks=[cb])
        tr.train()
        seen[name], history[name] = cb.seen, tr.state.log_history
    assert [e for e, *_ in seen["trl"]].count("on_optimizer_step") == rounds["max_steps"]
    substeps = [e for e, *_ in seen["trl"]].count("on_substep_end")  # one between each update's 2 micro-batches
    assert substeps == (rounds["max_steps"] if rounds["gradient_accumulation_steps"] == 2 else 0)
    assert seen["grpokit"] == seen["trl"]
    # each entry holds TRL's keys: the round's sampling metrics (reward ...) on its first step only
    assert [e["step"] for e in history["grpokit"]] == [e["step"] for e in history["trl"]]
    assert [sorted(set(t) - set(g)) for t, g in zip(history["trl"], history["grpokit"])] == [[]] * len(history["trl"])
    assert ["reward" in e for e in history["grpokit"]] == ["reward" in e for e in history["trl"]]


def counting(obj, names):
    """``obj`` with its methods ``names`` counting their calls in ``obj.calls``."""
    obj.calls = 0
    for name in names:
        method = getattr(obj, name)

        def counted(*a, _method=method, **k):
            obj.calls += 1
            return _method(*a, **k)

        setattr(obj, name, counted)
    return obj


@pytest.mark.parametrize("built", [False, True], ids=["in_init", "after_build"])
def test_a_model_tokenizer_rewards_and_reference_assigned_before_train_are_the_ones_trained(
    chat_model, tmp_path, built
):
    """TRL holds model, processing_class, reward_funcs and ref_model as plain attributes: assigned after
    construction (in a subclass's __init__, or after the run was built by reading one), the new object is
    the one trained (its parameters change), sampled with, called; once train() started, one sentence for the
    model and tokenizer (reward functions are the next batch's: test_trl_held.py)."""
    import copy

    calls = []

    def longer(completions, **kwargs):
        calls.append(len(completions))
        return [len(c[0]["content"]) / 10 for c in completions]

    args = small_args(GRPOConfig, tmp_path / "run", max_steps=1, beta=0.04, learning_rate=1e-2)
    tr = GRPOTrainer(chat_model, reward_funcs=[short], train_dataset=DATA, args=args)
    if built:
        assert tr.model is not None and tr._trainer is not None  # reading builds the run
    model, tok, ref = copy.deepcopy(tr.model), copy.deepcopy(tr.processing_class), copy.deepcopy(tr.model)
    before = [p.detach().clone() for p in model.parameters()]
    tr.model, tr.ref_model, tr.reward_funcs = model, ref, [longer]
    tr.processing_class = counting(tok, ["__call__", "decode", "batch_decode", "apply_chat_template"])
    tr.train()
    assert tr.model is model and tr._trainer.model is model and tr.ref_model is ref
    assert any(not torch.equal(a, b.detach()) for a, b in zip(before, model.parameters()))  # the one trained
    assert calls and tok.calls > 0 and tr.processing_class is tok
    for name, value in (("model", model), ("processing_class", tok)):  # reward_funcs: the next batch's (held)
        with pytest.raises(ConfigError, match=rf"^GRPOTrainer.{name} can be replaced until train\(\) starts"):
            setattr(tr, name, value)


def test_a_reference_assigned_after_construction_is_the_one_the_kl_term_reads(chat_model, tmp_path):
    """beta > 0, one step: the reference is the policy's copy, so step 1's logged kl is 0 (the policy has not
    moved yet); a reference assigned after construction whose weights differ makes that kl > 0."""
    import copy

    def first_kl(assign):
        args = small_args(GRPOConfig, tmp_path / str(assign), max_steps=1, beta=0.04, logging_steps=1, seed=1)
        tr = GRPOTrainer(chat_model, reward_funcs=[short], train_dataset=DATA, args=args)
        if assign:
            ref = copy.deepcopy(tr.model)
            with torch.no_grad():
                for p in ref.parameters():
                    p.add_(0.5 * torch.randn_like(p))
            tr.ref_model = ref
        tr.train()
        return next(e["kl"] for e in tr.state.log_history if "kl" in e)

    assert first_kl(False) == pytest.approx(0.0, abs=1e-6)
    assert first_kl(True) > 1e-3


def test_a_logps_override_with_a_truncating_sampler_is_refused_when_installed():
    # The override cannot replay the sampler's truncated support (vLLM with top_k / top_p / min_p), which every
    # step's pi_old pass needs (algo/pipeline: sampler_truncates asks for pi_old): refused when the passes are put
    # in the slots, before the run starts (before: at the first step's pi_old pass, after a sampled round)
    from types import SimpleNamespace

    from grpokit.trl.contract.overrides import into_slots

    facade = SimpleNamespace(_overrides={"_get_per_token_logps_and_entropies": None})
    runner = SimpleNamespace()
    cfg = SimpleNamespace(algo=SimpleNamespace(distill_top_k=0))
    trainer = SimpleNamespace(runner=runner, eval_runner=runner, replays_support=True, prompts=[], cfg=cfg)
    with pytest.raises(ConfigError) as e:
        into_slots(facade, trainer)
    assert str(e.value) == (
        "a GRPOTrainer subclass's _get_per_token_logps_and_entropies cannot replay the sampler's truncated support "
        "(top_k / top_p / min_p with vLLM) that grpokit's pi_old pass needs; sample without truncation or drop the "
        "override"
    )
    trainer.replays_support = False  # without truncation both passes go through the override
    into_slots(facade, trainer)
    assert trainer.old_logprobs.__self__.facade is facade and trainer.logprobs.__self__.facade is facade


def test_a_step_whose_rewards_were_all_none_leaves_the_logged_window_mean_as_trls(chat_model, tmp_path):
    """A reward function answering None for every completion of step 1 and 1.0 on step 2, logged every 2 steps:
    TRL 1.16 leaves step 1's NaN out of the window's mean (1.0); a plain mean logged NaN for the whole window."""
    trl = pytest.importorskip("trl")
    logged = {}
    for name, module in (("trl", trl), ("grpokit", __import__("grpokit.trl").trl)):
        calls = []

        def none_first(completions, **kwargs):
            calls.append(1)
            return [None if len(calls) == 1 else 1.0] * len(completions)

        args = small_args(module.GRPOConfig, tmp_path / name, max_steps=2, num_generations=2, logging_steps=2)
        tr = module.GRPOTrainer(chat_model, reward_funcs=[none_first, short], train_dataset=DATA, args=args)
        tr.train()
        entry = tr.state.log_history[0]
        logged[name] = (entry["rewards/none_first/mean"], entry["rewards/none_first/std"])
    assert logged["grpokit"] == logged["trl"] == (1.0, 0.0)


@pytest.mark.parametrize(
    "contents, where",
    [
        (
            ["say cd", "say cd", "say cd", "say ef"],
            "row 3's prompt differs from row 0's",
        ),  # before: row 3 sampled "say cd"
        (["say cd"] * 5, "5 rows"),  # before: 2 groups, 8 completions for 5 rows
    ],
)
def test_generate_and_score_completions_called_with_rows_not_in_groups_is_refused(
    contents, where, chat_model, tmp_path
):
    tr = GRPOTrainer(
        chat_model,
        reward_funcs=[short],
        train_dataset=DATA,
        args=loss_args(tmp_path / "d", gradient_accumulation_steps=2),
    )
    rows = [{"prompt": [{"role": "user", "content": c}]} for c in contents]
    with pytest.raises(
        ConfigError, match=rf"^_generate_and_score_completions was called with {where}; grpokit samples"
    ):
        tr._generate_and_score_completions(rows)
