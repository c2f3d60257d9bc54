"""Help text as plain text: the command line's descriptions are docstrings written in
reStructuredText, and a terminal should not show their markup."""

from __future__ import annotations

import argparse
import re
from typing import Final

__all__ = ["PlainHelpFormatter", "plain_text"]

_MARKUP: Final = re.compile(r"``(.+?)``|\*\*(.+?)\*\*|:[a-z]+:`~?(.+?)`", re.S)


def plain_text(text: str) -> str:
    """``text`` with its reStructuredText markup (literals, bold, roles) taken out."""
    return _MARKUP.sub(lambda m: next(g for g in m.groups() if g is not None), text)


class PlainHelpFormatter(argparse.RawDescriptionHelpFormatter):
    """A description laid out as written (paragraphs, bullets), without its markup."""

    def format_help(self) -> str:
        return plain_text(super().format_help())
