#!/usr/bin/env python3
"""report_view.py - the `ringtrain report` page as a person sees it, and its charts against the data.

Usage: report_view.py REPORT.html --png OUT.png [--metrics RUN0.jsonl [--metrics RUN1.jsonl ...]]
                      [--expect-charts loss,accuracy,...] [--chromium PATH] [--no-render]

What it checks (each check prints one line; any failure: exit 1):
  - the page is self-contained: no <script>, <link>, <iframe>, <object>, <embed>, <base>; no src, href,
    xlink:href, srcset, poster or action that points anywhere but "#..." or "data:"; no url(...) or
    @import in CSS but url(#...) and url(data:...);
  - its structure (the contract of tools/report/report.h): each <figure class="chart" id="chart-NAME">
    holds one <svg class="plot" width height> and a <figcaption>, and one <g class="area"> with the
    full mapping; a chart with more than one series (or more than one stacked key) has a <g class="legend">;
    the charts are exactly --expect-charts (when given); the config table (id="config") is there;
  - series against the metrics files: every <g class="series"> of an epoch chart (loss, accuracy,
    throughput, lr, loss-scale, gpu-*) holds as many points as run data-run's records have a non-null
    data-key field, at x = the record's epoch, each point within max(0.6 px, 1e-6 relative) of where
    the mapping of its <g class="area"> puts the value; its <circle>s (when drawn) sit on the points.
    Every <rect class="bar">'s drawn height is its data-value through the mapping, and a profile.*
    bar's data-value is that field of run data-run's record of epoch data-x. Series of other charts
    (benchmarks) must lie inside their plot area;
  - the rendering: headless Chromium draws the page (one run) to a PNG 1280 px wide; the run logs no
    console message at all (the page has no script, so any message is a fault: an exception, a
    resource that failed to load, a policy violation); the PNG is taller than 150 px per chart and has
    no blank band over 400 px; every chart is on it, whole, at its full size, with every drawn point
    and bar in its colour where the mapping says.

How the full page height is found: no script may run in the page and Chromium's --screenshot takes
the window only, so the page is drawn in a window taller than it can be (estimated from its charts and
table rows), and the rows of page background below the content are cropped off. If content reaches
the window's bottom, it is drawn again twice as tall (up to 16384 px).

How each chart is found on the PNG: the page drawn is a copy of REPORT.html with one <style> added
that gives each chart's svg an outline of a colour of its own (rgb(254,1,K)). An outline is painted
outside the element's box and takes no room, so the layout is the page's own; the outline's rectangle
on the PNG is the chart's place and its size, and the drawn points are looked up inside it. OUT.png is
that drawing, cropped (the outlines are 2 px wide, around each chart).
"""
import argparse
import html.parser
import json
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

EPOCH_CHARTS = {"loss", "accuracy", "throughput", "lr", "loss-scale", "gpu-util", "gpu-mem", "gpu-power"}
VOID = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source", "track", "wbr"}
WIDTH = 1280
OUTLINE = 2
PX_TOL = 0.6


class Node:
    def __init__(self, tag, attrs, parent):
        self.tag, self.attrs, self.parent, self.children, self.text = tag, attrs, parent, [], ""

    def cls(self):
        return (self.attrs.get("class") or "").split()

    def iter(self):
        yield self
        for c in self.children:
            yield from c.iter()

    def find_all(self, tag=None, cls=None):
        return [n for n in self.iter() if (tag is None or n.tag == tag) and (cls is None or cls in n.cls())]

    def ancestor(self, tag=None, cls=None):
        p = self.parent
        while p is not None and not ((tag is None or p.tag == tag) and (cls is None or cls in p.cls())):
            p = p.parent
        return p


class TreeBuilder(html.parser.HTMLParser):
    """A tolerant tree of the page: void elements close themselves, an end tag closes up to its match."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.root = Node("#root", {}, None)
        self.cur = self.root
        self.styles = []

    def handle_starttag(self, tag, attrs):
        n = Node(tag, {k.lower(): (v if v is not None else "") for k, v in attrs}, self.cur)
        self.cur.children.append(n)
        if tag not in VOID:
            self.cur = n

    def handle_startendtag(self, tag, attrs):
        n = Node(tag, {k.lower(): (v if v is not None else "") for k, v in attrs}, self.cur)
        self.cur.children.append(n)

    def handle_endtag(self, tag):
        p = self.cur
        while p is not None and p.tag != tag:
            p = p.parent
        if p is not None and p.parent is not None:
            self.cur = p.parent

    def handle_data(self, data):
        self.cur.text += data
        if self.cur.tag == "style":
            self.styles.append(data)


class Checker:
    def __init__(self):
        self.fails = 0

    def ok(self, msg):
        print("ok   " + msg)

    def fail(self, msg):
        print("FAIL " + msg)
        self.fails += 1

    def check(self, cond, msg):
        (self.ok if cond else self.fail)(msg)
        return cond


def num(s):
    try:
        return float(s)
    except (TypeError, ValueError):
        return float("nan")


class Mapping:
    """The value-to-pixel mapping of a <g class="area">."""
    KEYS = ("x0", "x1", "y0", "y1", "px0", "px1", "py0", "py1", "xlog", "ylog")

    def __init__(self, node):
        self.v = {k: num(node.attrs.get("data-" + k)) for k in self.KEYS}
        self.xlog, self.ylog = self.v["xlog"] == 1, self.v["ylog"] == 1

    def valid(self):
        v = self.v
        if any(math.isnan(v[k]) for k in self.KEYS) or v["x0"] == v["x1"] or v["y0"] == v["y1"]:
            return False
        if (self.xlog and min(v["x0"], v["x1"]) <= 0) or (self.ylog and min(v["y0"], v["y1"]) <= 0):
            return False
        return v["px1"] > v["px0"] and v["py0"] > v["py1"]

    def _fwd(self, val, a, b, pa, pb, lg):
        if lg:
            if val <= 0:
                return float("nan")
            val, a, b = math.log10(val), math.log10(a), math.log10(b)
        return pa + (val - a) / (b - a) * (pb - pa)

    def _inv(self, p, a, b, pa, pb, lg):
        if lg:
            a, b = math.log10(a), math.log10(b)
        t = a + (p - pa) / (pb - pa) * (b - a)
        return 10 ** t if lg else t

    def px(self, x):
        v = self.v
        return self._fwd(x, v["x0"], v["x1"], v["px0"], v["px1"], self.xlog)

    def py(self, y):
        v = self.v
        return self._fwd(y, v["y0"], v["y1"], v["py0"], v["py1"], self.ylog)

    def x(self, px):
        v = self.v
        return self._inv(px, v["x0"], v["x1"], v["px0"], v["px1"], self.xlog)

    def y(self, py):
        v = self.v
        return self._inv(py, v["y0"], v["y1"], v["py0"], v["py1"], self.ylog)

    def inside(self, px, py):
        v = self.v
        return (v["px0"] - PX_TOL <= px <= v["px1"] + PX_TOL) and (v["py1"] - PX_TOL <= py <= v["py0"] + PX_TOL)


def field(rec, path):
    """rec's field at a data-key path: dotted members, [i] array elements. None when absent or null."""
    v = rec
    for part in re.findall(r"[^.\[\]]+|\[\d+\]", path):
        if part.startswith("["):
            i = int(part[1:-1])
            v = v[i] if isinstance(v, list) and i < len(v) else None
        else:
            v = v.get(part) if isinstance(v, dict) else None
        if v is None:
            return None
    return v if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def points(poly):
    pts = []
    for tok in (poly.attrs.get("points") or "").replace(",", " ").split():
        pts.append(num(tok))
    if len(pts) % 2:
        return None
    return [(pts[i], pts[i + 1]) for i in range(0, len(pts), 2)]


def close(drawn, want, tol_px, val, inv):
    """drawn pixel vs the value's pixel: within tol_px, or the inverted value within 1e-6 relative."""
    if abs(drawn - want) <= tol_px:
        return True
    back = inv(drawn)
    return abs(back - val) <= 1e-6 * abs(val)


# ---------------------------------------------------------------- static checks --------------------------

FETCH_ATTRS = ("src", "href", "xlink:href", "srcset", "poster", "action", "data", "background", "formaction")


def check_self_contained(c, tree):
    bad = [n.tag for n in tree.root.iter() if n.tag in ("script", "link", "iframe", "object", "embed", "base",
                                                        "frame", "applet", "portal")]
    c.check(not bad, "no script, link, iframe, object, embed or base elements%s" % (": found " + ", ".join(sorted(set(bad))) if bad else ""))
    refs = []
    for n in tree.root.iter():
        for a in FETCH_ATTRS:
            v = (n.attrs.get(a) or "").strip()
            if v and not v.startswith("#") and not v.lower().startswith("data:"):
                refs.append("<%s %s=%r>" % (n.tag, a, v[:60]))
        if n.tag == "meta" and (n.attrs.get("http-equiv") or "").lower() == "refresh":
            refs.append("<meta http-equiv=refresh>")
        st = n.attrs.get("style") or ""
        for m in re.finditer(r"url\(\s*['\"]?([^'\")]*)", st):
            if not m.group(1).startswith("#") and not m.group(1).lower().startswith("data:"):
                refs.append("style url(%s)" % m.group(1)[:60])
    for css in tree.styles:
        for m in re.finditer(r"url\(\s*['\"]?([^'\")]*)", css):
            if not m.group(1).startswith("#") and not m.group(1).lower().startswith("data:"):
                refs.append("CSS url(%s)" % m.group(1)[:60])
        if "@import" in css:
            refs.append("CSS @import")
    c.check(not refs, "nothing to fetch (src, href, CSS url)%s" % (": " + "; ".join(refs[:5]) if refs else ""))
    c.check("http" not in " ".join(v for n in tree.root.iter() for k, v in n.attrs.items() if k in FETCH_ATTRS),
            "no http in src/href")


def chart_name(fig):
    i = fig.attrs.get("id") or ""
    return i[len("chart-"):] if i.startswith("chart-") else None


def check_structure(c, tree, expect):
    figs = tree.root.find_all("figure", "chart")
    names = [chart_name(f) for f in figs]
    c.check(all(names), "every figure.chart has an id chart-NAME (%d charts)" % len(figs))
    names = [n for n in names if n]
    c.check(len(set(names)) == len(names), "chart ids are unique")
    if expect is not None:
        missing, extra = [e for e in expect if e not in names], [n for n in names if n not in expect]
        c.check(not missing and not extra, "charts are the expected %d: %s%s%s" % (
            len(expect), ",".join(names), " (missing: %s)" % ",".join(missing) if missing else "",
            " (unexpected: %s)" % ",".join(extra) if extra else ""))
    charts = []
    for f in figs:
        name = chart_name(f) or "?"
        svgs = [n for n in f.find_all("svg") if "plot" in n.cls()]
        caps = f.find_all("figcaption")
        areas = f.find_all("g", "area")
        good = len(svgs) == 1 and len(caps) == 1 and len(areas) == 1
        w = h = float("nan")
        if svgs:
            w, h = num(svgs[0].attrs.get("width")), num(svgs[0].attrs.get("height"))
        m = Mapping(areas[0]) if len(areas) == 1 else None
        good = good and w > 0 and h > 0 and m is not None and m.valid()
        series = f.find_all("g", "series")
        bars = f.find_all("rect", "bar")
        hbars = f.find_all("rect", "hbar")
        # Bars: a category (data-run, data-x) holds one bar per stacked segment; the segments are the series.
        # Horizontal bars: a category (data-run, data-cat) holds one bar per series, side by side.
        per_cat = {}
        for b in bars:
            k = (b.attrs.get("data-run"), b.attrs.get("data-x"))
            per_cat[k] = per_cat.get(k, 0) + 1
        for b in hbars:
            k = ("h", b.attrs.get("data-run"), b.attrs.get("data-cat"))
            per_cat[k] = per_cat.get(k, 0) + 1
        spans = f.find_all("rect", "span")  # a timeline's (a traced step): rows of spans, no series
        nkeys = len(series) + max(per_cat.values(), default=0)
        legend = bool(f.find_all("g", "legend"))
        good = good and (series or bars or hbars or spans) and (nkeys <= 1 or legend)
        c.check(good, "chart %s: one svg.plot (%gx%g), a figcaption, one g.area with a valid mapping, "
                "%d series, %d bars, %d spans, legend %s" % (name, w, h, len(series), len(bars), len(spans),
                                                             "yes" if legend else "no"))
        if good:
            charts.append({"name": name, "fig": f, "svg": svgs[0], "w": w, "h": h, "map": m,
                           "series": series, "bars": bars, "hbars": hbars, "spans": spans})
    c.check(bool([t for t in tree.root.find_all("table", "config") if t.attrs.get("id") == "config"]),
            "the config table (table.config#config)")
    return charts


def check_series(ch, s, metrics):
    """Problems of one <g class="series"> (empty: none), and a description of what was compared."""
    m, run, key = ch["map"], s.attrs.get("data-run") or "", s.attrs.get("data-key")
    polys = s.find_all("polyline")
    pts = points(polys[0]) if len(polys) == 1 else None
    if pts is None or any(math.isnan(v) for p in pts for v in p) or not run.isdigit() or not key:
        return ["not one polyline with numeric points, data-run and data-key"], ""
    bad = []
    circles = [(num(e.attrs.get("cx")), num(e.attrs.get("cy"))) for e in s.find_all("circle")]
    if circles and not (len(circles) == len(pts) and all(abs(a[0] - b[0]) <= PX_TOL and abs(a[1] - b[1]) <= PX_TOL
                                                          for a, b in zip(circles, pts))):
        bad.append("%d circles not on the %d points" % (len(circles), len(pts)))
    out = [p for p in pts if not m.inside(*p)]
    if out:
        bad.append("points outside the plot area: %s" % out[:3])
    what = "%d points in the plot area" % len(pts)
    if ch["name"] not in EPOCH_CHARTS:
        return bad, what + " (a benchmark's: not compared)"
    r = int(run)
    if not metrics:
        return bad, what + " (no --metrics: not compared)"
    if r >= len(metrics):
        return bad + ["no metrics file for run %d" % r], what
    want = [(rec.get("epoch"), field(rec, key)) for rec in metrics[r]]
    want = [(e, v) for e, v in want if v is not None and isinstance(e, (int, float))]
    if len(pts) != len(want):
        return bad + ["%d points, but %d records have the field" % (len(pts), len(want))], what
    for (px, py), (e, v) in zip(pts, want):
        if not (close(px, m.px(e), PX_TOL, e, m.x) and close(py, m.py(v), PX_TOL, v, m.y)):
            bad.append("epoch %s value %.6g drawn at (%.2f,%.2f) = (%.6g, %.6g), expected at (%.2f,%.2f)" % (
                e, v, px, py, m.x(px), m.y(py), m.px(e), m.py(v)))
    return bad, "%d points = the %d records of run %d with the field, x = epoch, within %.1f px" % (
        len(pts), len(want), r, PX_TOL)


def check_bar(ch, b, metrics):
    m = ch["map"]
    run, key, x, val = b.attrs.get("data-run") or "", b.attrs.get("data-key"), num(b.attrs.get("data-x")), num(b.attrs.get("data-value"))
    where = "run %s x %g %s" % (run, x, key)
    if math.isnan(val) or not key or not run.isdigit():
        return ["%s: no numeric data-value, data-key or data-run" % where], 0
    bad, compared = [], 0
    hgt = num(b.attrs.get("height"))
    if not m.ylog:
        want_h = abs(m.py(val) - m.py(0.0))
        if math.isnan(hgt) or abs(hgt - want_h) > PX_TOL:
            bad.append("%s: drawn %.2f px tall, data-value %.6g is %.2f px" % (where, hgt, val, want_h))
    if key.startswith("profile.") and metrics and int(run) < len(metrics):
        recs = [rec for rec in metrics[int(run)] if rec.get("epoch") == x]
        v = field(recs[-1], key) if recs else None
        tol = max(PX_TOL * abs(m.v["y1"] - m.v["y0"]) / (m.v["py0"] - m.v["py1"]), 1e-6 * abs(v or 0))
        if v is None or abs(v - val) > tol:
            bad.append("%s: data-value %.6g, the record of epoch %g has %s" % (where, val, x, v))
        compared = 1
    return bad, compared


def check_data(c, charts, metrics):
    total_pts = total_series = 0
    for ch in charts:
        for s in ch["series"]:
            bad, what = check_series(ch, s, metrics)
            c.check(not bad, "chart %s series run %s %s: %s" % (ch["name"], s.attrs.get("data-run"), s.attrs.get("data-key"),
                                                              "; ".join(bad[:3]) if bad else what))
            total_series += 1
            total_pts += len(points(s.find_all("polyline")[0]) or []) if s.find_all("polyline") else 0
        if ch["bars"]:
            bad, compared = [], 0
            for b in ch["bars"]:
                bb, cc = check_bar(ch, b, metrics)
                bad += bb
                compared += cc
            c.check(not bad, "chart %s: %d bars, drawn heights = data-value%s%s" % (
                ch["name"], len(ch["bars"]), ", %d of them = the records' profile fields" % compared if compared else "",
                ": " + "; ".join(bad[:3]) if bad else ""))
            total_pts += len(ch["bars"])
        if ch.get("hbars"):
            # A horizontal bar's drawn width is its data-value through the x mapping, from x = 0.
            m, bad = ch["map"], []
            for b in ch["hbars"]:
                val, wd, x = num(b.attrs.get("data-value")), num(b.attrs.get("width")), num(b.attrs.get("x"))
                want = abs(m.px(max(val, 0.0)) - m.px(0.0))
                if math.isnan(val) or math.isnan(wd) or abs(wd - want) > PX_TOL or abs(x - m.px(0.0)) > PX_TOL:
                    bad.append("%s: drawn %.2f px wide at %.2f, data-value %.6g is %.2f px from %.2f" % (
                        b.attrs.get("data-key"), wd, x, val, want, m.px(0.0)))
            c.check(not bad, "chart %s: %d horizontal bars, drawn widths = data-value%s" % (
                ch["name"], len(ch["hbars"]), ": " + "; ".join(bad[:3]) if bad else ""))
            total_pts += len(ch["hbars"])
        if ch.get("spans"):
            # A span from data-t0 to data-t1 (microseconds) is drawn there, in its row's band (data-row r: y from
            # r to r + 1, rows counted from the top), at least 0.6 px wide.
            m, bad = ch["map"], []
            for sp in ch["spans"]:
                t0, t1, row = num(sp.attrs.get("data-t0")), num(sp.attrs.get("data-t1")), num(sp.attrs.get("data-row"))
                x, wd = num(sp.attrs.get("x")), num(sp.attrs.get("width"))
                y, ht = num(sp.attrs.get("y")), num(sp.attrs.get("height"))
                if not (m.v["x0"] <= t0 <= t1 <= m.v["x1"] + 1e-6):
                    bad.append("span %g..%g outside the window" % (t0, t1))
                elif abs(x - m.px(t0)) > PX_TOL or abs(x + wd - max(m.px(t1), m.px(t0) + 0.6)) > PX_TOL:
                    bad.append("span %g..%g drawn at %.2f..%.2f px" % (t0, t1, x, x + wd))
                elif not (m.py(row) - PX_TOL <= y and y + ht <= m.py(row + 1) + PX_TOL):
                    bad.append("span of row %g drawn at y %.2f..%.2f" % (row, y, y + ht))
            c.check(not bad, "chart %s: %d spans, each drawn at its times and in its row%s" % (
                ch["name"], len(ch["spans"]), ": " + "; ".join(bad[:3]) if bad else ""))
            total_pts += len(ch["spans"])
    print("data: %d charts, %d series, %d points and bars" % (len(charts), total_series, total_pts))


# ---------------------------------------------------------------- rendering ------------------------------

def probe_color(i):
    return (254, 1, 10 + 11 * i)


def probe_page(text, charts):
    rules = ["figure.chart svg.plot{outline:%dpx solid rgb(254,1,250)!important;outline-offset:0!important}" % OUTLINE]
    for i, ch in enumerate(charts):
        rules.append("#chart-%s svg.plot{outline-color:rgb(%d,%d,%d)!important}" % ((ch["name"],) + probe_color(i)))
    style = "<style>" + "\n".join(rules) + "</style>"
    m = re.search(r"</head\s*>", text, re.I)
    return text[:m.start()] + style + text[m.start():] if m else style + text


def estimate_height(tree, charts):
    h = 600 + sum(ch["h"] + 120 for ch in charts)
    h += 40 * len(tree.root.find_all("tr")) + 40 * len(tree.root.find_all("p"))
    return int(min(max(h, 1200), 16384))


def chromium_run(exe, url, png, height, tmp):
    cmd = [exe, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--disable-dev-shm-usage",
           "--no-first-run", "--disable-extensions", "--disable-background-networking", "--disable-sync",
           "--mute-audio", "--force-color-profile=srgb", "--force-device-scale-factor=1",
           "--user-data-dir=" + os.path.join(tmp, "profile"), "--enable-logging=stderr", "--v=0",
           "--screenshot=" + png, "--window-size=%d,%d" % (WIDTH, height), url]
    env = dict(os.environ, DBUS_SESSION_BUS_ADDRESS="disabled:")
    try:
        p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace",
                           timeout=90, env=env)
    except subprocess.TimeoutExpired:
        return None, "chromium did not finish in 90 s"
    return p.returncode, p.stdout


def render(c, exe, page, tree, charts, out_png):
    import numpy as np
    from PIL import Image
    tmp = tempfile.mkdtemp(prefix="report_view.")
    try:
        probe = os.path.join(tmp, "page.html")
        with open(probe, "w", encoding="utf-8") as f:
            f.write(probe_page(page, charts))
        shot = os.path.join(tmp, "shot.png")
        height = estimate_height(tree, charts)
        t0 = time.time()
        while True:
            if os.path.exists(shot):
                os.unlink(shot)
            rc, log = chromium_run(exe, "file://" + probe, shot, height, tmp)
            if not c.check(rc == 0 and os.path.exists(shot), "chromium drew the page at %dx%d (exit %s)" % (WIDTH, height, rc)):
                print("\n".join("     | " + l for l in (log or "").splitlines()[-15:]))
                return
            img = np.asarray(Image.open(shot).convert("RGB"))
            # One uint32 per pixel (0xRRGGBB): a colour is one comparison.
            rgb = (img[:, :, 0].astype(np.uint32) << 16) | (img[:, :, 1].astype(np.uint32) << 8) | img[:, :, 2]
            vals, counts = np.unique(rgb[-1], return_counts=True)
            bg = vals[counts.argmax()]
            ink_rows = np.nonzero((rgb != bg).any(axis=1))[0]
            bottom = int(ink_rows[-1]) + 1 if len(ink_rows) else 0
            if bottom < img.shape[0] - 8 or height >= 16384:
                break
            height = min(height * 2, 16384)
        print("render: %.1f s, window %dx%d, content %d px tall" % (time.time() - t0, WIDTH, height, bottom))
        console = [l for l in log.splitlines() if ":CONSOLE" in l or "Uncaught" in l or "Failed to load resource" in l]
        c.check(not console, "no console messages%s" % (": " + " | ".join(l[-160:] for l in console[:5]) if console else ""))
        img, rgb = img[:min(bottom + 16, img.shape[0])], rgb[:min(bottom + 16, img.shape[0])]
        Image.fromarray(img).save(out_png, optimize=False, compress_level=1)
        H, W = img.shape[:2]
        c.check(W == WIDTH, "PNG is %d px wide (%d)" % (WIDTH, W))
        c.check(H > 150 * len(charts), "PNG is %d px tall, over 150 px per chart (%d charts)" % (H, len(charts)))
        blank = (rgb == bg).all(axis=1)
        run = best = 0
        for b in blank:
            run = run + 1 if b else 0
            best = max(best, run)
        c.check(best <= 400, "no blank band over 400 px (the tallest is %d px)" % best)
        visible = 0
        for i, ch in enumerate(charts):
            visible += check_chart_pixels(c, img, rgb, ch, probe_color(i))
        print("png: %s, %dx%d, %d of %d charts found whole with their points drawn" % (out_png, W, H, visible, len(charts)))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def parse_color(s):
    s = (s or "").strip().lower()
    m = re.fullmatch(r"#([0-9a-f]{6})", s)
    if m:
        return tuple(int(m.group(1)[i:i + 2], 16) for i in (0, 2, 4))
    m = re.fullmatch(r"#([0-9a-f]{3})", s)
    if m:
        return tuple(int(ch * 2, 16) for ch in m.group(1))
    m = re.fullmatch(r"rgb\(\s*(\d+)\s*,\s*(\d+)\s*,\s*(\d+)\s*\)", s)
    if m:
        return tuple(int(g) for g in m.groups())
    return None


def paint(node, prop):
    """The colour a node (or the nearest ancestor) gives in attribute or inline style PROP, else None."""
    while node is not None:
        m = re.search(r"(?:^|;)\s*%s\s*:\s*([^;]+)" % prop, node.attrs.get("style") or "")
        col = parse_color(m.group(1) if m else node.attrs.get(prop))
        if col:
            return col
        node = node.parent
    return None


def check_chart_pixels(c, img, rgb, ch, color):
    import numpy as np
    name, w, h = ch["name"], ch["w"], ch["h"]
    mask = rgb == ((color[0] << 16) | (color[1] << 8) | color[2])
    rows = np.nonzero(mask.sum(axis=1) >= 0.5 * w)[0]
    cols = np.nonzero(mask.sum(axis=0) >= 0.5 * h)[0]
    if not c.check(len(rows) >= 2 * OUTLINE and len(cols) >= 2 * OUTLINE, "chart %s is on the PNG (its outline found)" % name):
        return 0
    top, bot, left, right = int(rows[0]), int(rows[-1]), int(cols[0]), int(cols[-1])
    x0, y0 = left + OUTLINE, top + OUTLINE
    dw, dh = right - left + 1 - 2 * OUTLINE, bot - top + 1 - 2 * OUTLINE
    frame = np.concatenate([mask[top, left:right + 1], mask[bot, left:right + 1], mask[top:bot + 1, left], mask[top:bot + 1, right]])
    whole = frame.mean()
    sx, sy = dw / w, dh / h
    vb = (ch["svg"].attrs.get("viewbox") or "").replace(",", " ").split()
    vx = vy = 0.0
    if len(vb) == 4:
        vx, vy, vw, vh = (num(t) for t in vb)
        sx, sy = dw / vw, dh / vh
    # The page may scale a chart to its column (CSS width:100%): same shape, at least 3/4 of its size.
    size_ok = abs(dw / w - dh / h) <= 0.01 + 1.0 / h and dw >= 0.75 * w
    if not c.check(size_ok and whole >= 0.98, "chart %s at (%d,%d), %dx%d px (svg %gx%g, scale %.3f), outline %.0f%% unbroken" % (
            name, x0, y0, dw, dh, w, h, dw / w, 100 * whole)):
        return 0
    m = ch["map"].v
    ax0, ax1 = int(x0 + (m["px0"] - vx) * sx), int(x0 + (m["px1"] - vx) * sx)
    ay1, ay0 = int(y0 + (m["py1"] - vy) * sy), int(y0 + (m["py0"] - vy) * sy)
    vals, counts = np.unique(rgb[ay1:ay0 + 1:2, ax0:ax1 + 1:2], return_counts=True)
    v = int(vals[counts.argmax()])
    abg = np.array([v >> 16, (v >> 8) & 255, v & 255])

    def drawn(px, py, col, r=3):
        X, Y = int(round(x0 + (px - vx) * sx)), int(round(y0 + (py - vy) * sy))
        win = img[max(Y - r, 0):Y + r + 1, max(X - r, 0):X + r + 1].reshape(-1, 3).astype(int)
        if col is not None:
            return bool((np.abs(win - np.array(col)).sum(axis=1) <= 60).any())
        return bool((np.abs(win - abg).sum(axis=1) > 60).any())

    missing, n = [], 0
    drawn_series = []
    for s in ch["series"]:
        poly = s.find_all("polyline")
        pts = points(poly[0]) if poly else None
        if pts:
            drawn_series.append((s, pts, paint(poly[0], "stroke")))
    for i, (s, pts, col) in enumerate(drawn_series):
        for p in pts:
            n += 1
            # A point that a later series draws over (the same place, within 2 px) shows that series' colour.
            cols = [col] + [c2 for _, pts2, c2 in drawn_series[i + 1:]
                            if any(abs(p[0] - q[0]) <= 2 and abs(p[1] - q[1]) <= 2 for q in pts2)]
            if not any(drawn(p[0], p[1], c2) for c2 in cols):
                missing.append("%s (%.0f,%.0f)" % (s.attrs.get("data-key"), *p))
    for b in ch["bars"] + ch.get("hbars", []):
        bx, by, bw, bh = (num(b.attrs.get(k)) for k in ("x", "y", "width", "height"))
        if any(math.isnan(v) for v in (bx, by, bw, bh)) or bh * sy < 3 or bw * sx < 3:
            continue
        n += 1
        if not drawn(bx + bw / 2, by + bh / 2, paint(b, "fill"), r=1):
            missing.append("bar %s x %s" % (b.attrs.get("data-key"), b.attrs.get("data-x")))
    c.check(not missing, "chart %s: %d points and bars drawn in their colour%s" % (
        name, n, "" if not missing else " (not found: %s)" % ", ".join(missing[:4])))
    return 0 if missing else 1


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("report")
    ap.add_argument("--png")
    ap.add_argument("--metrics", action="append", default=[])
    ap.add_argument("--expect-charts")
    ap.add_argument("--chromium")
    ap.add_argument("--no-render", action="store_true", help="the page's HTML and data only")
    a = ap.parse_args()
    if not a.no_render and not a.png:
        ap.error("--png OUT.png is required unless --no-render")
    c = Checker()
    page = open(a.report, encoding="utf-8").read()
    tree = TreeBuilder()
    tree.feed(page)
    tree.close()
    print("page: %s, %d bytes" % (a.report, len(page)))
    check_self_contained(c, tree)
    expect = [e for e in a.expect_charts.split(",") if e] if a.expect_charts is not None else None
    charts = check_structure(c, tree, expect)
    metrics = []
    for path in a.metrics:
        with open(path, encoding="utf-8") as f:
            metrics.append([json.loads(l) for l in f if l.strip()])
    check_data(c, charts, metrics)
    if not a.no_render:
        exe = a.chromium or shutil.which("chromium") or shutil.which("chromium-browser")
        if c.check(bool(exe), "chromium found (%s)" % exe):
            render(c, exe, page, tree, charts, a.png)
    print("report_view: %s" % ("%d failed" % c.fails if c.fails else "all passed"))
    return 1 if c.fails else 0


if __name__ == "__main__":
    sys.exit(main())
