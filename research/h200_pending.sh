#!/usr/bin/env bash
# The H200 measurements the open issues still wait for, in stages that each fit one device call
# (the device tool allows 600 s per command and 30 min per session; a cold start costs ~2 min).
# Run from the repository root on the device, after installing the service's wheels:
#
#   python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
#       --target /tmp/site .whl/*.whl >/dev/null 2>&1
#   export PYTHONPATH=/tmp/site:$PWD/service:$PWD/client
#   bash research/h200_pending.sh STAGE        # results land in $OUT (default: ./h200-out)
#
# Stages (times are estimates from earlier runs; each fits one 600 s call):
#   correct   the work whose numbers do not depend on timing, three processes side by side on
#             the one GPU: the GPU tests except the timing ones (tests/gpu/test_sandbox_gpu.py
#             runs artifact code through the sandboxed impl runner, #31), #29's false-failure
#             table (h200 x 3 seeds: ~360 s; expected 0 false failures for torch, torch.compile,
#             kassay, Liger, CCE) and `kassay selftest --device cuda` (#29: expected "detected
#             27/27 mutants, false failures 0/N correct cases (fairness corpus: 0/n)", kassay's
#             bf16 kernels judged there) (~550 s)
#   timed     alone on the GPU: the timing GPU tests (device time vs the profiler, the gate's
#             slowed runs) and #15's bench/ci_latency.py (~300 s)
#   engine    alone on the GPU: the README's engine table from examples/h200.yaml (~150 s)
#   flce      the memory-speed curve of both schedules and every peer, both shapes (~300 s)
#   vocab     #40: bench/flce_profile.py (where the vocabulary schedule's time goes,
#             ~60 s), the FLCE GPU tests of both schedules (~120 s), then the curve (`flce`)
#   checks    #40: the first half of `vocab` (the profile and the FLCE GPU tests), then
#             bench/flce_sweep.py (the vocabulary schedule's knobs one at a time, ~100 s)
#   vocab2    #40, after `vocab`: the options A/B (bench/flce.py --options) and `kassay
#             selftest --device cuda` (~300 s)
#   gputests  the whole GPU test suite, alone (~400 s)
#   sandbox   #31's CUDA IPC transport (tests/gpu/test_cuda_ipc_gpu.py), the sandboxed Triton
#             artifact (test_sandbox_gpu.py) and #30's op plugin on CUDA (test_op_plugin_gpu.py)
#             (~150 s)
#   codejobs  #42: bench/code_jobs.py on the GPU worker (the TE seed grid with built-ins, then
#             with two uploaded modules in one sandboxed runner: expected code <= 2 x builtin +
#             one runner start, <= 15 s for the 66 cases), then the sandbox's GPU tests (~200 s)
#   convergence  #33's default convergence job, examples/convergence.yaml (600 steps, not yet
#             run at that length: expected ~300 s; kassay, torch.compile, Liger,
#             m_bf16_chunk_accum and m_out_dtype_accum passed; m_zeros, m_grad_softmax_lost and
#             m_stale_lse failed; m_label_smoothing_weight inconclusive. At 1000 steps,
#             2026-12-05: 484 s, those verdicts)
set -uo pipefail
stage=${1:?usage: h200_pending.sh correct|timed|engine|flce|checks|vocab|vocab2|gputests|sandbox|codejobs|convergence}
out=${OUT:-./h200-out}
mkdir -p "$out"
day=$(date +%F)
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1 | grep -oE 'H[0-9]+' | tr 'H' 'h')
gpu=${gpu:-gpu}
export PYTORCH_CUDA_ALLOC_CONF=${PYTORCH_CUDA_ALLOC_CONF:-expandable_segments:True}
nvidia-smi --query-gpu=name,driver_version,clocks.sm,power.draw,temperature.gpu --format=csv \
    >"$out/gpu-$stage.csv" 2>&1

step() {  # step NAME SECONDS CMD...: run with a time limit, keep its log, say how it ended
    local name=$1 limit=$2
    shift 2
    local t0=$SECONDS
    timeout "$limit" "$@" >"$out/$name.log" 2>&1
    local rc=$?
    echo "== $name: rc=$rc in $((SECONDS - t0)) s"
    tail -n 15 "$out/$name.log"
}

flce_checks() {  # #40: where the vocabulary schedule's time goes, then the FLCE GPU tests
    step vocab-profile 150 python3 bench/flce_profile.py --out "$out/flce-vocab-profile-$gpu-$day.json"
    step gpu-flce 200 python3 -m pytest -q -m gpu -p no:cacheprovider \
        tests/gpu/test_kernel_flce_vocab_gpu.py tests/gpu/test_kernel_flce_gpu.py \
        tests/gpu/test_kernel_flce_options_gpu.py
}

timing_tests=(tests/gpu/test_timing_gpu.py tests/gpu/test_compare_gate_gpu.py)

case $stage in
correct)
    ignore=()
    for t in "${timing_tests[@]}"; do ignore+=(--ignore "$t"); done
    step gpu-correct 540 python3 -m pytest -q -m gpu tests/gpu "${ignore[@]}" \
        -p no:cacheprovider &
    (
        # smoke x 3 seeds was measured on 2026-12-03 (0 false failures); h200 then fit 2 seeds
        step verdicts-h200 520 python3 bench/verdicts.py --device cuda --skip wall mutants \
            --spec examples/h200.yaml --seeds 3 --out "$out/verdicts-h200-$day.json"
    ) &
    (
        step selftest 500 python3 -m kassay.cli selftest --device cuda
    ) &
    wait
    ;;
timed)
    step gpu-timed 200 python3 -m pytest -q -m gpu "${timing_tests[@]}" -p no:cacheprovider
    step ci-latency 300 python3 bench/ci_latency.py --out "$out/ci-latency-h200-$day.json" \
        --log "$out/ci-latency-serve.log"
    ;;
engine)
    # all regimes and the coverage points of the flce suites run too: ~120 s (23 s in 2026-12-02,
    # before default coverage)
    step h200-engine 400 python3 -m kassay.cli run examples/h200.yaml --device cuda --quiet \
        --json "$out/h200-engine-$day.json" --markdown "$out/h200-engine-$day.md"
    ;;
flce)
    step flce-budgets 340 python3 bench/flce.py --budgets --out "$out/flce-budgets-$gpu-$day.json"
    ;;
checks)
    flce_checks
    step flce-sweep 150 python3 bench/flce_sweep.py --out "$out/flce-sweep-$gpu-$day.json"
    ;;
vocab)
    flce_checks
    step flce-budgets 340 python3 bench/flce.py --budgets --out "$out/flce-budgets-$gpu-$day.json"
    ;;
vocab2)
    step flce-options 100 python3 bench/flce.py --options --out "$out/flce-options-$gpu-$day.json"
    step selftest 240 python3 -m kassay.cli selftest --device cuda
    ;;
sandbox)
    step gpu-sandbox 500 python3 -m pytest -q -m gpu -rA -p no:cacheprovider \
        tests/gpu/test_cuda_ipc_gpu.py tests/gpu/test_sandbox_gpu.py tests/gpu/test_op_plugin_gpu.py
    ;;
codejobs)
    step code-jobs 300 python3 bench/code_jobs.py --device cuda \
        --out "$out/code-jobs-h200-$day.json"
    step gpu-sandbox 280 python3 -m pytest -q -m gpu -rA -p no:cacheprovider \
        tests/gpu/test_cuda_ipc_gpu.py tests/gpu/test_sandbox_gpu.py
    ;;
convergence)
    export KASSAY_ENABLE_MUTANTS=true
    step convergence 580 python3 -m kassay.cli run \
        examples/convergence.yaml --device cuda --json "$out/convergence-h200-$day.json" \
        --markdown "$out/convergence-h200-$day.md"
    ;;
gputests)
    step gpu-tests 570 python3 -m pytest -q -m gpu tests/gpu -p no:cacheprovider
    ;;
*)
    echo "unknown stage: $stage" >&2
    exit 2
    ;;
esac
