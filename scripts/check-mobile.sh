#!/usr/bin/env bash
# Type-checks the Tauri app (pteria-app) for Android and iOS so the mobile builds never rot, on a
# Linux machine with no Android NDK and no Xcode. Called by scripts/test.sh; usage:
# scripts/check-mobile.sh [android] [ios]   (both when none is named)
#
# `cargo check` compiles every dependency's Rust (metadata only, nothing is linked) and runs the
# build scripts. Only one of those compiles C for the target: ring (rustls' crypto, under reqwest).
# Without an NDK or an SDK there are no target libc headers, so ring is built in the mode it has for
# exactly that (its build.rs uses it for musl/wasm cross builds): `-nostdlibinc` with
# RING_CORE_NOSTDLIBINC, where it needs only the compiler's own headers (stdint.h, stddef.h) and
# uses builtins for memcpy/memset. Debian's clang compiles it for the real target triple.
# iOS also needs Apple's <TargetConditionals.h>, which ring includes to tell iOS from macOS; it is
# an SDK header, so a stand-in defining the iOS device values is written under the build dir.
# Tauri's own build script links its Swift library only when the host is macOS (tauri/build.rs),
# so nothing here calls xcrun or swift; SDKROOT points at the stand-in dir so cc-rs does not ask
# xcrun for an SDK either.
#
# What this does not cover: linking, the Swift/Kotlin sides, and the gen/ projects (those need
# Xcode / the Android SDK+NDK; see the README's "Mobile" part).
set -euo pipefail
cd "$(dirname "$0")/.."

targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(android ios)

for tool in clang llvm-ar; do
  if ! command -v "$tool" >/dev/null 2>&1; then
    echo "check-mobile: '$tool' not found (Debian: clang llvm; scripts/test.sh installs them)" >&2
    exit 1
  fi
done

# Warnings in mobile-only code (cfg(mobile), cfg(target_os = "android")) fail the check, as clippy
# -D warnings does on the host. Per-target flags leave the host build's cache untouched.
export CARGO_TARGET_AARCH64_LINUX_ANDROID_RUSTFLAGS="-D warnings"
export CARGO_TARGET_AARCH64_APPLE_IOS_RUSTFLAGS="-D warnings"

check() {
  local triple=$1
  rustup -q target add "$triple"
  echo "-- cargo check -p pteria-app --target $triple"
  local start=$SECONDS
  cargo check -p pteria-app --target "$triple"
  echo "-- $triple: ok ($((SECONDS - start)) s)"
}

for t in "${targets[@]}"; do
  case "$t" in
  android)
    export CC_aarch64_linux_android=clang AR_aarch64_linux_android=llvm-ar
    export CFLAGS_aarch64_linux_android="-nostdlibinc -DRING_CORE_NOSTDLIBINC=1"
    check aarch64-linux-android
    ;;
  ios)
    # A fixed path under the build dir, so ring's build script is not rerun for a new one.
    sdk="$(realpath -m "${CARGO_TARGET_DIR:-target}")/mobile-sdk-stand-in"
    mkdir -p "$sdk"
    # Apple's values for an iOS device build (arm64, not the simulator).
    cat >"$sdk/TargetConditionals.h.new" <<'EOF'
#define TARGET_OS_MAC 1
#define TARGET_OS_OSX 0
#define TARGET_OS_IPHONE 1
#define TARGET_OS_IOS 1
#define TARGET_OS_SIMULATOR 0
EOF
    cmp -s "$sdk/TargetConditionals.h.new" "$sdk/TargetConditionals.h" ||
      mv "$sdk/TargetConditionals.h.new" "$sdk/TargetConditionals.h"
    export SDKROOT="$sdk" IPHONEOS_DEPLOYMENT_TARGET=14.0
    export CC_aarch64_apple_ios=clang AR_aarch64_apple_ios=llvm-ar
    export CFLAGS_aarch64_apple_ios="-nostdlibinc -DRING_CORE_NOSTDLIBINC=1 -I$sdk"
    check aarch64-apple-ios
    ;;
  *)
    echo "check-mobile: unknown target '$t' (android, ios)" >&2
    exit 2
    ;;
  esac
done
