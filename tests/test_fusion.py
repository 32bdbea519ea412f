"""N-gram LM fusion and phrase boosting in greedy decoding, against NeMo 3.0's own results (tests/fixtures/nemo-fusion,
made by scripts/fixtures/make_nemo_fusion_fixtures.py): the LM's and the boosting trees' `advance` from every state,
greedy_batch's token ids and frames with the LM, with a boosting tree, with both, with per-phrase scores, one clip at
a time and as a padded batch; then the ARPA reader's and the phrase list's errors, and the CLI.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import NEMO_PATH, chunked_tokens
from test_cli import _error_lines, in_process

from graphscribe.api import load_model
from graphscribe.io.arpa import write_arpa
from graphscribe.io.hotwords import HotwordError, parse_hotwords
from graphscribe.model.boosting import MAX_PHRASE_TOKENS, boosting_model
from graphscribe.model.decoding import GreedyDecoder
from graphscribe.model.fusion import fusion_models
from graphscribe.model.ngpulm import load_lm
from graphscribe.model.ngram import ArpaError, TokenModel, read_arpa

ROOT = Path(__file__).resolve().parents[1]
FOLDER = ROOT / "tests/fixtures/nemo-fusion"
REFERENCE = json.loads((FOLDER / "reference.json").read_text())
ARRAYS = dict(np.load(FOLDER / "reference.npz"))
LM = ROOT / REFERENCE["lm"]
MODELS = list(REFERENCE["models"])
V = 128  # the tiny models' non-blank tokens


@pytest.fixture(scope="module", params=MODELS)
def tiny(request):
    """(name, model on the CPU, encoder output of each clip alone)."""
    name = request.param
    model = load_model(ROOT / REFERENCE["models"][name]["checkpoint"], device="cpu", graphs=False)
    encoded = {clip: model.encode([model.read(ROOT / path)]) for clip, path in REFERENCE["clips"].items()}
    return name, model, encoded


def _decoder(model, lm: bool = False, hotwords: tuple[str, ...] = ()) -> GreedyDecoder:
    fusion = fusion_models(str(LM) if lm else None, REFERENCE["lm_weight"], hotwords, REFERENCE["boost"],
                           model.tokenizer, V, torch.device("cpu"))  # fmt: skip
    return GreedyDecoder(model.module.decoder, model.module.joint, model.cfg.decoding, graphs=False, fusion=fusion)


def _scored() -> tuple[str, ...]:
    return tuple(f"{p}:{s}" if s else p for p, s in REFERENCE["scored_phrases"])


RUNS = {  # NeMo's run -> (LM on, hotwords)
    "nofusion": (False, ()),
    f"lm{REFERENCE['lm_weight']}": (True, ()),
    f"boost{REFERENCE['boost']}": (False, tuple(REFERENCE["phrases"])),
    f"lm{REFERENCE['lm_weight']}+boost{REFERENCE['boost']}": (True, tuple(REFERENCE["phrases"])),
    f"scored-boost{REFERENCE['boost']}": (False, _scored()),
}


# ----------------------------------------------------------------------------- the models' advance


def _assert_advance(model: TokenModel, prefix: str, finals: bool = True) -> None:
    states = torch.arange(model.num_states)
    assert model.num_states == ARRAYS[prefix + "scores"].shape[0]
    scores, nxt = model.advance(states)
    np.testing.assert_allclose(scores.numpy(), ARRAYS[prefix + "scores"], rtol=0, atol=1e-6)
    np.testing.assert_array_equal(nxt.numpy(), ARRAYS[prefix + "next"])
    # greedy fusion's two lookups: the scores alone, and the next state of one token a row
    assert torch.equal(model.scores(states), scores)
    for token in range(scores.shape[1]):
        moved = states.clone()
        model.move(moved, torch.full_like(states, token), torch.ones_like(states, dtype=torch.bool))
        assert torch.equal(moved, nxt[:, token]), token
    if finals:
        np.testing.assert_allclose(model.final(states).numpy(), ARRAYS[prefix + "final"], rtol=0, atol=1e-6)


@pytest.mark.parametrize("name", MODELS)
def test_lm_advance_is_nemos_from_every_state(name):
    """Every state, every token: the back-off lookups give NeMo's natural-log scores and NeMo's next state ids."""
    _assert_advance(load_lm(LM, V), f"{name}/lm_")


def test_boosting_trees_advance_is_nemos_from_every_state(tiny):
    name, model, _ = tiny
    spec = REFERENCE["models"][name]
    for phrase, ids in spec["phrase_ids"].items():  # capitalisation as given: NeMo's text_to_ids
        assert model.tokenizer.encode(phrase) == ids, phrase
    plain = boosting_model(parse_hotwords(", ".join(REFERENCE["phrases"])), model.tokenizer, V, "cpu")
    _assert_advance(plain, f"{name}/tree_")
    scored = boosting_model([p for p in map(_one, _scored())], model.tokenizer, V, "cpu")
    _assert_advance(scored, f"{name}/scored_tree_")
    assert plain.start(2).tolist() == [0, 0]


def _one(item: str):
    return parse_hotwords(item)[0]


# ----------------------------------------------------------------------------- greedy decoding


@pytest.mark.parametrize("run", list(RUNS))
def test_greedy_with_fusion_gives_nemos_tokens(tiny, run):
    name, model, encoded = tiny
    expected = REFERENCE["models"][name]["runs"][run]
    decoder = _decoder(model, *RUNS[run])
    for clip, (enc, lengths) in encoded.items():
        (hyp,) = decoder.decode(enc, lengths)
        assert (hyp.token_ids, hyp.frames) == (expected[clip]["token_ids"], expected[clip]["timestamps"]), clip
    changed = REFERENCE["models"][name]["changed"][run]
    assert (run == "nofusion") == (not changed)  # each fused run changes NeMo's output somewhere


def test_greedy_with_lm_in_a_padded_batch(tiny):
    name, model, _ = tiny
    expected = REFERENCE["models"][name]["batch_lm"]
    audios = [model.read(ROOT / REFERENCE["clips"][clip]) for clip in REFERENCE["batch"]]
    hyps = _decoder(model, lm=True).decode(*model.encode(audios))
    for clip, hyp in zip(REFERENCE["batch"], hyps):
        assert (hyp.token_ids, hyp.frames) == (expected[clip]["token_ids"], expected[clip]["timestamps"]), clip


def test_a_chunk_hands_on_each_rows_lm_state(tiny):
    """decode_chunk's state holds each row's LM state after its last token (NeMo's fusion_states_list), and a
    chunk started from it scores on from there."""
    _, model, encoded = tiny
    enc, lengths = encoded["long_mix"]
    decoder = _decoder(model, lm=True)
    (hyp,), state = decoder.decode_chunk(enc, lengths, None)
    lm = load_lm(LM, V)
    walked = lm.start(1)
    for token in hyp.token_ids:
        walked = lm.advance(walked)[1][:, token]
    assert state.fusion is not None and state.fusion[:, 0].tolist() == walked.tolist()
    assert decoder.fresh_state(2, enc.device, enc.dtype).fusion.tolist() == [[lm.start_state]] * 2
    assert hyp.token_ids == decoder.decode(enc, lengths)[0].token_ids


# ----------------------------------------------------------------------------- errors


GOOD = (LM).read_text(encoding="utf-8")


def _broken(name: str) -> str:
    lines = GOOD.split("\n")
    first_bigram = lines.index("\\2-grams:") + 1
    cases = {
        "not_arpa": "hello\n",
        "empty": "",
        "cut_short": GOOD[: len(GOOD) // 2],
        "count_mismatch": GOOD.replace("ngram 2=389", "ngram 2=390"),
        "bad_number": "\n".join(lines[:first_bigram] + ["abc" + lines[first_bigram][9:]] + lines[first_bigram + 1 :]),
        "word_not_a_token": GOOD.replace("\t<s> e\t", "\t<s> ee\t"),
        "missing_prefix": GOOD.replace("\t<s> e\t", "\t<s> \u00c7\t"),  # a bigram whose word has no unigram
        "long_line": GOOD.replace("\\1-grams:\n", "\\1-grams:\n" + "x" * 5000 + "\n"),
        "binary": "\\data\\\nngram 1=\xff\n",
    }
    return cases[name]


@pytest.mark.parametrize(
    "case",
    ["not_arpa", "empty", "cut_short", "count_mismatch", "bad_number", "word_not_a_token", "missing_prefix",
     "long_line", "binary"],
)  # fmt: skip
def test_a_malformed_arpa_gets_one_clear_line(tmp_path, case):
    path = tmp_path / f"{case}.arpa"
    path.write_bytes(_broken(case).encode("utf-8", "surrogateescape") if case != "binary" else b"\\data\\\n\xff\xfe\n")
    with pytest.raises(ArpaError) as err:
        read_arpa(path, V)
    message = str(err.value)
    assert message.startswith(str(path)) and "\n" not in message, message


def test_a_missing_lm_file_gets_one_clear_line(tmp_path):
    with pytest.raises(ArpaError, match="cannot read the LM"):
        read_arpa(tmp_path / "nope.arpa", V)


def test_an_lm_for_another_vocabulary_is_refused(tmp_path):
    with pytest.raises(ArpaError, match="another vocabulary"):
        read_arpa(LM, 64)  # the fixture's LM has tokens up to 127


@pytest.mark.parametrize(
    "phrases,problem",
    [
        ("you, , sister", "an empty phrase"),
        ("漢字", "does not know"),
        (" ".join(["you"] * (MAX_PHRASE_TOKENS + 1)), f"over {MAX_PHRASE_TOKENS}"),
        ("you:-1", "must be above 0"),
    ],
)
def test_a_phrase_that_cannot_be_boosted_gets_one_clear_line(tiny, phrases, problem):
    _, model, _ = tiny
    with pytest.raises(HotwordError) as err:
        boosting_model(parse_hotwords(phrases), model.tokenizer, V, "cpu")
    assert problem in str(err.value) and str(err.value).startswith("--hotwords") and "\n" not in str(err.value)


# ----------------------------------------------------------------------------- CLI and scripts


def test_cli_without_phrases_prints_todays_bytes(tmp_path, capsys):
    clip = ROOT / REFERENCE["clips"]["espeak_fox"]
    empty = tmp_path / "none.txt"
    empty.write_text("\n\n")
    today = in_process(capsys, clip, "-f", "json")
    assert today.returncode == 0
    for extra in (["--hotwords", ""], ["--hotwords-file", empty], ["--boost", "3"]):
        same = in_process(capsys, clip, "-f", "json", *extra)
        assert (same.returncode, same.stdout) == (0, today.stdout), extra


def test_cli_with_lm_and_hotwords_gives_nemos_text(capsys):
    clip = ROOT / REFERENCE["clips"]["noise_3s"]
    done = in_process(
        capsys, clip, "-f", "json", "--lm", LM, "--lm-weight", "0.5", "--hotwords", "you, sister, is it, Gr"
    )
    assert done.returncode == 0, done.stderr
    expected = REFERENCE["models"]["tdt-tiny"]["runs"]["lm0.5+boost1.0"]["noise_3s"]["token_ids"]
    assert [t["id"] for t in json.loads(done.stdout)["tokens"]] == expected


@pytest.mark.parametrize("flag", ["--lm", "--hotwords"])
def test_cli_bad_lm_or_phrase_is_one_line_exit_2(tmp_path, capsys, flag):
    bad = tmp_path / "bad.arpa"
    bad.write_text("hello\n")
    value = bad if flag == "--lm" else "you, 漢"
    done = in_process(capsys, ROOT / REFERENCE["clips"]["espeak_fox"], flag, value)
    assert done.returncode == 2 and len(_error_lines(done.stderr)) == 1, done.stderr
    assert done.stdout == ""


def test_build_lm_makes_the_beam_fixtures_lm(tmp_path, capsys):
    """scripts/build_lm.py on the nemo-beam fixture's corpus writes its lm.arpa (which NeMo read) byte for byte."""
    spec = importlib.util.spec_from_file_location("build_lm", ROOT / "scripts/build_lm.py")
    build_lm = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(build_lm)
    out = tmp_path / "lm.arpa"
    assert build_lm.main([str(FOLDER / "corpus.txt"), str(out), "-m", str(NEMO_PATH)]) == 0
    assert out.read_bytes() == LM.read_bytes()
    assert write_arpa([[1, 2, 3]], tmp_path / "tiny.arpa")["ngrams"] == {1: 6, 2: 4, 3: 3}  # 3 tokens, <s>, </s>, <unk>
    load_lm(tmp_path / "tiny.arpa", V)  # what it writes, we read


# ----------------------------------------------------------------------------- streams


@pytest.fixture(scope="module")
def fused_model():
    return load_model(NEMO_PATH, device="cpu", lm=str(LM), hotwords=tuple(REFERENCE["phrases"]))


def test_a_chunked_decode_with_fusion_gives_the_whole_decodes_tokens(fused_model):
    """decode_chunk from the state the chunk before left: the LM's and the tree's states carry over too."""
    model = fused_model
    clips = [REFERENCE["clips"][c] for c in ("long_mix", "espeak_fox")]
    encoded, lengths = model.encode([model.read(ROOT / c) for c in clips])
    whole = model.decoder.decode(encoded, lengths)
    assert [h.token_ids for h in whole] != [h.token_ids for h in _decoder(model).decode(encoded, lengths)]
    for size in (1, 3, 10):
        assert chunked_tokens(model.decoder, encoded, lengths, size) == [h.token_ids for h in whole], size


def test_streams_with_fusion_batched_equal_each_alone():
    """The stream engine keeps each stream's fusion states in its pools: ten streams stepped together, opened at
    different steps (the pools grow past 8 while the first ones run), get what each gets alone."""
    from test_streaming import SMALL, _staggered, _whole

    from graphscribe.runtime.streaming import StreamEngine

    model = load_model(NEMO_PATH, device="cpu", lm=str(LM))  # the LM's state matters at every token
    longs = [model.read(ROOT / REFERENCE["clips"][c]) for c in ("long_mix", "long_libri_libri_fox")]
    audios = [longs[i % 2][16000 * i : 16000 * (i + 5)] for i in range(10)]  # 5 s each
    alone = [_whole(model.stream(*SMALL), a)[-1].token_ids for a in audios]
    events = _staggered(StreamEngine(model, *SMALL), audios)
    assert [next(e for e in s if e.type == "done").token_ids for s in events] == alone


def test_fusion_options_as_the_api_takes_them(tiny):
    """hotwords as a tuple of phrases or one comma-separated string; the weights finite; without fusion the
    decoder's step is chosen as without them (the fused Triton step where it runs: it takes the fusion too)."""
    _, model, _ = tiny
    cpu = torch.device("cpu")
    as_str = fusion_models(None, 0.5, "you, sister:2", 1.0, model.tokenizer, V, cpu)
    as_tuple = fusion_models(None, 0.5, ("you", "sister:2"), 1.0, model.tokenizer, V, cpu)
    assert (
        len(as_str) == len(as_tuple) == 1 and as_str[0][0].num_states == as_tuple[0][0].num_states == 6
    )  # root, you, s i s ter
    assert fusion_models(None, 0.5, (), 1.0, model.tokenizer, V, cpu) == []
    with pytest.raises(ValueError, match="--lm-weight"):
        fusion_models(str(LM), float("nan"), (), 1.0, model.tokenizer, V, cpu)
    assert _decoder(model).fused is None and _decoder(model, lm=True).fused is None
