"""The command line: ``grpokit train | eval | report | doctor | presets | models | vllm-serve | trl grpo`` and ``grpokit --version``.

One error model (docs/FAULTS.md): a user's mistake (bad config value, missing or malformed file,
an occupied run folder) prints one sentence and exits with status 2; a full disk stops the run with
a sentence naming the checkpoint it can resume from (status 1); a fault whose cause is the user's
files or the machine however a library wrapped it (grpokit.train.faults.classify: a damaged weights
file, permission denied, memory) is one sentence naming it (2 or 1); anything else is a fault of
grpokit itself and prints one sentence too (status 1). ``--debug`` (anywhere on the command line) or
GRPOKIT_DEBUG=1 shows the traceback instead. The working directory is on the import path, as
with ``python -m``, so a ``module:function`` reward next to the user's data is found.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from grpokit.config.io import apply_overrides, describe_fields, load_yaml
from grpokit.config.sections import Config, ConfigError

TRAIN_EPILOG = """\
Every field below can be set in a YAML file (--config, sections as mappings) or on the command
line as section.field=value; later settings win: defaults < --preset < --config < overrides.
The defaults are those of a run on one's own model; with the built-in demo (model.name_or_path=demo
and a data.task) the task's demo settings (8 new tokens, lr 3e-4, 60 steps) fill what is not set.

"""


def _train_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="grpokit train",
        description="Train a model with GRPO (default: the embedded demo).",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=TRAIN_EPILOG + describe_fields(),
    )
    p.add_argument(
        "--preset",
        help="published recipe to start from (grpokit presets lists them); it fills what "
        "--config and the overrides leave unset, at the run's own scale",
    )
    p.add_argument(
        "--paper-scale",
        action="store_true",
        help="with --preset: also take the paper's batch of prompts, generation length and learning rate",
    )
    p.add_argument(
        "--config",
        help="YAML file with config sections, or a TRL-style file with GRPOConfig's flat names (docs/TRL.md)",
    )
    p.add_argument("--out", help="run folder (default: a new folder under runs/)")
    p.add_argument(
        "--resume",
        metavar="RUN_DIR",
        help="continue the run in RUN_DIR from its newest checkpoint that "
        "verifies; overrides given here go to RUN_DIR/config_history.yaml",
    )
    p.add_argument(
        "--overwrite",
        action="store_true",
        help="start a new run in --out even when it holds a run (its checkpoints and records are deleted)",
    )
    p.add_argument(
        "--debug", action="store_true", help="show tracebacks instead of one-sentence errors (also GRPOKIT_DEBUG=1)"
    )
    p.add_argument("overrides", nargs="*", metavar="section.field=value", help="config overrides")
    return p


def build_config(args: argparse.Namespace) -> Config:
    if args.resume and _holds_run(Path(args.resume)):
        from grpokit.train.resume import load_run_config

        cfg = load_run_config(Path(args.resume))  # refuses a torn config.yaml; applies config_history.yaml
    else:  # a new run, or --resume on a folder with no run yet: it starts there (a job script's first start)
        cfg = Config()
    if args.paper_scale and not args.preset:
        raise ConfigError("--paper-scale applies a preset's paper-scale settings; name the preset with --preset")
    if args.config:
        cfg = load_yaml(args.config, cfg)
    cfg = apply_overrides(cfg, args.overrides)
    if args.out:
        cfg.train.out = args.out
    if args.overwrite:
        cfg.train.overwrite = True
    if args.preset:  # below --config and the overrides: it fills only the fields they left unset
        from grpokit.config import presets

        cfg = presets.apply(args.preset, cfg, paper_scale=args.paper_scale)
    return cfg


def _holds_run(run_dir: Path) -> bool:
    """A run was started in ``run_dir`` (its config.yaml, or checkpoints: then a missing config.yaml is refused)."""
    from grpokit.train.resume import CONFIG_FILE, has_checkpoints

    return (run_dir / CONFIG_FILE).is_file() or has_checkpoints(run_dir)


_DEBUG = False  # --debug / GRPOKIT_DEBUG=1 of the current main() call


def _say(*args, **kwargs) -> None:
    """Print on the first process only: under torchrun every rank runs this CLI, and the run's lines
    (and a user's mistake, the same sentence on every rank) should appear once, not once per process."""
    if os.environ.get("RANK", "0") == "0":
        print(*args, **kwargs)


def cmd_train(argv: list[str]) -> int:
    args = _train_parser().parse_args(argv)
    if args.config and not args.preset:
        from grpokit.trl import script as trl_yaml

        data = trl_yaml.read(args.config)
        if data is not None:  # TRL-style flat names: the same GRPOTrainer a TRL script builds
            return _train_trl(trl_yaml.apply_overrides(data, args.overrides), args)
    from grpokit.train.loop import Trainer

    cfg = build_config(args)
    trainer = None
    try:
        trainer = Trainer(cfg, resume=args.resume, start_if_no_checkpoint=True)
        _say(f"grpokit: run folder {trainer.run_dir}", flush=True)
        summary = trainer.train()
    except KeyboardInterrupt:  # a second Ctrl-C (or one before training started): say what is on disk
        print(f"grpokit: interrupted; {_checkpoint_note(trainer.run_dir if trainer else None)}", file=sys.stderr)
        return 130
    except Exception as e:  # a full disk or a fault of grpokit itself: one sentence and what can be resumed
        from grpokit.train.faults import classify
        from grpokit.train.resume import is_storage_fault

        if _DEBUG or (isinstance(e, _user_errors()) and trainer is None):
            raise
        note = _checkpoint_note(trainer.run_dir if trainer else (Path(args.resume) if args.resume else None))
        if isinstance(e, _user_errors()):  # raised by the run (a reward failing on most of a batch, a health stop)
            print(f"grpokit: error: {str(e).rstrip().rstrip('.')}; {note}", file=sys.stderr)
            return 2
        cause = classify(e, trainer.run_dir if trainer else None)
        if is_storage_fault(e):
            print(
                f"grpokit: error: the run stopped because writing {e.filename or 'a file'} failed ({e.strerror}); "
                f"{note} once space is free",
                file=sys.stderr,
            )
        elif cause is not None:  # the user's files or the machine, named by cause and place
            print(f"grpokit: error: {cause.sentence}; {note}", file=sys.stderr)
            return cause.status
        else:
            print(
                f"grpokit: error: an internal fault stopped the run ({type(e).__name__}: {_first_line(e)}; --debug shows "
                f"the traceback); {note}",
                file=sys.stderr,
            )
        return 1
    if summary.get("interrupted"):
        return _stopped(summary, cfg.train.steps, trainer.run_dir)
    before, after = summary.get("eval_before", {}), summary.get("eval_after", {})
    if "accuracy" in before and "accuracy" in after:
        n = int(after.get("n", 0))
        _say(
            f"held-out accuracy ({n} prompts): before {before['accuracy']:.1%} -> after {after['accuracy']:.1%}",
            flush=True,
        )
    _say(f"grpokit: {summary.get('steps', 0)} steps; metrics, checkpoints and report in {trainer.run_dir}", flush=True)
    return 0


def _stopped(summary: dict, steps: int, run_dir: Path) -> int:
    """A run a signal stopped (train/stopping.py): what is on disk, and 128 + the signal's number."""
    import signal

    name = summary.get("stop_signal", "SIGINT")
    when = f"after step {summary['steps']} of {steps}" if summary["steps"] else "before the first step finished"
    what = "interrupted" if name == "SIGINT" else f"stopped by {name}"
    print(f"grpokit: {what} {when}; {_checkpoint_note(run_dir)}", file=sys.stderr, flush=True)
    return 128 + int(getattr(signal, name, signal.SIGINT))


def _train_trl(data: dict, args: argparse.Namespace) -> int:
    from grpokit.train.resume import has_checkpoints
    from grpokit.trl import script

    if args.out or args.resume:
        data = {**data, "output_dir": args.out or args.resume}
    objects, extra = script.parse(config=data)
    if script.launcher_processes(extra) > 1:
        raise ConfigError(
            "num_processes > 1 in a TRL-style config: start it with `grpokit trl grpo --config FILE` "
            "(which launches the processes) or under torchrun"
        )
    trainer = script.build_trainer(*objects)
    _say(f"grpokit: run folder {trainer.run_dir} (TRL-style config)", flush=True)
    resume = bool(args.resume) and has_checkpoints(
        Path(args.resume)
    )  # none yet: the run starts there (a job's first start)
    result = trainer.train(resume_from_checkpoint=True if resume else None)
    if trainer.summary.get("interrupted"):
        return _stopped(trainer.summary, trainer.cfg.train.steps, Path(trainer.run_dir))
    trainer.save_model()
    _say(
        f"grpokit: {result.global_step} steps; model, metrics, checkpoints and report in {trainer.run_dir}", flush=True
    )
    return 0


def cmd_trl(argv: list[str]) -> int:
    """``grpokit trl grpo ARGS``: TRL's ``trl grpo`` command line (the same flags and --config YAML)."""
    if argv[:1] != ["grpo"]:
        if argv[:1] in ([], ["-h"], ["--help"]):
            print(
                "usage: grpokit trl grpo [TRL's trl grpo arguments: --model_name_or_path, --dataset_name, "
                "--reward_funcs, GRPOConfig's and ModelConfig's flags, --config FILE.yaml] (grpokit trl grpo --help)"
            )
            return 0
        raise ConfigError(f"grpokit trl runs TRL's grpo command only, not {argv[0]!r}; use grpokit trl grpo ...")
    from grpokit.trl import script

    return script.main(argv[1:], say=_say, stopped=_stopped)


def _checkpoint_note(run_dir: Path | None) -> str:
    """The truth about what a stopped run can be resumed from."""
    from grpokit.train.resume import newest_verified

    ckpt = newest_verified(run_dir / "checkpoints") if run_dir is not None else None
    if ckpt is None:
        return "no checkpoint was written, so there is nothing to resume (the run must start again)"
    report = " and report.html" if (run_dir / "report.html").exists() else ""
    return f"checkpoint {ckpt}{report} kept; continue with: grpokit train --resume {run_dir}"


def _check_run_folder(d: str) -> None:
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
        _check_run_folder(d)
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
        description="Read a run folder (config, metrics, samples) and print "
        "ranked findings: what looks wrong, the evidence, the change to try.",
    )
    p.add_argument("run_dir", metavar="RUN_DIR")
    p.add_argument("--json", action="store_true", help="print the findings as JSON")
    args = p.parse_args(argv)
    _check_run_folder(args.run_dir)
    if not (Path(args.run_dir) / "metrics.jsonl").is_file():
        raise ConfigError(
            f"run folder {args.run_dir!r} has no metrics.jsonl yet (no step has finished); run the doctor "
            "once the run has logged a step"
        )
    from grpokit.record.doctor import diagnose, format_findings
    from grpokit.record.report_data import load_run

    run = load_run(Path(args.run_dir))
    if not run.metrics:  # empty, or no line a step wrote: "nothing to fix" would be a false all-clear
        raise ConfigError(
            f"run folder {args.run_dir!r} has no step in metrics.jsonl yet; run the doctor once the run "
            "has logged a step"
        )
    findings = diagnose(run)
    if args.json:
        import dataclasses
        import json

        print(json.dumps([dataclasses.asdict(f) | {"severity": f.severity} for f in findings], indent=2))
    else:
        print(format_findings(findings, str(args.run_dir)))
    return 0


def cmd_presets(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="grpokit presets", description="List the presets and the values each sets.")
    p.add_argument("name", nargs="?", help="show only this preset")
    args = p.parse_args(argv)
    from grpokit.config import presets

    for name in [args.name] if args.name else presets.names():
        recipe, paper = presets.split(presets.load(name))
        print(f"{name}: {presets.description(name)}")
        for key, value in recipe.items():
            print(f"    {key} = {value}")
        own = presets.own_scale(name)
        for key, value in paper.items():
            print(f"    {key} = {value}" + ("" if own else "   (paper scale: only with --paper-scale)"))
    return 0


def cmd_models(argv: list[str]) -> int:
    argparse.ArgumentParser(
        prog="grpokit models",
        description="List the named real models that model.name_or_path "
        "accepts: size, source and whether they are installed and converted here.",
    ).parse_args(argv)
    from grpokit.train.named_models import listing

    for row in listing():
        print(f"{row['name']}: {row['parameters']} parameters, {row['description']}")
        print(f"    source = {row['source']}")
        print(f"    state  = {row['state']}")
    return 0


def cmd_vllm_serve(argv: list[str]) -> int:
    from grpokit.rollout.vllm_serve import (
        main as serve_main,  # imports no vLLM: --help works without it
    )

    return serve_main(argv)


COMMANDS = {
    "train": cmd_train,
    "eval": lambda argv: cmd_eval(argv),
    "report": cmd_report,
    "doctor": cmd_doctor,
    "presets": cmd_presets,
    "models": cmd_models,
    "vllm-serve": cmd_vllm_serve,
    "trl": lambda argv: cmd_trl(argv),
}


def cmd_eval(argv: list[str]) -> int:
    from .eval import main as eval_main

    return eval_main(argv)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in argv or os.environ.get("GRPOKIT_DEBUG", "").lower() in ("1", "true", "yes")
    argv = [a for a in argv if a != "--debug"]
    global _DEBUG
    _DEBUG = debug  # for the commands that catch a fault themselves (set on every call, never inherited)
    if argv[:1] == ["--version"]:
        from grpokit import __version__

        print(f"grpokit {__version__}")
        return 0
    if os.getcwd() not in sys.path and "" not in sys.path:  # as `python -m`: rewards beside the data import
        sys.path.insert(0, os.getcwd())
    if not argv or argv[0] in ("-h", "--help") or argv[0] not in COMMANDS:
        if argv and argv[0] not in ("-h", "--help"):
            print(f"grpokit: unknown command {argv[0]!r}; valid commands: {', '.join(COMMANDS)}", file=sys.stderr)
            return 2
        print(
            "usage: grpokit {" + ",".join(COMMANDS) + "} ...   (grpokit COMMAND --help for details; grpokit --version)"
        )
        return 0
    return _run(COMMANDS[argv[0]], argv[1:], debug)


def _user_errors() -> tuple[type, ...]:
    """The exceptions that carry a user's mistake as one sentence (imported lazily: --help stays light)."""
    from grpokit.record.health import TrainingHealthError
    from grpokit.rewards.spec import RewardError

    return ConfigError, RewardError, TrainingHealthError


def _run(command, argv: list[str], debug: bool) -> int:
    """The error model: one sentence per fault on stderr, the traceback only with --debug."""
    try:
        return command(argv)
    except KeyboardInterrupt:
        print("grpokit: interrupted", file=sys.stderr)
        return 130
    except _user_errors() as e:
        if debug:
            raise
        _say(f"grpokit: error: {e}", file=sys.stderr)
        return 2
    except Exception as e:
        if debug:
            raise
        from grpokit.train.faults import classify
        from grpokit.train.resume import (
            is_storage_fault,  # here: torch only when something failed
        )

        cause = classify(e)
        if is_storage_fault(e):
            print(
                f"grpokit: error: writing {e.filename or 'a file'} failed ({e.strerror}); what was written before is "
                "intact; free space and run the command again",
                file=sys.stderr,
            )
        elif cause is not None:  # the user's files or the machine, named by cause and place
            print(f"grpokit: error: {cause.sentence}", file=sys.stderr)
            return cause.status
        else:
            print(
                f"grpokit: error: an internal fault stopped the command ({type(e).__name__}: {_first_line(e)}); "
                "run it again with --debug for the traceback",
                file=sys.stderr,
            )
        return 1


def _first_line(e: BaseException) -> str:
    lines = str(e).strip().splitlines()
    return lines[0][:300] if lines else "no message"


if __name__ == "__main__":
    sys.exit(main())
