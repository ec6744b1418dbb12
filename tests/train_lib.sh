# train_lib.sh - sourced by the training tests (test_train.sh, test_multirank.sh):
# pass/fail counting and the readers they share. Needs $PY (a python3).
fails=0
pass() { echo "ok   $*"; }
fail() { echo "FAIL $*"; fails=$((fails + 1)); }

jfield() { # jfield FILE KEY: KEY of the last JSON line of FILE
    "$PY" -c 'import json,sys; print(json.loads([l for l in open(sys.argv[1]) if l.startswith("{")][-1])[sys.argv[2]])' "$1" "$2" 2>/dev/null
}

same_weights() { # same_weights A B: every tensor of two safetensors files byte-equal (metadata aside)
    "$PY" - "$1" "$2" <<'PYEOF'
import json, struct, sys
def load(p):
    b = open(p, "rb").read(); n = struct.unpack("<Q", b[:8])[0]; h = json.loads(b[8:8 + n]); h.pop("__metadata__", None)
    return {k: b[8 + n + v["data_offsets"][0]: 8 + n + v["data_offsets"][1]] for k, v in h.items()}
a, b = load(sys.argv[1]), load(sys.argv[2])
bad = [k for k in a if a[k] != b.get(k)]
assert set(a) == set(b) and not bad, bad[:5]
PYEOF
}
