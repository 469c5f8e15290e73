"""TRL's GRPO example scripts under trl and under grpokit.trl, the import line the only change.

    PYTHONPATH=src python bench/trl_examples.py --trl /path/to/trl-git [--only gspo.py] [--jobs 2]

``--trl`` is a git copy of huggingface/trl (a bare mirror is enough): the scripts are read from its
HEAD at run time and never committed here. Each script runs twice in a fresh folder, once as written
and once with ``from trl`` / ``from trl.rewards`` changed to ``grpokit.trl``, at CPU size:

- models: every "org/name" the script names resolves offline (HF_HUB_OFFLINE=1) to a stand-in in a
  local hub cache: a tiny Qwen3 over characters with TRL's qwen3 chat template (which TRL recognises
  for tool calling), or for a vision-language name grpokit's tiny Qwen2-VL demo model;
- datasets: the hub names the scripts load map to local parquet splits with the real columns
  (trl_examples_site/sitecustomize.py patches ``datasets.load_dataset`` on both sides alike);
- GRPOConfig of both packages gets the same overrides (OVERRIDES: two steps of 2 prompts x 2
  completions, short completions, no vLLM, no trackers, no Hub pushes);
- OpenEnv's echo environment: a stand-in client package and an echo server on 127.0.0.1.

It prints one row per script: each side's result, steps, log keys (with those TRL logs that grpokit
does not) and checkpoints. Not run in CI: it needs trl installed and takes minutes per script on a CPU.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from trl_examples_data import TEXT_NAMES, write_datasets, write_hub_cache

HERE = Path(__file__).resolve().parent
SITE = HERE / "trl_examples_site"
OVERRIDES = dict(
    max_steps=2,
    num_generations=2,
    per_device_train_batch_size=2,
    gradient_accumulation_steps=1,
    steps_per_generation=None,
    generation_batch_size=None,
    per_device_eval_batch_size=2,
    max_completion_length=16,
    use_vllm=False,
    report_to="none",
    push_to_hub=False,
    bf16=False,
    fp16=False,
    use_cpu=True,
    gradient_checkpointing=False,
    logging_steps=1,
    seed=0,
)
SCRIPTS = [
    "grpo_2048.py",
    "grpo_agent.py",
    "grpo_continuous_batching.py",
    "grpo_vlm.py",
    "gspo.py",
    "gspo_vlm.py",
    "openenv/echo.py",
]
BROWSERGYM = "needs the BrowserGym environment (a HF Space / Docker image, not on PyPI) and Playwright"
NOT_RUN = {  # script -> why it is listed, not run
    "openenv/browsergym.py": BROWSERGYM,
    "openenv/browsergym_llm.py": BROWSERGYM,
    "openenv/carla.py": "needs a CARLA simulator server (GPU, Docker) behind the carla_env Space client",
    "openenv/carla_vlm.py": "needs a CARLA simulator server (GPU, Docker) behind the carla_env Space client",
    "openenv/carla_vlm_gemma.py": "needs a CARLA simulator server (GPU, Docker) behind the carla_env Space client",
    "openenv/catch.py": "needs the OpenSpiel environment package (a HF Space, not on PyPI) and its server",
    "openenv/multi_env.py": "needs the Wordle and OpenSpiel environment packages (HF Spaces, not on PyPI)",
    "openenv/opencode.py": (
        "trl.experimental.async_grpo (AsyncGRPOTrainer), not GRPOTrainer; needs the opencode sandbox"
    ),
    "openenv/sudoku.py": "needs the TextArena Sudoku environment package (a HF Space, not on PyPI) and its server",
    "openenv/wordle.py": "needs the TextArena Wordle environment package (a HF Space, not on PyPI) and its server",
}
TRL_IMPORT = re.compile(r"^(\s*)from trl(\.rewards)? import", re.MULTILINE)


def git_show(trl: Path, path: str) -> str:
    return subprocess.run(
        ["git", "-C", str(trl), "show", f"HEAD:{path}"], check=True, capture_output=True, text=True
    ).stdout


def doc_examples(trl: Path) -> dict[str, str]:
    """The complete GRPO examples of docs/source/grpo_trainer.md (a GRPOTrainer, an import from trl, train())."""
    text = git_show(trl, "docs/source/grpo_trainer.md")
    out = {}
    for m in re.finditer(r"```python\n(.*?)```", text, re.DOTALL):
        code = m.group(1)
        if "GRPOTrainer(" in code and "from trl import" in code and "trainer.train()" in code:
            out[f"grpo_trainer.md:{text[: m.start()].count(chr(10)) + 2}"] = code
    return out


def ported(code: str) -> str:
    """The script with its trl imports (``from trl ...`` and ``from trl.rewards ...``) moved to grpokit.trl."""
    return TRL_IMPORT.sub(lambda m: f"{m.group(1)}from grpokit.trl{m.group(2) or ''} import", code)


def command_line(name: str, code: str, echo_url: str) -> list[str]:
    if "TrlParser" in code:
        models = re.findall(r"--model_name_or_path\s+(\S+)", code)
        return ["--model_name_or_path", models[0] if models else TEXT_NAMES[0], "--output_dir", "out"]
    if name == "openenv/echo.py":
        return ["--env-host", echo_url]
    return []


def run_one(name: str, side: str, code: str, args: list[str], root: Path, env: dict, timeout: int) -> dict:
    folder = root / name.replace("/", "_").replace(":", "_") / side
    folder.mkdir(parents=True, exist_ok=True)
    script = folder / "script.py"
    script.write_text(code)
    report = folder / "report.json"
    report.unlink(missing_ok=True)
    start = time.time()
    try:
        proc = subprocess.run(
            [sys.executable, str(script), *args],
            cwd=folder,
            capture_output=True,
            text=True,
            timeout=timeout,
            env={**env, "TRL_EX_REPORT": str(report)},
        )
        rc, error = proc.returncode, _error_line(proc.stderr, proc.returncode)
        (folder / "stderr.txt").write_text(proc.stderr)
    except subprocess.TimeoutExpired:
        rc, error = -1, f"timed out after {timeout} s"
    result = json.loads(report.read_text()) if report.exists() else {}
    result.update(rc=rc, error=error[:160] if rc else "", seconds=round(time.time() - start))
    return result


def _error_line(stderr: str, rc: int) -> str:
    """The exception line of a traceback (its last line naming an Error or Exception), else the signal."""
    lines = [ln for ln in stderr.splitlines() if re.match(r"^[\w.]+(Error|Exception|Interrupt)\b", ln)]
    if lines:
        return lines[-1]
    return f"killed by signal {-rc}" if rc < 0 else f"exit status {rc}, no traceback"


class _Echo(BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
        message = body.get("message", "")
        data = json.dumps({"echoed_message": message, "reward": 0.1 * len(message)}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


def cell(r: dict) -> str:
    return "runs" if r.get("rc") == 0 and "steps" in r else f"fails: {r.get('error', '')}"


def row(name: str, t: dict, g: dict) -> str:
    tk, gk = set(t.get("log_keys", [])), set(g.get("log_keys", []))
    missing = sorted(tk - gk)
    keys = f"{len(tk)} / {len(gk)}" + (f"; not logged by grpokit: {', '.join(missing)}" if missing and gk else "")
    return (
        f"| {name} | {cell(t)} | {cell(g)} | {t.get('steps', '-')} / {g.get('steps', '-')} | {keys} | "
        f"{', '.join(t.get('checkpoints', [])) or '-'} / {', '.join(g.get('checkpoints', [])) or '-'} |"
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--trl", type=Path, required=True, help="a git copy of huggingface/trl (bare or not)")
    p.add_argument("--work", type=Path, default=Path("/tmp/trl_examples"), help="stand-ins and run folders")
    p.add_argument("--only", nargs="*", help="script names to run (default: all)")
    p.add_argument("--jobs", type=int, default=1)
    p.add_argument("--timeout", type=int, default=900, help="seconds per run")
    a = p.parse_args()
    commit = subprocess.run(
        ["git", "-C", str(a.trl), "rev-parse", "HEAD"], check=True, capture_output=True, text=True
    ).stdout.strip()
    scripts = {n: git_show(a.trl, f"examples/scripts/{n}") for n in SCRIPTS} | doc_examples(a.trl)
    if a.only:
        scripts = {n: c for n, c in scripts.items() if n in a.only}
    a.work.mkdir(parents=True, exist_ok=True)
    names = set(re.findall(r"[\"\s]([A-Za-z][\w.-]*/[\w.-]+)[\"\s]", "\n".join(scripts.values())))
    datasets = write_datasets(a.work / "datasets")
    models = sorted(n for n in names if n not in datasets and not n.startswith(("examples/", "docs/")))
    cache = write_hub_cache(a.work, models)
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Echo)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    echo_url = f"http://127.0.0.1:{server.server_address[1]}"
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(SITE), os.environ.get("PYTHONPATH", "")]),
        "HF_HUB_CACHE": str(cache),
        "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
        "TRL_EXPERIMENTAL_SILENCE": "1",
        "TRL_EX_DATASETS": json.dumps(datasets),
        "TRL_EX_OVERRIDES": json.dumps(OVERRIDES),
        "CUDA_VISIBLE_DEVICES": "",
        "WANDB_MODE": "disabled",
        "TOKENIZERS_PARALLELISM": "false",
    }
    jobs = [
        (n, side, code if side == "trl" else ported(code)) for n, code in scripts.items() for side in ("trl", "grpokit")
    ]
    with ThreadPoolExecutor(a.jobs) as pool:
        done = list(
            pool.map(
                lambda j: run_one(
                    j[0], j[1], j[2], command_line(j[0], j[2], echo_url), a.work / "runs", env, a.timeout
                ),
                jobs,
            )
        )
    results = {(n, side): r for (n, side, _), r in zip(jobs, done)}
    print(f"TRL commit {commit}; {time.strftime('%Y-%m-%d')}; trl / grpokit in each cell\n")
    print("| script | trl | grpokit.trl | steps | log keys | checkpoints |\n| --- | --- | --- | --- | --- | --- |")
    for n in scripts:
        print(row(n, results[(n, "trl")], results[(n, "grpokit")]))
    for n, why in NOT_RUN.items():
        print(f"| {n} | not run: {why} | not run | - | - | - |")
    server.shutdown()


if __name__ == "__main__":
    main()
