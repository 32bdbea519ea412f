"""Phrase boosting per row (`model/row_boosting.py`): each row of one greedy decode boosted by its own phrases, against
NeMo 3.0's own results for each phrase list alone (tests/fixtures/nemo-fusion: its GPU-PB trees' `advance` from every
state, and greedy_batch's tokens with each tree); a row without phrases gives today's tokens; the static tables grow
and are refilled between batches; a request's phrases are bounded and checked.
"""

from __future__ import annotations

import pytest
import torch
from conftest import NEMO_PATH
from test_fusion import ARRAYS, REFERENCE, ROOT, V, _one, _scored
from test_streaming import SMALL, _staggered, _whole

from graphscribe.api import load_model
from graphscribe.io.hotwords import MAX_REQUEST_PHRASES, HotwordError, parse_hotwords, parse_request_hotwords
from graphscribe.model.boosting import boosting_tables
from graphscribe.model.decoding import GreedyDecoder
from graphscribe.model.row_boosting import NO_TREE, RowTrees
from graphscribe.runtime.cache_aware_streams import engine_for

PLAIN, SCORED = ", ".join(REFERENCE["phrases"]), ", ".join(_scored())
RUN = {None: "nofusion", PLAIN: f"boost{REFERENCE['boost']}", SCORED: f"scored-boost{REFERENCE['boost']}"}


@pytest.fixture(scope="module", params=list(REFERENCE["models"]))
def tiny(request):
    """(name, model on the CPU, encoder output of each clip alone)."""
    name = request.param
    model = load_model(ROOT / REFERENCE["models"][name]["checkpoint"], device="cpu", graphs=False)
    encoded = {clip: model.encode([model.read(ROOT / path)]) for clip, path in REFERENCE["clips"].items()}
    return name, model, encoded


def _tables(model, text: str):
    return boosting_tables(parse_hotwords(text), model.tokenizer, V)


def test_each_rows_tree_advances_as_nemos_tree_alone(tiny):
    """Trees end to end (a row without phrases between them): from every state of each, NeMo's scores, and NeMo's
    next state shifted by the tree's base; the row without phrases scores 0 and stays put."""
    name, model, _ = tiny
    plain = _tables(model, PLAIN)
    scored = boosting_tables([_one(item) for item in _scored()], model.tokenizer, V)
    trees = RowTrees(V, "cpu", arcs=16, states=4, rows=2)  # too small: `load` grows them
    assert trees.load([scored, None, plain, scored], 4)
    base = {"scored_tree_": 1, "tree_": 1 + len(scored.backoff_to)}
    assert trees.roots.tolist()[:4] == [base["scored_tree_"], NO_TREE, base["tree_"], base["scored_tree_"]]
    for prefix, first in base.items():
        expected_scores, expected_next = ARRAYS[f"{name}/{prefix}scores"], ARRAYS[f"{name}/{prefix}next"]
        count = expected_scores.shape[0]
        row = 0 if prefix == "scored_tree_" else 2  # advance reads each row's root: the states' rows must be theirs
        states = torch.full((4,), NO_TREE)
        for s in range(count):
            states[row] = first + s
            scores, nxt = trees.advance(states)
            torch.testing.assert_close(scores[row], torch.from_numpy(expected_scores[s]), rtol=0, atol=1e-6)
            assert (nxt[row] - first).tolist() == expected_next[s].tolist(), (prefix, s)
            assert scores[1].abs().sum() == 0 and (nxt[1] == NO_TREE).all()
            assert torch.equal(trees.scores(states), scores)  # greedy fusion's two lookups
            for token in range(V):
                moved = states.clone()
                trees.move(moved, torch.full_like(states, token), torch.ones_like(states, dtype=torch.bool))
                assert torch.equal(moved, nxt[:, token]), token


def _batch(encoded: dict, clips: list[str]):
    """Each clip's encoder output (computed alone) as one zero-padded batch: (B, T, D), (B,)."""
    outs = [encoded[c][0][0, : int(encoded[c][1][0])] for c in clips]
    batch = torch.nn.utils.rnn.pad_sequence(outs, batch_first=True)
    return batch, torch.tensor([o.shape[0] for o in outs])


def test_rows_with_their_own_phrases_in_one_decode_get_nemos_tokens_for_theirs(tiny):
    """One decode of nine clips, rows boosted by the plain list, the scored list or nothing: each row's tokens and
    frames are NeMo's for its clip decoded alone with its own phrases (or none)."""
    name, model, encoded = tiny
    clips = list(REFERENCE["clips"])
    lists = [PLAIN, SCORED, None] * 3
    trees = {text: _tables(model, text) for text in (PLAIN,)}
    trees[SCORED] = boosting_tables([_one(item) for item in _scored()], model.tokenizer, V)
    trees[None] = None
    decoder = GreedyDecoder(
        model.module.decoder, model.module.joint, model.cfg.decoding, graphs=False, fusion=[(RowTrees(V, "cpu"), 1.0)]
    )
    enc, lengths = _batch(encoded, clips)
    for shift in range(3):  # the same decoder again with the lists moved along: the tables refilled in place
        rows = lists[shift:] + lists[:shift]
        hyps = decoder.decode(enc, lengths, trees=[trees[text] for text in rows])
        for clip, text, hyp in zip(clips, rows, hyps):
            expected = REFERENCE["models"][name]["runs"][RUN[text]][clip]
            assert (hyp.token_ids, hyp.frames) == (expected["token_ids"], expected["timestamps"]), (clip, text)


def test_loaded_model_boosts_only_the_rows_with_phrases(tiny):
    """`LoadedModel.decode(trees=)`: a batch without trees decodes as today; rows with request phrases get theirs
    (NeMo's), the rows without them today's tokens, in the same batch; the options' phrases add to a request's."""
    name, model, encoded = tiny
    clips = list(REFERENCE["clips"])
    enc, lengths = _batch(encoded, clips)
    runs = REFERENCE["models"][name]["runs"]
    today = model.decode(enc, lengths)
    assert [h.token_ids for h in today] == [runs["nofusion"][c]["token_ids"] for c in clips]
    rows = [model.row_tree(parse_request_hotwords(PLAIN)) if i % 2 else None for i in range(len(clips))]
    hyps = model.decode(enc, lengths, trees=rows)
    for i, (clip, hyp) in enumerate(zip(clips, hyps)):
        assert hyp.token_ids == runs["boost1.0" if i % 2 else "nofusion"][clip]["token_ids"], clip
    assert model.row_tree(()) is None and model.row_tree(parse_request_hotwords(PLAIN)) is rows[1]  # kept
    served = load_model(ROOT / REFERENCE["models"][name]["checkpoint"], device="cpu", hotwords=("you", "sister"))
    both = served.decode(enc[:1], lengths[:1], trees=[served.row_tree(parse_request_hotwords("is it, Gr"))])
    assert both[0].token_ids == runs["boost1.0"][clips[0]]["token_ids"]


@pytest.mark.parametrize(
    "text,problem",
    [
        (", ".join(["you"] * (MAX_REQUEST_PHRASES + 1)), f"more than the {MAX_REQUEST_PHRASES}"),
        ("you,,sister", "an empty phrase"),
        ("you:0", "must be above 0"),
        ("x" * 600, "over 512 characters"),
    ],
)
def test_a_requests_phrases_are_bounded(text, problem):
    with pytest.raises(HotwordError) as err:
        parse_request_hotwords(text)
    assert problem in str(err.value) and str(err.value).startswith("hotwords: ") and "\n" not in str(err.value)
    assert parse_request_hotwords(" ") == () and parse_request_hotwords("a, b:2") == (("a", None), ("b", 2.0))


# ----------------------------------------------------------------------------- streams


def _done(events) -> list[int]:
    return next(e for e in events if e.type == "done").token_ids


@pytest.fixture(scope="module")
def streamed():
    """The stream test's model, and its audios: 5 s of the long clips each."""
    model = load_model(NEMO_PATH, device="cpu")
    longs = [model.read(ROOT / REFERENCE["clips"][c]) for c in ("long_mix", "long_libri_libri_fox")]
    return model, [longs[i % 2][16000 * i : 16000 * (i + 5)] for i in range(6)]


def test_a_stream_with_its_own_phrases_is_a_stream_of_a_model_loaded_with_them(streamed):
    """model.stream(hotwords=...): the tree's state carried from chunk to chunk as with --hotwords."""
    model, audios = streamed
    loaded_with = load_model(NEMO_PATH, device="cpu", hotwords=tuple(REFERENCE["phrases"]))
    for audio in audios[:2]:
        boosted = _done(_whole(model.stream(*SMALL, hotwords=PLAIN), audio))
        assert boosted == _done(_whole(loaded_with.stream(*SMALL), audio))
        assert boosted != _done(_whole(model.stream(*SMALL), audio))


def test_streams_with_their_own_phrases_stepped_together_get_each_theirs(streamed):
    """Six streams of one boosted engine (plain list, scored list, none), one joining at each step: the tables laid
    out anew at every step, each stream gets what it gets alone."""
    model, audios = streamed
    texts = [PLAIN, SCORED, ""] * 2
    alone = [_done(_whole(model.stream(*SMALL, hotwords=t), a)) for t, a in zip(texts, audios)]
    engine = engine_for(model, *SMALL, boosted=True)
    trees = [model.row_tree(parse_request_hotwords(t)) if t else None for t in texts]
    events = _staggered(engine, audios, trees=trees)
    assert [_done(e) for e in events] == alone
    assert alone[0] != alone[2]  # the phrases count
    with pytest.raises(ValueError, match="boosted engine"):
        engine_for(model, *SMALL).open(trees[0])
