#!/usr/bin/env bash
# Test-only system packages: Debian's chromium renders the HTML report headless in
# tests/test_report_browser.py. Idempotent and never fatal: without it that one test is skipped.
if command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1; then
  exit 0
fi
if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
  echo "install_test_deps: installing chromium (headless report rendering test)"
  (apt-get install -y -qq --no-install-recommends chromium >/dev/null 2>&1 || { apt-get update -qq >/dev/null 2>&1 && \
    apt-get install -y -qq --no-install-recommends chromium >/dev/null 2>&1; }) || \
    echo "install_test_deps: could not install chromium; the report rendering test will be skipped"
else
  echo "install_test_deps: chromium missing and cannot install it (need root and apt-get); the rendering test will be skipped"
fi
exit 0
