"""The keys every fine-tuning config shares (configs/glue.py, configs/squad.py):
schedule, AdamW, dropout, attention kernel, dtype, mesh, checkpoints. One home, so
that a new optimizer key reaches both tasks."""


def add_common_keys(config) -> None:
  """Adds the shared keys with their defaults to an unlocked ConfigDict."""
  config.warmup_ratio = 0.06  # Linear warm-up over this share of the steps.
  config.end_learning_rate_ratio = 0.0  # Linear decay to this fraction of the peak.
  config.weight_decay = 0.01  # AdamW's decoupled weight decay.
  # Layer-wise learning-rate decay (ELECTRA, DeBERTa): each encoder layer learns
  # at this times the rate of the one above, the embeddings lowest, the head at
  # the full rate. 1.0: off (RoBERTa, MAE-LM). See train_lib.scale_by_layer_decay.
  config.layer_decay = 1.0
  # True: LAMB-style relative updates (train_lib.scale_by_relative_size): the
  # learning rate is each tensor's relative change per step, so a pretrained
  # encoder, whose weights pretraining grew, is not fine-tuned more slowly than
  # a fresh one at the same rate. Its rates are relative: about 1e-3..1e-2.
  config.relative_updates = False
  config.adam_b1 = 0.9  # AdamW's first-moment decay.
  config.adam_b2 = 0.98  # AdamW's second-moment decay.
  config.adam_eps = 1e-6  # AdamW's epsilon.
  config.grad_clip_norm = 1.0  # Gradients are clipped to this global norm.
  config.dropout = 0.1  # Encoder and head.
  config.attention_dropout = 0.1  # Dropout on attention probabilities.
  config.activation_dropout = 0.0  # After the FFN's GELU (none in RoBERTa).
  # 'auto': the platform's flash-attention kernel where it applies (cuDNN on GPU in
  # bf16, Pallas on TPU, any length padded to its blocks; at eval only while
  # attention dropout is on), the einsum elsewhere (attention.ATTENTION_IMPLS).
  config.attention_impl = "auto"
  config.dtype = ""  # Matmul dtype; "": the pretrained model's (bfloat16/float32).
  config.seed = 1  # Head init, dropout and data order.
  config.mesh_shape = (-1, 1, 1)  # ('data', 'fsdp', 'tensor'), as in pretraining.
  config.log_every = 50  # Steps between log records.
  # A checkpoint (params + optimizer) is saved after every epoch and on SIGTERM /
  # Ctrl-C; the same command resumes. A finished run keeps its last one (what
  # export_hf exports) unless keep_final_checkpoint=False; a sweep keeps only the
  # runs at each task's selected learning rate. start_over: see configs/pretrain.py.
  config.keep_final_checkpoint = True
  config.start_over = False  # True: train from step 1 if no checkpoint reads.
  # JAX's persistent compilation cache: "auto" ($JAX_COMPILATION_CACHE_DIR, else
  # ~/.cache/maelm_jax/jax), a directory, or "" (off). A restart skips compiling.
  config.compilation_cache_dir = "auto"
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
