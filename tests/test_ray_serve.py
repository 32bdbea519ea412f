"""The Ray Serve deployment on a local Ray instance (two CPUs, started once for the module), called with the
official `openai` client: each file gets the CLI's text, concurrent requests share batches, errors are OpenAI's."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import openai
import pytest
import ray
from conftest import NEMO_PATH
from ray import serve
from test_server import FILES, cli, free_port, transcribe

from graphscribe.io.options import RunOptions
from graphscribe.ray_serve import APP_NAME, app, build_app

KEY = "sk-ray-serve-test"


@pytest.fixture(scope="module")
def url():
    ray.init(num_cpus=2, object_store_memory=200 * 2**20, include_dashboard=False, log_to_driver=False)
    port = free_port()
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    app = build_app(str(NEMO_PATH), RunOptions(batch_size=8), replicas=1, gpus_per_replica=0, api_key=KEY)
    serve.run(app, name=APP_NAME, route_prefix="/")
    yield f"http://127.0.0.1:{port}"
    serve.shutdown()
    ray.shutdown()


@pytest.fixture(scope="module")
def client(url):
    return openai.OpenAI(base_url=f"{url}/v1", api_key=KEY, max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def expected() -> dict[str, str]:
    return {Path(line.split(": ", 1)[0]).name: line.split(": ", 1)[1] for line in cli(*FILES).splitlines()}


def test_concurrent_clients_get_the_cli_text(client, expected):
    start = threading.Barrier(len(FILES))

    def one(path: Path) -> str:
        start.wait()
        return transcribe(client, path).text

    with ThreadPoolExecutor(len(FILES)) as pool:
        texts = list(pool.map(one, FILES))
    assert texts == [expected[p.name] for p in FILES]


def test_subtitles_and_models(client):
    with open(FILES[0], "rb") as f:
        srt = client.audio.transcriptions.create(file=f, model="tdt-tiny", response_format="srt")
    assert srt == cli(FILES[0], "--format", "srt")
    assert [m.id for m in client.models.list()] == ["tdt-tiny"]


def test_errors_in_openais_shape(url, client, tmp_path):
    letter = tmp_path / "letter.wav"
    letter.write_text("Dear reader,\n" * 10)
    with pytest.raises(openai.BadRequestError) as bad:
        transcribe(client, letter)
    assert bad.value.body["param"] == "file" and "letter.wav" in bad.value.body["message"]
    wrong = openai.OpenAI(base_url=f"{url}/v1", api_key="sk-wrong", max_retries=0, timeout=120)
    with pytest.raises(openai.AuthenticationError):
        transcribe(wrong, FILES[0])
    assert httpx.get(f"{url}/nowhere").status_code == 401  # the key first, as OpenAI does
    assert httpx.get(f"{url}/health").json()["device"] == "cpu"


def test_serve_runs_builder_takes_key_value_arguments():
    """`serve run graphscribe.ray_serve:app model=... replicas=2 gpus_per_replica=0`: the deployment's options."""
    built = app({"model": str(NEMO_PATH), "replicas": "2", "gpus_per_replica": "0", "batch": "4"})
    deployment = built._bound_deployment
    assert deployment.num_replicas == 2 and deployment.ray_actor_options["num_gpus"] == 0
    assert deployment.max_ongoing_requests == 16  # 4 x its batch
    with pytest.raises(ValueError, match="unknown arguments replica"):
        app({"model": str(NEMO_PATH), "replica": "2"})
