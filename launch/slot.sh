#!/bin/bash
# One slot of a run that grows across machines with a time limit (Colab, Kaggle,
# a preemptible job with a wall-clock cap), its workdir carried between them as
# files of a given size:
#
#   bash launch/slot.sh --workdir=runs/grow --parts=/mnt/drive/grow --max_runtime=9m \
#     -- --config=configs/pretrain.py:objective=maelm,size=small --config.total_flops=2e18
#
#   1. --workdir missing and --parts holding a slot's parts: unpacks them there
#      (the run's config, tokenizer and newest checkpoints, the data iterator's
#      position included);
#   2. runs `python -m maelm_jax.main --workdir=... --config.max_runtime=...` with
#      the arguments after `--`: it trains until the limit, saves and exits 0, or
#      finishes (docs/long-runs-and-faults.md);
#   3. packs the workdir into --parts/parts/ as workdir.tar.part-NNN of
#      --part_size bytes (split's sizes: 15M, 1G). The new parts are written to
#      parts.new/, marked COMPLETE, then swapped in by renames: a machine that dies
#      while packing or swapping leaves a complete set (the next slot finishes a
#      swap cut short, then reads parts/, else parts.old/), never a half.
# The next slot, on this machine or another, is the same command. Leave the save
# and the packing inside the machine's own limit (--max_runtime below it).
# Flags: --workdir, --parts (required); --max_runtime ("" none; default 9m);
# --part_size (default 1G); --python (default python3). Exit status: the run's,
# or 2 for bad flags.
set -u -o pipefail
WORKDIR=""; PARTS=""; MAX_RUNTIME="9m"; PART_SIZE="1G"; PYTHON="python3"
while [ $# -gt 0 ]; do
  case $1 in
    --workdir=*) WORKDIR=${1#*=} ;;
    --parts=*) PARTS=${1#*=} ;;
    --max_runtime=*) MAX_RUNTIME=${1#*=} ;;
    --part_size=*) PART_SIZE=${1#*=} ;;
    --python=*) PYTHON=${1#*=} ;;
    --) shift; break ;;
    *) echo "slot.sh: unknown flag $1 (flags: --workdir= --parts= --max_runtime=" \
            "--part_size= --python=, then -- and the run's arguments)" >&2; exit 2 ;;
  esac
  shift
done
if [ -z "$WORKDIR" ] || [ -z "$PARTS" ]; then
  echo "slot.sh: --workdir and --parts are required, e.g. --workdir=runs/grow" \
       "--parts=/mnt/drive/grow" >&2
  exit 2
fi
mkdir -p "$PARTS" || exit 2
# A swap that a dying machine cut short: finish it.
if [ ! -d "$PARTS/parts" ] && [ -f "$PARTS/parts.new/COMPLETE" ]; then
  mv "$PARTS/parts.new" "$PARTS/parts" || exit 1
fi

if [ ! -e "$WORKDIR" ]; then
  for SET in parts parts.old; do
    [ -f "$PARTS/$SET/COMPLETE" ] || continue
    mkdir -p "$WORKDIR" && cat "$PARTS/$SET"/workdir.tar.part-* | tar -C "$WORKDIR" -xf - || {
      echo "slot.sh: the parts in $PARTS/$SET do not unpack; nothing was run" >&2
      rm -rf "$WORKDIR"; exit 1; }
    echo "slot.sh: unpacked $(ls "$PARTS/$SET"/workdir.tar.part-* | wc -l) parts of" \
         "$PARTS/$SET into $WORKDIR" >&2
    break
  done
fi

"$PYTHON" -m maelm_jax.main --workdir="$WORKDIR" "$@" --config.max_runtime="$MAX_RUNTIME"
STATUS=$?
[ -d "$WORKDIR" ] || exit $STATUS  # Refused before it wrote anything.

rm -rf "$PARTS/parts.new" && mkdir -p "$PARTS/parts.new" &&
  tar -C "$WORKDIR" --exclude=./.lock -cf - . |
  split -b "$PART_SIZE" -d -a 3 - "$PARTS/parts.new/workdir.tar.part-" &&
  touch "$PARTS/parts.new/COMPLETE" || {
    echo "slot.sh: packing $WORKDIR failed; the previous parts in $PARTS are kept" >&2
    rm -rf "$PARTS/parts.new"; exit 1; }
rm -rf "$PARTS/parts.old"
[ -d "$PARTS/parts" ] && mv "$PARTS/parts" "$PARTS/parts.old"
mv "$PARTS/parts.new" "$PARTS/parts" && rm -rf "$PARTS/parts.old"
echo "slot.sh: packed $WORKDIR into $(ls "$PARTS/parts"/workdir.tar.part-* | wc -l)" \
     "parts of at most $PART_SIZE in $PARTS/parts (exit $STATUS)" >&2
exit $STATUS
