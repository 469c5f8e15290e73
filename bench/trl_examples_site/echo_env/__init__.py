"""Stand-in for OpenEnv's Echo environment client (``echo_env`` from the qgallouedec/echo_env Space):
the same names, talking JSON over HTTP to the local echo server bench/trl_examples.py starts on
127.0.0.1. The server echoes the message and rewards its length (0.1 per character), as the Space's."""

from __future__ import annotations

import json
import urllib.request
from types import SimpleNamespace

from .models import EchoAction

__all__ = ["EchoAction", "EchoEnv"]


class EchoEnv:
    def __init__(self, base_url: str):
        self.base_url = base_url.rstrip("/")

    def _post(self, route: str, body: dict) -> SimpleNamespace:
        request = urllib.request.Request(
            self.base_url + route, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(request, timeout=10) as reply:
            data = json.loads(reply.read())
        return SimpleNamespace(observation=SimpleNamespace(**data), reward=data["reward"], done=False)

    def reset(self) -> SimpleNamespace:
        return self._post("/reset", {})

    def step(self, action: EchoAction) -> SimpleNamespace:
        return self._post("/step", {"message": action.message})
