"""What env/calls.py ``call_many`` adds to a batch of trivial environment resets.

    PYTHONPATH=src python bench/call_many_overhead.py --calls 128 --tries 20
    git show <commit>:src/grpokit/env/calls.py > /tmp/calls_before.py
    PYTHONPATH=src python bench/call_many_overhead.py --before /tmp/calls_before.py

Each try builds and resets ``--calls`` instances of a class whose ``reset`` does nothing, through a
plain loop and through ``call_many`` (8 threads, as the episode runner), and with ``--before`` also
through another version of calls.py loaded from that file; the versions alternate (bench/alternate.py).
Prints the median and the range of each in milliseconds, and the threads each version left running.
"""

from __future__ import annotations

import argparse
import importlib.util
import threading

from alternate import turns
from timing import seconds, spread


class Trivial:
    def reset(self, **row):
        return None


def _build_and_reset(row: dict) -> tuple:
    env = Trivial()
    return env, env.reset(**row)


def _load(path: str):
    spec = importlib.util.spec_from_file_location("calls_before", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=128, help="resets a batch (default 128: 16 prompts x G=8)")
    ap.add_argument("--tries", type=int, default=20, help="batches timed per version (default 20)")
    ap.add_argument("--before", help="another calls.py to time alongside (e.g. the version before a change)")
    args = ap.parse_args()
    from grpokit.env import calls

    rows = [{"prompt": f"{i}*{i}="} for i in range(args.calls)]
    batch = [lambda r=r: _build_and_reset(r) for r in rows]
    versions = {"loop": lambda: [c() for c in batch], "call_many": lambda: calls.call_many("bench", batch, 30)}
    if args.before:
        old = _load(args.before)
        versions["call_many before"] = lambda: old.call_many("bench-before", batch, 30)
    times: dict[str, list[float]] = {k: [] for k in versions}
    for _, name in turns(list(versions), args.tries):
        times[name].append(seconds(versions[name])[0] * 1e3)
    for name, ms in times.items():
        s = spread(ms)
        print(f"{name:>17}: median {s['median']:7.2f} ms, {s['min']:.2f}-{s['max']:.2f} ms ({s['n']} batches)")
    print(
        "threads alive:",
        {k: sum(t.name == f"grpokit-{k}" for t in threading.enumerate()) for k in ("bench", "bench-before")},
    )


if __name__ == "__main__":
    main()
