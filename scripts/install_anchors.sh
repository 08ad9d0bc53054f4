#!/usr/bin/env bash
# On the H200 (no network): install every anchor stack whose wheels are all staged under .whl/
# (re-joining split wheels, checking sha256) into /tmp/site/<stack>, then write /tmp/site/env.sh.
# Safe to run after each staging call: finished stacks are not reinstalled.
#   scripts/install_anchors.sh && . /tmp/site/env.sh
# env: ANCHOR_SITE (default /tmp/site), ANCHOR_WHEELS (where pieces are gathered, default /tmp/anchor_wheels)
set -euo pipefail
cd "$(dirname "$0")/.."
exec python3 scripts/anchor_wheels.py install "$@"
