#!/usr/bin/env bash
# report_screenshot.sh - docs/report.png: the top of a real run's report page, as headless Chromium draws
# it 1280 px wide, cut between two rows of charts, reduced to a palette so that the PNG stays small
# (under 300 KB) and its text sharp.
# Usage: tools/dev/report_screenshot.sh [REPORT.html [OUT.png]] [--height PX]
#   REPORT.html  default data/report.html (what tools/quickstart.sh writes)
#   OUT.png      default docs/report.png
#   --height PX  the most of the page to keep, from its top (default 1500); the cut goes in the last gap
#                between charts above it
# Needs chromium (tools/install-deps.sh --test) and Python with PIL and numpy.
set -eu -o pipefail
top=$(cd "$(dirname "$0")/../.." && pwd)
args=() height=1500
while [ $# -gt 0 ]; do
    case $1 in
    --height) height=${2:?--height needs a number}; shift 2 ;;
    -h | --help) sed -n '2,/^set -eu/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) args+=("$1"); shift ;;
    esac
done
page=${args[0]:-$top/data/report.html}
out=${args[1]:-$top/docs/report.png}
PY=/usr/bin/python3
[ -x "$PY" ] || PY=$(command -v python3)
chromium=$(command -v chromium || command -v chromium-browser || true)
[ -n "$chromium" ] || { echo "report_screenshot: no chromium (tools/install-deps.sh --test installs it)" >&2; exit 1; }
[ -f "$page" ] || { echo "report_screenshot: no $page (tools/quickstart.sh writes data/report.html)" >&2; exit 1; }
page=$(cd "$(dirname "$page")" && pwd)/$(basename "$page")

T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
# A window taller than the part kept: the page's own layout at 1280 px, the bottom cut below.
DBUS_SESSION_BUS_ADDRESS=disabled: timeout 90 "$chromium" --headless --no-sandbox --disable-gpu --hide-scrollbars \
    --disable-dev-shm-usage --no-first-run --disable-extensions --force-color-profile=srgb \
    --force-device-scale-factor=1 --user-data-dir="$T/profile" --screenshot="$T/shot.png" \
    --window-size=1280,$((height + 600)) "file://$page" >"$T/log" 2>&1 \
    || { echo "report_screenshot: chromium failed:" >&2; tail -5 "$T/log" >&2; exit 1; }

"$PY" - "$T/shot.png" "$out" "$height" <<'EOF'
import io, sys
import numpy as np
from PIL import Image

src, out, max_h = sys.argv[1], sys.argv[2], int(sys.argv[3])
img = np.asarray(Image.open(src).convert("RGB"))
bg = img[-1, 0]
blank = (img == bg).all(axis=2).all(axis=1)
ink = np.nonzero(~blank)[0]
bottom = int(ink[-1]) + 1 if len(ink) else img.shape[0]
# The cut: the middle of the last gap of 8 or more blank rows above max_h (the gaps between the rows of
# charts and between sections), or max_h itself when there is none; the page's end when it is shorter.
cut = min(bottom + 12, img.shape[0])
if bottom > max_h:
    cut, run = max_h, 0
    for y in range(max_h):
        run = run + 1 if blank[y] else 0
        if run >= 8 and (y + 1 >= max_h or not blank[y + 1]):
            cut = y - run // 2
img = Image.fromarray(img[:cut])
# A palette of at most 128 colours: the charts' flat colours, grey text edges, white. Fewer if still too big.
for colours in (128, 64, 32):
    buf = io.BytesIO()
    img.quantize(colors=colours, method=Image.Quantize.MEDIANCUT, dither=Image.Dither.NONE).save(buf, "PNG", optimize=True)
    if buf.tell() < 300 * 1024:
        break
open(out, "wb").write(buf.getvalue())
print("report_screenshot: %s, %dx%d, %d colours, %d KB" % (out, img.width, img.height, colours, (buf.tell() + 1023) // 1024))
EOF
