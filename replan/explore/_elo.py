"""Elo ratings and the pairings of a hypothesis tournament.

Ratings start at 1200. A comparison moves both ratings by ``k`` times the
difference between the result and the expected score, so beating a stronger
candidate gains more than beating a weaker one. Pairings are drawn from a
seeded ``random.Random``: a fixed seed gives a fixed tournament.
"""

from __future__ import annotations

import math
import random
from collections.abc import Awaitable, Callable, Sequence
from itertools import combinations
from typing import Literal

import anyio

from ..messages import ComparisonRecord, EloRating

START = 1200.0

Judge = Callable[[str, str], Awaitable[tuple[Literal["a", "b"], str] | None]]
"""``await judge(a_id, b_id)``: the winner and a rationale, or None when the
comparison could not be made (it is then left out)."""


def expected(rating_a: float, rating_b: float) -> float:
    """The score ``a`` is expected to take against ``b`` (0 to 1)."""
    return 1.0 / (1.0 + math.pow(10.0, (rating_b - rating_a) / 400.0))


def update(
    rating_a: float, rating_b: float, a_won: bool, k: float = 32.0
) -> tuple[float, float]:
    """Both ratings after one comparison between ``a`` and ``b``."""
    score_a = 1.0 if a_won else 0.0
    delta = k * (score_a - expected(rating_a, rating_b))
    return rating_a + delta, rating_b - delta


def random_round(ids: Sequence[str], rng: random.Random) -> list[tuple[str, str]]:
    """Pair every candidate once in a shuffled order; an odd one sits out."""
    order = sorted(ids)
    rng.shuffle(order)
    return [(order[i], order[i + 1]) for i in range(0, len(order) - 1, 2)]


def top_round(
    ids: Sequence[str], ratings: dict[str, EloRating], top_n: int
) -> list[tuple[str, str]]:
    """A round robin among the ``top_n`` highest rated (ties by id)."""
    ranked = sorted(ids, key=lambda i: (-ratings[i].rating, id_key(i)))
    return list(combinations(ranked[:top_n], 2))


def apply_results(
    ratings: dict[str, EloRating],
    results: Sequence[tuple[str, str, Literal["a", "b"], str]],
    *,
    iteration: int,
    round_index: int,
    k: float,
) -> tuple[dict[str, EloRating], list[ComparisonRecord]]:
    """Fold one round's results, in order, into new ratings and records."""
    out = dict(ratings)
    records: list[ComparisonRecord] = []
    for a, b, winner, rationale in results:
        ra, rb = out.get(a, EloRating()), out.get(b, EloRating())
        new_a, new_b = update(ra.rating, rb.rating, winner == "a", k)
        out[a] = EloRating(
            rating=new_a,
            wins=ra.wins + (winner == "a"),
            losses=ra.losses + (winner == "b"),
        )
        out[b] = EloRating(
            rating=new_b,
            wins=rb.wins + (winner == "b"),
            losses=rb.losses + (winner == "a"),
        )
        records.append(
            ComparisonRecord(
                a=a,
                b=b,
                winner=a if winner == "a" else b,
                rating_a=new_a,
                rating_b=new_b,
                iteration=iteration,
                round=round_index,
                rationale=rationale,
            )
        )
    return out, records


async def play_round(
    pairs: Sequence[tuple[str, str]], judge: Judge
) -> list[tuple[str, str, Literal["a", "b"], str]]:
    """Judge every pair concurrently; results come back in pairing order."""
    answers: list[tuple[Literal["a", "b"], str] | None] = [None] * len(pairs)

    async def one(index: int, a: str, b: str) -> None:
        answers[index] = await judge(a, b)

    async with anyio.create_task_group() as tg:
        for index, (a, b) in enumerate(pairs):
            tg.start_soon(one, index, a, b)
    return [
        (a, b, answer[0], answer[1])
        for (a, b), answer in zip(pairs, answers, strict=True)
        if answer is not None
    ]


def id_key(hypothesis_id: str) -> tuple[int, str]:
    """Sort key putting ``H2`` before ``H10``."""
    digits = hypothesis_id.removeprefix("H")
    return (int(digits), "") if digits.isdigit() else (0, hypothesis_id)
