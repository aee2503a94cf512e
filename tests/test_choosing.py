"""Choosing a step's tokens for many rows at once gives each row the token its own processors
would, and the stop-string check asks transformers' criteria only when it could say yes."""

from __future__ import annotations

import random

import pytest
import torch
from transformers import StopStringCriteria

from chat.engine.local.batching import Row
from chat.engine.local.choosing import greedy_rules, next_tokens
from chat.engine.local.row_processors import sampling_processors
from chat.engine.local.stopping import StopStrings
from chat.engine.types import GenerationRequest

VOCAB = 64


def _row(prompt: list[int], answer: list[int], **params) -> Row:
    row = Row(GenerationRequest.of(prompt, **params), lambda text: None, 100, frozenset([0]))
    row.new_ids = list(answer)
    row.processors = sampling_processors(row, None)
    if "seed" in params:  # as Row.prepare does
        row.generator = torch.Generator()
    return row


def _random_row(rng: random.Random) -> Row:
    prompt = [rng.randrange(VOCAB) for _ in range(rng.randrange(1, 6))]
    # Answers repeat ids, so some appear twice in a row's penalty.
    answer = [rng.randrange(8) for _ in range(rng.choice([0, 1, 3, 9]))]
    kind = rng.choice(["plain", "rep", "rep", "rep2", "ngram", "min", "sampled"])
    params = {
        "plain": {},
        "rep": {"repetition_penalty": 1.1},
        "rep2": {"repetition_penalty": 1.7},
        "ngram": {"repetition_penalty": 1.1, "no_repeat_ngram_size": 2},
        "min": {"repetition_penalty": 1.1, "min_new_tokens": 5},
        "sampled": {"repetition_penalty": 1.1, "temperature": 0.7, "seed": 3},
    }[kind]
    return _row(prompt, answer, **params)


@pytest.mark.unit
def test_rows_chosen_together_get_the_token_their_own_processors_give():
    rng = random.Random(7)
    torch.manual_seed(7)
    changed = 0
    for _ in range(300):
        rows = [_random_row(rng) for _ in range(rng.randrange(1, 9))]
        logits = torch.randn(len(rows), VOCAB) * 3
        # The best scores sit on ids the answers hold, of both signs, so penalties decide.
        logits[:, :8] += torch.randn(len(rows), 8).abs() * 4 - 1  # id 0 is the rows' eos
        expected = []
        for index, row in enumerate(rows):
            if row.generator is not None:
                row.generator.manual_seed(3)
            expected.append(row.pick(logits[index : index + 1].clone()))
        for row in rows:
            if row.generator is not None:
                row.generator.manual_seed(3)
        plain = logits.argmax(dim=-1).tolist()
        assert next_tokens(rows, logits.clone()) == expected
        changed += sum(
            1
            for row, token, first in zip(rows, expected, plain, strict=True)
            if token != first and greedy_rules(row) is not None
        )
    assert changed > 20  # the penalties changed many choices, so they were applied


@pytest.mark.unit
def test_only_greedy_rows_with_a_penalty_or_a_minimum_length_are_chosen_together():
    assert greedy_rules(_row([1, 2], [3], repetition_penalty=1.1)) == (None, 1.1)
    minimum, penalty = greedy_rules(_row([1], [3], repetition_penalty=1.1, min_new_tokens=2))
    assert minimum is not None and penalty == 1.1
    assert greedy_rules(_row([1], [3], min_new_tokens=2))[1] is None
    assert greedy_rules(_row([1, 2], [3], repetition_penalty=1.1, seed=1, temperature=0.5)) is None
    assert greedy_rules(_row([1], [3], frequency_penalty=0.5)) is None
    assert greedy_rules(_row([1], [3], repetition_penalty=1.1, no_repeat_ngram_size=2)) is None


@pytest.mark.integration
def test_the_stop_string_check_agrees_with_transformers_criteria(backend):
    """Over random ids and ids that spell a stop string in several tokenizations, the check says
    what StopStringCriteria says, and skips the criteria for most tokens."""
    tokenizer = backend.tokenizer
    stops = ("\nUser:", "stop", "THE END")
    check = StopStrings(tokenizer, stops)
    criteria = StopStringCriteria(tokenizer, list(stops))
    assert 0 < len(check.enders) < tokenizer.vocab_size // 10
    rng = random.Random(11)
    texts = ["Hello there\nUser:", "nonstop", "a stopper", "THE END", "The end.", "User: hi"]
    sequences = [tokenizer.encode(t, add_special_tokens=False) for t in texts]
    # Ids ending in each stop string's tokens, preceded by random ones.
    sequences += [[rng.randrange(tokenizer.vocab_size) for _ in range(5)] + s for s in sequences]
    sequences += [
        [rng.randrange(tokenizer.vocab_size) for _ in range(rng.randrange(1, 12))]
        for _ in range(400)
    ]
    sequences += [s + [e] for s in sequences[:40] for e in rng.sample(sorted(check.enders), 3)]
    hits = 0
    for ids in sequences:
        expected = bool(criteria(torch.tensor([ids[-criteria.maximum_token_len :]]), None))
        assert check.hit(ids) == expected, tokenizer.decode(ids)
        hits += expected
    assert hits >= 4
