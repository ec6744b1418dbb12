#!/usr/bin/env bash
# test_pack_folder.sh - a folder of pictures as people have them, end to end:
# tests/mkfolder.c writes every case (baseline/progressive/gray/CMYK/YCCK
# JPEGs, PNGs of every colour type, WebP, PPM/PGM, upper-case and .jpeg
# names, a PNG named .jpg, an empty class, a JPEG with junk bytes before its
# SOS that libjpeg decodes with a warning, BMPs of every depth and RLE, TIFFs
# of every common layout and compression) with six bad files (a truncated
# JPEG, BMP and TIFF, text named .jpg, zero bytes, a BMP header Pillow refuses)
# and four to ignore, and its expected.json.
#   - pack without --skip-bad stops at the first bad file in record order, naming it;
#   - --size 48 --skip-bad packs exactly the good files, lists the bad ones with
#     their reasons (manifest "files") and prints the summary line; every record
#     matches Pillow + torchvision's Resize(48) + CenterCrop(48) of its file
#     within the PSNR pack_folder_check.py states; --fit pad leaves black borders;
#   - the JPEG with the warning is kept without --skip-bad, listed with its warning
#     (manifest "files" "warnings") and in the summary line, and its record, raw or
#     as the JPEG stored, equals Pillow's convert("RGB") of it;
#   - --codec jpeg --max-side 128 keeps each record's own size (<= 128), verify
#     passes, and the load-time crops are the same batches for 1 and 2 workers
#     and differ for another seed; train runs on them at --image-size S and eval takes S from the checkpoint.
# Usage: test_pack_folder.sh path/to/ringtrain path/to/rt_mkfolder. Exit 0 pass, 1 fail, 77 skip.
set -u
RT=$1 MK=$2
PY=/usr/bin/python3
HERE=$(cd "$(dirname "$0")" && pwd)
$PY -c 'import PIL, torchvision' 2>/dev/null || { echo "skipped: needs /usr/bin/python3 with Pillow and torchvision"; exit 77; }
T=$(mktemp -d "${TMPDIR:-/tmp}/rt-packfolder-XXXXXX")
trap 'rm -rf "$T"' EXIT
fails=0 checks=0
fail() { echo "FAIL: $*" >&2; fails=$((fails + 1)); }
check() { checks=$((checks + 1)); "$@" || fail "$*"; }
has() { grep -qF -- "$2" "$1" || { echo "--- $1:" >&2; cat "$1" >&2; return 1; }; }

"$MK" "$T/photos" --count 6 >/dev/null || { echo "FAIL: rt_mkfolder"; exit 1; }
exp=$T/photos.expected.json
first_bad=$($PY -c '
import json, sys
e = json.load(open(sys.argv[1]))
bad = sorted((f["path"].encode() for f in e["files"] if f["status"] not in ("ok", "ignored")))
print(bad[0].decode())' "$exp")

# 1. Without --skip-bad: the first bad file in record order (classes, then names, byte order) stops it.
checks=$((checks + 1))
if "$RT" pack "$T/photos" --out "$T/strict" --size 48 >"$T/out" 2>"$T/err"; then
    fail "pack of a folder with bad files succeeded without --skip-bad"
else
    has "$T/err" "photos/$first_bad" || fail "the error does not name the first bad file $first_bad"
    has "$T/err" "--skip-bad" || fail "the error does not name --skip-bad"
    [ ! -e "$T/strict" ] && [ ! -e "$T/strict.partial" ] || fail "a failed pack left $T/strict(.partial) behind"
fi

# 2. --size 48 --skip-bad: counts, the manifest's list, the summary line, pixels against Pillow.
check "$RT" pack "$T/photos" --out "$T/s48" --size 48 --skip-bad --threads 2 >"$T/out" 2>"$T/err"
check has "$T/out" "skipped 6 of "
check has "$T/out" "1 zero-sized, 1 not an image, 3 truncated, 1 unsupported"
check has "$T/out" "ignored 4 files"
check has "$T/out" "pack: 1 file decoded through a libjpeg warning (listed under \"files\" in $T/s48/manifest.json): first: $T/photos/dogs/warned.jpg: Corrupt JPEG data: 3 extraneous bytes before marker 0xda"
check "$RT" verify "$T/s48" >/dev/null
check $PY "$HERE/pack_folder_check.py" counts "$exp" "$T/s48"
# The record of the JPEG with the warning: its place among the good files in record order.
wr=$($PY -c '
import json, sys
e = json.load(open(sys.argv[1]))
ok = sorted((f for f in e["files"] if f["status"] == "ok"), key=lambda f: (f["class"].encode(), f["path"].encode()))
print(next(i for i, f in enumerate(ok) if f["warning"]))' "$exp")
for r in 0 3 5 8 12 13 20 $wr; do "$RT" inspect "$T/s48" --record $r --out "$T/s48_$r.png" >/dev/null || fail "inspect record $r"; done
check $PY "$HERE/pack_folder_check.py" pixels "$exp" "$T/s48" "$T" 0 3 5 8 12 13 20 $wr
check "$RT" pack "$T/photos" --out "$T/pad" --size 40x56 --fit pad --skip-bad --threads 1 >/dev/null
check "$RT" inspect "$T/pad" --record 0 --out "$T/pad_0.png" >/dev/null
check $PY "$HERE/pack_folder_check.py" pad "$exp" "$T/pad_0.png"
# The same input and options give the same bytes at any thread count.
check "$RT" pack "$T/photos" --out "$T/s48b" --size 48 --skip-bad --threads 1 >/dev/null
check cmp "$T/s48/manifest.json" "$T/s48b/manifest.json"
check cmp "$T/s48/train-00000.rts" "$T/s48b/train-00000.rts"

# 2b. The warned JPEG alone: kept without --skip-bad, pixels equal to Pillow's, stored raw and as the file
# itself (the jpeg codec passes it through; inspect decodes it with the loader's TurboJPEG path).
mkdir -p "$T/warned/a" && cp "$T/photos/dogs/warned.jpg" "$T/warned/a/0.jpg"
for codec in raw jpeg; do
    check "$RT" pack "$T/warned" --out "$T/w_$codec" --codec $codec >"$T/out" 2>"$T/err"
    check has "$T/out" "1 file decoded through a libjpeg warning"
    check has "$T/w_$codec/manifest.json" "3 extraneous bytes before marker 0xda"
    check "$RT" inspect "$T/w_$codec" --record 0 --out "$T/w_$codec.png" >/dev/null
    check $PY "$HERE/pack_folder_check.py" exact "$T/warned/a/0.jpg" "$T/w_$codec.png"
done
check has "$T/w_jpeg/manifest.json" "passthrough"

# 2c. Lossless files where Pillow's reading is easy to miss, each alone, packed as they are with --exif-rotate:
# the record equals Pillow's ImageOps.exif_transpose(...).convert("RGB") exactly (16-bit gray clipped as
# Pillow's mode "I" converts it; a lossless WebP turned as its EXIF chunk says; a PNG whose eXIf comes after
# IDAT, turned, which also makes the probe's displayed size -- pack's record shape -- the turned one).
for f in x_gray16.png y_rotated.webp z_rotated_late.png; do
    mkdir -p "$T/one_$f/a" && cp "$T/photos/dogs/$f" "$T/one_$f/a/0.${f#*.}"
    check "$RT" pack "$T/one_$f" --out "$T/p_$f" --codec raw --exif-rotate >/dev/null
    check "$RT" inspect "$T/p_$f" --record 0 --out "$T/p_$f.png" >/dev/null
    check $PY "$HERE/pack_folder_check.py" exact-rotated "$T/photos/dogs/$f" "$T/p_$f.png"
done

# 2d. BMP and TIFF files where Pillow's reading is easy to miss, each alone, packed as they are: the record equals
# Pillow's convert("RGB") exactly (RLE8 with a delta as Pillow 9.4 reads it, 16-bit 5-6-5, JPEG-in-TIFF, and a TIFF
# with an Orientation tag, which Pillow turns on load, asked or not: the probe's size, pack's record shape, is turned).
for f in zb_rle8.bmp zb_565.bmp zt_jpeg.tif zt_rotated.tif; do
    mkdir -p "$T/one_$f/a" && cp "$T/photos/dogs/$f" "$T/one_$f/a/0.${f#*.}"
    check "$RT" pack "$T/one_$f" --out "$T/p_$f" --codec raw >/dev/null
    check "$RT" inspect "$T/p_$f" --record 0 --out "$T/p_$f.png" >/dev/null
    check $PY "$HERE/pack_folder_check.py" exact "$T/photos/dogs/$f" "$T/p_$f.png"
done

# 3. Variable sizes (the warned JPEG is stored as it is, and the load-time crops decode it): --codec jpeg --max-side 128, crops at load time.
check "$RT" pack "$T/photos" --out "$T/var" --codec jpeg --max-side 128 --skip-bad --val-split 0.25 >"$T/out" 2>"$T/err"
check "$RT" verify "$T/var" >/dev/null
check $PY "$HERE/pack_folder_check.py" variable "$exp" "$T/var" 128
for r in 0 1 2; do
    "$RT" inspect "$T/var" --record $r --out "$T/var_$r.png" >"$T/insp_$r" || fail "inspect var record $r"
done
check $PY "$HERE/pack_folder_check.py" sizes "$T/var" "$T"/insp_0 "$T"/insp_1 "$T"/insp_2
digest() { "$RT" loadbench "$T/var" --image-size 32 --batch-size 8 --epochs 2 --digest "$@" | sed -n 's/^digest: \([0-9a-f]*\).*/\1/p'; }
d1=$(digest --workers 1) d2=$(digest --workers 2) d3=$(digest --workers 2 --seed 7)
checks=$((checks + 1))
[ -n "$d1" ] && [ "$d1" = "$d2" ] || fail "crops differ between 1 and 2 workers ($d1, $d2)"
checks=$((checks + 1))
[ "$d3" != "$d2" ] || fail "another seed gave the same crops"
dv1=$(digest --workers 1 --split val) dv2=$(digest --workers 2 --split val)
checks=$((checks + 1))
[ -n "$dv1" ] && [ "$dv1" = "$dv2" ] || fail "centre crops differ between 1 and 2 workers"
checks=$((checks + 1))
if "$RT" loadbench "$T/var" --epochs 1 >"$T/out" 2>"$T/err"; then fail "loadbench without --image-size ran"; else
    has "$T/err" "--image-size" || fail "no hint at --image-size"; fi
# A small model, one epoch (after which the val split is evaluated): the crops' path into training is under test.
check "$RT" train --data "$T/var" --image-size 16 --model mnist-net --epochs 1 --batch-size 8 \
    --checkpoint-dir "$T/ck" >"$T/out" 2>&1
check has "$T/out" "val acc"
# eval takes the crop size from the checkpoint: a folder with train/ and test/ (the same pictures).
mkdir "$T/tt" && ln -s "$T/photos" "$T/tt/train" && ln -s "$T/photos" "$T/tt/test"
check "$RT" pack "$T/tt" --out "$T/vt" --codec jpeg --max-side 64 --skip-bad >/dev/null 2>&1
check "$RT" train --data "$T/vt" --image-size 20 --model mnist-net --steps 2 --batch-size 8 \
    --checkpoint-dir "$T/ck2" >"$T/out" 2>&1
check "$RT" eval --data "$T/vt" --checkpoint "$T/ck2/model.safetensors" >"$T/out" 2>&1
nok=$($PY -c 'import json, sys; print(json.load(open(sys.argv[1]))["counts"]["ok"])' "$exp")
check has "$T/out" "test split: $nok images"

echo "test_pack_folder: $checks checks, $fails failed"
[ "$fails" -eq 0 ]
