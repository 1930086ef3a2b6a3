#!/usr/bin/env bash
# The main job on a fresh Debian/Ubuntu machine: build pteria, describe a bundled Gemma 4 test
# program, and run it (a prompt, then decode steps) on the CPU reference runtime.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v cargo >/dev/null 2>&1; then
  if ! command -v curl >/dev/null 2>&1 || ! dpkg -s build-essential >/dev/null 2>&1; then
    if [ "$(id -u)" -eq 0 ]; then s=; else s=sudo; fi
    $s apt-get update -qq
    $s env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq build-essential pkg-config curl ca-certificates
  fi
  curl -sSf https://sh.rustup.rs | sh -s -- -y --profile minimal
  # shellcheck disable=SC1091
  . "$HOME/.cargo/env"
fi
program=tests/fixtures/gemma4_tiny_portable_fp32.pte
cargo run --release --quiet -- inspect "$program"
echo "logits for prompt 2,17,93,150,8,201,66,34,250,120 then tokens 45,7:"
out=$(cargo run --release --quiet -- logits "$program" --prompt 2,17,93,150,8,201,66,34,250,120 --decode 45,7)
echo "${out:0:400} ..."
