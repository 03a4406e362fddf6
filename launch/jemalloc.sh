# Sourced by the launchers (local.sh, slurm_gpu.sbatch, and on each TPU worker
# by tpu_pod.sh, whose login shell may be any POSIX sh: so plain sh here):
# preload jemalloc into the run where it is installed.
#
# Under glibc's malloc a run's resident memory creeps up with every checkpoint
# save (~12 MB per 1,000 steps of `tiny` at the default cadence: its arenas keep
# freed host buffers between live ones); with jemalloc preloaded it stays flat
# (docs/long-runs-and-faults.md; benchmarks/soak.md). The search is
# that of maelm_jax/run/host_memory.py's find_jemalloc; the run's log then says
# "host allocator: jemalloc".
#
#   jemalloc_library        prints the library: $MAELM_JEMALLOC if set (status 1
#                           if that is no file), else the first standard path
#                           that exists; nothing and status 1 where none does.
#   jemalloc_preload WHO [export]
#                           sets jemalloc_ld_preload to $LD_PRELOAD with the
#                           library in front (unless already there) and says so
#                           on stderr as WHO; with `export`, also exports it as
#                           LD_PRELOAD. Where it is not installed, or another
#                           allocator (tcmalloc) is preloaded already, says so
#                           and leaves LD_PRELOAD as it is. Status 2 (after a
#                           message) if $MAELM_JEMALLOC names no file.
#   jemalloc_remove WHO     for --no_jemalloc: sets jemalloc_ld_preload to
#                           $LD_PRELOAD without any jemalloc (one inherited from
#                           the shell, say) and says glibc's malloc is used.
#   jemalloc_choose WHO USE jemalloc_preload WHO if USE is 1, else jemalloc_remove
#                           WHO; then sets jemalloc_env to the assignment a run's
#                           environment takes (LD_PRELOAD=...), empty where
#                           LD_PRELOAD stays unset. The launchers' one call.

JEMALLOC_PATHS="
  /usr/lib/x86_64-linux-gnu/libjemalloc.so.2
  /usr/lib/aarch64-linux-gnu/libjemalloc.so.2
  /usr/lib64/libjemalloc.so.2
  /usr/lib/libjemalloc.so.2
  /usr/local/lib/libjemalloc.so.2
"

jemalloc_library() {
  if [ -n "${MAELM_JEMALLOC:-}" ]; then
    [ -f "$MAELM_JEMALLOC" ] || return 1
    echo "$MAELM_JEMALLOC"
    return 0
  fi
  for jemalloc_path in $JEMALLOC_PATHS; do
    if [ -f "$jemalloc_path" ]; then
      echo "$jemalloc_path"
      return 0
    fi
  done
  return 1
}

jemalloc_preload() {
  jemalloc_ld_preload="${LD_PRELOAD:-}"
  if ! jemalloc_lib="$(jemalloc_library)"; then
    if [ -n "${MAELM_JEMALLOC:-}" ]; then
      echo "$1: MAELM_JEMALLOC=$MAELM_JEMALLOC is no file; point it at libjemalloc.so.2, or unset it (then the standard places are searched)" >&2
      return 2
    fi
    echo "$1: jemalloc is not installed, so the run uses glibc's malloc, whose memory creeps up over hours of checkpointing; install it (apt install libjemalloc2) and the launcher preloads it" >&2
    return 0
  fi
  case ":${LD_PRELOAD:-}:" in
    *":$jemalloc_lib:"*) ;;
    *tcmalloc*)
      echo "$1: LD_PRELOAD holds another allocator ($LD_PRELOAD): kept, jemalloc not added" >&2
      return 0 ;;
    *) jemalloc_ld_preload="$jemalloc_lib${LD_PRELOAD:+:$LD_PRELOAD}" ;;
  esac
  if [ "${2:-}" = export ]; then
    export LD_PRELOAD="$jemalloc_ld_preload"
  fi
  echo "$1: preloading jemalloc ($jemalloc_lib) for flat host memory over long runs; --no_jemalloc for glibc's malloc" >&2
}

jemalloc_remove() {
  jemalloc_ld_preload=""
  jemalloc_old_ifs="$IFS"
  IFS=":"
  for jemalloc_entry in ${LD_PRELOAD:-}; do
    case "$jemalloc_entry" in
      "" | *libjemalloc*) ;;
      *) jemalloc_ld_preload="${jemalloc_ld_preload:+$jemalloc_ld_preload:}$jemalloc_entry" ;;
    esac
  done
  IFS="$jemalloc_old_ifs"
  echo "$1: --no_jemalloc: glibc's malloc" >&2
}

jemalloc_choose() {
  if [ "$2" = 1 ]; then
    jemalloc_preload "$1" || return 2
  else
    jemalloc_remove "$1"
  fi
  jemalloc_env=""
  if [ -n "$jemalloc_ld_preload" ] || [ -n "${LD_PRELOAD:-}" ]; then
    jemalloc_env="LD_PRELOAD=$jemalloc_ld_preload"
  fi
}
