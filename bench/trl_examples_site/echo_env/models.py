"""The Echo environment's action record."""

from dataclasses import dataclass


@dataclass
class EchoAction:
    message: str
