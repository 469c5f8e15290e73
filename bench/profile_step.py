"""Where one grpokit step's seconds go: torch.profiler over measured steps of the bench workload.

    PYTHONPATH=src python bench/profile_step.py --model /tmp/grpokit-bench-models/qwen-h512-L8 --threads 2

Prints the trainer's own phase timer (rollout, reward, update) per step, the phases bench/worker.py
measures, and the profiler's top operators by self CPU time. Read with bench/RESULTS.md.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import worker  # noqa: E402


def main(argv=None):
    p = argparse.ArgumentParser()
    p.add_argument("--model", required=True)
    p.add_argument("--threads", type=int, default=0)
    p.add_argument("--G", type=int, default=8)
    p.add_argument("--P", type=int, default=8)
    p.add_argument("--T", type=int, default=32)
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--rows", type=int, default=25)
    p.add_argument("--no-profiler", action="store_true")
    p.add_argument("--set", action="append", default=[], help="grpokit config override KEY=VALUE (repeatable)")
    a = p.parse_args(argv)
    if a.threads:
        torch.set_num_threads(a.threads)
    wa = argparse.Namespace(model=a.model, G=a.G, P=a.P, T=a.T, steps=a.steps, warmup=1, beta=0.04, lr=1e-5,
                            device="cpu", dtype="float32", seed=0, threads=a.threads, mbs=0, set=a.set)
    clock = worker.PhaseClock()
    import grpokit.train as gt
    # run warm-up + measured steps through the worker's own grpokit runner, profiling the measured ones
    orig_step = gt.Trainer.train_step
    prof = None if a.no_profiler else torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU])
    count = {"n": 0}

    def step(self):
        count["n"] += 1
        if count["n"] == 2 and prof is not None:
            prof.__enter__()
        t = time.perf_counter()
        m = orig_step(self)
        print(f"step {count['n']}: {time.perf_counter() - t:.3f}s  timer "
              + " ".join(f"{k}={v:.3f}" for k, v in m.items() if k.startswith("time/")), flush=True)
        return m
    gt.Trainer.train_step = step
    recs = worker.run_grpokit(wa, clock)
    if prof is not None:
        prof.__exit__(None, None, None)
    for r in recs:
        print("worker phases:", {k: round(v, 3) for k, v in r["phases"].items()}, "step_s", round(r["step_s"], 3))
    if prof is not None:
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=a.rows))


if __name__ == "__main__":
    main()
