#!/usr/bin/env bash
# test.sh - builds and runs every test on a fresh Debian 12 machine: installs
# what is missing, then
#   1. the normal build and its ctest suite (with the `cluster` tests: a throwaway Slurm
#      running the job scripts of docs/STAGING.md, two "nodes" as network namespaces, a second
#      local user against staging; they need root and namespaces, and skip without),
#   2. an ASan+UBSan build (-DRT_SANITIZE=ON) and the same suite but the `scale` test (32 ranks) and
#      the tests labelled `nosan` (text checks, or C paths another test runs under ASan: tests/CMakeLists.txt),
#   3. a ThreadSanitizer build (-DRT_TSAN=ON) of the threaded stages' tests (the comm
#      thread's under mpirun -np 2), of the stream protocol on the CPU backend's
#      asynchronous streams (RINGTRAIN_CPU_STREAMS=async, one compute thread), and of
#      the trace recorder, alone and under every thread of a traced run, and NVML's sampler,
#   4. the libFuzzer targets (clang, -DRT_FUZZ=ON), each for a bounded time
#      (RT_FUZZ_SECONDS, default 30) from the seed corpus,
#   5. the `fresh` test: this commit on a pristine Debian 12 root, installed by root and built, run,
#      tested and packaged by an ordinary user; the .deb installed into another pristine root
#      (tests/test_fresh.sh; needs root and the package sources, skips without); it runs in the
#      background from the end of 2 on, beside 3 and 4, and its output comes last.
# Exits non-zero if anything fails. `.ci/run` calls exactly this.
set -eu
top=$(cd "$(dirname "$0")/.." && pwd)
cd "$top"
tools/install-deps.sh --test
jobs=$(nproc)

echo "== build (Release, as tools/quickstart.sh builds)"
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j "$jobs"
ctest --test-dir build --output-on-failure -j "$jobs" -LE fresh

echo "== build (ASan + UBSan)"
cmake -S . -B build-asan -G Ninja -DRT_SANITIZE=ON -DRT_CUDA=OFF >/dev/null
cmake --build build-asan -j "$jobs"
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
    ctest --test-dir build-asan --output-on-failure -j "$jobs" -LE 'fresh|scale|nosan'

# The fresh test is mostly apt and dpkg for its first four minutes, one core: it starts here, beside the
# ThreadSanitizer stage (whose tests run one at a time) and then the fuzzers (one process on one core each), in
# its own session so that a failure here can stop it and everything it started.
echo "== fresh: a pristine Debian 12 root (beside the TSan stage and the fuzzers; its output after theirs)"
setsid ctest --test-dir build -V -L fresh >build/fresh.log 2>&1 &
fresh=$!
trap 'kill -TERM -- -$fresh 2>/dev/null || true' EXIT

echo "== build (ThreadSanitizer) for the threaded stages"
cmake -S . -B build-tsan -G Ninja -DRT_TSAN=ON -DRT_CUDA=OFF >/dev/null
cmake --build build-tsan -j "$jobs" --target test_pack test_synth test_ring test_loader test_comm test_ddp \
    test_train_step test_trace test_nvml fake_nvml ringtrain
RT_TEST_SMALL=1 RT_TEST_THREADS=1 TSAN_OPTIONS=halt_on_error=1:suppressions="$top/tests/tsan-openmpi.supp" \
    ctest --test-dir build-tsan --output-on-failure \
    -R '^test_(pack|synth|ring|loader|comm_np2|ddp_np2|train_step_async|ddp_async_np2|cpu_streams|trace|trace_run|nvml)$'

echo "== fuzz (libFuzzer, ${RT_FUZZ_SECONDS:-30} s per target)"
cmake -S . -B build-fuzz -G Ninja -DCMAKE_C_COMPILER=clang -DRT_FUZZ=ON -DRT_CUDA=OFF >/dev/null
cmake --build build-fuzz -j "$jobs" --target fuzz_shard fuzz_pickle fuzz_idx fuzz_safetensors fuzz_image
for t in shard pickle idx safetensors image; do
    work=$(mktemp -d)
    build-fuzz/tests/fuzz/fuzz_$t -max_total_time="${RT_FUZZ_SECONDS:-30}" -rss_limit_mb=2048 \
        -print_final_stats=1 "$work" "tests/fuzz/corpus/$t" 2>"$work.log" ||
        { tail -40 "$work.log"; echo "fuzz_$t found a crash (reproducer in $PWD)"; exit 1; }
    grep -E "stat::number_of_executed_units" "$work.log" | sed "s/^/fuzz_$t: /"
    rm -rf "$work" "$work.log"
done

echo "== fresh (output)"
rc=0
wait "$fresh" || rc=$?
trap - EXIT
cat build/fresh.log
[ "$rc" -eq 0 ] || { echo "the fresh test failed (exit $rc)"; exit 1; }
echo "all tests passed"
