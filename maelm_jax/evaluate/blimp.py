r"""BLiMP: grammar knowledge of a pretrained encoder, scored without fine-tuning.

  python -m maelm_jax.evaluate.blimp --workdir=runs/run_mlm,runs/run_maelm \
      --data=<data>/blimp --out=runs/blimp

BLiMP (Warstadt et al., 2020) is a set of minimal pairs, a grammatical and an
ungrammatical sentence that differ in one place; a model knows the phenomenon
when it finds the grammatical one more likely. A masked LM has no sentence
probability, so each sentence is scored by its pseudo-log-likelihood (PLL,
Salazar et al., ACL 2020): every token is masked in turn and the log-probability
of the original token is summed. The model predicts exactly as it did in
pretraining: for MLM the token becomes `[MASK]` in the encoder input; for MAE-LM
and 3ML (`drop_masked`) it is *removed* from the encoder and predicted by the
decoder from the `[MASK]` embedding at its slot.

Two variants (--variant):
  word_l2r (default)  PLL-word-l2r (Kauf & Ivanova, 2023): when a token is
                      scored, the later pieces of the same word are masked too.
                      Plain PLL lets a multi-piece word predict its own pieces
                      from each other ("▁ir" + "regular"), so it rates sentences
                      with rare, many-piece words too high; an 8000-piece
                      vocabulary splits words often, so this matters here.
  token               the original PLL: one token masked at a time.

Speed: every masked copy of every sentence is one row of a batch; rows are
grouped by length bucket and by how many positions they mask, so each group has
a static shape and compiles once, and each batch is sharded over all devices.

Beside the encoders, a baseline from word statistics alone: an interpolated
bigram model of the pieces, counted on the first workdir's training text
(--ngram_tokens, 0 to skip).

Writes `<out>/blimp.json` (per workdir: accuracy per paradigm, per
`linguistics_term`, per `field`, and `mean`, the mean over paradigms, which is
how the literature reports BLiMP), `blimp.md` and `blimp.png` (one bar per term
for each workdir).
"""

from __future__ import annotations

import collections
from collections.abc import Sequence
import dataclasses
import functools
import glob
import json
import os
import statistics
import sys
import time

from absl import flags, logging
import jax
import jax.numpy as jnp
import numpy as np

from maelm_jax.run import pretrained as pretrained_lib
from maelm_jax.core import cli, progress as progress_lib, sharding, storage
from maelm_jax.core import workdir as workdir_lib
from maelm_jax.modeling import masking, model as model_lib
from maelm_jax.data import sources
from maelm_jax.data import tokenizer as tokenizer_lib

VARIANTS = ("word_l2r", "token")
DEFAULT_VARIANT = "word_l2r"
RESULTS_FILE = "blimp.json"
TABLE_FILE = "blimp.md"
PLOT_FILE = "blimp.png"
WORD_START = "\u2581"  # SentencePiece's word-boundary marker.
# All 67 paradigms (the BLiMP paper, Table 3), for scale.
REFERENCE_SCORES = {"5-gram": 61.2, "LSTM": 69.8, "Transformer-XL": 69.6,
                    "GPT-2": 81.5, "human": 88.6}


# --------------------------------------------------------------------------
# Data.
# --------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Pair:
  paradigm: str  # BLiMP's UID, e.g. "anaphor_gender_agreement".
  field: str  # "morphology", "syntax", "semantics", "syntax_semantics".
  term: str  # linguistics_term, e.g. "anaphor_agreement".
  good: str
  bad: str


def read_pairs(data_dir: str, max_pairs_per_paradigm: int = 0) -> list[Pair]:
  """Every pair of every `<UID>.jsonl` in `data_dir` (BLiMP's own files)."""
  files = sorted(glob.glob(os.path.join(data_dir, "*.jsonl")))
  if not files:
    raise FileNotFoundError(
        f"--data={data_dir} holds no BLiMP files (*.jsonl, one per paradigm, as "
        "BLiMP ships them); pass the folder that holds e.g. "
        "anaphor_gender_agreement.jsonl")
  pairs = []
  for path in files:
    with open(path, encoding="utf-8") as f:
      records = sources.json_records(path, f.read())
    for count, (where, row) in enumerate(records, 1):
      missing = [k for k in ("sentence_good", "sentence_bad") if k not in row]
      if missing:
        raise ValueError(f"{where} has no {missing}; a BLiMP pair needs "
                         "sentence_good and sentence_bad")
      paradigm = row.get("UID") or os.path.basename(path)[:-len(".jsonl")]
      pairs.append(Pair(paradigm, row.get("field", "unknown"),
                        row.get("linguistics_term", paradigm),
                        row["sentence_good"], row["sentence_bad"]))
      if count == max_pairs_per_paradigm:
        break
  return pairs


# --------------------------------------------------------------------------
# Masked copies.
# --------------------------------------------------------------------------


def sentence_ids(tokenizer: tokenizer_lib.Tokenizer, sentences: Sequence[str]
                 ) -> list[np.ndarray]:
  """`[CLS] pieces [SEP]` of each sentence, as the pretraining rows hold them."""
  return [np.asarray([tokenizer.cls_id, *ids, tokenizer.sep_id], np.int32)
          for ids in tokenizer.encode(list(sentences))]


def word_starts(tokenizer: tokenizer_lib.Tokenizer, ids: np.ndarray) -> np.ndarray:
  """bool per position: the piece begins a word (or is a special token)."""
  return tokenizer.word_starts(ids)


def masked_sets(starts: np.ndarray, variant: str) -> list[tuple[int, ...]]:
  """For each scored position i (1..n-2 of `[CLS] .. [SEP]`), the positions
  masked when it is predicted, i first: (i,) for `token`; for `word_l2r`, i
  and the later pieces of its word."""
  if variant not in VARIANTS:
    raise ValueError(f"--variant={variant!r} is unknown; use one of {VARIANTS}")
  length = len(starts)
  sets = []
  for i in range(1, length - 1):
    masked = [i]
    if variant == "word_l2r":
      j = i + 1
      while j < length - 1 and not starts[j]:
        masked.append(j)
        j += 1
    sets.append(tuple(masked))
  return sets


def bucket_length(n: int) -> int:
  """Padded row length: multiples of 8 up to 64, then powers of two (few
  compilations, little padding; BLiMP sentences are 6-30 pieces)."""
  if n <= 64:
    return max(8, -(-n // 8) * 8)
  return 1 << (n - 1).bit_length()


@dataclasses.dataclass
class _Group:
  """Masked copies of one static shape: row length and masked count."""
  ids: list = dataclasses.field(default_factory=list)  # [L] padded rows.
  masked: list = dataclasses.field(default_factory=list)  # [m] positions, i first.
  sentence: list = dataclasses.field(default_factory=list)  # Which sentence.


def build_copies(rows: Sequence[np.ndarray], starts: Sequence[np.ndarray],
                 variant: str, drop_masked: bool = True
                 ) -> dict[tuple[int, int], _Group]:
  """Every masked copy of every sentence, grouped by (row length, masked count).

  Without `drop_masked` (MLM) the masked count changes no shape the encoder
  sees, so one group per length holds every count, each masked set padded by
  repeating its first position (the same `[MASK]`s): fewer compilations.
  """
  groups: dict[tuple[int, int], _Group] = collections.defaultdict(_Group)
  for index, (ids, is_start) in enumerate(zip(rows, starts)):
    length = bucket_length(len(ids))
    padded = np.zeros(length, np.int32)
    padded[:len(ids)] = ids
    for masked in masked_sets(is_start, variant):
      group = groups[(length, len(masked) if drop_masked else 0)]
      group.ids.append(padded)
      group.masked.append(masked)
      group.sentence.append(index)
  if not drop_masked:
    for group in groups.values():
      width = max(len(m) for m in group.masked)
      group.masked = [m + (m[0],) * (width - len(m)) for m in group.masked]
  return dict(groups)


def copies_as_masks(ids: np.ndarray, masked: np.ndarray, drop_masked: bool,
                    mask_id: int) -> dict[str, np.ndarray]:
  """Numpy fields of `masking.Masks` for copies [B, L] masking [B, m] (column 0
  is the one position scored)."""
  batch, length = ids.shape
  rows = np.arange(batch)[:, None]
  selected = masked[:, :1]
  fields = {"selected_positions": selected.astype(np.int32),
            "selected_weights": np.ones((batch, 1), np.float32),
            "targets": ids[rows, selected].astype(np.int32),
            "masked_positions": np.sort(masked, axis=1).astype(np.int32)}
  if drop_masked:
    # The positions left: [CLS], the unmasked pieces, [SEP] and the padding,
    # which the encoder ignores ([PAD] keys are masked out of attention).
    keep = np.ones((batch, length), bool)
    keep[rows, masked] = False
    positions = np.nonzero(keep)[1].reshape(batch, length - masked.shape[1])
    fields["encoder_positions"] = positions.astype(np.int32)
    fields["encoder_ids"] = ids[rows, positions].astype(np.int32)
  else:
    corrupted = ids.copy()
    corrupted[rows, masked] = mask_id
    fields["encoder_positions"] = np.broadcast_to(
        np.arange(length, dtype=np.int32), (batch, length)).copy()
    fields["encoder_ids"] = corrupted.astype(np.int32)
  return fields


# --------------------------------------------------------------------------
# Scoring.
# --------------------------------------------------------------------------


@functools.lru_cache(maxsize=8)
def _log_prob_fn(model_cfg: model_lib.ModelConfig):
  """params, Masks -> float32 [B]: log p(target | copy) at the scored slot."""
  model = model_lib.MaskedLM(model_cfg, deterministic=True)

  def log_prob(params, masks):
    logits = model.apply({"params": params}, masks)[:, 0].astype(jnp.float32)
    return jnp.take_along_axis(jax.nn.log_softmax(logits, axis=-1),
                               masks.targets, axis=-1)[:, 0]
  return jax.jit(log_prob)


def pseudo_log_likelihoods(model_cfg: model_lib.ModelConfig, params, rows,
                           starts, *, variant: str = DEFAULT_VARIANT,
                           batch_size: int = 512, mesh=None,
                           progress: str = "") -> np.ndarray:
  """PLL (natural log) of each `[CLS] .. [SEP]` row; see the module docstring.

  Args:
    model_cfg: the pretraining model's config (objective, decoder, sizes).
    params: the full pretraining params (encoder, decoder, LM head).
    rows: int arrays `[CLS] pieces [SEP]`, one per sentence.
    starts: bool arrays, `word_starts` of each row.
    variant: "word_l2r" or "token".
    batch_size: masked copies per call (rounded up to the devices' multiple).
    mesh: copies are sharded over its ('data', 'fsdp') axes (default: every
      device on the data axis); params are replicated.
    progress: a name for progress lines (pairs done, pairs/s, ETA, counted by
      the masked copies scored); "" for none.
  """
  max_len = max(len(r) for r in rows)
  if bucket_length(max_len) > model_cfg.max_positions:
    raise ValueError(f"a sentence has {max_len} pieces with [CLS]/[SEP], more than "
                     f"the model's {model_cfg.max_positions} positions; leave such "
                     "sentences out of --data")
  mesh = mesh or sharding.make_mesh((-1, 1, 1))
  shards = sharding.data_parallel_size(mesh)
  batch_size = -(-batch_size // shards) * shards
  params = jax.device_put(params, sharding.replicated(mesh))
  copies_sharding = sharding.batch_sharding(mesh)
  log_prob = _log_prob_fn(model_cfg)
  totals = np.zeros(len(rows), np.float64)
  groups = build_copies(rows, starts, variant, model_cfg.drop_masked)
  copies, scored = sum(len(g.ids) for g in groups.values()), 0
  pairs = progress_lib.Progress(progress, total=len(rows) // 2, unit="pairs",
                                log=logging.info if progress else lambda _: None)
  for _, group in sorted(groups.items()):
    ids, masked = np.stack(group.ids), np.asarray(group.masked, np.int32)
    sentence = np.asarray(group.sentence)
    # Small groups get a batch just big enough (one compilation per size).
    size = min(batch_size, -(-len(ids) // shards) * shards)
    for start in range(0, len(ids), size):
      chunk = slice(start, start + size)
      real = len(ids[chunk])
      pad = size - real  # Repeat row 0 to the static size; its result is dropped.
      fields = copies_as_masks(np.concatenate([ids[chunk], ids[:1].repeat(pad, 0)]),
                               np.concatenate([masked[chunk],
                                               masked[:1].repeat(pad, 0)]),
                               model_cfg.drop_masked, model_cfg.mask_id)
      masks = masking.Masks(**jax.device_put(fields, copies_sharding))
      values = np.asarray(jax.device_get(log_prob(params, masks)))[:real]
      np.add.at(totals, sentence[chunk], values.astype(np.float64))
      scored += real
      pairs.update(pairs.total * scored / copies)
  pairs.finish()
  return totals


def score_pairs(model_cfg, params, tokenizer, pairs: Sequence[Pair], *,
                variant: str = DEFAULT_VARIANT, batch_size: int = 512,
                mesh=None, progress: str = "") -> tuple[np.ndarray, np.ndarray]:
  """(PLL of each good sentence, PLL of each bad one)."""
  sentences = [p.good for p in pairs] + [p.bad for p in pairs]
  rows = sentence_ids(tokenizer, sentences)
  starts = [word_starts(tokenizer, r) for r in rows]
  pll = pseudo_log_likelihoods(model_cfg, params, rows, starts, variant=variant,
                               batch_size=batch_size, mesh=mesh, progress=progress)
  return pll[:len(pairs)], pll[len(pairs):]


# --------------------------------------------------------------------------
# The word-statistics baseline.
# --------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class BigramModel:
  """Interpolated absolute-discount bigram model of pieces, `[CLS]` as the
  start and `[SEP]` as the end of a sentence."""

  vocab_size: int
  unigram_log_probs: np.ndarray  # [V], add-one smoothed.
  codes: np.ndarray  # Sorted left * V + right of every bigram seen.
  counts: np.ndarray  # Their counts.
  left_totals: np.ndarray  # [V] bigram count by left id.
  left_types: np.ndarray  # [V] distinct successors by left id.
  num_tokens: int
  discount: float = 0.75

  def log_prob(self, ids: np.ndarray) -> float:
    """log p(ids[1:] | ids[:-1]) of one `[CLS] .. [SEP]` row."""
    ids = np.asarray(ids, np.int64)
    left, right = ids[:-1], ids[1:]
    codes = left * self.vocab_size + right
    where = np.minimum(np.searchsorted(self.codes, codes), len(self.codes) - 1)
    count = np.where(self.codes[where] == codes, self.counts[where], 0)
    totals = self.left_totals[left]
    seen = np.maximum(totals, 1)
    unigram = np.exp(self.unigram_log_probs[right])
    backoff = np.where(totals > 0, self.discount * self.left_types[left] / seen, 1.0)
    probs = np.maximum(count - self.discount, 0) / seen + backoff * unigram
    return float(np.log(probs).sum())


def count_bigrams(rows, vocab_size: int, max_tokens: int) -> BigramModel:
  """Counts a `BigramModel` on `[CLS] .. [SEP]` rows, up to `max_tokens`."""
  unigram = np.zeros(vocab_size, np.int64)
  codes, counted = [], 0
  for ids in rows:
    ids = np.asarray(ids, np.int64)
    if len(ids) < 2:
      continue
    unigram += np.bincount(ids[1:], minlength=vocab_size)[:vocab_size]
    codes.append(ids[:-1] * vocab_size + ids[1:])
    counted += len(ids) - 1
    if counted >= max_tokens:
      break
  if not counted:
    raise ValueError("no text to count the bigram baseline on; pass --ngram_source "
                     "or --ngram_tokens=0")
  unique, counts = np.unique(np.concatenate(codes), return_counts=True)
  left = unique // vocab_size
  smoothed = unigram + 1.0
  return BigramModel(
      vocab_size=vocab_size,
      unigram_log_probs=np.log(smoothed / smoothed.sum()),
      codes=unique, counts=counts,
      left_totals=np.bincount(left, weights=counts, minlength=vocab_size),
      left_types=np.bincount(left, minlength=vocab_size).astype(np.float64),
      num_tokens=counted)


def corpus_rows(source_spec: str, tokenizer, max_tokens: int, *, text_field="text",
                seed: int = 0):
  """`[CLS] sentence [SEP]` rows of the training split of `source_spec`, in
  the seeded document order of tokenizer training, until `max_tokens`."""
  from maelm_jax.data import pipeline, sources  # pylint: disable=g-import-not-at-top
  source = sources.open_source(source_spec, sources.TRAIN, text_field=text_field)
  yielded = 0
  for text in pipeline.training_texts(source, max_chars=sys.maxsize, seed=seed):
    for row in sentence_ids(tokenizer, tokenizer_lib.SENTENCE_END.split(text)):
      yielded += len(row) - 1
      yield row
    if yielded >= max_tokens:
      return


# --------------------------------------------------------------------------
# Aggregation, table and plot.
# --------------------------------------------------------------------------


def aggregate(pairs: Sequence[Pair], good: np.ndarray, bad: np.ndarray) -> dict:
  """Accuracies (x100) per paradigm, term and field, and `mean` over paradigms.

  A pair is right when the good sentence scores strictly higher. A term's or
  field's accuracy is the mean of its paradigms' (equal to the pooled accuracy
  when every paradigm has the same number of pairs, as BLiMP's do).
  """
  right = np.asarray(good) > np.asarray(bad)
  by_paradigm = collections.defaultdict(list)
  term_of, field_of = {}, {}
  for pair, ok in zip(pairs, right):
    by_paradigm[pair.paradigm].append(bool(ok))
    term_of[pair.paradigm], field_of[pair.paradigm] = pair.term, pair.field
  paradigms = {p: 100 * statistics.mean(v) for p, v in sorted(by_paradigm.items())}

  def mean_by(key_of):
    groups = collections.defaultdict(list)
    for paradigm, accuracy in paradigms.items():
      groups[key_of[paradigm]].append(accuracy)
    return {k: statistics.mean(v) for k, v in sorted(groups.items())}
  return {"mean": statistics.mean(paradigms.values()), "pairs": len(pairs),
          "paradigms": paradigms, "terms": mean_by(term_of),
          "fields": mean_by(field_of)}


def format_table(results: dict) -> str:
  """Markdown: one row per linguistics term (and the mean), a column per model."""
  columns = list(results["models"])
  first = results["models"][columns[0]]
  lines = [f"BLiMP, {len(first['paradigms'])} paradigms, {first['pairs']} pairs; "
           f"PLL variant {results['variant']}; accuracy (%) a pair is right when "
           "the grammatical sentence scores higher; mean = mean over paradigms.", "",
           "| term | paradigms | " + " | ".join(columns) + " |",
           "|---|--:|" + "--:|" * len(columns)]
  counts = collections.Counter(results.get("term_of", {}).values())
  for term in first["terms"]:
    cells = [f"{results['models'][c]['terms'][term]:.1f}" for c in columns]
    lines.append(f"| {term} | {counts.get(term, '')} | " + " | ".join(cells) + " |")
  lines.append("| **mean** | | " + " | ".join(
      f"**{results['models'][c]['mean']:.1f}**" for c in columns) + " |")
  return "\n".join(lines)


def plot(results: dict, path: str) -> None:
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use("Agg")
  from matplotlib import pyplot as plt  # pylint: disable=g-import-not-at-top
  columns = list(results["models"])
  terms = list(results["models"][columns[0]]["terms"])
  width = 0.8 / len(columns)
  fig, ax = plt.subplots(figsize=(max(6, 0.5 * len(terms) * len(columns) + 2), 4.5))
  for n, column in enumerate(columns):
    values = [results["models"][column]["terms"][t] for t in terms]
    label = f"{column} (mean {results['models'][column]['mean']:.1f})"
    ax.bar(np.arange(len(terms)) + (n - (len(columns) - 1) / 2) * width, values,
           width, label=label)
  ax.axhline(50, color="gray", ls="--", lw=1, label="chance")
  ax.set_xticks(np.arange(len(terms)), [t.replace("_", " ") for t in terms],
                rotation=45, ha="right", fontsize=8)
  ax.set(ylabel="accuracy (%)", ylim=(0, 100),
         title=f"BLiMP by phenomenon (PLL {results['variant']})")
  ax.legend(fontsize=7)
  fig.tight_layout()
  fig.savefig(path, dpi=100)
  plt.close(fig)


# --------------------------------------------------------------------------
# The command.
# --------------------------------------------------------------------------


def _label(workdir: str, labels: set) -> str:
  label = os.path.basename(os.path.normpath(workdir))
  return workdir if label in labels else label


def evaluate(workdirs: Sequence[str], data: str, out: str, *,
             variant: str = DEFAULT_VARIANT, step: int | None = None,
             batch_size: int = 512, max_pairs_per_paradigm: int = 0,
             ngram_tokens: int = 5_000_000, ngram_source: str = "",
             command: str = "", overwrite: bool = False) -> dict:
  """Scores every workdir (and the bigram baseline) on BLiMP; writes `out`
  (refusing one that holds earlier results, unless `overwrite`)."""
  if variant not in VARIANTS:
    raise ValueError(f"--variant={variant!r} is unknown; use one of {VARIANTS}")
  if len(set(map(os.path.abspath, workdirs))) != len(workdirs):
    raise ValueError(f"--workdir names a workdir twice: {list(workdirs)}")
  workdir_lib.check_results_out(out, RESULTS_FILE, overwrite)
  pairs = read_pairs(data, max_pairs_per_paradigm)
  runs = [load_run(w, step) for w in workdirs]  # Every input error before any work.
  os.makedirs(out, exist_ok=True)
  results = {"variant": variant, "data": os.path.abspath(data), "command": command,
             "references_all_67_paradigms": REFERENCE_SCORES,
             "term_of": {p.paradigm: p.term for p in pairs},
             "field_of": {p.paradigm: p.field for p in pairs}, "models": {}}
  labels: set = set()
  for workdir, run in zip(workdirs, runs):
    start = time.monotonic()
    good, bad = score_pairs(run.model_cfg, run.params, run.tokenizer, pairs,
                            variant=variant, batch_size=batch_size,
                            progress=f"blimp {os.path.basename(os.path.normpath(workdir))}")
    seconds = time.monotonic() - start
    label = _label(workdir, labels)
    labels.add(label)
    results["models"][label] = {
        **aggregate(pairs, good, bad), "workdir": storage.absolute(workdir),
        "objective": run.config.model.objective,
        "decoder": run.config.model.get("decoder_type"), "step": run.step,
        "seconds": seconds, "pairs_per_s": len(pairs) / seconds}
    logging.info("blimp: %s (step %d) mean %.1f over %d pairs, %.0f pairs/s",
                    label, run.step, results["models"][label]["mean"], len(pairs),
                    len(pairs) / seconds)
  if ngram_tokens:
    run = runs[0]
    spec = ngram_source or run.config.data.source
    model = count_bigrams(corpus_rows(spec, run.tokenizer, ngram_tokens,
                                      text_field=run.config.data.get("text_field",
                                                                     "text")),
                          run.tokenizer.vocab_size, ngram_tokens)
    rows = sentence_ids(run.tokenizer, [p.good for p in pairs] + [p.bad for p in pairs])
    scores = np.asarray([model.log_prob(r) for r in rows])
    results["models"]["bigram"] = {
        **aggregate(pairs, scores[:len(pairs)], scores[len(pairs):]),
        "source": spec, "tokens": model.num_tokens}
  with open(os.path.join(out, RESULTS_FILE), "w") as f:
    json.dump(results, f, indent=2)
  with open(os.path.join(out, TABLE_FILE), "w") as f:
    f.write((f"`{command}`\n\n" if command else "") + format_table(results) + "\n")
  plot(results, os.path.join(out, PLOT_FILE))
  return results


def load_run(workdir: str, step: int | None) -> pretrained_lib.Pretrained:
  """The full pretraining model (decoder and LM head included), unrolled."""
  workdir = pretrained_lib.check_pretraining_workdir(workdir, step)
  run = pretrained_lib.load_pretrained(workdir, encoder_only=False, step=step,
                                    scan_layers=False)
  if run.config.get("mode", "pretrain") != "pretrain":
    raise ValueError(f"--workdir {workdir} is a fine-tuning run; BLiMP scores the "
                     "pretraining workdir it started from (its LM head)")
  # float32 scores: bfloat16 logits would tie sentences that differ slightly.
  run.model_cfg = dataclasses.replace(run.model_cfg, dtype=jnp.float32,
                                      attention_impl="xla")
  return run


def _define_flags() -> None:
  flags.DEFINE_list("workdir", None, "Pretraining workdirs, comma-separated")
  flags.DEFINE_string("data", None, "A folder of BLiMP <UID>.jsonl files")
  flags.DEFINE_string("out", None, "Where blimp.json, blimp.md, blimp.png go")
  flags.DEFINE_enum("variant", DEFAULT_VARIANT, VARIANTS,
                    "PLL variant: word_l2r (Kauf & Ivanova 2023) or token")
  flags.DEFINE_integer("step", None, "Checkpoint step (default: each one's newest)")
  flags.DEFINE_integer("batch_size", 512, "Masked copies per forward pass")
  flags.DEFINE_integer("max_pairs", 0, "Pairs per paradigm (0: all)")
  flags.DEFINE_integer("ngram_tokens", 5_000_000, "Training tokens the bigram "
                       "baseline is counted on (0: no baseline)")
  flags.DEFINE_string("ngram_source", "", "Text for the bigram baseline (a "
                      "data.source spec; default: the first workdir's)")
  flags.DEFINE_bool("overwrite", False, "Replace the results already in --out")
  flags.mark_flags_as_required(["workdir", "data", "out"])


def main():
  FLAGS = flags.FLAGS
  results = evaluate(
      FLAGS.workdir, FLAGS.data, FLAGS.out, variant=FLAGS.variant,
      step=FLAGS.step, batch_size=FLAGS.batch_size, max_pairs_per_paradigm=FLAGS.max_pairs,
      ngram_tokens=FLAGS.ngram_tokens, ngram_source=FLAGS.ngram_source,
      command=cli.command_line("maelm_jax.evaluate.blimp"), overwrite=FLAGS.overwrite)
  print(format_table(results))
  print(f"\n{os.path.join(os.path.abspath(FLAGS.out), RESULTS_FILE)}, {TABLE_FILE}, "
        f"{PLOT_FILE}")


# `python -m` and the maelm-blimp command (setup.py's console scripts).
console = cli.command(main, _define_flags)

if __name__ == "__main__":
  console()
