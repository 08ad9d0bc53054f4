#!/usr/bin/env bash
# The source tree of a git ref under .carry/baseline (git-ignored), for scripts/h200_check.sh's
# BASELINE=1: the device call then builds that tree's library as well and times both libraries on
# the same machine (A/B of a candidate against its base, free of the machines' spread).
#   scripts/make_baseline.sh <ref>            then run the device call with carry [".carry/baseline"]
#   scripts/make_baseline.sh <ref> variant    a second candidate under .carry/variant (h200_check's
#                                             VARIANT=1, carry [".carry/baseline", ".carry/variant"])
set -euo pipefail
cd "$(dirname "$0")/.."
ref=${1:?usage: scripts/make_baseline.sh <git ref> [baseline|variant]}
dest=.carry/${2:-baseline}
case "$dest" in .carry/baseline | .carry/variant) ;; *) echo "the tree goes to baseline or variant" >&2; exit 2 ;; esac
rm -rf "$dest"
mkdir -p "$dest"
# the library's build inputs: the tree without bench/ and docs (bench's C++ tools and scripts kept)
git archive "$ref" CMakeLists.txt cmake src include python tests examples \
  $(git ls-tree -r --name-only "$ref" bench | grep -v '^bench/results/') | tar -x -m -C "$dest"  # -m: mtimes now, so that a warm machine's build rebuilds a changed tree
git rev-parse --short "$ref" >"$dest/COMMIT"
echo "${dest#.carry/} $(cat "$dest/COMMIT") in $dest ($(du -sh "$dest" | cut -f1))"
