#!/usr/bin/env bash
# One H200 call: build with all cores, CPU tests, SASS/resource checks, GPU tests, benchmark.
# Logs go to $OUT (the device tool brings them back); a short summary is printed last.
#   scripts/h200_check.sh [tests|quick|full|bwd|cp|ab|bench|timeline|stage|dist]
#     quick (default): tests + the quick forward and backward tables; full: tests + both full tables;
#     bwd: tests + the full backward table; tests: tests only; cp: tests + the cost-model fits written
#     into src/plan/ (bench/fit_cost_model.py: each direction's split scan, then the fit; the records
#     copied to $OUT), a rebuild and ctest with them, the auto-CP sweep (full;
#     CP_SWEEP_ARGS=--quick for the quick one); ab: tests + the A/B
#     timing of the fused forward kernels
#     (bench/fused_kernel_ab.py); bench: build + the benchmark only (python -m flashgdn.bench
#     $BENCH_ARGS: one CSV, plots and log, and the anchors' JIT caches as jit_*.tar.gz); timeline: a FLASHGDN_TIMELINE build in build-timeline and
#     bench/timeline.py (phase cycles of the warp-specialized forwards); stage: install the anchor wheels staged so far and stop
#     (one call per .whl/<group>, bench/notes.md "Anchors"); dist (a multi-GPU kind): build, the
#     distributed tests (gloo on one GPU, NCCL one GPU per rank) and bench/distributed_scaling.py
#   env: PYTEST_ARGS (default tests/gpu), PYTEST_TIMEOUT (seconds, default 420), PYTEST_SMOKE (a
#   first pytest run bounded by 120 s, default "tests/gpu/test_forward.py -k kernels"; empty: none;
#   a hang there stops the call), BENCH_TIMEOUT (seconds per benchmark), PROFILE=1 (ncu on the fused forward) or
#   PROFILE="regex config...;..." (ncu --set full on the first kernel matching regex in
#   bench/profile_forward.py config, e.g. "chunk_inverse 4x8192 16 32;fused_forward_ws 4x8192 16 32 ws";
#   prints the details and the SASS lines where the warps stall most, bench/ncu_source_top.py),
#   BENCH_ARGS (extra flashgdn.bench arguments, e.g. --filter hv=32 or --anchors fla),
#   BWD_BENCH_ARGS (extra arguments of the backward table only, e.g. --filter hv=16|8),
#   AB_ARGS (ab: extra bench/fused_kernel_ab.py arguments, e.g. "--kernels rs,inv"), KERNEL_TIMES=0 (ab: no ncu
#   kernel times after the A/B) or "config;config..." (bench/profile_forward.py configurations instead of the default ones),
#   FLASHGDN_COMMIT (the commit measured: the device copy has no .git), SKIP_TESTS=1 (no pytest and
#   examples: for a second call on a warm machine after a tests call), CP_FITS (cp: the cost models
#   to refit, default "fwd bwd"), FIT_ARGS (cp: extra fit_cost_model.py arguments, e.g.
#   "--ranking-weight 100"), CP_SWEEPS (cp: the sweeps to run after the refit, default "fwd", the
#   full auto/off sweep; "splits" / "bwd": the forward's / backward's split scans again, which the
#   fits have just timed: their logs give the refit planner's choice against the best cut), TIMELINE=1 (every
#   mode but stage, dist and bench: the timeline mode's build and bench/timeline.py at the end, saving a call;
#   TIMELINE_ARGS: its arguments, e.g. --backward for the gradient pass's stages),
#   EXTRA (every mode but stage, dist and bench: a command run on the build before the profile and timeline,
#   its log extra.log, e.g. "python3 bench/kernel_breakdown.py"),
#   BASELINE=1 (every mode but stage, dist and bench; needs .carry/baseline from scripts/make_baseline.sh
#   <ref>, carried): that tree's library built in build-baseline, then BASELINE_CMD (default: the
#   kernel breakdown of five CP and short rows) run with the baseline's library and this tree's (each
#   through its own tree's Python package),
#   alternating, twice each, the order rotated each round (AB_ROUNDS=N: N times; ab_baseline.log,
#   ab_candidate.log: one machine, no spread between machines; bench/ab_compare.py sets their
#   kernel_breakdown rows side by side, ab_compare.txt); BASELINE_TABLES=1 also measures the baseline's forward and backward tables
#   (FLASHGDN_COMMIT=baseline_<its sha>); with BASELINE, VARIANT=1 (needs .carry/variant from
#   scripts/make_baseline.sh <ref> variant, carried too) builds a second candidate in build-variant,
#   runs its own VARIANT_PYTEST (default tests/gpu/test_forward.py; its Python package and library) and
#   times it in the same rounds (ab_variant.log): two candidates judged in one call
# Anchor wheels carried under .whl/ (scripts/fetch_anchors.sh) are installed first
# (scripts/install_anchors.sh) and put on PYTHONPATH.
set -uo pipefail
cd "$(dirname "$0")/.."
MODE=${1:-quick}
OUT=${OUT:-/tmp/flashgdn_out}
mkdir -p "$OUT"
summary=()
note() { summary+=("$*"); echo "== $*"; }
# The device tool brings back at most 8 files: past 8, everything but the CSV/JSON records goes
# into one logs.tar.gz (unpack with tar xzf).
pack_logs() {
  local rest
  rest=$(cd "$OUT" && ls | grep -vE '\.(csv|json)$|^logs\.tar\.gz$|^jit_.*\.tar\.gz$')
  if [ "$(ls "$OUT" | wc -l)" -gt 8 ] && [ -n "$rest" ]; then
    (cd "$OUT" && tar czf logs.tar.gz $rest && rm -rf $rest)
  fi
}
trap pack_logs EXIT

if [ -d .whl ]; then
  scripts/install_anchors.sh && [ -f "${ANCHOR_SITE:-/tmp/site}/env.sh" ] && . "${ANCHOR_SITE:-/tmp/site}/env.sh"
fi
# The anchors' JIT caches (TileLang's kernels for FlashQLA, Triton's for FLA): a fresh machine compiles
# them inside the benchmark's warm-up calls (session 36: FlashQLA's 33 TileLang kernels took most of a
# 530 s forward call). The bench mode returns them as $OUT/jit_<name>.tar.gz (at most 15 MiB each, the
# device tool's limit a file); copied here under .carry/jit_cache/ and carried, they are unpacked first.
JIT_CACHES="tilelang:.tilelang/cache triton:.triton/cache"
for cache in .carry/jit_cache/jit_*.tar.gz; do
  [ -f "$cache" ] && tar xzf "$cache" -C "$HOME" && echo "JIT cache restored: $cache"
done
save_jit_caches() {
  local entry name dir bytes
  for entry in $JIT_CACHES; do
    name=${entry%%:*} dir=${entry#*:}
    [ -d "$HOME/$dir" ] || continue
    tar czf "$OUT/jit_$name.tar.gz" -C "$HOME" "$dir"
    bytes=$(stat -c %s "$OUT/jit_$name.tar.gz")
    if [ "$bytes" -gt $((15 * 1024 * 1024)) ]; then
      rm -f "$OUT/jit_$name.tar.gz"
      note "JIT cache $name: $((bytes / 1024 / 1024)) MiB packed, over the 15 MiB a returned file may hold: not returned"
    else
      note "JIT cache $name: $((bytes / 1024)) KiB packed in jit_$name.tar.gz (copy to .carry/jit_cache/ and carry it)"
    fi
  done
}
[ "$MODE" = stage ] && exit 0

kernel_times() {  # ncu time of every kernel of one forward call per configuration (bench/profile_forward.py);
  # every configuration's summary also goes to kernel_times.txt (the raw ncu log of the last one: kernel_times.log)
  for config in "$@"; do
    timeout 180 ncu --clock-control none --kernel-name-base demangled -k regex:flashgdn \
      --metrics gpu__time_duration.sum python3 bench/profile_forward.py $config >"$OUT/kernel_times.log" 2>&1
    {
      echo "kernel times, $config:"
      grep -E "^  [a-z].*\(|gpu__time_duration" "$OUT/kernel_times.log" | sed -E 's/<.*//; s/ +/ /g' | paste - - | cut -c1-150 | head -12
    } | tee -a "$OUT/kernel_times.txt"
  done
}

profile() {  # ncu --set full on one kernel per entry of PROFILE ("regex config ...;" ...)
  [ -n "${PROFILE:-}" ] || return 0
  IFS=';' read -ra profiles <<<"$([ "$PROFILE" = 1 ] && echo "fused_forward 1x8192 16 32" || echo "$PROFILE")"
  for entry in "${profiles[@]}"; do
    read -r regex config <<<"$entry"
    name=$(echo "$regex $config" | tr -c 'A-Za-z0-9' '_' | sed 's/_*$//')
    timeout 300 ncu --clock-control none --set full -k "regex:$regex" -c 1 -o "$OUT/$name" \
      python3 bench/profile_forward.py $config >"$OUT/ncu_$name.log" 2>&1
    note "ncu $regex ($config) rc=$?"
    ncu --import "$OUT/$name.ncu-rep" --page details >"$OUT/ncu_$name.txt" 2>&1
    grep -E "Duration|SM Frequency|Registers Per|Achieved Occupancy|Warp Cycles Per Issued|Issue Slots|Compute \(SM\) Throughput|Memory Throughput|No Eligible|stall" \
      "$OUT/ncu_$name.txt" | head -18
    # where the warps wait, per SASS instruction (the source page's warp-state samples)
    ncu --import "$OUT/$name.ncu-rep" --page source --csv --print-source sass >"$OUT/ncu_${name}_source.csv" 2>&1
    python3 bench/ncu_source_top.py "$OUT/ncu_${name}_source.csv" --top 20 --regions >"$OUT/ncu_${name}_stalls.txt" 2>&1
    head -70 "$OUT/ncu_${name}_stalls.txt"
    gzip -f "$OUT/ncu_${name}_source.csv"  # kept (per-line samples and executed counts) for a later read
    rm -f "$OUT/$name.ncu-rep"
  done
}

timeline() {  # a measurement build (FLASHGDN_TIMELINE, build-timeline) and bench/timeline.py
  local start rc
  start=$(date +%s)
  cmake -S . -B build-timeline -G Ninja -DCMAKE_BUILD_TYPE=Release -DFLASHGDN_TIMELINE=ON -DFLASHGDN_BUILD_TESTS=OFF \
    >"$OUT/build_timeline.log" 2>&1 && cmake --build build-timeline -j "$(nproc)" --target flashgdn_c >>"$OUT/build_timeline.log" 2>&1
  rc=$?
  note "timeline build rc=$rc in $(( $(date +%s) - start )) s; spill warnings (the marks' cost): $(grep -cE "Registers are spilled" "$OUT/build_timeline.log")"
  if [ $rc -ne 0 ]; then grep -E "error|Error" "$OUT/build_timeline.log" | head -30; return 1; fi
  FLASHGDN_LIBRARY=$PWD/build-timeline/libflashgdn_c.so PYTHONPATH=$PWD/python timeout 300 python3 bench/timeline.py \
    --out "$OUT" ${TIMELINE_ARGS:-} >"$OUT/timeline.log" 2>&1
  rc=$?
  note "timeline rc=$rc"
  tail -n 12 "$OUT/timeline.log"
  return $rc
}

if [ "$MODE" = timeline ]; then  # the timeline only
  timeline
  rc=$?
  echo "================ summary"
  printf '%s\n' "${summary[@]}"
  exit $rc
fi

# NCCL for flashgdn_distributed (cmake/cuda.cmake): the CUDA toolkit's, else torch's nvidia-nccl wheel
if [ -z "${NCCL_HOME:-}" ]; then
  NCCL_HOME=$(python3 -c "import nvidia.nccl as n; print(list(n.__path__)[0])" 2>/dev/null) && export NCCL_HOME
fi

start=$(date +%s)
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DFLASHGDN_PTXAS_VERBOSE=ON >"$OUT/build.log" 2>&1 &&
  cmake --build build -j "$(nproc)" >>"$OUT/build.log" 2>&1
rc=$?
note "build rc=$rc in $(( $(date +%s) - start )) s"
if [ $rc -ne 0 ]; then grep -E "error|Error" "$OUT/build.log" | head -30; printf '%s\n' "${summary[@]}"; exit 1; fi
grep -E "spill|Local memory" "$OUT/build.log" | sort -u | head -5
spills=$(grep -cE "Registers are spilled|Local memory used" "$OUT/build.log")
note "ptxas spill/local-memory warnings: $spills"
# C7515: ptxas serialised a kernel's wgmmas (an accumulator written by other code while in flight)
note "ptxas serialised-wgmma reports (C7515): $(grep -c "C7515" "$OUT/build.log")"

export FLASHGDN_LIBRARY=$PWD/build/libflashgdn_c.so
export PYTHONPATH=$PWD/python${PYTHONPATH:+:$PYTHONPATH}
export PYTHONUNBUFFERED=1

if [ "$MODE" = bench ]; then
  timeout "${BENCH_TIMEOUT:-420}" python3 -m flashgdn.bench ${BENCH_ARGS:-} --out "$OUT" >"$OUT/bench.log" 2>&1
  note "benchmark rc=$? (124: stopped by BENCH_TIMEOUT, rows so far kept)"
  save_jit_caches
  tail -n 40 "$OUT/bench.log"
  echo "================ summary"
  printf '%s\n' "${summary[@]}"
  exit 0
fi

if [ "$MODE" = dist ]; then
  nvidia-smi -L
  # the sharded runs (gloo on one GPU, NCCL one GPU per rank) and the shard phases on one GPU (test_cp)
  timeout "${PYTEST_TIMEOUT:-420}" python3 -m pytest tests/gpu/test_distributed.py tests/gpu/test_cp.py -k shard \
    -q -rfEs -s >"$OUT/pytest_dist.log" 2>&1
  note "distributed tests rc=$?: $(tail -1 "$OUT/pytest_dist.log")"
  ctest --test-dir build -R distributed_nccl -V >"$OUT/ctest_nccl.log" 2>&1
  note "C++ NCCL entry point (gpu_unit.distributed_nccl) rc=$?: $(grep -cE "GPUs, cuts" "$OUT/ctest_nccl.log") cases, $(grep -E "GPU:| OK$|FAILED|No tests" "$OUT/ctest_nccl.log" | tr '\n' ' ')"
  grep -E "GPUs, cuts" "$OUT/ctest_nccl.log" | cut -c1-200 | head -12
  grep -E "ranks on|shard maps|SKIPPED|FAILED|Error" "$OUT/pytest_dist.log" | head -30
  timeout "${BENCH_TIMEOUT:-420}" python3 bench/distributed_scaling.py --out "$OUT" >"$OUT/scaling.log" 2>&1
  note "distributed scaling rc=$?"
  grep -E "GPU" "$OUT/scaling.log" | head -24
  profile
  echo "================ summary"
  printf '%s\n' "${summary[@]}"
  exit 0
fi

ctest --test-dir build -j "$(nproc)" >"$OUT/ctest.log" 2>&1 ||
  ctest --test-dir build --rerun-failed --output-on-failure 2>&1 | tail -n 40 | tee -a "$OUT/ctest.log"
note "ctest: $(grep -E 'tests passed|tests failed' "$OUT/ctest.log" | head -1)"

cuobjdump --dump-sass build/libflashgdn_c.so >"$OUT/sass.txt" 2>&1
note "SASS: HMMA $(grep -c HMMA "$OUT/sass.txt"), HGMMA $(grep -c HGMMA "$OUT/sass.txt") (waits $(grep -c WARPGROUP.DEPBAR "$OUT/sass.txt"): one per HGMMA means serialised), MUFU.EX2 $(grep -c MUFU.EX2 "$OUT/sass.txt"), LDL/STL $(grep -cE "LDL|STL" "$OUT/sass.txt")"

if [ "$MODE" = cp ]; then  # refit first: the GPU tests and the sweeps run with the fitted models
  for direction in ${CP_FITS-fwd bwd}; do
    timeout "${BENCH_TIMEOUT:-420}" python3 bench/fit_cost_model.py --direction "$direction" --write-header \
      ${FIT_ARGS:-} >"$OUT/fit_$direction.log" 2>&1
    note "cost-model fit ($direction) rc=$?"
    grep -vE "\(1\.000 of best\)" "$OUT/fit_$direction.log" | tail -n 30  # choices off the best cut, coefficients
  done
  cp bench/results/*cost_model*"${FLASHGDN_COMMIT:-}"*.json bench/results/*cp_sweep_*_splits_"${FLASHGDN_COMMIT:-}"*.csv \
    src/plan/cost_model.h src/plan/cost_model.cpp "$OUT"/ 2>/dev/null
  cmake --build build -j "$(nproc)" >>"$OUT/build.log" 2>&1
  note "rebuild with the fitted model rc=$?"
  ctest --test-dir build -j "$(nproc)" >"$OUT/ctest_fitted.log" 2>&1
  note "ctest with the fitted model: $(grep -E 'tests passed|tests failed' "$OUT/ctest_fitted.log")"
  grep -E "\*\*\*Failed|Failed  " "$OUT/ctest_fitted.log" | head -5
fi

# Each failed or erroring test into the summary with its seed (tests/gpu/conftest.py prints "[seed N]
# name" as a test starts; FLASHGDN_TEST_SEED=N replays it): the summary is what a call's reply keeps
# when its logs are lost (session 32's one failure was known by count only).
failed_with_seeds() {
  local id name seed
  while read -r _ id _; do  # (not a pipeline's subshell: note appends to the summary)
    name=${id##*::}
    seed=$(grep -F "] $name" "$1" | grep -oE "\[seed [0-9]+\]" | tail -1)
    note "  failed: ${id} ${seed:-[seed not printed]}"
  done < <(grep -E "^(FAILED|ERROR) " "$1" | head -20)
}

if [ -z "${SKIP_TESTS:-}" ] && [ -n "${PYTEST_SMOKE-tests/gpu/test_forward.py -k kernels}" ]; then
  # a short first run of the newest kernels: a hang costs 120 s, not the whole suite's timeout
  eval "smoke_args=(${PYTEST_SMOKE-tests/gpu/test_forward.py -k kernels})"  # shell quoting kept: -k 'a and b'
  timeout 120 python3 -m pytest "${smoke_args[@]}" -q -rfE -s >"$OUT/pytest_smoke.log" 2>&1
  smoke=$?
  note "pytest smoke rc=$smoke (124: hung): $(tail -1 "$OUT/pytest_smoke.log")"
  failed_with_seeds "$OUT/pytest_smoke.log"
  if [ $smoke -eq 124 ]; then  # a kernel hangs: the benchmarks would hang too
    echo "================ summary"
    printf '%s\n' "${summary[@]}"
    exit 1
  fi
fi
if [ -z "${SKIP_TESTS:-}" ]; then
  eval "pytest_args=(${PYTEST_ARGS:-tests/gpu})"  # shell quoting kept (session 21: -k '...' was split into words)
  timeout "${PYTEST_TIMEOUT:-420}" python3 -m pytest "${pytest_args[@]}" -q -rfE -s \
    --junitxml="$OUT/pytest.xml" >"$OUT/pytest.log" 2>&1
  note "pytest rc=$? (124: stopped by PYTEST_TIMEOUT): $(tail -1 "$OUT/pytest.log")"
  failed_with_seeds "$OUT/pytest.log"

  timeout 300 python3 examples/train.py >"$OUT/train.log" 2>&1
  note "examples/train.py rc=$?: $(tail -1 "$OUT/train.log")"
  timeout 120 python3 examples/serving.py >"$OUT/serving.log" 2>&1
  note "examples/serving.py rc=$?: $(tail -1 "$OUT/serving.log")"
fi

if [ "$MODE" = cp ]; then
  kernel_times "1x32768 2 8 cp"
  if [[ " ${CP_SWEEPS-fwd} " == *" fwd "* ]]; then
    timeout "${BENCH_TIMEOUT:-420}" python3 bench/cp_sweep.py ${CP_SWEEP_ARGS:-} --out "$OUT" >"$OUT/sweep.log" 2>&1
    note "cp sweep rc=$?: $(tail -1 "$OUT/sweep.log")"
    grep -E "ratio 1\.0[3-9]|ratio 1\.[1-9]" "$OUT/sweep.log" | head -10
  fi
  if [[ " ${CP_SWEEPS-fwd} " == *" splits "* ]]; then
    timeout "${BENCH_TIMEOUT:-420}" python3 bench/cp_sweep.py --splits --out "$OUT" >"$OUT/sweep_splits.log" 2>&1
    note "forward split scan rc=$?: $(tail -1 "$OUT/sweep_splits.log")"
    grep "^fwd" "$OUT/sweep_splits.log"
  fi
  if [[ " ${CP_SWEEPS-fwd} " == *" bwd "* ]]; then
    timeout "${BENCH_TIMEOUT:-420}" python3 bench/cp_sweep.py --direction bwd --out "$OUT" >"$OUT/sweep_bwd.log" 2>&1
    note "backward cp sweep rc=$?"
    grep "^bwd" "$OUT/sweep_bwd.log"
  fi
fi

if [ "$MODE" = ab ]; then
  timeout "${BENCH_TIMEOUT:-420}" python3 bench/fused_kernel_ab.py ${AB_ARGS:-} --out "$OUT" >"$OUT/ab.log" 2>&1
  note "fused kernel A/B rc=$?"
  tail -n 30 "$OUT/ab.log"
  if [ "${KERNEL_TIMES:-1}" = 1 ]; then
    kernel_times "4x8192 16 32" "4x8192 16 32 ws" "4x8192 16 32 rs" "1x32768 2 8" "1x32768 2 8 cp" "1x32768 2 8 cp ws" \
      "1x32768 2 8 cp rs"
  elif [ "${KERNEL_TIMES}" != 0 ]; then
    IFS=';' read -ra configs <<<"$KERNEL_TIMES"
    kernel_times "${configs[@]}"
  fi
fi

quick_flag=$([ "$MODE" = full ] || echo --quick)
if [ "$MODE" = quick ] || [ "$MODE" = full ]; then
  timeout "${BENCH_TIMEOUT:-420}" python3 -m flashgdn.bench --direction fwd $quick_flag --no-plots ${BENCH_ARGS:-} \
    --out "$OUT" >"$OUT/bench.log" 2>&1
  note "forward bench rc=$? (124: stopped by BENCH_TIMEOUT, rows so far kept)"
  tail -n 25 "$OUT/bench.log"
fi
if [ "$MODE" != tests ] && [ "$MODE" != cp ] && [ "$MODE" != ab ]; then
  timeout "${BENCH_TIMEOUT:-420}" python3 -m flashgdn.bench --direction bwd $([ "$MODE" = bwd ] || echo $quick_flag) \
    --no-plots ${BENCH_ARGS:-} ${BWD_BENCH_ARGS:-} --out "$OUT" >"$OUT/bench_bwd.log" 2>&1
  note "backward bench rc=$? (124: stopped by BENCH_TIMEOUT, rows so far kept)"
  tail -n 25 "$OUT/bench_bwd.log"
fi

if [ -n "${EXTRA:-}" ]; then  # EXTRA="command": one more measurement on this build (e.g. bench/kernel_breakdown.py)
  timeout "${BENCH_TIMEOUT:-420}" bash -c "$EXTRA" >"$OUT/extra.log" 2>&1
  note "extra ($EXTRA) rc=$?"
  tail -n 40 "$OUT/extra.log"
fi

build_tree() {  # build_tree <tree> <build dir> <label>: a carried tree's library (no tests)
  local start rc
  start=$(date +%s)
  cmake -S "$1" -B "$2" -G Ninja -DCMAKE_BUILD_TYPE=Release -DFLASHGDN_BUILD_TESTS=OFF >"$OUT/build_$3.log" 2>&1 &&
    cmake --build "$2" -j "$(nproc)" --target flashgdn_c >>"$OUT/build_$3.log" 2>&1
  rc=$?
  note "$3 $(cat "$1/COMMIT" 2>/dev/null || echo unknown) build rc=$rc in $(( $(date +%s) - start )) s"
  return $rc
}

if [ -n "${BASELINE:-}" ]; then  # A/B against .carry/baseline's library on this machine
  baseline_sha=$(cat .carry/baseline/COMMIT 2>/dev/null || echo unknown)
  build_tree .carry/baseline build-baseline baseline
  rc=$?
  variant_sha=""
  if [ -n "${VARIANT:-}" ] && build_tree .carry/variant build-variant variant; then
    variant_sha=$(cat .carry/variant/COMMIT)
    # the variant's own GPU tests, with its Python package and library
    eval "variant_pytest=(${VARIANT_PYTEST:-tests/gpu/test_forward.py})"
    (cd .carry/variant && FLASHGDN_LIBRARY=$PWD/../../build-variant/libflashgdn_c.so PYTHONPATH=$PWD/python \
      timeout "${PYTEST_TIMEOUT:-420}" python3 -m pytest "${variant_pytest[@]}" -q -rfE -s) >"$OUT/pytest_variant.log" 2>&1
    note "variant $variant_sha pytest rc=$?: $(tail -1 "$OUT/pytest_variant.log")"
    failed_with_seeds "$OUT/pytest_variant.log"
  fi
  if [ $rc -eq 0 ]; then
    ab_cmd=${BASELINE_CMD:-python3 bench/kernel_breakdown.py 1x2048:2:8 1x8192:2:8 1x8192:2:4:bwd 1x32768:2:8 8x1024:2:8}
    : >"$OUT/ab_baseline.log"
    : >"$OUT/ab_candidate.log"
    [ -n "$variant_sha" ] && : >"$OUT/ab_variant.log"
    # each library with its own tree's Python package (the ctypes mirrors must match its structs:
    # flashgdn_struct_sizes), the working tree's scripts and anchors
    own_python() { echo "$PWD/$1/python${PYTHONPATH#"$PWD/python"}"; }
    ab_run() {  # one tree's run of the A/B command: baseline and variant through their own library and package
      local tree=$1 sha
      case $tree in baseline) sha=$baseline_sha ;; candidate) sha=${FLASHGDN_COMMIT:-} ;; variant) sha=$variant_sha ;; esac
      if [ "$tree" = candidate ]; then
        timeout "${BENCH_TIMEOUT:-420}" bash -c "$ab_cmd" >>"$OUT/ab_candidate.log" 2>&1
      else
        FLASHGDN_LIBRARY=$PWD/build-$tree/libflashgdn_c.so PYTHONPATH=$(own_python ".carry/$tree") \
          timeout "${BENCH_TIMEOUT:-420}" bash -c "$ab_cmd" >>"$OUT/ab_$tree.log" 2>&1
      fi
      note "A/B round $round, $tree $sha rc=$?"
    }
    trees=(baseline candidate ${variant_sha:+variant})
    # the order rotates each round (round 1: baseline first), so that no tree always runs first or
    # last: whole calls of equal kernels differ up to ~1% between processes (bench/notes.md, session 33)
    for round in $(seq "${AB_ROUNDS:-2}"); do
      for i in "${!trees[@]}"; do
        ab_run "${trees[$(((i + round - 1) % ${#trees[@]}))]}"
      done
    done
    echo "== baseline $baseline_sha"; tail -n 30 "$OUT/ab_baseline.log"
    echo "== candidate ${FLASHGDN_COMMIT:-}"; tail -n 30 "$OUT/ab_candidate.log"
    [ -n "$variant_sha" ] && { echo "== variant $variant_sha"; tail -n 30 "$OUT/ab_variant.log"; }
    # the kernel_breakdown rows side by side, last round, changes against the baseline (ab_compare.txt)
    python3 bench/ab_compare.py "$OUT/ab_baseline.log" "$OUT/ab_candidate.log" ${variant_sha:+"$OUT/ab_variant.log"} \
      >"$OUT/ab_compare.txt" 2>&1 && { echo "== A/B, last round"; cat "$OUT/ab_compare.txt"; }
    if [ -n "${BASELINE_TABLES:-}" ]; then
      for direction in fwd bwd; do
        FLASHGDN_LIBRARY=$PWD/build-baseline/libflashgdn_c.so PYTHONPATH=$(own_python .carry/baseline) \
          FLASHGDN_COMMIT=baseline_$baseline_sha timeout "${BENCH_TIMEOUT:-420}" python3 -m flashgdn.bench --direction $direction --no-plots ${BENCH_ARGS:-} \
          --out "$OUT" >"$OUT/bench_baseline_$direction.log" 2>&1
        note "baseline $direction bench rc=$?"
      done
    fi
  fi
fi
profile
[ -n "${TIMELINE:-}" ] && timeline  # TIMELINE=1: the timeline too, in the same call
echo "================ summary"
printf '%s\n' "${summary[@]}"
