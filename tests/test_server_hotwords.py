"""Hotwords per request in `transcribe serve`, from outside: the real server process, the official `openai` client
and a raw connection. Two requests with different phrases in one batch each get NeMo's tokens for their own
phrases (tests/fixtures/nemo-fusion); a bad phrase is a 400 naming it; `prompt` is boosted with --prompt-as-hotwords.
"""

from __future__ import annotations

import json
import threading

import openai
import pytest
from test_fusion import REFERENCE, ROOT, _scored
from test_server import KEY, REQUEST_SECONDS, _connect, _metric_samples, _read_answer, start_server

CLIP = ROOT / REFERENCE["clips"]["espeak_fox"]
RUNS = REFERENCE["models"]["tdt-tiny"]["runs"]  # the server's checkpoint is conftest's NEMO_PATH, tdt-tiny
PLAIN, SCORED = ", ".join(REFERENCE["phrases"]), ", ".join(_scored())


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    # a batch formed while requests are on their way waits for them (up to ten minutes): two requests admitted
    # together are one batch
    served = start_server(
        tmp_path_factory.mktemp("hot") / "stderr.txt", "--max-wait-ms", "600000", "--prompt-as-hotwords"
    )
    yield served
    assert served.stop() == 0, served.log.read_text()


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key=KEY, max_retries=0, timeout=REQUEST_SECONDS)


def _tokens(body: dict) -> list[int]:
    return [t for segment in body["segments"] for t in segment["tokens"]]


def _body(fields: dict[str, str], boundary: str) -> bytes:
    parts = [f'--{boundary}\r\nContent-Disposition: form-data; name="{k}"\r\n\r\n{v}\r\n' for k, v in fields.items()]
    head = f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="a.wav"\r\n\r\n'
    return "".join(parts).encode() + head.encode() + CLIP.read_bytes() + f"\r\n--{boundary}--\r\n".encode()


def _wait_depth(url: str, depth: int) -> None:
    """Until /metrics counts `depth` requests admitted and not answered (each poll is a request of its own)."""
    while _metric_samples(url, "graphscribe_queue_depth")[""] != depth:
        pass


def test_two_requests_in_one_batch_each_get_their_own_phrases(server, client):
    """A raw request with the plain list is admitted and half sent; one with the scored list comes through the
    official client; the raw one is finished: one batch of two rows, each NeMo's tokens for its own phrases."""
    assert RUNS["boost1.0"]["espeak_fox"]["token_ids"] != RUNS["scored-boost1.0"]["espeak_fox"]["token_ids"]
    boundary = "graphscribe-hot"
    body = _body({"hotwords": PLAIN, "response_format": "verbose_json"}, boundary)
    with _connect(server.url, REQUEST_SECONDS) as raw:
        raw.sendall(
            b"POST /v1/audio/transcriptions HTTP/1.1\r\nHost: localhost\r\n"
            + f"Authorization: Bearer {KEY}\r\nContent-Type: multipart/form-data; boundary={boundary}\r\n".encode()
            + f"Content-Length: {len(body)}\r\n\r\n".encode()
            + body[: len(body) // 2]
        )
        _wait_depth(server.url, 1)
        answers = {}

        def scored() -> None:
            with open(CLIP, "rb") as f:
                answers["scored"] = client.audio.transcriptions.create(
                    file=f, model="tdt-tiny", response_format="verbose_json", extra_body={"hotwords": SCORED}
                )

        thread = threading.Thread(target=scored)
        thread.start()
        _wait_depth(server.url, 2)
        raw.sendall(body[len(body) // 2 :])
        status, _, plain = _read_answer(raw)
        thread.join()
    assert status == 200, plain
    assert _tokens(plain) == RUNS["boost1.0"]["espeak_fox"]["token_ids"]
    assert _tokens(answers["scored"].model_dump()) == RUNS["scored-boost1.0"]["espeak_fox"]["token_ids"]
    rows = _metric_samples(server.url, "graphscribe_batch_rows_bucket")
    assert (rows['{le="1"}'], rows['{le="2"}']) == (0, 1)  # one batch, both requests in it


def test_a_request_without_phrases_is_todays(server, client):
    with open(CLIP, "rb") as f:
        body = client.audio.transcriptions.create(file=f, model="tdt-tiny", response_format="verbose_json")
    assert _tokens(body.model_dump()) == RUNS["nofusion"]["espeak_fox"]["token_ids"]


def test_prompt_is_boosted_with_prompt_as_hotwords(server, client):
    with open(CLIP, "rb") as f:
        body = client.audio.transcriptions.create(
            file=f, model="tdt-tiny", response_format="verbose_json", prompt=PLAIN
        )
    assert _tokens(body.model_dump()) == RUNS["boost1.0"]["espeak_fox"]["token_ids"]


@pytest.mark.parametrize(
    "field,text,problem",
    [
        ("hotwords", "you, 漢字", "is only pieces the tokenizer does not know"),  # found by the engine's tokenizer
        ("hotwords", ", ".join(["you"] * 1001), "more than the 1000"),  # found by the HTTP worker
        ("hotwords", "you:-2", "must be above 0"),
        ("prompt", "you,,sister", "an empty phrase"),
    ],
)
def test_a_bad_phrase_is_a_400_naming_it(server, client, field, text, problem):
    with open(CLIP, "rb") as f, pytest.raises(openai.BadRequestError) as err:
        if field == "prompt":
            client.audio.transcriptions.create(file=f, model="tdt-tiny", prompt=text)
        else:
            client.audio.transcriptions.create(file=f, model="tdt-tiny", extra_body={field: text})
    error = err.value.body
    assert error["param"] == field and problem in error["message"], json.dumps(error)
    assert error["message"].startswith(f"{field}: ") and "\n" not in error["message"]
    with open(CLIP, "rb") as f:  # the server goes on, the next request unharmed
        assert client.audio.transcriptions.create(file=f, model="tdt-tiny").text
