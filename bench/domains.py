"""Many domains, one policy, on SmolLM2-135M-Instruct on a CPU (docs/DOMAINS.md): held-out accuracy per
domain for (a) one mixed run, (b) per-domain rounds, (c) one expert per domain then on-policy
distillation of the experts into one student, at equal training steps, each from the same start; and
the frontier curriculum's zero-variance share against a plain run and dynamic sampling.

    python bench/domains.py --steps 8 --seeds 0 1 --eval-size 64 --out runs/domains   # each arm, each seed
    python bench/domains.py --show runs/domains                                       # the tables again

S = --steps. (a) trains 2S steps on both domains mixed 1:1; (b) S steps on the first domain then S on
the second (train.stages); (c) an expert per domain (S/2 steps each, alone), then the student, from the
same start, distils each expert on its own domain in turn (S/2 steps each: the GRPO advantage plus
algo.distill_coef times the per-token reverse KL to that expert); 2S steps in all, though (c)'s
distillation steps also run the teacher's forward pass. The curriculum runs S steps on the first domain
three times: plain, data.curriculum=frontier, algo.dynamic_sampling=true (which samples more groups per
step: its share is of the groups it sampled). The recipe is the smollm2-math preset's (G=8, 4 prompts a
step, 48 new tokens, lr 5e-6 constant); every run of a seed starts from the same model and seed.
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
        "task_params": {"min_terms": 2, "max_terms": 2, "instruction": "Give the final answer as a number."},
    },
}


def base_overrides(out: Path, seed: int, eval_size: int, size: argparse.Namespace) -> list[str]:
    return [
        "model.name_or_path=smollm2-135m-instruct",
        f"rollout.group_size={size.group_size}",
        f"rollout.max_new_tokens={size.max_new_tokens}",
        f"train.prompts_per_step={size.prompts}",
        "optim.lr=5e-6",
        "optim.schedule=constant",
        "algo.aggregation=token-mean",
        f"train.seed={seed}",
        f"data.eval_size={eval_size}",
        f"train.out={out}",
        "train.overwrite=true",
        "train.save_every=0",
        "record.sinks=[]",
        "record.report=false",
    ]


def domains_override(names: list[str]) -> str:
    return "data.domains=" + json.dumps({n: DOMAINS[n] for n in names})


def train(overrides: list[str]) -> dict:
    from grpokit.config import Config
    from grpokit.config.io import apply_overrides
    from grpokit.train import Trainer

    cfg = apply_overrides(Config(), overrides)
    return Trainer(cfg, quiet=True).train()


def final_model(run: Path) -> str:
    return str(sorted((run / "checkpoints").glob("step-*"))[-1] / "model")


def arms(out: Path, steps: int, seed: int, eval_size: int, size: argparse.Namespace) -> dict[str, dict]:
    """Every arm of one seed; each returns its run summary (held-out per domain before and after)."""
    a, b = list(DOMAINS)
    half = max(1, steps // 2)
    base = lambda name: base_overrides(out / f"seed{seed}" / name, seed, eval_size, size)  # noqa: E731
    both = domains_override([a, b])
    res = {
        "mixed": train([*base("mixed"), both, f"train.steps={2 * steps}"]),
        "rounds": train(
            [*base("rounds"), both, f"train.stages=[{{domain: {a}, steps: {steps}}}, {{domain: {b}, steps: {steps}}}]"]
        ),
    }
    experts = {d: out / f"seed{seed}" / f"expert-{d}" for d in (a, b)}
    for d, run in experts.items():
        train([*base(f"expert-{d}"), domains_override([d]), f"train.steps={half}", "data.eval_size=0"])
    student = None
    for i, d in enumerate((a, b)):
        over = [*base(f"distill-{i}"), both, f"train.stages=[{{domain: {d}, steps: {half}}}]"]
        over += [f"algo.distill_teacher={final_model(experts[d])}", "algo.distill_coef=1.0"]
        over += [f"model.name_or_path={student}"] if student else []
        res[f"distill-{i}"] = train(over)
        student = final_model(out / f"seed{seed}" / f"distill-{i}")
    res["experts+distill"] = {
        "eval_before": res["distill-0"]["eval_before"],
        "eval_after": res.pop("distill-1")["eval_after"],
    }
    res.pop("distill-0")
    for name, extra in (
        ("plain", []),
        ("frontier", ["data.curriculum=frontier"]),
        ("dynamic", ["algo.dynamic_sampling=true"]),
    ):
        train([*base(f"curriculum-{name}"), domains_override([a]), f"train.steps={steps}", "data.eval_size=0", *extra])
        res[f"curriculum-{name}"] = {"zero_std_share": zero_std_share(out / f"seed{seed}" / f"curriculum-{name}")}
    (out / f"seed{seed}" / "results.json").write_text(json.dumps(res, indent=1))
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


def show(out: Path) -> str:
    seeds = sorted(out.glob("seed*/results.json"))
    runs = [json.loads(p.read_text()) for p in seeds]
    lines = [
        f"seeds: {', '.join(p.parent.name for p in seeds)}",
        "",
        "| arm | " + " | ".join(f"{d} before -> after" for d in DOMAINS) + " |",
    ]
    lines.append("| --- |" + " --- |" * len(DOMAINS))
    for arm in ("mixed", "rounds", "experts+distill"):
        cells = []
        for d in DOMAINS:
            key = f"domain/{d}/accuracy"
            before = [r[arm]["eval_before"].get(key, float("nan")) for r in runs]
            after = [r[arm]["eval_after"].get(key, float("nan")) for r in runs]
            each = ", ".join(f"{x:.3f}" for x in after)
            cells.append(f"{statistics.fmean(before):.3f} -> {statistics.fmean(after):.3f} ({each})")
        lines.append(f"| {arm} | " + " | ".join(cells) + " |")
    lines += ["", "| sampler | zero-variance share of sampled groups |", "| --- | --- |"]
    for name in ("plain", "frontier", "dynamic"):
        vals = [r[f"curriculum-{name}"]["zero_std_share"] for r in runs]
        lines.append(f"| {name} | {statistics.fmean(vals):.3f} ({', '.join(f'{v:.3f}' for v in vals)}) |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0])
    ap.add_argument("--eval-size", type=int, default=64)
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
            arms(args.out, args.steps, seed, args.eval_size, args)
    print(show(args.show or args.out))


if __name__ == "__main__":
    main()
