"""rollout.backend=vllm_server without vLLM: the trainer's client against a fake server that serves
exactly the endpoints stock vLLM serves (tests/helpers/fake_vllm.py), the worker extension on a fake vLLM
worker holding a tiny torch model, and `grpokit vllm-serve` on a machine without vLLM."""

import pytest
import torch

from grpokit import cli
from grpokit.config import ConfigError
from grpokit.rollout import vllm_serve
from grpokit.rollout.hf import SamplingParams
from grpokit.rollout.vllm_client import VLLMServer
from grpokit.rollout.vllm_worker import EXTENSION, PROTOCOL, WeightSyncExtension
from helpers.fake_vllm import FakeVLLMServer, make_worker_class
from helpers.models import tiny_llama
from helpers.runs import make


def same_weights(a, b) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


def client(srv, tmp_path, **kw) -> VLLMServer:
    kw.setdefault("startup_timeout", 5.0)
    return VLLMServer(srv.url, SamplingParams(max_new_tokens=4), tmp_path / "sync", **kw)


# ---------------------------------------------------------------- the code that runs inside vLLM


def test_worker_extension_loads_a_safetensors_folder_into_the_live_model(tmp_path):
    from safetensors.torch import save_file

    worker = make_worker_class(WeightSyncExtension)(tiny_llama(seed=1), 0, "processed_logprobs")
    policy = tiny_llama(seed=2)
    assert not same_weights(worker.model_runner.model.hf, policy)
    sd = policy.state_dict()
    save_file({k: v.contiguous() for k, v in sd.items()}, str(tmp_path / "model.safetensors"))
    out = worker.grpokit_load_weights(str(tmp_path))
    assert same_weights(worker.model_runner.model.hf, policy)
    # every tensor of the file, float32 = 4 bytes per element
    assert out == {"tensors": len(sd), "bytes": sum(v.numel() * 4 for v in sd.values()), "rank": 0}
    assert worker.grpokit_info() == {
        "extension": "grpokit",
        "protocol": PROTOCOL,
        "logprobs_mode": "processed_logprobs",
        "dtype": "float32",
        "rank": 0,
        "lora": None,  # started without --enable-lora
    }
    with pytest.raises(FileNotFoundError, match="no \\*.safetensors file in"):
        worker.grpokit_load_weights(str(tmp_path / "missing"))


def test_extension_names_cannot_clash_with_vllm_worker_attributes():
    # vLLM refuses an extension attribute the worker already has (worker_base.py), so ours are namespaced
    names = [a for a in dir(WeightSyncExtension) if not a.startswith("__")]
    assert names == ["grpokit_info", "grpokit_load_weights"]
    assert EXTENSION == f"{WeightSyncExtension.__module__}.{WeightSyncExtension.__qualname__}"


# ---------------------------------------------------------------- the trainer's client


@pytest.mark.parametrize("flavor", ["0.33.0", "0.10.2"])
def test_client_connects_samples_and_syncs_against_the_fake(tmp_path, flavor):
    server_model, policy = tiny_llama(seed=1), tiny_llama(seed=2)
    with FakeVLLMServer(server_model, workers=2, busy_prefix_cache=1, flavor=flavor) as srv:
        eng = client(srv, tmp_path)
        assert eng.model_name == "tiny" and eng.dtype == torch.float32
        ro = eng.generate([[3, 4], [5]], 2)
        # the fake's samples, choice by choice (index i*G + g = sample g of prompt i)
        assert ro.prompt_ids == [[3, 4], [5]] and ro.group_size == 2
        assert ro.completion_ids == [ids for ids, _, _ in srv.sampled]
        assert ro.sampling_logprobs == [lps for _, lps, _ in srv.sampled]
        assert ro.finish_reasons == [{"stop": "eos", "length": "length"}[r] for _, _, r in srv.sampled]
        body = next(b for _, p, b in srv.calls if p == "/v1/completions")
        assert body["prompt"] == [[3, 4], [5]] and body["n"] == 2 and body["logprobs"] == 0
        assert body["return_tokens_as_token_ids"] is True and body["model"] == "tiny"
        assert body["top_k"] == 0 and body["repetition_penalty"] == 1.0  # every sampling field is explicit

        m = eng.after_update(policy, 7)
        assert same_weights(server_model, policy) and same_weights(srv.workers[1].model_runner.model.hf, policy)
        assert m["rollout/weight_sync_step"] == 7.0 and m["time/weight_sync"] > 0
        paths = [p for _, p, _ in srv.calls]
        # one readiness check, the model list, the extension check, a sample, a load, then the cache reset:
        # 0.33 answers {"success": false} while blocks are held (the fake once), so it is asked again
        assert paths == [
            "/health",
            "/v1/models",
            "/collective_rpc",
            "/v1/completions",
            "/collective_rpc",
            "/reset_prefix_cache",
        ] + ["/reset_prefix_cache"] * (flavor == "0.33.0")
        load = srv.calls[4][2]
        assert load["method"] == "grpokit_load_weights" and load["args"] == [
            str((tmp_path / "sync" / "step-000007").resolve())
        ]
        eng.after_update(policy, 8)
        assert [d.name for d in (tmp_path / "sync").iterdir()] == ["step-000008"]  # the previous folder is removed


def test_tied_embeddings_are_written_once(tmp_path):
    from safetensors import safe_open
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(
        vocab_size=32,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        tie_word_embeddings=True,
        eos_token_id=2,
    )
    torch.manual_seed(0)
    server_model = LlamaForCausalLM(cfg)
    torch.manual_seed(1)
    policy = LlamaForCausalLM(cfg)
    with FakeVLLMServer(server_model) as srv:
        eng = client(srv, tmp_path)
        eng.after_update(policy, 1)
        with safe_open(str(tmp_path / "sync" / "step-000001" / "model.safetensors"), "pt") as fh:
            names = set(fh.keys())
        assert "model.embed_tokens.weight" in names and "lm_head.weight" not in names
        assert same_weights(server_model, policy)


@pytest.mark.parametrize("field", ["rollout.vllm_startup_timeout", "rollout.vllm_request_timeout"])
def test_timeouts_must_be_positive(tiny_model_dir, tmp_path, field):
    with pytest.raises(ConfigError, match=f"{field}=0.0 must be > 0 seconds"):
        make(tiny_model_dir, tmp_path / "run", **{"rollout.backend": "vllm_server", field: 0})


def test_waits_for_a_server_that_is_still_starting(tmp_path):
    with FakeVLLMServer(tiny_llama(), start_delay=0.5) as srv:
        eng = client(srv, tmp_path)  # polls /health until the server listens
        assert eng.model_name == "tiny"


def test_unreachable_server_is_one_sentence_naming_vllm_url(tmp_path):
    srv = FakeVLLMServer(tiny_llama())  # never started: nothing listens on its port
    with pytest.raises(
        ConfigError, match=r"rollout.vllm_url: no vLLM server became ready at http://127.0.0.1:\d+ within 0.3 s"
    ):
        client(srv, tmp_path, startup_timeout=0.3)


@pytest.mark.parametrize(
    "kw, message",
    [
        ({"dev_mode": False}, "has no /collective_rpc endpoint .*VLLM_SERVER_DEV_MODE=1.*grpokit vllm-serve"),
        (
            {"extension": False},
            "lacks grpokit's worker extension grpokit.rollout.vllm_worker.WeightSyncExtension "
            r"\(HTTP 500: .*Method 'grpokit_info' is not implemented.*grpokit vllm-serve",
        ),
        (
            {"extension": False, "flavor": "0.10.2"},
            "lacks grpokit's worker extension grpokit.rollout.vllm_worker."
            r"WeightSyncExtension \(HTTP 500: Internal Server Error\)",
        ),
        ({"logprobs_mode": "raw_logprobs"}, "returns 'raw_logprobs' logprobs.*--logprobs-mode processed_logprobs"),
    ],
)
def test_a_server_grpokit_cannot_drive_is_refused_at_start(tmp_path, kw, message):
    with FakeVLLMServer(tiny_llama(), **kw) as srv:
        with pytest.raises(ConfigError, match=message):
            client(srv, tmp_path)


def test_a_server_that_cannot_read_the_sync_folder_stops_the_run_clearly(tmp_path):
    with FakeVLLMServer(tiny_llama()) as srv:
        worker = srv.workers[0]  # as if the server saw another filesystem: the folder is not there
        worker.grpokit_load_weights = lambda folder: WeightSyncExtension.grpokit_load_weights(
            worker, folder + "-elsewhere"
        )
        eng = client(srv, tmp_path)
        with pytest.raises(
            RuntimeError,
            match=r"failed grpokit_load_weights \(HTTP 500: .*no \*.safetensors file in .*"
            r"-elsewhere.*\); the server must read rollout.vllm_sync_dir",
        ):
            eng.after_update(tiny_llama(seed=3), 1)


def test_sampling_timeout_and_server_errors_are_clear(tmp_path):
    with FakeVLLMServer(tiny_llama(), completion_delay=1.0) as srv:
        eng = client(srv, tmp_path, request_timeout=0.2)
        with pytest.raises(RuntimeError, match="failed to sample .*timed out"):
            eng.generate([[3]], 2)
    with FakeVLLMServer(tiny_llama()) as srv:
        eng = client(srv, tmp_path)
        eng.model_name = "other"
        with pytest.raises(RuntimeError, match=r"failed to sample \(HTTP 404: The model `other` does not exist"):
            eng.generate([[3]], 2)


def test_training_steps_against_the_fake_server_sample_from_the_synced_weights(tiny_model_dir, tmp_path):
    from transformers import AutoConfig, LlamaForCausalLM

    torch.manual_seed(123)
    server_model = LlamaForCausalLM(AutoConfig.from_pretrained(tiny_model_dir))  # not the trainer's weights
    with FakeVLLMServer(server_model, workers=2) as srv:
        tr = make(
            tiny_model_dir,
            tmp_path / "run",
            **{
                "rollout.backend": "vllm_server",
                "rollout.vllm_url": srv.url,
                "rollout.tis_cap": 2.0,
                "rollout.vllm_startup_timeout": 5,
            },
        )
        assert same_weights(server_model, tr.model)  # pushed once at start
        for _ in range(2):
            before = {k: v.clone() for k, v in tr.model.state_dict().items()}
            m = tr.train_step()
            tr.step += 1
            # the fake sampled with exactly the trainer's weights, so its logprobs are the trainer's
            # up to float32 rounding; without the sync they differ by ~0.1 (the next test)
            assert m["tis/logp_abs_diff_mean"] < 1e-4
            assert not all(torch.equal(before[k], v) for k, v in tr.model.state_dict().items())  # it trained
            assert same_weights(server_model, tr.model) and same_weights(srv.workers[1].model_runner.model.hf, tr.model)
        rpc = [b["method"] for _, p, b in srv.calls if p == "/collective_rpc"]
        assert rpc == ["grpokit_info"] + ["grpokit_load_weights"] * 3
        assert [d.name for d in (tmp_path / "run" / "vllm-weights").iterdir()] == ["step-000002"]


def test_without_the_sync_the_fake_samples_from_other_weights(tiny_model_dir, tmp_path):
    # the control for the test above: the same run, the fake's loads dropped, gives a large difference
    from transformers import AutoConfig, LlamaForCausalLM

    torch.manual_seed(123)
    server_model = LlamaForCausalLM(AutoConfig.from_pretrained(tiny_model_dir))
    with FakeVLLMServer(server_model) as srv:
        srv.workers[0].model_runner.model.load_weights = lambda weights: [None for _ in weights]
        tr = make(
            tiny_model_dir,
            tmp_path / "run",
            **{
                "rollout.backend": "vllm_server",
                "rollout.vllm_url": srv.url,
                "rollout.tis_cap": 2.0,
                "rollout.vllm_startup_timeout": 5,
            },
        )
        assert tr.train_step()["tis/logp_abs_diff_mean"] > 0.05


def _rank(rank, world, init_file, model_dir, out, url, result_file, fsdp=False):
    import torch.distributed as dist

    from grpokit.rollout.vllm_client import full_weights

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        tr = make(
            model_dir,
            out,
            **{
                "rollout.backend": "vllm_server",
                "rollout.vllm_url": url,
                "rollout.tis_cap": 2.0,
                "train.prompts_per_step": 4,
                "data.eval_size": 0,
                "rollout.vllm_startup_timeout": 30,
                "train.fsdp": fsdp,
            },
        )
        metrics = []
        for _ in range(2):
            metrics.append(tr.train_step())
            tr.step += 1
        weights = full_weights(tr.model) if fsdp else tr.model.state_dict()  # FSDP2: a collective, every rank
        if rank == 0:
            torch.save({"weights": weights, "metrics": metrics}, result_file)
        tr.engine.close()
        tr.runner.close()
        dist.barrier()  # neither rank tears gloo down while the other still uses it (a rank once aborted at exit)
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
@pytest.mark.parametrize("fsdp", [False, True])
def test_two_trainer_ranks_share_one_server_and_sync_once_per_step(tiny_model_dir, tmp_path, fsdp):
    import torch.multiprocessing as mp
    from transformers import AutoConfig, LlamaForCausalLM

    torch.manual_seed(123)
    server_model = LlamaForCausalLM(AutoConfig.from_pretrained(tiny_model_dir))
    with FakeVLLMServer(server_model) as srv:
        mp.spawn(
            _rank,
            args=(
                2,
                str(tmp_path / "init"),
                str(tiny_model_dir),
                str(tmp_path / "run"),
                srv.url,
                str(tmp_path / "rank0.pt"),
                fsdp,
            ),
            nprocs=2,
            join=True,
        )
    result = torch.load(tmp_path / "rank0.pt")
    # the server holds the trained policy (FSDP2: gathered from both ranks' shards; untied head)
    assert set(result["weights"]) == set(server_model.state_dict())
    assert all(torch.equal(v, result["weights"][k]) for k, v in server_model.state_dict().items())
    for m in result["metrics"]:  # averaged over both ranks: each sampled from the synced weights
        assert m["tis/logp_abs_diff_mean"] < 1e-4
    # rank 0 alone loads; the barrier keeps both ranks' sampling after the server holds the new weights
    events = [
        "load" if b and b.get("method") == "grpokit_load_weights" else p
        for _, p, b in srv.calls
        if p in ("/v1/completions", "/reset_prefix_cache") or (b or {}).get("method") == "grpokit_load_weights"
    ]
    assert events == ["load", "/reset_prefix_cache"] + ["/v1/completions"] * 2 + ["load", "/reset_prefix_cache"] + [
        "/v1/completions"
    ] * 2 + ["load", "/reset_prefix_cache"]


# ---------------------------------------------------------------- grpokit vllm-serve


def test_vllm_serve_help_works_without_vllm(capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(["vllm-serve", "--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    assert "grpokit vllm-serve [--dry-run] [--lora-rank R] MODEL" in out and "pip install 'grpokit[vllm]'" in out


def test_vllm_serve_without_vllm_says_how_to_install(monkeypatch, capsys):
    monkeypatch.setattr(vllm_serve, "installed_vllm", lambda: None)
    assert cli.main(["vllm-serve", "Qwen/Qwen2.5-0.5B-Instruct", "--port", "8000"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (
        "grpokit: error: grpokit vllm-serve needs vLLM, which is not installed in this environment: "
        "pip install 'grpokit[vllm]' (vllm>=0.10.2,<0.34; vLLM serves on a CUDA GPU)"
    )


def test_vllm_serve_runs_stock_vllm_serve_with_what_the_trainer_needs(monkeypatch, capsys):
    ran = {}
    monkeypatch.setattr(vllm_serve, "installed_vllm", lambda: "0.33.0")
    monkeypatch.setattr(vllm_serve.os, "execve", lambda path, argv, env: ran.update(path=path, argv=argv, env=env))
    monkeypatch.setattr(vllm_serve.sys, "executable", "/venv/bin/python")
    assert cli.main(["vllm-serve", "M", "--port", "8001", "--dry-run", "-tp", "2"]) == 0
    # everything after MODEL is vLLM's, --dry-run included; grpokit's options go before MODEL
    assert ran["argv"] == [
        "/venv/bin/python",
        "-m",
        "vllm.entrypoints.cli.main",
        "serve",
        "M",
        "--port",
        "8001",
        "--dry-run",
        "-tp",
        "2",
        "--worker-extension-cls",
        EXTENSION,
        "--logprobs-mode",
        "processed_logprobs",
        "--enable-scale-out",
    ]  # 0.33 >= 0.30: image prompts' endpoints
    assert ran["path"] == "/venv/bin/python" and ran["env"]["VLLM_SERVER_DEV_MODE"] == "1"
    err = capsys.readouterr().err  # 0.33.0 is in the checked range: no warning, only the command it runs
    assert err == f"grpokit vllm-serve: running VLLM_SERVER_DEV_MODE=1 {' '.join(ran['argv'])}\n"
    cmd, _ = vllm_serve.build_command("M", ["--logprobs-mode=raw_logprobs"])
    assert cmd.count("--logprobs-mode=raw_logprobs") == 1 and "processed_logprobs" not in cmd  # the user's choice stays
    with pytest.raises(ConfigError, match="sets --worker-extension-cls"):
        vllm_serve.build_command("M", ["--worker-extension-cls", "x.Y"])


def test_vllm_versions_outside_the_checked_range_get_a_warning():
    assert vllm_serve.version_note("0.10.2") is None and vllm_serve.version_note("0.33.0") is None
    assert "0.10.1 is outside the checked range >=0.10.2,<0.34" in vllm_serve.version_note("0.10.1")
    assert "outside" in vllm_serve.version_note("0.34.0")


def test_vllm_serve_dry_run_prints_the_command(capsys):
    assert cli.main(["vllm-serve", "--dry-run", "M", "--port", "8001"]) == 0
    out = capsys.readouterr().out
    assert (
        out.startswith("VLLM_SERVER_DEV_MODE=1 ") and f"serve M --port 8001 --worker-extension-cls {EXTENSION}" in out
    )


def test_fsdp_with_lora_on_the_server_backend_is_one_sentence(tmp_path):
    from grpokit.config import Config
    from grpokit.rollout.vllm_client import make_server_engine
    from grpokit.train.distributed import DistContext

    # refused before any connection (the URL is never called)
    with pytest.raises(ConfigError, match="model.lora_rank > 0"):
        make_server_engine(Config().rollout, SamplingParams(), tmp_path, DistContext(fsdp=True), lora=True)
