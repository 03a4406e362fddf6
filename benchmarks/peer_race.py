r"""Our `mlm` train step against Hugging Face's Flax and PyTorch RoBERTa, side by side.

Three masked-LM train steps at one configuration, timed in one run on this CPU:

  ours   the `mlm` objective of this repository: `train_lib.jit_steps` (masking on
         device, forward, backward, clip, AdamW, non-finite guard, state donated),
         LM head on the K selected positions only;
  flax   transformers' `FlaxRobertaForMaskedLM`, optax AdamW in a `jax.jit` step
         with params / optimizer state donated, logits at every position,
         cross-entropy over the selected ones (labels -100 elsewhere);
  torch  transformers' `RobertaForMaskedLM` in PyTorch (eager), torch.optim.AdamW,
         `torch.set_num_threads(cores)`, the model's own loss (CrossEntropyLoss,
         ignore_index -100) over logits at every position.

  benchmarks/peer_venv.sh                   # once: the peers' venv, in the temporary dir
  .venv/bin/python benchmarks/peer_race.py  # float32 and bfloat16, dropout 0.1 and 0
  .venv/bin/python benchmarks/peer_race.py --dtypes=float32 --dropouts=0.1 --rounds=2 \
      --steps_per_round=2 --warmup_steps=1  # smoke test

Design (a noisy, shared VM): every implementation runs in its own long-lived worker
subprocess (ours under this interpreter, the peers under --peer_python). A worker
builds its model, compiles and runs one step, and says it is ready. The parent then
warms every worker up (--warmup_steps, untimed) and does --rounds rounds; in each
round it asks every worker in turn (order rotated per round) over stdin/stdout
lines to run --steps_per_round steps, and the worker answers with their wall time
(ended by `jax.block_until_ready` on state and loss; torch on CPU is synchronous,
the loss is read with `.item()`). Only one worker computes at a time; the others
wait on their stdin. Reported per implementation and dtype: the median tokens/s over
rounds, the spread (max-min)/median, the median step time, the ratio to the Flax
peer (of the medians, and the median of the per-round ratios, which pairs
neighbouring windows), model GFLOP/s, and the CPU time other processes used while
that implementation was timed.

The configuration (the issue's): hidden 256, 4 layers, 4 heads, FFN 1024, vocab 8192,
batch 32 x 128, absolute positions (our relative position bias off), post-LN, tied
input/output embeddings, dropout 0.1 (hidden and attention; --dropouts also runs
0, where no random bits are drawn and the steps compare as pure compute), 15% of the
126 maskable positions selected per row (19: 15 [MASK], 2 random, 2 kept),
AdamW lr 1e-4 (linear warm-up over 500 steps, linear decay to 0 at 10,000: ours'
schedule, mirrored in both peers), weight decay 0.01 on matrices and embeddings
(not biases, not LayerNorm scales), betas 0.9/0.98, eps 1e-6, gradient clipping by
global norm 2.0 (ours' `grad_clip_norm`; `optax.clip_by_global_norm` and
`torch.nn.utils.clip_grad_norm_` in the peers). Random `[CLS] w.. [SEP]` rows,
the same for all three; ours masks them inside its step at every step as it always
does, the peers get host-side masked inputs and labels drawn once before timing.
bfloat16: ours and the Flax peer keep float32 parameters and run the matmuls in
bf16; torch runs under `torch.autocast('cpu', torch.bfloat16)` (float32 weights,
bf16 matmuls), the same mixed precision.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import pathlib
import platform
import re
import shlex
import statistics
import subprocess
import sys
import tempfile
import time

REPO = pathlib.Path(__file__).resolve().parents[1]
DEFAULT_PEER_PYTHON = os.path.join(tempfile.gettempdir(), "peer_venv", "bin", "python")
IMPLS = ("ours", "flax", "torch")
LABELS = {"ours": "ours (`mlm`)", "flax": "HF FlaxRobertaForMaskedLM",
          "torch": "HF RobertaForMaskedLM (PyTorch)"}

# The configuration.
HIDDEN, LAYERS, HEADS, MLP, VOCAB = 256, 4, 4, 1024, 8192
BATCH, SEQ_LEN = 32, 128
DROPOUT = 0.1
LAYER_NORM_EPS = 1e-5  # ours' nn.LayerNorm epsilon; the peers are set to it.
MASK_RATIO, RANDOM_PROB, KEEP_PROB = 0.15, 0.1, 0.1
# Optimizer (the same in all three; the schedule's shape is ours', see train_lib).
LR, WEIGHT_DECAY, B1, B2, EPS = 1e-4, 0.01, 0.9, 0.98, 1e-6
WARMUP_STEPS, TOTAL_STEPS = 500, 10_000
GRAD_CLIP = 2.0  # configs/pretrain.py grad_clip_norm.
# RoBERTa numbers positions from pad_token_id + 1; our [PAD] is 0, so positions
# 1..L, and the table has one more row than ours (as `export_hf` writes it).
PAD_ID, CLS_ID, SEP_ID = 0, 2, 3


def lr_at(step: int) -> float:
  """ours' `train_lib.learning_rate_schedule` at these settings, in Python."""
  if step < WARMUP_STEPS:
    return LR * step / WARMUP_STEPS
  frac = min(step - WARMUP_STEPS, TOTAL_STEPS - WARMUP_STEPS) / (TOTAL_STEPS - WARMUP_STEPS)
  return LR * (1.0 - frac)


def roberta_config_kwargs() -> dict:
  return dict(vocab_size=VOCAB, hidden_size=HIDDEN, num_hidden_layers=LAYERS,
              num_attention_heads=HEADS, intermediate_size=MLP, hidden_act="gelu",
              hidden_dropout_prob=DROPOUT, attention_probs_dropout_prob=DROPOUT,
              max_position_embeddings=SEQ_LEN + PAD_ID + 1, type_vocab_size=1,
              layer_norm_eps=LAYER_NORM_EPS, initializer_range=0.02,
              pad_token_id=PAD_ID, bos_token_id=CLS_ID, eos_token_id=SEP_ID,
              tie_word_embeddings=True, position_embedding_type="absolute")


# ================================================================== Workers ==
# A worker prints one JSON line when ready, then answers every "run N" line on
# stdin with one JSON line; "quit" ends it. Anything the libraries print goes to
# stderr (a log file the parent shows if the worker fails).

def _param_groups_from_paths(paths_sizes) -> dict:
  """Parameter counts by part, from (lowercased path, size) pairs of any of the
  three models."""
  groups = {"word embeddings": 0, "position embeddings": 0, "token-type embeddings": 0,
            "embedding LayerNorm": 0, "layers": 0, "LM head": 0, "other": 0}
  for path, size in paths_sizes:
    if "lm_head" in path:
      groups["LM head"] += size
    elif re.search(r"layer_\d|layer[./]\d", path):
      groups["layers"] += size
    elif "word_embeddings" in path or "token_embed" in path:
      groups["word embeddings"] += size
    elif "position" in path:
      groups["position embeddings"] += size
    elif "token_type" in path:
      groups["token-type embeddings"] += size
    elif "input_ln" in path or ("embeddings" in path and "layernorm" in path):
      groups["embedding LayerNorm"] += size
    else:
      groups["other"] += size
  return groups


def _jax_param_groups(params) -> dict:
  import jax
  flat = jax.tree_util.tree_flatten_with_path(params)[0]
  return _param_groups_from_paths(
      ("/".join(str(getattr(k, "key", k)) for k in path).lower(), leaf.size)
      for path, leaf in flat)


class OursWorker:
  """Our `mlm` step, built the way benchmarks/train_throughput.py builds it."""

  def __init__(self, dtype: str, inputs, seed: int):
    sys.path.insert(0, str(REPO / "benchmarks"))
    import jax
    import train_throughput as tt  # noqa: E402  (puts the repo on sys.path)
    from maelm_jax.core import sharding
    from maelm_jax.run import train_lib
    self.jax = jax
    config, self.model_cfg = ours_config(dtype)
    tx = train_lib.make_optimizer(config)
    mesh = sharding.make_mesh((1, 1, 1), jax.devices()[:1])
    self.state, shardings = train_lib.create_sharded_state(
        self.model_cfg, SEQ_LEN, tx, mesh, seed)
    train_step, _ = train_lib.jit_steps(self.model_cfg, SEQ_LEN, tx, mesh, shardings,
                                        config.grad_accum_steps)
    self.batch = {"input_ids": jax.device_put(inputs["input_ids"],
                                              sharding.batch_sharding(mesh))}
    self.knots = train_lib.learning_rate_knots(config)
    t0 = time.perf_counter()
    self.step = train_step.lower(self.state, self.batch, self.knots).compile()
    self.compile_s = time.perf_counter() - t0
    import flax
    import jaxlib
    import numpy
    import optax
    self.info = dict(
        params=sum(x.size for x in jax.tree.leaves(self.state.params)),
        param_groups=_jax_param_groups(self.state.params),
        versions=dict(python=platform.python_version(), jax=jax.__version__,
                      jaxlib=jaxlib.__version__, flax=flax.__version__,
                      optax=optax.__version__, numpy=numpy.__version__),
        device=str(jax.devices()[0].device_kind),
        num_selected=self.model_cfg.mask_counts(SEQ_LEN).num_selected,
        attention=self.model_cfg.attention_backend(True, SEQ_LEN, SEQ_LEN),
        train_throughput=tt.__file__)

  def run(self, steps: int) -> float:
    metrics = None
    for _ in range(steps):
      self.state, metrics = self.step(self.state, self.batch, self.knots)
    self.jax.block_until_ready((self.state, metrics))
    return float(metrics["loss"])


class FlaxWorker:
  """HF FlaxRobertaForMaskedLM + optax AdamW, one jitted step, state donated."""

  def __init__(self, dtype: str, inputs, seed: int):
    import jax
    import jax.numpy as jnp
    import optax
    from transformers import FlaxRobertaForMaskedLM, RobertaConfig
    self.jax = jax
    config = RobertaConfig(**roberta_config_kwargs())
    model = FlaxRobertaForMaskedLM(config, seed=seed, dtype=jnp.dtype(dtype))
    params = model.params

    schedule = optax.join_schedules(
        [optax.linear_schedule(0.0, LR, WARMUP_STEPS),
         optax.linear_schedule(LR, 0.0, TOTAL_STEPS - WARMUP_STEPS)], [WARMUP_STEPS])
    # As ours' `weight_decay_mask`: decay matrices and embeddings only.
    decay_mask = lambda p: jax.tree_util.tree_map_with_path(
        lambda path, _: path[-1].key not in ("bias", "scale"), p)
    tx = optax.chain(optax.clip_by_global_norm(GRAD_CLIP),
                     optax.adamw(schedule, b1=B1, b2=B2, eps=EPS,
                                 weight_decay=WEIGHT_DECAY, mask=decay_mask))

    def train_step(state, batch):
      params, opt_state, rng = state
      rng, dropout_rng = jax.random.split(rng)

      def loss_fn(params):
        logits = model(batch["input_ids"], attention_mask=batch["attention_mask"],
                       params=params, dropout_rng=dropout_rng, train=True)[0]
        labels = batch["labels"]
        selected = labels >= 0
        nll = optax.softmax_cross_entropy_with_integer_labels(
            logits.astype(jnp.float32), jnp.where(selected, labels, 0))
        return jnp.sum(nll * selected) / jnp.maximum(selected.sum(), 1)

      loss, grads = jax.value_and_grad(loss_fn)(params)
      updates, opt_state = tx.update(grads, opt_state, params)
      return (optax.apply_updates(params, updates), opt_state, rng), loss

    self.state = (params, tx.init(params), jax.random.PRNGKey(seed))
    self.batch = {"input_ids": jnp.asarray(inputs["peer_input_ids"]),
                  "attention_mask": jnp.ones_like(jnp.asarray(inputs["peer_input_ids"])),
                  "labels": jnp.asarray(inputs["peer_labels"])}
    t0 = time.perf_counter()
    self.step = jax.jit(train_step, donate_argnums=0).lower(
        self.state, self.batch).compile()
    self.compile_s = time.perf_counter() - t0
    import flax
    import jaxlib
    import numpy
    import transformers
    self.info = dict(
        params=sum(x.size for x in jax.tree.leaves(params)),
        param_groups=_jax_param_groups(params),
        versions=dict(python=platform.python_version(), jax=jax.__version__,
                      jaxlib=jaxlib.__version__, flax=flax.__version__,
                      optax=optax.__version__, numpy=numpy.__version__,
                      transformers=transformers.__version__),
        device=str(jax.devices()[0].device_kind))

  def run(self, steps: int) -> float:
    loss = None
    for _ in range(steps):
      self.state, loss = self.step(self.state, self.batch)
    self.jax.block_until_ready((self.state, loss))
    return float(loss)


class TorchWorker:
  """HF RobertaForMaskedLM (eager PyTorch) + torch.optim.AdamW."""

  def __init__(self, dtype: str, inputs, seed: int):
    import torch
    from transformers import RobertaConfig, RobertaForMaskedLM
    self.torch = torch
    torch.set_num_threads(_cores())
    torch.manual_seed(seed)
    t0 = time.perf_counter()
    self.model = RobertaForMaskedLM(RobertaConfig(**roberta_config_kwargs()))
    self.model.train()
    params = list(self.model.parameters())  # tied weights once
    # As ours' mask: no decay for biases and LayerNorm weights (the 1-D tensors).
    groups = [{"params": [p for p in params if p.ndim >= 2],
               "weight_decay": WEIGHT_DECAY},
              {"params": [p for p in params if p.ndim < 2], "weight_decay": 0.0}]
    self.optimizer = torch.optim.AdamW(groups, lr=LR, betas=(B1, B2), eps=EPS)
    self.scheduler = torch.optim.lr_scheduler.LambdaLR(
        self.optimizer, lambda step: lr_at(step) / LR)
    self.params = params
    self.autocast = dtype == "bfloat16"
    self.batch = dict(
        input_ids=torch.from_numpy(inputs["peer_input_ids"].astype("int64")),
        attention_mask=torch.ones(inputs["peer_input_ids"].shape, dtype=torch.int64),
        labels=torch.from_numpy(inputs["peer_labels"].astype("int64")))
    self.compile_s = time.perf_counter() - t0  # building only; eager, no compile
    import numpy
    import transformers
    self.info = dict(
        params=sum(p.numel() for p in params),
        param_groups=_param_groups_from_paths(
            (name.lower(), p.numel()) for name, p in self.model.named_parameters()),
        versions=dict(python=platform.python_version(), torch=torch.__version__,
                      transformers=transformers.__version__, numpy=numpy.__version__),
        device="cpu", threads=torch.get_num_threads(),
        attention=self.model.config._attn_implementation,
        adamw="default (for-loop on CPU: foreach=None, fused=None)",
        bf16="autocast" if self.autocast else "-")

  def run(self, steps: int) -> float:
    torch = self.torch
    loss = None
    for _ in range(steps):
      ctx = (torch.autocast("cpu", dtype=torch.bfloat16) if self.autocast
             else contextlib.nullcontext())
      with ctx:
        loss = self.model(**self.batch).loss
      loss.backward()
      torch.nn.utils.clip_grad_norm_(self.params, GRAD_CLIP)
      self.optimizer.step()
      self.scheduler.step()
      self.optimizer.zero_grad(set_to_none=True)
    return float(loss.item())


WORKERS = {"ours": OursWorker, "flax": FlaxWorker, "torch": TorchWorker}


def worker_main(args) -> int:
  # The protocol owns the real stdout; everything else printed goes to stderr.
  proto = os.fdopen(os.dup(1), "w", buffering=1)
  os.dup2(2, 1)
  sys.stdout = sys.stderr
  import numpy as np
  global DROPOUT
  DROPOUT = args.dropout  # Read by ours_config and roberta_config_kwargs.
  inputs = dict(np.load(args.inputs))
  t0 = time.perf_counter()
  worker = WORKERS[args.worker](args.dtype, inputs, args.seed)
  build_s = time.perf_counter() - t0
  t0 = time.perf_counter()
  loss = worker.run(1)  # first execution: allocation, thread pools
  first_step_s = time.perf_counter() - t0
  proto.write(json.dumps(dict(ready=True, build_s=build_s, compile_s=worker.compile_s,
                              first_step_s=first_step_s, loss=loss, pid=os.getpid(),
                              **worker.info)) + "\n")
  for line in sys.stdin:
    command = line.split()
    if not command or command[0] == "quit":
      break
    steps = int(command[1])
    cpu0, t0 = time.process_time(), time.perf_counter()
    loss = worker.run(steps)
    seconds, cpu_s = time.perf_counter() - t0, time.process_time() - cpu0
    if not np.isfinite(loss):
      proto.write(json.dumps(dict(error=f"non-finite loss {loss}")) + "\n")
      return 1
    proto.write(json.dumps(dict(seconds=seconds, cpu_s=cpu_s, loss=loss)) + "\n")
  return 0


# =================================================================== Parent ==

def ours_config(dtype: str, **model_overrides):
  """Our resolved pretraining config and ModelConfig at the race's settings:
  `train_throughput.build_config` (the real config, mlm/small) with the model
  matched to RoBERTa and the optimizer to the peers'; `model_overrides` (config.model
  keys) on top, for benchmarks/step_overheads.py."""
  sys.path.insert(0, str(REPO / "benchmarks"))
  import train_throughput as tt  # noqa: E402
  from maelm_jax.modeling.model import ModelConfig
  from maelm_jax.data.tokenizer import MASK_ID
  model = dict(
      num_layers=LAYERS, hidden=HIDDEN, num_heads=HEADS, mlp=MLP,
      max_positions=SEQ_LEN, ln_type="post", relative_position_bias=False,
      dropout=DROPOUT, attention_dropout=DROPOUT, activation_dropout=0.0,
      tie_embeddings=True,
      zero_init_residual=False, mask_ratio=MASK_RATIO,
      random_replace_prob=RANDOM_PROB, keep_prob=KEEP_PROB,
      attention_impl="auto", scan_layers=False, remat_policy="none")
  config = tt.build_config("mlm", "small", SEQ_LEN, BATCH, dtype,
                           **{**model, **model_overrides})
  config.learning_rate, config.weight_decay = LR, WEIGHT_DECAY
  config.adam_b1, config.adam_b2, config.adam_eps = B1, B2, EPS
  config.warmup_steps, config.total_steps = WARMUP_STEPS, TOTAL_STEPS
  config.warmup_ratio, config.end_learning_rate_ratio = 0.0, 0.0
  config.grad_clip_norm, config.grad_accum_steps = GRAD_CLIP, 1
  assert tt.VOCAB_SIZE == VOCAB, tt.VOCAB_SIZE
  model_cfg = ModelConfig.from_config(config.model, VOCAB, MASK_ID)
  return config, model_cfg


def peer_inputs(ids, counts, seed: int):
  """Host-side BERT masking of `ids` with ours' per-row counts: K selected
  maskable positions, of which num_mask -> [MASK], num_random -> a random id,
  num_keep unchanged; labels = the original id there, -100 elsewhere."""
  import numpy as np
  from maelm_jax.data.tokenizer import MASK_ID, NUM_SPECIAL
  rng = np.random.RandomState(seed + 1)
  inputs = ids.copy()
  labels = np.full(ids.shape, -100, np.int32)
  for row in range(ids.shape[0]):
    candidates = np.flatnonzero(ids[row] >= NUM_SPECIAL)
    chosen = rng.permutation(candidates)[:counts.num_selected]
    labels[row, chosen] = ids[row, chosen]
    masked = chosen[:counts.num_mask]
    randomised = chosen[counts.num_mask:counts.num_mask + counts.num_random]
    inputs[row, masked] = MASK_ID
    inputs[row, randomised] = rng.randint(NUM_SPECIAL, VOCAB, len(randomised))
  return inputs.astype(np.int32), labels


def peer_flops_per_step(model_cfg) -> int:
  """`flops.train_flops_per_step` with the head on all L positions (K = L)."""
  from maelm_jax.modeling import flops
  parts = flops.forward_flops_per_sequence(model_cfg, SEQ_LEN)
  parts["head"] = 2 * SEQ_LEN * (model_cfg.hidden ** 2 + model_cfg.hidden * VOCAB)
  return 3 * BATCH * sum(parts.values())


class Worker:
  """The parent's handle on one worker subprocess."""

  def __init__(self, impl, dtype, dropout, python, inputs_path, seed, log_dir):
    self.impl, self.dtype = impl, dtype
    self.log_path = pathlib.Path(log_dir) / f"{impl}_{dtype}_dropout{dropout:g}.log"
    self.log = open(self.log_path, "w")
    env = dict(os.environ, JAX_PLATFORMS="cpu", TF_CPP_MIN_LOG_LEVEL="2",
               TRANSFORMERS_VERBOSITY="error", TOKENIZERS_PARALLELISM="false",
               PYTHONUNBUFFERED="1")
    self.command = [python, str(pathlib.Path(__file__).resolve()), "--worker", impl,
                    "--dtype", dtype, "--dropout", repr(dropout),
                    "--inputs", str(inputs_path), "--seed", str(seed)]
    self.proc = subprocess.Popen(self.command, stdin=subprocess.PIPE,
                                 stdout=subprocess.PIPE, stderr=self.log, text=True,
                                 cwd=REPO, env=env)
    self.info = None
    self.windows = []  # dicts: seconds, cpu_s, loss, others_cores, round

  def _read(self) -> dict:
    line = self.proc.stdout.readline()
    if not line:
      self.proc.wait()
      self.log.flush()
      tail = self.log_path.read_text()[-3000:]
      raise RuntimeError(f"{self.impl}/{self.dtype} worker exited "
                         f"(rc={self.proc.returncode}); its log "
                         f"{self.log_path} ends:\n{tail}")
    reply = json.loads(line)
    if "error" in reply:
      raise RuntimeError(f"{self.impl}/{self.dtype}: {reply['error']}")
    return reply

  def wait_ready(self) -> dict:
    self.info = self._read()
    return self.info

  def run(self, steps: int) -> dict:
    self.proc.stdin.write(f"run {steps}\n")
    self.proc.stdin.flush()
    return self._read()

  def close(self):
    if self.proc.poll() is None:
      try:
        self.proc.stdin.write("quit\n")
        self.proc.stdin.flush()
        self.proc.wait(timeout=30)
      except (OSError, subprocess.TimeoutExpired):
        self.proc.kill()
        self.proc.wait()
    self.log.close()


def _busy_seconds():
  """Busy CPU seconds of the whole machine so far (/proc/stat), or None."""
  sys.path.insert(0, str(REPO / "benchmarks"))
  import train_throughput as tt
  sample = tt.CpuMeter._sample()
  return None if sample is None else sample[1]


def timed_window(worker: Worker, steps: int) -> dict:
  busy0 = _busy_seconds()
  t0 = time.perf_counter()
  reply = worker.run(steps)
  wall = time.perf_counter() - t0
  busy1 = _busy_seconds()
  if busy0 is not None and busy1 is not None and wall > 0:
    # Cores busy with anything but the worker (the parent is asleep meanwhile).
    reply["others_cores"] = max(busy1 - busy0 - reply["cpu_s"], 0.0) / wall
  return reply


def race_cell(args, dtype, dropout, inputs_path, log_dir, model_cfg, flops_by_impl):
  """One table: every implementation at `dtype` and `dropout`."""
  label = f"{dtype}, dropout {dropout:g}"
  pythons = {"ours": sys.executable, "flax": args.peer_python,
             "torch": args.peer_python}
  workers = []
  try:
    for impl in args.impls:
      workers.append(Worker(impl, dtype, dropout, pythons[impl], inputs_path, args.seed,
                            log_dir))
    for w in workers:  # they build and compile concurrently; nothing is timed yet
      info = w.wait_ready()
      print(f"  [{label}] {w.impl:5s} ready: built+compiled in {info['build_s']:.1f}s "
            f"(compile {info['compile_s']:.1f}s), first step "
            f"{info['first_step_s']:.2f}s, {info['params']:,} params, "
            f"loss {info['loss']:.3f}", flush=True)
    for w in workers:  # warm-up, one worker at a time, as the rounds run
      if args.warmup_steps:
        reply = w.run(args.warmup_steps)
        print(f"  [{label}] {w.impl:5s} warm-up {args.warmup_steps} steps "
              f"{reply['seconds']:.2f}s", flush=True)
    for rnd in range(args.rounds):
      order = workers[rnd % len(workers):] + workers[:rnd % len(workers)]
      for w in order:
        if args.gap_s:
          time.sleep(args.gap_s)  # let the previous worker's threads go idle
        reply = timed_window(w, args.steps_per_round)
        reply["round"] = rnd
        w.windows.append(reply)
      print(f"  [{label}] round {rnd + 1}/{args.rounds}: " + ", ".join(
          f"{w.impl} {BATCH * SEQ_LEN * args.steps_per_round / w.windows[-1]['seconds']:,.0f}"
          for w in workers) + " tokens/s", flush=True)
  finally:
    for w in workers:
      w.close()
  rows = summarize(args, dtype, workers, flops_by_impl)
  for r in rows:
    r["dropout"] = dropout
  return rows


def summarize(args, dtype, workers, flops_by_impl):
  tokens = BATCH * SEQ_LEN * args.steps_per_round
  rows = []
  for w in workers:
    tps = [tokens / win["seconds"] for win in w.windows]
    step_s = statistics.median(win["seconds"] for win in w.windows) / args.steps_per_round
    others = [win["others_cores"] for win in w.windows if "others_cores" in win]
    rows.append(dict(
        impl=w.impl, dtype=dtype, params=w.info["params"],
        param_groups=w.info["param_groups"], tokens_per_s=statistics.median(tps),
        tokens_per_s_all=tps, spread=(max(tps) - min(tps)) / statistics.median(tps),
        step_s=step_s, model_flops=flops_by_impl[w.impl],
        gflops_per_s=flops_by_impl[w.impl] / step_s / 1e9,
        compile_s=w.info["compile_s"], build_s=w.info["build_s"],
        first_step_s=w.info["first_step_s"],
        others_cores=statistics.median(others) if others else None,
        last_loss=w.windows[-1]["loss"], windows=w.windows,
        info={k: v for k, v in w.info.items() if k not in ("param_groups",)}))
  flax = next((r for r in rows if r["impl"] == "flax"), None)
  for r in rows:
    if flax:
      r["ratio_vs_flax"] = r["tokens_per_s"] / flax["tokens_per_s"]
      paired = [a / b for a, b in zip(r["tokens_per_s_all"], flax["tokens_per_s_all"])]
      r["paired_ratio"] = statistics.median(paired)
      r["paired_ratio_range"] = (min(paired), max(paired))
  return rows


# ------------------------------------------------------------------ Reports --

def _cpu_model() -> str:
  try:
    with open("/proc/cpuinfo") as f:
      for line in f:
        if line.startswith("model name"):
          return line.split(":", 1)[1].strip()
  except OSError:
    pass
  return platform.processor() or "unknown"


def _cores() -> int:
  try:
    return len(os.sched_getaffinity(0))
  except AttributeError:
    return os.cpu_count() or 1


def _loadavg() -> str:
  try:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())
  except OSError:
    return "n/a"


def command_line() -> str:
  python = os.path.relpath(sys.executable, os.getcwd())
  if python.startswith("../.."):
    python = sys.executable
  script = os.path.relpath(os.path.abspath(sys.argv[0]), os.getcwd())
  return " ".join([shlex.quote(python), shlex.quote(script)] +
                  [shlex.quote(a) for a in sys.argv[1:]])


def param_comparison(rows) -> list[str]:
  by = {r["impl"]: r for r in rows}
  if "ours" not in by:
    return []
  ours = by["ours"]
  lines = []
  for impl in ("flax", "torch"):
    if impl not in by:
      continue
    peer = by[impl]
    diff = peer["params"] - ours["params"]
    parts = [f"{name} {peer['param_groups'][name] - ours['param_groups'].get(name, 0):+,}"
             for name in peer["param_groups"]
             if peer["param_groups"][name] != ours["param_groups"].get(name, 0)]
    lines.append(f"{LABELS[impl]} {peer['params']:,} = ours {ours['params']:,} "
                 f"{diff:+,} ({', '.join(parts) or 'no difference'})")
  groups = ", ".join(f"{k} {v:,}" for k, v in ours["param_groups"].items() if v)
  return [f"- Parameters: ours {ours['params']:,} ({groups}); " + "; ".join(lines) +
          ". Expected: RoBERTa's position table has one more row (row 0 = padding, "
          f"positions 1..{SEQ_LEN}: +{HIDDEN}) and a token-type table of one row "
          f"(+{HIDDEN}); no pooler in either masked-LM model; the LM head "
          "(dense, LayerNorm, vocab bias, decoder tied to the word embeddings) is the "
          "same."]


def format_table(rows, steps_per_round) -> str:
  head = ("| implementation | params | K (head positions) | tokens/s (median) | spread "
          "| step ms | vs Flax (medians) | vs Flax (per-round, median [min–max]) "
          "| model GFLOP/step | GFLOP/s | compile s | first step s | others' CPU (cores) "
          "| loss (last) |")
  sep = "|---|" + "--:|" * 13
  lines = [head, sep]
  for r in rows:
    k = r["info"].get("num_selected", SEQ_LEN) if r["impl"] == "ours" else SEQ_LEN
    ratio = f"{r['ratio_vs_flax']:.2f}x" if "ratio_vs_flax" in r else "-"
    paired = (f"{r['paired_ratio']:.2f}x [{r['paired_ratio_range'][0]:.2f}–"
              f"{r['paired_ratio_range'][1]:.2f}]" if "paired_ratio" in r else "-")
    others = "-" if r["others_cores"] is None else f"{r['others_cores']:.2f}"
    compile_s = "eager" if r["impl"] == "torch" else f"{r['compile_s']:.1f}"
    lines.append(
        f"| {LABELS[r['impl']]} | {r['params']:,} | {k} | {r['tokens_per_s']:,.0f} "
        f"| {r['spread']:.0%} | {r['step_s'] * 1e3:,.0f} | {ratio} | {paired} "
        f"| {r['model_flops'] / 1e9:,.1f} | {r['gflops_per_s']:,.1f} | {compile_s} "
        f"| {r['first_step_s']:.2f} | {others} | {r['last_loss']:.3f} |")
  return "\n".join(lines)


def format_section(args, tables, versions, started, total_s, load_before, load_after,
                   model_cfg, flops_by_impl, extra) -> str:
  counts = model_cfg.mask_counts(SEQ_LEN)
  out = [
      "## Peer race: ours `mlm` vs Hugging Face RoBERTa (Flax, PyTorch)",
      "",
      f"- Date: {started.strftime('%Y-%m-%d %H:%M %Z').strip()} "
      f"(total run time {total_s / 60:.1f} min)",
      f"- Machine: {_cpu_model()}, {_cores()} cores; Python {platform.python_version()}",
      "- Versions: " + "; ".join(
          f"{impl}: " + ", ".join(f"{k} {v}" for k, v in ver.items())
          for impl, ver in versions.items()),
      f"- Load average (1/5/15 min) before: {load_before}; after: {load_after}",
      f"- Command (from the repository root): `{command_line()}`",
      f"- Settings: rounds={args.rounds}, steps_per_round={args.steps_per_round}, "
      f"warmup_steps={args.warmup_steps} (after compile + 1 step), seed={args.seed}; "
      f"peer python `{args.peer_python}`",
  ]
  if args.note:
    out.append(f"- Note: {args.note}")
  out += [
      "",
      f"Configuration, identical in all three: hidden {HIDDEN}, {LAYERS} layers, "
      f"{HEADS} heads, FFN {MLP}, vocab {VOCAB}, batch {BATCH} x {SEQ_LEN} "
      f"({BATCH * SEQ_LEN} tokens/step, all counted in tokens/s), post-LN, absolute "
      "positions (ours: relative position bias off), tied embeddings, exact GELU, "
      f"LayerNorm eps {LAYER_NORM_EPS}, dropout as each table's heading says (hidden "
      "and attention; none inside the FFN, as RoBERTa), "
      f"{counts.num_selected} of the {SEQ_LEN - 2} maskable positions selected per row "
      f"({counts.num_mask} [MASK], {counts.num_random} random, {counts.num_keep} kept; "
      f"{MASK_RATIO:.0%} with 80/10/10), AdamW lr {LR:g} (warm-up {WARMUP_STEPS}, "
      f"linear decay to 0 at {TOTAL_STEPS}), weight decay {WEIGHT_DECAY} (not on "
      f"biases / LayerNorm scales), betas {B1}/{B2}, eps {EPS:g}, global-norm "
      f"clipping {GRAD_CLIP}. Random `[CLS] w.. [SEP]` rows, the same for all three. "
      "**Ours masks inside its jitted step at every step, as it always does; the peers "
      "get host-side masked inputs and labels prepared once before timing.** "
      "bfloat16: ours and Flax keep float32 parameters and run matmuls in bf16; "
      "PyTorch runs under `torch.autocast('cpu', torch.bfloat16)` (float32 weights).",
      "",
      "Model FLOPs: `maelm_jax/modeling/flops.py` `train_flops_per_step` (matmuls only, "
      "2 FLOPs per multiply-add, training = 3 x forward): per sequence "
      f"{LAYERS} x [2L(4d²+2df) + 4L²d] + head 2K(d² + dV), L={SEQ_LEN}, d={HIDDEN}, "
      f"f={MLP}, V={VOCAB}. Ours: K={counts.num_selected} (its head runs on the "
      f"selected positions), {flops_by_impl['ours'] / 1e9:.1f} GFLOP/step; the peers: "
      f"the same formula with K={SEQ_LEN} (logits at every position), "
      f"{flops_by_impl['flax'] / 1e9:.1f} GFLOP/step "
      f"({flops_by_impl['flax'] / flops_by_impl['ours']:.2f}x ours). Not counted: "
      "embedding gathers and their gradients, softmax, LayerNorm, the optimizer.",
      "",
      "Timing: each implementation in its own long-lived worker process; after "
      "compile, one step and the warm-up, every round asks each worker in turn "
      "(order rotated per round) to run the steps of one window and report its wall "
      "time (JAX: ended by `block_until_ready` on state and loss; PyTorch: "
      "synchronous, loss read with `.item()`). tokens/s: median over rounds; spread: "
      "(max-min)/median; step ms: median window / steps; vs Flax (medians): ratio of "
      "the median tokens/s; vs Flax (per-round): median [min–max] of the ratio of "
      "the windows of the same round; others' CPU: median over windows of the cores "
      "busy with anything but the timed worker (/proc/stat minus the worker's CPU "
      "time), above 0 means the machine was shared while timing.",
  ]
  for line in extra:
    out.append(line)
  for label, rows in tables:
    dtype, dropout = rows[0]["dtype"], rows[0]["dropout"]
    out += ["", f"### {label}", ""]
    out += param_comparison(rows)
    torch_row = next((r for r in rows if r["impl"] == "torch"), None)
    if torch_row:
      i = torch_row["info"]
      out.append(f"- PyTorch: {i.get('threads')} threads, attention "
                 f"`{i.get('attention')}`, AdamW {i.get('adamw')}, bf16 "
                 f"{'autocast' if dtype == 'bfloat16' else 'n/a'}")
    ours_row = next((r for r in rows if r["impl"] == "ours"), None)
    if ours_row:
      out.append(f"- Ours: attention `{ours_row['info'].get('attention')}` (einsum"
                 + ("; attention dropout active)" if dropout else ")"))
    out += ["", format_table(rows, args.steps_per_round)]
  return "\n".join(out) + "\n"


DIFFERENCES = [
    "",
    "Differences that remain (not removable without changing a library or the model):",
    "",
    "- Ours' LM head (dense, GELU, LayerNorm, vocabulary projection) runs on the "
    "K selected positions only; the peers compute logits at every position, as "
    "Hugging Face does. This is the point of the comparison.",
    "- Ours draws new masks inside its jitted step every step (argsort of "
    "random scores, gathers); the peers reuse one host-side masked batch.",
    "- At dropout > 0, HF's Flax RoBERTa draws one attention-dropout mask for "
    "every row and head (flax `dot_product_attention_weights(broadcast_dropout="
    "True)`): L x L random numbers per layer, against B x H x L x L in ours and in "
    "PyTorch (independent masks, as BERT). On XLA:CPU random bits are expensive, so "
    "this favours the Flax peer; the dropout-0 tables have no random bits at all.",
    "- Ours' step also guards against non-finite loss/gradients (a select over "
    "params and optimizer state) and computes accuracy and grad-norm metrics; the "
    "peers return the loss only.",
    "- Ours' attention scores and softmax are float32 in bf16 (einsum with "
    "float32 accumulation); the HF Flax model computes attention in its dtype; "
    "PyTorch autocast decides per op (SDPA).",
    "- RoBERTa's embeddings add a token-type row (1 x hidden) and number "
    "positions from 1 (one more table row); ours adds a padding bias per layer "
    "from `input_ids != 0`, the peers an all-ones attention_mask.",
    "- PyTorch runs eagerly (no torch.compile); its AdamW is the default "
    "implementation for CPU tensors.",
]


def parse_args(argv=None):
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                              formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--dtypes", default="float32,bfloat16",
                 help="comma-separated: float32, bfloat16 (one table each)")
  p.add_argument("--dropouts", default="0.1,0",
                 help="comma-separated hidden and attention dropout rates, one table "
                      "each (default 0.1,0)")
  p.add_argument("--impls", default=",".join(IMPLS),
                 help=f"comma-separated subset of {IMPLS}")
  p.add_argument("--rounds", type=int, default=8, help="timed rounds (default 8)")
  p.add_argument("--steps_per_round", type=int, default=4,
                 help="steps per timed window (default 4)")
  p.add_argument("--warmup_steps", type=int, default=3,
                 help="untimed steps per worker after compile + 1 step (default 3)")
  p.add_argument("--gap_s", type=float, default=0.2,
                 help="pause before each window, so the previous worker's threads "
                      "stop spinning (default 0.2)")
  p.add_argument("--peer_python", default=DEFAULT_PEER_PYTHON,
                 help="python of the peers' venv (benchmarks/peer_venv.sh)")
  p.add_argument("--seed", type=int, default=0)
  p.add_argument("--note", default="", help="free text under the machine line")
  p.add_argument("--out", default="",
                 help="markdown file to append the section to (default: print only)")
  p.add_argument("--json", default="", help="also dump raw timings to this file")
  # Internal: run as a worker.
  p.add_argument("--worker", choices=IMPLS, help=argparse.SUPPRESS)
  p.add_argument("--dtype", default="float32", help=argparse.SUPPRESS)
  p.add_argument("--dropout", type=float, default=DROPOUT, help=argparse.SUPPRESS)
  p.add_argument("--inputs", default="", help=argparse.SUPPRESS)
  args = p.parse_args(argv)
  if args.worker:
    return args
  args.dtypes = [d for d in args.dtypes.split(",") if d]
  try:
    args.dropouts = [float(d) for d in args.dropouts.split(",") if d]
  except ValueError:
    p.error(f"--dropouts: {args.dropouts!r} is not a comma-separated list of rates")
  if not args.dropouts or not all(0.0 <= d < 1.0 for d in args.dropouts):
    p.error(f"--dropouts: {args.dropouts} must be rates in [0, 1)")
  args.impls = [i for i in args.impls.split(",") if i]
  for d in args.dtypes:
    if d not in ("float32", "bfloat16"):
      p.error(f"--dtypes: {d!r} is not float32 or bfloat16")
  for i in args.impls:
    if i not in IMPLS:
      p.error(f"--impls: {i!r} is not one of {IMPLS}")
  if args.rounds < 1 or args.steps_per_round < 1 or args.warmup_steps < 0:
    p.error("--rounds and --steps_per_round must be >= 1, --warmup_steps >= 0")
  if {"flax", "torch"} & set(args.impls) and not os.path.exists(args.peer_python):
    p.error(f"--peer_python {args.peer_python} does not exist; create it with "
            "benchmarks/peer_venv.sh")
  return args


def main(argv=None) -> int:
  args = parse_args(argv)
  if args.worker:
    return worker_main(args)
  import numpy as np
  sys.path.insert(0, str(REPO / "benchmarks"))
  import train_throughput as tt  # noqa: E402

  started = datetime.datetime.now(datetime.timezone.utc)
  t_start = time.perf_counter()
  load_before = _loadavg()
  print(f"{_cpu_model()} ({_cores()} cores); load average {load_before}", flush=True)

  _, model_cfg = ours_config("float32")
  counts = model_cfg.mask_counts(SEQ_LEN)
  from maelm_jax.modeling import flops
  flops_by_impl = {"ours": flops.train_flops_per_step(model_cfg, SEQ_LEN, BATCH),
                   "flax": peer_flops_per_step(model_cfg),
                   "torch": peer_flops_per_step(model_cfg)}
  ids = tt.random_batch(BATCH, SEQ_LEN, args.seed)
  peer_ids, peer_labels = peer_inputs(ids, counts, args.seed)
  tables, versions = [], {}
  with tempfile.TemporaryDirectory(prefix="peer_race_") as tmp:
    inputs_path = pathlib.Path(tmp) / "inputs.npz"
    np.savez(inputs_path, input_ids=ids, peer_input_ids=peer_ids,
             peer_labels=peer_labels)
    for dtype in args.dtypes:
      for dropout in args.dropouts:
        rows = race_cell(args, dtype, dropout, inputs_path, tmp, model_cfg,
                         flops_by_impl)
        tables.append((f"{dtype}, dropout {dropout:g}", rows))
      for r in rows:
        versions.setdefault(r["impl"], r["info"]["versions"])
  total_s = time.perf_counter() - t_start
  section = format_section(args, tables, versions, started, total_s, load_before,
                           _loadavg(), model_cfg, flops_by_impl, DIFFERENCES)
  print()
  print(section)
  if args.out:
    path = pathlib.Path(args.out)
    if not path.is_absolute():
      path = REPO / path
    path.parent.mkdir(parents=True, exist_ok=True)
    text = path.read_text() if path.exists() else ""
    gap = ("" if not text or text.endswith("\n\n") else
           "\n" if text.endswith("\n") else "\n\n")
    with open(path, "a") as f:
      f.write(gap + section)
    print(f"appended to {path}")
  if args.json:
    with open(args.json, "w") as f:
      json.dump({"command": command_line(), "date": started.isoformat(),
                 "machine": {"cpu": _cpu_model(), "cores": _cores()},
                 "load_before": load_before, "load_after": _loadavg(),
                 "total_s": total_s, "flops_per_step": flops_by_impl,
                 "tables": dict(tables)}, f, indent=2, default=str)
  print(f"total {total_s / 60:.1f} min")
  return 0


if __name__ == "__main__":
  sys.exit(main())
