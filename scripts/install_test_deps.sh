#!/usr/bin/env bash
# Test-only system packages: Debian's chromium renders the HTML report headless in
# tests/record/test_report_browser.py. Idempotent and never fatal: without it those tests are skipped.
# `make test` runs this after `make setup`; as root it uses apt-get, otherwise passwordless sudo
# (CI runners) when there is one.
if command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1; then
  exit 0
fi
if [ "$(id -u)" = "0" ]; then
  as_root=()
elif command -v sudo >/dev/null 2>&1 && sudo -n true >/dev/null 2>&1; then
  as_root=(sudo -n)
else
  echo "install_test_deps: chromium missing and cannot install it (need root or passwordless sudo); the report's browser tests will be skipped"
  exit 0
fi
if ! command -v apt-get >/dev/null 2>&1; then
  echo "install_test_deps: chromium missing and no apt-get; the report's browser tests will be skipped"
  exit 0
fi
echo "install_test_deps: installing chromium (headless report rendering tests)"
install() { "${as_root[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium >/dev/null 2>&1; }
install || { "${as_root[@]}" apt-get update -qq >/dev/null 2>&1 && install; } || \
  echo "install_test_deps: could not install chromium; the report's browser tests will be skipped"
exit 0
