"""Pure parts of explore runs: Elo tournament, similarity, safety, selection."""

from __future__ import annotations

from ._elo import START as START
from ._elo import Judge as Judge
from ._elo import apply_results as apply_results
from ._elo import expected as expected
from ._elo import id_key as id_key
from ._elo import play_round as play_round
from ._elo import random_round as random_round
from ._elo import top_round as top_round
from ._elo import update as update
from ._evidence import evidence_items as evidence_items
from ._evidence import goal_words as goal_words
from ._safety import mentions as mentions
from ._safety import screen as screen
from ._select import aggregate as aggregate
from ._select import critique_problem as critique_problem
from ._select import decide as decide
from ._select import rank_key as rank_key
from ._select import review_reasons as review_reasons
from ._select import select as select
from ._select import shortfalls as shortfalls
from ._similarity import clusters as clusters
from ._similarity import similarity as similarity
from ._similarity import words as words

__all__ = (
    "START",
    "Judge",
    "aggregate",
    "apply_results",
    "clusters",
    "critique_problem",
    "decide",
    "evidence_items",
    "expected",
    "goal_words",
    "id_key",
    "mentions",
    "play_round",
    "random_round",
    "rank_key",
    "review_reasons",
    "screen",
    "select",
    "shortfalls",
    "similarity",
    "top_round",
    "update",
    "words",
)
