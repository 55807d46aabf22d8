#!/bin/sh
# The cross compiler and emulator tests/kernels/test_cpu_native_aarch64.py builds and runs the native CPU ops'
# Arm builds with, installed through apt-get where that works without a password; anywhere else one line says the
# checks will skip, and the install goes on (this script always exits 0).
PACKAGES="gcc-aarch64-linux-gnu libc6-dev-arm64-cross qemu-user"
command -v aarch64-linux-gnu-gcc >/dev/null 2>&1 && command -v qemu-aarch64 >/dev/null 2>&1 && exit 0
skip() { echo "aarch64 kernel checks will skip: $1 (they need: $PACKAGES)"; exit 0; }
command -v apt-get >/dev/null 2>&1 || skip "no apt-get here"
if [ "$(id -u)" = 0 ]; then
    as_root=""
elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
    as_root="sudo -n"
else
    skip "not root, and no sudo without a password"
fi
export DEBIAN_FRONTEND=noninteractive
$as_root apt-get install -y -qq $PACKAGES >/dev/null 2>&1 \
    || { $as_root apt-get update -qq >/dev/null 2>&1 && $as_root apt-get install -y -qq $PACKAGES >/dev/null 2>&1; } \
    || skip "apt-get could not install them (offline?)"
echo "installed $PACKAGES for the aarch64 kernel checks"
