"""An unreachable Hugging Face Hub fails fast with a sentence that says so, and a model id in the local
cache loads from its cached snapshot folder at once, said in one line.

The endpoint is a closed port on 127.0.0.1 (nothing listens: the connection is refused at once), the
cache an empty temporary folder or one holding a small model in huggingface_hub's snapshot layout, so
nothing here touches the network."""

import shutil
import socket

import pytest
import torch

from grpokit.config.sections import ConfigError, ModelConfig
from grpokit.train import hub
from grpokit.train.models import load_tokenizer

_real_cached = hub._cached  # the fixture replaces it by an empty cache


@pytest.fixture
def closed_endpoint(monkeypatch, tmp_path):
    with socket.socket() as s:  # a port that was free a moment ago and has no listener now
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{port}")
    for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", *hub._PROXIES):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(hub, "_cached", lambda repo_id: None)  # an empty cache, whatever this machine holds
    hub._unreachable.cache_clear()  # each test's endpoint probed afresh
    hub._say_offline.cache_clear()
    yield port
    hub._unreachable.cache_clear()
    hub._say_offline.cache_clear()


def test_unreachable_hub_is_one_sentence_naming_the_hub(closed_endpoint):
    with pytest.raises(ConfigError) as e:
        load_tokenizer(ModelConfig(name_or_path="grpokit-test-org/no-such-model"))
    msg = str(e.value)
    assert f"Hub at http://127.0.0.1:{closed_endpoint} could not be reached (ConnectionRefusedError)" in msg
    assert "'grpokit-test-org/no-such-model'" in msg and "does not appear" not in msg and msg.count(". ") == 0


def test_the_trl_layer_fails_the_same_way(closed_endpoint):
    from datasets import Dataset

    from grpokit.trl import GRPOConfig, GRPOTrainer

    with pytest.raises(ConfigError, match="could not be reached"):
        GRPOTrainer(
            "grpokit-test-org/no-such-model",
            reward_funcs=lambda completions, **kw: [0.0] * len(completions),
            train_dataset=Dataset.from_list([{"prompt": "1+1="}] * 4),
            args=GRPOConfig("unused", use_cpu=True, num_generations=2, per_device_train_batch_size=2, report_to="none"),
        )


def test_local_folders_and_offline_mode_are_not_probed(closed_endpoint, tmp_path, monkeypatch):
    assert hub.check_reachable(str(tmp_path)) == str(tmp_path)  # an existing folder: no connection tried
    hub.check_reachable("./not/a/hub/id/at/all")  # not an id: transformers reports the missing path itself
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    hub.check_reachable("org/any-model")  # offline: huggingface_hub answers from the cache or says it is offline
    monkeypatch.delenv("HF_HUB_OFFLINE")
    with pytest.raises(ConfigError):  # and the probe does run when none of those hold
        hub.check_reachable("org/any-model")


def _cache_with(tmp_path, repo_id: str):
    """A Hugging Face cache folder holding ``repo_id`` as huggingface_hub lays it out: the files under
    snapshots/<commit>, refs/main naming that commit."""
    from helpers.trl_models import make_chat_model

    source = make_chat_model(tmp_path / "source")
    commit = "0123456789abcdef0123456789abcdef01234567"
    repo = tmp_path / "hub" / f"models--{repo_id.replace('/', '--')}"
    snapshot = repo / "snapshots" / commit
    shutil.copytree(source, snapshot)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    return tmp_path / "hub", snapshot


def test_a_cached_id_loads_offline_from_its_snapshot_when_the_hub_is_unreachable(
    closed_endpoint, tmp_path, monkeypatch, capsys
):
    """Before: a cached id skipped the probe, and transformers asked the unreachable Hub for each file
    (about 8 minutes of retries with no network). Now the probe runs, fails at once on the closed port,
    and every loader gets the snapshot folder: nothing is asked of the Hub."""
    from huggingface_hub import constants

    from grpokit.train.models import load_model, model_path

    cache, snapshot = _cache_with(tmp_path, "grpokit-test-org/tiny")
    monkeypatch.setattr(hub, "_cached", _real_cached)  # the real lookup, in the cache below
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    cfg = ModelConfig(name_or_path="grpokit-test-org/tiny")
    assert model_path(cfg.name_or_path) == str(snapshot)
    tok = load_tokenizer(cfg)
    model = load_model(cfg, torch.device("cpu"), torch.float32)
    assert tok("ab")["input_ids"] and model.config.vocab_size > 0
    err = capsys.readouterr().err.splitlines()
    said = [line for line in err if "offline from the local cache" in line]
    # one line for the id, however many loaders resolved it (tokenizer, model, and model_path above)
    assert said == [
        f"grpokit: the Hugging Face Hub at http://127.0.0.1:{closed_endpoint} could not be reached "
        f"(ConnectionRefusedError); loading 'grpokit-test-org/tiny' offline from the local cache ({snapshot})"
    ]


def test_a_cached_id_is_loaded_by_name_when_the_hub_answers(closed_endpoint, tmp_path, monkeypatch):
    """A reachable endpoint (a listening socket on 127.0.0.1): the id goes to transformers as it is, which
    then checks the Hub for a newer revision, as before."""
    from huggingface_hub import constants

    cache, _ = _cache_with(tmp_path, "grpokit-test-org/tiny")
    monkeypatch.setattr(hub, "_cached", _real_cached)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{listener.getsockname()[1]}")
        assert hub.check_reachable("grpokit-test-org/tiny") == "grpokit-test-org/tiny"


def test_a_trl_reward_model_by_cached_id_loads_offline_too(closed_endpoint, tmp_path, monkeypatch):
    """The same for a reward model named by hub id in grpokit.trl's reward_funcs; its name stays the id's."""
    from huggingface_hub import constants

    from grpokit.trl.reward_model import RewardModel

    cache, _ = _cache_with(tmp_path, "grpokit-test-org/rm")
    monkeypatch.setattr(hub, "_cached", _real_cached)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    rm = RewardModel("grpokit-test-org/rm")
    assert rm.__name__ == "rm" and len(rm(["ab"], ["cd"])) == 1
    with pytest.raises(ConfigError, match=r"^reward_funcs entry='grpokit-test-org/other' is not a local folder"):
        RewardModel("grpokit-test-org/other")
