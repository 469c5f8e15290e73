"""What report.html weighs for a 1,000-step run (the figure docs/MONITORING.md quotes).

A real 1,000-step run takes an hour of CPU, so the run is stretched from a short real one: its
metrics.jsonl rows (the held-out evaluation rows left out) are repeated up to --steps, with the last
row's evaluation at the end, and its samples.jsonl rows repeated every `record.samples_every` steps
(default 10: 100 sampled steps). Repeated values have the same number of digits as fresh ones, so the
size is that of a real run of the same metrics and samples.

    grpokit train --out /tmp/demo20 train.steps=20   # about 10 s on a CPU
    python bench/report_size.py /tmp/demo20
"""

from __future__ import annotations

import argparse
import json
import re
import tempfile
from pathlib import Path

from grpokit.record.jsonl import read_jsonl
from grpokit.record.report import _json_for_script, render_report


def stretch(src: Path, dst: Path, steps: int, samples_every: int) -> None:
    rows = read_jsonl(src / "metrics.jsonl")
    plain = [r for r in rows if not any(k.startswith("eval/") for k in r)] or rows
    with open(dst / "metrics.jsonl", "w") as f:
        for step in range(1, steps + 1):
            row = dict(plain[(step - 1) % len(plain)], step=step)
            if step == steps:
                row |= {k: v for k, v in rows[-1].items() if k.startswith("eval/")}
            f.write(json.dumps(row) + "\n")
    samples = read_jsonl(src / "samples.jsonl")
    per_step = sum(1 for s in samples if s["step"] == samples[0]["step"])
    with open(dst / "samples.jsonl", "w") as f:
        for i, step in enumerate(range(samples_every, steps + 1, samples_every)):
            for j in range(per_step):
                f.write(json.dumps(dict(samples[(i * per_step + j) % len(samples)], step=step)) + "\n")
    for name in ("config.yaml", "summary.json", "health.jsonl"):
        if (src / name).exists():
            (dst / name).write_bytes((src / name).read_bytes())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("run", type=Path, help="a short real run folder (metrics.jsonl and samples.jsonl)")
    ap.add_argument("--steps", type=int, default=1000)
    ap.add_argument("--samples-every", type=int, default=10)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        stretch(args.run, Path(tmp), args.steps, args.samples_every)
        html = render_report(Path(tmp))
        data = re.search(r'id="grpokit-data">(.*?)</script>', html, re.S).group(1)
        payload = json.loads(data)
        run = payload["runs"][0]
        metrics = len(_json_for_script({"steps": run["steps"], "series": run["series"]}).encode())
        samples = len(_json_for_script(run["samples"]).encode())
        n_metrics = len({k for r in read_jsonl(Path(tmp) / "metrics.jsonl") for k in r} - {"step"})
        n_samples = sum(len(r["completions"]) for r in run["samples"])
    kb, size = 1000, len(html.encode())
    print(
        f"{args.steps} steps, {n_metrics} metrics logged, {len(run['series'])} drawn, "
        f"{len(run['samples'])} sample rows ({n_samples} completions): report.html {size / kb:.0f} KB: "
        f"metric values {metrics / kb:.0f} KB, samples {samples / kb:.0f} KB, "
        f"the rest (library, script, styles, page) {(size - metrics - samples) / kb:.0f} KB"
    )


if __name__ == "__main__":
    main()
