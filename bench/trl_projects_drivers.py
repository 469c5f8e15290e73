"""One published TRL project at CPU size, on one side (``trl`` or ``grpokit``); run by bench/trl_projects.py.

    python bench/trl_projects_drivers.py PROJECT SIDE OUT

The project's code is on PYTHONPATH (downloaded by the harness; on the grpokit side its ``trl`` imports
read ``grpokit.trl``). Before the trainer is built, every method a project class defines that TRL's
GRPOTrainer (or transformers' Trainer) also has, and every ``on_*`` event of a project callback, is wrapped
with a counter. OUT/result.json gets the steps logged, the counts and what the project itself wrote.
"""

from __future__ import annotations

import collections
import functools
import importlib
import json
import sys
import tempfile
from pathlib import Path

COUNTS: collections.Counter = collections.Counter()
OUTPUT: dict = {}


def side_trl(side: str):
    return importlib.import_module("grpokit.trl" if side == "grpokit" else "trl")


def _counting(key: str, fn):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        COUNTS[key] += 1
        return fn(*args, **kwargs)

    return wrapper


def instrument(package: str) -> None:
    """Wrap the overrides and callback events of every class defined under ``package``."""
    import transformers

    import trl

    contract = set(dir(trl.GRPOTrainer)) | set(dir(transformers.Trainer))
    for name, mod in list(sys.modules.items()):
        if not (name == package or name.startswith(package + ".")) or mod is None:
            continue
        for cls in list(vars(mod).values()):
            if not isinstance(cls, type) or cls.__module__ != name:
                continue
            callback = issubclass(cls, transformers.TrainerCallback)
            trainer = any(b.__name__.endswith("Trainer") for b in cls.__mro__[1:])  # TRL's, grpokit's, transformers'
            for attr, fn in list(vars(cls).items()):
                if not callable(fn) or attr.startswith("__"):
                    continue
                if (callback and attr.startswith("on_")) or (trainer and attr in contract):
                    setattr(cls, attr, _counting(f"{cls.__name__}.{attr}", fn))


def tiny(out: Path):
    from helpers.trl_models import make_chat_model

    return make_chat_model(out / "model")


def prompts(n: int = 4, answer: bool = False):
    from datasets import Dataset

    rows = {"prompt": [[{"role": "user", "content": f"add {i} and {i + 1}"}] for i in range(n)]}
    if answer:
        rows["answer"] = [str(2 * i + 1) for i in range(n)]
    return Dataset.from_dict(rows)


def length_reward(completions, **kwargs):
    return [float(len(c[0]["content"] if isinstance(c, list) else c) % 3) for c in completions]


SMALL = dict(
    per_device_train_batch_size=2,
    num_generations=2,
    max_completion_length=8,
    max_steps=2,
    logging_steps=1,
    report_to="none",
    bf16=False,
    use_cpu=True,
    save_strategy="no",
)


def run_cgrpo(side: str, out: Path):
    import trl_cgrpo.cgrpo_config  # noqa: F401
    import trl_cgrpo.cgrpo_trainer as m

    instrument("trl_cgrpo")
    args = m.CGRPOConfig(
        output_dir=str(out / "run"), **{**SMALL, "num_generations": None}, budget_grid=[2], loss_type="dapo"
    )
    return m.CGRPOTrainer(
        model=str(tiny(out)),
        reward_funcs=length_reward,
        args=args,
        train_dataset=prompts(),
        calibration_dataset=prompts(answer=True),
        answer_extractor=lambda s: s.strip()[:1],
    )


def run_sdpo(side: str, out: Path):
    import sdpo_rl.trainer as m
    from sdpo_rl.config import SDPOConfig
    from transformers import AutoModelForCausalLM, AutoTokenizer

    instrument("sdpo_rl")
    path = tiny(out)
    return m.SDPOTrainer(
        model=AutoModelForCausalLM.from_pretrained(path),
        args=side_trl(side).GRPOConfig(output_dir=str(out / "run"), **SMALL),
        sdpo_config=SDPOConfig(max_reprompt_length=64, distillation_topk=8),  # below the tiny vocabulary
        processing_class=AutoTokenizer.from_pretrained(path),
        reward_funcs=[length_reward],
        train_dataset=prompts(),
    )


def zero_reward(completions, **kwargs):
    return [0.0] * len(completions)


def run_erl(side: str, out: Path):
    """Every first attempt scores 0, below the gate, so both sides take the project's reflection and retry
    path on every step (a length reward gates by chance); erl_rl_coef=0 because the project's log-prob
    helper unpacks two of the three values TRL 1.16's _get_per_token_logps_and_entropies returns."""
    import erl.trainer as m
    from erl.config import ERLConfig

    instrument("erl")
    return m.ERLTrainer(
        model=str(tiny(out)),
        reward_funcs=zero_reward,
        args=ERLConfig(output_dir=str(out / "run"), **SMALL, erl_rl_coef=0.0),
        train_dataset=prompts(),
    )


def run_trainsafe(side: str, out: Path):
    import trainsafe.callback as m

    instrument("trainsafe")
    reports = m.terminal_reporter.report
    m.terminal_reporter.report = _counting("project output: terminal report", reports)
    T = side_trl(side)
    args = T.GRPOConfig(output_dir=str(out / "run"), **SMALL, eval_strategy="steps", eval_steps=1)
    return T.GRPOTrainer(
        model=str(tiny(out)),
        reward_funcs=length_reward,
        args=args,
        train_dataset=prompts(),
        eval_dataset=prompts(),
        callbacks=[m.TrainSafeCallback(num_inference_samples=2, max_new_tokens=8, log_to_wandb=False)],
    )


def run_rldoctor(side: str, out: Path):
    from rl_doctor.integrations import trl as m

    instrument("rl_doctor")
    OUTPUT["report"] = str(out / "rldoctor.html")
    T = side_trl(side)
    return T.GRPOTrainer(
        model=str(tiny(out)),
        reward_funcs=length_reward,
        args=T.GRPOConfig(output_dir=str(out / "run"), **{**SMALL, "max_steps": 3}),
        train_dataset=prompts(),
        callbacks=[m.RLDoctorCallback(check_every=1, min_steps=1, report_path=OUTPUT["report"])],
    )


def run_alignrl(side: str, out: Path):
    """SFT then GRPO through the project's runners; their model and dataset loaders (unsloth, the Hub) are
    replaced by the tiny local ones, the training code is the project's."""
    import alignrl.grpo as g
    import alignrl.sft as s
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer

    instrument("alignrl")
    path = tiny(out)

    def load(runner):
        runner._model = AutoModelForCausalLM.from_pretrained(path)
        runner._tokenizer = AutoTokenizer.from_pretrained(path)

    common = dict(
        output_dir=out / "run", max_steps=1, logging_steps=1, optim="adamw_torch", per_device_train_batch_size=2
    )
    sft = s.SFTRunner(s.SFTConfig(**common, gradient_accumulation_steps=1, max_seq_length=64))
    sft._load_model = lambda: load(sft)
    sft._load_dataset = lambda: Dataset.from_dict({"text": ["<user>add 1 and 2\n<assistant>3\n"] * 4})
    grpo = g.GRPORunner(
        g.GRPOConfig(**common, gradient_accumulation_steps=1, num_generations=2, max_completion_length=8),
        reward_funcs=[length_reward],
    )
    grpo._load_model = lambda: load(grpo)
    grpo._load_dataset = prompts
    results = []
    for name, runner in (("sft", sft), ("grpo", grpo)):
        try:
            runner.train()
            results.append(f"{name}: trained")
        except Exception as e:  # noqa: BLE001 - each runner's fate is part of the record
            results.append(f"{name}: {type(e).__name__}: {str(e).splitlines()[0][:150] if str(e) else ''}")
    OUTPUT["runners"] = results
    return None


def run_sft_grpo(side: str, out: Path):
    """The two-stage project (bench/projects/sft_then_grpo.py): SFT on the tiny model's chat text, then GRPO
    from the SFT output folder; the project's callback records each stage's losses in stages.json."""
    import sft_then_grpo as m
    from datasets import Dataset

    instrument("sft_then_grpo")
    sft_data = Dataset.from_dict({"text": [f"<user>add {i} and {i + 1}\n<assistant>{2 * i + 1}\n" for i in range(4)]})
    grpo = m.run(str(tiny(out)), sft_data, prompts(answer=True), out / "run")
    stages = out / "run" / "grpo" / "stages.json"
    OUTPUT["stages"] = json.loads(stages.read_text()) if stages.exists() else None
    OUTPUT["grpo_from_sft"] = Path(grpo.model.config._name_or_path).resolve() == (out / "run" / "sft").resolve()
    return grpo


def main() -> None:
    project, side, out = sys.argv[1], sys.argv[2], Path(sys.argv[3])
    out.mkdir(parents=True, exist_ok=True)
    result: dict = {"project": project, "side": side}
    trainer = None
    try:
        trainer = globals()[f"run_{project}"](side, out)
        if trainer is not None and project != "sft_grpo":  # the two-stage project trains its stages itself
            trainer.train()
    finally:
        state = getattr(trainer, "state", None) or getattr(getattr(trainer, "bridge", None), "state", None)
        history = list(getattr(state, "log_history", []) or [])
        result["steps_logged"] = sum(1 for h in history if "loss" in h)
        result["counts"] = dict(COUNTS)
        if "report" in OUTPUT:
            OUTPUT["report_written"] = Path(OUTPUT.pop("report")).exists()
        result["output"] = OUTPUT
        (out / "result.json").write_text(json.dumps(result, indent=1, default=str))


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    with tempfile.TemporaryDirectory():
        main()
