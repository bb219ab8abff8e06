"""A generated section of README.md: the text between two marker lines, replaced in place.

The scoreboard (``validate.scoreboard``, ``<!-- scoreboard:start -->``) and the null calibration
(``validate.calibrate``, ``<!-- calibration:start -->``) each own one; what lies outside the markers is the
README's own prose and is never touched.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path


def replace_section(
    readme: str | Path, start: str, end: str, markdown: str, what: str, edit: Callable[[str], str] | None = None
) -> None:
    """Write ``markdown`` between the lines ``start`` and ``end`` of ``readme`` (``edit``, when given, makes it
    from the section's current text: ``edit(old)``). Raises ValueError naming the file, the ``what`` section
    and the markers to add when they are missing or out of order; nothing is written then."""
    path = Path(readme)
    text = path.read_text()
    if start not in text or end not in text or text.index(start) > text.index(end):
        raise ValueError(f"{path}: no {what} section; add the lines {start} and {end} (in that order) where it goes")
    head, rest = text.split(start, 1)
    old, tail = rest.split(end, 1)
    new = edit(old) if edit else markdown
    path.write_text(f"{head}{start}\n{new.rstrip()}\n{end}{tail}")
