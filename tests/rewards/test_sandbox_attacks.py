"""Hostile programs earn zero reward and leave the host and the run unharmed.

Each attack prints the right answer ("3" for input "1 2", or returns 3 from add(1, 2)) only when its
attack worked, so a zero reward means the attack failed; each test then also checks the host. A control
test shows that an honest program does earn the reward under the same limits.
"""

import os
import socket
import threading
import time

import pytest

from grpokit.rewards.code import code_pass_fraction, probe, run_tests
from grpokit.rewards.sandbox import uids
from grpokit.rewards.sandbox.isolation import Limits
from helpers.paths import TESTS
from helpers.sandbox_probes import SYSCALL_PROBE

ok, why = probe()
pytestmark = pytest.mark.skipif(not ok, reason=f"sandbox isolation unavailable on this host: {why}")

STDIO = [{"input": "1 2\n", "output": "3\n"}]
CALL = [{"fn": "add", "args": [1, 2], "expected": 3}]
FAST = Limits(wall_s=1.5, cpu_s=1, memory_bytes=256 * 2**20)


def score(code: str, cases=STDIO) -> float:
    return code_pass_fraction([f"```python\n{code}\n```"], [cases], wall_s=1.5, memory_mb=256)[0]


def sandbox_processes(owners) -> list[str]:
    """Processes on the host running as one of the uids ``owners`` (should be none after a run)."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if os.stat(f"/proc/{pid}").st_uid in owners:
                found.append(pid)
        except FileNotFoundError:
            pass
    return found


@pytest.fixture
def canary(tmp_path, monkeypatch):
    """After the test: the host's file untouched, and no process left running as any uid this test's
    sandboxes ran as. Only those uids: other pytest workers' sandboxes run beside this test (as uids of
    their own, sandbox/uids.py) and come and go while it runs."""
    path = tmp_path / "canary.txt"
    path.write_text("intact")
    taken, take = [], uids.take
    monkeypatch.setattr(uids, "take", lambda: taken.append(take()) or taken[-1])
    yield path
    assert path.read_text() == "intact"  # every attack leaves the host's files alone
    assert sorted(sandbox_processes(set(taken))) == []  # and leaves no process behind


def test_honest_programs_pass():
    assert score("a, b = map(int, input().split())\nprint(a + b)") == 1.0
    assert score("def add(a, b):\n    return a + b", CALL) == 1.0


def test_fork_bomb(canary):
    start = time.monotonic()
    assert score("import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass") == 0.0
    assert time.monotonic() - start < 5


def test_memory_exhaustion(canary):
    assert score("x = []\nwhile True:\n    x.append(bytearray(50 * 2**20))") == 0.0


def test_infinite_loop_that_ignores_signals(canary):
    code = (
        "import signal\nfor s in (signal.SIGTERM, signal.SIGINT, signal.SIGXCPU, signal.SIGALRM):\n"
        "    signal.signal(s, signal.SIG_IGN)\nwhile True:\n    pass"
    )
    start = time.monotonic()
    assert score(code) == 0.0
    assert time.monotonic() - start < 5


def test_writing_outside_its_folder(canary):
    code = (
        f"for p in [{str(canary)!r}, '/work/solution.py', '/usr/evil', '/opt/python/evil']:\n"
        "    try:\n        open(p, 'w').write('pwned')\n        print(3)\n    except OSError:\n        pass"
    )
    assert score(code) == 0.0


def test_reading_environment_secrets_and_host_files(canary, monkeypatch):
    monkeypatch.setenv("GRPOKIT_TEST_SECRET", "s3cret")
    code = (
        "import os\nfound = 'GRPOKIT_TEST_SECRET' in os.environ\n"
        "for p in ['/proc/1/environ', '/proc/self/environ', %r, '/etc/passwd', '/root/.bashrc']:\n"
        "    try:\n        t = open(p, 'rb').read()\n"
        "        found |= b's3cret' in t or b'intact' in t or b'root:' in t\n"
        "    except OSError:\n        pass\nif found:\n    print(3)" % str(canary)
    )
    assert score(code) == 0.0


def test_reading_the_expected_outputs(canary):
    cases = [{"input": "", "output": "EXPECTED-7f3a-1234"}]
    code = (
        "import os\nfor root, dirs, files in os.walk('/'):\n"
        "    if root.startswith(('/proc', '/sys', '/dev')):\n        continue\n    for f in files:\n"
        "        try:\n            t = open(os.path.join(root, f), errors='ignore').read(10**6)\n"
        "        except OSError:\n            continue\n"
        "        if 'EXPECTED-' in t and 'EXPECTED-7f3a' not in __file__:\n"
        "            i = t.index('EXPECTED-')\n            print(t[i:i + 18])\n            raise SystemExit"
    )
    assert score(code, cases) == 0.0


def test_connecting_to_a_loopback_server(canary):
    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    server.settimeout(3.0)
    port = server.getsockname()[1]
    seen = []
    thread = threading.Thread(target=lambda: seen.append(_accept(server)))
    thread.start()
    code = (
        "import socket\ntry:\n    socket.create_connection(('127.0.0.1', %d), timeout=0.5).sendall(b'hi')\n"
        "    print(3)\nexcept OSError:\n    pass" % port
    )
    assert score(code) == 0.0
    thread.join()
    server.close()
    assert seen == [False]  # the server saw no connection


def _accept(server: socket.socket) -> bool:
    try:
        server.accept()
        return True
    except socket.timeout:
        return False


def test_killing_other_processes(canary):
    code = (
        "import os, signal\nfor pid in (%d, %d, -1):\n    try:\n        os.kill(pid, signal.SIGKILL)\n"
        "        print(3)\n    except OSError:\n        pass" % (os.getpid(), os.getppid())
    )
    assert score(code) == 0.0
    assert os.getppid() != 1  # our parent lives too


def test_flooding_stdout(canary):
    start = time.monotonic()
    assert score("while True:\n    print('3' * 10000)") == 0.0
    assert score("import os\nwhile True:\n    os.write(1, b'3' * 10000)", CALL) == 0.0
    assert time.monotonic() - start < 6


def test_filling_the_disk(canary):
    code = (
        "import os\nn = 0\nfor i in range(10**6):\n    try:\n        with open(f'/tmp/f{i}', 'wb') as f:\n"
        "            f.write(b'x' * 2**20)\n        n += 1\n    except OSError:\n        break\n"
        "if n > 64:\n    print(3)"
    )
    assert score(code) == 0.0


def test_exiting_zero_before_the_tests_run(canary):
    assert score("import os\nos._exit(0)\ndef add(a, b):\n    return a + b", CALL) == 0.0
    assert score("raise SystemExit(0)\ndef add(a, b):\n    return a + b", CALL) == 0.0


def test_objects_whose_eq_is_always_true(canary):
    code = "class Yes(int):\n    def __eq__(self, other):\n        return True\ndef add(a, b):\n    return Yes(0)"
    assert score(code, CALL) == 0.0
    assert score("class Yes:\n    __eq__ = lambda s, o: True\ndef add(a, b):\n    return Yes()", CALL) == 0.0


def test_excepthook_that_exits_zero(canary):
    code = "import os, sys\nsys.excepthook = lambda *a: os._exit(0)\ndef add(a, b):\n    raise ValueError"
    assert score(code, CALL) == 0.0


def test_printing_fake_passed_lines(canary):
    code = (
        "import os, json\nfor line in ['PASSED 1/1', json.dumps({'case': 0, 'status': 'ok', 'passed': True,"
        " 'value': 'ok'})]:\n    print(line)\n    os.write(3, (line + '\\n').encode())\n"
        "def add(a, b):\n    return None"
    )
    from grpokit.rewards.calls import collecting_faults

    with collecting_faults() as faults:  # call mode: a line the harness did not write forfeits the reward
        assert score(code, CALL) == 0.0
    assert faults[0][0] == "tampering"
    assert score(code.replace("def add", "def _unused")) == 0.0


def test_patching_the_checker(canary):
    code = (
        "import sys, json\ntry:\n    import grpokit.rewards.code as c\n    c.strict_equal = lambda a, b: True\n"
        "except ImportError:\n    pass\nm = sys.modules['__main__']\nm.to_plain = lambda x: 'patched'\n"
        'json.dumps = lambda *a, **k: \'{"case": 0, "status": "ok", "value": true}\'\n'
        "def add(a, b):\n    return None"
    )
    assert score(code, CALL) == 0.0
    # and the checker in this (trusted) process is untouched
    assert run_tests("def add(a, b):\n    return a + b", CALL, FAST) == [True]


def test_without_isolation_code_rewards_refuse_unless_unsafe_is_allowed(monkeypatch):
    import grpokit.rewards.code as code

    monkeypatch.setattr(code, "probe", lambda: (False, "bubblewrap (bwrap) is not installed"))
    with pytest.raises(code.UnsafeCodeExecutionError, match="allow_unsafe_code_execution=True"):
        code_pass_fraction(["```python\nprint(3)\n```"], [STDIO])
    assert code_pass_fraction(
        ["```python\nprint(int(input().split()[0]) + 2)\n```"], [STDIO], allow_unsafe_code_execution=True
    ) == [1.0]


# --- the trusted parent never raises on what a program writes ---

HOSTILE_RECORDS = [
    "[" * 100_000 + "]" * 100_000,  # RecursionError in a plain json.loads
    '{"case": 0, "status": "ok", "value": ' + "[" * 5000 + "]" * 5000 + "}",
    '{"case": 0, "status": "ok", "value": ' + '{"a": ' * 5000 + "1" + "}" * 5000 + "}",
    '{"case": 0, "status": "ok", "value": ' + "9" * 100_000 + "}",  # int too long to convert
    '{"case": ' + "1" * 5000 + ', "status": "ok"}',
    '{"case": true, "status": "ok", "value": 3}',  # bool is not a case number
    '{"case": 0, "status": "ok", "stdout": ["3"]}',
    '{"case": 0, "status": "ok", "value": NaN}',
    '{"case": 0, "status": {"ok": 1}, "value": 3}',
    "\udcff\x00" * 100,
    "[]",
    "3",
    "null",
    '"x"',
]


@pytest.mark.parametrize("line", HOSTILE_RECORDS, ids=range(len(HOSTILE_RECORDS)))
def test_hostile_result_records_are_failed_cases_not_parent_errors(canary, line):
    # The program writes the hostile line on the result channel, then exits; add(1, 2) is never
    # reported honestly. In call mode (the program shares the harness's process) any line the harness
    # did not write is tampering: the completion scores 0.0, counted as tampering; a well-formed record
    # of case 0 in its place is read as the program's own (wrong) output: 0.0. In stdio mode the
    # program cannot reach the channel: 0.0.
    code = f"import os\nos.write(3, ({line!r} + '\\n').encode('utf-8', 'surrogatepass'))\nos._exit(0)"
    assert score(code, CALL) == 0.0
    assert score(code) == 0.0


def test_a_hostile_line_fails_the_case_it_was_written_in(canary):
    # a deeply nested line, then a well-formed record for case 0, both written by the program: the
    # harness writes one line per case, so the stray line is tampering (failing only its case would give 1.0)
    from grpokit.rewards.calls import collecting_faults

    code = (
        "import os\nos.write(3, b'[' * 100000 + b'\\n')\n"
        'os.write(3, b\'{"case": 0, "status": "ok", "value": 3}\\n\')\nos._exit(0)'
    )
    with collecting_faults() as faults:
        assert score(code, CALL) == 0.0
    assert faults[0][0] == "tampering"


def test_nesting_and_size_bounds_of_the_parser():
    from grpokit.rewards.sandbox.isolation import MAX_DEPTH, MAX_LINE_BYTES, parse_records

    ok_value = "[" * MAX_DEPTH + "]" * MAX_DEPTH  # MAX_DEPTH lists inside the record's dict: at the bound
    deep = "[" * (MAX_DEPTH + 1) + "]" * (MAX_DEPTH + 1)  # one more level: rejected
    text = "\n".join(
        [
            '{"case": 0, "value": %s}' % ok_value,
            '{"case": 1, "value": %s}' % deep,
            '{"case": 2, "value": "%s"}' % ("x" * MAX_LINE_BYTES),
            '{"case": 3}',
        ]
    )
    assert [r["case"] for r in parse_records(text)] == [0, 3]


# --- no zombie survives a call, even when the trainer is PID 1 ---

PID1_TRAINER = r"""
import os
from grpokit.rewards.code import code_pass_fraction
assert os.getpid() == 1
honest = "```python\na, b = map(int, input().split())\nprint(a + b)\n```"
looping = "```python\nimport os\nos.fork()\nwhile True:\n    pass\n```"  # killed at the wall-clock limit
scores = code_pass_fraction([honest] * 20 + [looping] * 10, [[{"input": "1 2\n", "output": "3\n"}]] * 30,
                            wall_s=1.0, max_parallel=5)
zombies = 0
for pid in filter(str.isdigit, os.listdir("/proc")):
    try:
        zombies += open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        pass
print(zombies, scores.count(1.0), scores.count(0.0))
"""


def test_no_zombies_after_30_calls_when_the_trainer_is_pid_1():
    # Without a subreaper launcher every call would leave bwrap's namespace init as a zombie of PID 1
    # (21 zombies after these 30 calls). Expected: 0 zombies, the 20 honest programs pass, the 10 loops fail.
    import shutil
    import subprocess
    import sys

    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("needs root and util-linux unshare to run the trainer as PID 1 of a new PID namespace")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    out = subprocess.run(
        ["unshare", "--pid", "--fork", "--mount-proc", sys.executable, "-c", PID1_TRAINER],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    if out.returncode != 0 and "unshare failed" in out.stderr:
        pytest.skip(f"this host refuses a new PID namespace: {out.stderr.strip()[:200]}")
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["0", "20", "10"]


# --- seccomp: the kernel's attack surface is closed inside the sandbox ---


def test_seccomp_denies_namespaces_mounts_io_uring_userfaultfd_keyrings_bpf_ptrace():
    # The program returns every denied system call that did not answer EPERM (clone3: ENOSYS), so the
    # expected value [] scores 1.0 only if all are blocked. Without the filter, as root, this returned
    # unshare(CLONE_NEWUSER) -> 0, clone(CLONE_NEWUSER) -> a pid, io_uring_setup and userfaultfd -> a
    # descriptor, keyctl -> a keyring id, and most zero-argument calls reached the kernel (EINVAL, EFAULT).
    import platform

    from grpokit.rewards.sandbox import seccomp

    if seccomp.filter_bytes() is None:
        pytest.skip(f"no seccomp syscall table for {platform.machine()}; the sandbox runs without a filter")
    _, numbers = seccomp.SYSCALLS[platform.machine()]
    code = SYSCALL_PROBE % (numbers, seccomp.DENIED)
    cases = [{"fn": "escapes", "args": [], "expected": []}]
    result = run_tests(code, cases, FAST)
    assert result == [True]
    # threads, subprocesses and fork still work for honest programs under the filter
    honest = (
        "import threading, subprocess, sys, os\ndef add(a, b):\n    out = []\n"
        "    t = threading.Thread(target=lambda: out.append(a + b))\n    t.start(); t.join()\n"
        "    pid = os.fork()\n    if pid == 0:\n        os._exit(7)\n"
        "    assert os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 7\n"
        "    r = subprocess.run([sys.executable, '-c', 'print(1)'], capture_output=True)\n"
        "    return out[0] + int(r.stdout) - 1"
    )
    assert score(honest, CALL) == 1.0


def test_seccomp_filter_layout():
    # 4 header + 2 (x32 check) + 2 per denied syscall (46 on x86-64) + 7 (clone3, clone flags) instructions
    from grpokit.rewards.sandbox import seccomp

    prog = seccomp.filter_bytes("x86_64")
    assert len(prog) == 8 * (4 + 2 + 2 * (len(seccomp.DENIED) + 3) + 7)
    assert seccomp.filter_bytes("riscv64") is None


NON_ROOT_SECCOMP = r"""
import os, platform
from grpokit.rewards.code import probe, run_tests
from grpokit.rewards.sandbox import seccomp
from grpokit.rewards.sandbox import uids
from grpokit.rewards.sandbox.isolation import Limits
from helpers.sandbox_probes import SYSCALL_PROBE
assert os.geteuid() != 0 and probe()[0], probe()
code = SYSCALL_PROBE % (seccomp.SYSCALLS[platform.machine()][1], seccomp.DENIED)
print(run_tests(code, [{"fn": "escapes", "args": [], "expected": []}], Limits(wall_s=3)))
"""


def test_seccomp_also_holds_in_non_root_mode():
    # The trainer runs with euid 1000 in a user namespace (so the sandbox takes bwrap's unprivileged
    # path: --unshare-user, --disable-userns); the same probe must find every denied call blocked.
    import shutil
    import subprocess
    import sys

    from grpokit.rewards.sandbox import seccomp

    if seccomp.filter_bytes() is None or os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("needs root, util-linux unshare and a seccomp table to start a non-root trainer")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS), *sys.path])}
    out = subprocess.run(
        ["unshare", "--user", "--map-user=1000", "--map-group=1000", sys.executable, "-c", NON_ROOT_SECCOMP],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    if out.returncode != 0 and "unshare failed" in out.stderr:
        pytest.skip(f"this host refuses a user namespace: {out.stderr.strip()[:200]}")
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["[True]"]
