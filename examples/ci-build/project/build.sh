#!/usr/bin/env bash
# The project's CI build: byte-compile every module, then run the tests.
set -euo pipefail
echo "== compile"
python3 -m compileall -q .
echo "== test"
python3 test_stats.py
