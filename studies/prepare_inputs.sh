#!/bin/bash
# The ignored folders the study configs read beside the checkout (studies/configs/*.py,
# run by studies/run_study.py), made from the shared data on a CPU machine. A fresh
# machine holds only what is in the repository, so this runs first, before a GPU's
# time limit starts:
#   DATA=<data> bash studies/prepare_inputs.sh grow knobs glue     # 1 m 44 s for grow and knobs on 2 busy cores
# and every folder is made again the same way (the tokenizer is seeded: the same
# text gives the same pieces):
#   .grow    data/: Wikipedia shards 04 and 05 (20 MB of xz, the text the grow run
#            and the knob probe train on); tokenizer.model: a unigram tokenizer of
#            8,000 pieces trained on that text's training split, seed 0, as a
#            training run would train it;
#   .knobs   blimp/: the first 200 pairs of each of the 36 paradigms (the protocol's);
#   .glue    data/: SST-2, QNLI and CoLA as the protocol reads them (5.6 MB), for
#            run_study.py --glue_dir=.glue/data.
set -eu
DATA=${DATA:?set DATA to the folder of downloaded data (corpus/, glue/, blimp/)}
PY=${PY:-.venv/bin/python}
[ $# -gt 0 ] || set -- grow knobs glue
for part in "$@"; do
  case $part in
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
    *) echo "prepare_inputs.sh: unknown folder '$part'; use grow, knobs or glue" >&2
       exit 2 ;;
  esac
  echo "$part: $(du -sh .$part | cut -f1)"
done
