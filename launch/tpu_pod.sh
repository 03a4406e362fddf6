#!/usr/bin/env bash
# Runs maelm_jax on every worker of a Cloud TPU VM (pod slice) through gcloud.
#
#   launch/tpu_pod.sh --tpu=NAME --zone=ZONE [--project=PROJECT] [--topology=T]
#                     [--skip_plan] [--skip_copy] [--skip_install] [--detach]
#                     [--no_jemalloc] [--dry_run] -- <arguments of maelm_jax.main>
#
# Step 0, on this machine, before any worker is touched: the plan
# (python -m maelm_jax.plan) compiles the run's train step for the pod's chips
# and refuses a config that does not fit their memory (exit 3, with the knobs
# that would). The topology is --topology (v5e:4x4, or an accelerator type such
# as v5litepod-16), else the TPU's accelerator type from `gcloud compute tpus
# tpu-vm describe`. The plan needs libtpu here (pip install -e '.[tpu]', Linux
# x86-64); it runs with $MAELM_PLAN_PYTHON, else this repository's .venv, else
# python3. --skip_plan leaves it out (a fine-tuning run whose init_from is only on
# the workers' shared disk needs it); --dry_run runs the plan here (minutes of
# compiles) and prints it.
#
# Steps, each a gcloud command over all workers (--worker=all, in parallel):
#   1. copy this repository (without .venv, workdirs, .git, caches) to ~/maelm-jax
#      on every worker: a clean local copy, then `tpu-vm scp --recurse`;
#   2. install it into the venv ~/maelm-venv: `pip install -e '.[gcs]' "jax[tpu]"`, and
#      jemalloc (`apt-get install libjemalloc2`, skipped where it is);
#   3. run `python -m maelm_jax.main <arguments>` in ~/maelm-jax on every worker
#      with MAELM_DISTRIBUTED=tpu, so that maelm_jax/run/distributed.py calls
#      jax.distributed.initialize() with no arguments and JAX takes worker count,
#      worker id and coordinator from the TPU metadata; jemalloc preloaded
#      where installed (launch/jemalloc.sh: under glibc's malloc a run's memory
#      creeps up over hours of checkpointing).
# --no_jemalloc: neither installs nor preloads it (glibc's malloc).
# --skip_copy / --skip_install leave out steps 1 / 2 (a relaunch of the same code).
# --detach starts the run under nohup (log: ~/maelm-jax.log on each worker) and
# returns, so a dropped ssh connection does not kill a long run.
# --dry_run prints the exact commands and runs nothing on the workers.
#
# --workdir must be one every worker shares: gs://BUCKET/PATH (orbax writes the
# checkpoints there directly), or a shared filesystem (Filestore/NFS, a
# gcsfuse-mounted bucket). Process 0 writes the tokenizer and metrics there and
# all processes write their part of each checkpoint.
#
# Example:
#   launch/tpu_pod.sh --tpu=my-v4-32 --zone=us-central2-b -- \
#       --config=configs/pretrain.py:objective=maelm,size=base \
#       --workdir=gs://my-bucket/maelm_base --config.batch_size=2048 \
#       --config.data.source=tfds:wikipedia/20230601.en \
#       --config.data.tfds_data_dir=/mnt/shared/tensorflow_datasets
set -euo pipefail

usage() {
  sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//' >&2
}

die() {
  echo "tpu_pod.sh: $*" >&2
  exit 2
}

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
REMOTE_DIR="maelm-jax"     # Under each worker's home directory.
REMOTE_VENV="maelm-venv"
REMOTE_LOG="maelm-jax.log"
tpu=""
zone=""
project=""
dry_run=0
skip_copy=0
skip_install=0
detach=0
use_jemalloc=1
topology=""
skip_plan=0

while (($#)); do
  case "$1" in
    --tpu=*) tpu="${1#*=}" ;;
    --zone=*) zone="${1#*=}" ;;
    --project=*) project="${1#*=}" ;;
    --topology=*) topology="${1#*=}" ;;
    --tpu | --zone | --project | --topology)
      (($# >= 2)) || die "$1 needs a value"
      declare "${1#--}=$2"
      shift
      ;;
    --skip_plan | --skip-plan) skip_plan=1 ;;
    --skip_copy) skip_copy=1 ;;
    --skip_install) skip_install=1 ;;
    --detach) detach=1 ;;
    --no_jemalloc | --no-jemalloc) use_jemalloc=0 ;;
    --dry_run | --dry-run) dry_run=1 ;;
    -h | --help) usage; exit 0 ;;
    --) shift; break ;;
    *) die "unknown option '$1'. Launcher options go before '--', the arguments of maelm_jax.main after it (--help for usage)" ;;
  esac
  shift
done
main_args=("$@")

[[ -n "$tpu" ]] || die "--tpu=NAME is required (the TPU VM name, as in 'gcloud compute tpus tpu-vm list')"
[[ -n "$zone" ]] || die "--zone=ZONE is required (e.g. us-central2-b)"
((${#main_args[@]})) || die "no arguments for maelm_jax.main after '--' (at least --config and --workdir)"

workdir=""
for ((k = 0; k < ${#main_args[@]}; k++)); do
  case "${main_args[k]}" in
    --workdir=* | -workdir=*) workdir="${main_args[k]#*=}" ;;
    --workdir | -workdir) workdir="${main_args[k + 1]:-}" ;;
  esac
done
if [[ -z "$workdir" ]]; then
  die "no --workdir in the arguments of maelm_jax.main"
elif [[ "$workdir" == gs://* ]]; then
  :  # A bucket: every worker reaches it.
elif [[ "$workdir" != /* ]]; then
  # Relative means inside ~/$REMOTE_DIR, which the next launch deletes (step 1),
  # checkpoints included; and on each worker's own disk, not shared.
  die "--workdir=$workdir is relative: it would be ~/$REMOTE_DIR/$workdir on each worker, which the next launch deletes with the code copy. Pass an absolute path on a filesystem all workers share (e.g. --workdir=/mnt/shared/run)"
elif [[ "$workdir" == */"$REMOTE_DIR" || "$workdir" == */"$REMOTE_DIR"/* ]]; then
  die "--workdir=$workdir is inside the code copy ~/$REMOTE_DIR, which every launch deletes; pass a directory outside it, on a filesystem all workers share"
fi

gcloud_tail=(--zone="$zone")
[[ -n "$project" ]] && gcloud_tail+=(--project="$project")

# Step 0: the plan, here, before any worker is touched.
if ((!skip_plan)); then
  if [[ -z "$topology" ]]; then
    command -v gcloud > /dev/null || die "gcloud not found, so the TPU's topology is unknown; pass --topology=v5e:4x4 (or its accelerator type, e.g. v5litepod-16), or --skip_plan"
    topology="$(gcloud compute tpus tpu-vm describe "$tpu" "${gcloud_tail[@]}" --format='value(acceleratorType)')" \
      || die "could not read the accelerator type of TPU $tpu (above); pass --topology=v5e:4x4 (or e.g. v5litepod-16), or --skip_plan"
    [[ -n "$topology" ]] || die "gcloud gave no accelerator type for TPU $tpu; pass --topology=v5e:4x4, or --skip_plan"
  fi
  plan_python="${MAELM_PLAN_PYTHON:-}"
  if [[ -z "$plan_python" ]]; then
    if [[ -x "$REPO/.venv/bin/python" ]]; then plan_python="$REPO/.venv/bin/python"; else plan_python=python3; fi
  fi
  plan_args=()  # maelm_jax.main's arguments the plan takes: --config and its overrides.
  for ((k = 0; k < ${#main_args[@]}; k++)); do
    case "${main_args[k]}" in
      --workdir | -workdir) k=$((k + 1)) ;;
      --workdir=* | -workdir=* | --verbose | --noverbose) ;;
      *) plan_args+=("${main_args[k]}") ;;
    esac
  done
  echo "tpu_pod.sh: planning the run for $topology on this machine ($plan_python -m maelm_jax.plan)..." >&2
  set +e
  plan_out="$(cd "$REPO" && "$plan_python" -m maelm_jax.plan --topology="$topology" "${plan_args[@]}" 2> "${TMPDIR:-/tmp}/maelm-plan.$$.err")"
  plan_status=$?
  set -e
  plan_err="$(grep -E '^(plan|error)' "${TMPDIR:-/tmp}/maelm-plan.$$.err" || tail -n 20 "${TMPDIR:-/tmp}/maelm-plan.$$.err")"
  rm -f "${TMPDIR:-/tmp}/maelm-plan.$$.err"
  if ((plan_status == 3)); then
    printf '%s\n' "$plan_out" >&2
    echo "tpu_pod.sh: this config does not fit $topology (above); nothing was launched. Change it, or pass --skip_plan" >&2
    exit 3
  elif ((plan_status != 0)); then
    [[ -n "$plan_err" ]] && printf '%s\n' "$plan_err" >&2
    die "the plan failed (exit $plan_status; above); fix it, or pass --skip_plan to launch without it"
  fi
  if ((dry_run)); then
    printf '%s\n' "$plan_out" | sed 's/^/# /'
  else
    printf '%s\n' "$plan_out" >&2
  fi
fi
gcloud_tail+=(--worker=all)

stage="${TMPDIR:-/tmp}/maelm-jax-stage.$$"
quote() {  # Shell-quoted words, space-separated.
  local out
  out="$(printf '%q ' "$@")"
  printf '%s' "${out% }"
}

# The remote commands (run by each worker's login shell, in its home directory).
args_q="$(quote "${main_args[@]}")"
run_cmd="cd ~/$REMOTE_DIR && "
if ((use_jemalloc)); then
  # A code copy from before launch/jemalloc.sh existed (a relaunch with --skip_copy)
  # runs on, under glibc's malloc, saying so.
  run_cmd+='{ if [ -f launch/jemalloc.sh ]; then . launch/jemalloc.sh && jemalloc_preload "tpu_pod.sh on $(hostname)" export || exit 2; '
  run_cmd+='else echo "tpu_pod.sh on $(hostname): launch/jemalloc.sh is not in this code copy (relaunch without --skip_copy): glibc'"'"'s malloc" >&2; fi; } && '
fi
run_cmd+="MAELM_DISTRIBUTED=tpu"
if ((detach)); then
  run_cmd+=" nohup ~/$REMOTE_VENV/bin/python -m maelm_jax.main ${args_q} > ~/$REMOTE_LOG 2>&1 < /dev/null &"
else
  run_cmd+=" ~/$REMOTE_VENV/bin/python -m maelm_jax.main ${args_q}"
fi
install_cmd="set -e; cd ~/$REMOTE_DIR; if [ ! -x ~/$REMOTE_VENV/bin/python ]; then python3 -m venv ~/$REMOTE_VENV || { sudo apt-get -qq update && sudo apt-get -qq install -y python3-venv && python3 -m venv ~/$REMOTE_VENV; }; fi; ~/$REMOTE_VENV/bin/pip install -q -U pip; ~/$REMOTE_VENV/bin/pip install -q -e '.[gcs]' 'jax[tpu]'"
if ((use_jemalloc)); then
  install_cmd+="; . launch/jemalloc.sh; jemalloc_library > /dev/null || sudo apt-get -qq install -y libjemalloc2 || { sudo apt-get -qq update && sudo apt-get -qq install -y libjemalloc2; } || echo 'jemalloc not installed: the run will use glibc malloc'"
fi

commands=()   # Each entry: one command line, already shell-quoted.
if ((!skip_copy)); then
  commands+=("rm -rf $(quote "$stage") && mkdir -p $(quote "$stage/$REMOTE_DIR") && tar -C $(quote "$REPO") --exclude=./.venv --exclude=./workdirs --exclude=./.git --exclude=__pycache__ --exclude='*.egg-info' --exclude=.pytest_cache -cf - . | tar -C $(quote "$stage/$REMOTE_DIR") -xf -")
  commands+=("$(quote gcloud compute tpus tpu-vm ssh "$tpu" "${gcloud_tail[@]}" --command="rm -rf ~/$REMOTE_DIR")")
  commands+=("$(quote gcloud compute tpus tpu-vm scp --recurse "$stage/$REMOTE_DIR" "$tpu:~/" "${gcloud_tail[@]}")")
  commands+=("rm -rf $(quote "$stage")")
fi
if ((!skip_install)); then
  commands+=("$(quote gcloud compute tpus tpu-vm ssh "$tpu" "${gcloud_tail[@]}" --command="$install_cmd")")
fi
commands+=("$(quote gcloud compute tpus tpu-vm ssh "$tpu" "${gcloud_tail[@]}" --command="$run_cmd")")

if ((dry_run)); then
  echo "# maelm_jax on all workers of TPU $tpu (zone $zone${project:+, project $project})"
  printf '%s\n' "${commands[@]}"
  exit 0
fi

command -v gcloud > /dev/null || die "gcloud not found; install the Google Cloud CLI (or use --dry_run to see the commands)"
for c in "${commands[@]}"; do
  echo "+ $c" >&2
  eval "$c"
done
