#!/usr/bin/env python
"""The demo model's decoding tables: greedy, beam 4, beam 4 with an n-gram LM (issue 49); rare-word boosting (50).

    python scripts/eval_decoding.py [--out bench/2026-11-demo-decoding] [--model src/graphscribe/data/demo.nemo]
    python scripts/eval_decoding.py --only confidence   # greedy word confidences against the wrong words

Needs `python scripts/demo_speech.py prepare` first. All on the CPU (`device="cpu"`, float32).

Utterances (espeak-ng, held-out voice variants, sentences never in training):
- **test**: the 400 held-out utterances of the demo model's training run (`train_demo.make_jobs`, seed 0), the
  set whose greedy WER the README gives (4.72%).
- **dev**: every other held-out sentence, one held-out voice each (voices from `random.Random("decoding/dev")`).
  Used for the LM's order and weight (its first `--dev-lm` utterances) and to choose the rare words (all of it).
- **recall**: every held-out sentence holding one of the chosen rare words, spoken again by `--recall-voices` new
  held-out voices (`random.Random("decoding/recall")`): other utterances than those the words were chosen on.

The LM: `scripts/build_lm.py` over `.textdata/train.txt` (the fortune sentences of training) written as the model
writes text (`demo_speech.normalize`). Its order and weight: the lowest beam-4 WER on the dev utterances.

The rare words (`rare_words`): words of the dev references that greedy misses there (fewer in the hypothesis than
in the reference), of at least MIN_LETTERS letters, no apostrophe; the RARE_WORDS of them least frequent in the
training text (ties: alphabetical). Their recall is measured on the recall utterances without and with boosting;
the WER without them on the test utterances whose references hold none of them.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from collections import Counter
from pathlib import Path

import build_lm  # scripts/, beside this one
import demo_speech as speech
import train_demo

import graphscribe as gs

ROOT = Path(__file__).resolve().parents[1]
DEMO = ROOT / "src/graphscribe/data/demo.nemo"
BEAM = 4
LM_ORDERS = (3, 5)
LM_WEIGHTS = (0.2, 0.4, 0.6, 0.8)
BOOSTS = (1.0, 2.0, 4.0)
RARE_WORDS = 20
MIN_LETTERS = 4


class Clips:
    """Held-out utterances: references and 16 kHz float32 samples."""

    def __init__(self, name: str, root: Path, sentences: list[str], voices: list, workers: int):
        self.name, self.sentences, self.voices = name, sentences, voices
        raw = speech.synthesize_many(root, sentences, voices, workers)
        self.audio = [c.numpy() for c in speech.to_model_rate(raw, "cpu")]
        self.refs = [speech.normalize(s) for s in sentences]

    def subset(self, keep: list[int]) -> "Clips":
        out = object.__new__(Clips)
        out.name, out.sentences, out.voices = (
            self.name,
            [self.sentences[i] for i in keep],
            [self.voices[i] for i in keep],
        )
        out.audio, out.refs = [self.audio[i] for i in keep], [self.refs[i] for i in keep]
        return out

    @property
    def seconds(self) -> float:
        return sum(len(a) for a in self.audio) / speech.SAMPLE_RATE


def make_sets(workers: int, recall_voices: int):
    """(test, dev, a function making the recall utterances of a list of sentences)."""
    root = speech.install_espeak()
    text = speech.load_text()
    train_pool, held_pool = speech.voice_pools(root)
    _, _, test_sentences, test_voices, _ = train_demo.make_jobs(text, train_pool, held_pool, train_demo.GPU, 0)
    taken = set(test_sentences)
    dev_sentences = [s for s in text.heldout if s not in taken]
    rng = random.Random("decoding/dev")
    dev_voices = [speech.random_voice(rng, held_pool) for _ in dev_sentences]
    test = Clips("test", root, test_sentences, test_voices, workers)
    dev = Clips("dev", root, dev_sentences, dev_voices, workers)

    def recall(sentences: list[str]) -> Clips:
        rng = random.Random("decoding/recall")
        pairs = [(s, speech.random_voice(rng, held_pool)) for s in sentences for _ in range(recall_voices)]
        return Clips("recall", root, [s for s, _ in pairs], [v for _, v in pairs], workers)

    return test, dev, recall, text


def decode(model_path: str, clips: Clips, batch_size: int, **options) -> dict:
    """Transcribe `clips` with load_model(**options) on the CPU: hypotheses, WER and seconds."""
    model = gs.load_model(model_path, device="cpu", dtype="float32", batch_size=batch_size, **options)
    start = time.perf_counter()
    hyps = [r.text for r in model.transcribe(clips.audio, batch_size=batch_size)]
    seconds = time.perf_counter() - start
    errors = sum(speech.word_errors(r, h)[0] for r, h in zip(clips.refs, hyps))
    words = sum(len(r.split()) for r in clips.refs)
    label = ", ".join(f"{k}={Path(v).name if k == 'lm' else v}" for k, v in options.items()) or "greedy"
    print(
        f"  {clips.name} ({len(hyps)}): {label}: WER {errors / words:.2%} ({errors}/{words}), {seconds:.0f} s",
        flush=True,
    )
    return {"hyps": hyps, "wer": errors / words, "errors": errors, "words": words, "seconds": round(seconds, 1)}


def summary(result: dict) -> dict:
    return {k: v for k, v in result.items() if k != "hyps"}


def build_lms(model_path: str, folder: Path, orders) -> dict[int, str]:
    """ARPA files of the normalised training sentences, one per order."""
    folder.mkdir(parents=True, exist_ok=True)
    corpus = folder / "train-normalized.txt"
    sentences = [speech.normalize(s) for s in (speech.TEXT_DIR / "train.txt").read_text().splitlines()]
    corpus.write_text("\n".join(s for s in sentences if s) + "\n")
    paths = {}
    for order in orders:
        paths[order] = str(folder / f"train-order{order}.arpa")
        if build_lm.main([str(corpus), paths[order], "-m", model_path, "--order", str(order)]) != 0:
            raise SystemExit(f"build_lm failed for order {order}")
    return paths


def missed(ref: str, hyp: str) -> Counter:
    """Reference words the hypothesis holds fewer times than the reference."""
    r, h = Counter(ref.split()), Counter(hyp.split())
    return Counter({w: n - h[w] for w, n in r.items() if n > h[w]})


def rare_words(refs: list[str], hyps: list[str], counts: Counter) -> list[str]:
    """The rule: words greedy misses on these utterances (MIN_LETTERS letters or more, no apostrophe), the
    RARE_WORDS least frequent in the training text, ties alphabetical."""
    candidates = set()
    for ref, hyp in zip(refs, hyps):
        candidates.update(w for w in missed(ref, hyp) if w.isalpha() and len(w) >= MIN_LETTERS)
    return sorted(candidates, key=lambda w: (counts[w], w))[:RARE_WORDS]


def recall(refs: list[str], hyps: list[str], words: list[str]) -> dict:
    """Per word and overall: occurrences in the references also in the hypothesis (counted per utterance)."""
    hit, total = Counter(), Counter()
    for ref, hyp in zip(refs, hyps):
        r, h = Counter(ref.split()), Counter(hyp.split())
        for w in words:
            total[w] += r[w]
            hit[w] += min(r[w], h[w])
    return {
        "recall": sum(hit.values()) / max(sum(total.values()), 1),
        "hits": sum(hit.values()),
        "occurrences": sum(total.values()),
        "per_word": {w: [hit[w], total[w]] for w in words},
    }


def lm_study(args, dev: Clips, test: Clips) -> dict:
    """Issue 49: greedy, beam, beam + LM (order and weight chosen on dev) on the test utterances."""
    lms = build_lms(args.model, args.scratch, LM_ORDERS)
    tune = dev.subset(list(range(min(args.dev_lm, len(dev.refs)))))
    print(f"LM choice on {len(tune.refs)} dev utterances", flush=True)
    grid = [{"order": 0, "lm_weight": 0.0, **summary(decode(args.model, tune, args.batch_size, beam_size=BEAM))}]
    for order, path in lms.items():
        for weight in LM_WEIGHTS:
            result = decode(args.model, tune, args.batch_size, beam_size=BEAM, lm=path, lm_weight=weight)
            grid.append({"order": order, "lm_weight": weight, **summary(result)})
    best = min((g for g in grid if g["order"]), key=lambda g: (g["errors"], g["order"], g["lm_weight"]))
    print(f"chosen: order {best['order']}, weight {best['lm_weight']}", flush=True)
    print("test utterances", flush=True)
    rows = {
        "greedy": decode(args.model, test, args.batch_size),
        f"beam {BEAM}": decode(args.model, test, args.batch_size, beam_size=BEAM),
        f"beam {BEAM} + LM": decode(
            args.model, test, args.batch_size, beam_size=BEAM, lm=lms[best["order"]], lm_weight=best["lm_weight"]
        ),
        "greedy + LM": decode(args.model, test, args.batch_size, lm=lms[best["order"]], lm_weight=best["lm_weight"]),
    }
    changed = [
        {"ref": r, "greedy": g, "beam_lm": b}
        for r, g, b in zip(test.refs, rows["greedy"]["hyps"], rows[f"beam {BEAM} + LM"]["hyps"])
        if g != b
    ]
    return {
        "lm": {"corpus": ".textdata/train.txt, normalised", "orders": list(LM_ORDERS), "weights": list(LM_WEIGHTS)},
        "dev_grid": grid,
        "chosen": {"order": best["order"], "lm_weight": best["lm_weight"]},
        "test": {name: summary(r) for name, r in rows.items()},
        "test_seconds_of_audio": round(test.seconds, 1),
        "greedy_against_beam_lm_examples": changed[:15],
        "texts_changed_by_beam_lm": len(changed),
    }, rows["greedy"]


def boost_study(args, dev: Clips, test: Clips, make_recall, text, test_greedy: dict) -> dict:
    """Issue 50: rare words greedy misses on dev, their recall boosted on new utterances, WER without them."""
    counts = Counter(dict(zip(text.common, (int(w) for w in text.weights))))
    dev_greedy = decode(args.model, dev, args.batch_size)
    words = rare_words(dev.refs, dev_greedy["hyps"], counts)
    print(f"rare words: {words}", flush=True)
    holding = [s for s in text.heldout if set(speech.normalize(s).split()) & set(words)]
    clips = make_recall(holding)
    chosen_on = [i for i, r in enumerate(dev.refs) if set(r.split()) & set(words)]
    selection = dev.subset(chosen_on)
    without = test.subset([i for i, r in enumerate(test.refs) if not set(r.split()) & set(words)])
    rows = []
    for boost in (0.0, *BOOSTS):
        options = {"hotwords": tuple(words), "boost": boost} if boost else {}
        on_recall = decode(args.model, clips, args.batch_size, **options)
        on_selection = decode(args.model, selection, args.batch_size, **options)
        if boost:
            on_without = decode(args.model, without, args.batch_size, **options)
        else:  # greedy on those test utterances: the test run's own hypotheses
            keep = [i for i, r in enumerate(test.refs) if not set(r.split()) & set(words)]
            hyps = [test_greedy["hyps"][i] for i in keep]
            errors = sum(speech.word_errors(r, h)[0] for r, h in zip(without.refs, hyps))
            n = sum(len(r.split()) for r in without.refs)
            on_without = {"hyps": hyps, "wer": errors / n, "errors": errors, "words": n, "seconds": None}
        rows.append(
            {
                "boost": boost,
                "recall": recall(clips.refs, on_recall["hyps"], words),
                "recall_utterances_wer": summary(on_recall),
                "selection_recall": recall(selection.refs, on_selection["hyps"], words),
                "test_without_wer": summary(on_without),
            }
        )
        print(
            f"boost {boost}: recall {rows[-1]['recall']['recall']:.1%}, on the selection utterances "
            f"{rows[-1]['selection_recall']['recall']:.1%}, WER without {on_without['wer']:.2%}",
            flush=True,
        )
    return {
        "rule": f"dev words greedy misses, >= {MIN_LETTERS} letters, alphabetic; the {RARE_WORDS} least frequent "
        "in .textdata/train.txt (ties alphabetical)",
        "words": [{"word": w, "training_count": counts[w]} for w in words],
        "dev_greedy": summary(dev_greedy),
        "recall_sentences": len(holding),
        "recall_utterances": len(clips.refs),
        "recall_voices_per_sentence": args.recall_voices,
        "selection_utterances": len(selection.refs),
        "test_without_utterances": len(without.refs),
        "rows": rows,
    }


def aligned_correct(ref: list[str], hyp: list[str]) -> list[bool]:
    """For each hypothesis word: whether a minimal word alignment matches it to the same reference word."""
    rows = [list(range(len(hyp) + 1))]
    for i, rw in enumerate(ref, 1):
        row = [i]
        for j, hw in enumerate(hyp, 1):
            row.append(min(rows[-1][j] + 1, row[j - 1] + 1, rows[-1][j - 1] + (rw != hw)))
        rows.append(row)
    correct, i, j = [False] * len(hyp), len(ref), len(hyp)
    while i and j:
        if rows[i][j] == rows[i - 1][j - 1] + (ref[i - 1] != hyp[j - 1]):
            correct[j - 1] = ref[i - 1] == hyp[j - 1]
            i, j = i - 1, j - 1
        elif rows[i][j] == rows[i][j - 1] + 1:
            j -= 1
        else:
            i -= 1
    return correct


def confidence_study(args, test: Clips) -> dict:
    """Word confidences (NeMo's defaults) of greedy on the test utterances against which words are wrong."""
    model = gs.load_model(args.model, device="cpu", dtype="float32", batch_size=args.batch_size, confidence=True)
    pairs = []  # (confidence, correct)
    for ref, t in zip(test.refs, model.transcribe(test.audio, batch_size=args.batch_size)):
        words = [(speech.normalize(w.word), w.confidence) for w in t.words if speech.normalize(w.word)]
        marks = aligned_correct(ref.split(), [w for w, _ in words])
        pairs += [(c, ok) for (_, c), ok in zip(words, marks)]
    good = sorted(c for c, ok in pairs if ok)
    bad = sorted(c for c, ok in pairs if not ok)
    ranked = sorted(pairs)
    low = ranked[: len(ranked) // 10]
    below = sum(sum(1 for g in good if g > b) + 0.5 * sum(1 for g in good if g == b) for b in bad)
    report = {
        "words": len(pairs),
        "wrong_words": len(bad),
        "mean_confidence_correct": sum(good) / max(len(good), 1),
        "mean_confidence_wrong": sum(bad) / max(len(bad), 1),
        "auc_wrong_below_correct": below / max(len(good) * len(bad), 1),
        "wrong_share_least_confident_tenth": sum(1 for _, ok in low if not ok) / max(len(low), 1),
        "wrong_share_all": len(bad) / max(len(pairs), 1),
        "wrong_words_in_least_confident_tenth": sum(1 for _, ok in low if not ok),
    }
    print(f"confidence: {report}", flush=True)
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=str(DEMO))
    parser.add_argument("--out", type=Path, default=ROOT / "bench/2026-11-demo-decoding")
    parser.add_argument("--scratch", type=Path, default=ROOT / ".scratch/demo-decoding", help="the ARPA files")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--workers", type=int, default=2, help="espeak-ng processes")
    parser.add_argument("--dev-lm", type=int, default=200, help="dev utterances for the LM's order and weight")
    parser.add_argument("--recall-voices", type=int, default=3, help="new voices per sentence with a rare word")
    parser.add_argument(
        "--only", choices=["lm", "boost", "confidence"], help="one study (boost decodes the test set greedily)"
    )
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    test, dev, make_recall, text = make_sets(args.workers, args.recall_voices)
    print(f"test: {len(test.refs)} utterances ({test.seconds:.0f} s); dev: {len(dev.refs)} ({dev.seconds:.0f} s)")
    setup = {"model": Path(args.model).name, "device": "cpu", "dtype": "float32", "batch_size": args.batch_size}
    if args.only == "confidence":
        report = confidence_study(args, test)
        (args.out / "confidence.json").write_text(json.dumps({**setup, **report}, indent=1) + "\n")
        return 0
    if args.only != "boost":
        report, test_greedy = lm_study(args, dev, test)
        (args.out / "lm.json").write_text(json.dumps({**setup, **report}, indent=1) + "\n")
    else:
        test_greedy = decode(args.model, test, args.batch_size)
    if args.only != "lm":
        report = boost_study(args, dev, test, make_recall, text, test_greedy)
        (args.out / "hotwords.json").write_text(json.dumps({**setup, **report}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
