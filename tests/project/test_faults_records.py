"""No metric row lost (issue 48): metrics.jsonl, samples.jsonl and health.jsonl removed or renamed
while a run writes them are opened again at their path with one line saying where the earlier rows
went, `--resume` names the steps a file lost, and a full disk (a real 1 MB tmpfs, root only) leaves
no partial line and is a disk error naming the file."""

import errno
import json
import os
import subprocess

import pytest

from grpokit.cli import main
from grpokit.record.jsonl import HEALTH_FILE, METRICS_FILE, SAMPLES_FILE, JsonlSink, read_jsonl, spans
from grpokit.train.faults import classify
from helpers import faults_runs
from helpers.faults_runs import steps_in, train

workdir = faults_runs.workdir  # the fixture


def _sink(tmp_path, said):
    return JsonlSink(tmp_path, say=lambda *a, **k: said.append(a[0]))


def test_a_removed_file_is_opened_again_and_the_loss_is_named(tmp_path):
    said: list[str] = []
    sink = _sink(tmp_path, said)
    sink.log({"loss": 1.0}, 1)
    sink.log({"loss": 2.0}, 2)
    (tmp_path / METRICS_FILE).unlink()  # a cleanup job
    sink.log({"loss": 3.0}, 3)
    sink.log({"loss": 4.0}, 4)
    sink.close()
    assert [r["step"] for r in read_jsonl(tmp_path / METRICS_FILE)] == [3, 4]
    assert said == [
        f"grpokit: warning: {tmp_path / METRICS_FILE} was removed while the run wrote it; a new metrics.jsonl "
        "continues from step 3 (its rows up to step 2 are lost with it)"
    ]
    (event,) = read_jsonl(tmp_path / HEALTH_FILE)
    assert event["step"] == 3 and event["monitor"] == "record" and "was removed" in event["message"]


@pytest.mark.parametrize("fname", [METRICS_FILE, SAMPLES_FILE, HEALTH_FILE])
def test_a_renamed_file_keeps_its_rows_and_the_new_one_takes_each_later_row_once(tmp_path, fname):
    said: list[str] = []
    sink = _sink(tmp_path, said)

    def write(step):
        {
            METRICS_FILE: lambda: sink.log({"loss": float(step)}, step),
            SAMPLES_FILE: lambda: sink.log_samples(step, [{"prompt": "p", "completions": []}]),
            HEALTH_FILE: lambda: sink.warn(step, f"note {step}"),
        }[fname]()

    write(1)
    write(2)
    os.rename(tmp_path / fname, tmp_path / f"{fname}.1")  # log rotation
    write(3)
    sink.close()
    assert [r["step"] for r in read_jsonl(tmp_path / f"{fname}.1")] == [1, 2]
    assert [r["step"] for r in read_jsonl(tmp_path / fname) if r.get("monitor") != "record"] == [3]
    assert said[0].endswith(f"a new {fname} continues from step 3 (its rows up to step 2 are in the renamed file)")


def test_a_run_whose_metrics_are_removed_mid_run_keeps_writing_and_resume_names_the_gap(workdir, capsys):
    # a reward that removes metrics.jsonl while step 3 is scored (the cleanup job runs mid-step)
    (workdir / "cleaner.py").write_text(
        "import os\nn = 0\n"
        "def cleans(completions, **kwargs):\n"
        "    global n\n    n += 1\n"
        "    if n == 3: os.unlink('run/metrics.jsonl')\n"
        "    return [0.5] * len(completions)\n"
    )
    assert train("train.steps=4", "reward.functions=[cleaner:cleans]", "--out", "run") == 0
    out = capsys.readouterr().out
    kept = steps_in(workdir / "run")
    first = kept[0]  # the step whose scoring removed the file (the reward is also called once before training)
    assert 1 < first < 4 and kept == list(range(first, 5))
    assert (
        f"run/metrics.jsonl was removed while the run wrote it; a new metrics.jsonl continues from step {first} "
        f"(its rows up to step {first - 1} are lost with it)" in out
    )
    assert main(["train", "--resume", "run", "train.steps=5", "reward.functions=[faultrew:likes_short]"]) == 0
    out = capsys.readouterr().out
    gap = "1" if first == 2 else f"1-{first - 1}"
    assert f"run/metrics.jsonl has no rows for step(s) {gap} of the 4 before the checkpoint" in out
    assert steps_in(workdir / "run") == [*kept, 5]


def test_spans():
    assert spans([1, 2, 3, 7, 9, 10]) == "1-3, 7, 9-10"


@pytest.fixture
def tiny_disk(tmp_path):
    """A real 1 MB filesystem (tmpfs; root only), unmounted after the test."""
    mnt = tmp_path / "disk"
    mnt.mkdir()
    mounted = os.geteuid() == 0 and (
        subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mnt)], capture_output=True).returncode
        == 0
    )
    if not mounted:
        pytest.skip("mounting a tmpfs needs root")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", str(mnt)], check=False)


def test_a_full_disk_leaves_no_partial_line_and_is_a_disk_error_naming_the_file(tiny_disk):
    sink = JsonlSink(tiny_disk, say=lambda *a, **k: None)
    big = "x" * 30_000  # ~34 rows fill 1 MB; the row that does not fit is written in part by the kernel
    with pytest.raises(OSError) as caught:
        for step in range(1, 100):
            sink.log({"text": big}, step)
    e = caught.value
    assert e.errno == errno.ENOSPC and e.filename == str(tiny_disk / METRICS_FILE)
    raw = (tiny_disk / METRICS_FILE).read_bytes()
    assert raw.endswith(b"\n")
    rows = [json.loads(line) for line in raw.splitlines()]  # every line whole
    assert [r["step"] for r in rows] == list(range(1, len(rows) + 1))
    cause = classify(e)
    assert cause is not None and cause.sentence == (
        f"writing {tiny_disk / METRICS_FILE} failed because the disk refused it (No space left on device)"
    )
    (tiny_disk / METRICS_FILE).write_bytes(b"")  # room again: the next row goes in whole
    sink.log({"text": "short"}, len(rows) + 1)
    sink.close()
    assert [r["step"] for r in read_jsonl(tiny_disk / METRICS_FILE)] == [len(rows) + 1]
