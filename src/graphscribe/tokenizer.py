"""SentencePiece tokenizer from the checkpoint: token ids -> text and pieces, as NeMo decodes them."""

from __future__ import annotations

import sentencepiece as spm


class TokenizerError(ValueError):
    pass


class Tokenizer:
    def __init__(self, model_proto: bytes, source: str = "checkpoint"):
        self._sp = spm.SentencePieceProcessor()
        try:
            self._sp.LoadFromSerializedProto(model_proto)
        except (RuntimeError, TypeError, OSError) as err:
            raise TokenizerError(f"{source}: the tokenizer model is not a SentencePiece model ({err})") from None

    @property
    def vocab_size(self) -> int:
        return self._sp.get_piece_size()

    def decode(self, ids: list[int]) -> str:
        return self._sp.decode_ids(ids)

    def piece(self, token_id: int) -> str:
        return self._sp.id_to_piece(token_id)
