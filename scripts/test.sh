#!/usr/bin/env bash
# Runs every Pteria check on a fresh Debian/Ubuntu machine: installs what is missing, then
# formatting, lints, and all test suites. Usage: scripts/test.sh
set -euo pipefail
cd "$(dirname "$0")/.."

sudo_if_needed() { if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi; }

# System packages the build and tests need (what the -sys crates' build scripts probe with
# pkg-config, and what is loaded at run time):
# - everything: C toolchain for -sys crates, pkg-config, curl for rustup, and lavapipe
#   (mesa-vulkan-drivers), the CPU Vulkan driver every GPU kernel test runs on;
# - the Tauri app (src-tauri): WebKitGTK 4.1 with GTK 3, libsoup 3 and JavaScriptCore (the
#   webkit2gtk/gtk/soup3/javascriptcore -sys crates);
# - the Slint shell (ui/desktop): fontconfig (yeslogic-fontconfig-sys), and the X11 libraries winit
#   and xkbcommon-dl open at run time, plus a font for both windows to draw text with;
# - the window tests of both shells start Xvfb; the web UI tests run Debian's Chromium (driven by
#   npm playwright-core, on the machine's Node.js);
# - the Android/iOS checks (scripts/check-mobile.sh): clang compiles ring's C for those targets,
#   llvm-ar (from llvm) archives it.
pkgs=(build-essential pkg-config curl ca-certificates mesa-vulkan-drivers libvulkan1
  libwebkit2gtk-4.1-dev libgtk-3-dev libsoup-3.0-dev libjavascriptcoregtk-4.1-dev
  libfontconfig-dev libx11-6 libx11-xcb1 libxcursor1 libxi6 libxkbcommon0 libxkbcommon-x11-0
  fonts-dejavu-core xvfb chromium clang llvm)
command -v node >/dev/null 2>&1 || pkgs+=(nodejs npm)
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
# Every suite runs even after a failure, so one CI log shows all of them.
status=0
echo "== mobile: cargo check -p pteria-app for aarch64-linux-android and aarch64-apple-ios"
scripts/check-mobile.sh || status=$?
echo "== cargo test"
cargo test --workspace --no-fail-fast || status=$?

echo "== UI tests (ui/web in headless Chromium, Tauri IPC mocked)"
(cd ui/tests && npm ci --no-audit --no-fund --loglevel=error && node --test) || status=$?

exit "$status"
