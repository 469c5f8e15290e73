"""TextArena single-player games as grpokit environments (``pip install 'grpokit[textarena]'``).

``textarena_environment("GuessTheNumber-v0")`` makes the class built once per episode:
``reset(**row)`` seeds Python's random generator with the row's ``seed`` column (TextArena draws
its games from it; the G episodes of a row play the same game, as GRPO compares them), makes the
game with ``textarena.make`` and resets it for one player, returning the game's opening text; the
one tool ``move(move)`` is the episode's step (``<tool_call>7</tool_call>`` plays ``[7]``: the
game's own action wrapper brackets a move), and what the game answers to it is the tool turn
(only what is new since the last observation, not the whole history again). ``done`` is the
game's, and ``get_reward()`` the game's own reward for player 0 when it is over (0.0 before: an
unfinished game scores nothing). Games that need downloads at reset (nltk word lists: Wordle,
Hangman) work only where those are installed.
"""

from __future__ import annotations

import random
import threading
from typing import Any

from grpokit.config.base import ConfigError
from grpokit.env.tools import TerminalToolError

from . import require

_SEED_LOCK = threading.Lock()  # the global random generator is seeded and drawn from under it


def textarena_environment(env_id: str, *, seed_column: str = "seed", name: str | None = None) -> type:
    """The environment class of the single-player TextArena game ``env_id`` (e.g. "GuessTheNumber-v0").
    ``seed_column`` names the row column that picks the game (absent: seed 0); ``name`` names the
    class, and so the reward component of ``get_reward()`` (default: the game id without "-v0")."""
    ta = require("textarena", "textarena")
    try:
        ta.make(env_id=env_id)
    except Exception as e:
        raise ConfigError(
            f"textarena has no game {env_id!r} ({str(e).splitlines()[0][:200] if str(e) else type(e).__name__})"
        ) from None
    cls_name = name or env_id.split("-v")[0].replace("-", "_")
    settings = {"env_id": env_id, "seed_column": seed_column}
    return type(cls_name, (_Game,), {"settings": settings, "__doc__": f"One game of TextArena's {env_id}."})


class _Game:
    """One episode's game (the class ``textarena_environment`` specialises)."""

    settings: dict[str, Any] = {}

    def __init__(self) -> None:
        self._game = None
        self._seen = ""
        self.done = False
        self.reward = 0.0
        self.outcome = ""

    def reset(self, **row: Any) -> str:
        import textarena as ta

        seed = row.get(self.settings["seed_column"], 0)
        with _SEED_LOCK:
            saved = random.getstate()
            try:
                random.seed(seed)
                self._game = ta.make(env_id=self.settings["env_id"])
                try:
                    self._game.reset(num_players=1)
                except Exception as e:
                    raise ConfigError(
                        f"{self.settings['env_id']} could not start as a single-player game ({e})"
                    ) from None
            finally:
                random.setstate(saved)
        self.done, self.reward, self.outcome = False, 0.0, ""
        self._seen = ""
        return self._new_text()

    def move(self, move: str) -> str:
        """Play your move in the game.

        Args:
            move: the move, e.g. a number or a word.
        """
        if self._game is None or self.done:
            raise TerminalToolError("the game is over; it takes no more moves")
        done, _ = self._game.step(str(move))
        if done or self._game.state.done:
            self.done = True
            rewards = self._game.state.rewards or {}
            self.reward = float(rewards.get(0, 0.0))
            info = (self._game.state.game_info or {}).get(0, {})
            self.outcome = str(info.get("reason", ""))
            return f"Game over. {self.outcome}".strip()
        return self._new_text()

    def get_reward(self) -> float:
        return self.reward

    def _new_text(self) -> str:
        """What the game shows now that it had not shown before (its observation repeats the history)."""
        _, obs = self._game.get_observation()
        text = (
            obs
            if isinstance(obs, str)
            else "\n".join(str(m[1]) if isinstance(m, tuple) and len(m) > 1 else str(m) for m in obs)
        )
        new = text.removeprefix(self._seen)
        self._seen = text
        return new.strip()
