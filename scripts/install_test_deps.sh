#!/usr/bin/env bash
# Test-only packages, installed by `make test` (`scripts/setup.sh test` runs this last). Idempotent and never fatal: without them
# the tests that need them are skipped.
#
# 1. The real tracker packages for tests/record/test_record_trackers.py (a wandb offline run, an MLflow
#    file store), kept in $VENV/tracker-site: those tests run them in a subprocess with that folder on its
#    path. Nothing else sees them: TRL imports wandb in every process where it is importable.
VENV=${VENV:-.venv}
TRACKERS="wandb==0.31.0 mlflow-skinny==3.17.2"
if [ ! -f "$VENV/tracker-site/.installed" ] || [ "$(cat "$VENV/tracker-site/.installed")" != "$TRACKERS" ]; then
  echo "install_test_deps: installing $TRACKERS into $VENV/tracker-site (the tracker sinks' tests only)"
  rm -rf "$VENV/tracker-site"
  # shellcheck disable=SC2086
  if "$VENV/bin/python" -m pip --disable-pip-version-check install -q --target "$VENV/tracker-site" $TRACKERS >/dev/null 2>&1; then
    echo "$TRACKERS" > "$VENV/tracker-site/.installed"
  else
    rm -rf "$VENV/tracker-site"
    echo "install_test_deps: could not install $TRACKERS; the wandb and mlflow tests will be skipped"
  fi
fi

# 2. Debian's chromium renders the HTML report headless in tests/record/test_report_browser.py. As root it
#    uses apt-get, otherwise passwordless sudo (CI runners) when there is one.
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
