"""The training text: the King James Bible as Debian's bible-kjv / bible-kjv-text packages ship it.

One verse per line, verse numbers and chapter headings dropped. Every 25th chapter (counting from
Genesis 1 as chapter 0) is held out for validation, so the split is fixed by the text alone.
"""
import re
import subprocess

VAL_EVERY = 25
_HEADING = re.compile(r"^[1-3]?\s?[A-Za-z][A-Za-z ]* \d+$")
_VERSE = re.compile(r"^\s+\d+ (.*)$")


def read_kjv():
    """Returns (train_lines, val_lines): verses without numbers, split by chapter."""
    train, val, _, _ = read_kjv_chapters()
    return train, val


def read_kjv_chapters():
    """(train_lines, val_lines, train_chapter_ends, val_chapter_ends); the ends are sets of the
    indices of each chapter's last line in its split."""
    out = subprocess.run(["bible", "-l100000", "gen1:1-rev22:21"], check=True, capture_output=True, text=True).stdout
    train, val, train_ends, val_ends = [], [], set(), set()
    chapter = -1
    for raw in out.split("\n"):
        line = raw.rstrip()
        if not line:
            continue
        verse = _VERSE.match(line)
        if verse:
            if chapter < 0:
                raise ValueError("verse before the first chapter heading")
            text = " ".join(verse.group(1).split())
            (val if chapter % VAL_EVERY == 0 else train).append(text)
        elif _HEADING.match(line):
            _close_chapter(chapter, train, val, train_ends, val_ends)
            chapter += 1
        else:
            raise ValueError(f"unexpected line in bible output: {line!r}")
    _close_chapter(chapter, train, val, train_ends, val_ends)
    if chapter + 1 != 1189:
        raise ValueError(f"expected 1189 chapters, found {chapter + 1}")
    for text in train + val:
        if not text.isascii():
            raise ValueError(f"non-ASCII verse (the ASCII pre-tokenizer would diverge): {text!r}")
    return train, val, train_ends, val_ends


def _close_chapter(chapter, train, val, train_ends, val_ends):
    if chapter >= 0:
        lines, ends = (val, val_ends) if chapter % VAL_EVERY == 0 else (train, train_ends)
        ends.add(len(lines) - 1)
