"""Rules for text that users name things with, shared by every layer that accepts or prints it."""

from __future__ import annotations

import unicodedata

DNS_LABEL = r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$"
"""Job names, projects and labels: lower-case letters, digits and inner dashes, at most 63
characters (RFC 1123, as Kubernetes names objects)."""
DNS_LABEL_HINT = "use 1-63 lower-case letters, digits and dashes, starting and ending with a letter or digit"


def _is_control(character: str) -> bool:
    # Category C: control, format (bidi overrides, zero-width), surrogate, private, unassigned.
    return unicodedata.category(character).startswith("C")


def has_control_character(text: str) -> bool:
    """Whether ``text`` holds an escape, a newline, a bidi override or another character that
    would drive or fake a terminal when printed. (``isprintable`` answers most text at C speed;
    it also balks at spaces other than the plain one, which are no control characters.)"""
    return not text.isprintable() and any(map(_is_control, text))


def composed(text: str) -> str:
    """``text`` in Unicode normal form C: what a name must already be, so that two names never
    print alike (``café`` composed and ``cafe`` with a combining accent are one name or none)."""
    return unicodedata.normalize("NFC", text)


def printable(text: str) -> str:
    """``text`` with each control character written as its escape (``\\x1b``), safe to print."""
    if not has_control_character(text):
        return text
    return "".join(c.encode("unicode_escape").decode("ascii") if _is_control(c) else c for c in text)
