"""Record (or check) every variant's metrics for a few deterministic CPU steps on the demo task.

A refactor must not move any number that it did not mean to move. This script writes the record,
``tests/golden/variant_metrics.json``; ``tests/project/test_golden_metrics.py`` re-runs a subset in
CI and this script re-runs them all (``--check``). Timing and throughput keys
are left out: they are the only values that differ between two identical runs.

    python scripts/golden_metrics.py --write      # record (when a change of numbers is meant)
    python scripts/golden_metrics.py --check      # compare every variant against the record
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
from pathlib import Path

GOLDEN = Path(__file__).resolve().parent.parent / "tests" / "golden" / "variant_metrics.json"
SMALL = [
    "train.steps=2",
    "train.prompts_per_step=4",
    "rollout.group_size=8",
    "data.eval_size=16",
    "record.sinks=[jsonl]",
    "record.report=false",
    "optim.lr=1e-3",
    "train.threads=1",
]
# pairs of options no single variant covers
EXTRA = {
    "kl-k3-loss-bias": ["algo.beta=0.04", "algo.kl_bias_correction=true", "algo.num_iterations=2"],
    "dual-clip-token-mean": ["algo.dual_clip=3.0", "algo.aggregation=token-mean", "algo.num_iterations=2"],
    "gspo-kl": ["algo.ratio_level=sequence", "algo.beta=0.04", "algo.num_iterations=2"],
    "dapo-entropy-top": [
        "algo.clip_high=0.28",
        "algo.aggregation=token-mean",
        "algo.entropy_top_fraction=0.5",
        "algo.mask_truncated=true",
    ],
    "rloo-kl-reward": ["algo.baseline=leave_one_out", "algo.scale=none", "algo.beta=0.04", "algo.kl_placement=reward"],
}
SKIP = ("time", "seconds", "per_second", "tokens_per_second", "runtime", "memory")


def variants() -> dict[str, list[str]]:
    try:
        from grpokit.algo.variants import VARIANTS
    except ImportError:
        from grpokit.algo.variants import VARIANTS
    return {**{k: v[1] for k, v in VARIANTS.items()}, **EXTRA}


def run_one(overrides: list[str]) -> list[dict]:
    from grpokit.config import Config, apply_overrides
    from grpokit.train import Trainer

    keep = {o.split("=")[0] for o in overrides}
    with tempfile.TemporaryDirectory() as d:
        cfg = apply_overrides(
            Config(), overrides + [s for s in SMALL if s.split("=")[0] not in keep] + [f"train.out={d}/run"]
        )
        Trainer(cfg, quiet=True).train()
        lines = [json.loads(l) for l in (Path(d) / "run" / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in l.items() if not any(s in k for s in SKIP)} for l in lines]


def same(a, b, rel: float = 1e-4) -> bool:
    """Equal up to ``rel``: the record's machine and another CPU kind sum reductions in another
    order (SIMD width), which moved grad_norm, kl and ratio/mean by up to 2.4e-6 relative between
    the recording machine and an AMD EPYC one; a moved stage moves them by far more."""
    if isinstance(a, float) or isinstance(b, float):
        if a is None or b is None:
            return a is b
        if math.isnan(a) and math.isnan(b):
            return True
        return abs(a - b) <= rel * max(1.0, abs(a), abs(b))
    return a == b


def diff(want: list[dict], got: list[dict]) -> list[str]:
    out = []
    for i, (w, g) in enumerate(zip(want, got)):
        for k in sorted(w):  # a metric added since the record is new, not moved
            if k not in g or not same(w[k], g[k]):
                out.append(f"step {i + 1} {k}: recorded {w.get(k)!r}, now {g.get(k)!r}")
    if len(want) != len(got):
        out.append(f"{len(want)} steps recorded, {len(got)} now")
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--write", action="store_true")
    ap.add_argument("--check", action="store_true")
    ap.add_argument("--only", default="")
    args = ap.parse_args()
    names = [n for n in variants() if not args.only or n in args.only.split(",")]
    if args.write:
        rec = {n: run_one(variants()[n]) for n in names}
        GOLDEN.parent.mkdir(parents=True, exist_ok=True)
        GOLDEN.write_text(json.dumps(rec, indent=1, sort_keys=True))
        print(f"wrote {len(rec)} variants to {GOLDEN}")
        return 0
    rec = json.loads(GOLDEN.read_text())
    bad = 0
    for n in names:
        d = diff(rec[n], run_one(variants()[n]))
        print(f"{n}: {'same' if not d else 'DIFFERS'}")
        for line in d[:20]:
            print("   ", line)
        bad += bool(d)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
