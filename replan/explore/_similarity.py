"""Near-duplicate detection: word-set similarity and single-link clusters.

Deliberately simple and deterministic: case-folded words, stop words and a
plural ``s`` removed, compared by Jaccard similarity. Two hypotheses at or
above the threshold are the same idea; clusters are the connected groups.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ._elo import id_key

_WORD = re.compile(r"[^\W_]+")
"""Letters and digits of any script (``café``, ``Гипотеза``)."""

_STOP = """
a an and are as at be because been but by can could do does for from has have
how if in into is it its may might more most not of on or so than that the their
them then there these they this those to too was were what when which while who
why will with would
"""
STOP_WORDS = frozenset(_STOP.split())


def text_words(text: str) -> list[str]:
    """The case-folded words of ``text``, in order: runs of letters, digits
    and combining marks of any script.

    A combining mark continues its word: a Devanagari or Thai vowel sign,
    or an accent typed apart from its letter (``naïve`` decomposed), is
    part of the word, not a break that leaves single letters as words.
    """
    folded = unicodedata.normalize("NFC", text.casefold())
    if folded.isascii():
        return _WORD.findall(folded)
    found: list[str] = []
    word: list[str] = []
    for char in folded:
        if char.isalnum() or (word and unicodedata.category(char).startswith("M")):
            word.append(char)
        elif word:
            found.append("".join(word))
            word = []
    if word:
        found.append("".join(word))
    return found


def words(text: str) -> frozenset[str]:
    """The normalized content words of ``text``."""
    out: set[str] = set()
    for word in text_words(text):
        if word in STOP_WORDS:
            continue
        if len(word) > 3 and word.endswith("s") and not word.endswith("ss"):
            word = word[:-1]
        out.add(word)
    return frozenset(out)


def similarity(a: str, b: str) -> float:
    """Jaccard similarity of the two texts' content words (0 to 1)."""
    wa, wb = words(a), words(b)
    if not wa and not wb:
        return 1.0
    return len(wa & wb) / len(wa | wb)


def clusters(
    texts: Mapping[str, str],
    threshold: float,
    rank: Callable[[str], tuple[Any, ...]],
) -> list[tuple[str, list[str]]]:
    """Group ids whose texts are near-duplicates (single link).

    Args:
        texts: id to text.
        threshold: similarity at which two texts belong together.
        rank: the sort key of a member; the smallest becomes the representative.

    Returns:
        ``(representative, members)`` per cluster, members in id order, the
        clusters in the order of their representatives' rank.
    """
    ids: Sequence[str] = sorted(texts, key=id_key)
    parent = {i: i for i in ids}

    def root(i: str) -> str:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    bags = {i: words(texts[i]) for i in ids}
    for n, a in enumerate(ids):
        for b in ids[n + 1 :]:
            union = bags[a] | bags[b]
            score = len(bags[a] & bags[b]) / len(union) if union else 1.0
            if score >= threshold:
                parent[root(b)] = root(a)
    groups: dict[str, list[str]] = {}
    for i in ids:
        groups.setdefault(root(i), []).append(i)
    out = [(min(members, key=rank), members) for members in groups.values()]
    out.sort(key=lambda pair: rank(pair[0]))
    return out
