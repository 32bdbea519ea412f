"""SentencePiece tokenizer from the checkpoint: token ids -> text and pieces, as NeMo decodes them."""

from __future__ import annotations

import re
import unicodedata

import sentencepiece as spm

# Pieces that are not text: [tags], <tags>, ##continuations, ▁word pieces, blank pieces (NeMo's list).
_SPECIAL_PIECE = re.compile(r"^\[.*\]$|^<.*>$|^##|^▁|^\s*$")
DECODED_CACHE = 1 << 16  # pieces -> text entries kept (a word's pieces, or one piece); cleared when full


class TokenizerError(ValueError):
    pass


class Tokenizer:
    def __init__(self, model_proto: bytes, source: str = "checkpoint"):
        self.model_proto = model_proto  # what a worker process builds its own from (`rendering.TranscriptMaker`)
        self._sp = spm.SentencePieceProcessor()
        try:
            self._sp.LoadFromSerializedProto(model_proto)
        except (RuntimeError, TypeError, OSError) as err:
            raise TokenizerError(f"{source}: the tokenizer model is not a SentencePiece model ({err})") from None
        self._pieces = [self._sp.id_to_piece(i) for i in range(self._sp.get_piece_size())]
        self.punctuation = _punctuation(self._pieces)
        self.wordpiece = any(p.startswith("##") for p in self._pieces)  # NeMo's "wpe" tokenizer type
        self._space_before_punct = _space_before_punctuation(self.punctuation)
        # Words repeat: a folder's transcripts decode the same few thousand piece sequences again and again, and a
        # SentencePiece call costs more than the rest of a word's timestamps.
        self._decoded: dict[tuple[str, ...], str] = {}

    @property
    def vocab_size(self) -> int:
        return self._sp.get_piece_size()

    def decode(self, ids: list[int]) -> str:
        """Text as NeMo's hypotheses have it: SentencePiece's decode, less one space before punctuation."""
        text = self._sp.decode_ids(ids)
        if self._space_before_punct is not None:
            text = self._space_before_punct.sub(r"\2", text)
        return text

    def encode(self, text: str) -> list[int]:
        """Token ids of text, as NeMo's `text_to_ids` gives them (SentencePiece's encode; boosted phrases)."""
        return self._sp.encode_as_ids(text)

    @property
    def unk_id(self) -> int:
        return self._sp.unk_id()

    def sp_decode(self, ids: list[int]) -> str:
        """SentencePiece's own decode, without NeMo's hypothesis clean-up (its streaming finals clean up apart)."""
        return self._sp.decode_ids(ids)

    def piece(self, token_id: int) -> str:
        return self._pieces[token_id]

    def decode_pieces(self, pieces: list[str]) -> str:
        """Text of vocabulary pieces, as NeMo decodes a word's pieces (no punctuation clean-up)."""
        key = tuple(pieces)
        text = self._decoded.get(key)
        if text is None:
            if len(self._decoded) >= DECODED_CACHE:
                self._decoded.clear()
            text = self._decoded[key] = self._sp.decode_pieces(list(key))
        return text


def _punctuation(pieces: list[str]) -> frozenset[str]:
    """Punctuation marks that the vocabulary can emit on their own (NeMo's supported_punctuation)."""
    return frozenset(
        ch
        for piece in pieces
        if not _SPECIAL_PIECE.match(piece)
        for ch in piece
        if unicodedata.category(ch).startswith("P")
    )


def _space_before_punctuation(marks: frozenset[str]) -> re.Pattern | None:
    """NeMo removes one whitespace before each punctuation mark that the vocabulary can emit on its own."""
    if not marks:
        return None
    return re.compile(r"(\s)(" + "|".join(re.escape(m) for m in sorted(marks)) + ")")
