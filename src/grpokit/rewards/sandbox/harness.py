"""Runs inside the sandbox: executes the untrusted solution and reports raw outputs, never verdicts.

Usage: python -I -S harness.py JOB_DIR SCRATCH_DIR. JOB_DIR holds solution.py and job.json
({"mode": "stdio" | "call", "inputs": [...], "case_timeout_s": float, "max_output_bytes": int, and
optionally "stderr_bytes": int, how much of the end of a stdio case's stderr to report, 0 = none});
expected outputs are never given to the sandbox. One JSON line per case is written to file
descriptor 3: {"case": i, "status": "ok" | "error" | "timeout", "stdout": str, "stdout_bytes": int (all
it printed), "returncode": int, "stderr": str (its last stderr_bytes, with stderr_bytes)} (stdio) or
{"case": i, "status": ..., "value": plain JSON value} (call). The trusted parent decides pass or fail,
so a hostile program that tampers with this file can at most invent its own outputs, which it does not
know to be right. Standard library only.
"""

import io
import json
import os
import subprocess
import sys

JOB_DIR, SCRATCH = sys.argv[1], sys.argv[2]
PLAIN = (type(None), bool, int, float, str)


def to_plain(x, depth=0):
    """Exact plain types only (no subclasses, so no objects with a forged __eq__); tuples become lists."""
    if depth > 50:
        raise ValueError("value nested too deeply")
    if type(x) in PLAIN:
        return x
    if type(x) in (list, tuple):
        return [to_plain(v, depth + 1) for v in x]
    if type(x) is dict and all(type(k) is str for k in x):
        return {k: to_plain(v, depth + 1) for k, v in x.items()}
    raise TypeError(f"return value of type {type(x).__name__} is not a plain JSON value")


def main():
    channel = os.fdopen(3, "w", buffering=1)
    with open(os.path.join(JOB_DIR, "job.json")) as f:
        job = json.load(f)
    solution = os.path.join(JOB_DIR, "solution.py")
    limit = job["max_output_bytes"]
    err_limit = job.get("stderr_bytes", 0)

    def report(record):
        channel.write(json.dumps(record) + "\n")

    if job["mode"] == "stdio":
        for i, text in enumerate(job["inputs"]):
            inp, out, err = (os.path.join(SCRATCH, f"{kind}{i}") for kind in ("in", "out", "err"))
            with open(inp, "w") as f:
                f.write(text)
            try:
                with open(inp) as fin, open(out, "wb") as fout, open(err if err_limit else os.devnull, "wb") as ferr:
                    proc = subprocess.run(
                        [sys.executable, "-I", "-S", solution],
                        stdin=fin,
                        stdout=fout,
                        stderr=ferr,
                        timeout=job["case_timeout_s"],
                        env={},
                    )
                with open(out, "rb") as f:
                    stdout = f.read(limit).decode("utf-8", "replace")
                record = {"case": i, "status": "ok" if proc.returncode == 0 else "error", "stdout": stdout}
                record.update(stdout_bytes=os.path.getsize(out), returncode=proc.returncode)
                if err_limit:
                    with open(err, "rb") as f:
                        f.seek(max(0, os.path.getsize(err) - err_limit))
                        record["stderr"] = f.read(err_limit).decode("utf-8", "replace")
                report(record)
            except subprocess.TimeoutExpired:
                report({"case": i, "status": "timeout"})
            except OSError as exc:
                report({"case": i, "status": "error", "error": str(exc)[:200]})
        return
    # "call": define the solution once, then call the named function per case.
    namespace = {"__name__": "solution"}
    sys.stdout = io.StringIO()  # prints of the solution are not outputs in call mode
    try:
        with open(solution) as f:
            exec(compile(f.read(), "solution.py", "exec"), namespace)
    except BaseException as exc:  # SystemExit too: exiting early fails every case
        for i in range(len(job["inputs"])):
            report({"case": i, "status": "error", "error": type(exc).__name__})
        return
    for i, case in enumerate(job["inputs"]):
        try:
            fn = namespace[case["fn"]]
            value = to_plain(fn(*case["args"]))
            text = json.dumps({"case": i, "status": "ok", "value": value})
            if len(text) > limit:
                raise ValueError("return value too large")
            channel.write(text + "\n")
        except BaseException as exc:
            report({"case": i, "status": "error", "error": type(exc).__name__})
        sys.stdout = io.StringIO()


if __name__ == "__main__":
    main()
