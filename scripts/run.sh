#!/usr/bin/env bash
# The main job on a fresh Debian/Ubuntu machine: build pteria and ask the bundled demo model
# (SmolLM2-135M-Instruct, assets/models/smollm2-135m-instruct) a question with `pteria generate`.
# The demo model's program is not in git (too large, see its README.md); without it this runs the
# CPU reference runtime on a bundled Gemma 4 test program instead.
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
demo=assets/models/smollm2-135m-instruct/model.pte
if [ -f "$demo" ]; then
  question="What is the capital of France?"
  echo "> $question"
  cargo run --release --quiet -- generate --prompt "$question" --temperature 0 --stats
  echo "(chat with it: cargo run --release -- chat)"
  exit 0
fi
echo "note: $demo is not here (it is not in git; see assets/models/smollm2-135m-instruct/README.md)." >&2
echo "Running the fixture job instead." >&2
program=tests/fixtures/gemma4_tiny_portable_fp32.pte
cargo run --release --quiet -- inspect "$program"
echo "logits for prompt 2,17,93,150,8,201,66,34,250,120 then tokens 45,7:"
out=$(cargo run --release --quiet -- logits "$program" --prompt 2,17,93,150,8,201,66,34,250,120 --decode 45,7)
echo "${out:0:400} ..."
