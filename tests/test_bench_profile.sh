#!/usr/bin/env bash
# test_bench_profile.sh - not written yet (skips).
exit 77
