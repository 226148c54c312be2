"""The tokenizer's public contract (engine/tokenize.py docstring, stage 1)."""

from __future__ import annotations

import importlib
import unicodedata

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine import tokenize
from engine.tokenize import tokens_from_list
from conftest import examples

TEXT = settings(max_examples=examples(400), deadline=None, derandomize=True)


def texts(sentence: str, **kw) -> list[str]:
    return [t.text for t in tokenize(sentence, **kw)]


@pytest.mark.parametrize(
    "sentence, expected",
    [
        ("the cat sat", ["the", "cat", "sat"]),
        ("  the   cat\tsat\n", ["the", "cat", "sat"]),  # any whitespace separates, none is kept
        ("Hello, world!", ["Hello", ",", "world", "!"]),
        ("wait!!", ["wait", "!", "!"]),  # each punctuation mark is its own token
        ("don't", ["don", "'", "t"]),
        ("a_b", ["a", "_", "b"]),  # underscore is punctuation here
        ("3.14 and 42nd x2", ["3", ".", "14", "and", "42nd", "x2"]),  # digits are word characters
        ("Ⅻ ½", ["Ⅻ", "½"]),  # \p{N} beyond ASCII digits
        ("$5 + 3 = 8 ©", ["$", "5", "+", "3", "=", "8", "©"]),  # symbols are single tokens
        ("The the", ["The", "the"]),  # no case folding
    ],
)
def test_words_and_punctuation(sentence, expected):
    assert texts(sentence) == expected


@pytest.mark.parametrize(
    "sentence, expected",
    [
        ("I 👩\u200d💻 code", ["I", "👩\u200d💻", "code"]),  # ZWJ sequence: one token
        ("👨\u200d👩\u200d👧\u200d👦", ["👨\u200d👩\u200d👧\u200d👦"]),  # family, four people, one token
        ("👍🏽👍", ["👍🏽", "👍"]),  # skin-tone modifier stays with its emoji
        ("🇫🇷🇩🇪", ["🇫🇷", "🇩🇪"]),  # flags: regional-indicator pairs
        ("❤\ufe0f!", ["❤\ufe0f", "!"]),  # variation selector stays attached
        ("1\ufe0f\u20e3", ["1\ufe0f\u20e3"]),  # keycap: digit + marks, one token
        ("hi😀there", ["hi", "😀", "there"]),
    ],
)
def test_emoji_sequences_are_one_token_each(sentence, expected):
    assert texts(sentence) == expected


@pytest.mark.parametrize(
    "sentence, expected",
    [
        ("你好世界", ["你", "好", "世", "界"]),  # Han: one token per ideograph
        ("東京タワーへ", ["東", "京", "タ", "ワ", "ー", "へ"]),  # Katakana, the long-vowel mark, Hiragana
        ("AI是未来", ["AI", "是", "未", "来"]),  # a Latin word runs into ideographs
        ("我爱NLP。", ["我", "爱", "NLP", "。"]),  # ideographic full stop is punctuation
        ("한국어 문장", ["한국어", "문장"]),  # Hangul uses spaces: whole words
    ],
)
def test_cjk(sentence, expected):
    assert texts(sentence) == expected


@pytest.mark.parametrize(
    "sentence, expected",
    [
        ("café", ["café"]),  # precomposed é (NFC)
        ("cafe\u0301", ["cafe\u0301"]),  # e + combining acute (NFD): the mark stays in the word
        ("naïve Zoë", ["naïve", "Zoë"]),
        ("Z\u0351\u0352a\u0353lgo", ["Z\u0351\u0352a\u0353lgo"]),  # stacked combining marks
        ("नमस्ते दुनिया", ["नमस्ते", "दुनिया"]),  # Devanagari: virama and vowel signs are marks
        ("می\u200cخواهم", ["می\u200cخواهم"]),  # Persian ZWNJ inside a word
        ("क्\u200dष", ["क्\u200dष"]),  # ZWJ after a virama stays in the word
        ("مرحبا بالعالم", ["مرحبا", "بالعالم"]),  # Arabic, logical (storage) order
        ("שָׁלוֹם עולם!", ["שָׁלוֹם", "עולם", "!"]),  # Hebrew with niqqud points
        ("السعر ١٢٣", ["السعر", "١٢٣"]),  # Arabic-Indic digits
    ],
)
def test_accents_marks_and_non_latin_scripts(sentence, expected):
    assert texts(sentence) == expected


def test_nfc_and_nfd_are_different_token_texts():
    nfc, nfd = unicodedata.normalize("NFC", "café"), unicodedata.normalize("NFD", "café")
    assert texts(f"{nfc} {nfd}") == [nfc, nfd] and nfc != nfd  # not normalised


def test_a_combining_mark_with_no_base_is_a_token_of_its_own():
    assert texts("\u0301a") == ["\u0301", "a"]


@pytest.mark.parametrize("sentence", ["", " ", "   ", "\t\n\r\x0b\x0c", "\u00a0\u2003\u3000\u2028"])
def test_whitespace_only_gives_no_tokens(sentence):
    assert tokenize(sentence) == []


def test_offsets_are_code_points_into_the_sentence_as_given():
    sentence = " 😀 café\u0301 你好, مرحبا! "
    toks = tokenize(sentence)
    assert [(t.index, t.text, t.start, t.end) for t in toks] == [
        (0, "😀", 1, 2), (1, "café\u0301", 3, 8), (2, "你", 9, 10), (3, "好", 10, 11), (4, ",", 11, 12),
        (5, "مرحبا", 13, 18), (6, "!", 18, 19),
    ]
    assert all(sentence[t.start:t.end] == t.text for t in toks)


@pytest.mark.parametrize("limit, expected", [(0, []), (1, ["a"]), (3, ["a", "b", ","]), (4, ["a", "b", ",", "c"]),
                                             (99, ["a", "b", ",", "c"]), (None, ["a", "b", ",", "c"])])
def test_limit_stops_after_that_many_tokens(limit, expected):
    assert texts("a b, c", limit=limit) == expected


def test_limit_keeps_offsets_of_the_full_sentence():
    toks = tokenize("  alpha beta gamma", limit=2)
    assert [(t.text, t.start, t.end) for t in toks] == [("alpha", 2, 7), ("beta", 8, 12)]


def test_tokens_from_list_offsets_index_the_tokens_joined_by_single_spaces():
    words = ["the", "cat", "👩\u200d💻", "sat"]
    joined = " ".join(words)
    toks = tokens_from_list(words)
    assert [t.index for t in toks] == [0, 1, 2, 3]
    assert [joined[t.start:t.end] for t in toks] == words


# --- Properties on arbitrary text ---------------------------------------------

def check_contract(sentence: str, toks) -> None:
    assert [t.index for t in toks] == list(range(len(toks)))
    previous_end = 0
    for t in toks:
        assert sentence[t.start:t.end] == t.text
        assert t.text and not any(c.isspace() for c in t.text), repr(t.text)
        assert previous_end <= t.start < t.end  # increasing and non-overlapping
        assert sentence[previous_end:t.start].isspace() or previous_end == t.start  # only whitespace skipped
        previous_end = t.end
    assert sentence[previous_end:].isspace() or previous_end == len(sentence)
    assert "".join(t.text for t in toks) == "".join(c for c in sentence if not c.isspace())


@TEXT
@given(st.text())
def test_any_text_tokenizes_within_the_contract(sentence):
    # Never raises; tokens cover every non-whitespace character exactly once.
    check_contract(sentence, tokenize(sentence))


@TEXT
@given(st.lists(st.sampled_from(["a", "é", "e\u0301", "你", "😀", "👩\u200d💻", "🇫🇷", "!", "_", "1", " ", "\t",
                                 "\u200d", "\u0301", "ب", "क्ष", "\u3000", "\u0600"]), max_size=20).map("".join))
def test_mixed_scripts_tokenize_within_the_contract(sentence):
    # A denser mix of the hard cases than st.text() tends to produce.
    check_contract(sentence, tokenize(sentence))


@TEXT
@given(st.text(), st.integers(0, 10))
def test_limit_returns_a_prefix(sentence, limit):
    assert tokenize(sentence, limit=limit) == tokenize(sentence)[:limit]


# --- Regression: found by these tests on engine 1.0.0, fixed in 631ca77 -----------------

@pytest.mark.parametrize(
    "sentence, expected",
    [
        ("\u0600 x", ["\u0600", "x"]),  # ARABIC NUMBER SIGN then a space: the space ends up inside the token
        ("a \u06dd b", ["a", "\u06dd", "b"]),  # ARABIC END OF AYAH
        ("\u0600١٢٣", ["\u0600", "١٢٣"]),  # the sign must not split the number it prefixes
        ("\u0600abc", ["\u0600", "abc"]),
    ],
)
def test_prepended_concatenation_mark_does_not_swallow_a_following_space(sentence, expected):
    # \X treats Grapheme_Cluster_Break=Prepend characters (U+0600–U+0605, U+06DD, …) as
    # attaching to whatever follows, even a space, so a "symbol" token contains whitespace.
    toks = tokenize(sentence)
    assert [t.text for t in toks] == expected
    check_contract(sentence, toks)


# ASCII text takes a one-regex path (engine/tokenize.py); it must split exactly as the general rules do.
ASCII = [chr(i) for i in range(128)]
general = importlib.import_module("engine.tokenize")._tokenize_unicode  # the module, not engine's function


def test_ascii_path_equals_the_general_rules_on_every_pair_of_characters():
    for a in ASCII:
        for b in ASCII:
            assert tokenize(a + b) == general(a + b), repr(a + b)


@TEXT
@given(st.text(alphabet=st.sampled_from(ASCII), max_size=40), st.one_of(st.none(), st.integers(0, 6)))
def test_ascii_path_equals_the_general_rules(sentence, limit):
    assert tokenize(sentence, limit) == general(sentence, limit)
