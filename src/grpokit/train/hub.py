"""A model id that must come from the Hugging Face Hub fails fast when the Hub cannot be reached, and a
cached one loads from the cache at once.

Without this, transformers retries an unreachable endpoint for tens of seconds and then reports that
the model "does not appear to exist" - the wrong cause; and an id already in the local cache still
asks the Hub for each file (measured: ~8 minutes of retries before a small model started with no
network, 21 s with HF_HUB_OFFLINE=1). So before loading an id that is not a local folder, one TCP
connection to the endpoint (HF_ENDPOINT, else huggingface_hub's) is tried with a short timeout, once
per endpoint in a process; when it fails, an id in the cache is loaded from its cached snapshot folder
(what HF_HUB_OFFLINE would read), said in one line, and any other id stops the run with one sentence
saying the Hub could not be reached. Offline mode (HF_HUB_OFFLINE) and proxies are left to
huggingface_hub, which handles them itself.
"""

from __future__ import annotations

import os
import re
import socket
import sys
from functools import lru_cache
from urllib.parse import urlsplit

from grpokit.config.sections import ConfigError

CONNECT_TIMEOUT_S = 5.0
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$")
_PROXIES = ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy")


def _endpoint() -> str:
    from huggingface_hub import constants

    return os.environ.get("HF_ENDPOINT") or constants.ENDPOINT


def _cached(repo_id: str) -> str | None:
    """The id's cached snapshot folder (the one holding its config.json at the cache's main ref), else None."""
    from huggingface_hub import try_to_load_from_cache

    try:
        config = try_to_load_from_cache(repo_id, "config.json")
    except Exception:  # a malformed id: let transformers say what is wrong with it
        return None
    return os.path.dirname(config) if isinstance(config, str) else None


@lru_cache(maxsize=None)
def _unreachable(host: str, port: int) -> str | None:
    """Why one TCP connection to the endpoint failed (the exception's class name), None when it opened.
    Once per endpoint and process: the tokenizer, the model and the processor each resolve the id."""
    try:
        socket.create_connection((host, port), timeout=CONNECT_TIMEOUT_S).close()
    except OSError as e:
        return e.__class__.__name__
    return None


def check_reachable(name_or_path: str, setting: str = "model.name_or_path") -> str:
    """What to load ``name_or_path`` from: itself, or, for an id in the local cache while the Hub's
    endpoint refuses or times out, its cached snapshot folder (said in one line). ConfigError naming
    ``setting`` when the id needs the Hub and the Hub cannot be reached."""
    if os.path.exists(name_or_path) or not _HUB_ID.match(name_or_path):
        return name_or_path
    if os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes") or any(os.environ.get(p) for p in _PROXIES):
        return name_or_path
    url = urlsplit(_endpoint())
    port = url.port or (443 if url.scheme == "https" else 80)
    why = _unreachable(url.hostname or "", port)
    if why is None:
        return name_or_path
    where = f"the Hugging Face Hub at {url.scheme}://{url.netloc} could not be reached ({why})"
    snapshot = _cached(name_or_path)
    if snapshot is not None:
        _say_offline(f"grpokit: {where}; loading {name_or_path!r} offline from the local cache ({snapshot})")
        return snapshot
    raise ConfigError(
        f"{setting}={name_or_path!r} is not a local folder nor in the local cache, and {where}; "
        "check the network or HF_ENDPOINT, or give a local model folder"
    )


@lru_cache(maxsize=None)
def _say_offline(line: str) -> None:
    """The offline line once per id and process (each loader resolves the id again)."""
    if os.environ.get("RANK", "0") == "0":
        print(line, file=sys.stderr, flush=True)
