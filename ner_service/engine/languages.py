"""A text's language as far as the shipped models need it: Chinese or not."""

from __future__ import annotations

import re

from ner_service.engine.spans import CJK

#: The share of a text's units (a CJK ideograph, or a word of other letters) that are ideographs
#: from which it is read as Chinese: a Chinese text quoting English names is still Chinese, an
#: English one quoting a name in Chinese is not.
CHINESE_SHARE = 0.4
_IDEOGRAPH = re.compile(f"[{CJK}]")
_WORD = re.compile(f"[^\\W\\d_{CJK}]+")


def guess_language(text: str) -> str | None:
    """``"zh"`` for a text whose units are mostly CJK ideographs, ``"en"`` for one with words
    otherwise, None for a text of neither (digits, punctuation)."""
    ideographs, words = len(_IDEOGRAPH.findall(text)), len(_WORD.findall(text))
    if not ideographs + words:
        return None
    return "zh" if ideographs >= CHINESE_SHARE * (ideographs + words) else "en"
