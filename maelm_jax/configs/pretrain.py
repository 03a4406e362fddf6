r"""Pretraining: MLM, MAE-LM or 3ML encoders at any size.

Run (embedded default corpus, the English docs that ship with CPython):
  python -m maelm_jax.main --config=configs/pretrain.py:objective=maelm,size=tiny \
      --workdir=runs/maelm_tiny

Your own text or a tfds corpus:
  --config.data.source='text:/data/books/*.txt,/data/web/*.jsonl.gz'
  --config.data.source='tfds:wikipedia/20230601.en' --config.data.tfds_data_dir=gs://...

Other objectives and decoders:
  --config=configs/pretrain.py:objective=3ml,size=base --config.model.decoder_type=cross
  --config=configs/pretrain.py:objective=mlm,size=base

The papers' settings (post-LN, BERT init, dropout 0.1, lr 5e-4, no position
bias in the decoder), which stay on the unigram plateau for thousands of steps
at small budgets:
  --config=configs/pretrain.py:objective=maelm,size=tiny,recipe=paper

Arguments: objective in (mlm, maelm, 3ml); size in (tiny, small, base, large);
recipe in (fast, paper). Knobs left at None take the objective's
(model.OBJECTIVES) or size's defaults.
"""

import ml_collections
from ml_collections import config_dict

from maelm_jax.run import config_lib


def get_config(arg=None):
  arg = config_lib.parse_arg(arg, objective="maelm", size="tiny", recipe="fast")
  if arg.recipe not in RECIPES:
    raise ValueError(f"recipe={arg.recipe!r} is unknown; use one of {sorted(RECIPES)}")
  config = ml_collections.ConfigDict()
  # What main.py runs: 'pretrain' here ('glue'/'squad' in the fine-tuning configs).
  config.mode = "pretrain"

  # Optimizer steps of the run (unless total_flops sets them).
  config.total_steps = 10_000
  # > 0: a compute budget instead. total_steps becomes total_flops / the train
  # FLOPs of one step (maelm_jax/modeling/flops.py, the model behind `mfu`), so runs of
  # different objectives or sizes get equal compute without hand arithmetic.
  config.total_flops = 0.0
  config.batch_size = 64  # Global, in sequences.
  config.seq_len = 128  # Tokens per row, [CLS] and [SEP] included.
  # Peak learning rate (the recipe sets it per size; see FAST_LEARNING_RATES).
  config.learning_rate = 5e-4
  config.warmup_steps = 500  # Linear warm-up from 0 to the peak over this many steps.
  # > 0: warm-up over this fraction of total_steps instead (so runs of a FLOP
  # budget, whose step counts differ, warm up over the same share of training).
  config.warmup_ratio = 0.0
  config.end_learning_rate_ratio = 0.0  # Linear decay to this fraction of the peak.
  # Written by a resume with another total_steps, not by hand: ((0, first
  # total), (resumed at, new total), ...); the rate goes on linearly from where
  # it got to (train_lib.continued_schedule). Empty: one warm-up and decay.
  config.lr_schedule_segments = ()
  # JAX's persistent compilation cache: "auto" ($JAX_COMPILATION_CACHE_DIR, else
  # ~/.cache/maelm_jax/jax), a directory, or "" (off). A restart skips compiling.
  config.compilation_cache_dir = "auto"
  # "A,B": a jax.profiler trace of steps A..B-1 into <workdir>/profile, for
  # TensorBoard's profile plugin, Perfetto or python -m maelm_jax.tools.profiling.
  config.profile_steps = ""
  # Weights & Biases: a project name logs the scalars, the config and the plots
  # there too (pip install wandb; WANDB_MODE=offline writes them under the
  # workdir). "": off. A resumed workdir continues its W&B run.
  config.wandb_project = ""
  config.wandb_entity = ""  # The W&B team or user; "": the logged-in default.
  # A wall-clock limit for this process's run ("90s", "9m", "1h30m"; "": none),
  # counted from when its state is built or restored: at the first step boundary
  # past it the run saves a checkpoint and exits 0; the same command goes on (for
  # machines with a time limit: Colab, Kaggle, preemptible jobs with a cap).
  config.max_runtime = ""
  config.weight_decay = 0.01  # AdamW's decoupled weight decay.
  # "matrices": AdamW decays kernels and embeddings, not biases nor LayerNorm
  # scales (BERT's rule); "all": every parameter (the MAE-LM release's fairseq).
  config.weight_decay_on = "matrices"
  config.adam_b1 = 0.9  # AdamW's first-moment decay.
  config.adam_b2 = 0.98  # AdamW's second-moment decay (RoBERTa's 0.98).
  config.adam_eps = 1e-6  # AdamW's epsilon.
  config.grad_clip_norm = 2.0  # Gradients are clipped to this global norm.
  # True: LAMB. Each tensor's AdamW step is rescaled to the tensor's norm, so
  # learning_rate is the relative change per step (train_lib.scale_by_relative_size;
  # the fine-tuning configs' key of the same name).
  config.relative_updates = False
  # Layer-wise learning-rate decay (the fine-tuning configs' knob; 1.0: off):
  # each encoder layer at this times the rate of the one above.
  config.layer_decay = 1.0
  config.grad_accum_steps = 1  # Microbatches per step: the same update in less memory.
  config.seed = 0  # Parameters, masks, dropout and data order.
  # Steps between log records (metrics.jsonl, TensorBoard, console).
  config.log_every = 50
  config.eval_every = 1000  # Steps between held-out evaluations.
  config.eval_batches = 20  # Batches per held-out evaluation.
  # Training tokens the unigram/bigram baselines are counted on (baselines.py).
  config.baseline_tokens = 2_000_000
  # Steps between checkpoints (and one at the end or on SIGTERM).
  config.checkpoint_every = 1000
  config.keep_checkpoints = 3  # The last N checkpoints...
  config.checkpoint_keep_period = 0  # ...plus every Nth step for good (0: none).
  # A step with a non-finite loss or gradient is never applied; then 'stop' ends
  # the run at the next log step (naming the step), 'skip' goes on and warns.
  config.nonfinite_policy = "stop"
  # Resuming a workdir whose config.json differs in anything but run length and
  # logging is refused unless this is set.
  config.allow_config_change = False
  # When every checkpoint of the workdir fails to read (each is moved aside as
  # <step>.corrupt, never deleted), the run stops unless this is set; then it
  # trains from step 1 in the same workdir.
  config.start_over = False
  # Print what the launch would do (parameters, masks, FLOPs, mesh, data, the
  # workdir's state: new, resumable at step N, or refused and why) and exit.
  config.dry_run = False
  config.mesh_shape = (-1, 1, 1)  # ('data', 'fsdp', 'tensor'); one -1 is inferred.
  config.peak_flops_per_device = 0.0  # 0: look up the device kind (flops.CHIPS).
  # A pretraining workdir whose params start this run (fresh optimizer).
  config.init_from = ""

  config.data = ml_collections.ConfigDict()
  # The corpus: text:, tfds:, arrayrecord: or pydoc: (sources.py).
  config.data.source = "pydoc:"
  config.data.eval_fraction = 0.01  # Share of documents held out for evaluation.
  config.data.text_field = "text"  # The JSON field or tfds feature that holds the text.
  # A text file that is not UTF-8 text (binary, another encoding) is skipped
  # with a warning naming it ('warn'), or stops the run ('stop').
  config.data.on_bad_text = "warn"
  # TFDS data_dir for data.source=tfds:... ('': TFDS's default).
  config.data.tfds_data_dir = ""
  # grain worker processes for tokenizing and packing (0: in-process).
  config.data.num_workers = 0
  # Documents are dealt to this many packed streams (0: one per process). Fix it
  # (e.g. 8) to get the same batches on any process count that divides it.
  config.data.num_streams = 0
  # "packed": rows cross documents ([SEP] between them), no padding; "complete_doc":
  # a row never crosses a document's end and is padded (the MAE-LM release).
  config.data.rows = "packed"

  config.tokenizer = ml_collections.ConfigDict()
  config.tokenizer.vocab_size = 8000  # Pieces, the 5 special ones included.
  config.tokenizer.model_type = "unigram"  # SentencePiece 'unigram' or 'bpe'.
  config.tokenizer.path = ""  # Empty: train one into the workdir (or reuse it).
  # Sentences sampled to train the tokenizer.
  config.tokenizer.max_sentences = 2_000_000

  config.model = ml_collections.ConfigDict()
  config.model.objective = arg.objective  # 'mlm', 'maelm' or '3ml' (model.OBJECTIVES).
  config.model.size = arg.size  # 'tiny', 'small', 'base' or 'large' (model.SIZES).
  # Size overrides (0: the preset's value).
  config.model.num_layers = 0
  config.model.hidden = 0  # Width (0: the size's).
  config.model.num_heads = 0  # Attention heads (0: the size's).
  config.model.mlp = 0  # FFN width (0: the size's).
  config.model.max_positions = 512  # Longest sequence the position table holds.
  config.model.ln_type = "post"  # 'post' (BERT, RoBERTa, MAE-LM) or 'pre' LayerNorm.
  # 'learned': a table of absolute positions; 'rope': rotary positions on every
  # attention's queries and keys (with relative_position_bias=False, no bias at all).
  config.model.position = "learned"
  # T5-style relative position bias, one table shared by all layers.
  config.model.relative_position_bias = True
  config.model.relative_buckets = 32  # Rows of the relative position table.
  # Offsets beyond this share the farthest bucket.
  config.model.relative_max_distance = 128
  config.model.relative_bucket_fn = "t5"  # or the MAE-LM release's "mae_lm".
  config.model.untie_cls_position = True  # [CLS] pairs without position bias (TUPE).
  config.model.relative_bias_init = "normal"  # or "local" (model.local_relative_bias_init)
  # Residual branches' output projections start at 0.
  config.model.zero_init_residual = False
  # The FFN: 'gelu' or 'geglu' (LTG-BERT / GPT-BERT; one more matrix, which
  # flops.py counts: mlp at 2/3 keeps the FLOPs).
  config.model.mlp_activation = "gelu"
  # NormFormer's extra LayerNorms: on each attention's output and on the FFN's
  # hidden units (LTG-BERT has them).
  config.model.normformer = False
  config.model.dropout = 0.1  # Dropout on embeddings and residual branches.
  # Dropout on attention probabilities (0 lets fused kernels run).
  config.model.attention_dropout = 0.1
  # Dropout on the FFN's hidden units after GELU: none, as in BERT, RoBERTa and
  # MAE-LM (fairseq's --activation-dropout 0).
  config.model.activation_dropout = 0.0
  config.model.dtype = "bfloat16"  # Matmul dtype; params and logits stay float32.
  # Runtime choices (a run resumes under another): attention.ATTENTION_IMPLS and
  # model.REMAT_POLICIES say what each does; remat=True is remat_policy='full'.
  config.model.attention_impl = "auto"
  # True: recompute each layer in the backward pass (remat_policy='full').
  config.model.remat = False
  # What a layer keeps for the backward pass (model.REMAT_POLICIES).
  config.model.remat_policy = "none"
  # One nn.scan over the layers (compiles as fast at 24 layers as at 2); changes
  # the checkpoint layout, which init_from, fine-tuning, analysis and export read
  # either way, but a run cannot resume under the other.
  config.model.scan_layers = False
  # Objective knobs; None takes the objective's default (model.OBJECTIVES).
  config.model.mask_ratio = config_dict.placeholder(float)
  # > 0: the rate starts here and moves linearly to mask_ratio (GPT-BERT,
  # LTG-BERT: 0.3 -> 0.15) in mask_ratio_stages equal shares of the run, each
  # its own compiled step (config_lib.mask_ratios); held-out evaluation stays at
  # mask_ratio, and total_flops counts each stage at its own cost.
  config.model.mask_ratio_start = 0.0
  # Stages of that schedule (2-16): each is a constant rate and one more compile.
  config.model.mask_ratio_stages = 4
  # Share of selected tokens replaced by a random one.
  config.model.random_replace_prob = config_dict.placeholder(float)
  config.model.keep_prob = config_dict.placeholder(float)
  # True: selected tokens leave the encoder (MAE-LM, 3ML).
  config.model.drop_masked = config_dict.placeholder(bool)
  # 'none', 'self' or 'cross' (3ML's cross-attention decoder).
  config.model.decoder_type = config_dict.placeholder(str)
  # Decoder depth (None: the size's preset).
  config.model.decoder_layers = config_dict.placeholder(int)
  config.model.decoder_dropout = 0.0  # Every dropout of the MAE-LM / 3ML decoder.
  # The decoder's own relative position bias.
  config.model.decoder_relative_position_bias = False
  # False: the LM head predicts with its own output embedding. Tied (the default,
  # as in BERT/RoBERTa/MAE-LM), the softmax pushes every unread piece's input
  # embedding the same way at each step and rare pieces collapse into one
  # direction (mean cosine 0.71 after 600 tiny steps; untied 0.01). Untied is not
  # the default: it learned more slowly in the first few hundred steps on pydoc
  # and on synthetic text, and no downstream A/B has shown it better yet
  # (studies/recipes-off-the-plateau.md, "Untied output embedding").
  config.model.tie_embeddings = True
  config.model.layer_norm_eps = 1e-5  # An imported BERT (import_hf) keeps 1e-12.

  apply_recipe(config, arg.recipe)
  config.lock()
  return config


# The default recipe, found by experiment (studies/recipes-off-the-plateau.md,
# "Which recipe leaves the plateau"): pre-LN, no dropout, a high peak learning rate with a short
# warm-up, rotary positions (since 2026-12-03; before, a learned table and a relative
# bias that prefers near neighbours from step 0), a relative bias of that kind in the
# MAE-LM / 3ML decoder, and 10% kept tokens for every objective. Peak
# learning rates per size; tiny was measured here (at its 2 layers: deepened to 8,
# mlm learns faster at 1e-3, maelm alike at 1e-3 to 3e-3; studies/recipes-off-the-plateau.md,
# "At 8 encoder layers"), the larger sizes follow the same pre-LN practice (Cramming, 24hBERT)
# scaled down with width.
FAST_LEARNING_RATES = {"tiny": 3e-3, "small": 2e-3, "base": 1e-3, "large": 5e-4}
RECIPES = ("fast", "paper")


def apply_recipe(config, recipe: str) -> None:
  if recipe == "paper":
    # The fields above are the MAE-LM / RoBERTa settings; these four are the
    # official MAE-LM release's own (yumeng5/MAE-LM, run_pretrain.sh and
    # fairseq/models/ae; docs/pretraining-and-data.md, "recipe=paper against the release").
    config.model.relative_bucket_fn = "mae_lm"
    config.model.relative_buckets = 64  # Rows of the relative position table.
    config.model.untie_cls_position = False
    config.weight_decay_on = "all"
    # --sample-break-mode complete_doc: rows never cross a document and are padded;
    # each row masks 15% of its own tokens (masking.py, per-row counts).
    config.data.rows = "complete_doc"
    return
  # Peak learning rate (the recipe sets it per size; see FAST_LEARNING_RATES).
  config.learning_rate = FAST_LEARNING_RATES[config.model.size]
  config.warmup_steps = 200  # Linear warm-up from 0 to the peak over this many steps.
  config.model.ln_type = "pre"  # 'post' (BERT, RoBERTa, MAE-LM) or 'pre' LayerNorm.
  config.model.dropout = 0.0  # Dropout on embeddings and residual branches.
  # Dropout on attention probabilities (0 lets fused kernels run).
  config.model.attention_dropout = 0.0
  # Rotary positions on every attention's queries and keys, no position table and
  # no bias in the encoder: ahead of the learned table plus relative bias on the
  # 600-step plateau probes of every objective at equal FLOPs, two seeds each
  # (studies/recipes-off-the-plateau.md, "Rotary positions"), and on a TPU the
  # encoder's attention kernels read no bias at all (benchmarks/tpu-plans.md).
  config.model.position = "rope"
  config.model.relative_position_bias = False
  # Attention that prefers near neighbours from step 0, where a relative bias
  # stays: the MAE-LM / 3ML decoder's, and an encoder's given one back.
  config.model.relative_bias_init = "local"
  # The decoder's own relative position bias.
  config.model.decoder_relative_position_bias = True
  # 10% of the selected tokens stay visible and unchanged and are predicted too
  # (BERT's keep rule; MLM and 3ML have it already). For MAE-LM this copy signal
  # is what lets training leave the plateau at small budgets: without it the
  # projections stay at their initial scale and the decoder ignores the context.
  # [MASK] still never enters the encoder.
  config.model.keep_prob = 0.1
