"""One resource budget per sandbox: memory, tasks and CPU of the whole process tree.

Every test runs once per mechanism this host offers: "auto" (a cgroup, when this process may create
one) and "rlimit" (the fallback: RLIMIT_NPROC for the sandbox's own uid or user namespace, and an
address space of budget / tasks per process). The hostile programs measure themselves from inside the
sandbox (its PID namespace shows only its own processes) and return the numbers to the trusted parent.
"""

import json
import os

import pytest

from grpokit.rewards.code import HARNESS, probe
from grpokit.rewards.sandbox import budget
from grpokit.rewards.sandbox.isolation import Limits, run_sandboxed

ok, why = probe()
pytestmark = pytest.mark.skipif(not ok, reason=f"sandbox isolation unavailable on this host: {why}")
MODES = ["rlimit"] + (["auto"] if budget.mechanism() is not None else [])
MB = 2**20

MEASURE = r'''
import os, time
def tree():
    """(memory in MB, tasks) of every process this sandbox can see: its whole tree, nothing else.
    Memory is the sum of proportional anonymous and shared-memory set sizes: what the programs hold
    (a page shared by k processes counts 1/k in each; the host's cached libraries are not counted)."""
    pss = tasks = 0
    for p in os.listdir("/proc"):
        if p.isdigit() and p != "1":  # pid 1 is bwrap's init (as root it is not the program's uid)
            try:
                for line in open(f"/proc/{p}/smaps_rollup"):
                    if line.startswith(("Pss_Anon:", "Pss_Shmem:")):
                        pss += int(line.split()[1])
                for line in open(f"/proc/{p}/status"):
                    if line.startswith("Threads:"):
                        tasks += int(line.split()[1])
            except OSError:
                pass
    return pss // 1024, tasks
'''

SIX_CHILDREN_OF_400MB = (
    MEASURE
    + r"""
def attack():
    r, w = os.pipe()
    kids = []
    for k in range(6):
        pid = os.fork()
        if pid == 0:
            try:
                x = bytearray(400 * 2**20)
                for i in range(0, len(x), 4096):
                    x[i] = 1  # touch every page: resident, not just reserved
                os.write(w, bytes([k]))  # child k holds its 400 MB now
                time.sleep(30)
            finally:
                os._exit(0)
        kids.append(pid)
    os.close(w)
    os.set_blocking(r, False)
    held, dead = set(), set()
    while len(held | dead) < 6:  # wait until every child holds its 400 MB or is gone
        time.sleep(0.02)
        try:
            held |= set(os.read(r, 64))
        except BlockingIOError:
            pass
        dead |= {k for k, p in enumerate(kids) if k not in dead and os.waitpid(p, os.WNOHANG)[0] == p}
    time.sleep(0.1)
    return [tree()[0], len(held - dead)]
"""
)

FORK_AND_THREAD_BOMB = (
    MEASURE
    + r"""
import threading
def attack():
    started = 0
    for _ in range(500):
        try:
            if os.fork() == 0:
                try:
                    for _ in range(50):  # each child also starts threads while it can
                        threading.Thread(target=time.sleep, args=(30,), daemon=True).start()
                except BaseException:
                    pass
                time.sleep(30)
                os._exit(0)
            started += 1
        except OSError:
            pass
    time.sleep(0.3)
    return [started, tree()[1]]
"""
)


def run_call(code: str, limits: Limits):
    """Run `attack()` of `code` in the sandbox; (returned value or None, RunResult)."""
    job = {
        "mode": "call",
        "inputs": [{"fn": "attack", "args": []}],
        "case_timeout_s": limits.wall_s,
        "max_output_bytes": 4096,
    }
    files = {"solution.py": code, "job.json": json.dumps(job), "harness.py": HARNESS}
    res = run_sandboxed(files, ["{python}", "-I", "-S", "{job}/harness.py", "{job}", "{scratch}"], limits)
    values = [r.get("value") for r in res.records if r.get("status") == "ok"]
    return (values[0] if values else None), res


@pytest.mark.parametrize("mode", MODES)
def test_six_children_of_400_mb_stay_within_the_memory_budget(mode):
    # memory_mb as RLIMIT_AS per process would let each of the 6 children hold 400 MB (2409 MB in the
    # tree under a "512 MB" limit). The tree holds at most 512 MB (a cgroup: children are OOM-killed at
    # the limit, so at most one holds its 400 MB; rlimit mode: each process may map 512 / 8 = 64 MB, so
    # no child gets its 400 MB at all).
    # the time limits are not what is tested: 20 s leaves room for 2.4 GB of page faults and the OOM kills on a
    # loaded machine (6 s once cut the attack short while three test workers ran; it takes ~1 s alone)
    limits = Limits(wall_s=20, cpu_s=20, memory_bytes=512 * MB, budget=mode)
    value, res = run_call(SIX_CHILDREN_OF_400MB, limits)
    assert value is not None, (res.timed_out, res.returncode, res.records, res.stderr[-2000:])
    held_mb, holding = value
    assert held_mb <= 512 and holding <= 1  # at most one child holds its 400 MB
    assert res.budget == (budget.mechanism() if mode == "auto" else "rlimit")


@pytest.mark.parametrize("mode", MODES)
def test_a_fork_and_thread_bomb_is_contained_in_its_task_budget(mode):
    # 500 forks, each child starting 50 threads: the tree never holds more than `processes` tasks
    # (pids.max with a cgroup, RLIMIT_NPROC of the sandbox's own uid or namespace without), and the
    # trusted parent gets its answer and cleans up.
    limits = Limits(wall_s=4, cpu_s=4, memory_bytes=512 * MB, processes=16, budget=mode)
    value, res = run_call(FORK_AND_THREAD_BOMB, limits)
    assert value is not None, res.stderr
    started, tasks = value
    assert 0 < started < 16 and tasks <= 16
    assert not res.timed_out
    # (as root this already held before, through the fresh uid's RLIMIT_NPROC; without root the limit
    # was charged to the trainer's uid: tests/rewards/test_sandbox_neighbours.py)


def test_the_tree_uses_at_most_its_cpu_quota():
    # 4 busy children for ~1 s of wall time: with a cgroup CPU quota of one CPU, the tree's CPU time is
    # at most its wall time (plus up to one 100 ms quota period); before the quota, on this 2-core host,
    # the same program used 1.93 CPU-s in 1.00 s (after: 1.02 CPU-s).
    if budget.mechanism() is None:
        pytest.skip("no writable cgroup on this host: the CPU quota needs one")
    code = r"""
import os, time, resource
def attack():
    start = time.monotonic()
    pids = []
    for _ in range(4):
        pid = os.fork()
        if pid == 0:
            while time.monotonic() - start < 1.0:
                pass
            os._exit(0)
        pids.append(pid)
    for pid in pids:
        os.waitpid(pid, 0)
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    return [used.ru_utime + used.ru_stime, time.monotonic() - start]
"""
    value, res = run_call(code, Limits(wall_s=6, cpu_s=4, cpus=1.0))
    assert value is not None, res.stderr
    cpu_s, wall_s = value
    assert cpu_s <= wall_s + 0.15


def test_budgets_that_cannot_hold_are_refused_in_one_sentence(monkeypatch):
    # rlimit mode splits memory over tasks; below 4 shares of 64 MB there is nothing to split
    with pytest.raises(budget.BudgetError, match=r"memory budget of 128 MB cannot be shared .* memory_mb >= 256"):
        budget.plan(128 * MB, 32, 1.0, "rlimit")
    # 512 MB over 32 tasks would leave 16 MB each: the task count drops to 8 shares of 64 MB instead
    assert budget.plan(512 * MB, 32, 1.0, "rlimit") == budget.Plan("rlimit", 8, 512 * MB, 64 * MB, 0.0)
    # without root and without a cgroup, an old kernel charges every sandbox to the trainer's uid
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    monkeypatch.setattr(budget, "_kernel_at_least", lambda major, minor: False)
    with pytest.raises(budget.BudgetError, match=r"charges every sandbox's processes to the trainer's uid"):
        budget.plan(512 * MB, 32, 1.0, "rlimit")
    with pytest.raises(ValueError, match=r"Limits.budget must be 'auto' or 'rlimit', got 'cgroups'"):
        budget.plan(512 * MB, 32, 1.0, "cgroups")


def test_code_rewards_refuse_before_running_when_no_budget_can_hold(monkeypatch):
    from grpokit.rewards.code import UnsafeCodeExecutionError, code_pass_fraction

    monkeypatch.setattr(budget, "mechanism", lambda: None)  # a host without a writable cgroup
    honest = "```python\nprint(sum(map(int, input().split())))\n```"
    cases = [[{"input": "1 2\n", "output": "3\n"}]]
    with pytest.raises(
        UnsafeCodeExecutionError,
        match=r"memory budget of 128 MB cannot be shared .*"
        r"or set allow_unsafe_code_execution=True",
    ):
        code_pass_fraction([honest], cases, memory_mb=128)
    assert code_pass_fraction([honest], cases, memory_mb=256) == [1.0]  # 4 shares of 64 MB: runs


def test_cgroup_v2_files_written_for_a_delegated_folder(tmp_path, monkeypatch):
    # This host has no cgroup v2 controllers, so the kernel side of "cgroup2" cannot run here; this
    # checks what is written where, against a folder laid out like a delegated v2 cgroup.
    (tmp_path / "cgroup.subtree_control").write_text("cpu memory pids\n")
    monkeypatch.setenv("GRPOKIT_SANDBOX_CGROUP", str(tmp_path))
    real_mkdir = os.mkdir

    def mkdir_with_files(path, *a):  # the kernel creates the interface files; a plain folder lacks them
        real_mkdir(path, *a)
        for name in ("memory.max", "memory.swap.max", "pids.max", "cpu.max", "cgroup.procs", "cgroup.kill"):
            open(os.path.join(path, name), "w").close()

    monkeypatch.setattr(os, "mkdir", mkdir_with_files)
    cg = budget.Cgroup.create(budget.Plan("cgroup2", 32, 512 * MB, 512 * MB, 1.5))
    folder = cg.folders["unified"]
    read = {
        name: open(os.path.join(folder, name)).read()
        for name in ("memory.max", "memory.swap.max", "pids.max", "cpu.max")
    }
    # 512 MiB = 536870912 bytes; 1.5 CPUs = 150000 us of every 100000 us period
    assert read == {"memory.max": "536870912", "memory.swap.max": "0", "pids.max": "32", "cpu.max": "150000 100000"}
    assert cg.procs_files() == [os.path.join(folder, "cgroup.procs")]
    cg.kill()
    assert open(os.path.join(folder, "cgroup.kill")).read() == "1"
