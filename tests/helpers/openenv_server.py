"""An OpenEnv server for the tests, on 127.0.0.1: the echo environment that ``openenv init`` writes
(openenv-core's own template), served by openenv's ``create_app`` with room for one websocket
session per episode. ``--step-delay S`` makes a step sleep S seconds first (a slow server): every step, or with
``--sleep-word W`` only those whose message starts with W.

    python tests/helpers/openenv_server.py ENV_PARENT_DIR ENV_NAME PORT [--step-delay S] [--sleep-word W]
"""

import argparse
import importlib
import sys
import time

import uvicorn
from openenv.core.env_server.http_server import create_app


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("parent")
    p.add_argument("name")
    p.add_argument("port", type=int)
    p.add_argument("--step-delay", type=float, default=0.0)
    p.add_argument("--sleep-word", default="")
    a = p.parse_args()
    sys.path.insert(0, a.parent)
    models = importlib.import_module(f"{a.name}.models")
    server = importlib.import_module(f"{a.name}.server.{a.name}_environment")
    from openenv.core.env_server.interfaces import Environment
    from openenv.core.env_server.types import Action, Observation

    def defined(module, base):  # the one subclass of base the generated module defines
        return next(v for v in vars(module).values() if isinstance(v, type) and issubclass(v, base) and v is not base)

    env_cls = defined(server, Environment)
    delay = a.step_delay

    class Served(env_cls):
        def step(self, action):
            if str(getattr(action, "message", "")).startswith(a.sleep_word):
                time.sleep(delay)
            return super().step(action)

    app = create_app(
        Served, defined(models, Action), defined(models, Observation), env_name=a.name, max_concurrent_envs=64
    )
    uvicorn.run(app, host="127.0.0.1", port=a.port, log_level="warning")


if __name__ == "__main__":
    main()
