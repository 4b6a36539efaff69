"""unicode_since9.py: the code points that Unicode 10.0 and later made part of normalization, from
Debian's unicode-data (DerivedAge.txt, UnicodeData.txt): those added after 9.0 that have a combining
class, a canonical decomposition, or appear in one.

    python3 scripts/unicode_since9.py [--unicode-dir /usr/share/unicode] [--c]

The Hugging Face tokenizers library normalizes with Unicode 9.0's tables (its crate
unicode-normalization-alignments); to it these characters are unassigned: starters that nothing
reorders or composes. src/data/tok_hf.c holds the ranges (--c prints them as its table does), and
python/tests/test_prepare_corpora.py checks that table against this script and the library's version.
"""

import argparse
import os


def ranges(unicode_dir="/usr/share/unicode"):
    """[(first, last)] of the code points, in order."""
    age = {}
    with open(os.path.join(unicode_dir, "DerivedAge.txt"), encoding="utf-8") as f:
        for line in f:
            line = line.split("#")[0].strip()
            if not line:
                continue
            span, version = (x.strip() for x in line.split(";"))
            first, _, last = span.partition("..")
            for cp in range(int(first, 16), int(last or first, 16) + 1):
                age[cp] = tuple(int(x) for x in version.split("."))
    involved = set()
    with open(os.path.join(unicode_dir, "UnicodeData.txt"), encoding="utf-8") as f:
        for line in f:
            fields = line.split(";")
            cp = int(fields[0], 16)
            if int(fields[3]):
                involved.add(cp)
            if fields[5] and not fields[5].startswith("<"):
                involved.add(cp)
                involved.update(int(x, 16) for x in fields[5].split())
    out = []
    for cp in sorted(c for c in involved if age.get(c, (99,)) > (9, 0)):
        if out and out[-1][1] == cp - 1:
            out[-1][1] = cp
        else:
            out.append([cp, cp])
    return [tuple(r) for r in out]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--unicode-dir", default="/usr/share/unicode")
    ap.add_argument("--c", action="store_true", help="print the ranges as tok_hf.c's table")
    a = ap.parse_args()
    rs = ranges(a.unicode_dir)
    if a.c:
        cells = [f"{{0x{x:X}, 0x{y:X}}}" for x, y in rs]
        for i in range(0, len(cells), 7):
            print("    " + ", ".join(cells[i:i + 7]) + ",")
    else:
        for x, y in rs:
            print(f"{x:04X}..{y:04X}")
    print(f"// {sum(y - x + 1 for x, y in rs)} code points, {len(rs)} ranges")


if __name__ == "__main__":
    main()
