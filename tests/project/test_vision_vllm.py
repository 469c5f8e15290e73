"""Image prompts on the vLLM backends, without vLLM: a fake ``LLM`` records what the colocated engine
passes to ``LLM.generate``; a fake server on 127.0.0.1 records the JSON the server client sends, and
TRL 1.16's own client (trl/generation/vllm_client.py) is run against the same fake as the oracle of
the wire format."""

from __future__ import annotations

import base64
import io
import json
import threading
import types
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import torch

from grpokit.config.sections import ConfigError
from grpokit.data.tasks import shapes
from grpokit.rollout import vllm_images as vi
from grpokit.rollout.hf import SamplingParams
from grpokit.rollout.vllm import VLLMColocated
from grpokit.rollout.vllm_client import VLLMServer
from grpokit.rollout.vllm_http import ServerReplyError
from grpokit.rollout.vllm_worker import PROTOCOL

IMG = 4  # the demo model's <|image_pad|>


def _scene(x: int):
    return shapes.render([("red", "square", x, 2)])


# ---------------------------------------------------------------- in-process LLM.generate


class FakeLLM:
    """Records each ``generate``'s prompts; every prompt gets G completions ``[7 + g, 8]`` at logprob -0.25."""

    def __init__(self):
        self.prompts: list = []

    def generate(self, prompts, sp, use_tqdm=False):
        self.prompts.append(prompts)
        done = lambda g: types.SimpleNamespace(
            index=g,
            token_ids=[7 + g, 8],
            finish_reason="length",
            stop_reason=None,  # noqa: E731
            logprobs=[{7 + g: types.SimpleNamespace(logprob=-0.25)}, {8: types.SimpleNamespace(logprob=-0.25)}],
        )
        return [types.SimpleNamespace(outputs=[done(g) for g in range(sp.n)]) for _ in prompts]

    def sleep(self, level):
        pass


class FakeSP:
    def __init__(self, **kw):
        self.__dict__.update(kw)


def test_colocated_engine_passes_images_as_multi_modal_data():
    llm, a, b = FakeLLM(), _scene(2), _scene(34)
    engine = VLLMColocated(llm, FakeSP, SamplingParams(max_new_tokens=2), sleep=False)
    ro = engine.generate([[3, IMG, IMG, 5, 9], [3, IMG, IMG, 5, 10]], 2, images=[[a], [b]])
    # LLM.generate's prompt form: token ids with the prompt's PIL images beside them, prompt by prompt
    assert llm.prompts[0] == [
        {"prompt_token_ids": [3, IMG, IMG, 5, 9], "multi_modal_data": {"image": [a]}},
        {"prompt_token_ids": [3, IMG, IMG, 5, 10], "multi_modal_data": {"image": [b]}},
    ]
    assert ro.completion_ids == [[7, 8], [8, 8], [7, 8], [8, 8]] and ro.sampling_logprobs[0] == [-0.25, -0.25]
    engine.generate([[9, 9]], 1)  # text prompts: token ids only
    assert llm.prompts[1] == [{"prompt_token_ids": [9, 9]}]
    engine.generate([[3, IMG, 5], [9, 9]], 1, images=[[a], []])  # a text row among image rows: ids only
    assert llm.prompts[2] == [
        {"prompt_token_ids": [3, IMG, 5], "multi_modal_data": {"image": [a]}},
        {"prompt_token_ids": [9, 9]},
    ]


def test_trainer_step_on_a_fake_colocated_engine_with_image_prompts(tmp_path, monkeypatch):
    from grpokit.config.io import apply_overrides
    from grpokit.config.sections import Config
    from grpokit.train import run_data
    from grpokit.train.loop import Trainer

    monkeypatch.setattr(run_data, "TASK_TRAIN_ROWS", 8)
    cfg = apply_overrides(
        Config(),
        [
            "data.task=shapes",
            "train.steps=1",
            "train.prompts_per_step=2",
            "rollout.group_size=2",
            "data.eval_size=0",
            "record.report=false",
            f"train.out={tmp_path}",
            "train.save_every=0",
        ],
    )
    tr = Trainer(cfg, quiet=True)
    llm = FakeLLM()
    tr.use_engine(VLLMColocated(llm, FakeSP, tr.params, sleep=False))
    tr.engine.after_update = lambda model, step: {}  # no weights to send to a fake
    tr.cfg.rollout.backend = "vllm"  # as if built on a GPU
    m = tr.train_step()
    sent = llm.prompts[0]
    assert len(sent) == 2 and all(len(p["multi_modal_data"]["image"]) == 1 for p in sent)
    assert all(p["prompt_token_ids"].count(IMG) == 16 for p in sent)  # the processor's ids, image tokens expanded
    assert sent[0]["multi_modal_data"]["image"][0].size == (64, 64)
    # the training passes saw the images: the fake's -0.25 is not the policy's log-probability, and a
    # forward without pixel values over 16 image tokens would have failed
    assert m["tis/logp_abs_diff_mean"] > 0


# ---------------------------------------------------------------- server: a fake vLLM on 127.0.0.1


class ImageServer:
    """The endpoints image prompts use, answering in vLLM's shapes; records every request body."""

    def __init__(self, render: bool = True):
        self.bodies: list[tuple[str, dict]] = []
        self.render = render
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def do_GET(self):
                self._answer(*outer.route("GET", self.path, None))

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"null")
                self._answer(*outer.route("POST", self.path, body))

            def _answer(self, status, body):
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def __enter__(self):
        threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        return self

    def __exit__(self, *exc):
        self.httpd.shutdown()
        self.httpd.server_close()

    def route(self, method, path, body):
        self.bodies.append((path, body))
        if path == "/health":
            return 200, {}
        if path == "/v1/models":
            return 200, {"object": "list", "data": [{"id": "tiny"}]}
        if path == "/collective_rpc":
            return 200, {"results": [{"protocol": PROTOCOL, "logprobs_mode": "processed_logprobs", "dtype": "float32"}]}
        if path == vi.RENDER and self.render:
            n = len(body["messages"][0]["content"])  # where the images sat in the server's own conversation
            return 200, {
                "features": {
                    "mm_hashes": {"image": [f"h{i}" for i in range(n)]},
                    "mm_placeholders": {"image": [{"offset": 1 + 18 * i, "length": 16} for i in range(n)]},
                }
            }
        if path == vi.GENERATE:
            n, first = body["sampling_params"]["n"], body["token_ids"][-1]
            return 200, {
                "request_id": body["request_id"],
                "choices": [
                    {
                        "index": g,
                        "token_ids": [first, 30 + g],
                        "finish_reason": "length",
                        "logprobs": {
                            "content": [
                                {"token": f"token_id:{first}", "logprob": -0.5, "top_logprobs": []},
                                {"token": f"token_id:{30 + g}", "logprob": -1.0 - g, "top_logprobs": []},
                            ]
                        },
                    }
                    for g in range(n)
                ],
            }
        return 404, {"error": {"message": "Not Found"}}


def _pixels(url: str):
    from PIL import Image

    head, _, data = url.partition(",")
    assert head == "data:image/png;base64"
    return Image.open(io.BytesIO(base64.b64decode(data))).convert("RGB").tobytes()


IDS = [[3] + [IMG] * 16 + [5, 40, 41], [3] + [IMG] * 16 + [5, 42]]


def test_server_client_renders_the_images_then_generates_from_our_ids(tmp_path):
    a, b = _scene(2), _scene(34)
    with ImageServer() as srv:
        client = VLLMServer(srv.url, SamplingParams(max_new_tokens=2, temperature=0.7), tmp_path, image_token_id=IMG)
        ro = client.generate(IDS, 2, images=[[a], [b]])
    renders = [body for path, body in srv.bodies if path == vi.RENDER]
    generates = sorted((body for path, body in srv.bodies if path == vi.GENERATE), key=lambda x: x["token_ids"][-1])
    assert len(renders) == 2 and len(generates) == 2  # one request of each per prompt
    pixels = sorted(_pixels(r["messages"][0]["content"][0]["image_url"]["url"]) for r in renders)
    assert pixels == sorted([a.tobytes(), b.tobytes()])  # each prompt's image, lossless (PNG)
    assert all(r["messages"][0]["role"] == "user" and r["max_tokens"] == 1 and r["model"] == "tiny" for r in renders)
    g = generates[0]  # the first prompt's (its last id, 41, sorts first)
    assert g["token_ids"] == IDS[0] and g["model"] == "tiny"
    # the server's placeholder (offset 1 in its conversation) moved to our run of 16 image tokens at 1
    assert g["features"]["mm_placeholders"]["image"] == [{"offset": 1, "length": 16}]
    assert g["features"]["mm_hashes"] == {"image": ["h0"]}  # the rest of the features as the server gave them
    sp = g["sampling_params"]
    assert (sp["n"], sp["max_tokens"], sp["temperature"], sp["logprobs"], sp["output_kind"]) == (2, 2, 0.7, 0, 2)
    # rows p*G + g: the fake answers [last prompt id, 30 + g] at logprobs (-0.5, -1 - g)
    assert ro.completion_ids == [[41, 30], [41, 31], [42, 30], [42, 31]]
    assert ro.sampling_logprobs == [[-0.5, -1.0], [-0.5, -2.0], [-0.5, -1.0], [-0.5, -2.0]]
    assert ro.finish_reasons == ["length"] * 4


def test_server_client_sends_what_trls_client_sends(tmp_path):
    """TRL 1.16's VLLMClient (the trainer's path: image_features, then generate with the features placed
    on the prompt's image runs) against the same fake: grpokit's requests carry the same fields with the
    same values (grpokit adds its other sampling fields), and both read the same samples back."""
    from trl.generation.vllm_client import VLLMClient

    a = _scene(18)
    with ImageServer() as srv:
        ours = VLLMServer(
            srv.url, SamplingParams(max_new_tokens=2, temperature=0.9), tmp_path, image_token_id=IMG
        ).generate(IDS[:1], 2, images=[[a]])
        mine = [body for _, body in srv.bodies if _ in (vi.RENDER, vi.GENERATE)]
        srv.bodies.clear()
        trl = object.__new__(VLLMClient)  # __init__ refuses without vllm installed; these are what it sets
        import requests

        trl.session, trl.base_url, trl.model = requests.Session(), srv.url, "tiny"
        [features] = trl.image_features([[a]])
        features = {
            **features,
            "mm_placeholders": {"image": vi.image_runs(IDS[0], IMG)},
        }  # as GRPOTrainer's _place_features
        out = trl.generate(IDS[:1], features=[features], n=2, temperature=0.9, max_tokens=2)
        theirs = [body for _, body in srv.bodies]
    assert mine[0] == theirs[0]  # the render request, byte for byte the same JSON
    ours_sp, theirs_sp = mine[1].pop("sampling_params"), theirs[1].pop("sampling_params")
    mine[1].pop("request_id"), theirs[1].pop("request_id")
    assert mine[1] == theirs[1]
    assert {k: ours_sp[k] for k in theirs_sp} == theirs_sp
    assert out["completion_ids"] == ours.completion_ids
    assert [[lp[0] for lp in row] for row in out["logprobs"]] == ours.sampling_logprobs


def test_server_client_sends_a_prompt_without_images_as_trls_client_does(tmp_path):
    """A text row among image rows (its image column null): no render request, and a generate request
    with ``features: null``, the body TRL 1.16's client sends for it (``features=[None]``)."""
    from trl.generation.vllm_client import VLLMClient

    text_ids = [3, 5, 43]  # no image tokens
    with ImageServer() as srv:
        ours = VLLMServer(
            srv.url, SamplingParams(max_new_tokens=2, temperature=0.9), tmp_path, image_token_id=IMG
        ).generate([IDS[0], text_ids], 2, images=[[_scene(2)], []])
        mine = [body for path, body in srv.bodies if path == vi.GENERATE and body["token_ids"] == text_ids]
        renders = [body for path, body in srv.bodies if path == vi.RENDER]
        srv.bodies.clear()
        trl = object.__new__(VLLMClient)
        import requests

        trl.session, trl.base_url, trl.model = requests.Session(), srv.url, "tiny"
        out = trl.generate([text_ids], features=[None], n=2, temperature=0.9, max_tokens=2)
        [theirs] = [body for _, body in srv.bodies]
    assert len(renders) == 1  # the image prompt's only
    [mine] = mine
    assert mine["features"] is None and theirs["features"] is None
    ours_sp, theirs_sp = mine.pop("sampling_params"), theirs.pop("sampling_params")
    mine.pop("request_id"), theirs.pop("request_id")
    assert mine == theirs and {k: ours_sp[k] for k in theirs_sp} == theirs_sp
    # rows p*G + g: the fake answers [last prompt id, 30 + g]
    assert (
        ours.completion_ids == [[41, 30], [41, 31], [43, 30], [43, 31]]
        and out["completion_ids"] == ours.completion_ids[2:]
    )


def test_server_without_the_render_endpoint_is_one_sentence(tmp_path):
    with ImageServer(render=False) as srv:
        client = VLLMServer(srv.url, SamplingParams(max_new_tokens=2), tmp_path, image_token_id=IMG)
        with pytest.raises(ConfigError, match="has no /v1/chat/completions/render endpoint.*--enable-scale-out"):
            client.generate(IDS[:1], 2, images=[[_scene(2)]])
        client.image_token_id = None
        with pytest.raises(ConfigError, match="no image_token_id"):
            client.generate(IDS[:1], 2, images=[[_scene(2)]])


def test_image_runs_and_placement_by_hand():
    # ids 9 I I 5 I 7: runs of I at offset 1 (length 2) and at offset 4 (length 1)
    assert vi.image_runs([9, IMG, IMG, 5, IMG, 7], IMG) == [{"offset": 1, "length": 2}, {"offset": 4, "length": 1}]
    assert vi.image_runs([9, 5], IMG) == []
    features = {"mm_placeholders": {"image": [{"offset": 1, "length": 16}]}}
    with pytest.raises(ServerReplyError, match="processed 1 images but the prompt has 2 runs"):
        vi.place(features, [9, IMG, IMG, 5, IMG, 7], IMG)
    with pytest.raises(ServerReplyError, match="no features with mm_placeholders"):
        vi.place(None, [IMG], IMG)


@pytest.mark.parametrize(
    "reply, says",
    [
        ({"choices": []}, "0 choices, expected 1"),
        (
            {"choices": [{"index": 0, "token_ids": [1, 2], "logprobs": {"content": [{"logprob": -1.0}]}}]},
            "without per-token logprobs",
        ),
        (
            {"choices": [{"index": 0, "token_ids": [1], "logprobs": {"content": [{"logprob": float("nan")}]}}]},
            "not a finite number",
        ),
        (
            {"choices": [{"index": 3, "token_ids": [1], "logprobs": {"content": [{"logprob": -1.0}]}}]},
            "no distinct index",
        ),
        (
            {"choices": [{"index": 0, "token_ids": ["1"], "logprobs": {"content": [{"logprob": -1.0}]}}]},
            "no list of token ids",
        ),
    ],
)
def test_malformed_generate_replies_are_one_sentence(reply, says):
    with pytest.raises(ServerReplyError, match=says):
        vi.parse_generate(reply, 1)


def test_vllm_serve_adds_scale_out_where_vllm_has_it():
    from grpokit.rollout import vllm_serve

    assert [vllm_serve.scale_out_supported(v) for v in ("0.29.1", "0.30.0", "0.33.0", None, "dev")] == [
        False,
        True,
        True,
        False,
        False,
    ]
    cmd, _ = vllm_serve.build_command("M", [], scale_out=True)
    assert cmd.count("--enable-scale-out") == 1
    assert "--enable-scale-out" not in vllm_serve.build_command("M", [])[0]
    assert vllm_serve.build_command("M", ["--enable-scale-out"], scale_out=True)[0].count("--enable-scale-out") == 1


def test_prompt_images_are_the_rows_pil_images():
    from grpokit.config.sections import DataConfig
    from grpokit.data.prompts import to_prompts
    from grpokit.data.vision import load_processor, prompt_images

    rows = shapes.train_rows(2, seed=1)
    proc = load_processor(str(shapes.shapes_model_path()))
    p = to_prompts(rows, proc.tokenizer, DataConfig(), processor=proc)[1]
    [img] = prompt_images(p)
    assert img.tobytes() == rows[1]["image"].convert("RGB").tobytes()
    assert torch.is_tensor(p.vision["pixel_values"])  # the hf engines' form stays beside it
