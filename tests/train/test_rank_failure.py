"""A rank's failure on record (record/rank_failures.py) and rank 0's account of a failed job
(train/rank_failure.py): which rank, which error, preferred over the broken collective rank 0 saw; cleared by a
resume. The real two-process failure is tests/train/test_distributed_metrics.py's."""

import json
from types import SimpleNamespace

from grpokit.record import rank_failures
from grpokit.train.rank_failure import RankFailure, failed_entry, is_collective_error

GLOO = RuntimeError(
    "[../third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection closed by peer [127.0.0.1]:934. This is "
    "typically caused by a remote worker crashing."
)  # what rank 0 raised when rank 1 died under it (a plain RuntimeError)
TWO = SimpleNamespace(active=True, rank=0, world_size=2)


def test_a_broken_collective_is_told_from_a_ranks_own_error():
    assert is_collective_error(GLOO)
    assert not is_collective_error(RuntimeError("boom")) and not is_collective_error(ValueError("closed by peer"))


def test_rank_0_names_the_rank_whose_error_ended_the_job(tmp_path):
    # rank 2 also saw only a broken collective; rank 1's own error is the cause, whatever the rank order
    rank_failures.write(tmp_path, 2, 4, "RuntimeError: Connection reset by peer", collective=True)
    rank_failures.write(tmp_path, 1, 4, "RewardError: Reward 'f' failed on 8 of 8 completions")
    failed = failed_entry(tmp_path, GLOO, 4, TWO, wait_s=0)
    assert (failed["rank"], failed["step"]) == (1, 4)
    assert failed["error"] == "RewardError: Reward 'f' failed on 8 of 8 completions"
    assert failed["rank_0_saw"].startswith("RuntimeError: [../third_party/gloo")
    assert str(RankFailure(failed)) == (
        "rank 1 of the job failed after step 4: RewardError: Reward 'f' failed on 8 of 8 completions"
    )


def test_rank_0s_own_error_and_a_rank_that_left_no_record(tmp_path):
    rank_failures.write(tmp_path, 1, 2, "RuntimeError: Connection reset by peer", collective=True)
    assert failed_entry(tmp_path, ValueError("bad"), 2, TWO, wait_s=0) == {
        "step": 2,
        "rank": 0,
        "error": "ValueError: bad",
    }
    one = SimpleNamespace(active=False, rank=0, world_size=1)
    assert failed_entry(tmp_path, ValueError("bad"), 2, one) == {"step": 2, "error": "ValueError: bad"}  # as before
    rank_failures.clear(tmp_path, 1, 2)
    gone = failed_entry(tmp_path, GLOO, 2, TWO, wait_s=0)  # killed, or os._exit: nothing written
    assert gone["rank"] is None and gone["error"].startswith("another process of the job ended without recording")
    assert str(RankFailure(gone)).startswith("another rank of the job failed after step 2: another process")


def test_records_are_read_by_rank_and_cleared_by_their_own_rank(tmp_path):
    for r in (0, 1, 3):
        rank_failures.write(tmp_path, r, 1, f"E{r}: x")
    (tmp_path / "failed-rank9.json").write_text("not json")  # unreadable: left out
    assert [r["rank"] for r in rank_failures.read(tmp_path)] == [0, 1, 3]
    rank_failures.clear(tmp_path, 1, 2)  # rank 1 of 2: its own
    assert [r["rank"] for r in rank_failures.read(tmp_path)] == [0, 3]
    rank_failures.clear(tmp_path, 0, 2)  # rank 0 of 2: its own and those of ranks the job does not have
    assert rank_failures.read(tmp_path) == []
    assert rank_failures.job_failure({}, tmp_path) is None
    rank_failures.write(tmp_path, 1, 3, "E: y")  # rank 0 killed before summary.json: the doctor reads the record
    assert rank_failures.job_failure({"eval_before": {}}, tmp_path)["error"] == "E: y"
    assert rank_failures.job_failure({"failed": {"step": 3, "error": "F"}}, tmp_path) == {"step": 3, "error": "F"}


def test_the_command_line_names_the_failing_rank(capsys, tmp_path):
    from grpokit.cli.errors import run_command

    def command(argv):
        try:
            raise GLOO
        except RuntimeError as exc:
            raise RankFailure({"step": 1, "rank": 1, "error": "RewardError: boom"}) from exc

    assert run_command(command, [], debug=False) == 1
    assert capsys.readouterr().err.strip() == "grpokit: error: rank 1 of the job failed after step 1: RewardError: boom"
    from grpokit.cli.train_command import _run_fault  # `grpokit train`'s own sentence: not "an internal fault"

    assert _run_fault(RankFailure({"step": 1, "rank": 1, "error": "RewardError: boom."}), tmp_path, None) == 1
    err = capsys.readouterr().err
    assert err.startswith("grpokit: error: rank 1 of the job failed after step 1: RewardError: boom; "), err


def test_faults_classify_names_the_rank_before_what_its_error_says():
    """train/faults.py's one rule for both command-line paths: the failing rank and its error, exit status 1 (before,
    each CLI path tested RankFailure itself ahead of classify). Its error may itself read as a full disk; it is still
    that rank's, said as the rank said it, not "writing the run folder failed" on rank 0's behalf."""
    from grpokit.train.faults import Cause, classify

    def raised(error):
        try:
            try:
                raise GLOO
            except RuntimeError as exc:
                raise RankFailure({"step": 3, "rank": 1, "error": error}) from exc
        except RankFailure as e:
            return e

    assert classify(raised("RewardError: boom.")) == Cause(
        "rank 1 of the job failed after step 3: RewardError: boom", 1
    )
    full = raised("OSError: [Errno 28] No space left on device: '/scratch/x'")
    assert classify(full) == Cause(
        "rank 1 of the job failed after step 3: OSError: [Errno 28] No space left on device: '/scratch/x'", 1
    )


def test_a_resume_clears_the_ranks_records(tiny_model_dir, tmp_path):
    from grpokit.train import Trainer
    from helpers.runs import ROWS, likes_a, tiny_cfg

    def trainer(steps, resume=None):
        cfg = tiny_cfg(tiny_model_dir, tmp_path / "run", **{"train.steps": steps, "data.eval_size": 0})
        cfg.data.dataset = ""
        return Trainer(cfg, reward_funcs=[likes_a], train_rows=ROWS, resume=resume, quiet=True)

    trainer(1).train()
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    summary["failed"] = {"step": 1, "rank": 1, "error": "RewardError: boom"}  # as a 2-rank run that failed
    (tmp_path / "run" / "summary.json").write_text(json.dumps(summary))
    rank_failures.write(tmp_path / "run", 1, 1, "RewardError: boom")
    trainer(2, resume=tmp_path / "run").train()  # resumed in one process
    assert "failed" not in json.loads((tmp_path / "run" / "summary.json").read_text())
    assert not list((tmp_path / "run").glob("failed-rank*.json"))
