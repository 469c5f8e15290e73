"""LoRA adapter-only sync to a vLLM server (rollout/vllm_lora.py), against the fake server on loopback whose
runtime-LoRA endpoints follow vLLM's (tests/helpers/fake_vllm_lora.py): the adapter files are PEFT's own,
the server samples with base + adapter, each step moves the adapter alone, and a server that cannot take
adapters is refused in one sentence."""

import json

import pytest
import torch

from grpokit import cli
from grpokit.config import ConfigError
from grpokit.rollout import vllm_serve
from grpokit.rollout.hf import SamplingParams
from grpokit.rollout.vllm_client import VLLMServer
from grpokit.rollout.vllm_http import HTTPAnswer
from grpokit.rollout.vllm_lora import lora_call, serve_rank, write_adapter
from helpers.fake_vllm import FakeVLLMServer
from helpers.models import perturb_lora_b, tiny_llama
from helpers.runs import make

FLAG = "VLLM_ALLOW_RUNTIME_LORA_UPDATING"


def lora_policy(seed=2, r=4):
    """A tiny Llama with LoRA adapters as train/lora.py adds them, B not zero (a fresh adapter changes nothing)."""
    from peft import LoraConfig, get_peft_model

    pm = get_peft_model(
        tiny_llama(seed=seed), LoraConfig(r=r, lora_alpha=8, target_modules="all-linear", task_type="CAUSAL_LM")
    )
    return perturb_lora_b(pm, seed)


def client(srv, tmp_path, **kw) -> VLLMServer:
    return VLLMServer(srv.url, SamplingParams(max_new_tokens=4), tmp_path / "sync", startup_timeout=5.0, **kw)


def policy_logprobs(model, prompt, completion):
    """log pi(completion | prompt) token by token under ``model`` (temperature 1)."""
    ids = torch.tensor([prompt + completion])
    with torch.no_grad():
        logp = torch.log_softmax(model(input_ids=ids).logits[0].float(), -1)
    return [float(logp[len(prompt) - 1 + i, t]) for i, t in enumerate(completion)]


@pytest.mark.parametrize("dtype", [None, torch.bfloat16])
def test_the_adapter_written_is_exactly_what_peft_saves(tmp_path, dtype):
    from safetensors import safe_open

    pm = lora_policy()
    folder, nbytes = write_adapter(pm, "default", tmp_path / "ours", dtype)
    pm.save_pretrained(tmp_path / "peft")
    assert folder == tmp_path / "ours" / "adapter" and not (tmp_path / "ours" / "adapter.partial").exists()
    ours, theirs = folder / "adapter_model.safetensors", tmp_path / "peft" / "adapter_model.safetensors"
    with safe_open(str(ours), "pt") as a, safe_open(str(theirs), "pt") as b:
        assert a.metadata() == b.metadata() == {"format": "pt"}
        assert sorted(a.keys()) == sorted(b.keys())
        # names as PEFT writes them (vLLM parses these): base_model.model.<module>.lora_A.weight, no adapter name
        assert all(k.startswith("base_model.model.model.layers.") and ".default." not in k for k in a.keys())
        for k in a.keys():
            want = b.get_tensor(k) if dtype is None else b.get_tensor(k).to(dtype)
            assert torch.equal(a.get_tensor(k), want) and a.get_tensor(k).dtype == want.dtype
    # 2 layers x 7 linears x (A: r x in, B: out x r), 4 bytes a float32 element (2 for bfloat16)
    assert nbytes == sum(p.numel() for n, p in pm.named_parameters() if "lora_" in n) * (4 if dtype is None else 2)
    ours_cfg = json.loads((folder / "adapter_config.json").read_text())
    peft_cfg = json.loads((tmp_path / "peft" / "adapter_config.json").read_text())
    # target_modules is a set inside peft: its order in the file is arbitrary
    assert set(ours_cfg.pop("target_modules")) == set(peft_cfg.pop("target_modules"))
    assert ours_cfg == peft_cfg and ours_cfg["inference_mode"] is True and ours_cfg["r"] == 4


def test_only_the_adapter_travels_after_the_base_and_the_server_samples_base_plus_adapter(tmp_path, monkeypatch):
    monkeypatch.setenv(FLAG, "True")
    server_model, policy = tiny_llama(seed=1), lora_policy(seed=2)  # the server starts from other weights
    with FakeVLLMServer(server_model, max_lora_rank=8, busy_prefix_cache=1) as srv:
        eng = client(srv, tmp_path, lora=True)
        first = eng.after_update(policy, 0)
        # the base went once, unmerged: the server's weights are the policy's base, not base + adapter
        base = policy.get_base_model().state_dict()
        plain = {k.replace(".base_layer", ""): v for k, v in base.items() if "lora_" not in k}
        assert all(torch.equal(v, plain[k]) for k, v in server_model.state_dict().items())
        name0 = eng.adapter
        assert name0.startswith("grpokit-") and name0.endswith("-step-000000")
        ro = eng.generate([[3, 4], [5]], 2)
        body = [b for _, p, b in srv.calls if p == "/v1/completions"][-1]
        assert body["model"] == name0  # the request names the adapter
        # the fake sampled with base + adapter: its logprobs are the policy's, up to float32 rounding
        for k, (comp, lps) in enumerate(zip(ro.completion_ids, ro.sampling_logprobs)):
            want = policy_logprobs(policy, ro.prompt_ids[k // 2], comp)
            assert max(abs(a - b) for a, b in zip(lps, want)) < 1e-5

        with torch.no_grad():  # an update moves the adapters only
            for n, p in policy.named_parameters():
                if "lora_A" in n:
                    p.add_(0.1)
        srv.calls.clear()
        second = eng.after_update(policy, 1)
        paths = [(p, (b or {}).get("lora_name")) for _, p, b in srv.calls]
        # no full weights: unload the previous adapter, load the new one, reset the prefix cache
        assert paths == [
            ("/v1/unload_lora_adapter", name0),
            ("/v1/load_lora_adapter", eng.adapter),
            ("/reset_prefix_cache", None),
        ]
        assert [c["id"] for c in srv.models(None)[1]["data"]] == ["tiny", eng.adapter]
        assert [d.name for d in (tmp_path / "sync").iterdir()] == ["step-000001"]
        assert sorted(f.name for f in (tmp_path / "sync" / "step-000001" / "adapter").iterdir()) == [
            "adapter_config.json",
            "adapter_model.safetensors",
        ]
        ro = eng.generate([[6]], 2)
        for comp, lps in zip(ro.completion_ids, ro.sampling_logprobs):
            assert max(abs(a - b) for a, b in zip(lps, policy_logprobs(policy, [6], comp))) < 1e-5
    lora_bytes = sum(p.numel() * 4 for n, p in policy.named_parameters() if "lora_" in n)
    assert second["rollout/weight_sync_bytes"] == lora_bytes
    assert first["rollout/weight_sync_bytes"] == lora_bytes + sum(v.numel() * 4 for v in plain.values())
    assert second["rollout/weight_sync_bytes"] < first["rollout/weight_sync_bytes"] / 5


def test_a_lora_run_against_the_fake_samples_from_the_synced_adapters(tiny_model_dir, tmp_path, monkeypatch):
    from transformers import AutoConfig, LlamaForCausalLM

    monkeypatch.setenv(FLAG, "1")
    torch.manual_seed(123)
    server_model = LlamaForCausalLM(AutoConfig.from_pretrained(tiny_model_dir))
    with FakeVLLMServer(server_model, max_lora_rank=16) as srv:
        tr = make(
            tiny_model_dir,
            tmp_path / "run",
            **{
                "rollout.backend": "vllm_server",
                "rollout.vllm_url": srv.url,
                "rollout.vllm_startup_timeout": 5,
                "model.lora_rank": 4,
                "optim.lr": 5e-2,
            },
        )
        sizes = []
        for _ in range(2):
            m = tr.train_step()
            tr.step += 1
            assert m["tis/logp_abs_diff_mean"] < 1e-4  # sampled with base + the trainer's adapters
            sizes.append(m["rollout/weight_sync_bytes"])
        rpc = [b["method"] for _, p, b in srv.calls if p == "/collective_rpc"]
        assert rpc == ["grpokit_info", "grpokit_load_weights"]  # the full weights once, at start
        loads = [b["lora_name"] for _, p, b in srv.calls if p == "/v1/load_lora_adapter"]
        assert len(loads) == 3 and len(set(loads)) == 3  # start + two updates, each under a new name
        adapters = sum(p.numel() * 4 for n, p in tr.model.named_parameters() if "lora_" in n)
        assert sizes == [adapters, adapters]


@pytest.mark.parametrize(
    "env, rank, message",
    [
        ("True", None, r"was not started with LoRA enabled, which model.lora_rank > 0 needs .*--lora-rank R MODEL"),
        (None, 8, r"does not allow runtime LoRA loading \(VLLM_ALLOW_RUNTIME_LORA_UPDATING is not set\)"),
    ],
)
def test_a_server_without_lora_is_refused_in_one_sentence(tmp_path, monkeypatch, env, rank, message):
    if env is None:
        monkeypatch.delenv(FLAG, raising=False)
    else:
        monkeypatch.setenv(FLAG, env)
    with FakeVLLMServer(tiny_llama(), max_lora_rank=rank) as srv:
        with pytest.raises(ConfigError, match=message) as e:
            client(srv, tmp_path, lora=True)
        assert "\n" not in str(e.value)
        client(srv, tmp_path)  # full-weight sync needs neither


def test_an_adapter_rank_above_the_servers_is_refused(tmp_path, monkeypatch):
    monkeypatch.setenv(FLAG, "true")
    with FakeVLLMServer(tiny_llama(), max_lora_rank=8) as srv:
        eng = client(srv, tmp_path, lora=True)
        with pytest.raises(ConfigError, match=r"model.lora_rank=16 is above the vLLM server's --max-lora-rank 8 at"):
            eng.after_update(lora_policy(r=16), 0)


def test_adapter_load_faults_are_one_sentence(tmp_path, monkeypatch):
    monkeypatch.setenv(FLAG, "True")
    with FakeVLLMServer(tiny_llama(), max_lora_rank=8) as srv:
        eng = client(srv, tmp_path, lora=True)
        real = srv.lora.add
        srv.lora.add = lambda i, n, path: real(i, n, path + "-elsewhere")  # as if the server saw another filesystem
        with pytest.raises(
            RuntimeError,
            match=r"failed /v1/load_lora_adapter for grpokit-.*-step-000003 \(HTTP 404: Loading lora .* failed: "
            r"No adapter found for .*\); the server must read rollout.vllm_sync_dir",
        ):
            eng.after_update(lora_policy(), 3)
    dead = lambda *a: HTTPAnswer(0, {}, "timed out: no complete reply within 5 s")  # noqa: E731
    with pytest.raises(RuntimeError, match=r"stopped answering during /v1/unload_lora_adapter \(timed out"):
        lora_call(dead, "http://h:1", "/v1/unload_lora_adapter", {"lora_name": "x"}, 5.0)
    gone = lambda *a: HTTPAnswer(404, {"detail": "Not Found"}, "")  # noqa: E731 - 0.10.2: the route is absent
    with pytest.raises(ConfigError, match=r"has no /v1/load_lora_adapter endpoint \(runtime LoRA updating is off\)"):
        lora_call(gone, "http://h:1", "/v1/load_lora_adapter", {"lora_name": "x", "lora_path": "/p"}, 5.0)


# ---------------------------------------------------------------- grpokit vllm-serve --lora-rank


def test_vllm_serve_lora_rank_enables_runtime_lora(monkeypatch, capsys):
    ran = {}
    monkeypatch.setattr(vllm_serve, "installed_vllm", lambda: "0.10.2")
    monkeypatch.setattr(vllm_serve, "preflight", lambda model, args: None)
    monkeypatch.setattr(vllm_serve.os, "execve", lambda path, argv, env: ran.update(argv=argv, env=env))
    assert cli.main(["vllm-serve", "--lora-rank", "12", "M", "--port", "8001"]) == 0
    assert ran["argv"][4:7] == ["M", "--port", "8001"]
    assert ran["argv"][-3:] == ["--enable-lora", "--max-lora-rank", "16"]  # 12 -> vLLM's next allowed rank
    assert ran["env"]["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] == "True" and ran["env"]["VLLM_SERVER_DEV_MODE"] == "1"
    assert "running VLLM_SERVER_DEV_MODE=1 VLLM_ALLOW_RUNTIME_LORA_UPDATING=True " in capsys.readouterr().err
    cmd, env = vllm_serve.build_command("M", ["--max-lora-rank=64", "--enable-lora"], lora_rank=8)
    assert cmd.count("--enable-lora") == 1 and "--max-lora-rank" not in cmd  # the user's own choice stays
    cmd, env = vllm_serve.build_command("M", [])
    assert "--enable-lora" not in cmd and env == {"VLLM_SERVER_DEV_MODE": "1"}  # full weights: no LoRA
    assert [serve_rank(r) for r in (1, 2, 8, 9, 300, 512)] == [1, 8, 8, 16, 320, 512]
    with pytest.raises(ConfigError, match="vLLM serves LoRA ranks up to 512"):
        serve_rank(600)


def test_adapter_sync_samples_what_a_merged_full_sync_samples_under_the_same_seed(tmp_path, monkeypatch):
    monkeypatch.setenv(FLAG, "True")
    policy, rollouts = lora_policy(seed=5), []
    for lora in (True, False):  # the same fake seed; adapters applied by the server, or merged by the trainer
        with FakeVLLMServer(tiny_llama(seed=1), max_lora_rank=8, seed=7) as srv:
            eng = client(srv, tmp_path / str(lora), lora=lora)
            eng.after_update(policy, 0)
            rollouts.append(eng.generate([[3, 4], [5], [6, 7, 8]], 4))
    adapter, merged = rollouts
    assert adapter.completion_ids == merged.completion_ids
    for a, b in zip(adapter.sampling_logprobs, merged.sampling_logprobs):
        assert max(abs(x - y) for x, y in zip(a, b)) < 1e-5  # W x + s B A x against (W + s B A) x: rounding
    # the control: the base alone (the policy without its adapters) samples other tokens under the same seed
    with FakeVLLMServer(tiny_llama(seed=1), seed=7) as srv:
        eng = client(srv, tmp_path / "base")
        eng.after_update(tiny_llama(seed=5), 0)
        assert eng.generate([[3, 4], [5], [6, 7, 8]], 4).completion_ids != adapter.completion_ids
