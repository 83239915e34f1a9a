#!/usr/bin/env bash
# scripts/main.sh: set up, build and run the main job on the shipped small models.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh build
build/kvlingo info --model models/qwen3-b
build/kvlingo generate --model models/qwen3-b --max-tokens 48 \
  --prompt "The committee said on Friday that the investigation of the recent election produced no evidence that"
