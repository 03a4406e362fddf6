#!/bin/bash
# The ignored folders that the GPU runs read beside the checkout, made on
# a CPU machine from the shared data and PyPI. A fresh machine holds only what is
# in the repository (on 2026-11-28 the first run's 8 x 256 encoders and the grow
# run's state were gone with the machine that brought them back), so this runs
# first, before the GPU's time limit starts:
#   bash studies/prepare_gpu_inputs.sh whl grow knobs glue      # 48 s on 2 cores
# and every folder is made again the same way (the tokenizer is seeded: the same
# text gives the same pieces):
#   .whl     the packages the GPU machine's image lacks (its KINDS.md list), as wheels for
#            its Python 3.12: grain, array_record, ml_collections, portpicker,
#            tensorboardX, at the versions this venv runs (their needs are there);
#   .grow    data/: Wikipedia shards 04 and 05 (20 MB of xz, the text the grow run
#            and the knob probe train on); tokenizer.model: a unigram tokenizer of
#            8,000 pieces trained on that text's training split, seed 0, as a
#            training run would train it;
#   .knobs   blimp/: the first 200 pairs of each of the 36 paradigms (the protocol's);
#   .glue    data/: SST-2, QNLI and CoLA as the protocol reads them (5.6 MB); the
#            encoders to score go in .glue/enc/ by hand (studies/gpu-encoders.md).
set -eu
DATA=${DATA:-../shared/data}; PY=${PY:-.venv/bin/python}
[ $# -gt 0 ] || set -- whl grow knobs glue
for part in "$@"; do
  case $part in
    whl)
      mkdir -p .whl
      for name in grain array_record ml_collections portpicker tensorboardX; do
        version=$($PY -m pip show $name | sed -n 's/^Version: //p')
        $PY -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
            --implementation cp --platform manylinux_2_28_x86_64 \
            --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
            --platform manylinux2014_x86_64 -d .whl "$name==$version"
      done ;;
    grow)
      mkdir -p .grow/data
      cp $DATA/corpus/wikipedia/enwiki-2015-0[45]-of-08.jsonl.xz .grow/data/
      # As a training run trains its own (run_tokenizer.py): the training split's
      # documents, the default config's size, type and sample, seed 0.
      [ -f .grow/tokenizer.model ] || $PY - <<'PYTHON'
from configs import pretrain
from maelm_jax.data import pipeline, sources, tokenizer
config = pretrain.get_config("objective=maelm,size=tiny")
source = sources.open_source("text:.grow/data/*.jsonl.xz", "train")
tokenizer.load_or_train_tokenizer(
    ".grow", lambda: pipeline.training_texts(source),
    vocab_size=config.tokenizer.vocab_size, model_type=config.tokenizer.model_type,
    max_sentences=config.tokenizer.max_sentences, seed=0)
PYTHON
      ;;
    knobs)
      mkdir -p .knobs/blimp
      for f in $DATA/blimp/*.jsonl; do head -200 $f > .knobs/blimp/$(basename $f); done ;;
    glue)
      mkdir -p .glue/data .glue/enc
      for t in SST-2 QNLI CoLA; do cp -r $DATA/glue/$t .glue/data/; done ;;
    *) echo "prepare_gpu_inputs.sh: unknown folder '$part'; use whl, grow, knobs or glue" >&2
       exit 2 ;;
  esac
  echo "$part: $(du -sh .$part | cut -f1)"
done
