"""Word and segment timestamps against NeMo's own, and against hand-derived expectations.

NeMo 3.0's `transcribe(paths, timestamps=True)` wrote `fixtures/nemo-timestamps/*.json` for the
tiny TDT checkpoint and for the bundled demo model. Part 1 feeds NeMo's own token offsets to our
word and segment builder. Part 2 transcribes the clips end to end, single and batched. Part 3
explains the one difference: NeMo decoded four demo clips in one batch, and its batched decoder
then reports some tokens' durations from a later joint evaluation; a port of NeMo's batched loop
reproduces its numbers, and decoding each clip alone gives ours. Part 4: RNN-T (a token ends one
frame after it starts) and the builder's rules, worked out by hand.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from conftest import CLIPS, FIXTURES

from graphscribe.api import load_model
from graphscribe.output.timestamps import WordRules, words_and_segments

STAMPS = FIXTURES / "nemo-timestamps"
DEMO_PATH = Path(__file__).parents[1] / "src" / "graphscribe" / "data" / "demo.nemo"
RNNT_PATH = FIXTURES / "nemo-rnnt-tiny" / "rnnt-tiny.nemo"
TDT_PATH = FIXTURES / "nemo-tdt-tiny" / "tdt-tiny.nemo"
REFERENCES = {
    "tdt-tiny": json.loads((STAMPS / "tdt-tiny.json").read_text())["timestamps"],
    "demo": json.loads((STAMPS / "demo.json").read_text())["timestamps"],
}
NEMO_BATCH = 4  # transcribe()'s default batch size, with which the references were made


def _clip_path(name: str) -> Path | None:
    """Where a reference clip's audio is in tests/fixtures (None: not copied)."""
    for path in (CLIPS / name, STAMPS / "clips" / Path(name).with_suffix(".flac").name):
        if path.exists():
            return path
    return None


def _seconds(frame: int) -> float:
    return frame * 0.01 * 8  # NeMo: offset x window_stride x subsampling_factor


@pytest.fixture(scope="module")
def models():
    return {
        "tdt-tiny": load_model(TDT_PATH, device="cpu", graphs=False),
        "demo": load_model(DEMO_PATH, device="cpu", graphs=False),
    }


@pytest.fixture(scope="module")
def single(models):
    """(ref, path) -> that clip transcribed alone, once for the module: parts 2 and 3 compare the same transcripts
    (long_mix_62s's takes 6.5 s on the CPU)."""
    done: dict = {}

    def transcript(ref: str, path: Path):
        if (ref, path) not in done:
            [done[ref, path]] = models[ref].transcribe([path])
        return done[ref, path]

    return transcript


def _nemo_words(clip: dict) -> list[tuple]:
    return [(w["word"], w["start"], w["end"], w["start_offset"], w["end_offset"]) for w in clip["word"]]


def _nemo_segments(clip: dict) -> list[tuple]:
    return [(s["segment"], s["start"], s["end"], s["start_offset"], s["end_offset"]) for s in clip["segment"]]


def _words(words) -> list[tuple]:
    return [(w.word, w.start, w.end, w.start_frame, w.end_frame) for w in words]


def _segments(segments) -> list[tuple]:
    return [(s.text, s.start, s.end, s.start_frame, s.end_frame) for s in segments]


def _reference_clips():
    return [(ref, clip["file"]) for ref, data in REFERENCES.items() for clip in data["clips"]]


def _clip(ref: str, name: str) -> dict:
    return next(c for c in REFERENCES[ref]["clips"] if c["file"] == name)


# ============================================================================ part 1: NeMo's token offsets in


@pytest.mark.parametrize("ref,name", _reference_clips())
def test_builder_gives_nemo_words_and_segments_from_nemo_token_offsets(models, ref, name):
    """Every clip of both references, to the last bit of the float: text, offsets and seconds."""
    model, clip = models[ref], _clip(ref, name)
    pieces = [model.tokenizer.piece(i) for i in clip["token_ids"]]
    spans = [(c["start_offset"], c["end_offset"]) for c in clip["char"]]
    words, segments = words_and_segments(
        pieces, spans, model.tokenizer.decode_pieces, model.word_rules, True, model.frame_seconds
    )
    assert _words(words) == _nemo_words(clip)
    assert _segments(segments) == _nemo_segments(clip)


# ============================================================================ part 2: end to end


def _end_to_end_cases():
    """Clips we have audio for whose NeMo numbers are NeMo's per-file numbers (see part 3)."""
    cases = [("tdt-tiny", c["file"]) for c in REFERENCES["tdt-tiny"]["clips"] if _clip_path(c["file"])]
    return cases + [("demo", "long_mix_62s.wav")]


@pytest.mark.parametrize("ref,name", _end_to_end_cases())
def test_transcribed_words_and_segments_equal_nemos(single, ref, name):
    clip = _clip(ref, name)
    transcript = single(ref, _clip_path(name))
    assert transcript.token_ids == clip["token_ids"]
    assert _words(transcript.words) == _nemo_words(clip)
    assert _segments(transcript.segments) == _nemo_segments(clip)


@pytest.mark.parametrize("ref", REFERENCES)
def test_batched_words_equal_single(models, single, ref):
    """All of a reference's clips in one padded batch: the same words and segments as one by one."""
    paths = [p for p in (_clip_path(c["file"]) for c in REFERENCES[ref]["clips"]) if p is not None]
    batched = models[ref].transcribe(paths, batch_size=len(paths))
    for path, transcript in zip(paths, batched):
        alone = single(ref, path)
        assert _words(transcript.words) == _words(alone.words)
        assert _segments(transcript.segments) == _segments(alone.segments)


def test_json_has_words_and_segments_in_rounded_seconds(models):
    clip = _clip("demo", "demo2.wav")
    [transcript] = models["demo"].transcribe([_clip_path(clip["file"])])
    record = transcript.to_json()
    assert [w["word"] for w in record["words"]] == [w["word"] for w in clip["word"]]
    assert [w["start"] for w in record["words"]] == [round(w["start"], 3) for w in clip["word"]]
    assert [s["text"] for s in record["segments"]] == [s["segment"] for s in clip["segment"]]
    assert all(set(w) == {"word", "start", "end"} for w in record["words"])
    assert all(set(s) == {"text", "start", "end"} for s in record["segments"])


# ============================================================================ part 3: NeMo's batched durations


def _nemo_batched_tdt(model, paths: list[Path]) -> list[list[tuple[int, int, int]]]:
    """NeMo 3.0's batched TDT greedy loop (tdt_label_looping.py `torch_impl`, as `transcribe` runs it):
    (token id, frame, reported duration) per token. The inner "skip blanks" loop re-reads the duration
    logits of every row at its current frame, and the tokens of this outer step are stored afterwards."""
    joint, prediction = model.module.joint, model.module.decoder
    table = torch.tensor(model.cfg.decoding.durations)
    n_dur, blank, max_symbols = len(table), model.cfg.blank_id, model.cfg.decoding.max_symbols
    with torch.inference_mode():
        encoded, lengths = model.encode([model.read(p) for p in paths])
        f = joint.project_encoder(encoded)  # (B, T, J)
        rows = torch.arange(len(paths))
        last = (lengths - 1).clamp(min=0)
        t = torch.zeros(len(paths), dtype=torch.long)
        h, c = prediction.initial_state(len(paths), "cpu", torch.float32)
        out, h, c = prediction.step(torch.full((len(paths),), blank), h, c)
        g = joint.project_prediction(out)
        tokens: list[list[tuple[int, int, int]]] = [[] for _ in paths]
        last_frame = torch.full((len(paths),), -1)
        on_frame = torch.zeros(len(paths), dtype=torch.long)
        active = t < lengths
        while active.any():
            was_active = active.clone()
            logits = joint.logits(f[rows, torch.minimum(t, last)], g)
            labels = logits[:, :-n_dur].argmax(-1)
            durations = table[logits[:, -n_dur:].argmax(-1)]
            durations = durations.masked_fill((durations == 0) & (labels == blank), 1)
            at = t.clone()
            t = t + durations * active
            active = t < lengths
            advance = active & (labels == blank)
            while advance.any():
                at = torch.where(advance, t, at)
                logits = joint.logits(f[rows, torch.minimum(t, last)], g)
                labels = torch.where(advance, logits[:, :-n_dur].argmax(-1), labels)
                durations = table[logits[:, -n_dur:].argmax(-1)]  # every row, not only the advancing ones
                durations = durations.masked_fill((durations == 0) & (labels == blank), 1)
                t = torch.where(advance, t + durations, t)
                active = t < lengths
                advance = active & (labels == blank)
            found = was_active & (labels != blank)
            for b in torch.nonzero(found).flatten().tolist():
                tokens[b].append((int(labels[b]), int(at[b]), int(durations[b])))
                on_frame[b] = on_frame[b] + 1 if last_frame[b] == at[b] else 1
                last_frame[b] = at[b]
            out, h2, c2 = prediction.step(labels.masked_fill(~found, blank), h, c)
            h, c = torch.where(found[None, :, None], h2, h), torch.where(found[None, :, None], c2, c)
            g = torch.where(found[:, None], joint.project_prediction(out), g)
            t = t + (active & found & (on_frame >= max_symbols) & (last_frame == t)).long()
            active = t < lengths
    return tokens


def _words_from(model, tokens: list[tuple[int, int, int]]):
    pieces = [model.tokenizer.piece(i) for i, _, _ in tokens]
    spans = [(f, f + d) for _, f, d in tokens]
    return words_and_segments(pieces, spans, model.tokenizer.decode_pieces, model.word_rules, True, model.frame_seconds)


def test_demo_reference_is_nemos_batch_of_four_and_ours_is_nemo_per_file(models, single):
    model = models["demo"]
    clips = REFERENCES["demo"]["clips"]
    alone_in_nemo = {}  # a batch of one clip is that clip alone: long_mix_62s's port (5.5 s) is not run twice
    for start in range(0, len(clips), NEMO_BATCH):  # the batches NeMo's transcribe() made
        group = clips[start : start + NEMO_BATCH]
        batched = _nemo_batched_tdt(model, [_clip_path(c["file"]) for c in group])
        if len(group) == 1:
            alone_in_nemo[group[0]["file"]] = batched[0]
        for clip, tokens in zip(group, batched):
            words, segments = _words_from(model, tokens)
            assert _words(words) == _nemo_words(clip), clip["file"]
            assert _segments(segments) == _nemo_segments(clip), clip["file"]
    differ = 0
    for clip in clips:
        path = _clip_path(clip["file"])
        alone = alone_in_nemo.get(clip["file"]) or _nemo_batched_tdt(model, [path])[0]
        ours = single("demo", path)
        assert [(t.id, t.frame, t.end_frame) for t in ours.tokens] == [(i, f, f + d) for i, f, d in alone]
        words = _words(ours.words)
        assert [w[:2] for w in words] == [w[:2] for w in _nemo_words(clip)]  # text and start never differ
        differ += words != _nemo_words(clip)
    assert differ == 4  # demo0-3, batched in NeMo; long_mix_62s was alone in its batch


# ============================================================================ part 4: RNN-T, and the rules by hand


# rnnt-tiny's tokens (NeMo's, fixtures/nemo-rnnt-tiny/reference.json) and the words NeMo's rules make of them.
# An RNN-T token spans [frame, frame + 1); no piece of these starts a word except `▁you` and `▁`.
RNNT_EXPECTED = {
    # `?` `D` `D` ... `N` at frames 16 x10, 17, 22, 22: no word start, so one word from the first token's
    # frame to one past the last token's; `?` is punctuation, so it joins the word being built.
    "espeak_fox.wav": ([("?DD?DD?DD?yNN", 16, 23)], [("?DD?DD?DD?yNN", 16, 23)]),
    # `` ` ` ` ▁you ` ` ` ▁you ` ` `` all at frame 0: each `▁you` closes the word before it.
    "short_2s.wav": ([("```", 0, 1), ("you```", 0, 1), ("you``", 0, 1)], [("``` you``` you``", 0, 1)]),
    # ten `▁` at frame 3: each starts a word whose text is empty; NeMo keeps all ten, and their segment
    # is the empty words joined by spaces.
    "quarter_second.wav": ([("", 3, 4)] * 10, [(" " * 9, 3, 4)]),
    # ten `-` (punctuation) at frame 42: the first starts the word, the others join it.
    "librispeech_2086-149220-0033.wav": ([("-" * 10, 42, 43)], [("-" * 10, 42, 43)]),
    "noise_3s.wav": ([("5yanyz", 14, 38)], [("5yanyz", 14, 38)]),
}


@pytest.fixture(scope="module")
def rnnt_model():
    return load_model(RNNT_PATH, device="cpu", graphs=False)


@pytest.mark.parametrize("name", RNNT_EXPECTED)
def test_rnnt_words_end_one_frame_after_their_last_token(rnnt_model, name):
    words, segments = RNNT_EXPECTED[name]
    [transcript] = rnnt_model.transcribe([CLIPS / name])
    assert [(w.word, w.start_frame, w.end_frame) for w in transcript.words] == words
    assert [(w.start, w.end) for w in transcript.words] == [(_seconds(s), _seconds(e)) for _, s, e in words]
    assert [(s.text, s.start_frame, s.end_frame) for s in transcript.segments] == segments
    assert [(t.start, t.end) for t in transcript.tokens] == [
        (_seconds(t.frame), _seconds(t.frame + 1)) for t in transcript.tokens
    ]


@pytest.fixture(scope="module")
def build(models):
    """pieces of tdt-tiny's vocabulary, frames, durations -> (text, start, end frames) of words and segments."""
    return lambda *args, **kwargs: _build(models["tdt-tiny"].tokenizer, *args, **kwargs)


def _build(tokenizer, pieces, frames, durations, tdt, segment_gap=None):
    rules = WordRules(tokenizer.punctuation, segment_gap=segment_gap)
    spans = [(f, f + (d if tdt else 1)) for f, d in zip(frames, durations)]
    words, segments = words_and_segments(pieces, spans, tokenizer.decode_pieces, rules, tdt, _seconds)
    return (
        [(w.word, w.start_frame, w.end_frame) for w in words],
        [(s.text, s.start_frame, s.end_frame) for s in segments],
    )


# "the won, is." with the comma 5 frames late (after a pause) and a full stop of duration 0.
PIECES = ["▁the", "▁w", "on", ",", "▁is", "."]
FRAMES = [0, 2, 3, 9, 10, 15]
DURATIONS = [2, 1, 1, 1, 2, 0]


def test_tdt_punctuation_moves_to_the_end_of_the_token_before(build):
    words, segments = build(PIECES, FRAMES, DURATIONS, tdt=True)
    # "," is pinned to the end of "on" (frame 4), "." to the end of "▁is" (12).
    assert words == [("the", 0, 2), ("won,", 2, 4), ("is.", 10, 12)]
    assert segments == [("the won, is.", 0, 12)]


def test_rnnt_punctuation_keeps_its_own_frame(build):
    words, segments = build(PIECES, FRAMES, DURATIONS, tdt=False)
    assert words == [("the", 0, 1), ("won,", 2, 10), ("is.", 10, 16)]
    assert segments == [("the won, is.", 0, 16)]


def test_segments_end_at_full_stops_question_and_exclamation_marks(build):
    pieces = ["▁is", "?", "▁the", "!", "▁w", "on", ".", "▁to"]
    words, segments = build(pieces, [0, 1, 2, 3, 4, 5, 6, 7], [1] * 8, tdt=False)
    assert [w for w, _, _ in words] == ["is?", "the!", "won.", "to"]
    assert segments == [("is?", 0, 2), ("the!", 2, 4), ("won.", 4, 7), ("to", 7, 8)]


def test_segment_gap_threshold_as_nemo_applies_it(build):
    # a gap of 5 frames or more ends a segment ...
    _, segments = build(["▁the", "▁w", "on", "▁is"], [0, 2, 3, 9], [1, 1, 1, 1], tdt=False, segment_gap=5)
    assert segments == [("the won", 0, 4), ("is", 9, 10)]
    # ... and, as in NeMo, with a threshold set a full stop ends a segment only as its first word.
    _, segments = build(["▁the", "▁is", ".", "▁to"], [0, 1, 2, 3], [1, 1, 1, 1], tdt=False, segment_gap=5)
    assert segments == [("the is. to", 0, 4)]
    _, segments = build(["▁the", "▁is", ".", "▁to"], [0, 1, 2, 3], [1, 1, 1, 1], tdt=False)
    assert segments == [("the is.", 0, 3), ("to", 3, 4)]


def test_no_tokens_no_words(build):
    assert build([], [], [], tdt=True) == ([], [])


# ============================================================================ GPU: graphs on and off


@pytest.mark.gpu
@pytest.mark.parametrize("graphs", [False, True])
def test_words_on_cuda_equal_nemos_with_graphs_on_and_off(graphs):
    for ref, checkpoint in (("tdt-tiny", TDT_PATH), ("demo", DEMO_PATH)):
        model = load_model(checkpoint, device="cuda", dtype="float32", graphs=graphs)
        cases = [name for r, name in _end_to_end_cases() if r == ref]
        for batch in (1, len(cases)):
            for name, transcript in zip(cases, model.transcribe([_clip_path(n) for n in cases], batch_size=batch)):
                clip = _clip(ref, name)
                assert _words(transcript.words) == _nemo_words(clip), (ref, name, batch)
                assert _segments(transcript.segments) == _nemo_segments(clip), (ref, name, batch)
