# Sourced by the launchers (local.sh, slurm_gpu.sbatch, and on each TPU worker
# by tpu_pod.sh): preload jemalloc into the run where it is installed.
#
# Under glibc's malloc a run's resident memory creeps up with every checkpoint
# save (~12 MB per 1,000 steps of `tiny` at the default cadence: its arenas keep
# freed host buffers between live ones); with jemalloc preloaded it stays flat
# (README "Long runs"; benchmarks/RESULTS.md, "Hours of running"). The search is
# that of maelm_jax/host_memory.py's find_jemalloc; the run's log then says
# "host allocator: jemalloc".
#
#   jemalloc_library        prints the library: $MAELM_JEMALLOC if set (status 1
#                           if that is no file), else the first standard path
#                           that exists; nothing and status 1 where none does.
#   jemalloc_preload WHO [export]
#                           sets jemalloc_ld_preload to $LD_PRELOAD with the
#                           library in front (unless already there) and says so
#                           on stderr as WHO; with `export`, also exports it as
#                           LD_PRELOAD. Where it is not installed: says that and
#                           how to install it, and jemalloc_ld_preload is empty.
#                           Status 2 (after a message) if $MAELM_JEMALLOC names
#                           no file.

JEMALLOC_PATHS=(
  /usr/lib/x86_64-linux-gnu/libjemalloc.so.2
  /usr/lib/aarch64-linux-gnu/libjemalloc.so.2
  /usr/lib64/libjemalloc.so.2
  /usr/lib/libjemalloc.so.2
  /usr/local/lib/libjemalloc.so.2
)

jemalloc_library() {
  if [[ -n "${MAELM_JEMALLOC:-}" ]]; then
    [[ -f "$MAELM_JEMALLOC" ]] || return 1
    echo "$MAELM_JEMALLOC"
    return 0
  fi
  local path
  for path in "${JEMALLOC_PATHS[@]}"; do
    if [[ -f "$path" ]]; then
      echo "$path"
      return 0
    fi
  done
  return 1
}

jemalloc_preload() {
  local who="$1" library
  jemalloc_ld_preload=""
  if ! library="$(jemalloc_library)"; then
    if [[ -n "${MAELM_JEMALLOC:-}" ]]; then
      echo "$who: MAELM_JEMALLOC=$MAELM_JEMALLOC is no file; point it at libjemalloc.so.2, or unset it (then the standard places are searched)" >&2
      return 2
    fi
    echo "$who: jemalloc is not installed, so the run uses glibc's malloc, whose memory creeps up over hours of checkpointing; install it (apt install libjemalloc2) and the launcher preloads it" >&2
    return 0
  fi
  case ":${LD_PRELOAD:-}:" in
    *":$library:"*) jemalloc_ld_preload="$LD_PRELOAD" ;;
    *) jemalloc_ld_preload="$library${LD_PRELOAD:+:$LD_PRELOAD}" ;;
  esac
  if [[ "${2:-}" == export ]]; then
    export LD_PRELOAD="$jemalloc_ld_preload"
  fi
  echo "$who: preloading jemalloc ($library) for flat host memory over long runs; --no_jemalloc for glibc's malloc" >&2
}
