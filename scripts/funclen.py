#!/usr/bin/env python3
"""funclen.py: lists the C functions longer than a limit in the repository's tracked sources.

    scripts/funclen.py [--max N] [--tests] [--all] [FILE ...]

Prints one row per function over N lines (default 100), longest first, as `lines file:line name`,
and exits with status 1 when there is any (0 when none), so a test or CI step can use it. Without
FILE arguments it reads the git-tracked .c and .h files under src/ and bench/ (and tests/ with
--tests). --all prints every function, not only the long ones (the exit status still counts only
those over N).

A function's length counts its lines from the one that starts its definition (the return type, at
column 0) through the line of its closing brace. The parser is meant for this codebase's style, not
for any C: comments, strings and preprocessor lines are blanked first; a definition starts at a
column-0 line that is not a directive, and is one when the text up to the first `{` has a `(`, no
`=` and no `;` (prototypes, struct/enum bodies and initialised arrays are skipped); it ends at the
brace that closes that `{`.
"""
import argparse
import os
import re
import subprocess
import sys


def blank_comments_and_strings(text):
    """Returns text with comments, string and char literals replaced by spaces, newlines kept,
    so that braces and parentheses inside them are not counted and line numbers stay the same."""
    out = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
        elif text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            out.append(" " * (j - i))
            i = j
        elif c in "\"'":
            j = i + 1
            while j < n and text[j] != c and text[j] != "\n":
                j += 2 if text[j] == "\\" else 1
            j = min(j + 1, n)
            out.append(c + " " * (j - i - 2) + c if j - i >= 2 else text[i:j])
            i = j
        else:
            out.append(c)
            i += 1
    return "".join(out)


def blank_directives(lines):
    """Blanks preprocessor lines (with their backslash continuations): a macro body is not a
    function, and an #if around a definition must not change the brace count."""
    out, cont = [], False
    for line in lines:
        if cont or line.lstrip().startswith("#"):
            cont = line.rstrip().endswith("\\")
            out.append("")
        else:
            out.append(line)
    return out


def functions(path):
    """Yields (name, first line (1-based), length in lines) for every function defined in path."""
    with open(path, encoding="utf-8", errors="replace") as f:
        lines = blank_directives(blank_comments_and_strings(f.read()).split("\n"))
    i = 0
    while i < len(lines):
        line = lines[i]
        if not line or not (line[0].isalpha() or line[0] == "_"):
            i += 1
            continue
        # Collect the header: from this column-0 line up to the first '{' or ';'.
        head, j = "", i
        while j < len(lines):
            head += lines[j] + "\n"
            if "{" in lines[j] or ";" in lines[j]:
                break
            j += 1
        brace = head.find("{")
        semi = head.find(";")
        before = head[:brace] if brace >= 0 else head
        if brace < 0 or (0 <= semi < brace) or "(" not in before or "=" in before:
            i = j + 1  # a prototype, a declaration, a struct/enum body or an initialiser
            if brace >= 0 and "(" not in before:
                i = skip_braces(lines, j)  # skip the struct/enum/array body as a whole
            continue
        m = re.search(r"([A-Za-z_]\w*)\s*\(", before)
        name = m.group(1) if m else "?"
        end = skip_braces(lines, j) - 1  # index of the line with the closing brace
        yield name, i + 1, end - i + 1
        i = end + 1


def skip_braces(lines, j):
    """Returns the index after the line where the brace opened on line j closes."""
    depth = 0
    for k in range(j, len(lines)):
        depth += lines[k].count("{") - lines[k].count("}")
        if depth <= 0 and "{" in "".join(lines[j:k + 1]):
            return k + 1
    return len(lines)


def tracked_sources(with_tests):
    dirs = ["src", "bench"] + (["tests"] if with_tests else [])
    root = subprocess.run(["git", "rev-parse", "--show-toplevel"], capture_output=True, text=True,
                          check=True).stdout.strip()
    files = subprocess.run(["git", "-C", root, "ls-files", "--"] + dirs, capture_output=True,
                           text=True, check=True).stdout.split()
    return root, [f for f in files if f.endswith((".c", ".h"))]


def main():
    ap = argparse.ArgumentParser(description="List C functions longer than a limit.")
    ap.add_argument("--max", type=int, default=100, help="the longest a function may be (lines)")
    ap.add_argument("--tests", action="store_true", help="also read tests/")
    ap.add_argument("--all", action="store_true", help="print every function, not only long ones")
    ap.add_argument("files", nargs="*", help="files to read instead of the tracked sources")
    a = ap.parse_args()
    if a.files:
        root, files = ".", a.files
    else:
        root, files = tracked_sources(a.tests)
    rows = []
    for f in files:
        for name, line, n in functions(os.path.join(root, f)):
            rows.append((n, f, line, name))
    rows.sort(key=lambda r: (-r[0], r[1], r[2]))
    over = [r for r in rows if r[0] > a.max]
    for n, f, line, name in rows if a.all else over:
        print(f"{n:5d} {f}:{line} {name}")
    sys.stdout.flush()
    print(f"{len(over)} function(s) over {a.max} lines in {len(files)} file(s)", file=sys.stderr)
    return 1 if over else 0


if __name__ == "__main__":
    sys.exit(main())
