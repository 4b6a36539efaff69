#!/usr/bin/env python3
"""No two .c files under src/ need each other (docs/architecture.md, "The layers").

A file "needs" another when it names a function the other defines with external linkage. Two files
that need each other are one module split in the wrong place: the piece both use belongs in a file
(or a private header) below both. The layer order itself is the linker's to check; this is the same
rule inside a layer, which no linker sees.

Usage: file_circles.py SRC_DIR. Prints every pair and the names each side takes; exit 1 if any.
"""
import os
import re
import sys

# a definition: at column 0, not static, a name followed by "(", then the body's "{" on that line or
# a later one (a signature over two lines), before any ";" (a declaration)
DEF = re.compile(r'^(?!static\b|typedef\b|struct\b|enum\b|union\b|#)[A-Za-z_][\w \t\*]*?\b([A-Za-z_]\w*)\s*\(')
NAME = re.compile(r'\b[A-Za-z_]\w*\b')
# comments, then string and character literals: a name inside a message is not a use
COMMENT = re.compile(r'//[^\n]*|/\*.*?\*/', re.S)
LITERAL = re.compile(r'"(?:\\.|[^"\\\n])*"|\'(?:\\.|[^\'\\\n])*\'')


def strip(text):
    return LITERAL.sub('""', COMMENT.sub(' ', text))


def definitions(text):
    names, pending = [], None
    for line in text.split('\n'):
        m = DEF.match(line)
        if m:
            pending = m.group(1)
        if pending and '{' in line:
            names.append(pending)
            pending = None
        elif pending and line.rstrip().endswith(';'):
            pending = None  # a declaration, not a definition
    return names


def main(src):
    files = sorted(os.path.join(d, f) for d, _, fs in os.walk(src) for f in fs if f.endswith('.c'))
    text = {f: strip(open(f, encoding='utf-8').read()) for f in files}
    owner = {}
    for f in files:
        for name in definitions(text[f]):
            owner.setdefault(name, f)
    needs = {f: {} for f in files}
    for f in files:
        for name in set(NAME.findall(text[f])):
            g = owner.get(name)
            if g and g != f:
                needs[f].setdefault(g, []).append(name)
    bad = 0
    for i, a in enumerate(files):
        for b in files[i + 1:]:
            if b in needs[a] and a in needs[b]:
                bad += 1
                print(f'{os.path.relpath(a, src)} <-> {os.path.relpath(b, src)}: '
                      f'{sorted(needs[a][b])} / {sorted(needs[b][a])}')
    print(f'{len(files)} files, {len(owner)} functions, {bad} pair(s) that need each other')
    return 1 if bad else 0


if __name__ == '__main__':
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    sys.exit(main(sys.argv[1]))
