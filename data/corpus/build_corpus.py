#!/usr/bin/env python3
"""Rebuild data/corpus/ from Debian packages (public-domain English text). Not needed for training: the output
is committed. Run on a Debian 12 machine as root from the repository root:

    apt-get install -y bible-kjv libsword-utils          # `bible` (reads bible-kjv-text) and `mod2imp`
    apt-get download sword-comm-mhcc sword-comm-tdavid sword-text-web
    for d in sword-*.deb; do dpkg -x $d /tmp/mhcc; done
    python3 data/corpus/build_corpus.py --sword-path /tmp/mhcc/usr/share/sword

Writes data/corpus/train.txt.xz and data/corpus/heldout.txt (see README.md there).
Also needs sword-comm-tdavid and sword-text-web unpacked into the same folder (dpkg -x each .deb into /tmp/mhcc).
Held out: the Book of Revelation (the last book of the KJV); the WEB's Revelation is left out entirely.
"""
import argparse, html, lzma, os, re, subprocess

HERE = os.path.dirname(os.path.abspath(__file__))
HELDOUT_BOOK = "Revelation"


def kjv_books():
    """[(book, [[verse, ...] per chapter])] from `bible` (package bible-kjv, data from bible-kjv-text)."""
    raw = subprocess.run(["bible", "-l100000", "-m", "20000", "Gen1:1-Rev22:21"], check=True, capture_output=True,
                         text=True, env={**os.environ, "COLUMNS": "100000"}).stdout
    books, cur_book = [], None
    for line in raw.split("\n"):
        if not line.strip():
            continue
        m = re.match(r"^  (\d+) (.*)$", line)
        if m:
            books[-1][1][-1].append(m.group(2).strip())
            continue
        m = re.match(r"^(.+) (\d+)$", line)
        assert m, f"unexpected line from bible: {line!r}"
        if m.group(1) != cur_book:
            cur_book = m.group(1)
            books.append((cur_book, []))
        books[-1][1].append([])
    n = sum(len(c) for _, chs in books for c in chs)
    assert len(books) == 66 and n == 31102, (len(books), n)
    return books


def kjv_text(book, chapters):
    # one verse a line, no numbers; a blank line between chapters; the book's name as a title
    return f"{book}\n\n" + "\n\n".join("\n".join(vs) for vs in chapters) + "\n"


OSIS_BOOKS = {}  # mod2imp keys use English book names ("Genesis 1:2"), as the KJV output does


def mhcc_books(sword_path):
    """[(book, text)] from Matthew Henry's Concise Commentary (sword-comm-mhcc), markup stripped, in order.
    mod2imp repeats linked entries, so each paragraph is kept only the first time it appears."""
    imp = subprocess.run(["mod2imp", "MHCC"], check=True, capture_output=True, text=True, errors="replace",
                         env={**os.environ, "SWORD_PATH": sword_path}).stdout
    seen, out = set(), []
    for part in imp.split("$$$"):
        if "\n" not in part:
            continue
        key, body = part.split("\n", 1)
        m = re.match(r"^(.+?) \d+:\d+$", key.strip())
        if not m or not body.strip():
            continue
        book = m.group(1)
        b = body
        for tag in ("title", "table", "reference", "note"):
            b = re.sub(rf"<{tag}\b[^>]*>.*?</{tag}>", "", b, flags=re.S)
        b = re.sub(r'<hi type="bold">\s*Verses?\b[^<]*</hi>', "\n", b)
        b = re.sub(r'<div[^>]*type="x-p"[^>]*/>', "\n", b)
        b = re.sub(r"<[^>]+>", "", b)
        b = html.unescape(b)
        for para in b.split("\n"):
            p = re.sub(r"\s+", " ", para).strip()
            p = re.sub(r"\(\s*[,;]?\s*\)", "", p)              # parentheses emptied by removed references
            p = re.sub(r"\s+([,.;:?!])", r"\1", p)
            p = re.sub(r"([,;:])\1+", r"\1", p)
            p = re.sub(r",\.", ".", p)
            p = re.sub(r"\s+", " ", p).strip()
            if len(p) < 20 or p in seen or re.search(r"[^A-Za-z0-9 ,.;:?!'\"()\-]", p):
                continue  # leftovers of markup and odd symbols: drop the whole paragraph
            seen.add(p)
            if not out or out[-1][0] != book:
                out.append((book, []))
            out[-1][1].append(p)
    return [(b, "\n".join(ps) + "\n") for b, ps in out]


ASCII = {"\u201c": '"', "\u201d": '"', "\u2018": "'", "\u2019": "'", "\u2014": " - ", "\u2013": "-",
         "\u2026": "...", "\u00a0": " ", "\u00e6": "ae", "\u00c6": "Ae", "\u0153": "oe"}


def osis_paragraphs(body, para_tags=True):
    """Plain paragraphs from one OSIS/ThML entry of mod2imp's output."""
    b = body
    for tag in ("title", "table", "reference", "note"):
        b = re.sub(rf"<{tag}\b[^>]*>.*?</{tag}>", "", b, flags=re.S)
    b = re.sub(r'<hi type="bold">\s*Verses?\b[^<]*</hi>', "\n", b)
    if para_tags:
        b = re.sub(r'<div[^>]*type="x-p"[^>]*/>', "\n", b)
        b = re.sub(r"<lb\b[^>]*/>", "\n", b)
    b = re.sub(r"<[^>]+>", " " if para_tags else "", b)
    b = html.unescape(b)
    for k, v in ASCII.items():
        b = b.replace(k, v)
    out = []
    for para in b.split("\n"):
        p = re.sub(r"\s+", " ", para).strip()
        p = re.sub(r"\(\s*[,;]?\s*\)", "", p)              # parentheses emptied by removed references
        p = re.sub(r"\s+([,.;:?!])", r"\1", p)
        p = re.sub(r"([,;:])\1+", r"\1", p)
        p = re.sub(r",\.", ".", p)
        p = re.sub(r"\s+", " ", p).strip()
        out.append(p)
    return out


def imp_entries(module, sword_path):
    imp = subprocess.run(["mod2imp", module], check=True, capture_output=True, text=True, errors="replace",
                         env={**os.environ, "SWORD_PATH": sword_path}).stdout
    for part in imp.split("$$$"):
        if "\n" not in part:
            continue
        key, body = part.split("\n", 1)
        m = re.match(r"^(.+?) (\d+):(\d+)$", key.strip())
        if m and body.strip():
            yield m.group(1), int(m.group(2)), int(m.group(3)), body


def web_books(sword_path):
    """[(book, [[verse, ...] per chapter])] from the World English Bible (sword-text-web), footnotes removed."""
    books = []
    for book, c, v, body in imp_entries("engWEB2015eb", sword_path):
        if c == 0 or v == 0:
            continue
        text = " ".join(p for p in osis_paragraphs(body, para_tags=False) if p).strip()
        if not text or re.search(r"[^ -~]", text):
            continue
        if not books or books[-1][0] != book:
            books.append((book, {}))
        books[-1][1].setdefault(c, []).append(text)
    return [(b, [chs[c] for c in sorted(chs)]) for b, chs in books]


def tdavid_text(sword_path):
    """Spurgeon's Treasury of David (sword-comm-tdavid) as paragraphs, each kept once, in order."""
    seen, out = set(), []
    for book, c, v, body in imp_entries("TDavid", sword_path):
        for p in osis_paragraphs(body):
            if len(p) < 40 or p in seen or re.search(r"[^A-Za-z0-9 ,.;:?!'\"()\-]", p):
                continue
            seen.add(p)
            out.append(p)
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sword-path", required=True, help="folder holding mods.d/mhcc.conf")
    ap.add_argument("--out", default=HERE)
    a = ap.parse_args()
    train, held = [], []
    for book, chs in kjv_books():
        (held if book == HELDOUT_BOOK else train).append(kjv_text(book, chs))
    for book, chs in web_books(a.sword_path):
        if book in ("Revelation", "Revelation of John"):
            continue                      # a parallel translation of the held-out book
        train.append(f"The World English Bible: {book}\n\n" + "\n\n".join("\n".join(vs) for vs in chs) + "\n")
    td = tdavid_text(a.sword_path)
    assert sum(map(len, td)) > 3_000_000, "too little Treasury of David text"
    for i in range(0, len(td), 400):      # documents of 400 paragraphs
        train.append("The Treasury of David, by C. H. Spurgeon\n\n" + "\n".join(td[i:i + 400]) + "\n")
    mh = mhcc_books(a.sword_path)
    # mod2imp (libsword 1.9) reports read errors on this module and loses the later books, and the entries it
    # does read are not reliably filed under the right book: the commentary is used as plain prose, without
    # book titles, and none of it is held out (it has nothing on Revelation).
    assert sum(len(t) for _, t in mh) > 2_000_000, "too little commentary text"
    for book, text in mh:
        if len(text) > 1000:
            train.append(f"Matthew Henry's Concise Commentary\n\n{text}")
    # documents are separated by a form feed line, which the trainer uses to split them
    sep = "\n\f\n"
    for d in train + held:
        assert "\f" not in d and all(ord(c) < 128 for c in d), "non-ASCII or form feed in the text"
    with lzma.open(os.path.join(a.out, "train.txt.xz"), "wt", encoding="utf-8", preset=9 | lzma.PRESET_EXTREME) as f:
        f.write(sep.join(train))
    with open(os.path.join(a.out, "heldout.txt"), "w", encoding="utf-8") as f:
        f.write(sep.join(held))
    print(f"train: {len(train)} documents, {sum(map(len, train))} chars; heldout: {len(held)} documents, "
          f"{sum(map(len, held))} chars")


if __name__ == "__main__":
    main()
