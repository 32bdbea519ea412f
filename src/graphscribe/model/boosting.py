"""Phrase boosting as NeMo's GPU-PB does it (`context_biasing/boosting_graph_batched.py`): the phrases, tokenised with
the model's tokenizer, make an Aho-Corasick tree (NeMo's ContextGraph, from icefall) whose arcs carry a bonus per
token; failing out of a partial match takes the bonus back. The tree becomes the same tables as an n-gram LM
(`ngram.TokenModel`), states numbered as NeMo numbers them, and is fused into decoding the same way.

A phrase's token bonus: its context score `s` (NeMo's `context_score`, 1.0, or the phrase's own `phrase:s`) for
its first token, `s * DEPTH_SCALING + ln(i + 1)` for its (i+1)-th; a shared prefix keeps the largest bonus.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from graphscribe.io.hotwords import HotwordError
from graphscribe.model.ngram import START, TableBuilder, Tables, TokenModel

CONTEXT_SCORE = 1.0  # NeMo's BoostingTreeModelConfig defaults (RNN-T and TDT)
DEPTH_SCALING = 2.0
UNK_SCORE = 0.0  # tokens that start no phrase
FINAL_EOS_SCORE = 1.0  # a phrase end's final weight (AED models' eos; transducers never use it)
MAX_PHRASES = 10_000
MAX_PHRASE_TOKENS = 64


@dataclass
class _Node:
    id: int
    token: int
    token_score: float
    node_score: float
    is_end: bool
    level: int
    next: dict[int, "_Node"] = field(default_factory=dict)
    fail: "_Node | None" = None


def build_boosting_tree(
    phrases: list[tuple[str, float | None]],
    encode: Callable[[str], list[int]],
    vocab_size: int,
    unknown: frozenset[int] = frozenset(),
    source: str = "--hotwords",
) -> Tables:
    """The tables of the boosting tree of `phrases` ((text, context score or None), as `parse_hotwords` gives),
    tokenised by `encode` (the model's tokenizer, capitalisation as given). HotwordError for a phrase that is empty,
    longer than MAX_PHRASE_TOKENS tokens, or made of `unknown` pieces only (<unk>, a bare word boundary)."""
    if len(phrases) > MAX_PHRASES:
        raise HotwordError(f"{source}: {len(phrases)} phrases, more than the {MAX_PHRASES} boosted at most")
    token_ids = []
    for text, _ in phrases:
        ids = encode(text) if text.strip() else []
        if not ids:
            raise HotwordError(f"{source}: an empty phrase ({text!r})")
        if len(ids) > MAX_PHRASE_TOKENS:
            raise HotwordError(f"{source}: phrase {text[:40]!r} is {len(ids)} tokens, over {MAX_PHRASE_TOKENS}")
        if all(i in unknown for i in ids):
            raise HotwordError(f"{source}: phrase {text[:40]!r} is only pieces the tokenizer does not know")
        if not all(0 <= i < vocab_size for i in ids):
            raise HotwordError(f"{source}: phrase {text[:40]!r} tokenises outside the model's {vocab_size} tokens")
        token_ids.append(ids)
    root = _context_graph(token_ids, [score for _, score in phrases])
    return _tree_tables(root, vocab_size)


def boosting_model(phrases, tokenizer, vocab_size: int, device, source: str = "--hotwords") -> TokenModel:
    """`build_boosting_tree` with the model's tokenizer, on `device`."""
    return TokenModel(boosting_tables(phrases, tokenizer, vocab_size, source), device)


def boosting_tables(phrases, tokenizer, vocab_size: int, source: str = "--hotwords") -> Tables:
    """`build_boosting_tree` with the model's tokenizer: the host tables of one tree (a row's, `row_boosting.py`)."""
    unknown = frozenset(i for i in range(vocab_size) if i == tokenizer.unk_id or tokenizer.piece(i) == "\u2581")
    return build_boosting_tree(phrases, tokenizer.encode, vocab_size, unknown, source)


def _context_graph(token_ids: list[list[int]], scores: list[float | None]) -> _Node:
    """NeMo's ContextGraph.build (non-uniform weights): the trie, then Aho-Corasick fail links."""
    count = 0
    root = _Node(0, -1, 0.0, 0.0, False, 0)
    root.fail = root
    for tokens, score in zip(token_ids, scores):
        context_score = CONTEXT_SCORE if not score else score
        node = root
        for i, token in enumerate(tokens):
            last = i == len(tokens) - 1
            if token not in node.next:
                token_score = context_score * DEPTH_SCALING + np.log(i + 1) if i > 0 else context_score
                count += 1
                node.next[token] = _Node(count, token, token_score, node.node_score + token_score, last, i + 1)
            else:
                child = node.next[token]
                child.token_score = max(context_score, child.token_score)
                child.node_score = node.node_score + child.token_score
                child.is_end = last or child.is_end
            node = node.next[token]
    _fill_fail(root)
    return root


def _fill_fail(root: _Node) -> None:
    queue = deque()
    for node in root.next.values():
        node.fail = root
        queue.append(node)
    while queue:
        current = queue.popleft()
        for token, node in current.next.items():
            fail = current.fail
            if token in fail.next:
                fail = fail.next[token]
            else:
                fail = fail.fail
                while token not in fail.next:
                    fail = fail.fail
                    if fail.token == -1:
                        break
                if token in fail.next:
                    fail = fail.next[token]
            node.fail = fail
            queue.append(node)


def _tree_tables(root: _Node, vocab_size: int) -> Tables:
    """NeMo's BoostingTreeStorage: breadth-first branches, each level sorted by (parent id, token)."""
    levels: dict[int, list[tuple[_Node, _Node]]] = {}
    queue, depth = deque([root]), 0
    while queue:
        current = queue.popleft()
        for node in current.next.values():
            levels.setdefault(node.level, []).append((current, node))
            depth = max(depth, node.level)
            queue.append(node)
    b = TableBuilder(vocab_size)
    b.state(START, 0.0, 0.0)
    state_of = {0: START}
    first = set()
    for level in range(1, depth + 1):
        for parent, node in sorted(levels[level], key=lambda pn: (pn[0].id, pn[1].token)):
            backoff = 0.0 if node.is_end else node.fail.node_score - node.node_score
            origin, target = state_of[parent.id], b.state(state_of[node.fail.id], 0.0)
            b.backoff_weight[target] = backoff
            b.final[target] = FINAL_EOS_SCORE if node.is_end else 0.0
            b.arcs.append((origin, node.token, target, node.token_score))
            state_of[node.id] = target
            if level == 1:
                first.add(node.token)
    b.arcs.extend((START, label, START, UNK_SCORE) for label in range(vocab_size) if label not in first)
    # a node at depth d fails to a shallower one: at most d back-offs to the root
    return b.tables(depth + 1, START, resolve_final=False)
