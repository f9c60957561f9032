"""Near-duplicates by word-set similarity, grouped into clusters."""

from __future__ import annotations

from replan.explore import clusters, similarity, words


def test_words_ignore_case_punctuation_stop_words_and_plurals() -> None:
    assert words("The Users abandon the SETUP, when permissions lack!") == {
        "user",
        "abandon",
        "setup",
        "permission",
        "lack",
    }


def test_rephrasings_are_similar_and_different_ideas_are_not() -> None:
    a = "Users abandon setup when admin permissions are missing"
    b = "Users abandon the setup when they lack admin permissions"
    c = "Pricing confusion drives churn in the second month"
    assert similarity(a, b) >= 0.6
    assert similarity(a, c) < 0.2
    assert similarity(a, a) == 1.0


def test_words_of_any_script_count_and_unrelated_ideas_in_them_differ() -> None:
    # Read as Latin letters only, these had no words and scored 1.0: duplicates.
    a = "Пользователи бросают настройку без прав администратора"
    b = "Цены путают клиентов во втором месяце"
    assert similarity(a, b) < 0.2
    assert similarity(a, a) == 1.0
    assert similarity("用户因权限不足放弃设置", "价格混乱导致第二个月流失") < 0.2
    assert words("Café crème, CAFÉ") == {"café", "crème"}


def test_clusters_link_near_duplicates_and_keep_the_best_ranked_as_representative() -> (
    None
):
    texts = {
        "H1": "Solo cooks leave because recipes serve four people",
        "H2": "Budget setters stay longer than other cooks",
        "H3": "Solo cooks leave because the recipes serve four",
        "H10": "Recipes serve four so solo cooks leave",
    }
    strength = {"H1": 2, "H2": 0, "H3": 1, "H10": 3}
    groups = clusters(texts, 0.6, rank=lambda h: (strength[h],))
    assert groups == [("H2", ["H2"]), ("H3", ["H1", "H3", "H10"])]


def test_a_threshold_of_one_merges_only_identical_word_sets() -> None:
    texts = {"H1": "cooks leave early", "H2": "Cooks leave, early!", "H3": "cooks stay"}
    groups = clusters(texts, 1.0, rank=lambda h: (h,))
    assert [members for _, members in groups] == [["H1", "H2"], ["H3"]]


def test_a_combining_mark_continues_its_word_in_any_script() -> None:
    # Python's \w takes no combining mark: a Devanagari vowel sign, or an
    # accent typed apart from its letter, split a word into single letters,
    # and unrelated statements shared those "words".
    assert words("हिन्दी भाषा") == {"हिन्दी", "भाषा"}
    assert words("nai\u0308ve cafe\u0301") == {"naïve", "café"}
    assert similarity("naïve cooks skip plans", "nai\u0308ve cooks skip plans") == 1.0
    a = "रसोइये इसलिए छोड़ते हैं क्योंकि व्यंजन चार लोगों के लिए होते हैं"
    b = "बचा हुआ खाना साप्ताहिक योजना को बेकार महसूस कराता है"
    assert similarity(a, b) < 0.1
