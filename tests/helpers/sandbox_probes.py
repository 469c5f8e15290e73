"""Programs that probe the code sandbox from inside (run by the sandbox tests, in-process and non-root)."""

SYSCALL_PROBE = r"""
import ctypes, errno, os
libc = ctypes.CDLL(None, use_errno=True)
NR = %r
def call(name, *args):
    r = libc.syscall(ctypes.c_long(NR[name]), *[ctypes.c_long(a) for a in args])
    return r, ctypes.get_errno()
def reached(name, *args):
    r, e = call(name, *args)
    if r == 0 and name == "clone":
        os._exit(0)  # in the child, if a clone got through
    if r > 0 and name == "clone":
        os.waitpid(r, 0)
    return None if r == -1 and e == errno.EPERM else f"{name}: {r} {errno.errorcode.get(e, e)}"
def escapes():
    params = ctypes.create_string_buffer(120)
    real = [reached("unshare", 0x10000000), reached("unshare", 0x20000), reached("clone", 0x10000000 | 17),
            reached("clone", 0x20000000 | 17), reached("io_uring_setup", 8, ctypes.addressof(params)),
            reached("userfaultfd", 1), reached("keyctl", 0, -3, 1), reached("ptrace", 0),
            reached("add_key", 0, 0, 0, 0, -2)]
    zero_args = [reached(name) for name in %r]  # even pointless arguments get EPERM from the filter
    r, e = call("clone3", 0, 0)
    clone3 = [] if r == -1 and e == errno.ENOSYS else [f"clone3: {r} {errno.errorcode.get(e, e)}"]
    return [x for x in real + zero_args if x] + clone3
"""


def sandbox_inside_the_call(completions, test_cases, **kwargs):
    """A user's reward that waits on each program's sandbox (60 s wall) inside its own call's deadline. The
    built-in code rewards wait outside it (calls.timed_elsewhere: each program keeps its own wall_s), so the
    tests of what a reward deadline landing in a sandbox's wait leaves behind use this one. Module level:
    it pickles into reward workers by reference."""
    from grpokit.rewards.code import extract_code, run_tests
    from grpokit.rewards.sandbox.isolation import Limits

    return [
        float(all(run_tests(extract_code(c), cases, Limits(wall_s=60.0)))) for c, cases in zip(completions, test_cases)
    ]
