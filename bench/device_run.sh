#!/usr/bin/env bash
# One device call: the steps of a plan, each under its own time limit inside a global budget,
# all output in $OUT/all.log, RESULT lines in $OUT/results.txt, the inductor cache in
# $OUT/inductor-cache.tgz (carry it back as .whl/inductor-cache.tgz to skip recompiles).
#   bash bench/device_run.sh PLAN [BUDGET_S]        (from the repo root on the GPU machine)
set -u
PLAN=${1:?plan}; BUDGET=${2:-560}
OUT=${OUT:-/tmp/bench-out}; mkdir -p "$OUT"
LOG=$OUT/all.log; RES=$OUT/results.txt
export PYTHONUNBUFFERED=1 TORCHINDUCTOR_CACHE_DIR=/tmp/inductor
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site:${PYTHONPATH:-}
fi
[ -f .whl/inductor-cache.tgz ] && mkdir -p /tmp/inductor && tar -xzf .whl/inductor-cache.tgz -C /tmp/inductor

# checkpoints of throughput runs go to RAM when /dev/shm is big enough (the worker always saves at the end)
SHM_FREE=$(df -BG --output=avail /dev/shm 2>/dev/null | tail -1 | tr -dc 0-9)
if [ "${SHM_FREE:-0}" -gt 40 ]; then FASTCK=/dev/shm/cfsdp-ck; else FASTCK=/tmp/cfsdp-ck; fi

step() {  # step NAME LIMIT_S CMD...
  local name=$1 lim=$2; shift 2
  local left=$((BUDGET - SECONDS - 15))
  [ "$lim" -gt "$left" ] && lim=$left
  if [ "$lim" -lt 30 ]; then echo "=== $name: skipped (budget)" | tee -a "$LOG"; return; fi
  echo "=== $name (limit ${lim}s, t=${SECONDS}s): $*" | tee -a "$LOG"
  local t0=$SECONDS
  timeout -k 5 "$lim" "$@" >>"$LOG" 2>&1
  local rc=$?
  echo "=== $name rc=$rc in $((SECONDS - t0))s" | tee -a "$LOG"
  grep -a '^RESULT' "$LOG" > "$RES"
}

info() {
  nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.max.sm,power.limit --format=csv
  python3 -c "import sys; sys.path.insert(0, 'bench'); import common, json; print('VERSIONS', json.dumps(common.versions()))"
  df -h / /tmp /dev/shm 2>/dev/null; free -g | head -2; nproc
}

TB="python3 bench/train_bench.py --set checkpoint.dir=$FASTCK"
case "$PLAN" in
  smoke)
    info 2>&1 | tee -a "$LOG"
    step tiny 120 $TB --preset llama-tiny --seq 128 --bs 4 --steps 10 --log-every 5 --skip 5 --tag tiny ${SMOKE_ARGS:-}
    ;;
  final)  # issue 4: both reference baselines and our configurations in one call, most wanted first
    info 2>&1 | tee -a "$LOG"
    step base_fsdp2_compile_bs8 150 python3 bench/hf_baseline.py --variant fsdp2_compile --bs 8
    step ours_bs16_nors 110 $TB --bs 16 --steps 30 --reshard false --tag ours_bs16_nors
    step base_compile_bs8 130 python3 bench/hf_baseline.py --variant compile --bs 8
    step ours_bs8_logits 110 $TB --bs 8 --steps 30 --loss logits --tag ours_bs8_logits
    step ours_bs8_nors 100 $TB --bs 8 --steps 30 --reshard false --tag ours_bs8_nors
    step ours_bs8 100 $TB --bs 8 --steps 30 --tag ours_bs8
    step ours_bs16 100 $TB --bs 16 --steps 30 --tag ours_bs16
    ;;
  ckpt)  # issue 5: DCP save / async / load vs dd on one disk, then an async save inside the real loop
    info 2>&1 | tee -a "$LOG"
    step ckpt 300 python3 bench/ckpt_bench.py --dir /tmp/cfsdp-ckpt --budget-s 290 --repeat 1 \
      --parts dd,sync,writer,async,pinned_cached,pinned_async,load
    rm -rf /tmp/cfsdp-ckpt
    step ours_bs16_nors_async_ckpt 200 python3 bench/train_bench.py --set checkpoint.dir=/tmp/cfsdp-ck-disk \
      --bs 16 --reshard false --steps 25 --ckpt-every 15 --async-ckpt --tag ours_bs16_nors_async_ckpt
    ;;
  preflight)  # issue 27.2: the GPU check through CUDA, and the pre-flight's all-reduce bus bandwidth over the GPUs
    info 2>&1 | tee -a "$LOG"
    step preflight 120 python3 -m torch.distributed.run --standalone --nproc-per-node="$(nvidia-smi -L | wc -l)" \
      bench/preflight_bench.py
    ;;
  lora)  # issue 22: a full fine-tune, LoRA and LoRA on a bf16 base of one pretrained llama-1b (random weights
    # written by save_pretrained), bf16 compute, compile: peak memory, tokens/s, MFU, checkpoint size
    info 2>&1 | tee -a "$LOG"
    step lora_base 150 python3 bench/lora_bench.py --work /tmp/lora-bench --preset llama-1b --base-only
    LB="$TB --bs 8 --steps 30 --set model.name_or_path=/tmp/lora-bench/base-llama-1b"
    step full_pretrained_bs8 130 $LB --tag full_pretrained_bs8
    step lora_bs8 130 $LB --set peft.method=lora --tag lora_bs8
    step lora_bf16_base_bs8 130 $LB --set peft.method=lora --set peft.base_dtype=bfloat16 --tag lora_bf16_base_bs8
    ;;
  fused)  # issues 4 and 37: the fused lm_head against the full logits, now that FSDP2 runs engage it
    # (7837d41): SFT on llama-1b, then DPO's per-row log-probs (128k vocabulary, bf16, a llama-1b body)
    info 2>&1 | tee -a "$LOG"
    step ours_bs8 100 $TB --bs 8 --steps 30 --tag ours_bs8
    step ours_bs8_logits 110 $TB --bs 8 --steps 30 --loss logits --tag ours_bs8_logits
    step ours_bs16 100 $TB --bs 16 --steps 30 --tag ours_bs16
    step ours_bs16_logits 110 $TB --bs 16 --steps 30 --loss logits --tag ours_bs16_logits
    step pref_1b 150 python3 bench/preference_bench.py --device cuda --dtype bfloat16 --vocab 128256 \
      --rows 8 --seq 2048 --hidden 2048 --layers 16 --repeats 4
    ;;
  *) echo "unknown plan $PLAN"; exit 2 ;;
esac
(cd /tmp/inductor 2>/dev/null && tar -czf "$OUT/inductor-cache.tgz" . 2>/dev/null)
ls -la "$OUT"
echo "==== RESULTS"
cat "$RES" 2>/dev/null
