#!/usr/bin/env bash
# scripts/main.sh: set up, build and run the main job on the shipped small models: kvld for
# qwen3-a and qwen3-b and kvlingo-router (cascade policy) on loopback, a scripted 6-turn
# conversation that switches models by translating the KV cache, one line per turn, and a
# comparison with re-prefill TTFT for the same switches.  Stops what it started.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh build
exec scripts/demo.sh build
