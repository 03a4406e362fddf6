"""Which tokenizer a pretraining run uses: decided here once, for the run, its dry
run (`--config.dry_run=True`) and the planner (`python -m maelm_jax.plan`).

The order: the workdir's own file (a resumed run keeps the ids its checkpoints
were trained with), else the one it is told (`tokenizer.path`), else the
`init_from` run's, else the one a token-id corpus was prepared with, else one
trained on the corpus into the workdir. A run may not swap the workdir's
tokenizer for another, and a token-id corpus only reads with its own.

A Hugging Face `tokenizer.json` is stored in the workdir re-indexed, with the
special roles at ids 0..4 (`tokenizer.project_order_text`); until then it is read
from a staged copy in a temporary file.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
import contextlib
import dataclasses
import filecmp
import os
import shutil
import tempfile

from maelm_jax.core import special_tokens
from maelm_jax.data import tokenizer as tokenizer_lib

TO_BE_TRAINED = "to be trained into the workdir"


def tokenizer_path_for(config, workdir: str,
                       corpus_tokenizer: str | None = None) -> str | None:
  """The tokenizer file a run is told to use (None: its own, or one to train),
  refused when it differs from the workdir's own or from a token-id corpus's."""
  wanted = config.tokenizer.path or (
      tokenizer_lib.workdir_tokenizer_path(config.init_from) if config.init_from
      else "") or corpus_tokenizer or ""
  if corpus_tokenizer and not filecmp.cmp(wanted, corpus_tokenizer, shallow=False):
    raise ValueError(
        f"{config.data.source} holds token ids of {corpus_tokenizer}, but this run "
        f"uses {wanted}; drop --config.tokenizer.path (the corpus's tokenizer is "
        "used), or prepare the corpus with --tokenizer=" + wanted)
  # The workdir's own file of either kind: a SentencePiece run resumed with a
  # tokenizer.json (or the reverse) is a swap too, not a first copy.
  own = tokenizer_lib.workdir_tokenizer_path(workdir) if workdir else ""
  if wanted and own and os.path.isfile(own) and (
      os.path.basename(own) != tokenizer_lib.own_name(wanted)
      or not _same_tokenizer(own, wanted)):
    raise ValueError(
        f"tokenizer {wanted} differs from {own}, the tokenizer this workdir's "
        "checkpoints were trained with; drop --config.tokenizer.path (and "
        "init_from) to resume, or use a new --workdir")
  return wanted or None


def _same_tokenizer(own: str, given: str) -> bool:
  """Whether the workdir's tokenizer file is `given` as the run stores it."""
  if own.endswith(".json"):
    with open(own, encoding="utf-8") as f:
      return f.read() == tokenizer_lib.project_order_text(given)
  return filecmp.cmp(own, given, shallow=False)


def _staged(given: str) -> str:
  """`given` as the run stores it: itself, or for a tokenizer.json whose ids
  0..4 are not the roles, a re-indexed copy in a temporary file."""
  if not given.endswith(".json"):
    return given
  text = tokenizer_lib.project_order_text(given)
  with open(given, encoding="utf-8") as f:
    if f.read() == text:
      return given
  fd, staged = tempfile.mkstemp(suffix=".json")
  with os.fdopen(fd, "w", encoding="utf-8") as f:
    f.write(text)
  return staged


@dataclasses.dataclass(frozen=True)
class TokenizerFile:
  given: str | None  # The file the run is told to use (None: its own or a new one).
  own: str  # Where the workdir keeps it ("" without a workdir: the planner).
  load: str | None  # The file to read now (None: train one into the workdir).


@contextlib.contextmanager
def tokenizer_file(config, workdir: str | None,
                   corpus_tokenizer: str | None = None) -> Iterator[TokenizerFile]:
  """The run's tokenizer file, decided by the rules above; a staged copy is
  deleted on leaving."""
  given = tokenizer_path_for(config, workdir or "", corpus_tokenizer)
  if not workdir:
    own = ""
  elif given:
    own = os.path.join(workdir, tokenizer_lib.own_name(given))
  else:
    own = tokenizer_lib.workdir_tokenizer_path(workdir)
  if own and os.path.exists(own):
    load = own
  elif given:  # A missing file is named by the tokenizer's loader.
    load = _staged(given) if os.path.exists(given) else given
  else:
    load = None
  try:
    yield TokenizerFile(given, own, load)
  finally:
    if load not in (None, given, own):
      os.unlink(load)  # The staged, re-indexed copy.


def planned_vocabulary(config, workdir: str | None) -> tuple[int, int, str]:
  """(vocabulary size, [MASK] id, where they come from) of the tokenizer a run
  would use, without reading the corpus: what the dry run and the planner say."""
  with tokenizer_file(config, workdir) as file:
    if file.load is None or not os.path.exists(file.load):
      return config.tokenizer.vocab_size, special_tokens.MASK_ID, TO_BE_TRAINED
    tokenizer = tokenizer_lib.open_tokenizer(file.load)
    return tokenizer.vocab_size, tokenizer.mask_id, (
        file.own if file.load == file.own else file.given)


def load_run_tokenizer(config, workdir: str,
                       training_texts: Callable[[], Iterable[str]], *,
                       corpus_tokenizer: str | None, is_writer: bool):
  """The run's tokenizer, loaded or trained, and kept in the workdir (the
  workdir is self-contained: a given file is copied in, atomically, since other
  processes may be reading it)."""
  with tokenizer_file(config, workdir, corpus_tokenizer) as file:
    tokenizer = tokenizer_lib.load_or_train_tokenizer(
        workdir, training_texts, vocab_size=config.tokenizer.vocab_size,
        model_type=config.tokenizer.model_type, path=file.load,
        max_sentences=config.tokenizer.max_sentences, seed=config.seed,
        is_writer=is_writer)
    if is_writer and file.given and not os.path.exists(file.own):
      shutil.copyfile(file.load, file.own + ".tmp")
      os.replace(file.own + ".tmp", file.own)
    if file.load != file.given and isinstance(tokenizer, tokenizer_lib.HFTokenizer):
      tokenizer.path = file.own  # Not the staged copy deleted on leaving.
  return tokenizer
