#!/usr/bin/env bash
# Install what the code-execution sandbox needs (Debian: bubblewrap; setpriv comes with util-linux).
# Idempotent and never fatal: without root or apt it only says so, and grpokit then detects at start-up
# that isolation is missing and refuses code rewards (unless allow_unsafe_code_execution=True).
if command -v bwrap >/dev/null 2>&1; then
  exit 0
fi
if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
  echo "install_sandbox_deps: installing bubblewrap"
  (apt-get install -y -qq bubblewrap >/dev/null 2>&1 || { apt-get update -qq >/dev/null 2>&1 && \
    apt-get install -y -qq bubblewrap >/dev/null 2>&1; }) || \
    echo "install_sandbox_deps: could not install bubblewrap; code rewards will refuse to run"
else
  echo "install_sandbox_deps: bubblewrap missing and cannot install it (need root and apt-get); code rewards will refuse to run"
fi
exit 0
