"""The Elo arithmetic against hand-computed values, and seeded pairings."""

from __future__ import annotations

import random

import pytest

from replan.explore import (
    START,
    apply_results,
    expected,
    play_round,
    random_round,
    top_round,
    update,
)
from replan.messages import EloRating


def test_ratings_start_at_1200() -> None:
    assert START == 1200.0
    assert EloRating().rating == 1200.0


def test_equal_ratings_expect_an_even_score_and_move_by_half_of_k() -> None:
    assert expected(1200, 1200) == 0.5
    # 1200 + 32 * (1 - 0.5) = 1216; 1200 - 16 = 1184
    assert update(1200, 1200, a_won=True) == (1216.0, 1184.0)
    assert update(1200, 1200, a_won=False) == (1184.0, 1216.0)


def test_an_upset_moves_the_ratings_by_the_hand_computed_amount() -> None:
    # E_a = 1 / (1 + 10^((1200 - 1400) / 400)) = 1 / (1 + 10^-0.5) = 0.7597469
    assert expected(1400, 1200) == pytest.approx(0.7597469, abs=1e-7)
    # a loses: 1400 + 32 * (0 - 0.7597469) = 1375.68810; b gains the same 24.3119
    a, b = update(1400, 1200, a_won=False)
    assert a == pytest.approx(1375.68810, abs=1e-4)
    assert b == pytest.approx(1224.31190, abs=1e-4)


def test_the_k_factor_scales_the_change() -> None:
    # 400 points apart: E_a = 1 / (1 + 10^-1) = 0.9090909; a wins with k = 10
    a, b = update(1600, 1200, a_won=True, k=10)
    assert a == pytest.approx(1600 + 10 * (1 - 0.9090909), abs=1e-6)
    assert a + b == pytest.approx(2800)


def test_applying_a_round_folds_results_in_order_with_win_records() -> None:
    ratings = {h: EloRating() for h in ("H1", "H2", "H3")}
    after, records = apply_results(
        ratings,
        [("H1", "H2", "a", "r1"), ("H1", "H3", "b", "r2")],
        iteration=1,
        round_index=1,
        k=32,
    )
    # H1 beat H2 (1216 / 1184), then lost to H3 at 1216 vs 1200:
    # E = 1 / (1 + 10^(-16/400)) = 1 / 1.912011 = 0.5230096
    # -> H1 1216 - 32 * 0.5230096 = 1199.263693; H3 1200 + 16.736307
    assert after["H1"].rating == pytest.approx(1199.263693, abs=1e-5)
    assert after["H3"].rating == pytest.approx(1216.736307, abs=1e-5)
    assert after["H2"].rating == 1184.0
    assert (after["H1"].wins, after["H1"].losses) == (1, 1)
    assert [r.winner for r in records] == ["H1", "H3"]
    assert records[1].rating_a == after["H1"].rating
    assert ratings["H1"].rating == 1200.0  # the input is not modified


def test_a_random_round_pairs_everyone_once_and_leaves_an_odd_one_out() -> None:
    ids = [f"H{i}" for i in range(1, 8)]
    pairs = random_round(ids, random.Random(3))
    seen = [h for pair in pairs for h in pair]
    assert len(pairs) == 3
    assert len(set(seen)) == 6


def test_the_same_seed_gives_the_same_pairings_and_another_seed_differs() -> None:
    ids = [f"H{i}" for i in range(1, 11)]
    first = [random_round(ids, random.Random("7:1")) for _ in range(3)]
    assert first[0] == first[1] == first[2]
    others = {tuple(random_round(ids, random.Random(f"{s}:1"))) for s in range(8)}
    assert len(others) > 1


def test_the_top_round_is_a_round_robin_among_the_highest_rated() -> None:
    ratings = {
        "H1": EloRating(rating=1250),
        "H2": EloRating(rating=1100),
        "H3": EloRating(rating=1300),
        "H4": EloRating(rating=1210),
        "H5": EloRating(rating=1210),
    }
    pairs = top_round(list(ratings), ratings, top_n=3)
    assert pairs == [("H3", "H1"), ("H3", "H4"), ("H1", "H4")]


async def test_a_round_is_judged_concurrently_and_reported_in_pairing_order() -> None:
    import anyio

    async def judge(a: str, b: str):
        # The first pair answers last: order must still follow the pairing.
        await anyio.sleep(0.02 if a == "H1" else 0.0)
        return ("a" if a < b else "b", f"{a} vs {b}")

    results = await play_round([("H1", "H2"), ("H4", "H3")], judge)
    assert results == [("H1", "H2", "a", "H1 vs H2"), ("H4", "H3", "b", "H4 vs H3")]


async def test_a_comparison_that_cannot_be_made_is_left_out() -> None:
    async def judge(a: str, b: str):
        return None if a == "H3" else ("a", "")

    results = await play_round([("H1", "H2"), ("H3", "H4")], judge)
    assert [r[:2] for r in results] == [("H1", "H2")]
