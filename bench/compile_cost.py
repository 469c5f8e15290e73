"""model.compile's cost and gain: per-step wall time of the first steps of the built-in demo (the shipped
tiny Llama on two-digit addition), eager and with ``model.compile=true``, and whether the numbers agree.

    PYTHONPATH=src python bench/compile_cost.py [--steps 6] [--backend inductor]

It prints one JSON line per mode. On a CPU and a 0.26M-parameter model this measures the compile's
price, not a speed-up; the gain that matters is on a real model and GPU (bench/RESULTS.md says which
were measured).
"""

import argparse
import json
import tempfile
import time

from grpokit.config import Config, apply_overrides
from grpokit.train import Trainer


def run(compile_: bool, steps: int, backend: str) -> dict:
    with tempfile.TemporaryDirectory() as d:
        cfg = apply_overrides(
            Config(),
            [
                f"train.steps={steps}",
                f"train.out={d}/run",
                "record.sinks=[]",
                "record.report=false",
                "data.eval_size=0",
                "train.threads=2",
                f"model.compile={str(compile_).lower()}",
                *([f"model.compile_backend={backend}"] if compile_ else []),  # an eager run reads no backend
            ],
        )
        tr = Trainer(cfg, quiet=True)
        times, last = [], {}
        for _ in range(steps):
            t = time.perf_counter()
            last = tr.train_step()
            tr.step += 1
            times.append(round(time.perf_counter() - t, 3))
    return {
        "compile": compile_,
        "backend": backend if compile_ else None,
        "step_seconds": times,
        "last_loss": last["loss"],
        "last_grad_norm": last["grad_norm"],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--backend", default="inductor")
    a = ap.parse_args()
    for mode in (False, True):
        print(json.dumps(run(mode, a.steps, a.backend)))


if __name__ == "__main__":
    main()
