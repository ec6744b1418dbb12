#!/usr/bin/env python3
"""check_doc_links.py FILE.md... - every relative link of the given Markdown files leads somewhere.

For each link [text](target) or image ![alt](target) outside code blocks and code spans:
  - a target with a scheme (https:, mailto:) is not checked (nothing is fetched);
  - a path, relative to the file's folder, must name a file or folder that exists;
  - an anchor (#name, or path.md#name) must be a heading of that Markdown file, by GitHub's rule: the
    heading's text in lower case, punctuation dropped, each space a hyphen, "-1", "-2", ... after the
    first, second, ... repeat of the same anchor in the file; <a id="name"> / <a name="name"> count too.
A path that starts with "/" is refused (on the web it would mean the site's root, not the repository's).

Prints one line per bad link, "FILE:LINE: TARGET: why", and a summary. Exit 0 when every link is good,
1 otherwise (also for a file that cannot be read). Standard library only.
"""
import os
import re
import sys

FENCE = re.compile(r'^\s{0,3}(```|~~~)')
HEADING = re.compile(r'^\s{0,3}(#{1,6})\s+(.*?)\s*#*\s*$')
HTML_ANCHOR = re.compile(r'<a\s+(?:id|name)="([^"]+)"')
CODE_SPAN = re.compile(r'(`+)(.+?)\1', re.S)
LINK = re.compile(r'!?\[((?:[^\[\]]|\[[^\[\]]*\])*)\]\(\s*<?([^()\s<>]+)>?(?:\s+"[^"]*")?\s*\)')
SCHEME = re.compile(r'^[A-Za-z][A-Za-z0-9+.-]*:')


def slug(text):
    """GitHub's anchor of a heading's text."""
    text = re.sub(r'\[([^\]]*)\]\([^)]*\)', r'\1', text)  # a link in a heading: its text
    out = []
    for ch in text.strip().lower():
        if ch.isalnum() or ch in ' -_':
            out.append(ch)
    return ''.join(out).replace(' ', '-')


def read(path):
    with open(path, encoding='utf-8') as f:
        return f.read()


def prose(text):
    """The text with code blocks blanked and code spans' contents masked, line numbers kept."""
    lines, fence = [], False
    for line in text.split('\n'):
        if FENCE.match(line):
            fence = not fence
            lines.append('')
        else:
            lines.append('' if fence else line)
    text = '\n'.join(lines)
    return CODE_SPAN.sub(lambda m: m.group(1) + re.sub(r'[^\n]', 'x', m.group(2)) + m.group(1), text)


_anchors = {}


def anchors(path):
    """The anchors of a Markdown file's headings (and explicit <a id=...>)."""
    if path not in _anchors:
        found, seen, fence = set(), {}, False
        for line in read(path).split('\n'):
            if FENCE.match(line):
                fence = not fence
                continue
            if fence:
                continue
            found.update(HTML_ANCHOR.findall(line))
            m = HEADING.match(line)
            if m:
                a = slug(m.group(2))
                n = seen.get(a, 0)
                seen[a] = n + 1
                found.add(a if n == 0 else '%s-%d' % (a, n))
        _anchors[path] = found
    return _anchors[path]


def check(path):
    bad, count = [], 0
    text = prose(read(path))
    for m in LINK.finditer(text):
        target = m.group(2)
        line = text.count('\n', 0, m.start()) + 1
        if SCHEME.match(target):
            continue
        count += 1
        where, _, anchor = target.partition('#')
        if where.startswith('/'):
            bad.append((line, target, 'a path from the root: write it relative to this file'))
            continue
        dest = os.path.normpath(os.path.join(os.path.dirname(path), where)) if where else path
        if not os.path.exists(dest):
            bad.append((line, target, 'no such file: %s' % dest))
            continue
        if anchor:
            if not dest.endswith('.md') or os.path.isdir(dest):
                bad.append((line, target, 'an anchor into something that is not a Markdown file'))
            elif anchor not in anchors(dest):
                bad.append((line, target, '%s has no heading whose anchor is #%s' % (dest, anchor)))
    return bad, count


def main(argv):
    if not argv:
        print(__doc__.strip().split('\n')[0], file=sys.stderr)
        return 1
    nbad = nlinks = 0
    for path in argv:
        try:
            bad, count = check(path)
        except OSError as e:
            print('%s: %s' % (path, e.strerror))
            nbad += 1
            continue
        nlinks += count
        for line, target, why in bad:
            print('%s:%d: %s: %s' % (path, line, target, why))
        nbad += len(bad)
    print('links: %d bad of %d relative links in %d files' % (nbad, nlinks, len(argv)))
    return 1 if nbad else 0


if __name__ == '__main__':
    sys.exit(main(sys.argv[1:]))
