#!/bin/bash
# One slot of a run that grows across machines with a time limit (Colab, Kaggle,
# a preemptible job with a wall-clock cap), its workdir carried between them as
# files of a given size:
#
#   bash launch/slot.sh --workdir=runs/grow --parts=/mnt/drive/grow --max_runtime=9m \
#     -- --config=configs/pretrain.py:objective=maelm,size=small --config.total_flops=2e18
#
#   1. unpacks --parts' newest complete set into --workdir (the run's config,
#      tokenizer and newest checkpoints, the data iterator's position included),
#      unless the workdir here is that set's slot already (a serial in both); a
#      workdir of an older slot, or half unpacked, is moved aside, never deleted;
#   2. runs `python -m maelm_jax.main --workdir=... --config.max_runtime=...` with
#      the arguments after `--`: it trains until the limit, saves and exits 0, or
#      finishes (docs/long-runs-and-faults.md);
#   3. packs the workdir into --parts/parts/ as workdir.tar.part-NNN of
#      --part_size bytes (split's sizes: 15M, 1G). The new parts are written to
#      parts.new/, marked COMPLETE, then swapped in by renames: a machine that dies
#      while packing or swapping leaves a complete set (a COMPLETE parts.new/ is
#      the newest, and the next slot swaps it in first), never a half.
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
fail() { echo "slot.sh: $*" >&2; exit 1; }
# A set marked COMPLETE in parts.new/ is always the newest: a machine died before
# or during its swap. Finish the swap.
if [ -f "$PARTS/parts.new/COMPLETE" ]; then
  rm -rf "$PARTS/parts.old" && { [ ! -d "$PARTS/parts" ] || mv "$PARTS/parts" "$PARTS/parts.old"; } &&
    mv "$PARTS/parts.new" "$PARTS/parts" && rm -rf "$PARTS/parts.old" ||
    fail "cannot swap in $PARTS/parts.new; nothing was run"
fi
SET="$PARTS/parts"; [ -f "$SET/COMPLETE" ] || SET="$PARTS/parts.old"
SERIAL=0; [ -f "$SET/COMPLETE" ] && SERIAL=$(cat "$SET/SERIAL" 2>/dev/null || echo 0)

# The parts are unpacked unless this machine's workdir is the slot they hold (the
# same serial): a workdir left by an older slot on this disk, or half unpacked, is
# moved aside (never deleted) and the parts win.
if [ -f "$SET/COMPLETE" ] && [ "$(cat "$WORKDIR/.slot" 2>/dev/null)" != "$SERIAL" ]; then
  if [ -e "$WORKDIR" ]; then
    mv "$WORKDIR" "$WORKDIR.before-slot-$SERIAL.$$" || fail "cannot move $WORKDIR aside"
    echo "slot.sh: $WORKDIR was not slot $SERIAL's; moved to $WORKDIR.before-slot-$SERIAL.$$" >&2
  fi
  rm -rf "$WORKDIR.unpacking" && mkdir -p "$WORKDIR.unpacking" &&
    cat "$SET"/workdir.tar.part-* | tar -C "$WORKDIR.unpacking" -xf - &&
    mv "$WORKDIR.unpacking" "$WORKDIR" ||
    { rm -rf "$WORKDIR.unpacking"; fail "the parts in $SET do not unpack; nothing was run"; }
  echo "slot.sh: unpacked slot $SERIAL ($(ls "$SET"/workdir.tar.part-* | wc -l) parts of" \
       "$SET) into $WORKDIR" >&2
fi

"$PYTHON" -m maelm_jax.main --workdir="$WORKDIR" "$@" --config.max_runtime="$MAX_RUNTIME"
STATUS=$?
[ -d "$WORKDIR" ] || exit $STATUS  # Refused before it wrote anything.

SERIAL=$((SERIAL + 1))
echo $SERIAL > "$WORKDIR/.slot" &&
  rm -rf "$PARTS/parts.new" && mkdir -p "$PARTS/parts.new" &&
  tar -C "$WORKDIR" --exclude=./.lock -cf - . |
  split -b "$PART_SIZE" -d -a 3 - "$PARTS/parts.new/workdir.tar.part-" &&
  echo $SERIAL > "$PARTS/parts.new/SERIAL" && touch "$PARTS/parts.new/COMPLETE" || {
    rm -rf "$PARTS/parts.new"
    fail "packing $WORKDIR failed; the previous parts in $PARTS are kept"; }
rm -rf "$PARTS/parts.old" && { [ ! -d "$PARTS/parts" ] || mv "$PARTS/parts" "$PARTS/parts.old"; } &&
  mv "$PARTS/parts.new" "$PARTS/parts" && rm -rf "$PARTS/parts.old" ||
  fail "cannot swap in $PARTS/parts.new (complete: the next slot swaps it in)"
echo "slot.sh: packed $WORKDIR as slot $SERIAL: $(ls "$PARTS/parts"/workdir.tar.part-* | wc -l)" \
     "parts of at most $PART_SIZE in $PARTS/parts (exit $STATUS)" >&2
exit $STATUS
