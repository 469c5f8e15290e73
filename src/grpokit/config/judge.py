"""reward.judge's readers: the features that ask whether a completion is right (dynamic sampling, the frontier
curriculum, EDGE-GRPO's error correction), in one table that every sentence and filter naming them is built from."""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable

if TYPE_CHECKING:
    from .sections import Config

DYNAMIC_SAMPLING = "algo.dynamic_sampling=true"
"""The judge's reader for which the reward as trained is a sound judge of its own (a group flat in it has no
gradient): an empty reward.judge is no mistake there, and it was the only reader of the judge's old spelling,
algo.dynamic_sampling_on."""

# The features that read reward.judge: the setting that turns each on (as sentences name it) and whether a config
# has it on. judge_readers, validation's refusal of a judge nothing reads and the start-up warnings about the judge
# are built from this one table.
JUDGE_READERS: tuple[tuple[str, Callable[[Config], bool]], ...] = (
    (DYNAMIC_SAMPLING, lambda cfg: cfg.algo.dynamic_sampling),
    ("data.curriculum=frontier", lambda cfg: cfg.data.curriculum == "frontier"),
    ("algo.error_correction", lambda cfg: cfg.algo.error_correction != "off"),
)


def judge_readers(cfg: Config, besides: tuple[str, ...] = ()) -> list[str]:
    """The features of ``cfg`` that read reward.judge (JUDGE_READERS' names; none: it would be read by nothing), but
    those named in ``besides`` (e.g. (DYNAMIC_SAMPLING,))."""
    return [name for name, on in JUDGE_READERS if on(cfg) and name not in besides]


def spoken(names: list[str], conjunction: str = "or") -> str:
    """Names as a sentence lists them: "a", "a or b", "a, b or c" (``conjunction`` "and": "a, b and c")."""
    return f" {conjunction} ".join([", ".join(names[:-1]), names[-1]] if len(names) > 1 else names)


def respelled_judge(cfg: Config) -> str | None:
    """The warning for a judge given in its old spelling, algo.dynamic_sampling_on (an earlier run's config.yaml, an
    old config file), that now reaches readers it did not reach before: earlier versions read it for dynamic
    sampling alone and judged the frontier curriculum and error correction by the reward as trained. None when
    nothing changed (the new spelling, an empty judge, or dynamic sampling its only reader). One judge serves every
    reader, so no setting keeps the old behaviour; the warning says so."""
    from .retired import spelled_as

    old = spelled_as(cfg, "reward.judge")
    readers = judge_readers(cfg, besides=(DYNAMIC_SAMPLING,))
    if old is None or not cfg.reward.judge or not readers:
        return None
    judge, one = cfg.reward.judge, len(readers) == 1
    return (
        f"{old}={judge} (the spelling of earlier versions) sets reward.judge, which {spoken(readers, 'and')} "
        f"read{'s' if one else ''} too: {'it' if one else 'they'} now judge{'s' if one else ''} a completion by "
        f"{judge}, where earlier versions judged {'it' if one else 'them'} by the reward as trained and read {old} "
        "for dynamic sampling alone; no setting keeps that split (one judge serves every reader), so keep it, or set "
        "reward.judge=[] to judge by the reward as trained everywhere, dynamic sampling included"
    )
