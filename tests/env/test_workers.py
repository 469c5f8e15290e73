"""env/workers.py: untrusted calls reuse a key's daemon threads, and an abandoned one is never reused."""

import contextvars
import threading
import time

from grpokit.env import workers
from grpokit.env.calls import call_many
from grpokit.env.tools import call_tool


def _key(name: str) -> str:
    return f"test-{name}-{time.monotonic_ns()}"


def _named(key: str) -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == f"grpokit-{key}"]


def test_many_batches_start_no_more_threads_than_run_at_once():
    key = _key("reuse")
    for b in range(40):  # 40 batches x 32 calls: 1280 calls, 8 at a time
        outs = call_many(key, [lambda b=b, i=i: (b, i) for i in range(32)], timeout_s=30, threads=8)
        assert [o.value for o in outs] == [(b, i) for i in range(32)]
    assert workers.started(key) <= 8  # a fresh thread per call started 1280
    assert len(_named(key)) <= 8


def test_a_worker_abandoned_on_a_hang_is_never_handed_another_call():
    key = _key("hang")
    release = threading.Event()
    hung: list[int] = []

    def hang():
        hung.append(threading.get_ident())
        try:
            release.wait(30)
        except BaseException:  # swallows the stop: it stays abandoned until it returns
            release.wait(30)
        return "late"

    first = call_many(key, [hang] + [threading.get_ident] * 3, timeout_s=0.3, threads=4)
    assert first[0].timed_out and not first[0].ok and all(o.ok for o in first[1:])
    for _ in range(5):  # later batches: fresh results, none of them on the abandoned thread
        later = call_many(key, [threading.get_ident] * 6, timeout_s=5, threads=4)
        assert all(o.ok for o in later) and hung[0] not in {o.value for o in later}
    assert workers.running_abandoned(key) == 1
    release.set()
    deadline = time.monotonic() + 10
    while workers.running_abandoned(key) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert workers.running_abandoned(key) == 0  # it returned "late" and ended, publishing nothing


def test_a_finished_call_is_never_stopped_and_its_worker_runs_the_next_call_unharmed():
    key = _key("late-stop")
    first = workers.submit(key, threading.get_ident)
    assert first.done.wait(10)
    assert first.abandon() is False  # finished: no stop is sent to the thread that moved on
    second = workers.submit(key, lambda: (time.sleep(0.3), threading.get_ident())[1])
    assert second.done.wait(10)
    assert second.error is None and second.value == first.value  # the same thread, no stray exception
    assert workers.started(key) == 1


def test_each_call_runs_in_a_fresh_context_as_in_a_new_thread():
    var: contextvars.ContextVar[str] = contextvars.ContextVar("var", default="unset")
    key = _key("context")
    outs = call_many(key, [lambda: var.set("first") and var.get(), var.get], timeout_s=5, threads=1)
    assert [o.value for o in outs] == ["first", "unset"] and workers.started(key) == 1


def test_tool_calls_reuse_one_thread_and_a_hung_tool_gets_a_new_one():
    release = threading.Event()

    def echo(x: str) -> str:
        if x == "hang":
            release.wait(30)
        return f"{x}@{threading.get_ident()}"

    name = _key("echo")
    tools = {name: echo}
    idents = {call_tool(tools, name, str(i), timeout_s=5, max_chars=100).content.split("@")[1] for i in range(20)}
    assert len(idents) == 1 and workers.started(f"tool-{name}") == 1
    assert call_tool(tools, name, "hang", timeout_s=0.2, max_chars=100).timed_out
    after = call_tool(tools, name, "7", timeout_s=5, max_chars=100).content
    assert after.startswith("7@") and after.split("@")[1] not in idents | {""}
    assert workers.started(f"tool-{name}") == 2
    release.set()


def test_run_all_keeps_order_bounds_threads_and_raises_the_first_error():
    key = _key("run-all")
    assert workers.run_all(key, [lambda i=i: i * i for i in range(50)], threads=4) == [i * i for i in range(50)]
    assert workers.started(key) <= 4

    def boom():
        raise ValueError("bad row")

    try:
        workers.run_all(key, [lambda: 1, boom, lambda: 3], threads=2)
    except ValueError as e:
        assert str(e) == "bad row"
    else:
        raise AssertionError("run_all swallowed the error")


def test_a_forked_child_starts_its_own_workers():
    import os

    key = _key("fork")
    assert call_many(key, [lambda: 1] * 4, timeout_s=5, threads=4)[0].value == 1  # idle workers in the parent
    pid = os.fork()
    if pid == 0:  # the child: the parent's idle threads do not exist here
        outs = call_many(key, [lambda: 5] * 4, timeout_s=5, threads=4)
        os._exit(0 if [o.value for o in outs] == [5] * 4 else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
