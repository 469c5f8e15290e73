"""HTTP to a vLLM server, treated as untrusted: a total deadline, a size bound, a checked reply shape.

A server is another program on another machine; a broken, overloaded or hostile one must cost the
trainer one sentence, never a hang, an out-of-memory kill or a KeyError:

- Deadline: ``timeout`` bounds the *whole* request (connect, send, headers, body). A socket timeout
  alone is per read, so a server dripping one byte a second held a 5 s call for 64 s; here a timer
  shuts the socket down when the deadline passes, whatever the request is blocked on.
- Size: the body is read in chunks and refused past ``max_bytes`` (a 1 GiB reply was read whole).
- Shape: ``parse_choices`` checks every field of a completions reply it uses and raises
  ``ServerReplyError`` (one sentence) on anything else; it never raises another exception.

Standard library only (``http.client``): no proxy is consulted, since trainer -> server traffic stays
inside the cluster and an HTTP(S)_PROXY set for the internet must not catch it.
"""

from __future__ import annotations

import http.client
import json
import math
import socket
import threading
import urllib.parse
from typing import Any

MAX_REPLY_BYTES = 16 * 2**20  # health, models, RPC answers: small JSON
REPLY_BYTES_PER_TOKEN = 256  # a sampled token with its logprob is ~40 bytes of JSON; 256 leaves room


class ServerReplyError(RuntimeError):
    """A vLLM server's reply does not have the shape grpokit needs (one sentence)."""


class HTTPAnswer:
    """A server's answer: status (0 = no complete answer), parsed JSON body ({} when empty or not JSON), raw text."""

    def __init__(self, status: int, body: Any, text: str):
        self.status, self.body, self.text = status, body, text

    @property
    def message(self) -> str:
        """vLLM's error text: its ``{"error": {"message": ...}}`` (ErrorResponse), else the raw body
        (0.10.2 answers an unhandled exception, e.g. a failed collective_rpc, with plain "Internal Server Error")."""
        b = self.body
        if isinstance(b, dict) and isinstance(b.get("error"), dict):
            return str(b["error"].get("message", ""))
        if isinstance(b, dict) and ("message" in b or "detail" in b):
            return str(b.get("message", b.get("detail")))
        return self.text.strip()[:300]


def http_call(method: str, url: str, body: dict | None, timeout: float, max_bytes: int = MAX_REPLY_BYTES) -> HTTPAnswer:
    """One HTTP request finished within ``timeout`` seconds in total; errors come back as an answer
    (status 0 with the reason when no complete answer came)."""
    parts = urllib.parse.urlsplit(url)
    cls = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    data = None if body is None else json.dumps(body).encode()
    conn = cls(parts.hostname or "", parts.port, timeout=timeout)
    expired = threading.Event()
    timer = threading.Timer(timeout, _cut, args=(conn, expired))
    timer.daemon = True
    timer.start()
    try:
        conn.request(method, path, body=data, headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        raw = _read_bounded(resp, max_bytes, expired)
        status = resp.status
    except _TooLarge:
        return HTTPAnswer(0, {}, f"the reply was larger than {max_bytes} bytes")
    except (OSError, http.client.HTTPException, ValueError) as e:  # refused, unreachable, DNS, cut, not HTTP
        if expired.is_set():
            return HTTPAnswer(0, {}, f"timed out: no complete reply within {timeout:g} s")
        return HTTPAnswer(0, {}, str(getattr(e, "reason", e)) or type(e).__name__)
    finally:
        timer.cancel()
        conn.close()
    if expired.is_set():  # the cut can look like a clean end of the body
        return HTTPAnswer(0, {}, f"timed out: no complete reply within {timeout:g} s")
    text = raw.decode(errors="replace")
    try:
        parsed = json.loads(text) if text.strip() else {}
    except (ValueError, RecursionError):
        parsed = {}
    return HTTPAnswer(status, parsed, text)


class _TooLarge(Exception):
    pass


def _read_bounded(resp: http.client.HTTPResponse, max_bytes: int, expired: threading.Event) -> bytes:
    chunks, size = [], 0
    while not expired.is_set():
        chunk = resp.read1(65536)
        if not chunk:
            break
        size += len(chunk)
        if size > max_bytes:
            raise _TooLarge()
        chunks.append(chunk)
    return b"".join(chunks)


def _cut(conn: http.client.HTTPConnection, expired: threading.Event) -> None:
    """The deadline: wake whatever read or write the request is blocked in."""
    expired.set()
    sock = conn.sock
    if sock is not None:
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass


def sampling_fields(group_size: int, p: Any) -> dict[str, Any]:
    """vLLM's sampling fields of one request (``p``: rollout/hf.py's SamplingParams), every one sent;
    the stop string stays in the output, as the hf engine keeps a tag-format tool call's closing tag."""
    return {
        "n": group_size,
        "max_tokens": p.max_new_tokens,
        "temperature": p.temperature,
        "top_p": p.top_p,
        "top_k": p.top_k,
        "min_p": p.min_p,
        "repetition_penalty": p.repetition_penalty,
        "presence_penalty": 0.0,
        "frequency_penalty": 0.0,
        "stop": list(p.stop),
        "logprobs": 0,
        "include_stop_str_in_output": True,
    }


def reply_budget(num_choices: int, max_tokens: int) -> int:
    """Most bytes a completions reply for ``num_choices`` samples of ``max_tokens`` tokens may take."""
    return 2**20 + num_choices * max(1, max_tokens) * REPLY_BYTES_PER_TOKEN


def parse_choices(body: Any, expected: int) -> list[tuple[int, list[int], list[float], Any, Any]]:
    """``(index, token ids, logprobs, finish_reason, stop_reason)`` of each choice of a
    ``/v1/completions`` reply, sorted by index; ``ServerReplyError`` for any other shape."""
    choices = body.get("choices") if isinstance(body, dict) else None
    if not isinstance(choices, list):
        raise ServerReplyError(f"the vLLM server's completions reply has no list of choices (got {_kind(body)})")
    if len(choices) != expected:
        raise ServerReplyError(f"the vLLM server returned {len(choices)} choices, expected {expected}")
    out = [_choice(c, k) for k, c in enumerate(choices)]
    out.sort(key=lambda c: c[0])
    if [c[0] for c in out] != list(range(expected)):
        raise ServerReplyError(f"the vLLM server's choice indices are not 0..{expected - 1}")
    return out


def _choice(c: Any, k: int) -> tuple[int, list[int], list[float], Any, Any]:
    if not isinstance(c, dict) or type(c.get("index")) is not int:
        raise ServerReplyError(f"the vLLM server's choice {k} is not an object with an integer index")
    lp = c.get("logprobs")
    tokens = lp.get("tokens") if isinstance(lp, dict) else None
    values = lp.get("token_logprobs") if isinstance(lp, dict) else None
    if not isinstance(tokens, list) or not isinstance(values, list) or len(tokens) != len(values):
        raise ServerReplyError(f"the vLLM server returned choice {c['index']} without per-token logprobs")
    ids, lps = [], []
    for t, v in zip(tokens, values):
        head, _, tail = t.partition(":") if isinstance(t, str) else ("", "", "")
        if head != "token_id" or not tail.isascii() or not tail.isdigit() or len(tail) > 12:
            raise ServerReplyError(
                f"the vLLM server returned token {str(t)[:40]!r} in choice {c['index']}, "
                "not 'token_id:<id>' (is it run with return_tokens_as_token_ids?)"
            )
        if type(v) not in (int, float) or not math.isfinite(v):
            raise ServerReplyError(
                f"the vLLM server returned logprob {str(v)[:40]!r} in choice {c['index']}, not a finite number"
            )
        ids.append(int(tail))
        lps.append(float(v))
    finish, stop = c.get("finish_reason"), c.get("stop_reason")
    if finish is not None and not isinstance(finish, str):
        raise ServerReplyError(f"the vLLM server returned finish_reason {str(finish)[:40]!r} in choice {c['index']}")
    return c["index"], ids, lps, finish, stop


def _kind(x: Any) -> str:
    return f"a {type(x).__name__}" if not isinstance(x, dict) else f"keys {sorted(map(str, x))[:5]}"


__all__ = ["HTTPAnswer", "ServerReplyError", "http_call", "parse_choices", "reply_budget"]
