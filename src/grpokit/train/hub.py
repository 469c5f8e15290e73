"""A model id that must come from the Hugging Face Hub fails fast when the Hub cannot be reached.

Without this, transformers retries an unreachable endpoint for tens of seconds and then reports that
the model "does not appear to exist" - the wrong cause. So before loading an id that is neither a
local folder nor in the local cache, one TCP connection to the endpoint (HF_ENDPOINT, else
huggingface_hub's) is tried with a short timeout; when it fails, the run stops with one sentence
saying the Hub could not be reached. Offline mode (HF_HUB_OFFLINE) and proxies are left to
huggingface_hub, which handles them itself.
"""

from __future__ import annotations

import os
import re
import socket
from urllib.parse import urlsplit

from grpokit.config.sections import ConfigError

CONNECT_TIMEOUT_S = 5.0
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$")
_PROXIES = ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy")


def _endpoint() -> str:
    from huggingface_hub import constants

    return os.environ.get("HF_ENDPOINT") or constants.ENDPOINT


def _cached(repo_id: str) -> bool:
    from huggingface_hub import try_to_load_from_cache

    try:
        return isinstance(try_to_load_from_cache(repo_id, "config.json"), str)
    except Exception:  # a malformed id: let transformers say what is wrong with it
        return True


def check_reachable(name_or_path: str) -> None:
    """Raise ConfigError when ``name_or_path`` needs the Hub and the Hub's endpoint refuses or times out."""
    if os.path.exists(name_or_path) or not _HUB_ID.match(name_or_path):
        return
    if os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes") or any(os.environ.get(p) for p in _PROXIES):
        return
    if _cached(name_or_path):
        return
    url = urlsplit(_endpoint())
    port = url.port or (443 if url.scheme == "https" else 80)
    try:
        socket.create_connection((url.hostname, port), timeout=CONNECT_TIMEOUT_S).close()
    except OSError as e:
        raise ConfigError(
            f"model.name_or_path={name_or_path!r} is not a local folder nor in the local cache, and the "
            f"Hugging Face Hub at {url.scheme}://{url.netloc} could not be reached ({e.__class__.__name__}); "
            "check the network or HF_ENDPOINT, or give a local model folder"
        ) from None
