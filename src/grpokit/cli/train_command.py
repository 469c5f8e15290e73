"""``grpokit train`` and ``grpokit trl grpo``: a config becomes a run, and its outcome one line.

``build_config`` layers the defaults, ``--preset``, ``--config`` and the dotted overrides; a TRL-style
YAML (flat TRL names) runs through grpokit.trl's GRPOTrainer instead. A run that stops says what is
on disk and how to resume it (``checkpoint_note``); faults follow the error model of cli/errors.py.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import yaml

from grpokit.config.io import apply_overrides, describe_fields, load_yaml, strict_yaml
from grpokit.config.sections import Config, ConfigError
from grpokit.config.style import config_style

from . import errors
from .console import outlive_console
from .errors import first_line, say, user_errors

TRAIN_EPILOG = """\
Every field below can be set in a YAML file (--config, sections as mappings) or on the command
line as section.field=value; later settings win: defaults < --preset < --config < overrides.
The defaults are those of a run on one's own model; with the built-in demo (model.name_or_path=demo
and a data.task) the task's demo settings (8 new tokens, lr 3e-4, 60 steps) fill what is not set.

"""


def train_parser() -> argparse.ArgumentParser:
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
        help="continue the run in RUN_DIR from its newest checkpoint that verifies, or from exactly the "
        "checkpoint RUN_DIR/checkpoints/step-N given (later ones move to RUN_DIR/earlier-runs/); overrides "
        "given here go to RUN_DIR/config_history.yaml",
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
    resumed = bool(args.resume) and holds_run(resume_run(args.resume))
    if resumed:
        from grpokit.train.resume import load_run_config

        cfg = load_run_config(resume_run(args.resume))  # refuses a torn config.yaml; applies config_history.yaml
    else:  # a new run, or --resume on a folder with no run yet: it starts there (a job script's first start)
        cfg = Config()
    if args.paper_scale and not args.preset:
        raise ConfigError("--paper-scale applies a preset's paper-scale settings; name the preset with --preset")
    cfg = _command_line(args, cfg)
    if args.preset:  # below --config and the overrides: it fills only the fields they left unset
        from grpokit.config import presets
        from grpokit.validation.algo import unread_rules

        rules = unread_rules()  # the registered objectives' clip fields too: what the run would not read
        if resumed:  # the run's config holds its preset already: accepted where it changes nothing
            fresh = _command_line(args, Config())
            cfg = presets.resumed(args.preset, cfg, fresh, paper_scale=args.paper_scale, rules=rules)
        else:
            cfg = presets.apply(args.preset, cfg, paper_scale=args.paper_scale, rules=rules)
    return cfg


def _command_line(args: argparse.Namespace, cfg: Config) -> Config:
    """``cfg`` with this command line's --config file, overrides, --out and --overwrite."""
    if args.config:
        cfg = load_yaml(args.config, cfg)
    cfg = apply_overrides(cfg, args.overrides)
    if args.out:
        cfg.train.out = args.out
    if args.overwrite:
        cfg.train.overwrite = True
    return cfg


def trl_style_config(path: str) -> dict | None:
    """The config file's mapping when it is TRL-style (flat TRL names, config/style.py decides), else None (a
    grpokit config, or one grpokit's reader refuses). A grpokit file is told apart without importing the TRL
    layer (its imports, transformers' Trainer and peft, take seconds at every start). A key given twice, or a
    file mixing both styles, is refused in one sentence."""
    p = Path(path)
    if not p.is_file():
        return None
    try:
        data = strict_yaml(p.read_text(), f"config file {str(p)!r}")
    except (yaml.YAMLError, UnicodeDecodeError):
        return None

    def trl_names() -> set[str]:
        from grpokit.trl.scripts.trl_grpo import argument_names

        return argument_names()

    return data if config_style(data, trl_names, f"config file {str(p)!r}") == "trl" else None


def resume_run(resume: str) -> Path:
    """The run folder of ``--resume``: the folder given, or the run of a checkpoint folder given
    (``RUN/checkpoints/step-N``: resumed from exactly that one, train/run_checkpoints.py)."""
    from grpokit.train.run_checkpoints import checkpoint_folder

    named = checkpoint_folder(Path(resume))
    return named[0] if named else Path(resume)


def holds_run(run_dir: Path) -> bool:
    """A run was started in ``run_dir`` (its config.yaml, or checkpoints: then a missing config.yaml is refused)."""
    from grpokit.train.resume import CONFIG_FILE
    from grpokit.train.run_checkpoints import has_checkpoints

    return (run_dir / CONFIG_FILE).is_file() or has_checkpoints(run_dir)


def parse_train_args(argv: list[str]) -> argparse.Namespace:
    """``grpokit train``'s arguments, overrides before and after the options alike (``grpokit train a=1 --out R
    b=2``: a plain parse stopped at ``b=2`` with "unrecognized arguments")."""
    return train_parser().parse_intermixed_args(argv)


def cmd_train(argv: list[str]) -> int:
    """``grpokit train``: a grpokit config (or a TRL-style YAML) becomes a run; its outcome in one line."""
    args = parse_train_args(argv)
    outlive_console()  # a closed console pipe does not end the run (cli/console.py)
    data = trl_style_config(args.config) if args.config and not args.preset else None
    if data is not None:  # TRL-style flat names: the same GRPOTrainer a TRL script builds
        from grpokit.trl.scripts import trl_grpo

        return train_trl(trl_grpo.apply_overrides(data, args.overrides), args)
    from grpokit.train.loop import Trainer

    cfg = build_config(args)
    trainer = None
    try:
        trainer = Trainer(cfg, resume=args.resume, start_if_no_checkpoint=True)
        say(f"grpokit: run folder {trainer.run_dir}", flush=True)
        summary = trainer.train()
    except KeyboardInterrupt:  # a second Ctrl-C (or one before training started): say what is on disk
        print(f"grpokit: interrupted; {checkpoint_note(trainer.run_dir if trainer else None)}", file=sys.stderr)
        return 130
    except Exception as e:  # a full disk or a fault of grpokit itself: one sentence and what can be resumed
        if errors.DEBUG or (isinstance(e, user_errors()) and trainer is None):
            raise
        return _run_fault(
            e, trainer.run_dir if trainer else None, str(resume_run(args.resume)) if args.resume else None
        )
    if summary.get("interrupted"):
        return stopped(summary, cfg.train.steps, trainer.run_dir)
    _say_finished(summary, trainer.run_dir)
    return 0


def _run_fault(e: Exception, run_dir: Path | None, resume: str | None) -> int:
    """A run that stopped on ``e``: one sentence naming the cause (a user's mistake the run raised, a
    full disk, the user's files, the machine or another rank (train/faults.py classify), or grpokit's own fault)
    and what can be resumed."""
    from grpokit.train.faults import classify
    from grpokit.train.resume import is_storage_fault

    note = checkpoint_note(run_dir if run_dir is not None else (Path(resume) if resume else None))
    if isinstance(e, user_errors()):  # raised by the run (a reward failing on most of a batch, a health stop)
        print(f"grpokit: error: {str(e).rstrip().rstrip('.')}; {note}", file=sys.stderr)
        return 2
    cause = classify(e, run_dir)  # under torchrun also the rank whose error ended the job, and that error
    if is_storage_fault(e):
        print(
            f"grpokit: error: the run stopped because writing {e.filename or 'a file'} failed ({e.strerror}); "
            f"{note} once space is free",
            file=sys.stderr,
        )
    elif cause is not None:  # the user's files, the machine or another rank, named by cause and place
        print(f"grpokit: error: {cause.sentence}; {note}", file=sys.stderr)
        return cause.status
    else:
        print(
            f"grpokit: error: an internal fault stopped the run ({type(e).__name__}: {first_line(e)}; --debug shows "
            f"the traceback); {note}",
            file=sys.stderr,
        )
    return 1


def _say_finished(summary: dict, run_dir: Path) -> None:
    """The finished run's held-out accuracy before and after, and where its files are."""
    before, after = summary.get("eval_before", {}), summary.get("eval_after", {})
    if "accuracy" in before and "accuracy" in after:
        n, ungraded = int(after.get("n", 0)), int(after.get("ungraded", 0))
        left_out = f"; {ungraded} ungraded, left out" if ungraded else ""
        say(
            f"held-out accuracy ({n - ungraded} prompts{left_out}): before {before['accuracy']:.1%} -> "
            f"after {after['accuracy']:.1%}",
            flush=True,
        )
    say(f"grpokit: {summary.get('steps', 0)} steps; metrics, checkpoints and report in {run_dir}", flush=True)


def stopped(summary: dict, steps: int, run_dir: Path) -> int:
    """A run a signal stopped (train/stopping.py): what is on disk, and 128 + the signal's number."""
    import signal

    name, owed = summary.get("stop_signal", "SIGINT"), summary.get("eval_owed")
    when = f"after step {summary['steps']} of {steps}" if summary["steps"] else "before the first step finished"
    if owed is not None:  # the stop cut a held-out evaluation: --resume runs it first (train/trainer_outputs.py)
        at = f"of step {owed} of {steps}" if owed else "before the first step"
        when = f"during the held-out evaluation {at} (--resume runs it first)"
    what = "interrupted" if name == "SIGINT" else f"stopped by {name}"
    print(f"grpokit: {what} {when}; {checkpoint_note(run_dir)}", file=sys.stderr, flush=True)
    return 128 + int(getattr(signal, name, signal.SIGINT))


def train_trl(data: dict, args: argparse.Namespace) -> int:
    from grpokit.train.run_checkpoints import has_checkpoints
    from grpokit.trl.scripts import trl_grpo as script

    if args.out or args.resume:
        data = {**data, "output_dir": args.out or str(resume_run(args.resume))}
    objects, extra = script.parse(config=data)
    if script.launcher_processes(extra) > 1:
        raise ConfigError(
            "num_processes > 1 in a TRL-style config: start it with `grpokit trl grpo --config FILE` "
            "(which launches the processes) or under torchrun"
        )
    named = bool(args.resume) and resume_run(args.resume) != Path(args.resume)  # a checkpoint folder: that one
    resume = bool(args.resume) and has_checkpoints(resume_run(args.resume))  # none yet: the run starts there
    trainer, result = script.build_and_train(
        objects, say, "TRL-style config", args.resume if named else True if resume else None
    )
    if trainer.summary.get("interrupted"):
        return stopped(trainer.summary, trainer.cfg.train.steps, Path(trainer.run_dir))
    trainer.save_model()
    say(f"grpokit: {result.global_step} steps; model, metrics, checkpoints and report in {trainer.run_dir}", flush=True)
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
    from grpokit.trl.scripts import trl_grpo as script

    outlive_console()
    return script.main(argv[1:], say=say, stopped=stopped)


def checkpoint_note(run_dir: Path | None) -> str:
    """The truth about what a stopped run can be resumed from."""
    from grpokit.train.run_checkpoints import newest_verified

    ckpt = newest_verified(run_dir / "checkpoints") if run_dir is not None else None
    if ckpt is None:
        return "no checkpoint was written, so there is nothing to resume (the run must start again)"
    report = " and report.html" if (run_dir / "report.html").exists() else ""
    return f"checkpoint {ckpt}{report} kept; continue with: grpokit train --resume {run_dir}"
