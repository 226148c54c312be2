"""Stage 1, ``tokens``: split a sentence into word and punctuation tokens.

Rules (public contract, see docs/engine.md):

* A **word** is a maximal run of letters (``\\p{L}``) and digits (``\\p{N}``)
  of any script. Han, Hiragana and Katakana are written without spaces, so
  each of their characters is a token of its own ("你好" is two tokens).
  Combining marks (``\\p{M}``) and the joiners ZWJ/ZWNJ (U+200D, U+200C)
  that follow a letter or digit stay in its word, so decomposed "café",
  Devanagari and Persian words are one token each.
* **Whitespace** (``str.isspace``) separates tokens and is never a token.
* Everything else is a token on its own, one **grapheme cluster** at a time:
  each punctuation mark, symbol or emoji, with an emoji's modifiers, ZWJ
  sequence or flag pair kept together ("👩‍💻" is one token, "!!" is two).
  Underscore is punctuation here, so "a_b" is three tokens.
* Text is not normalised or case-folded: "The" and "the", or NFC and NFD
  "café", are different token texts with different embeddings.
* ``start``/``end`` are offsets in Unicode code points (Python ``str``
  indices) into the sentence exactly as given: ``sentence[start:end] == text``.
  RTL text keeps logical (storage) order.
* Control characters and lone surrogates are tokenised like symbols; the
  service rejects them at its edge before they get here.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from itertools import islice

import regex

# A word character that is not an ideograph; ideographic scripts get one token
# per character (as BERT's basic tokenizer does), since they use no spaces.
_IDEOGRAPH = r"\p{Han}\p{Hiragana}\p{Katakana}"
_WORD_RE = regex.compile(
    rf"(?:[\p{{L}}\p{{N}}--[{_IDEOGRAPH}]][\p{{M}}\u200c\u200d]*)+"
    rf"|[{_IDEOGRAPH}]\p{{M}}*",
    regex.V1,
)
_GRAPHEME_RE = regex.compile(r"\X")
_WORD_START_RE = regex.compile(r"[\p{L}\p{N}]")

# ASCII text, the common case, split by the same rules in one C scan: letters and digits are
# [A-Za-z0-9], there are no marks, joiners, ideographs or prepend characters, each other
# character is a grapheme cluster of its own, and what str.isspace calls whitespace
# (\t \n \v \f \r, the space, and U+001C–U+001F) is skipped. tests/test_tokenize.py
# holds it to the general path.
_ASCII_TOKEN_RE = re.compile(r"[A-Za-z0-9]+|[^A-Za-z0-9\t\n\x0b\x0c\r \x1c-\x1f]")


@dataclass(frozen=True, slots=True)
class Token:
    index: int
    text: str
    start: int
    end: int


def tokenize(sentence: str, limit: int | None = None) -> list[Token]:
    """Split ``sentence`` into tokens with code-point offsets. Never raises.

    With ``limit``, stop once that many tokens are found, so a huge sentence
    costs no more than the limit before it is rejected.
    """
    if sentence.isascii():
        return [Token(i, m.group(), m.start(), m.end())
                for i, m in enumerate(islice(_ASCII_TOKEN_RE.finditer(sentence), limit))]
    return _tokenize_unicode(sentence, limit)


def _tokenize_unicode(sentence: str, limit: int | None = None) -> list[Token]:
    """``tokenize`` by the general rules, for any text."""
    tokens: list[Token] = []
    pos, n = 0, len(sentence)
    while pos < n and (limit is None or len(tokens) < limit):
        if sentence[pos].isspace():
            pos += 1
            continue
        word = _WORD_RE.match(sentence, pos)
        if word is not None:
            end = word.end()
        else:
            # One grapheme cluster (emoji sequence, punctuation mark + marks).
            # One grapheme cluster: a punctuation mark or symbol with any
            # marks on it, or a whole emoji sequence. It is what a reader sees.
            grapheme = _GRAPHEME_RE.match(sentence, pos)
            assert grapheme is not None  # \X matches one character at least, and pos < len(sentence)
            end = grapheme.end()
            # A "prepend" character (e.g. U+0600 ARABIC NUMBER SIGN) joins the
            # next character into its cluster, even a space or the first digit
            # of a number: cut it there, so the word after it stays whole.
            for i in range(pos + 1, end):
                if sentence[i].isspace() or _WORD_START_RE.match(sentence, i):
                    end = i
                    break
        tokens.append(Token(len(tokens), sentence[pos:end], pos, end))
        pos = end
    return tokens


def tokens_from_list(texts: list[str]) -> list[Token]:
    """Pre-split tokens: offsets index into the tokens joined by single spaces."""
    tokens: list[Token] = []
    pos = 0
    for i, text in enumerate(texts):
        tokens.append(Token(i, text, pos, pos + len(text)))
        pos += len(text) + 1
    return tokens
