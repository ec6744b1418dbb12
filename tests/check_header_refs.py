#!/usr/bin/python3
"""
check_header_refs.py - keeps stale names out of the comments of the headers.

The headers (*.h, *.cuh under common/ loader/ staging/ compute/ comm/ tools/)
name code in their comments: a parameter (`be`), a field (`o->split`), a
function (`rt_backend_ops`), a file (`cpu/conv.c`). When the code changes
and the comment does not, the name points at nothing. This script finds every
such name that has nothing left to point at.

What is checked. In every comment of every header:

  * each token between backquotes that is a C identifier (a trailing "()" or
    "[]" allowed) or a member chain `a->b`, `a.b`, `(*a)->b`: each identifier
    of it must be a CODE WORD of the tree (below). Every part is checked, so
    a field that was renamed is caught even when the struct pointer's name is
    still in use. A name ending in "_" (`rt_cpu_`) is the start of names:
    some code word must begin with it;
  * each token between backquotes that is a path to a source file, that is
    path characters holding a "/" or ending in .c .h .cu .cuh .py .sh .md:
    it must exist (file or folder; "*" globs) relative to the repository
    root, to the header's folder or one above it, or to a top-level module
    folder (so `cpu/conv.c` in compute/ is compute/cpu/conv.c); a bare file
    name (`loop.c`) may also be anywhere in the source folders, or be a file
    the build generates (named in CMake code: rt_buildinfo.h);
  * outside backquotes, the same checks on what can only be a code name:
    a call `name()`, a chain `a->b`, a lower-case snake_case word
    (train_request_stop; not ALL_CAPS, not a word followed by "("), a file
    name ending in .c .h .cu .cuh .py .sh, and a path under a top-level
    folder (tools/train/). Most headers name functions this way, without
    backquotes, so leaving these out would miss most stale names.

Everything else between backquotes is skipped: anything with a space
(shell commands, `get(ctx, name)`, prose), command-line options (`--steps`),
ALL_CAPS words (environment variables, macros), numbers, format strings,
JSON or other punctuation, absolute or home paths (`/dev/shm`), data file
names (`state.json`), and the short ALLOW list below, each with its reason.

The rule for identifiers. A CODE WORD is a word that occurs OUTSIDE comments
in some source file of the tree: C, CUDA, Python, shell and CMake files under
the top-level folders in SOURCE_DIRS (build folders, hidden folders and
__pycache__ are left out), plus the top-level CMakeLists.txt. Comments are
stripped before the words are collected; string literals are kept (a JSON key
or a library's name is legitimately only in a string). So a function that
was removed or renamed, but that one or several comments still name, is no
code word and is reported; a parameter or field is found in the declaration
next to the comment. The rule cannot see a name that went stale while still
existing elsewhere (a parameter renamed to a name another function uses; a
one-letter name): that is the price of a check without a C parser.

Output: one line per stale reference, "path:line: `token` names nothing in
the tree", paths relative to the root; exit status 1 when there is any, 0
when there is none, 2 on a usage error. --self-test checks the checker on a
small made-up tree (one stale and one good reference of each kind). Python 3
standard library only.
"""

import argparse
import glob
import io
import os
import re
import sys
import tempfile
import tokenize

sys.dont_write_bytecode = True
SELF = os.path.abspath(__file__)

# Folders whose headers are checked.
HEADER_DIRS = ("common", "loader", "staging", "compute", "comm", "tools")
HEADER_EXTS = (".h", ".cuh")
# Folders whose source files make up the code words (missing ones are fine).
SOURCE_DIRS = ("loader", "staging", "compute", "comm", "common", "tools", "tests", "bench", "python", "docs")
C_EXTS = (".c", ".h", ".cu", ".cuh", ".cpp", ".cc", ".hpp")
HASH_EXTS = (".py", ".sh", ".cmake")  # comments start with "#"
SOURCE_PATH_EXTS = (".c", ".h", ".cu", ".cuh", ".py", ".sh", ".md")
# Names of files that are data, not code: a backquoted `name.ext` with one of these is a file name, not a member.
DATA_EXTS = frozenset(
    "json tsv csv txt log pack idx bin safetensors pkl pt pth gz xz zst tar so deb npy in cmake conf"
    " supp jpg jpeg png".split())

# Backquoted tokens that name nothing in the tree on purpose. token -> reason.
ALLOW = {
    "clip_grad_norm_": "PyTorch's function, which compute.h's clipping follows",
    "count_include_pad": "PyTorch's AvgPool2d argument, which compute.h's average pooling follows",
    "init_scale": "PyTorch's GradScaler argument, which struct rt_scaler's start value follows",
    "map_gpu": "a value of Slurm's --gpu-bind, which comm.h's GPU preflight reads",
}

IDENT = r"[A-Za-z_][A-Za-z0-9_]*"
RE_WORD = re.compile(IDENT)
RE_CHAIN = re.compile(r"^\(?\*?(%s)\)?((?:->|\.)%s)*(?:\(\)|\[\])?$" % (IDENT, IDENT))
RE_PATH = re.compile(r"^[A-Za-z0-9_.\-/*]+$")
RE_ALLCAPS = re.compile(r"^[A-Z][A-Z0-9_]*$")


def is_build_dir(name):
    return (name.startswith("build") or name.startswith(".") or name in ("CMakeFiles", "__pycache__")
            or name.endswith(".partial"))


def tree_files(root, dirs):
    """Every file under the top-level directories `dirs` of root, build directories left out, in order."""
    for d in dirs:
        base = os.path.join(root, d)
        if not os.path.isdir(base):
            continue
        for dirpath, dirnames, filenames in os.walk(base):
            dirnames[:] = sorted(n for n in dirnames if not is_build_dir(n))
            for f in sorted(filenames):
                yield os.path.join(dirpath, f)


def source_files(root):
    """The files whose code makes the code words: (path, kind) with kind 'c' or 'hash'."""
    out = []
    top = os.path.join(root, "CMakeLists.txt")
    if os.path.isfile(top):
        out.append((top, "hash"))
    for p in tree_files(root, SOURCE_DIRS):
        f = os.path.basename(p)
        if os.path.abspath(p) == SELF:
            continue  # its self-test and allow-list name stale words on purpose
        if f.endswith(C_EXTS):
            out.append((p, "c"))
        elif f.endswith(HASH_EXTS) or f == "CMakeLists.txt":
            out.append((p, "hash"))
        elif "." not in f and is_shell_script(p):
            out.append((p, "hash"))
    return out


def is_shell_script(path):
    try:
        with open(path, "rb") as fh:
            head = fh.read(64)
    except OSError:
        return False
    return head.startswith(b"#!") and (b"sh" in head.split(b"\n")[0] or b"python" in head.split(b"\n")[0])


def read(path):
    with open(path, encoding="utf-8", errors="replace") as fh:
        return fh.read()


def split_c(text):
    """C/CUDA text -> (code, comments): code with every comment blanked (newlines kept), and the comments as a
    list of (start offset, comment text). String and character literals stay in the code."""
    code = []
    comments = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if c == "/" and text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            comments.append((i, text[i:j]))
            code.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
        elif c == "/" and text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            comments.append((i, text[i:j]))
            code.append(" " * (j - i))
            i = j
        elif c in "\"'":
            j = i + 1
            while j < n and text[j] != c and text[j] != "\n":
                j += 2 if text[j] == "\\" else 1
            j = min(j + 1, n)
            code.append(text[i:j])
            i = j
        else:
            j = i + 1
            while j < n and text[j] not in "/\"'":
                j += 1
            code.append(text[i:j])
            i = j
    return "".join(code), comments


def strip_hash(text):
    """Python, shell or CMake text without its "#" comments: a "#" outside quotes at the start of a line or
    after a blank starts one (so $# and ${#x} stay). Quotes are tracked within a line only: good enough for
    collecting words."""
    out = []
    for line in text.split("\n"):
        quote = None
        cut = len(line)
        k = 0
        while k < len(line):
            ch = line[k]
            if quote:
                if ch == "\\":
                    k += 1
                elif ch == quote:
                    quote = None
            elif ch in "\"'":
                quote = ch
            elif ch == "#" and (k == 0 or line[k - 1] in " \t;("):
                cut = k
                break
            k += 1
        out.append(line[:cut])
    return "\n".join(out)


def strip_python(text):
    """Python text without its comments and docstrings (a string that is a statement of its own: prose, like a
    comment). Other strings stay. Falls back to strip_hash() on text tokenize cannot read."""
    try:
        toks = list(tokenize.generate_tokens(io.StringIO(text).readline))
    except (tokenize.TokenError, SyntaxError, IndentationError):
        return strip_hash(text)
    out = []
    prev = tokenize.NEWLINE
    for tok in toks:
        if tok.type == tokenize.COMMENT:
            continue
        if tok.type == tokenize.STRING and prev in (tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT,
                                                    tokenize.NL, tokenize.ENCODING):
            continue
        if tok.type not in (tokenize.NL, tokenize.COMMENT):
            prev = tok.type
        out.append(tok.string)
    return "\n".join(out)


def code_words(root):
    """(the code words, the names of files the build generates: those its CMake code names, such as
    rt_buildinfo.h from configure_file)."""
    words, generated = set(), set()
    for path, kind in source_files(root):
        text = read(path)
        if kind == "c":
            code = split_c(text)[0]
        elif path.endswith(".py"):
            code = strip_python(text)
        else:
            code = strip_hash(text)
        words.update(RE_WORD.findall(code))
        if path.endswith(("CMakeLists.txt", ".cmake")):
            generated.update(os.path.basename(f) for f in re.findall(r"[\w./${}-]+\.\w+", code))
    return words, generated


def headers(root):
    return [p for p in tree_files(root, HEADER_DIRS) if p.endswith(HEADER_EXTS)]


RE_BARE = re.compile(
    r"(?<![\w.>$/-])(?:"
    r"(?P<call>[A-Za-z_]\w*)\(\)"                                      # rt_backend_ops()
    r"|(?P<chain>[A-Za-z_]\w*(?:->[A-Za-z_]\w*)+)"                      # be->why_not_bf16
    r"|(?P<path>[\w*-][\w.*-]*(?:/[\w.*-]+)*\.(?:c|h|cu|cuh|py|sh)"     # tools/cmd_*.c, loop.c
    r"|(?:%s)/[\w.*/-]*)(?![\w/])"                                       # tools/train/
    r"|(?P<snake>[a-z][a-z0-9]*(?:_[a-z0-9]+)+_?)"                        # train_request_stop, rt_x_
    r")(?![\w(])" % "|".join(HEADER_DIRS + ("tests", "bench", "docs")))


def references(text):
    """(offset, token, backquoted) for the names in the comments of a header's text: every `token` between
    backquotes (they pair up within one comment; a token that runs over a line end is prose and left out), and
    outside backquotes every name written so that it can only be code (see RE_BARE)."""
    out = []
    for start, comment in split_c(text)[1]:
        for m in re.finditer(r"`([^`]*)`", comment):
            if "\n" not in m.group(1):
                out.append((start + m.start(), m.group(1), True))
        rest = re.sub(r"`[^`]*`", lambda m: " " * len(m.group(0)), comment)
        for m in RE_BARE.finditer(rest):
            out.append((start + m.start(), m.group(0), False))
    out.sort()
    return out


def classify(token, backquoted=True):
    """('ident', identifiers), ('prefix', [prefix]), ('path', None), or (None, None) for no code name."""
    t = token.strip()
    if not t or t != token or t in ALLOW:
        return None, None
    if any(ch.isspace() for ch in t) or t.startswith("-") or RE_ALLCAPS.match(t):
        return None, None
    if not backquoted and t.endswith("()"):
        return "ident", [t[:-2]]
    if RE_PATH.match(t) and ("/" in t or t.endswith(SOURCE_PATH_EXTS)):
        if t.startswith("/") or t.startswith("~") or not re.search(r"[A-Za-z]", t):
            return None, None
        return "path", None
    if re.match(r"^[a-z]\w*_$", t):
        return "prefix", [t]  # rt_backend_input_: the start of names
    m = RE_CHAIN.match(t)
    if m:
        parts = RE_WORD.findall(t)
        # `state.json`, `model.safetensors`: a data file's name, not a member.
        if len(parts) == 2 and "." in t and "->" not in t and parts[1].lower() in DATA_EXTS:
            return None, None
        return "ident", parts
    return None, None


def path_exists(root, header, token, basenames):
    """A source path exists relative to the root, the header's folder or one above it, or a top-level module
    folder; a bare file name (no "/") also when a file of that name is anywhere in the source folders or the
    build's CMake code names it (a generated file)."""
    rel = token.rstrip("/")
    if "/" not in rel and "*" not in rel and rel in basenames:
        return True
    bases = [root]
    d = os.path.dirname(header)
    while len(d) > len(root):
        bases.append(d)
        d = os.path.dirname(d)
    bases += [os.path.join(root, m) for m in SOURCE_DIRS]
    for b in bases:
        p = os.path.join(b, rel)
        if glob.glob(p) if "*" in rel else os.path.exists(p):
            return True
    return False


def check(root):
    """The stale references: a list of (relative path, line, token)."""
    root = os.path.abspath(root)
    words, generated = code_words(root)
    basenames = generated | {os.path.basename(p) for p, _ in source_files(root)}
    stale = []
    for h in headers(root):
        text = read(h)
        for off, token, bq in references(text):
            kind, parts = classify(token, bq)
            if kind == "ident":
                ok = all(p in words for p in parts)
            elif kind == "prefix":
                ok = any(w.startswith(parts[0]) and w != parts[0] for w in words)
            elif kind == "path":
                ok = path_exists(root, h, token, basenames)
            else:
                continue
            if not ok:
                stale.append((os.path.relpath(h, root), text.count("\n", 0, off) + 1, token))
    return stale


def report(stale, out=sys.stdout):
    for path, line, token in stale:
        print("%s:%d: `%s` names nothing in the tree" % (path, line, token), file=out)


SELF_TEST_FILES = {
    "CMakeLists.txt": "project(x C)\n# gone_in_cmake_comment\nconfigure_file(gen.h.in ${B}/gen.h)\n",
    "compute/cpu/conv.c": "int conv_forward(int n) { return n; /* only_in_c_comment */ }\n",
    "bench/x.py": '"""only_in_docstring"""\nreal_py_name = "map_gpu"  # only_in_py_comment\n',
    "tools/run.sh": "#!/bin/sh\necho $# ${#x} # shell_comment_word\nthing_set_caller\n",
    "compute/thing.h": (
        "/* thing.h - a test header.\n"
        " * `conv_forward` and `cpu/conv.c` are there; `ringtrain train --steps`, `--steps`, `PATH`,\n"
        " * `state.json`, `42`, `/dev/shm` and `count_include_pad` (allowed) are no code names; gen.h is made.\n"
        " * `removed_fn` is named only here,\n"
        " * `only_in_c_comment` only in a comment elsewhere, `only_in_docstring` in a docstring. */\n"
        "struct thing { int split; };\n"
        "/* Sets `t->split` from `n`; `t->gone_field` went. See `cpu/gone.c` and `compute/thing.h`. */\n"
        "void thing_set(struct thing *t, int n);\n"
        "// `gone_in_cmake_comment` is in a CMake comment only; `thing_set()` and `conv_` are fine.\n"
        "/* Unquoted: conv_forward(), t->split, cpu/conv.c, conv.c, real_py_name and compute/cpu/ are fine;\n"
        " * gone_call(), t->gone_member, old_helper_fn, cpu/old.c and compute/old/ are not. */\n"
        "const char *s = \"`not_a_comment` not_a_comment_either()\";\n"),
}
# (path, line, stale token, what the fix puts in its place)
SELF_TEST_STALE = [
    ("compute/thing.h", 4, "removed_fn", "conv_forward"),
    ("compute/thing.h", 5, "only_in_c_comment", "conv_forward"),
    ("compute/thing.h", 5, "only_in_docstring", "real_py_name"),
    ("compute/thing.h", 7, "t->gone_field", "t->split"),
    ("compute/thing.h", 7, "cpu/gone.c", "cpu/conv.c"),
    ("compute/thing.h", 9, "gone_in_cmake_comment", "thing_set"),
    ("compute/thing.h", 11, "gone_call()", "thing_set()"),
    ("compute/thing.h", 11, "t->gone_member", "t->split"),
    ("compute/thing.h", 11, "old_helper_fn", "real_py_name"),
    ("compute/thing.h", 11, "cpu/old.c", "cpu/conv.c"),
    ("compute/thing.h", 11, "compute/old/", "compute/cpu/"),
]


def self_test():
    """Runs the check on a made-up tree holding stale and good references of each kind: 0 when it reports
    exactly the stale ones, and nothing once they are replaced by good ones."""
    expect = [(p, n, t) for p, n, t, _ in SELF_TEST_STALE]
    with tempfile.TemporaryDirectory(prefix="check_header_refs.") as root:
        for rel, body in SELF_TEST_FILES.items():
            p = os.path.join(root, rel)
            os.makedirs(os.path.dirname(p), exist_ok=True)
            with open(p, "w", encoding="utf-8") as fh:
                fh.write(body)
        got = check(root)
        # The same tree with the stale names replaced must be clean: the check can pass, too.
        h = os.path.join(root, "compute/thing.h")
        lines = read(h).split("\n")
        for _, n, token, good in SELF_TEST_STALE:
            lines[n - 1] = lines[n - 1].replace(token, good, 1)
        with open(h, "w", encoding="utf-8") as fh:
            fh.write("\n".join(lines))
        clean = check(root)
    if got != expect or clean:
        print("self-test FAILED", file=sys.stderr)
        print("expected:", file=sys.stderr)
        report(expect, sys.stderr)
        print("got:", file=sys.stderr)
        report(got, sys.stderr)
        print("after the fix (expected nothing):", file=sys.stderr)
        report(clean, sys.stderr)
        return 1
    print("self-test passed: the %d stale references found, none after the fix" % len(got))
    return 0


def main(argv):
    ap = argparse.ArgumentParser(
        description="Report the names in the comments of the headers (common/ loader/ staging/ compute/ "
        "comm/ tools/) that name nothing in the tree: backquoted tokens, and unquoted ones that can only be code "
        "(name(), a->b, snake_case words, source file names). An identifier must occur in some source file "
        "outside comments; a source path must exist. One line per stale reference; exit 1 when there is any, 0 "
        "when there is none, 2 on a usage error.")
    ap.add_argument("--root", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."),
                    help="the repository root (default: the folder above this script's)")
    ap.add_argument("--self-test", action="store_true",
                    help="check the checker on a made-up tree with stale and good references, then exit")
    args = ap.parse_args(argv)
    if args.self_test:
        return self_test()
    root = os.path.abspath(args.root)
    if not all(os.path.isdir(os.path.join(root, d)) for d in ("common", "compute")):
        print("check_header_refs.py: %s is not the repository root" % root, file=sys.stderr)
        return 2
    stale = check(root)
    report(stale)
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
