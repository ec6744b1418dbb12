#!/usr/bin/env bash
# make_corpus.sh - regenerates the seed corpora for fuzz_shard and fuzz_idx
# from tiny synthetic datasets. Usage: tests/fuzz/make_corpus.sh build/ringtrain
# (fuzz_pickle's seeds come from tests/fixtures/make_pickle_fixtures.py.)
set -eu
RT=${1:?usage: make_corpus.sh path/to/ringtrain}
here=$(cd "$(dirname "$0")" && pwd)
t=$(mktemp -d)
trap 'rm -rf "$t"' EXIT
"$RT" synth --out "$t/c" --train 10 --test 2 --seed 1 >/dev/null
"$RT" synth --out "$t/m" --format mnist --train 3 --test 2 --seed 1 >/dev/null
"$RT" pack "$t/c" --out "$t/raw" --block-records 4 >/dev/null
"$RT" pack "$t/c" --out "$t/jpeg" --codec jpeg --block-records 4 >/dev/null
mkdir -p "$here/corpus/shard" "$here/corpus/idx"
# fuzz_shard: first byte even = shard, odd = manifest.
{ printf '\x00'; cat "$t/raw/test-00000.rts"; } >"$here/corpus/shard/raw-shard"
{ printf '\x00'; cat "$t/jpeg/test-00000.rts"; } >"$here/corpus/shard/jpeg-shard"
{ printf '\x01'; cat "$t/raw/manifest.json"; } >"$here/corpus/shard/manifest"
# first byte 2: the target recomputes checksums so mutations reach the decoders.
{ printf '\x02'; cat "$t/raw/test-00000.rts"; } >"$here/corpus/shard/raw-shard-resealed"
{ printf '\x02'; cat "$t/jpeg/test-00000.rts"; } >"$here/corpus/shard/jpeg-shard-resealed"
cp "$t/m/t10k-images-idx3-ubyte.gz" "$here/corpus/idx/images.gz"
cp "$t/m/t10k-labels-idx1-ubyte.gz" "$here/corpus/idx/labels.gz"
gzip -dc "$t/m/t10k-labels-idx1-ubyte.gz" >"$here/corpus/idx/labels"
ls -la "$here/corpus/shard" "$here/corpus/idx"
