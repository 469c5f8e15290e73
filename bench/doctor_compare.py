"""grpokit doctor against rldoctor, rlprobe and rlwatch on the same planted runs (docs/MONITORING.md).

    python bench/doctor_compare.py --out /tmp/doctor_bench              # train the runs, then compare
    python bench/doctor_compare.py --out /tmp/doctor_bench --no-train   # compare runs already there

Each planted run is a real `grpokit train` of the built-in arithmetic task (--steps, 40 by default,
held-out evaluation every quarter of them) with one fault planted by a config change or a reward function of
bench/doctor/planted_rewards.py; two runs are healthy. Every tool reads the same run, converted to
what it reads: rldoctor the run's metrics.jsonl (TRL names, which it maps), rlprobe a recording made
with its own Recorder, rlwatch its metrics store filled through its own `log_step`; each then runs its
own command line (`rl-doctor diagnose`, `rlprobe doctor`, `rlwatch diagnose`) as a new user would.
The three are installed apart from grpokit's environment: `pip install --target /tmp/doctors
rldoctor==0.2.0 rlprobe==0.1.0 rlwatch==0.5.1` (--tools names the folder).

A broken run is "named" when a finding names its planted cause (the codes or words listed per run
below), "caught" when the tool raised something else, "silent" when it raised nothing; a healthy run
is "quiet" or a "false alarm" (anything at warning level or above). The table goes to stdout and,
as JSON, to OUT/table.json.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HERE = Path(__file__).resolve().parent / "doctor"
RW = "planted_rewards"
# (name, overrides, the planted cause as words a finding may name: grpokit codes and the others' terms);
# no cause: a healthy run
RUNS: list[tuple[str, list[str], list[str]]] = [
    ("healthy", [], []),
    ("healthy_seed1", ["train.seed=1"], []),
    ("lr_too_high", ["optim.lr=0.02"], ["entropy", "collapse", "grad", "kl", "heldout_drop", "spread", "same_text"]),
    ("reward_always_0", [f"reward.functions=[{RW}:always_zero]"], ["reward_constant", "zero", "variance", "constant"]),
    (
        "group_size_2",
        ["rollout.group_size=2"],
        ["zero_std", "zero_grad", "small_group", "variance", "signal", "advantage"],
    ),
    ("low_temperature", ["rollout.temperature=0.05"], ["zero_std", "entropy", "same_text", "variance", "advantage"]),
    ("kl_blowup", ["algo.beta=0.5", "optim.lr=0.01", "algo.num_iterations=4"], ["kl"]),
    ("clip_too_tight", ["algo.clip_low=0.0005", "algo.clip_high=0.0005", "algo.num_iterations=4"], ["clip"]),
    ("truncated", ["rollout.max_new_tokens=4"], ["truncat", "length"]),
    ("length_only_reward", [f"reward.functions=[{RW}:length_only]"], ["hacking", "length", "heldout", "eval"]),
    ("constant_format_term", [f"reward.functions=[task,{RW}:constant_one]"], ["constant_component", "composition"]),
    ("flaky_reward", [f"reward.functions=[{RW}:flaky_task]"], ["reward_failures", "verifier", "fail"]),
]


def train(out: Path, steps: int, jobs: int) -> None:
    """Train every planted run not already finished in `out`, `jobs` at a time."""
    from concurrent.futures import ThreadPoolExecutor

    env = os.environ | {"PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(HERE)])}
    base = [f"train.steps={steps}", f"train.eval_every={max(1, steps // 4)}", "data.eval_size=200"]
    out.mkdir(parents=True, exist_ok=True)

    def one(name: str, overrides: list[str]) -> None:
        run = out / name
        if (run / "summary.json").is_file() and "steps" in json.loads((run / "summary.json").read_text()):
            return
        print(f"training {name}: {' '.join(overrides) or '(defaults)'}", flush=True)
        cmd = [sys.executable, "-m", "grpokit", "train", "--out", str(run), "--overwrite", *base, *overrides]
        with (out / f"{name}.log").open("w") as log:
            subprocess.run(cmd, env=env, check=False, stdout=log, stderr=subprocess.STDOUT)

    with ThreadPoolExecutor(jobs) as pool:
        list(pool.map(lambda r: one(r[0], r[1]), RUNS))


def rows(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]


def grpokit_doctor(run: Path, tools: Path) -> list[tuple[str, str]]:
    env = os.environ | {"PYTHONPATH": str(ROOT / "src")}
    out = subprocess.run(
        [sys.executable, "-m", "grpokit", "doctor", str(run), "--json"], env=env, capture_output=True, text=True
    )
    return [(f["code"], f["level"]) for f in json.loads(out.stdout)["findings"]]


CONVERT = r"""
import json, sys
from pathlib import Path
tool, src, dst = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3])
rows = [json.loads(l) for l in (src / "metrics.jsonl").read_text().splitlines() if l.strip()]
g = lambda r, k: r.get(k) if isinstance(r.get(k), (int, float)) else None
if tool == "rlprobe":
    from rlprobe.recorder.core import Recorder
    rec = Recorder(dst, algorithm="grpo", capture_env=False, install_handlers=False)
    for r in rows:
        comps = {k.split("/")[1]: v for k, v in r.items() if k.startswith("rewards/") and k.endswith("/mean")}
        m = dict(reward_mean=g(r, "reward"), reward_std=g(r, "reward_std"), reward_min=g(r, "completions/reward_min"),
                 reward_max=g(r, "completions/reward_max"), kl_mean=g(r, "kl"), entropy_mean=g(r, "entropy"),
                 clip_fraction=g(r, "clip_ratio/region_mean"), zero_variance_group_frac=g(r, "frac_reward_zero_std"),
                 loss=g(r, "loss"), lr=g(r, "learning_rate"), grad_norm=g(r, "grad_norm"),
                 completion_len_mean=g(r, "completions/mean_length"), completion_len_max=g(r, "completions/max_length"),
                 truncation_rate=g(r, "completions/clipped_ratio"), step_time_s=g(r, "time/step"))
        m = {k: v for k, v in m.items() if v is not None}
        if comps:
            m["reward_components"] = comps
        if g(r, "eval/accuracy") is not None:
            m["extra"] = {"eval_accuracy": r["eval/accuracy"]}
        rec.log_step(int(r["step"]), **m)
    rec.close()
else:
    from rlwatch.config import load_config
    from rlwatch.core import RLWatch
    cfg = load_config(None)
    cfg.storage.log_dir, cfg.run_id = str(dst), src.name
    mon = RLWatch(cfg)
    mon.start()
    for r in rows:
        mon.log_step(int(r["step"]), entropy=g(r, "entropy"), kl_divergence=g(r, "kl"), reward_mean=g(r, "reward"),
                     reward_std=g(r, "reward_std"), loss=g(r, "loss"), learning_rate=g(r, "learning_rate"),
                     clip_fraction=g(r, "clip_ratio/region_mean"), grad_norm=g(r, "grad_norm"))
    mon.stop()
"""


class ToolFailed(Exception):
    """A tool that did not run, or whose input could not be converted: its one line for the table."""


def _tool_json(tools: Path, argv: list[str]) -> object:
    """Run one of the other tools' command lines (installed under ``tools``) and read its JSON answer."""
    env = os.environ | {"PYTHONPATH": str(tools)}
    out = subprocess.run(
        [sys.executable, str(tools / "bin" / argv[0]), *argv[1:]], env=env, capture_output=True, text=True
    )
    try:
        return json.loads(out.stdout)
    except json.JSONDecodeError:
        raise ToolFailed("(did not run: " + (out.stderr.strip().splitlines() or ["?"])[-1][:80] + ")") from None


def _convert(kind: str, run: Path, tools: Path, dst: Path) -> None:
    """Write the run as the tool ``kind`` reads it (CONVERT, in the tools' own environment) into ``dst``."""
    env = os.environ | {"PYTHONPATH": str(tools)}
    cmd = [sys.executable, "-c", CONVERT, kind, str(run), str(dst)]
    conv = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if conv.returncode:
        raise ToolFailed("(conversion failed: " + conv.stderr.strip().splitlines()[-1][:80] + ")")


def _found(found: object, key: str, names: tuple[str, ...]) -> list[tuple[str, str]]:
    """(name, level) of each finding of a tool's JSON (a list, or a dict holding the list at ``key``)."""
    found = found.get(key, []) if isinstance(found, dict) else found
    return [
        (str(next((f.get(n) for n in names if f.get(n)), None)), str(f.get("severity", "warning")).lower())
        for f in found
    ]


def rldoctor(run: Path, tools: Path) -> list[tuple[str, str]]:
    report = _tool_json(tools, ["rldoctor", "diagnose", str(run / "metrics.jsonl"), "-f", "json"])
    return _found(report, "findings", ("detector", "id", "title"))


def rlprobe(run: Path, tools: Path) -> list[tuple[str, str]]:
    dst = run.parent / "_converted" / "rlprobe" / run.name
    if not dst.exists():
        _convert("rlprobe", run, tools, dst)
    found = _tool_json(tools, ["rlprobe", "doctor", str(dst), "--json"])
    return _found(found, "findings", ("signature_id", "detector", "id", "title"))


def rlwatch(run: Path, tools: Path) -> list[tuple[str, str]]:
    dst = run.parent / "_converted" / "rlwatch"
    _convert("rlwatch", run, tools, dst)
    argv = ["rlwatch", "diagnose", "--log-dir", str(dst), "--run-id", run.name, "--format", "json"]
    report = _tool_json(tools, argv)
    return _found(report if isinstance(report, dict) else {"alerts": report}, "alerts", ("detector",))


def _findings(tool, run: Path, tools: Path) -> list[tuple[str, str]]:
    try:
        return tool(run, tools)
    except ToolFailed as e:
        return [(str(e), "error")]


TOOLS = {"grpokit doctor": grpokit_doctor, "rldoctor": rldoctor, "rlprobe": rlprobe, "rlwatch": rlwatch}
QUIET_LEVELS = {"info", "ok", "none", "note", "skipped"}  # rldoctor lists every detector, quiet ones as ok/skipped


def verdict(found: list[tuple[str, str]], cause: list[str]) -> str:
    alarms = [name for name, level in found if level not in QUIET_LEVELS and not name.startswith("(")]
    if any(name.startswith("(") for name, _ in found):
        return "did not run"
    if not cause:
        return "false alarm" if alarms else "quiet"
    if not alarms:
        return "silent"
    return "named" if any(re.search(w, a, re.I) for a in alarms for w in cause) else "caught"


def heldout(run: Path) -> str:
    s = json.loads((run / "summary.json").read_text()) if (run / "summary.json").is_file() else {}
    a, b = (s.get(k, {}).get("accuracy") for k in ("eval_before", "eval_after"))
    if isinstance(a, float) and isinstance(b, float):
        return f"{a:.0%} -> {b:.0%}"
    return f"{a:.0%} -> stopped" if isinstance(a, float) else "?"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, required=True, help="folder of the planted runs")
    p.add_argument("--tools", type=Path, default=Path("/tmp/doctors"), help="pip --target folder of the other tools")
    p.add_argument("--no-train", action="store_true", help="compare the runs already in --out")
    p.add_argument("--steps", type=int, default=40, help="steps per run (held-out evaluation every quarter)")
    p.add_argument("--jobs", type=int, default=1, help="runs trained at once")
    args = p.parse_args()
    if not args.no_train:
        train(args.out, args.steps, args.jobs)
    table = []
    for name, _, cause in RUNS:
        run = args.out / name
        if not (run / "metrics.jsonl").is_file():
            print(f"{name}: no run (training failed?)", flush=True)
            continue
        found = {tool: _findings(fn, run, args.tools) for tool, fn in TOOLS.items()}
        table.append(
            {
                "run": name,
                "heldout": heldout(run),
                "found": found,
                "verdict": {t: verdict(f, cause) for t, f in found.items()},
            }
        )
        print(
            f"{name:22} {heldout(run):12} " + " | ".join(f"{t}: {table[-1]['verdict'][t]}" for t in TOOLS), flush=True
        )
    (args.out / "table.json").write_text(json.dumps(table, indent=1))
    print("\n| run | held-out | " + " | ".join(TOOLS) + " |\n|---|---|" + "---|" * len(TOOLS))
    for row in table:
        print(f"| {row['run']} | {row['heldout']} | " + " | ".join(row["verdict"][t] for t in TOOLS) + " |")
    for t in TOOLS:
        v = [row["verdict"][t] for row in table]
        print(
            f"{t}: named {v.count('named')}, caught {v.count('caught')}, silent {v.count('silent')}, "
            f"false alarms {v.count('false alarm')}, quiet {v.count('quiet')}"
        )


if __name__ == "__main__":
    main()
