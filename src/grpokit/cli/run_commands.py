"""``grpokit report`` and ``grpokit doctor``: the commands that read a run folder.

A path that holds no run is refused in one sentence (a report or a diagnosis of nothing would mislead).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from grpokit.config.sections import ConfigError


def check_run_folder(d: str) -> None:
    """Refuse, in one sentence, a path that holds no run (a report or a diagnosis of nothing would mislead)."""
    from grpokit.train.resume import CONFIG_FILE

    what = "give the folder a grpokit train run wrote (its config.yaml, metrics.jsonl and summary.json)"
    if not Path(d).exists():
        raise ConfigError(f"run folder {d!r} does not exist; {what}")
    if not Path(d).is_dir():
        raise ConfigError(f"{d!r} is a file, not a run folder; {what}")
    if not any((Path(d) / n).is_file() for n in (CONFIG_FILE, "metrics.jsonl", "summary.json")):
        raise ConfigError(f"{d!r} holds no run (no config.yaml, metrics.jsonl or summary.json); {what}")


def cmd_report(argv: list[str]) -> int:
    p = argparse.ArgumentParser(
        prog="grpokit report",
        description="Write an interactive, self-contained HTML report of a run "
        "(RUN_DIR/report.html), or of several runs overlaid with their config differences.",
    )
    p.add_argument("run_dirs", nargs="+", metavar="RUN_DIR")
    p.add_argument(
        "--out", help="HTML file to write (default: RUN_DIR/report.html for one run, comparison.html for several)"
    )
    p.add_argument(
        "--watch",
        action="store_true",
        help="rewrite the file every --interval seconds until the runs finish; the open page reloads itself meanwhile",
    )
    p.add_argument("--interval", type=float, default=5.0, help="seconds between rewrites with --watch (default 5)")
    args = p.parse_args(argv)
    for d in args.run_dirs:
        check_run_folder(d)
    if args.interval <= 0:
        raise ConfigError(f"--interval {args.interval} is not valid; give a number of seconds above 0")
    from grpokit.record.report import REPORT_FILE, watch, write_comparison

    dirs = [Path(d) for d in args.run_dirs]
    out = Path(args.out) if args.out else dirs[0] / REPORT_FILE if len(dirs) == 1 else Path("comparison.html")
    if not args.watch:
        print(write_comparison(dirs, out))
        return 0
    print(f"grpokit report: writing {out} every {args.interval:g} s until the run finishes (Ctrl-C stops)", flush=True)
    try:
        watch(dirs, out, args.interval)
    except KeyboardInterrupt:
        write_comparison(dirs, out)  # the last page must not reload forever
    print(out)
    return 0


def cmd_doctor(argv: list[str]) -> int:
    p = argparse.ArgumentParser(
        prog="grpokit doctor",
        description="Read a run (a grpokit run folder, a TRL/transformers output_dir, TensorBoard event files, "
        "a .jsonl/.csv metrics export) and print ranked findings: what looks wrong, the evidence, the change to "
        "try; then what the run cost and what could not be checked.",
    )
    p.add_argument("run_dir", metavar="RUN")
    p.add_argument("--json", action="store_true", help="print the diagnosis as JSON (findings, notes, steps)")
    p.add_argument(
        "--fail-on",
        choices=("warning", "error"),
        help="exit with status 1 when a finding of this level or worse is found (for CI)",
    )
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a threshold: a DoctorConfig field (e.g. truncated_max=0.3) or a health one (health.kl_max=2)",
    )
    p.add_argument("--config", help="a YAML file whose `doctor:` and `health:` sections set thresholds")
    args = p.parse_args(argv)
    from grpokit.record.doctor import examine, format_findings
    from grpokit.record.doctor_settings import thresholds
    from grpokit.record.run_readers import load_any

    dc, health = thresholds(args.config, args.set)
    run, source = load_any(Path(args.run_dir))
    if source == "grpokit run" and not (run.path / "metrics.jsonl").is_file():
        raise ConfigError(
            f"run folder {args.run_dir!r} has no metrics.jsonl yet (no step has finished); run the doctor "
            "once the run has logged a step"
        )
    if not run.metrics:  # empty, or no line a step wrote: "nothing to fix" would be a false all-clear
        where = "metrics.jsonl" if source == "grpokit run" else source
        raise ConfigError(f"{args.run_dir!r} has no step in {where} yet; run the doctor once the run has logged a step")
    diag = examine(run, dc, health)
    if args.json:
        import json

        print(json.dumps({"run": str(args.run_dir), "source": source} | diag.to_dict(), indent=2, default=str))
    else:
        print(format_findings(diag, str(args.run_dir)))
    levels = ("info", "warning", "error")
    worst = diag.worst()
    return 1 if args.fail_on and worst and levels.index(worst) >= levels.index(args.fail_on) else 0
