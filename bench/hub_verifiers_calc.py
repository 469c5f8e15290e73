"""Learning on a verifiers environment: held-out success before and after GRPO.

The environment is written the way a verifiers (0.4, ``verifiers.v1``) user writes one: a Taskset of
two-digit multiplications (the calculator task's disjoint splits), a Task whose ``@vf.reward``
``correct`` checks the final ``<answer>``, and a Toolset whose ``@vf.tool`` ``calculator`` evaluates
arithmetic. grpokit trains on it through its adapter (grpokit.env.hubs.verifiers_env): the tasks as
prompts, the rubric as the reward, the toolset as each episode's tools. The model is the shipped
calculator demo model (pre-warmed on the tag format: it calls the tool on about a third of its
samples and otherwise guesses; docs/TASKS.md), with the calculator demo's settings.

    PYTHONPATH=src python bench/hub_verifiers_calc.py [--steps 60] [--seed 0] [--out /tmp/vf-calc]

Prints one JSON line: held-out greedy success before and after (500 held-out tasks), tool use,
wall time and the machine's load average.
"""

from __future__ import annotations

import argparse
import json
import os
import time

import verifiers.v1 as vf

from grpokit.config.io import apply_overrides
from grpokit.config.sections import Config
from grpokit.data.tasks import calculator as calc
from grpokit.env.builtin import calculator as evaluate_arithmetic
from grpokit.env.hubs.verifiers_env import (
    rubric_rewards,
    rubric_weights,
    taskset_rows,
    toolset_environment,
)
from grpokit.train import Trainer


class MulData(vf.TaskData):
    answer: str


class MulTask(vf.Task[MulData, vf.State, vf.TaskConfig]):
    @vf.reward
    def correct(self, task: MulData, trace: vf.Trace) -> float:
        """1 when the final reply's <answer> is the product."""
        reply = trace.last_reply
        return float("<answer>" in reply and reply.split("<answer>")[-1].split("</answer>")[0].strip() == task.answer)


class MulTaskset(vf.Taskset[MulTask, vf.TasksetConfig]):
    """Training or held-out problems (the calculator task's splits: disjoint by construction)."""

    rows: list[dict] = []

    def load(self):
        for r in self.rows:
            yield MulTask(MulData(prompt=r["prompt"], answer=r["answer"]), self.config.task)


def taskset(rows: list[dict]) -> MulTaskset:
    ts = MulTaskset(vf.TasksetConfig())
    ts.rows = rows
    return ts


class Calculator(vf.Toolset):
    @vf.tool
    def calculator(self, expression: str) -> str:
        """Evaluate an arithmetic expression exactly."""
        return evaluate_arithmetic(expression)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default="/tmp/vf-calc")
    a = p.parse_args()
    train, held_out = taskset(calc.train_rows(a.steps * 16, seed=a.seed)), taskset(calc.held_out_rows(500))
    cfg = apply_overrides(
        Config(),
        [
            f"model.name_or_path={calc.calc_model_path()}",
            "data.task=",
            "reward.functions=[]",
            f"reward.weights=[{','.join(map(str, rubric_weights(train)))}]",
            "rollout.group_size=8",
            "train.prompts_per_step=16",
            "optim.lr=3e-4",
            "rollout.temperature=1.0",
            "rollout.max_new_tokens=8",
            "env.max_turns=4",
            "env.tool_format=tags",
            f"train.steps={a.steps}",
            "train.save_every=0",
            f"train.seed={a.seed}",
            f"train.out={a.out}",
            "train.overwrite=true",
            "record.sinks=[]",
            "record.report=false",
        ],
    )
    start = time.time()
    tr = Trainer(
        cfg,
        reward_funcs=rubric_rewards(train),
        train_rows=taskset_rows(train),
        eval_rows=taskset_rows(held_out),
        environment_factory=toolset_environment(Calculator),
        quiet=True,
    )
    tr.train()
    summary = json.loads((tr.run_dir / "summary.json").read_text())
    print(
        json.dumps(
            {
                "steps": a.steps,
                "seed": a.seed,
                "wall_s": round(time.time() - start, 1),
                "load_avg_1m_end": os.getloadavg()[0],
                "eval_before": summary.get("eval_before"),
                "eval_after": summary.get("eval_after"),
            }
        )
    )


if __name__ == "__main__":
    main()
