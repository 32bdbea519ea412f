"""Special pieces of Parakeet v3's tokenizer (`<|endoftext|>`, `<|en|>`, `<|emo:happy|>`, ...) decode as NeMo's do.

NeMo's SentencePieceTokenizer (nemo/collections/common/tokenizers/sentencepiece_tokenizer.py, ids_to_text, at
NeMo 8cfedd7) decodes with `self.tokenizer.decode_ids(ids)` unless `legacy` is set, which ASR models do not set:
no stripping of its own. SentencePiece writes a user-defined piece as its text and a control piece as nothing,
and turns each "▁" into a space, dropping the leading one. NeMo's punctuation set
(asr/parts/utils/tokenizer_utils.py, extract_punctuation_from_vocab) skips pieces matching `^<.*>$`.
"""

from __future__ import annotations

import io

import pytest
import sentencepiece as spm

from graphscribe.io.tokenizer import Tokenizer

USER_DEFINED = ["<|endoftext|>", "<|en|>", "<|emo:happy|>"]
CONTROL = ["<|nospeech|>"]


@pytest.fixture(scope="module")
def model_proto() -> bytes:
    sentences = ["hello world, how are you?", "the world is wide.", "say hello to the world!"] * 50
    out = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(sentences),
        model_writer=out,
        model_type="bpe",
        vocab_size=60,
        user_defined_symbols=USER_DEFINED,
        control_symbols=CONTROL,
        character_coverage=1.0,
    )
    return out.getvalue()


def test_special_pieces_decode_as_nemo_does(model_proto):
    tokenizer = Tokenizer(model_proto)
    sp = spm.SentencePieceProcessor(model_proto=model_proto)
    hello, world = sp.piece_to_id("▁hello"), sp.piece_to_id("▁world")
    assert sp.id_to_piece(hello) == "▁hello" and sp.id_to_piece(world) == "▁world"  # whole-word pieces exist
    ids = [hello, sp.piece_to_id("<|en|>"), world, sp.piece_to_id("<|emo:happy|>"), sp.piece_to_id("<|nospeech|>")]
    # user-defined pieces as their text, the control piece as nothing, "▁" as a space, no leading space
    assert tokenizer.decode(ids) == "hello<|en|> world<|emo:happy|>"


def test_special_pieces_are_not_punctuation(model_proto):
    tokenizer = Tokenizer(model_proto)
    assert tokenizer.punctuation == {",", "?", ".", "!"}  # from the text pieces only; not "<", "|", ":" of the tags
