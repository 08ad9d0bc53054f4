#!/usr/bin/env bash
# The source tree of a git ref under .carry/baseline (git-ignored), for scripts/h200_check.sh's
# BASELINE=1: the device call then builds that tree's library as well and times both libraries on
# the same machine (A/B of a candidate against its base, free of the machines' spread).
#   scripts/make_baseline.sh <ref>      then run the device call with carry [".carry/baseline"]
set -euo pipefail
cd "$(dirname "$0")/.."
ref=${1:?usage: scripts/make_baseline.sh <git ref>}
rm -rf .carry/baseline
mkdir -p .carry/baseline
# the library's build inputs: the tree without bench/ and docs (bench's C++ tools and scripts kept)
git archive "$ref" CMakeLists.txt cmake src include python tests examples \
  $(git ls-tree -r --name-only "$ref" bench | grep -v '^bench/results/') | tar -x -C .carry/baseline
git rev-parse --short "$ref" >.carry/baseline/COMMIT
echo "baseline $(cat .carry/baseline/COMMIT) in .carry/baseline ($(du -sh .carry/baseline | cut -f1))"
