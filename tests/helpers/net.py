"""Loopback networking for tests: a free TCP port on 127.0.0.1."""

import socket


def free_port() -> int:
    """A port nothing listens on right now (the kernel's pick, released again: a test binds it soon after)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
