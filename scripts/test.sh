#!/usr/bin/env bash
# Runs every Pteria check on a fresh Debian/Ubuntu machine: installs what is missing, then
# formatting, lints, and all test suites. Usage: scripts/test.sh
set -euo pipefail
cd "$(dirname "$0")/.."

sudo_if_needed() { if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi; }

# System packages the build and tests need: C toolchain for -sys crates, pkg-config, curl for
# rustup, and lavapipe (mesa-vulkan-drivers), the CPU Vulkan driver every GPU kernel test runs on.
pkgs=(build-essential pkg-config curl ca-certificates mesa-vulkan-drivers libvulkan1)
missing=()
for p in "${pkgs[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "installing: ${missing[*]}"
  sudo_if_needed apt-get update -qq
  sudo_if_needed env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}"
fi

if ! command -v cargo >/dev/null 2>&1; then
  curl -sSf https://sh.rustup.rs | sh -s -- -y --profile minimal
  # shellcheck disable=SC1091
  . "$HOME/.cargo/env"
fi
rustup component add rustfmt clippy >/dev/null 2>&1 || true

echo "== cargo fmt --check"
cargo fmt --all -- --check
echo "== cargo clippy"
cargo clippy --workspace --all-targets -- -D warnings
echo "== cargo test"
# Every suite runs even after a failure, so one CI log shows all of them.
cargo test --workspace --no-fail-fast
