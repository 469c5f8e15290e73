"""Many domains, one policy, on SmolLM2-135M-Instruct on a CPU (docs/DOMAINS.md): held-out accuracy per
domain for (a) one mixed run, (b) per-domain rounds, (c) one expert per domain then on-policy
distillation of the experts into one student, at equal training steps, each from the same start; and
the frontier curriculum's zero-variance share against a plain run.

    python bench/domains.py --steps 6 --seeds 0 1 --eval-size 48 --out runs/domains   # each seed's pieces
    python bench/domains.py --show runs/domains                                       # the tables again

S = --steps. (a) trains 2S steps on both domains mixed 1:1; (b) S steps on the first domain then S on
the second (train.stages); (c) an expert per domain (S/2 steps each, alone), then the student, from the
same start, distils each expert on its own domain in turn (S/2 steps each: the GRPO advantage plus
algo.distill_coef times the per-token reverse KL to that expert); 2S steps in all, though (c)'s
distillation steps also run the teacher's forward pass. Every final model (and the start, once) is then
scored by one evaluator: greedy, each domain's first --eval-size held-out prompts. The curriculum runs
--curriculum-steps steps twice on a pool of the first domain's first --pool training rows (small enough
that prompts recur, so a per-prompt pass rate can steer sampling): plain, then data.curriculum=frontier.
The recipe is the smollm2-math preset's (G=8, 4 prompts a step, 48 new tokens, lr 5e-6 constant); every
run of a seed starts from the same model and seed. Each finished piece is kept in seed<N>/results.json: a
stopped measurement goes on where it stopped.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
from pathlib import Path

DOMAINS = {
    "add": {
        "task": "reasoning_gym:basic_arithmetic",
        "task_params": {
            "min_terms": 2,
            "max_terms": 2,
            "min_digits": 2,
            "max_digits": 2,
            "operators": ["+"],
            "allow_parentheses": False,
            "allow_negation": False,
            "instruction": "Think briefly, then give the final answer as a number.",
        },
    },
    "chain": {
        "task": "reasoning_gym:chain_sum",
        "task_params": {
            "min_terms": 2,
            "max_terms": 2,
            "min_digits": 1,
            "max_digits": 2,
            "instruction": "Give the final answer as a number.",
        },
    },
}


def base_overrides(out: Path, seed: int, size: argparse.Namespace) -> list[str]:
    """The recipe's settings; no held-out evaluation inside a run (every model is evaluated afterwards by one
    evaluator, `evaluate`, so that the shared start is evaluated once, not once per arm)."""
    return [
        "model.name_or_path=smollm2-135m-instruct",
        f"rollout.group_size={size.group_size}",
        f"rollout.max_new_tokens={size.max_new_tokens}",
        f"train.prompts_per_step={size.prompts}",
        "optim.lr=5e-6",
        "optim.schedule=constant",
        "algo.aggregation=token-mean",
        f"train.seed={seed}",
        "data.eval_size=0",
        f"train.out={out}",
        "train.overwrite=true",
        "train.save_every=0",
        "record.sinks=[]",
        "record.report=false",
    ]


def domains_override(names: list[str]) -> str:
    return "data.domains=" + json.dumps({n: DOMAINS[n] for n in names})


def build_config(overrides: list[str]):
    from grpokit.config import Config
    from grpokit.config.io import apply_overrides
    from grpokit.train.stages import settle_stages

    return settle_stages(apply_overrides(Config(), overrides))


def build(overrides: list[str], cfg=None):
    from grpokit.train import Trainer

    return Trainer(cfg or build_config(overrides), quiet=True)


def train(overrides: list[str]) -> dict:
    """One run; a run stopped by a signal (Ctrl-C, SIGTERM: the trainer checkpoints and returns) stops the
    measurement too, instead of going on to the next piece with a short run. A run whose last step's checkpoint
    is already in its folder (a measurement stopped after it) is not run again."""
    cfg = build_config(overrides)
    out = Path(cfg.train.out)
    if cfg.train.steps and (out / "checkpoints" / f"step-{cfg.train.steps:06d}" / "model").is_dir():
        return json.loads((out / "summary.json").read_text())
    summary = build(overrides, cfg).train()
    if summary.get("interrupted"):
        raise SystemExit(f"bench/domains.py: stopped by {summary.get('stop_signal')}; run it again to go on")
    return summary


def final_model(run: Path) -> str:
    return str(sorted((run / "checkpoints").glob("step-*"))[-1] / "model")


def evaluate(model: str, out: Path, eval_size: int, size: argparse.Namespace) -> dict[str, float]:
    """Greedy held-out accuracy of ``model`` on every domain's first ``eval_size`` held-out prompts (the run's
    own per-domain evaluator, built without training)."""
    over = [*base_overrides(out, 0, size), domains_override(list(DOMAINS)), f"model.name_or_path={model}"]
    return build([*over, f"data.eval_size={eval_size}", "train.steps=0"])._evaluate()


def arms(out: Path, steps: int, seed: int, size: argparse.Namespace) -> dict[str, str]:
    """Every arm of one seed, trained from the same start; returns each arm's final model."""
    a, b = list(DOMAINS)
    half = max(1, steps // 2)
    run = lambda name: out / f"seed{seed}" / name  # noqa: E731
    base = lambda name: base_overrides(run(name), seed, size)  # noqa: E731
    both = domains_override([a, b])
    train([*base("mixed"), both, f"train.steps={2 * steps}"])
    train([*base("rounds"), both, f"train.stages=[{{domain: {a}, steps: {steps}}}, {{domain: {b}, steps: {steps}}}]"])
    models = {"mixed": final_model(run("mixed")), "rounds": final_model(run("rounds"))}
    for d in (a, b):
        train([*base(f"expert-{d}"), domains_override([d]), f"train.steps={half}"])
    student = None
    for i, d in enumerate((a, b)):
        over = [*base(f"distill-{i}"), both, f"train.stages=[{{domain: {d}, steps: {half}}}]"]
        over += [f"algo.distill_teacher={final_model(run(f'expert-{d}'))}", "algo.distill_coef=1.0"]
        over += [f"model.name_or_path={student}"] if student else []
        train(over)
        student = final_model(run(f"distill-{i}"))
    models["experts+distill"] = student
    return models


def curriculum_pool(out: Path, n: int) -> Path:
    """The first domain's first ``n`` training rows as a JSONL file: a pool small enough that prompts recur
    within a short run, so a per-prompt pass rate can steer sampling."""
    from grpokit.data.tasks.reasoning_gym import rows_for

    first = DOMAINS[list(DOMAINS)[0]]
    rows = rows_for(first["task"], first["task_params"])[0](n, 0)
    path = out / f"pool-{n}.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def curriculum(out: Path, steps: int, seed: int, pool: int, size: argparse.Namespace) -> dict[str, float]:
    """Plain sampling against the frontier curriculum on the pool: the zero-variance share of sampled groups."""
    data = [
        f"data.dataset={curriculum_pool(out, pool)}",
        "reward.functions=[grpokit.data.tasks.reasoning_gym:reasoning_gym_accuracy]",
        f"train.steps={steps}",
    ]
    res = {}
    for name, extra in (("plain", []), ("frontier", ["data.curriculum=frontier"])):
        run = out / f"seed{seed}" / f"curriculum-{name}"
        train([*base_overrides(run, seed, size), *data, *extra])
        res[name] = zero_std_share(run)
    return res


def zero_std_share(run: Path) -> float:
    """The share of sampled groups whose rewards were all equal, over the run: the curriculum's own count,
    dynamic sampling's dropped over sampled groups, else frac_reward_zero_std (a plain run keeps every group)."""
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    if any("dynamic_sampling/dropped_groups" in r for r in rows):
        dropped = sum(r["dynamic_sampling/dropped_groups"] for r in rows)
        return dropped / sum(r["dynamic_sampling/sampled_prompts"] for r in rows)
    key = next((k for k in rows[0] if k.endswith("curriculum/zero_std_share")), "frac_reward_zero_std")
    vals = [r[key] for r in rows if isinstance(r.get(key), float) and math.isfinite(r[key])]
    return statistics.fmean(vals)


DEMO_VARIANTS = {
    "plain": [],
    "frontier": ["data.curriculum=frontier"],
    # buckets by the gold sum: a bucket is seen again within a run, a single prompt of 7,278 hardly ever
    "frontier-by-answer": ["data.curriculum=frontier", "data.curriculum_key=answer"],
    "dynamic": ["algo.dynamic_sampling=true"],
}


def demo_curriculum(out: Path, seeds: list[int], variants: list[str]) -> str:
    """The curriculum on the built-in arithmetic task and its demo model (seconds a run): 60 steps of the
    demo's settings (16 prompts x G=8, lr 3e-4) plain, at the frontier and with dynamic sampling; the
    zero-variance share of the groups sampled over the run, the groups sampled, held-out accuracy after."""
    lines = [
        "| sampler | zero-variance share | groups sampled | held-out accuracy after | seeds |",
        "| --- | --- | --- | --- | --- |",
    ]
    for name in variants:
        extra, shares, sampled, acc = DEMO_VARIANTS[name], [], [], []
        for seed in seeds:
            run = out / f"demo-{name}-seed{seed}"
            common = [
                f"train.out={run}",
                "train.overwrite=true",
                f"train.seed={seed}",
                "record.sinks=[]",
                "record.report=false",
            ]
            summary = train(["model.name_or_path=demo", "data.task=arithmetic", *common, *extra])
            rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
            shares.append(zero_std_share(run))
            sampled.append(sum(r.get("dynamic_sampling/sampled_prompts", 16) for r in rows))
            acc.append(summary["eval_after"]["accuracy"])
        lines.append(
            f"| {name} | {statistics.fmean(shares):.3f} ({', '.join(f'{v:.3f}' for v in shares)}) | "
            f"{statistics.fmean(sampled):.0f} | {statistics.fmean(acc):.3f} ({', '.join(f'{v:.3f}' for v in acc)}) | "
            f"{', '.join(map(str, seeds))} |"
        )
    return "\n".join(lines)


def run_seed(out: Path, seed: int, a: argparse.Namespace) -> dict:
    """One seed's arms, the curriculum, then every model evaluated by one evaluator; each finished piece is kept in
    ``seed<N>/results.json``, so a stopped measurement goes on where it stopped."""
    path = out / f"seed{seed}" / "results.json"
    res = json.loads(path.read_text()) if path.exists() else {}
    save = lambda: path.write_text(json.dumps(res, indent=1))  # noqa: E731
    path.parent.mkdir(parents=True, exist_ok=True)
    if "models" not in res:
        res["models"] = arms(out, a.steps, seed, a)
        save()
    if "curriculum" not in res and a.curriculum_steps:
        res["curriculum"] = curriculum(out, a.curriculum_steps, seed, a.pool, a)
        save()
    start = out / "start.json"  # every seed starts from the same model: evaluated once
    if not start.exists():
        start.write_text(json.dumps(evaluate("smollm2-135m-instruct", out / "eval", a.eval_size, a)))
    res.setdefault("eval", {"start": json.loads(start.read_text())})
    for arm, model in res["models"].items():
        if arm not in res["eval"]:
            res["eval"][arm] = evaluate(model, out / "eval", a.eval_size, a)
            save()
    return res


def show(out: Path) -> str:
    paths = sorted(out.glob("seed*/results.json"))
    runs = [json.loads(p.read_text()) for p in paths]
    runs = [r for r in runs if "eval" in r and all(arm in r["eval"] for arm in r.get("models", {}))]
    lines = [
        f"seeds: {len(runs)}; greedy held-out accuracy per domain, mean over seeds (each seed)",
        "",
        "| model | " + " | ".join(DOMAINS) + " | all |",
        "| --- |" + " --- |" * (len(DOMAINS) + 1),
    ]
    for arm in ("start", "mixed", "rounds", "experts+distill"):
        cells = []
        for key in [f"domain/{d}/accuracy" for d in DOMAINS] + ["accuracy"]:
            vals = [r["eval"][arm][key] for r in runs if arm in r["eval"]]
            cells.append(f"{statistics.fmean(vals):.3f} ({', '.join(f'{v:.3f}' for v in vals)})" if vals else "-")
        lines.append(f"| {arm} | " + " | ".join(cells) + " |")
    cur = [r["curriculum"] for r in runs if "curriculum" in r]
    if cur:
        lines += ["", "| sampler | zero-variance share of sampled groups |", "| --- | --- |"]
        for name in ("plain", "frontier"):
            vals = [c[name] for c in cur]
            lines.append(f"| {name} | {statistics.fmean(vals):.3f} ({', '.join(f'{v:.3f}' for v in vals)}) |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=6, help="S: each arm trains 2S steps")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0])
    ap.add_argument("--eval-size", type=int, default=64, help="held-out prompts per domain")
    ap.add_argument("--curriculum-steps", type=int, default=8, help="0: no curriculum runs")
    ap.add_argument("--pool", type=int, default=16, help="training rows of the curriculum runs")
    ap.add_argument("--out", type=Path, default=Path("runs/domains"))
    ap.add_argument("--show", type=Path, default=None)
    ap.add_argument("--group-size", type=int, default=8, help="G (the recipe's 8)")
    ap.add_argument("--max-new-tokens", type=int, default=48, help="the recipe's 48")
    ap.add_argument("--prompts", type=int, default=4, help="prompts per step (the recipe's 4)")
    ap.add_argument("--demo-curriculum", action="store_true", help="only the curriculum on the arithmetic demo")
    ap.add_argument("--variants", nargs="+", default=list(DEMO_VARIANTS), choices=list(DEMO_VARIANTS))
    args = ap.parse_args()
    if args.demo_curriculum:
        print(demo_curriculum(args.out, args.seeds, args.variants))
        return
    if args.show is None:
        for seed in args.seeds:
            run_seed(args.out, seed, args)
    print(show(args.show or args.out))


if __name__ == "__main__":
    main()
