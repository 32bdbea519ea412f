"""Audio in: formats, rates and channels people have; bad files fail alone, with a reason.

Inputs are written with soundfile from the NeMo fixture clip; where the samples are
bit-identical to the original, the tokens must be NeMo's.
"""

from __future__ import annotations

import io
import itertools
import json
import os
import re
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
import torch
import torchaudio.functional as AF
from av_media import write_media
from conftest import CLIP_NAMES, CLIPS, JFK_FLAC, NEMO_PATH, SPEECH_CLIP, reference_clip

from graphscribe.io import audio
from graphscribe.io.audio import AudioError, audio_seconds, find_audio_files, load_audio, prepare_audio

RATE = 16000  # Hz, the model's
SECONDS = reference_clip(SPEECH_CLIP.name)["samples"] / RATE  # 7.435 s


def _bandlimited_resample(x: np.ndarray, rate: int, target: int) -> np.ndarray:
    """The ideal resampler, as a reference independent of torchaudio's: x's spectrum cut (or zero-padded) to the
    target's band, periodic at the ends."""
    n = len(x)
    m = round(n * target / rate)
    spectrum = np.fft.rfft(x)
    kept = min(len(spectrum), m // 2 + 1)
    out = np.zeros(m // 2 + 1, dtype=complex)
    out[:kept] = spectrum[:kept]
    return np.fft.irfft(out, m) * m / n


def _relative_error_inside(ours: np.ndarray, reference: np.ndarray, edge: int = 1600) -> float:
    """Relative L2 error away from the first and last `edge` samples (where the reference is periodic)."""
    n = min(len(ours), len(reference))
    diff = ours[edge : n - edge] - reference[edge : n - edge]
    return float(np.linalg.norm(diff) / np.linalg.norm(reference[edge : n - edge]))


@pytest.fixture(scope="module")
def pcm16() -> np.ndarray:
    data, rate = sf.read(SPEECH_CLIP, dtype="int16")
    assert rate == RATE and data.ndim == 1
    return data


@pytest.fixture(scope="module")
def samples() -> np.ndarray:
    return sf.read(SPEECH_CLIP, dtype="float32")[0]


# Lossless 16 kHz variants: written from the 16-bit source, they read back as the same float32 samples.
LOSSLESS = [
    ("wav", "PCM_16"),
    ("wav", "PCM_24"),
    ("wav", "PCM_32"),
    ("wav", "FLOAT"),
    ("wav", "DOUBLE"),
    ("flac", "PCM_24"),
    ("flac", "PCM_16"),
]


@pytest.mark.parametrize("suffix,subtype", LOSSLESS, ids=[f"{s}-{t}" for s, t in LOSSLESS])
def test_lossless_formats_give_nemo_tokens(model, speech_ids, tmp_path, pcm16, samples, suffix, subtype):
    path = tmp_path / f"clip_{subtype}.{suffix}"
    data = pcm16 if subtype in ("PCM_16", "PCM_24", "PCM_32") else samples
    sf.write(path, data, RATE, subtype=subtype)
    loaded = load_audio(path, RATE)
    assert loaded.dtype == torch.float32
    assert np.array_equal(loaded.numpy(), samples)  # bit-identical, so the tokens must be NeMo's
    [transcript] = model.transcribe([path])
    assert transcript.error is None
    assert transcript.token_ids == speech_ids


LOSSY_OR_CONVERTED = [("wav", "PCM_U8"), ("ogg", "VORBIS"), ("mp3", "MPEG_LAYER_III")]


@pytest.mark.parametrize("suffix,subtype", LOSSY_OR_CONVERTED, ids=[s for _, s in LOSSY_OR_CONVERTED])
def test_lossy_formats_transcribe(model, tmp_path, samples, suffix, subtype):
    if subtype not in sf.available_subtypes(suffix.upper()):
        pytest.skip(f"this libsndfile cannot write {suffix} {subtype}")
    path = tmp_path / f"clip.{suffix}"
    sf.write(path, samples, RATE, subtype=subtype)
    loaded = load_audio(path, RATE).numpy()
    n = min(len(loaded), len(samples))
    assert np.corrcoef(loaded[:n], samples[:n])[0, 1] > 0.99  # the source, aligned, with the codec's loss
    [transcript] = model.transcribe([path])
    assert transcript.error is None, transcript.error
    assert transcript.audio_seconds == pytest.approx(SECONDS, abs=0.1)  # MP3 pads by a frame or so


@pytest.mark.parametrize("rate", [48000, 8000, 44100])
def test_other_rates_are_resampled(model, tmp_path, samples, rate):
    resampled = AF.resample(torch.from_numpy(samples), RATE, rate).numpy()
    path = tmp_path / f"clip_{rate}.wav"
    sf.write(path, resampled, rate, subtype="FLOAT")
    loaded = load_audio(path, RATE)
    assert loaded.numel() / RATE == pytest.approx(SECONDS, abs=0.01)
    # back at 16 kHz: the source, less what an 8 kHz file cannot hold (above 4 kHz, and the filters' roll-off)
    expected = samples if rate > RATE else _bandlimited_resample(_bandlimited_resample(samples, RATE, rate), rate, RATE)
    assert _relative_error_inside(loaded.numpy(), expected) < (0.01 if rate > RATE else 0.1)
    [transcript] = model.transcribe([path])
    assert transcript.error is None
    assert transcript.audio_seconds == pytest.approx(SECONDS, abs=0.01)


def test_stereo_with_the_same_signal_gives_nemo_tokens(model, speech_ids, tmp_path, pcm16):
    path = tmp_path / "stereo.wav"
    sf.write(path, np.stack([pcm16, pcm16], axis=1), RATE, subtype="PCM_16")
    assert sf.info(path).channels == 2
    [transcript] = model.transcribe([path])
    assert transcript.error is None
    assert transcript.token_ids == speech_ids


def test_six_channels_are_mixed_down(model, speech_ids, tmp_path, samples):
    path = tmp_path / "six.wav"
    sf.write(path, np.stack([samples] * 6, axis=1), RATE, subtype="FLOAT")
    loaded = load_audio(path, RATE)
    assert loaded.shape == (len(samples),)
    assert np.array_equal(loaded.numpy(), samples)  # the mean of six equal 16-bit values is exact in float32
    [transcript] = model.transcribe([path])
    assert transcript.error is None and transcript.token_ids == speech_ids


def test_jfk_flac_44k1_stereo_24bit(model):
    info = sf.info(JFK_FLAC)
    assert (info.samplerate, info.channels, info.subtype) == (44100, 2, "PCM_24")
    audio = load_audio(JFK_FLAC, RATE)
    assert audio.ndim == 1 and audio.dtype == torch.float32
    assert audio.numel() / RATE == pytest.approx(11.0, abs=0.01)
    stereo = sf.read(JFK_FLAC, dtype="float64")[0]  # (L, 2)
    assert _relative_error_inside(audio.numpy(), _bandlimited_resample(stereo.mean(axis=1), 44100, RATE)) < 0.01
    [transcript] = model.transcribe([JFK_FLAC])
    assert transcript.error is None
    assert transcript.audio_seconds == pytest.approx(11.0, abs=0.01)


# ---------------------------------------------------------------------------- bad input


def _write_bad_files(folder, pcm16) -> dict[str, tuple[object, tuple[str, ...]]]:
    """name -> (path, words one of which the error must contain)."""
    bad = {}
    bad["missing"] = (folder / "missing.wav", ("no such file", "not found", "does not exist"))
    text = folder / "notes.wav"
    text.write_text("these are meeting notes, not audio\n" * 20)
    bad["text_as_wav"] = (text, ("not a readable audio", "not audio", "format"))
    header_only = folder / "header_only.wav"
    sf.write(header_only, pcm16, RATE, subtype="PCM_16")
    header_only.write_bytes(header_only.read_bytes()[:30])  # cut inside the header
    bad["cut_in_header"] = (header_only, ("not a readable audio", "truncated", "corrupt"))
    noise = folder / "noise.flac"
    noise.write_bytes(np.random.default_rng(0).bytes(4096))
    bad["random_bytes_flac"] = (noise, ("not a readable audio file (unknown format or corrupt data)",))
    noise_mp3 = folder / "noise.mp3"
    noise_mp3.write_bytes(np.random.default_rng(1).bytes(4096))
    bad["random_bytes_mp3"] = (noise_mp3, ("not a readable audio file (unknown format or corrupt data)",))
    empty = folder / "empty.wav"
    sf.write(empty, np.zeros(0, np.int16), RATE, subtype="PCM_16")
    bad["zero_samples"] = (empty, ("no samples", "empty"))
    nan = folder / "nan.wav"
    x = (pcm16 / 32768).astype(np.float32)
    x[1000] = np.nan
    sf.write(nan, x, RATE, subtype="FLOAT")
    bad["nan"] = (nan, ("nan",))
    inf = folder / "inf.wav"
    x[1000] = np.inf
    sf.write(inf, x, RATE, subtype="FLOAT")
    bad["inf"] = (inf, ("infinite", "inf"))
    return bad


def test_bad_files_fail_alone_with_a_reason(model, reference, tmp_path, pcm16):
    bad = _write_bad_files(tmp_path, pcm16)
    good = [CLIPS / clip["file"] for clip in reference["clips"]]
    pairs = itertools.zip_longest([path for path, _ in bad.values()], good)
    items = [item for pair in pairs for item in pair if item is not None]  # bad and good interleaved
    results = model.transcribe(items, batch_size=3)
    assert len(results) == len(items)
    by_path = {str(p): t for p, t in zip(items, results)}
    for name, (path, words) in bad.items():
        transcript = by_path[str(path)]
        assert transcript.error is not None, f"{name}: no error"
        assert path.name in transcript.error, f"{name}: {transcript.error!r} does not name the file"
        assert any(w in transcript.error.lower() for w in words), f"{name}: {transcript.error!r}"
        assert "\n" not in transcript.error
        assert transcript.token_ids == [] and transcript.text == ""
    for clip in reference["clips"]:
        transcript = by_path[str(CLIPS / clip["file"])]
        assert transcript.error is None
        assert transcript.token_ids == clip["token_ids"]
        assert transcript.text == clip["text"]


SHORT = json.loads((Path(__file__).parent / "fixtures" / "nemo-short" / "reference.json").read_text())


def test_clips_shorter_than_an_encoder_frame_give_nemo_results(model, speech_ids, tmp_path, pcm16):
    """1 to 1280 samples: NeMo's feature and encoder frames, and its tokens (none without a feature frame),
    alone and padded in one batch with speech."""
    paths = []
    for clip in SHORT["clips"]:
        paths.append(tmp_path / f"cut_{clip['samples']:04d}.wav")
        sf.write(paths[-1], pcm16[SHORT["offset"] : SHORT["offset"] + clip["samples"]], RATE, subtype="PCM_16")
    assert {c["feature_frames"] for c in SHORT["clips"]} >= {0, 1} and {
        c["encoder_frames"] for c in SHORT["clips"]
    } == {0, 1}
    for path, clip in zip(paths, SHORT["clips"]):
        audio = model.read(path)
        _, feature_frames = model.features([audio])
        _, encoder_frames = model.encode([audio])
        assert (int(feature_frames[0]), int(encoder_frames[0])) == (clip["feature_frames"], clip["encoder_frames"])
    for batch in (1, len(paths) + 1):
        *short, speech = model.transcribe([*paths, SPEECH_CLIP], batch_size=batch)
        assert speech.token_ids == speech_ids
        for transcript, clip in zip(short, SHORT["clips"]):
            assert transcript.error is None, transcript.error
            assert (transcript.token_ids, transcript.text) == (clip["token_ids"], clip["text"]), clip["samples"]


def test_a_fifo_is_not_read(model, tmp_path):
    fifo = tmp_path / "stream.wav"
    os.mkfifo(fifo)
    [transcript] = model.transcribe([fifo])  # would block forever if opened
    assert transcript.error == f"{fifo}: not a regular file"


def test_a_folder_is_not_a_file(model, tmp_path):
    [transcript] = model.transcribe([tmp_path])
    assert transcript.error is not None and tmp_path.name in transcript.error and "folder" in transcript.error


def test_truncated_wav_is_an_error(model, speech_ids, tmp_path, pcm16):
    path = tmp_path / "half.wav"
    sf.write(path, pcm16, RATE, subtype="PCM_16")
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])  # the header still says 7.4 s
    results = model.transcribe([path, SPEECH_CLIP])
    assert results[1].error is None and results[1].token_ids == speech_ids
    assert results[0].error is not None
    assert path.name in results[0].error and "truncated" in results[0].error.lower()


@pytest.mark.parametrize(
    "array,words",
    [
        (np.zeros(0, np.float32), ("no samples",)),
        (np.array([0.0, np.nan] * 4000, np.float32), ("nan",)),
        (np.zeros((4000, 2, 2), np.float32), ("shape",)),
    ],
    ids=["empty", "nan", "3d"],
)
def test_bad_arrays_fail_alone(model, speech_ids, samples, array, words):
    bad, good = model.transcribe([array, samples])
    assert bad.error is not None and any(w in bad.error.lower() for w in words), bad.error
    assert good.error is None and good.token_ids == speech_ids


def test_channel_first_arrays_give_the_channel_last_text(model, speech_ids, samples):
    """(C, L), as torchaudio.load gives, reads as (L, C): channels averaged, as a file's are."""
    mono = torch.from_numpy(samples)
    stereo = torch.stack([mono, 0.5 * mono])  # (2, L)
    first_mono, last_mono, first_stereo, last_stereo = model.transcribe(
        [mono[None, :], mono[:, None], stereo, stereo.T]
    )
    assert first_mono.token_ids == last_mono.token_ids == speech_ids
    assert first_stereo.text == last_stereo.text and first_stereo.text
    for transcript in (first_mono, last_mono, first_stereo, last_stereo):
        assert transcript.error is None and transcript.audio_seconds == pytest.approx(SECONDS)


def test_an_array_with_more_than_8_channels_either_way_is_refused(model, samples):
    wide = np.zeros((9, 16000), np.float32)
    for array in (wide, wide.T):
        [transcript] = model.transcribe([array])
        assert transcript.error == (
            "<array>: audio must be (samples,), (samples, channels) or (channels, samples) with at most 8 channels, "
            f"got shape {array.shape}"
        )


def test_load_audio_raises_audio_error(tmp_path):
    with pytest.raises(AudioError, match="missing.wav"):
        load_audio(tmp_path / "missing.wav", RATE)


def test_out_of_memory_splits_the_batch_and_names_the_file(monkeypatch):
    """A batch that does not fit is retried one file at a time; a file that alone does not fit gets one line."""
    from graphscribe.api import load_model

    model = load_model(NEMO_PATH, device="cpu", graphs=False)
    encoder_output = model.encoder_output
    longest = max(reference_clip(n)["feature_frames"] for n in CLIP_NAMES)

    def tight_memory(features, frames, *window):
        if len(frames) > 1 or int(frames[0]) == longest:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 64.00 GiB")
        return encoder_output(features, frames, *window)

    monkeypatch.setattr(model, "encoder_output", tight_memory)
    got = model.transcribe([CLIPS / n for n in CLIP_NAMES], batch_size=3)
    for name, transcript in zip(CLIP_NAMES, got):
        ref = reference_clip(name)
        if ref["feature_frames"] == longest:
            assert transcript.error and name in transcript.error and "memory" in transcript.error
        else:
            assert transcript.error is None and transcript.token_ids == ref["token_ids"]


# ---------------------------------------------------------------------------- FFmpeg (PyAV): what libsndfile cannot read

HELDOUT_CLIP = Path(__file__).parent / "fixtures" / "demo-heldout" / "heldout_01.wav"  # 5.4 s, 16 kHz mono


@pytest.fixture(scope="module")
def heldout() -> np.ndarray:
    data, rate = sf.read(HELDOUT_CLIP, dtype="float32")
    assert rate == RATE and data.ndim == 1
    return data


@pytest.mark.parametrize("subtype", ["PCM_U8", "PCM_16", "PCM_24", "PCM_32", "FLOAT", "DOUBLE"])
def test_ffmpeg_reads_a_file_as_libsndfile_does(tmp_path, heldout, subtype):
    """The same 48 kHz stereo WAV through both readers: the same samples, bit for bit (scaling, channel mean and
    resampler are shared)."""
    upsampled = AF.resample(torch.from_numpy(heldout), RATE, 48000).numpy()
    path = tmp_path / "stereo48k.wav"
    sf.write(path, np.stack([upsampled, 0.01 - 0.3 * upsampled], axis=1), 48000, subtype=subtype)
    samples, rate = audio._read_ffmpeg(path, path.name, "", audio.MAX_AUDIO_SECONDS)
    assert rate == 48000
    assert np.array_equal(prepare_audio(samples, rate, RATE).numpy(), load_audio(path, RATE).numpy())


CONTAINERS = [  # name, codec, codec rate, layout, video codec
    ("clip.m4a", "aac", 44100, "mono", None),
    ("clip.mp4", "aac", 48000, "stereo", "libx264"),
    ("clip.webm", "libopus", 48000, "mono", None),
    ("clip.mkv", "libmp3lame", 22050, "stereo", "mpeg4"),
    ("clip.mov", "pcm_s16le", 16000, "mono", "mpeg4"),
]


@pytest.mark.parametrize("name,codec,rate,layout,video", CONTAINERS, ids=[c[0] for c in CONTAINERS])
def test_ffmpeg_containers_load_at_the_model_rate(tmp_path, heldout, name, codec, rate, layout, video):
    path = write_media(tmp_path / name, heldout, RATE, codec, rate, layout, video)
    with pytest.raises(sf.LibsndfileError):
        sf.info(path)  # FFmpeg's to read
    loaded = load_audio(path, RATE)
    assert loaded.dtype == torch.float32 and loaded.ndim == 1
    assert loaded.numel() == pytest.approx(len(heldout), abs=0.05 * RATE)  # encoder padding is trimmed
    n = min(loaded.numel(), len(heldout))
    assert np.corrcoef(loaded.numpy()[:n], heldout[:n])[0, 1] > 0.9  # the same sound, in time
    assert audio_seconds(path) == pytest.approx(len(heldout) / RATE, abs=0.2)
    if codec == "pcm_s16le":  # lossless at the model's rate: the WAV's samples
        assert np.array_equal(loaded.numpy(), heldout)


def test_a_video_without_audio_is_one_line(tmp_path):
    path = write_media(tmp_path / "silent-film.mp4", None, RATE, None, video="libx264", seconds=1.0)
    with pytest.raises(AudioError) as raised:
        load_audio(path, RATE)
    assert str(raised.value) == f"{path}: no audio track"


def test_corrupt_media_is_one_line(tmp_path, heldout):
    good = write_media(tmp_path / "good.m4a", heldout, RATE, "aac", 44100)
    data = bytearray(good.read_bytes())
    start = data.index(b"mdat") + 100
    data[start : start + 4000] = np.random.default_rng(0).bytes(4000)
    damaged = tmp_path / "damaged.m4a"
    damaged.write_bytes(bytes(data))
    cut = tmp_path / "cut.mp4"
    cut.write_bytes(
        write_media(tmp_path / "whole.mp4", heldout, RATE, "aac", 48000, video="libx264").read_bytes()[:5000]
    )
    for path, words in [(damaged, "corrupt data"), (cut, "unknown format or corrupt data")]:
        with pytest.raises(AudioError) as raised:
            load_audio(path, RATE)
        message = str(raised.value)
        assert message.startswith(f"{path}: not a readable audio file (") and words in message, message
        assert "\n" not in message


@pytest.mark.parametrize("live", [False, True], ids=["duration-in-header", "live-stream"])
def test_decoded_length_is_capped(tmp_path, heldout, live):
    """A compressed file may claim hours from a few bytes: refused from its header, or while decoding where the
    header has no duration (a live stream's)."""
    path = write_media(tmp_path / "clip.webm", heldout, RATE, "libopus", 48000, live_format="webm" if live else None)
    load_audio(path, RATE)
    length = r"over 2 s of audio, the most" if live else r"5\.\d+ s of audio, over the 2 s"
    with pytest.raises(AudioError, match=rf"clip\.webm: {length} one file may hold \(--max-audio-hours\); split it$"):
        load_audio(path, RATE, max_seconds=2.0)


def test_stdin_is_read_whole_and_named_dash(monkeypatch, heldout, tmp_path):
    path = write_media(tmp_path / "clip.m4a", heldout, RATE, "aac", 44100)
    for source in (HELDOUT_CLIP, path):  # libsndfile's, then FFmpeg's
        monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(source.read_bytes())))
        loaded = load_audio("-", RATE)
        assert loaded.numel() == pytest.approx(len(heldout), abs=0.05 * RATE)
        if source == HELDOUT_CLIP:
            assert np.array_equal(loaded.numpy(), heldout)
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(b"not audio at all" * 100)))
    with pytest.raises(AudioError, match=r"^-: not a readable audio file \(unknown format or corrupt data\)$"):
        load_audio("-", RATE)
    monkeypatch.setattr(audio, "MAX_STDIN_BYTES", 1000)
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(HELDOUT_CLIP.read_bytes())))
    with pytest.raises(AudioError, match=r"^-: standard input holds over 1,000 bytes; save it to a file$"):
        load_audio("-", RATE)


@pytest.mark.parametrize(
    "given,url",
    [
        ("https://example.com/talk.m4a", "https://example.com/talk.m4a"),
        (Path("https://example.com/talk.m4a"), "https://example.com/talk.m4a"),  # a Path keeps one slash
        ("HTTP://example.com", "HTTP://example.com"),
        ("s3://bucket/key.wav", "s3://bucket/key.wav"),
        ("talk.wav", None),
        ("http_talk.wav", None),
        ("notes:1.wav", None),
    ],
)
def test_urls_are_named_not_read(given, url):
    assert audio.url_of(given) == url
    if url is not None:
        with pytest.raises(AudioError, match=f"^{re.escape(url)}: URLs are not read; download the file first"):
            load_audio(given, RATE)


def test_folders_include_ffmpeg_formats(tmp_path):
    for name in ("a.m4a", "b.WEBM", "c.mp4", "d.mkv", "e.wav", "f.txt", "g.jpg"):
        (tmp_path / name).write_bytes(b"")
    assert [p.name for p in find_audio_files(tmp_path)] == ["a.m4a", "b.WEBM", "c.mp4", "d.mkv", "e.wav"]
