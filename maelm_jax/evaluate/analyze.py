r"""Effective rank of an encoder's token representations, layer by layer.

  python -m maelm_jax.evaluate.analyze --workdir=runs/mlm,runs/maelm --out=runs/rank \
      [--source='text:/data/*.txt'] [--num_tokens=4096] [--step=N]

MAE-LM (Meng et al., ICLR 2024) argues that an MLM encoder spends dimensions on
[MASK] tokens, so the representations of real tokens have a lower effective rank
than MAE-LM's, whose encoder never sees [MASK]. This measures it on checkpoints.

Text: the first rows of the held-out ("eval") split of --source (default: the
first workdir's own `data.source`), in corpus order, packed into rows of
--seq_len tokens by the pretraining pipeline; each workdir tokenizes the text
with its own tokenizer. Input kinds ([UNK] counts as a real token):

  real               the text as is: every position but [CLS]/[SEP]/[PAD]
  masked_text_real   the text with 15% (rounded) of each row's real tokens
                     replaced by [MASK] (fixed seed): the positions that kept
                     a real token
  masked_text_mask   the same input: its [MASK] positions (an MAE-LM encoder
                     never saw [MASK] in pretraining)

Each kind is exactly --num_tokens positions (N, drawn with a fixed seed), the
same positions at every layer. Layers (`layers` in rank.json), by index:

  0  embed     the input to the first transformer layer: token + absolute
               position embedding (post-LN: after the input LayerNorm; the
               relative position bias acts inside attention, not here)
  i  layer_i   the output of transformer layer i (1-based)
  L+1 final_ln pre-LN only: the final LayerNorm (what fine-tuning reads; for
               post-LN that is layer_L)

Definitions, on the N x D matrix centred over its N rows, singular values s
(a matrix of identical rows has rank 0 under both):

  entropy  Roy & Vetterli (2007): exp(H(p)), p_i = s_i / sum(s), H = -sum p log p
  pca90    the fewest principal components explaining >= 90% of sum(s^2)
           (r equal singular values: ceil(0.9 r))

Writes `--out/rank.json` ({"runs": {workdir: {objective, step, layers,
num_tokens, rank: {kind: {definition: [value per layer]}}}}, beside source,
seq_len, num_tokens, definitions and the command) and
`--out/effective_rank.png`, and prints a table.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os

from absl import flags
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from maelm_jax.run import pretrained as pretrained_lib
from maelm_jax.core import cli, storage
from maelm_jax.core import workdir as workdir_lib
from maelm_jax.modeling import model as model_lib
from maelm_jax.data import pipeline, sources
from maelm_jax.data import tokenizer as tokenizer_lib

KINDS = ("real", "masked_text_real", "masked_text_mask")
DEFINITIONS = {
    "entropy": "exp of the entropy of the normalised singular values of the "
               "centred N x D matrix (Roy & Vetterli 2007)",
    "pca90": "fewest principal components explaining >= 90% of the variance"}
MASK_RATIO = 0.15
SEED = 0
# [UNK] stands for real text, so only these are not "real tokens".
NOT_REAL = (tokenizer_lib.PAD_ID, tokenizer_lib.CLS_ID, tokenizer_lib.SEP_ID,
            tokenizer_lib.MASK_ID)
RESULTS_FILE, PLOT_FILE = "rank.json", "effective_rank.png"


def _singular_values(x) -> np.ndarray:
  x = np.asarray(x, np.float64)
  return np.linalg.svd(x - x.mean(axis=0), compute_uv=False)


def effective_rank_entropy(x) -> float:
  """Roy & Vetterli's effective rank of [N, D] `x`, centred; 0 if constant."""
  s = _singular_values(x)
  if s.sum() == 0:
    return 0.0
  p = s[s > 0] / s.sum()
  return float(np.exp(-(p * np.log(p)).sum()))


def pca_rank(x, fraction: float = 0.9) -> int:
  """The fewest principal components of [N, D] `x` (centred) explaining
  `fraction` of its variance; 0 if constant."""
  variance = _singular_values(x) ** 2
  if variance.sum() == 0:
    return 0
  explained = np.cumsum(variance) / variance.sum()
  # The tolerance keeps e.g. 9 of 10 equal components at exactly 90%.
  return int(np.searchsorted(explained, fraction - 1e-9) + 1)


def layer_names(model_cfg: model_lib.ModelConfig) -> list[str]:
  names = ["embed"] + [f"layer_{i + 1}" for i in range(model_cfg.num_layers)]
  return names + (["final_ln"] if model_cfg.ln_type == "pre" else [])


def _capture(module, method_name) -> bool:
  # The Stack's own Dropout (the identity at inference) returns exactly the input
  # of its first layer, so model.py needs no hook for layer 0.
  return method_name == "__call__" and (
      isinstance(module, model_lib.TransformerLayer) or
      (isinstance(module, nn.Dropout) and isinstance(module.parent, model_lib.Stack)))


@functools.lru_cache(maxsize=4)
def _jitted_forward(model_cfg: model_lib.ModelConfig):
  """ids [B, L] -> float32 [len(layer_names), B, L, D]."""
  encoder = model_lib.Encoder(model_cfg)

  def forward(params, input_ids):
    out, state = encoder.apply({"params": params}, input_ids,
                               capture_intermediates=_capture,
                               mutable=["intermediates"])
    captured = {name: value["__call__"][0]
                for name, value in state["intermediates"]["encoder"].items()}
    layers = [captured.pop(f"layer_{i}") for i in range(model_cfg.num_layers)]
    (embed,) = captured.values()  # The Dropout, whatever flax names it.
    return jnp.stack([embed] + layers + ([out] if model_cfg.ln_type == "pre" else []))
  return jax.jit(forward)


def layer_representations(model_cfg, params, input_ids, positions: dict,
                          batch_size: int = 32) -> dict[str, np.ndarray]:
  """Every layer's vectors at some positions, one encoder pass per batch.

  Args:
    model_cfg: the encoder's `ModelConfig` (run in float32 here).
    params: `{token_embed, encoder}`.
    input_ids: int [R, L] rows.
    positions: name -> (rows, cols), int arrays of the same length N.
    batch_size: rows per forward pass.

  Returns:
    name -> float32 [len(layer_names(model_cfg)), N, D].
  """
  cfg = dataclasses.replace(model_cfg, dtype=jnp.float32, remat=False,
                            remat_policy="none", attention_impl="xla")
  forward, params = _jitted_forward(cfg), jax.device_put(params)
  ids = np.asarray(input_ids, np.int32)
  # [PAD] rows fill the last batch (one compiled shape); nothing reads them.
  ids = np.concatenate([ids, np.zeros((-len(ids) % batch_size, ids.shape[1]),
                                      np.int32)])
  out = {name: np.zeros((len(layer_names(cfg)), len(rows), cfg.hidden), np.float32)
         for name, (rows, _) in positions.items()}
  for start in range(0, len(input_ids), batch_size):
    hidden = np.asarray(forward(params, ids[start:start + batch_size]))
    for name, (rows, cols) in positions.items():
      here = (rows >= start) & (rows < start + batch_size)
      out[name][:, here] = hidden[:, rows[here] - start, cols[here]]
  return out


def is_real(ids) -> np.ndarray:
  return ~np.isin(ids, NOT_REAL)


def _num_masked(num_real: int) -> int:
  return min(num_real, max(1, int(MASK_RATIO * num_real + 0.5)))


def mask_text(input_ids, seed: int = SEED) -> np.ndarray:
  """Replaces 15% (rounded, at least one) of each row's real tokens by [MASK]."""
  rng = np.random.default_rng(seed)
  masked = np.array(input_ids)
  for row in masked:
    real = np.flatnonzero(is_real(row))
    row[rng.choice(real, _num_masked(len(real)), replace=False)] = tokenizer_lib.MASK_ID
  return masked


def sample_positions(candidates, num: int, seed: int):
  """Exactly `num` of the True positions of [R, L] `candidates`: (rows, cols)."""
  rows, cols = np.nonzero(candidates)
  pick = np.sort(np.random.default_rng(seed).choice(len(rows), num, replace=False))
  return rows[pick], cols[pick]


def read_rows(source, tokenizer, seq_len: int, num_tokens: int) -> np.ndarray:
  """The first packed rows of `source` that hold `num_tokens` [MASK] slots."""
  dataset = pipeline.make_pretrain_dataset(source, tokenizer, seq_len=seq_len,
                                           batch_size=1, seed=SEED, shuffle=False,
                                           repeat=False)
  rows, num_masked = [], 0
  for batch in dataset:
    rows.append(batch["input_ids"][0])
    num_masked += _num_masked(int(is_real(rows[-1]).sum()))
    if num_masked >= num_tokens:
      return np.stack(rows)
  raise ValueError(
      f"{source!r} gives {len(rows)} rows of {seq_len} tokens with {num_masked} "
      f"[MASK] positions at {MASK_RATIO:.0%}, fewer than --num_tokens={num_tokens}; "
      "lower --num_tokens (keep it >= the hidden size) or give more text (--source)")


def _load(path: str, step: int | None) -> pretrained_lib.Pretrained:
  """Tokenizer, config and encoder parameters of a pretraining workdir."""
  path = pretrained_lib.check_pretraining_workdir(path, step)
  return pretrained_lib.load_pretrained(path, encoder_only=True, step=step,
                                    scan_layers=False)  # Per-layer outputs.


def _ranks(run: pretrained_lib.Pretrained, rows, num_tokens: int, batch_size: int) -> dict:
  masked = mask_text(rows)
  reps = layer_representations(
      run.model_cfg, run.params, rows,
      {"real": sample_positions(is_real(rows), num_tokens, SEED + 1)}, batch_size)
  reps.update(layer_representations(
      run.model_cfg, run.params, masked,
      {"masked_text_real": sample_positions(is_real(masked), num_tokens, SEED + 2),
       "masked_text_mask": sample_positions(masked == tokenizer_lib.MASK_ID,
                                            num_tokens, SEED + 3)}, batch_size))
  return {"objective": run.config.model.objective, "step": run.step,
          "layers": layer_names(run.model_cfg), "num_tokens": num_tokens,
          "rank": {kind: {"entropy": [effective_rank_entropy(x) for x in reps[kind]],
                          "pca90": [pca_rank(x) for x in reps[kind]]}
                   for kind in KINDS}}


def heldout_text(data, source: str = ""):
  """The held-out split of `source` (default: the run's `data.source`) as text, as
  a run's `data` config splits it."""
  return sources.open_source(source or data.source, sources.EVAL,
                             eval_fraction=data.eval_fraction, text_field=data.text_field,
                             tfds_data_dir=data.tfds_data_dir or None,
                             on_bad_text=data.on_bad_text).as_text()


def analyze(workdirs, out: str, *, source: str = "", num_tokens: int = 4096,
            step: int | None = None, batch_size: int = 32, seq_len: int | None = None,
            command: str = "", overwrite: bool = False) -> dict:
  """Writes `out/rank.json` and `out/effective_rank.png` (refusing an `out` that
  holds earlier results, unless `overwrite`); returns the former."""
  if not workdirs or num_tokens < 1 or batch_size < 1:
    raise ValueError("--workdir needs a pretraining workdir, --num_tokens and "
                     "--batch_size a positive number")
  workdir_lib.check_results_out(out, RESULTS_FILE, overwrite)
  paths = [storage.absolute(w) for w in workdirs]  # gs:// too (storage.py).
  if len(set(paths)) < len(paths):
    raise ValueError(f"--workdir names a workdir twice: {workdirs}")
  runs = [_load(path, step) for path in paths]
  data = runs[0].config.data
  seq_len = seq_len or runs[0].config.seq_len
  for path, run in zip(paths, runs):  # Every check before the first compilation.
    if num_tokens < run.model_cfg.hidden:
      raise ValueError(f"--num_tokens={num_tokens} is below the hidden size "
                       f"{run.model_cfg.hidden} of {path}, which no rank could "
                       f"reach; use --num_tokens >= {run.model_cfg.hidden}")
    if seq_len > run.model_cfg.max_positions:
      raise ValueError(f"--seq_len={seq_len} exceeds the {run.model_cfg.max_positions}"
                       f" positions of {path}; lower --seq_len")
  source = source or data.source
  text = heldout_text(data, source)  # Each run tokenizes with its own tokenizer.
  rows = [read_rows(text, run.tokenizer, seq_len, num_tokens) for run in runs]
  results = {"source": f"{source} (held-out split)", "seq_len": seq_len,
             "num_tokens": num_tokens, "definitions": DEFINITIONS,
             "layers": "0 embed: input of the first layer (post-LN: after the "
                       "input LayerNorm); i: output of layer i; final_ln (pre-LN): "
                       "the final LayerNorm", "command": command,
             "runs": {path: _ranks(run, run_rows, num_tokens, batch_size)
                      for path, run, run_rows in zip(paths, runs, rows)}}
  os.makedirs(out, exist_ok=True)
  with open(os.path.join(out, RESULTS_FILE), "w") as f:
    json.dump(results, f, indent=2)
  plot_ranks(results, os.path.join(out, PLOT_FILE))
  return results


def _label(path: str, run: dict) -> str:
  """The objective, step and the workdir's last two path parts (runs are often
  all called pretrain_<objective> in different folders)."""
  where = os.path.join(*os.path.normpath(path).split(os.sep)[-2:])
  return f"{run['objective']} step {run['step']} ({where})"


def plot_ranks(results: dict, path: str) -> None:
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use("Agg")
  from matplotlib import pyplot as plt  # pylint: disable=g-import-not-at-top

  fig, axes = plt.subplots(1, 2, figsize=(11, 5))
  for color, (workdir, run) in enumerate(results["runs"].items()):
    for kind, style in zip(KINDS, ("-", "--", ":")):
      for ax, definition in zip(axes, DEFINITIONS):
        values = run["rank"][kind][definition]
        ax.plot(range(len(values)), values, "o" + style, color=f"C{color}",
                label=f"{_label(workdir, run)} {kind}")
  for ax, definition in zip(axes, ("entropy (exp H)", "pca90")):
    ax.set(xlabel="layer", ylabel=f"effective rank: {definition}")
    longest = max(results["runs"].values(), key=lambda r: len(r["layers"]))["layers"]
    ax.set_xticks(range(len(longest)), longest)
    ax.grid(alpha=0.3)
  handles, labels = axes[0].get_legend_handles_labels()
  fig.legend(handles, labels, loc="lower center", ncol=3, fontsize=7)
  fig.suptitle(f"{results['num_tokens']} tokens per kind and layer")
  # Room under the plots for the legend's rows.
  fig.tight_layout(rect=(0, 0.045 * -(-len(labels) // 3), 1, 1))
  fig.savefig(path, dpi=100)
  plt.close(fig)


def format_table(results: dict) -> str:
  lines = [f"effective rank of {results['num_tokens']} token vectors (centred)"]
  for workdir, run in results["runs"].items():
    lines += ["", _label(workdir, run),
              f"  {'kind':18}{'def':9}" + "".join(f"{n:>10}" for n in run["layers"])]
    for kind in KINDS:
      for definition, values in run["rank"][kind].items():
        lines.append(f"  {kind:18}{definition:9}"
                     + "".join(f"{v:>10.1f}" for v in values))
  return "\n".join(lines)


def _define_flags() -> None:
  flags.DEFINE_list("workdir", None, "Pretraining workdirs, comma-separated")
  flags.DEFINE_string("out", None, "Where rank.json and effective_rank.png go")
  flags.DEFINE_string("source", "", "Text (a data.source spec; its held-out split "
                      "is read). Default: the first workdir's own data.source")
  flags.DEFINE_integer("num_tokens", 4096, "Tokens per workdir, layer and kind")
  flags.DEFINE_integer("step", None, "Checkpoint step (default: each one's newest)")
  flags.DEFINE_integer("batch_size", 32, "Rows per forward pass")
  flags.DEFINE_integer("seq_len", None, "Row length (default: the first workdir's)")
  flags.DEFINE_bool("overwrite", False, "Replace the results already in --out")
  flags.mark_flags_as_required(["workdir", "out"])


def main():
  FLAGS = flags.FLAGS
  results = analyze(
      FLAGS.workdir, FLAGS.out, source=FLAGS.source,
      num_tokens=FLAGS.num_tokens, step=FLAGS.step, batch_size=FLAGS.batch_size,
      seq_len=FLAGS.seq_len, command=cli.command_line("maelm_jax.evaluate.analyze"),
      overwrite=FLAGS.overwrite)
  print(format_table(results))
  print(f"\n{os.path.join(os.path.abspath(FLAGS.out), RESULTS_FILE)}, {PLOT_FILE}")


# `python -m` and the maelm-analyze command (setup.py's console scripts).
console = cli.command(main, _define_flags)

if __name__ == "__main__":
  console()
