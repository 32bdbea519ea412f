"""Greedy fusion's lookup kernels (`model/chain_kernels.py`) through Triton's interpreter against the PyTorch walk
(`chains.ChainTables.scores_over` and `next_over`, whose scores and next states are NeMo's: test_fusion.py and
test_row_boosting.py): the n-gram LM of the NeMo fixtures, each tiny model's boosting trees, and rows' own trees
laid end to end, from every state, bit for bit."""

from __future__ import annotations

import pytest
import torch
from test_fusion import LM, REFERENCE, ROOT, V, _one, _scored

from graphscribe.api import load_model
from graphscribe.io.hotwords import parse_hotwords
from graphscribe.model import chain_kernels
from graphscribe.model.boosting import boosting_model, boosting_tables
from graphscribe.model.ngpulm import load_lm
from graphscribe.model.row_boosting import NO_TREE, RowTrees

WEIGHT = 0.7  # a weight other than 1, so that the product is checked too


@pytest.fixture(scope="module")
def tokenizer():
    name = next(iter(REFERENCE["models"]))
    return load_model(ROOT / REFERENCE["models"][name]["checkpoint"], device="cpu", graphs=False).tokenizer


def _models(tokenizer):
    """(name, model, (B,) states covering every state of it) for the LM, a tree, and rows' own trees."""
    lm = load_lm(LM, V)
    tree = boosting_model(parse_hotwords(", ".join(REFERENCE["phrases"])), tokenizer, V, "cpu")
    trees = RowTrees(V, "cpu")
    plain = boosting_tables(parse_hotwords(", ".join(REFERENCE["phrases"])), tokenizer, V)
    scored = boosting_tables([_one(item) for item in _scored()], tokenizer, V)
    trees.load([scored, None, plain, scored], 4)
    # each row's states are its own tree's (a row's chain ends at its own root): rows 0 and 3 walk the scored tree
    size = [len(scored.backoff_to), 1, len(plain.backoff_to), len(scored.backoff_to)]
    states = [
        [(int(trees.roots[r]) if r != 1 else NO_TREE) + (s % size[r]) for r in range(4)] for s in range(max(size))
    ]
    return [
        ("lm", lm, torch.arange(lm.num_states)),
        ("tree", tree, torch.arange(tree.num_states)),
        ("row trees", trees, torch.tensor(states).reshape(-1)),
    ]


def test_scores_kernel_is_the_walks_bits(tokenizer):
    for name, model, states in _models(tokenizer):
        chains = model._chains if hasattr(model, "_chains") else model.chains
        root = (model.root_has, model.root_score) if hasattr(model, "root_has") else None
        expected = chains.weighted_scores(states, root, WEIGHT, None)
        out = torch.full((states.shape[0], V), float("nan"))
        _grow_roots(model, states.shape[0])
        got = chain_kernels.scores(chains, states, root, WEIGHT, out)
        assert torch.equal(got, expected), name


def test_move_kernel_is_the_walks_next_states(tokenizer):
    generator = torch.Generator().manual_seed(0)
    for name, model, states in _models(tokenizer):
        chains = model._chains if hasattr(model, "_chains") else model.chains
        _grow_roots(model, states.shape[0])
        own = chains.token[chains.first[states].clamp(max=chains.token.numel() - 1)]  # a deep hit, mostly
        draws = [own] + [torch.randint(0, V + 1, states.shape, generator=generator) for _ in range(2)]
        for tokens in draws:  # V: blank, on rows that do not emit
            emit = tokens < V
            emit[::5] = False
            ends = (
                dict(root=(model.root_has, model.root_next)) if hasattr(model, "root_has") else dict(roots=model.roots)
            )
            expected, got = states.clone(), states.clone()
            chains.move(expected, tokens, emit, **ends)
            chain_kernels.move(chains, got, tokens, emit, **ends)
            assert torch.equal(got, expected), name
            assert not torch.equal(expected[emit], states[emit]) or name == "row trees"


def _grow_roots(model, rows: int) -> None:
    """Rows' own roots for every row of a long batch of states: the 4 rows' roots repeated."""
    if isinstance(model, RowTrees) and model.roots.numel() < rows:
        model.roots = model.roots[:4].repeat((rows + 3) // 4)
