#!/usr/bin/env bash
# The main job on a fresh Debian/Ubuntu machine: build pteria and ask the bundled demo model
# (SmolLM2-135M-Instruct, assets/models/smollm2-135m-instruct) a question with `pteria generate`.
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
question="What is the capital of France?"
echo "> $question"
cargo run --release --quiet -- generate --prompt "$question" --temperature 0 --stats
echo "(chat with it: cargo run --release -- chat)"
