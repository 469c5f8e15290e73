"""Published TRL projects under trl and under grpokit.trl (issue 46, deliverable 6); not in CI.

Each project is downloaded from PyPI at run time (``pip download --no-deps NAME==VERSION``, never committed),
unpacked twice into a work folder: as published (side ``trl``) and with its ``trl`` imports changed to
``grpokit.trl`` (side ``grpokit``: ``from trl... import`` -> ``from grpokit.trl... import``, ``import trl``
-> ``import grpokit.trl as trl``). bench/trl_projects_drivers.py runs it at CPU size on each side in its own
process and counts each overridden method and each callback event; this prints one table row per project:
rc, steps logged and the counts on each side, and whether the project's own output appeared.

    PYTHONPATH=src .venv/bin/python bench/trl_projects.py [--work DIR] [--only NAME ...] [--timeout S]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# name -> (PyPI requirement, what it is)
PROJECTS = {
    "cgrpo": (
        "trl-cgrpo==0.2.0",
        "GRPOTrainer subclass: _generate_and_score_completions, _calculate_rewards, _generate_single_turn",
    ),
    "sdpo": (
        "sdpo-rl==0.0.3",
        "GRPOTrainer subclass: _generate_and_score_completions, _calculate_rewards, compute_loss; a callback",
    ),
    "erl": (
        "erl-trainer==0.4.1",
        "GRPOTrainer subclass: _generate_and_score_completions, compute_loss (reward 0: reflection every step)",
    ),
    "alignrl": ("alignrl==0.3.0", "multi-trainer: SFT then GRPO (trl.SFTConfig/SFTTrainer beside GRPO)"),
    "sft_grpo": (
        "local:bench/projects/sft_then_grpo.py",
        "multi-trainer: `import trl`, trl.SFTTrainer then trl.GRPOTrainer from the SFT output dir (written here)",
    ),
    "trainsafe": ("trainsafe==0.1.0", "callback: behavioural health checks on_evaluate"),
    "rldoctor": ("rldoctor==0.2.0", "callback: on_train_begin, on_log, on_train_end; an HTML report"),
}
_FROM = re.compile(r"^(\s*)from trl(\.[\w.]+)? import ", re.M)
_IMPORT = re.compile(r"^(\s*)import trl\s*$", re.M)


def to_grpokit(source: str) -> str:
    """A module's ``trl`` imports changed to ``grpokit.trl``, as a user would change them."""
    source = _FROM.sub(lambda m: f"{m.group(1)}from grpokit.trl{m.group(2) or ''} import ", source)
    return _IMPORT.sub(lambda m: f"{m.group(1)}import grpokit.trl as trl", source)


def prepare(requirement: str, work: Path) -> tuple[Path, Path]:
    """The project unpacked as published and with its imports changed: (trl side, grpokit side)."""
    if requirement.startswith("local:"):  # a project module written here, not downloaded
        source = ROOT / requirement.removeprefix("local:")
        sides = work / source.stem / "trl", work / source.stem / "grpokit"
        for side, text in zip(sides, (source.read_text(), to_grpokit(source.read_text()))):
            side.mkdir(parents=True, exist_ok=True)
            (side / source.name).write_text(text)
        return sides
    wheels = work / "wheels"
    wheels.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        [sys.executable, "-m", "pip", "download", "--no-deps", "-q", requirement, "-d", str(wheels)], check=True
    )
    name = requirement.split("==")[0].replace("-", "_")
    wheel = next(p for p in wheels.iterdir() if p.name.lower().startswith(name.lower()) and p.suffix == ".whl")
    sides = work / name / "trl", work / name / "grpokit"
    for side in sides:
        with zipfile.ZipFile(wheel) as z:
            z.extractall(side)
    for path in sides[1].rglob("*.py"):
        path.write_text(to_grpokit(path.read_text()))
    return sides


def run_side(name: str, side: str, code: Path, work: Path, timeout: int) -> dict:
    out = work / "runs" / name / side
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(code), str(ROOT / "src"), str(ROOT / "tests")])}
    cmd = [sys.executable, str(ROOT / "bench" / "trl_projects_drivers.py"), name, side, str(out)]
    try:
        p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
        rc, err = p.returncode, p.stderr
    except subprocess.TimeoutExpired as e:
        rc, err = "timeout", (e.stderr or b"").decode(errors="replace") if isinstance(e.stderr, bytes) else ""
    (out / "stderr.txt").parent.mkdir(parents=True, exist_ok=True)
    (out / "stderr.txt").write_text(err or "")
    result = json.loads((out / "result.json").read_text()) if (out / "result.json").exists() else {}
    last = [ln for ln in (err or "").splitlines() if ln.strip() and not ln.startswith(" ")]
    result.update(rc=rc, error="" if rc == 0 else (last[-1][:240] if last else ""))
    return result


def row(name: str, what: str, trl_side: dict, ours: dict) -> str:
    keys = sorted(set(trl_side.get("counts", {})) | set(ours.get("counts", {})))
    counts = "<br>".join(
        f"`{k}` {trl_side.get('counts', {}).get(k, 0)} / {ours.get('counts', {}).get(k, 0)}" for k in keys
    )
    out = lambda r: json.dumps(r.get("output", {}))[:160]  # noqa: E731
    return (
        f"| {name} | {what} | {trl_side.get('rc')} / {ours.get('rc')} | {trl_side.get('steps_logged', '-')} / "
        f"{ours.get('steps_logged', '-')} | {counts or '-'} | {out(trl_side)} / {out(ours)} | "
        f"{trl_side.get('error', '')} / {ours.get('error', '')} |"
    )


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--work", type=Path, default=None)
    p.add_argument("--only", nargs="*", default=None)
    p.add_argument("--timeout", type=int, default=900)
    a = p.parse_args()
    work = a.work or Path(tempfile.mkdtemp(prefix="trl_projects_"))
    print("| project (PyPI) | what it overrides or listens to | rc | steps logged | calls | project output | error |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    results = {}
    for name, (requirement, what) in PROJECTS.items():
        if a.only and name not in a.only:
            continue
        trl_code, our_code = prepare(requirement, work)
        sides = {
            side: run_side(name, side, code, work, a.timeout)
            for side, code in (("trl", trl_code), ("grpokit", our_code))
        }
        results[name] = sides
        print(row(f"{requirement}", what, sides["trl"], sides["grpokit"]), flush=True)
    (work / "results.json").write_text(json.dumps(results, indent=1, default=str))
    print(f"results: {work / 'results.json'}")


if __name__ == "__main__":
    main()
