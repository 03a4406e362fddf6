r"""SST-2 in ordinary spelling: does a pretrained encoder gain when fine-tuning text
is written the way its pretraining text was?

SST-2's sentences are Penn-Treebank tokenized and lowercased ("it 's not a bad film
, is it ?"). The books that `tiny` is pretrained on are ordinary prose ("It's not
a bad film, is it?"), so their tokenizer cuts the two differently: "does n't" is
`▁does ▁ n ' t` where pretraining saw `▁doesn ' t`, and every comma or full stop
gets a piece of its own. This writes a copy of an SST-2 directory with every
sentence detokenized (`detokenize_ptb`), labels and order unchanged, for
`--config.data.dir`:

  python studies/sst2_detokenized.py --glue_dir=<data>/glue \
      --out=runs/detok/glue          # writes runs/detok/glue/SST-2/{train,dev}.tsv

Measured in studies/pretraining-on-the-books.md ("Why SST-2 does not gain"): the gain over
random initialisation moves from -0.2 to +0.8, both scores fall, so the fine-tuning
protocol keeps SST-2 as GLUE distributes it.
"""

import argparse
import pathlib
import sys

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from maelm_jax.finetune import glue_data  # noqa: E402

# PTB splits these off the word before; they are written joined to it.
_CLITICS = ("n't", "'s", "'re", "'ve", "'ll", "'d", "'m")
_NO_SPACE_BEFORE = (".", ",", ";", ":", "?", "!", ")", "...", "%")
_NO_SPACE_AFTER = ("(", "$")
_PTB_BRACKETS = {"-lrb-": "(", "-rrb-": ")", "-lsb-": "[", "-rsb-": "]",
                 "-lcb-": "{", "-rcb-": "}"}


def detokenize_ptb(text: str) -> str:
  """Penn-Treebank-tokenized, lowercased text back to ordinary spelling.

  Rejoins clitics ("does n't" -> "doesn't", "ca n't" -> "can't"), closes the
  spaces around punctuation and brackets, turns `` and '' into ", writes the
  pronoun "i" as "I" and capitalises the first letter. Casing lost elsewhere
  (names) stays lost.
  """
  out: list[str] = []
  glue_next = False  # The previous token wants no space after it.
  open_quote = True  # A bare `"` token alternates opening and closing.
  for token in text.split():
    token = _PTB_BRACKETS.get(token, token)
    if token in ("``", "''", '"'):
      if token == "``" or (token == '"' and open_quote):
        out.append('"')
        glue_next, open_quote = True, False
        continue
      token, open_quote = '"', True
      if out:
        out[-1] += token
        continue
    if token == "i":
      token = "I"
    elif token.startswith("i'") and token[1:] in _CLITICS:
      token = "I" + token[1:]
    if out and not glue_next and (token in _CLITICS or token in _NO_SPACE_BEFORE):
      out[-1] += token
    elif out and glue_next:
      out[-1] += token
    else:
      out.append(token)
    glue_next = token in _NO_SPACE_AFTER
  text = " ".join(out)
  return text[:1].upper() + text[1:]


def write_detokenized(glue_dir: str, out: str) -> list[pathlib.Path]:
  """SST-2's train.tsv and dev.tsv under `glue_dir`, detokenized, into `out`/SST-2."""
  task = glue_data.TASKS["sst2"]
  directory, layout = glue_data.resolve_task_dir(task, glue_dir)
  if layout != "tsv":
    raise ValueError(f"{directory} holds SST-2 as {layout}; this study rewrites the "
                     "TSVs of download_glue_data.py")
  source = pathlib.Path(directory)
  target = pathlib.Path(out) / "SST-2"
  target.mkdir(parents=True, exist_ok=True)
  written = []
  for name in ("train.tsv", "dev.tsv"):
    examples = glue_data.read_tsv(task, str(source / name))
    lines = ["sentence\tlabel"] + [
        f"{detokenize_ptb(e.texts[0])}\t{task.labels[e.label]}" for e in examples]
    (target / name).write_text("\n".join(lines) + "\n", encoding="utf-8")
    written.append(target / name)
  return written


def main():
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--glue_dir", required=True,
                 help="the GLUE root or its SST-2 directory")
  p.add_argument("--out", required=True, help="a new GLUE root for the copy")
  args = p.parse_args()
  for path in write_detokenized(args.glue_dir, args.out):
    print(path)


if __name__ == "__main__":
  main()
