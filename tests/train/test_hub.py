"""An unreachable Hugging Face Hub fails fast with a sentence that says so.

The endpoint is a closed port on 127.0.0.1 (nothing listens: the connection is refused at once), the
cache an empty temporary folder, so nothing here touches the network."""

import socket

import pytest

from grpokit.config.sections import ConfigError, ModelConfig
from grpokit.train import hub
from grpokit.train.models import load_tokenizer


@pytest.fixture
def closed_endpoint(monkeypatch, tmp_path):
    with socket.socket() as s:  # a port that was free a moment ago and has no listener now
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{port}")
    for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", *hub._PROXIES):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(hub, "_cached", lambda repo_id: False)  # an empty cache, whatever this machine holds
    return port


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


def test_local_folders_offline_mode_and_cached_ids_are_not_probed(closed_endpoint, tmp_path, monkeypatch):
    hub.check_reachable(str(tmp_path))  # an existing folder: no connection tried
    hub.check_reachable("./not/a/hub/id/at/all")  # not an id: transformers reports the missing path itself
    monkeypatch.setattr(hub, "_cached", lambda repo_id: True)
    hub.check_reachable("org/cached-model")
    monkeypatch.setattr(hub, "_cached", lambda repo_id: False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    hub.check_reachable("org/any-model")  # offline: huggingface_hub answers from the cache or says it is offline
    monkeypatch.delenv("HF_HUB_OFFLINE")
    with pytest.raises(ConfigError):  # and the probe does run when none of those hold
        hub.check_reachable("org/any-model")
