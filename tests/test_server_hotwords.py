"""Hotwords and beams per request in `transcribe serve`, from outside: the real server process, the official `openai`
client and a raw connection. Two requests with different phrases in one batch each get NeMo's tokens for their own
phrases (tests/fixtures/nemo-fusion); a bad phrase is a 400 naming it; `prompt` is boosted with --prompt-as-hotwords.
A request's `beam` gets NeMo's best hypothesis of that beam (tests/fixtures/nemo-beam), beside a greedy one in its
batch; a bad one is a 400 naming `beam`.
"""

from __future__ import annotations

import json
import threading

import openai
import pytest
from conftest import NEMO_PATH
from test_beam import REFERENCE as BEAM_REFERENCE
from test_fusion import REFERENCE, ROOT, _scored
from test_server import KEY, REQUEST_SECONDS, _connect, _metric_samples, _read_answer, start_server

CLIP = ROOT / REFERENCE["clips"]["espeak_fox"]
RUNS = REFERENCE["models"]["tdt-tiny"]["runs"]  # the server's checkpoint is conftest's NEMO_PATH, tdt-tiny
PLAIN, SCORED = ", ".join(REFERENCE["phrases"]), ", ".join(_scored())
BEAM4 = BEAM_REFERENCE["models"]["tdt-tiny"]["runs"]["malsd_batch/beam4/nolm"]["single"]["espeak_fox"][0]["token_ids"]


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


def in_one_batch(server, client, fields: dict[str, str], extra_body: dict[str, str]) -> tuple[dict, dict]:
    """Two verbose_json answers of CLIP from one batch: a raw request with the form `fields` is admitted and half
    sent; one with `extra_body` comes through the official client; the raw one is finished. Asserts they shared a
    batch (the batch sizes counted by /metrics)."""
    boundary = "graphscribe-hot"
    body = _body({**fields, "response_format": "verbose_json"}, boundary)
    before = _metric_samples(server.url, "graphscribe_batch_rows_bucket")
    with _connect(server.url, REQUEST_SECONDS) as raw:
        raw.sendall(
            b"POST /v1/audio/transcriptions HTTP/1.1\r\nHost: localhost\r\n"
            + f"Authorization: Bearer {KEY}\r\nContent-Type: multipart/form-data; boundary={boundary}\r\n".encode()
            + f"Content-Length: {len(body)}\r\n\r\n".encode()
            + body[: len(body) // 2]
        )
        _wait_depth(server.url, 1)
        answers = {}

        def other() -> None:
            with open(CLIP, "rb") as f:
                answers["client"] = client.audio.transcriptions.create(
                    file=f, model="tdt-tiny", response_format="verbose_json", extra_body=extra_body
                )

        thread = threading.Thread(target=other)
        thread.start()
        _wait_depth(server.url, 2)
        raw.sendall(body[len(body) // 2 :])
        status, _, first = _read_answer(raw)
        thread.join()
    assert status == 200, first
    rows = _metric_samples(server.url, "graphscribe_batch_rows_bucket")
    batches = {le: rows[le] - before[le] for le in ('{le="1"}', '{le="2"}')}
    assert batches == {'{le="1"}': 0, '{le="2"}': 1}  # one batch, both requests in it
    return first, answers["client"].model_dump()


def test_two_requests_in_one_batch_each_get_their_own_phrases(server, client):
    """Each of two requests in one batch gets NeMo's tokens for its own phrases."""
    assert RUNS["boost1.0"]["espeak_fox"]["token_ids"] != RUNS["scored-boost1.0"]["espeak_fox"]["token_ids"]
    plain, scored = in_one_batch(server, client, {"hotwords": PLAIN}, {"hotwords": SCORED})
    assert _tokens(plain) == RUNS["boost1.0"]["espeak_fox"]["token_ids"]
    assert _tokens(scored) == RUNS["scored-boost1.0"]["espeak_fox"]["token_ids"]


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


# ============================================================================ a request's own beam


@pytest.mark.parametrize(
    "fields,extra_body,first,second",
    [
        ({"beam": "4"}, {}, BEAM4, RUNS["nofusion"]["espeak_fox"]["token_ids"]),
        ({"hotwords": PLAIN}, {"beam": "4"}, RUNS["boost1.0"]["espeak_fox"]["token_ids"], BEAM4),
    ],
    ids=["beam-and-greedy", "phrases-and-beam"],
)
def test_two_requests_in_one_batch_each_decoded_with_their_own_beam(server, client, fields, extra_body, first, second):
    """A greedy server (no --beam): a request with beam=4 gets NeMo's beam-4 best hypothesis, one without NeMo's
    greedy tokens (with its own phrases: boosted), both from one batch, encoded once."""
    assert BEAM4 != RUNS["nofusion"]["espeak_fox"]["token_ids"]
    answers = in_one_batch(server, client, fields, extra_body)
    assert [_tokens(a) for a in answers] == [first, second]


@pytest.mark.parametrize(
    "fields,problem",
    [
        ({"beam": "0"}, "'0': use a whole number from 1"),
        ({"beam": "99"}, "'99': use a whole number from 1"),
        ({"beam": "x"}, "'x': use a whole number from 1"),
        ({"beam": "4", "hotwords": "you"}, "own phrases are boosted in greedy decoding"),
        ({"beam": "2", "stream": "true"}, "stream=true transcribes greedily"),
    ],
)
def test_a_bad_beam_is_a_400_naming_it(client, fields, problem):
    with open(CLIP, "rb") as f, pytest.raises(openai.BadRequestError) as err:
        client.audio.transcriptions.create(file=f, model="tdt-tiny", extra_body=fields)
    error = err.value.body
    assert error["param"] == "beam" and problem in error["message"], json.dumps(error)
    assert error["message"].startswith("beam ") and "\n" not in error["message"]


# ============================================================================ realtime sessions and streamed uploads


def _boosted_stream_text(pcm, hotwords: str) -> str:
    """What `model.stream(hotwords=...)` says of 24 kHz PCM resampled as it arrives (test_realtime's path)."""
    from test_realtime import PIECE

    from graphscribe.api import load_model
    from graphscribe.io.resample import StreamResampler

    model = load_model(NEMO_PATH, device="cpu")
    resampler = StreamResampler(24000, model.sample_rate)
    stream = model.stream(0.8, 9.6, 1.6, hotwords=hotwords)
    samples = pcm.astype("float32") / 32768.0
    for i in range(0, len(samples), PIECE):
        stream.feed(resampler.push(samples[i : i + PIECE]))
    stream.feed(resampler.flush())
    return stream.finish()[-1].text


def _session_turn(server, transcription: dict, pcm) -> list[dict]:
    from test_realtime import MANUAL, appends, raw_session, receive

    session = json.loads(json.dumps(MANUAL))
    session["audio"]["input"]["transcription"] = transcription
    with raw_session(server) as ws:
        receive(ws, "session.created")
        ws.send(json.dumps({"type": "session.update", "session": session}))
        events = receive(ws, "session.updated")
        for piece in appends(pcm):
            ws.send(json.dumps({"type": "input_audio_buffer.append", "audio": piece}))
        ws.send(json.dumps({"type": "input_audio_buffer.commit"}))
        done = (
            "conversation.item.input_audio_transcription.completed",
            "conversation.item.input_audio_transcription.failed",
        )
        while events[-1]["type"] not in done:
            events.append(json.loads(ws.recv(timeout=REQUEST_SECONDS)))
    return events


def test_a_realtime_sessions_prompt_and_hotwords_are_boosted_in_its_turns(server):
    """A session's transcription prompt (--prompt-as-hotwords) or `hotwords`: its turns say what a stream with
    those phrases says (model.stream(hotwords=), itself a stream of a model loaded with them: test_row_boosting);
    a session without them, what a plain stream says."""
    from test_realtime import pcm24, streamed_text

    pcm = pcm24(CLIP)
    boosted = _boosted_stream_text(pcm, PLAIN)
    from graphscribe.api import load_model

    assert boosted != streamed_text(load_model(NEMO_PATH, device="cpu"), pcm)  # the phrases count on this clip
    for transcription in ({"prompt": PLAIN}, {"hotwords": PLAIN}):
        events = _session_turn(server, transcription, pcm)
        assert events[-1]["transcript"] == boosted, (transcription, events[-1])
    assert _session_turn(server, {}, pcm)[-1]["transcript"] == streamed_text(load_model(NEMO_PATH, device="cpu"), pcm)


def test_a_sessions_bad_phrase_is_an_error_event_or_its_turn_fails(server):
    from test_realtime import MANUAL, pcm24, raw_session, receive

    session = json.loads(json.dumps(MANUAL))
    session["audio"]["input"]["transcription"] = {"hotwords": "you:-1"}
    with raw_session(server) as ws:
        receive(ws, "session.created")
        ws.send(json.dumps({"type": "session.update", "session": session}))
        error = receive(ws, "error")[-1]["error"]
    assert error["param"] == "hotwords" and "must be above 0" in error["message"]
    # a phrase the worker cannot judge (its tokens): the engine fails the turn, naming it
    failed = _session_turn(server, {"hotwords": "you, 漢字"}, pcm24(CLIP, 1.0))[-1]
    assert failed["type"] == "conversation.item.input_audio_transcription.failed", failed
    assert "does not know" in json.dumps(failed)


def test_a_streamed_upload_is_boosted_by_its_own_phrases(client):
    """stream=true with hotwords: the live engine's turn boosted as model.stream(hotwords=...) is."""
    from graphscribe.api import load_model

    model = load_model(NEMO_PATH, device="cpu")
    stream = model.stream(0.8, 9.6, 1.6, hotwords=PLAIN)
    expected = (stream.feed(model.read(CLIP)) + stream.finish())[-1].text
    plain = model.stream(0.8, 9.6, 1.6)
    assert expected != (plain.feed(model.read(CLIP)) + plain.finish())[-1].text
    with open(CLIP, "rb") as f:
        events = list(
            client.audio.transcriptions.create(file=f, model="tdt-tiny", stream=True, extra_body={"hotwords": PLAIN})
        )
    assert events[-1].type == "transcript.text.done" and events[-1].text == expected


def test_the_service_refuses_a_requests_phrases_alone():
    """Service.submit: a phrase that cannot be boosted, or phrases with --beam (greedy only), answered at once with
    a BadRequest naming `hotwords`; nothing queued."""
    import torch

    from graphscribe.api import load_model
    from graphscribe.serve.ipc import BadRequest
    from graphscribe.serve.service import Service

    for beam, phrases, problem in ((1, (("漢字", None),), "does not know"), (2, (("you", None),), "--beam")):
        service = Service(load_model(NEMO_PATH, device="cpu", beam_size=beam))
        answers = []
        assert (
            service.submit(torch.zeros(1600), False, lambda t, q: answers.append(t), "a.wav", hotwords=phrases) is None
        )
        (answer,) = answers
        assert isinstance(answer, BadRequest) and answer.param == "hotwords" and problem in answer.error
        assert service.in_flight == 0
