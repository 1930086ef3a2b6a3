#!/usr/bin/env bash
# Type-checks the Tauri app for Android and iOS so the mobile builds never rot; no NDK or Xcode.
# `cargo check` still runs build scripts, and ring (rustls' crypto, under reqwest) compiles C and
# assembly for the target: Debian's clang with an explicit --target is enough for that. iOS has
# no SDK here, so cc is pointed at an empty sysroot; ring's C needs only compiler headers.
set -euo pipefail
cd "$(dirname "$0")/.."
rustup target add aarch64-linux-android aarch64-apple-ios >/dev/null

export CC_aarch64_linux_android="clang --target=aarch64-linux-android24"
export AR_aarch64_linux_android="$(command -v llvm-ar || command -v llvm-ar-14)"
echo "-- aarch64-linux-android"
cargo check -p pteria-app --target aarch64-linux-android

sysroot="$(mktemp -d)"
trap 'rm -rf "$sysroot"' EXIT
export SDKROOT="$sysroot"
export CC_aarch64_apple_ios="clang --target=arm64-apple-ios13.0"
export AR_aarch64_apple_ios="$AR_aarch64_linux_android"
echo "-- aarch64-apple-ios"
cargo check -p pteria-app --target aarch64-apple-ios
