"""The smollm2-math recipe under TRL 1.16, and both runs' held-out curves against training time.

    grpokit train --preset smollm2-math --out runs/smollm2-grpokit           # grpokit's side
    python bench/smollm2_curve.py trl --out runs/smollm2-trl                  # TRL's side, equal settings
    python bench/smollm2_curve.py show runs/smollm2-grpokit runs/smollm2-trl  # both curves, one table

TRL's side trains the same model folder (model.name_or_path=smollm2-135m-instruct), on the same
training rows (the task's train_rows(8192, seed 0) as chat messages), with the same reward
(reasoning_gym_accuracy) and the preset's settings in TRL's names: 4 prompts x G=8 = 32 completions
per step, 48 new tokens, temperature 1, lr 5e-6 constant, loss_type dapo (token mean), std scaling,
eps 0.2, beta 0, gradient checkpointing off (TRL 1.16 turns it on by default; grpokit's memory plan
leaves it off for this model on a machine with 24 GB, so TRL's side is set to match: equal compute).

Both sides are evaluated by the same function (grpokit.train.evaluate.evaluate: greedy, 48 tokens,
the task's verifier) on the same 200 held-out prompts before training and every 6 steps. The
training clock of each side is the sum of its steps' wall time (grpokit: ``time/step`` of
metrics.jsonl; TRL: on_step_begin -> on_step_end), evaluation excluded; the command's whole wall time
(model load and evaluations included) is recorded too.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

PRESET = "smollm2-math"
TRAIN_ROWS = 8192  # what grpokit draws from a task (train/run_data.py TASK_TRAIN_ROWS)


def _recipe() -> dict:
    from grpokit.config import presets

    return presets.apply(PRESET)


def run_trl(out: Path, steps: int | None) -> None:
    from transformers import AutoTokenizer, TrainerCallback

    import trl
    from grpokit.data.prompts import to_prompts
    from grpokit.data.tasks import get_task
    from grpokit.rewards.runner import RewardRunner
    from grpokit.rewards.spec import RewardSpec
    from grpokit.train.evaluate import evaluate, held_out_params
    from grpokit.train.models import eos_ids, model_path
    from grpokit.trl import reasoning_gym_accuracy, reasoning_gym_dataset

    start = time.time()
    cfg = _recipe()
    steps = steps or cfg.train.steps
    d, r = cfg.data, cfg.rollout
    folder = model_path(cfg.model.name_or_path)
    data = reasoning_gym_dataset(d.task, TRAIN_ROWS, seed=cfg.train.seed, params=d.task_params)
    tok = AutoTokenizer.from_pretrained(folder)
    held = to_prompts(get_task(d.task, d.task_params).held_out_rows(d.eval_size), tok, d)
    runner = RewardRunner([RewardSpec(fn=reasoning_gym_accuracy, name="accuracy", weight=1.0)], num_workers=0)
    out.mkdir(parents=True, exist_ok=True)
    curve = (out / "curve.jsonl").open("w")

    class Curve(TrainerCallback):
        train_s, t0 = 0.0, 0.0

        def _eval(self, step: int, model) -> None:
            res = evaluate(model, tok, held, runner, params=held_out_params(r), eos_token_ids=eos_ids(tok, model))
            row = {"step": step, "train_s": round(self.train_s, 1), "wall_s": round(time.time() - start, 1), **res}
            curve.write(json.dumps(row) + "\n")
            curve.flush()
            print(f"trl-side eval: {row}", flush=True)

        def on_train_begin(self, args, state, control, model=None, **kw):
            self._eval(0, model)

        def on_step_begin(self, args, state, control, **kw):
            self.t0 = time.time()

        def on_step_end(self, args, state, control, model=None, **kw):
            self.train_s += time.time() - self.t0
            if state.global_step % cfg.train.eval_every == 0 or state.global_step == steps:
                self._eval(state.global_step, model)

    args = trl.GRPOConfig(
        output_dir=str(out),
        max_steps=steps,
        per_device_train_batch_size=cfg.train.prompts_per_step * r.group_size,
        num_generations=r.group_size,
        max_completion_length=r.max_new_tokens,
        temperature=r.temperature,
        top_p=r.top_p,
        learning_rate=cfg.optim.lr,
        lr_scheduler_type="constant",
        adam_beta2=cfg.optim.adam_beta2,
        max_grad_norm=cfg.optim.max_grad_norm,
        weight_decay=cfg.optim.weight_decay,
        beta=cfg.algo.beta,
        epsilon=cfg.algo.clip_low,
        loss_type="dapo",
        scale_rewards="group",
        num_iterations=1,
        use_cpu=True,
        gradient_checkpointing=False,  # as grpokit's memory plan chose for this model (config.yaml)
        seed=cfg.train.seed,
        save_strategy="no",
        report_to=[],
        logging_steps=1,
        disable_tqdm=True,
    )
    trainer = trl.GRPOTrainer(
        model=folder, reward_funcs=[reasoning_gym_accuracy], args=args, train_dataset=data, callbacks=[Curve()]
    )
    trainer.train()
    (out / "summary.json").write_text(
        json.dumps({"trl": trl.__version__, "steps": steps, "wall_s": round(time.time() - start, 1)})
    )


def grpokit_curve(run: Path) -> list[dict]:
    """The held-out points of a grpokit run: step, summed step time, accuracy."""
    summary = json.loads((run / "summary.json").read_text())
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
    points, train_s = [{"step": 0, "train_s": 0.0, "accuracy": summary["eval_before"]["accuracy"]}], 0.0
    for m in rows:
        train_s += float(m.get("time/step", 0.0))
        if "eval/accuracy" in m:
            points.append({"step": int(m["step"]), "train_s": round(train_s, 1), "accuracy": m["eval/accuracy"]})
    after = summary.get("eval_after")
    if after and points[-1]["step"] != summary.get("steps"):
        points.append({"step": summary.get("steps"), "train_s": round(train_s, 1), "accuracy": after["accuracy"]})
    return points


def curve_of(run: Path) -> tuple[str, list[dict]]:
    """("trl" | "grpokit", the run's held-out points)."""
    curve = run / "curve.jsonl"
    if curve.exists():
        return "trl", [json.loads(line) for line in curve.read_text().splitlines() if line.strip()]
    return "grpokit", grpokit_curve(run)


def time_to_reach(points: list[dict], accuracy: float) -> float | None:
    """Training seconds at the first held-out point at or above ``accuracy`` (None: never)."""
    return next((p["train_s"] for p in points if p["accuracy"] >= accuracy - 1e-9), None)


def show(runs: list[Path]) -> None:
    curves = [(run, *curve_of(run)) for run in runs]
    for run, side, points in curves:
        print(f"{side} ({run}):")
        for p in points:
            print(
                f"    step {p['step']:>3}  train {p['train_s']:>8.1f} s  held-out accuracy {100 * p['accuracy']:.1f}%"
            )
    for run, side, points in curves:  # when each run reached every other run's final accuracy
        for other, other_side, other_points in curves:
            if other == run:
                continue
            target = other_points[-1]["accuracy"]
            t = time_to_reach(points, target)
            when = "never" if t is None else f"after {t:.1f} s of training"
            print(f"{side} reached {other_side}'s final {100 * target:.1f}% {when}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    t = sub.add_parser("trl", help="run the recipe under TRL 1.16")
    t.add_argument("--out", type=Path, required=True)
    t.add_argument("--steps", type=int, default=None)
    s = sub.add_parser("show", help="print the held-out curves of run folders")
    s.add_argument("runs", type=Path, nargs="+")
    args = p.parse_args(argv)
    if args.cmd == "trl":
        run_trl(args.out, args.steps)
    else:
        show(args.runs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
