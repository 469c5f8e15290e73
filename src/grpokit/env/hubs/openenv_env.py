"""OpenEnv servers as grpokit environments (``pip install 'grpokit[openenv]'``).

An OpenEnv environment is a server (``openenv.core.env_server.create_app``: HTTP plus a websocket
session per client) with ``reset()`` and ``step(action)``, each answering an observation, a reward
and ``done``. ``openenv_environment(base_url, action_field=...)`` makes the class grpokit (and
TRL's ``environment_factory``) builds once per episode, the pattern of TRL's
examples/scripts/openenv/: ``reset(**row)`` opens a session with OpenEnv's own client
(``GenericEnvClient``, dictionaries, so no environment package is needed) and returns the first
observation; the one tool ``act(action)`` is the episode's step (the model's call
``<tool_call>ACTION</tool_call>`` sends ``{action_field: ACTION}``), its observation the tool
turn; ``done`` is the server's; ``get_reward()`` the reward of the last step (as TRL's echo
example reads it).

Faults of the server go through the environment stage's fault model. Every request has a
deadline (``timeout_s``, and the episode loop's own ``env.tool_timeout_s`` / ``env.reset_timeout_s``
around it); a reset that fails (no server, a timeout, a wrong reply) is counted in
``episodes/reset_failures`` and the prompt's episodes start from the bare prompt; a step that
fails raises ``TerminalToolError`` with one sentence naming the server and what went wrong, which
ends that episode (finish reason ``tool_error``, counted in ``tools/failure_frequency``) and never
the run. A reply without an observation object or with a non-numeric reward is a wrong reply.
"""

from __future__ import annotations

import json
import logging
import math
import threading
from typing import Any

from grpokit.env.tools import TerminalToolError

from . import require

log = logging.getLogger(__name__)
CLOSE_WAIT_S = 2.0  # how long ending a session may hold the episode


class OpenEnvError(RuntimeError):
    """A reset against the server failed (reported as one sentence; counted as a reset failure)."""


def openenv_environment(
    base_url: str,
    *,
    action_field: str = "message",
    observation_field: str | None = None,
    timeout_s: float = 10.0,
    connect_timeout_s: float = 5.0,
    name: str = "OpenEnv",
) -> type:
    """The environment class for the OpenEnv server at ``base_url`` (http://host:port).

    ``action_field`` is the field of the server's action that carries the model's text;
    ``observation_field`` the field of its observation shown to the model (None: every field but
    ``reward``, ``done`` and ``metadata``, one ``key: value`` line each). ``name`` names the class,
    and so the reward component of ``get_reward()``."""
    require("openenv.core", "openenv")
    if not base_url.startswith(("http://", "https://", "ws://", "wss://")):
        raise ValueError(f"openenv_environment: base_url={base_url!r} must be a URL like http://127.0.0.1:8000")
    settings = dict(
        base_url=base_url.rstrip("/"),
        action_field=action_field,
        observation_field=observation_field,
        timeout_s=float(timeout_s),
        connect_timeout_s=float(connect_timeout_s),
    )
    return type(
        name, (_OpenEnvSession,), {"settings": settings, "__doc__": f"An episode on the OpenEnv server at {base_url}."}
    )


class _OpenEnvSession:
    """One episode's session on the server (the class ``openenv_environment`` specialises)."""

    settings: dict[str, Any] = {}

    def __init__(self) -> None:
        self._client = None
        self.reward: float = 0.0
        self.done = False

    def reset(self, **row: Any) -> str | None:
        self._close()
        s = self.settings
        from openenv.core.generic_client import GenericEnvClient

        self.reward, self.done = 0.0, False
        try:
            self._client = GenericEnvClient(
                s["base_url"], connect_timeout_s=s["connect_timeout_s"], message_timeout_s=s["timeout_s"]
            ).sync()
            result = self._client.reset()
            text, _, _ = self._read(result, "reset")
        except Exception as e:
            self._close(wait_s=0.0)
            sentence = self._sentence("reset", e)
            log.warning("%s", sentence)  # the loop counts the failure; the log says why
            raise OpenEnvError(sentence) from None
        return text or None

    def act(self, action: str) -> str:
        """Send your action to the environment and read what it answers.

        Args:
            action: the action, as text.
        """
        if self._client is None:
            raise TerminalToolError(
                f"the OpenEnv session at {self.settings['base_url']} is not open (its reset failed)"
            )
        if self.done:
            raise TerminalToolError("the episode is over; the environment takes no more actions")
        try:
            result = self._client.step({self.settings["action_field"]: action})
            text, reward, done = self._read(result, "step")
        except Exception as e:
            self._close(wait_s=0.0)  # a failed session is not waited on: the deadline has already passed
            raise TerminalToolError(self._sentence("step", e)) from None
        self.reward, self.done = reward, done
        if done:
            self._close()
        return text

    def get_reward(self) -> float:
        return float(self.reward)

    def _close(self, wait_s: float = CLOSE_WAIT_S) -> None:
        """End the session on the server. In a daemon thread waited on for ``wait_s`` at most: the
        client's close blocks on its event loop, which at interpreter exit may never answer."""
        client, self._client = self._client, None
        if client is not None:
            t = threading.Thread(target=_close_quietly, args=(client,), name="grpokit-openenv-close", daemon=True)
            t.start()
            t.join(timeout=wait_s)

    def __del__(self) -> None:  # an episode that ended without done: its session ends when it is dropped
        self._close(wait_s=0.0)

    # ------------------------------------------------------------------ the server's reply

    def _read(self, result: Any, what: str) -> tuple[str, float, bool]:
        """(observation text, reward, done) of a reply; a malformed reply raises ValueError."""
        obs, reward = result.observation, result.reward
        if not isinstance(obs, dict):
            raise ValueError(f"its {what} reply has no observation object (got {type(obs).__name__})")
        if reward is None:
            reward = obs.get("reward") or 0.0
        if isinstance(reward, bool) or not isinstance(reward, (int, float)) or not math.isfinite(reward):
            raise ValueError(f"its {what} reply has reward {reward!r}, not a finite number")
        field = self.settings["observation_field"]
        if field is not None:
            if field not in obs:
                raise ValueError(f"its observation has no field {field!r} (fields: {', '.join(sorted(obs)) or 'none'})")
            text = _text(obs[field])
        else:
            text = "\n".join(f"{k}: {_text(v)}" for k, v in obs.items() if k not in ("reward", "done", "metadata"))
        return text, float(reward), bool(result.done)

    def _sentence(self, what: str, e: Exception) -> str:
        url = self.settings["base_url"]
        if isinstance(e, TimeoutError) or type(e).__name__ == "TimeoutError":
            return f"the OpenEnv server at {url} did not answer {what} within {self.settings['timeout_s']:g} s"
        if isinstance(e, ValueError):
            return f"the OpenEnv server at {url} sent a wrong reply: {e}"
        if isinstance(e, ConnectionError):
            return f"could not reach the OpenEnv server at {url} for {what} ({_first_line(e)})"
        return f"the OpenEnv server at {url} failed on {what}: {type(e).__name__}: {_first_line(e)}"


def _close_quietly(client: Any) -> None:
    try:
        client.close()
    except Exception:  # closing a session whose server is gone: nothing left to do
        pass


def _text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, default=str)


def _first_line(e: Exception) -> str:
    text = str(e).strip().splitlines()
    return text[0][:300] if text else type(e).__name__
