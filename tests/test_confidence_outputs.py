"""Confidence in the outputs (`--confidence`, `RunOptions.confidence`): json tokens and words, the tsv column, the API
and the server's verbose_json carry NeMo 3.0's own token and word confidences (fixtures/nemo-confidence, its
`default` setting: NeMo's defaults), for the trained demo model and both random tiny ones; off, nothing is computed
and the outputs are what they were."""

from __future__ import annotations

import contextlib
import io
import json
import re
import threading
from pathlib import Path

import numpy as np
import openai
import pytest
from conftest import FIXTURES
from test_server import KEY, start_server

import graphscribe
from graphscribe.runtime.loaded import LoadedModel

FOLDER = FIXTURES / "nemo-confidence"
ROOT = FIXTURES.parent.parent
REFERENCE = json.loads((FOLDER / "reference.json").read_text())
DEFAULT = "default"  # the setting of NeMo's own defaults, which --confidence computes
TOLERANCE = dict(rtol=2e-5, atol=1e-12)  # float32 rounding (the fixture README, section 3)


def cli(*args) -> str:
    """What `transcribe ARGS --device cpu` prints, from `cli.main` in this process."""
    from graphscribe.cli import main

    out = io.StringIO()
    try:
        with contextlib.redirect_stdout(out):
            main([*map(str, args), "--device", "cpu"])
    except SystemExit as done:
        assert done.code in (0, None), done.code
    return out.getvalue()


def _records(name: str, *flags: str) -> dict[str, dict]:
    """The CLI's json record of each of a fixture model's clips, by clip name: one run, a clip a batch, as NeMo's
    were made (a silent clip's features differ in a padded batch, in NeMo as here: the fixture README)."""
    spec = REFERENCE["models"][name]
    paths = {str(ROOT / path): clip for clip, path in spec["clips"].items()}
    lines = cli(*paths, "--model", ROOT / spec["checkpoint"], "-f", "json", "--batch", 1, *flags).splitlines()
    return {paths[r["path"]]: r for r in map(json.loads, lines)}


@pytest.mark.parametrize("name", list(REFERENCE["models"]))
def test_json_carries_nemo_s_token_and_word_confidence(name):
    """`--confidence -f json`: each token's confidence is NeMo's, and the words with text carry NeMo's word
    confidences in order; a lone `▁` word (no text, which NeMo's word list leaves out) carries its token's."""
    for clip, record in _records(name, "--confidence").items():
        want = REFERENCE["models"][name]["settings"][DEFAULT]["clips"][clip]
        assert [t["id"] for t in record["tokens"]] == want["token_ids"], clip
        got = [t["confidence"] for t in record["tokens"]]
        np.testing.assert_allclose(got, want["token_confidence"], **TOLERANCE, err_msg=f"{name} {clip}")
        words = [w for w in record["words"] if w["word"].strip()]
        assert [w["word"] for w in words] == want["words"], clip
        got = [w["confidence"] for w in words]
        np.testing.assert_allclose(got, want["word_confidence"], **TOLERANCE, err_msg=f"{name} {clip}")
        lone = [t["confidence"] for t in record["tokens"] if t["piece"] == "\u2581"]
        assert [w["confidence"] for w in record["words"] if not w["word"].strip()] == lone, clip
        if name == "rnnt-tiny" and clip == "quarter_second":  # ten lone `▁`: ten words of no text, NeMo none
            assert len(record["words"]) == 10 and not want["word_confidence"]


def _stripped(record: dict) -> dict:
    for item in record.get("tokens", []) + record.get("words", []):
        item.pop("confidence")
    return record


def test_off_computes_nothing_and_gives_the_same_bytes(monkeypatch):
    """Without --confidence no replay runs, and json and tsv are byte for byte the outputs with it, less the
    confidences."""
    spec = REFERENCE["models"]["demo"]
    paths = [ROOT / path for path in spec["clips"].values()]
    on = cli(*paths, "-f", "json", "--confidence")

    def refuse(*_):
        raise AssertionError("confidences computed with --confidence off")

    monkeypatch.setattr(LoadedModel, "add_confidences", refuse)
    off = cli(*paths, "-f", "json")
    assert "confidence" not in off
    assert cli(paths[0], "-f", "srt", "--confidence") == cli(paths[0], "-f", "srt")  # not shown there: not computed
    assert off == "".join(
        json.dumps(_stripped(json.loads(line)), ensure_ascii=False) + "\n" for line in on.splitlines()
    )
    tsv_off = cli(paths[0], "-f", "tsv")
    assert tsv_off.splitlines()[0] == "start\tend\ttext"
    monkeypatch.undo()
    tsv_on = cli(paths[0], "-f", "tsv", "--confidence")
    assert tsv_off == "".join(line.rsplit("\t", 1)[0] + "\n" for line in tsv_on.splitlines())


def test_tsv_confidence_column_is_each_cue_s_least_confident_word():
    """The tsv's fourth column parses as a number: the least of its cue's words' confidences."""
    spec = REFERENCE["models"]["demo"]
    want = spec["settings"][DEFAULT]["clips"]
    for clip, path in spec["clips"].items():
        rows = [line.split("\t") for line in cli(ROOT / path, "-f", "tsv", "--confidence").splitlines()]
        assert rows[0] == ["start", "end", "text", "confidence"]
        cues, taken = rows[1:], 0
        assert cues and all(len(row) == 4 for row in cues)
        for _, _, text, value in cues:  # the cue's words are the next ones of the text
            n = len(text.split())
            least = min(want[clip]["word_confidence"][taken : taken + n])
            assert float(value) == pytest.approx(least, rel=1e-5), (clip, text)
            taken += n
        assert taken == len(want[clip]["words"])


def test_the_api_carries_them_in_a_batch():
    """`load_model(..., confidence=True)`: Transcript tokens and words carry them, the clips batched together."""
    spec = REFERENCE["models"]["demo"]
    model = graphscribe.load_model(ROOT / spec["checkpoint"], device="cpu", confidence=True)
    clips = list(spec["clips"])
    transcripts = model.transcribe([str(ROOT / spec["clips"][c]) for c in clips], batch_size=len(clips))
    for clip, transcript in zip(clips, transcripts):
        want = spec["settings"][DEFAULT]["clips"][clip]
        got = [t.confidence for t in transcript.tokens]
        np.testing.assert_allclose(got, want["token_confidence"], **TOLERANCE, err_msg=clip)
        got = [w.confidence for w in transcript.words if w.word.strip()]
        np.testing.assert_allclose(got, want["word_confidence"], **TOLERANCE, err_msg=clip)


@pytest.fixture(scope="module", params=[(), ("--confidence",)], ids=["asked", "served"])
def server(request, tmp_path_factory):
    """A server without --confidence (requests ask with include[]=confidence) and one with it; SIGTERM at the end."""
    checkpoint = ROOT / REFERENCE["models"]["demo"]["checkpoint"]
    served = start_server(
        tmp_path_factory.mktemp("server") / "stderr.txt", "--http-workers", "1", *request.param, model=checkpoint
    )
    yield served.url, bool(request.param)
    assert served.stop() == 0, served.log.read_text()


def _verbose(client, path: Path, **extra):
    with open(path, "rb") as f:
        return client.audio.transcriptions.create(
            file=f, model="demo", response_format="verbose_json", timestamp_granularities=["word"], **extra
        )


def test_server_verbose_json_words_carry_confidence(server):
    """verbose_json's words carry NeMo's word confidences (the official client) when the request asks
    (`include[]=confidence`) or the server runs with --confidence; otherwise no word has the key."""
    url, served = server
    client = openai.OpenAI(base_url=f"{url}/v1", api_key=KEY, max_retries=0, timeout=300)
    spec = REFERENCE["models"]["demo"]
    for clip, path in spec["clips"].items():
        want = spec["settings"][DEFAULT]["clips"][clip]
        answer = _verbose(client, ROOT / path, include=["confidence"])
        assert [w.word for w in answer.words] == want["words"], clip
        got = [w.model_dump()["confidence"] for w in answer.words]
        np.testing.assert_allclose(got, want["word_confidence"], **TOLERANCE, err_msg=clip)
        plain = _verbose(client, ROOT / path)
        assert [w.word for w in plain.words] == want["words"], clip
        assert all(("confidence" in w.model_dump()) == served for w in plain.words), clip


def test_a_batch_computes_them_once_and_answers_only_who_asked(monkeypatch):
    """Two requests in one batch, one asking: the batch's replay runs once over both rows, and only the one that
    asked gets them (the server's batching thread, in this process)."""
    from graphscribe.io.audio import read_input
    from graphscribe.serve.service import Service

    spec = REFERENCE["models"]["demo"]
    model = graphscribe.load_model(ROOT / spec["checkpoint"], device="cpu")
    rows, replay = [], LoadedModel.add_confidences
    monkeypatch.setattr(
        LoadedModel, "add_confidences", lambda self, e, hyps: (rows.append(len(hyps)), replay(self, e, hyps))
    )
    service = Service(model, max_batch=4)
    got, answered = {}, threading.Event()
    audios = {clip: read_input(str(ROOT / spec["clips"][clip]), model.sample_rate) for clip in ("demo1", "demo2")}

    def done(transcript, _):
        got[transcript.source] = transcript
        if len(got) == 2:
            answered.set()

    # the longest first: waiting since before the thread starts, the oldest heads the batch (Scheduler's overdue)
    for clip in sorted(audios, key=lambda c: -audios[c].numel()):
        service.submit(audios[clip], True, done, clip, confidence=clip == "demo1")
    service.start()
    assert answered.wait(300)
    service.close(60)
    assert rows == [2]
    want = spec["settings"][DEFAULT]["clips"]["demo1"]["word_confidence"]
    np.testing.assert_allclose([w.confidence for w in got["demo1"].words], want, **TOLERANCE)
    assert all(w.confidence is None for w in got["demo2"].words)
    assert all(t.confidence is None for t in got["demo2"].tokens)


def test_bench_throughput_rows_time_the_replay(tmp_path):
    """`bench --throughput --format json --confidence`: the rows say so and time the replay as a stage of its own
    (the lead's GPU measure of its cost against the same rows without --confidence)."""
    out = tmp_path / "bench.json"
    cli(
        "bench", "--throughput", "--files", 2, "--batch-sizes", 2, "--reps", 1, "--format", "json", "--confidence",
        "--json", out,
    )  # fmt: skip
    report = json.loads(out.read_text())
    assert report["confidence"] is True and report["format"] == "json"
    assert all(row["stages"]["confidence"] > 0 for row in report["throughput"])


def test_the_api_takes_nemo_s_other_methods():
    """`confidence_method`: NeMo's `max_prob` with mean aggregation (its `max_prob_mean` setting); a method NeMo has
    not is refused at loading, with one line naming it."""
    spec = REFERENCE["models"]["demo"]
    method = graphscribe.ConfidenceMethod(name="max_prob", alpha=1.0, aggregation="mean")
    model = graphscribe.load_model(ROOT / spec["checkpoint"], device="cpu", confidence=True, confidence_method=method)
    clip = "demo1"
    [transcript] = model.transcribe([str(ROOT / spec["clips"][clip])])
    want = spec["settings"]["max_prob_mean"]["clips"][clip]
    np.testing.assert_allclose([t.confidence for t in transcript.tokens], want["token_confidence"], **TOLERANCE)
    words = [w.confidence for w in transcript.words if w.word.strip()]
    np.testing.assert_allclose(words, want["word_confidence"], **TOLERANCE)
    for bad, line in (
        (graphscribe.ConfidenceMethod(entropy_type="shannon"), "confidence entropy 'shannon_exp'"),
        (graphscribe.ConfidenceMethod(aggregation="median"), "confidence aggregation 'median'"),
    ):
        with pytest.raises(ValueError, match=re.escape(line)):
            graphscribe.load_model(ROOT / spec["checkpoint"], device="cpu", confidence=True, confidence_method=bad)
