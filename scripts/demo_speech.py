"""Synthetic English speech for the bundled demo model: espeak-ng from Debian packages, text from fortunes.

    python scripts/demo_speech.py download  # once, where apt works: the .debs into .espeak/debs
    python scripts/demo_speech.py prepare   # then: build the sound-card stub, write .textdata/, test espeak-ng

Used by train_demo.py (on the lent GPU) and eval_demo.py (anywhere). Nothing here needs a
system-wide espeak-ng: the Debian packages in `.espeak/debs` are unpacked with `dpkg -x` into
`.espeak/root`, and espeak-ng runs from there with LD_LIBRARY_PATH and `--path`. libpcaudio
(espeak-ng's sound-card library) drags in PulseAudio, which a GPU machine lacks; espeak-ng only
writes to stdout here, so a silent stub of it (`.espeak/libpcaudio.so.0`, built from
`PCAUDIO_STUB_C` below) takes its place.

Text: sentences of the Debian `fortunes` packages, cleaned to plain words (no digits, no
acronyms, no abbreviations), 3 to 20 words; and random word sequences from `wamerican` and the
fortunes' own vocabulary. Transcripts are lower case words with apostrophes (`normalize`).
A fixed share of sentences and a few voice variants are held out of training.
"""

from __future__ import annotations

import argparse
import io
import itertools
import os
import random
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import wave
from collections import Counter
from dataclasses import dataclass
from multiprocessing import get_context
from pathlib import Path

import numpy as np
import torch
import torchaudio.functional as AF

ROOT = Path(__file__).resolve().parents[1]
ESPEAK_DIR = ROOT / ".espeak"  # git-ignored: debs/ (carried), root/ (unpacked), libpcaudio.so.0 (stub)
TEXT_DIR = ROOT / ".textdata"  # git-ignored: train.txt, heldout.txt, words.txt, real/ (carried)
ESPEAK_DEBS = ("espeak-ng", "espeak-ng-data", "libespeak-ng1", "libsonic0")
TEXT_DEBS = ("fortunes", "fortunes-min", "wamerican")
LIB_SUBDIR = "usr/lib/x86_64-linux-gnu"
ESPEAK_RATE = 22050  # Hz, espeak-ng's output
SAMPLE_RATE = 16000  # Hz, the model's
HELDOUT_SHARE = 0.05  # of the fortune sentences
MIN_WORDS, MAX_WORDS = 3, 20

# Accents: all in training (their pronunciation rules differ). Voice variants: some held out.
LANGUAGES = ("en-us", "en", "en-gb-scotland", "en-gb-x-gbclan", "en-gb-x-rp", "en-gb-x-gbcwmd", "en-029", "en-us-nyc")
HELDOUT_VARIANTS = ("m4", "f3", "Andrea", "steph2")
_ODD_VARIANTS = {"whisper", "whisperf", "Demonic", "UniRobot", "anikaRobot", "croak", "Mr serious"}

PCAUDIO_STUB_C = r"""
/* A silent stand-in for libpcaudio.so.0: espeak-ng writes to stdout here, never to a sound card. */
#include <stddef.h>
#include <errno.h>
struct audio_object;
struct audio_object *create_audio_device_object(const char *d, const char *a, const char *n) { return NULL; }
int audio_object_open(struct audio_object *o, int f, unsigned r, unsigned char c) { return ENODEV; }
void audio_object_close(struct audio_object *o) {}
void audio_object_destroy(struct audio_object *o) {}
int audio_object_write(struct audio_object *o, const void *d, size_t b) { return ENODEV; }
int audio_object_drain(struct audio_object *o) { return 0; }
int audio_object_flush(struct audio_object *o) { return 0; }
const char *audio_object_strerror(struct audio_object *o, int e) { return "no audio device (stub)"; }
"""


# ---------------------------------------------------------------------------- espeak-ng


def _debs(folder: Path, names) -> list[Path]:
    found = []
    for name in names:
        matches = sorted(folder.glob(f"{name}_*.deb"))
        if not matches:
            raise FileNotFoundError(f"{folder}: no {name}_*.deb (run `apt-get download {name}` there)")
        found.append(matches[-1])
    return found


def unpack_deb(deb: Path, dest: Path) -> None:
    """`dpkg -x deb dest`; where dpkg is missing, the same in Python (an ar archive holding data.tar.*)."""
    if shutil.which("dpkg"):
        subprocess.run(["dpkg", "-x", str(deb), str(dest)], check=True)
        return
    blob = deb.read_bytes()
    if not blob.startswith(b"!<arch>\n"):
        raise ValueError(f"{deb}: not a Debian package")
    pos = 8
    while pos + 60 <= len(blob):
        name, size = blob[pos : pos + 16].decode().strip().rstrip("/"), int(blob[pos + 48 : pos + 58])
        if name.startswith("data.tar"):
            with tarfile.open(fileobj=io.BytesIO(blob[pos + 60 : pos + 60 + size])) as tar:
                tar.extractall(dest, filter="data")
            return
        pos += 60 + size + size % 2
    raise ValueError(f"{deb}: no data.tar member")


def build_pcaudio_stub(out: Path) -> Path:
    """Compile the sound-card stub (needs a C compiler: done where the .debs are downloaded, then carried)."""
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "pcaudio_stub.c"
        src.write_text(PCAUDIO_STUB_C)
        subprocess.run(
            ["cc", "-O2", "-shared", "-fPIC", "-Wl,-soname,libpcaudio.so.0", "-o", str(out), str(src)], check=True
        )
    return out


def install_espeak(espeak_dir: Path = ESPEAK_DIR) -> Path:
    """Unpack the carried espeak-ng .debs into `espeak_dir/root` (once) and return that folder."""
    root = espeak_dir / "root"
    binary = root / "usr/bin/espeak-ng"
    if not binary.exists():
        root.mkdir(parents=True, exist_ok=True)
        for deb in _debs(espeak_dir / "debs", ESPEAK_DEBS):
            unpack_deb(deb, root)
        stub = espeak_dir / "libpcaudio.so.0"
        if not stub.exists():
            build_pcaudio_stub(stub)
        shutil.copy(stub, root / LIB_SUBDIR / "libpcaudio.so.0")
    lib = str(root / LIB_SUBDIR)
    check = subprocess.run(
        [str(binary), f"--path={lib}", "--stdout", "check"],
        capture_output=True,
        env=dict(os.environ, LD_LIBRARY_PATH=lib),
    )
    if check.returncode != 0 or len(check.stdout) < 1000:
        raise RuntimeError(f"{binary} does not run here: {check.stderr.decode(errors='replace').strip()}")
    return root


@dataclass(frozen=True)
class Voice:
    language: str
    variant: str
    rate: int  # words per minute
    pitch: int  # 0..99
    gap: int  # extra pause between words, 10 ms units

    @property
    def name(self) -> str:
        return f"{self.language}+{self.variant}"


def variants(root: Path) -> list[str]:
    folder = root / LIB_SUBDIR / "espeak-ng-data/voices/!v"
    return sorted(p.name for p in folder.iterdir() if p.is_file() and p.name not in _ODD_VARIANTS)


def random_voice(rng: random.Random, pool: list[str]) -> Voice:
    return Voice(
        language=rng.choice(LANGUAGES),
        variant=rng.choice(pool),
        rate=rng.randint(130, 220),
        pitch=rng.randint(30, 70),
        gap=rng.choice((0, 0, 0, 1, 2)),
    )


def voice_pools(root: Path) -> tuple[list[str], list[str]]:
    """(training variants, held-out variants)."""
    names = variants(root)
    held = [v for v in HELDOUT_VARIANTS if v in names]
    if len(held) < 2:
        raise RuntimeError(f"{root}: fewer than two of the held-out variants {HELDOUT_VARIANTS} exist")
    return [v for v in names if v not in held], held


def synthesize(root: Path, text: str, voice: Voice) -> np.ndarray:
    """text -> (L,) int16 samples at ESPEAK_RATE, as espeak-ng writes them."""
    lib = str(root / LIB_SUBDIR)
    env = dict(os.environ, LD_LIBRARY_PATH=lib + os.pathsep + os.environ.get("LD_LIBRARY_PATH", ""))
    cmd = [
        str(root / "usr/bin/espeak-ng"),
        f"--path={lib}",
        "-v",
        voice.name,
        "-s",
        str(voice.rate),
        "-p",
        str(voice.pitch),
        "-g",
        str(voice.gap),
        "--stdout",
        text,
    ]
    done = subprocess.run(cmd, env=env, capture_output=True)
    if done.returncode != 0:  # one odd sentence must not end a run of thousands: an empty clip is dropped later
        print(
            f"espeak-ng failed on {text!r} ({voice.name}): {done.stderr.decode(errors='replace').strip()}",
            file=sys.stderr,
            flush=True,
        )
        return np.zeros(0, dtype=np.int16)
    return np.frombuffer(done.stdout[44:], dtype="<i2").copy()  # a streamed WAV: 44-byte header, then the samples


def to_model_rate(clips: list[np.ndarray], device, chunk_seconds: float = 600.0) -> list[torch.Tensor]:
    """int16 clips at ESPEAK_RATE -> float32 (L,) tensors at SAMPLE_RATE on `device`, resampled in long runs.

    Clips are laid end to end with silent gaps wider than the resampling filter, so one call
    resamples many of them; each is cut back out at its own position.
    """
    gap = 256  # samples of silence between clips, > the filter's reach (about 30 input samples)
    out: list[torch.Tensor] = []
    i = 0
    while i < len(clips):
        group, total = [], 0
        while i < len(clips) and (not group or total < chunk_seconds * ESPEAK_RATE):
            group.append(clips[i])
            total += len(clips[i]) + gap
            i += 1
        flat = np.zeros(total + gap, dtype=np.int16)
        starts, pos = [], gap
        for clip in group:
            flat[pos : pos + len(clip)] = clip
            starts.append(pos)
            pos += len(clip) + gap
        signal = torch.from_numpy(flat).to(device).float() / 32768.0
        resampled = AF.resample(signal, ESPEAK_RATE, SAMPLE_RATE)
        for clip, start in zip(group, starts):
            a = start * SAMPLE_RATE // ESPEAK_RATE
            out.append(resampled[a : a + len(clip) * SAMPLE_RATE // ESPEAK_RATE].clone())
    return out


def _synth_job(job):
    root, text, voice = job
    return synthesize(root, text, voice)


def synthesize_many(root: Path, texts: list[str], voices: list[Voice], workers: int) -> list[np.ndarray]:
    """Synthesise in `workers` processes; returns the int16 clips in order."""
    jobs = [(root, t, v) for t, v in zip(texts, voices)]
    if workers <= 1:
        return [_synth_job(j) for j in jobs]
    with get_context("fork").Pool(workers) as pool:
        return pool.map(_synth_job, jobs, chunksize=8)


def start_synthesis(root: Path, texts: list[str], voices: list[Voice], workers: int):
    """Begin synthesis in `workers` forked processes: returns (pool, iterator of int16 clips in order).

    Fork before CUDA is initialised in the parent.
    """
    pool = get_context("fork").Pool(workers)
    return pool, pool.imap(_synth_job, [(root, t, v) for t, v in zip(texts, voices)], chunksize=16)


# ---------------------------------------------------------------------------- text

_ABBREVIATIONS = {
    "mr",
    "mrs",
    "ms",
    "dr",
    "st",
    "jr",
    "sr",
    "vs",
    "etc",
    "inc",
    "ltd",
    "co",
    "prof",
    "gen",
    "rev",
    "ca",
    "eg",
    "ie",
    "am",
    "pm",
}
_ALLOWED = re.compile(r"^[A-Za-z ,;:'\"!?.\-]+$")


def normalize(text: str) -> str:
    """Transcript form: lower case words, apostrophes kept inside words, everything else a space."""
    text = text.lower().replace("-", " ")
    text = re.sub(r"[^a-z' ]", " ", text)
    words = [w.strip("'") for w in text.split()]
    return " ".join(w for w in words if w)


def _clean_sentence(sentence: str) -> str | None:
    """A speakable sentence with an unambiguous transcript, or None."""
    sentence = " ".join(sentence.split()).strip(" -\"'")
    if not sentence or not _ALLOWED.match(sentence) or "--" in sentence or "''" in sentence:
        return None
    words = sentence.split()
    if not MIN_WORDS <= len(words) <= MAX_WORDS:
        return None
    for raw in words:
        word = raw.strip(",;:!?.\"'-")
        bare = word.lower().replace("'", "")
        if not word or bare in _ABBREVIATIONS:
            return None
        if len(word) > 1 and word.isupper():  # acronyms are spelled out by espeak-ng
            return None
        if len(bare) == 1 and bare not in ("a", "i"):  # single letters: spelled, ambiguous
            return None
    if sentence.count('"') % 2:
        return None
    return sentence if sentence[-1] in ".!?" else sentence + "."


def fortune_sentences(folder: Path) -> list[str]:
    """Sentences of all fortune cookie files under `folder`, cleaned, de-duplicated, in a stable order."""
    seen, out = set(), []
    for path in sorted(folder.iterdir()):
        if not path.is_file() or path.suffix in (".dat", ".u8") or path.is_symlink():
            continue
        text = path.read_text(encoding="latin-1")
        for cookie in text.split("\n%\n"):
            lines = [ln for ln in cookie.splitlines() if not ln.lstrip().startswith("--")]  # attributions
            flat = " ".join(" ".join(lines).split())
            for piece in re.split(r"(?<=[.!?])\s+", flat):
                sentence = _clean_sentence(piece)
                key = sentence and normalize(sentence)
                if sentence and key not in seen:
                    seen.add(key)
                    out.append(sentence)
    return out


def dictionary_words(path: Path) -> list[str]:
    words = []
    for line in path.read_text(encoding="utf-8", errors="ignore").splitlines():
        if re.fullmatch(r"[a-z]{2,12}", line):
            words.append(line)
    return words


def random_word_sentences(
    rng: random.Random, n: int, common: list[str], weights: list[float], dictionary: list[str]
) -> list[str]:
    """Word sequences of 4..12 words: half common words (by frequency), half dictionary words (uniform)."""
    cum = list(itertools.accumulate(weights))
    out = []
    for _ in range(n):
        k = rng.randint(4, 12)
        frequent = rng.choices(common, cum_weights=cum, k=k)
        out.append(" ".join(rng.choice(dictionary) if rng.random() < 0.5 else w for w in frequent))
    return out


def prepare_text(debs: Path, out: Path, seed: int = 0) -> dict:
    """Unpack the text .debs, write out/train.txt, heldout.txt (one sentence a line) and words.txt (word\\tcount)."""
    with tempfile.TemporaryDirectory() as tmp:
        for deb in _debs(debs, TEXT_DEBS):
            unpack_deb(deb, Path(tmp))
        sentences = fortune_sentences(Path(tmp) / "usr/share/games/fortunes")
        dictionary = dictionary_words(Path(tmp) / "usr/share/dict/american-english")
    rng = random.Random(seed)
    rng.shuffle(sentences)
    n_held = int(len(sentences) * HELDOUT_SHARE)
    held, train = sentences[:n_held], sentences[n_held:]
    counts = Counter(w for s in train for w in normalize(s).split())
    out.mkdir(parents=True, exist_ok=True)
    (out / "train.txt").write_text("\n".join(train) + "\n")
    (out / "heldout.txt").write_text("\n".join(held) + "\n")
    (out / "words.txt").write_text("".join(f"{w}\t{c}\n" for w, c in counts.most_common()))
    (out / "dictionary.txt").write_text("\n".join(dictionary) + "\n")
    return {"train": len(train), "heldout": len(held), "vocabulary": len(counts), "dictionary": len(dictionary)}


@dataclass
class TextData:
    train: list[str]
    heldout: list[str]
    common: list[str]
    weights: list[float]
    dictionary: list[str]


def load_text(folder: Path = TEXT_DIR) -> TextData:
    lines = lambda name: [ln for ln in (folder / name).read_text().splitlines() if ln.strip()]  # noqa: E731
    pairs = [ln.split("\t") for ln in lines("words.txt")]
    return TextData(
        train=lines("train.txt"),
        heldout=lines("heldout.txt"),
        common=[w for w, _ in pairs],
        weights=[float(c) for _, c in pairs],
        dictionary=lines("dictionary.txt"),
    )


def write_wav(path: Path, samples, rate: int = SAMPLE_RATE) -> None:
    """float samples in [-1, 1] -> 16-bit mono WAV (stdlib only)."""
    data = (np.clip(np.asarray(samples, dtype=np.float32), -1.0, 1.0) * 32767.0).round().astype("<i2")
    with wave.open(str(path), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(data.tobytes())


# ---------------------------------------------------------------------------- scoring


def word_errors(ref: str, hyp: str) -> tuple[int, int]:
    """(edit distance in words, reference words) of normalised texts."""
    r, h = normalize(ref).split(), normalize(hyp).split()
    row = list(range(len(h) + 1))
    for i, rw in enumerate(r, 1):
        prev, row[0] = row[0], i
        for j, hw in enumerate(h, 1):
            prev, row[j] = row[j], min(row[j] + 1, row[j - 1] + 1, prev + (rw != hw))
    return row[len(h)], len(r)


def word_error_rate(refs: list[str], hyps: list[str]) -> float:
    errors = words = 0
    for ref, hyp in zip(refs, hyps):
        e, n = word_errors(ref, hyp)
        errors, words = errors + e, words + n
    return errors / max(words, 1)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("command", choices=["download", "prepare"])
    args = parser.parse_args(argv)
    if args.command == "download":
        folder = ESPEAK_DIR / "debs"
        folder.mkdir(parents=True, exist_ok=True)
        subprocess.run(["apt-get", "download", *ESPEAK_DEBS, *TEXT_DEBS], cwd=folder, check=True)
        return 0
    if args.command == "prepare":
        stub = ESPEAK_DIR / "libpcaudio.so.0"
        if not stub.exists():
            build_pcaudio_stub(stub)
        print("text:", prepare_text(ESPEAK_DIR / "debs", TEXT_DIR))
        real = TEXT_DIR / "real"
        real.mkdir(exist_ok=True)
        for clip in sorted((ROOT.parent / "shared" / "audio").glob("*")):
            shutil.copy(clip, real / clip.name)
        root = install_espeak()
        train, held = voice_pools(root)
        clip = synthesize(root, "hello world", Voice("en-us", train[0], 170, 50, 0))
        print(
            f"espeak-ng: {root}; {len(train)} training variants, held out {held}; "
            f"'hello world' is {len(clip) / ESPEAK_RATE:.2f} s"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
