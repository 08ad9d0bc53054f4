#!/usr/bin/env bash
# On a machine with PyPI: download the anchors' pinned wheels for the H200 (CPython 3.12, manylinux
# x86_64) and pack them into .whl/<group>/ folders of at most 60 MiB each, one per device call.
#   scripts/fetch_anchors.sh [--extras]      # then: python3 scripts/anchor_wheels.py status
# Pins, groups and the staging rules: scripts/anchor_wheels.py; the staging procedure: bench/notes.md
# (section "Anchors"). .whl/ is git-ignored.
set -euo pipefail
cd "$(dirname "$0")/.."
exec python3 scripts/anchor_wheels.py fetch "$@"
