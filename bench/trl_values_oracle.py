"""TRL as the oracle of GRPOConfig values (issue 46, deliverable 5); not in CI (minutes on a CPU).

Walks every field of the installed TRL's GRPOConfig over its boundary values (tests/trl/trl_values.py),
builds TRL's and grpokit.trl's config with each, and for each pair TRL's GRPOConfig accepts runs TRL's own
GRPOTrainer for one step on a tiny chat model (tests/helpers/trl_models.py) with trl_values.BASE (a
checkpoint every step, 4 prompts x 2 completions of at most 8 tokens) and an eval set. ``runs``: train()
returned with a step logged;
``fails``: TRL's first error line. The result is written to tests/trl/values_table.json, which
tests/trl/test_trl_values.py checks grpokit against (``reason`` is kept from the previous table).

    PYTHONPATH=src .venv/bin/python bench/trl_values_oracle.py [--all] [--only FIELD ...]

Without ``--all`` only the pairs the two configs disagree on are run (and pairs whose earlier run is in
the table keep it).
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import tempfile
import time
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "tests"), str(ROOT / "tests" / "trl")]

from trl_values import TABLE, base_args, boundary_values, grpokit_verdict, trl_verdict  # noqa: E402


class Timeout(Exception):
    pass


def _alarm(*_):
    raise Timeout("no step within the time limit")


def one_step(model_dir: Path, name: str, value, seconds: int = 180) -> tuple[str, str]:
    """TRL's GRPOTrainer for one step with ``name=value``: ("runs", "") or ("fails", first error line)."""
    from datasets import Dataset

    import trl

    prompts = [[{"role": "user", "content": f"add {i} and {i + 1}"}] for i in range(4)]
    data = Dataset.from_dict({"prompt": prompts})

    def reward(completions, **kw):
        return [float(len(c[0]["content"]) % 3) for c in completions]

    with tempfile.TemporaryDirectory() as out:
        kw = base_args(out, name, value)
        signal.signal(signal.SIGALRM, _alarm)
        signal.alarm(seconds)
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                trainer = trl.GRPOTrainer(
                    model=str(model_dir),
                    reward_funcs=reward,
                    args=trl.GRPOConfig(**kw),
                    train_dataset=data,
                    eval_dataset=data,
                )
                trainer.train()
            steps = [h for h in trainer.state.log_history if "loss" in h]
            return ("runs", "") if steps else ("fails", "no training step was logged")
        except BaseException as e:  # noqa: BLE001 - the oracle records every way TRL stops
            if isinstance(e, KeyboardInterrupt):
                raise
            first = str(e).splitlines()[0] if str(e) else ""
            return "fails", f"{type(e).__name__}: {first}"[:300]
        finally:
            signal.alarm(0)


def main() -> None:
    import transformers

    import trl

    p = argparse.ArgumentParser()
    p.add_argument("--all", action="store_true", help="run TRL on every pair its GRPOConfig accepts")
    p.add_argument("--only", nargs="*", default=None, help="these fields only")
    a = p.parse_args()
    old = (
        {(r["field"], json.dumps(r["value"])): r for r in json.loads(TABLE.read_text())["rows"]}
        if TABLE.exists()
        else {}
    )
    from helpers.trl_models import make_chat_model

    work = Path(tempfile.mkdtemp())
    model_dir = make_chat_model(work / "model")
    rows, t0 = [], time.time()
    for name, value in boundary_values(trl.GRPOConfig):
        key = (name, json.dumps(value))
        prev = old.get(key, {})
        tv, tw = trl_verdict(name, value)
        gv, gw = grpokit_verdict(name, value)
        run, run_why = prev.get("trl_run", ""), prev.get("trl_run_why", "")
        wanted = a.only is None or name in a.only
        if tv == "accept" and wanted and (a.all or gv == "refuse") and (a.only is not None or not run):
            run, run_why = one_step(model_dir, name, value)
            print(f"{time.time() - t0:7.1f}s {name}={value!r}: {run} {run_why}", flush=True)
        elif tv != "accept":
            run, run_why = "", ""
        rows.append(
            dict(
                field=name,
                value=value,
                trl_config=tv,
                trl_config_why=tw,
                trl_run=run,
                trl_run_why=run_why,
                grpokit=gv,
                grpokit_why=gw,
                reason=prev.get("reason", ""),
            )
        )
    versions = {"trl": trl.__version__, "transformers": transformers.__version__}
    TABLE.write_text(json.dumps({**versions, "rows": rows}, indent=1) + "\n")
    print(f"{len(rows)} pairs written to {TABLE}")


if __name__ == "__main__":
    main()
