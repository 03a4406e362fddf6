"""studies/sst2_detokenized.py: SST-2's Penn Treebank spelling back to prose."""

import pathlib
import sys

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "studies"))
import sst2_detokenized  # noqa: E402

from maelm_jax.finetune import glue_data  # noqa: E402


@pytest.mark.parametrize("ptb,prose", [
    ("it 's a charming and often affecting journey . ",
     "It's a charming and often affecting journey."),
    ("the movie does n't work , and i was bored .",
     "The movie doesn't work, and I was bored."),
    ("ca n't stop , wo n't stop", "Can't stop, won't stop"),
    ("i 'm sure -lrb- well , almost -rrb- it 's `` art '' ... but i liked it !",
     "I'm sure (well, almost) it's \"art\"... but I liked it!"),
    ("they 're 100 % in the '70s ; is it ?", "They're 100% in the '70s; is it?"),
    ("a bare \" quote \" pair", "A bare \"quote\" pair"),
    ("", ""),
])
def test_detokenize_ptb(ptb, prose):
  assert sst2_detokenized.detokenize_ptb(ptb) == prose


def test_a_word_that_merely_starts_like_a_clitic_stays_apart():
  # "'tis" and a lone "'" are not clitics; "island" is not the pronoun "i".
  assert (sst2_detokenized.detokenize_ptb("' tis the island 's charm")
          == "' tis the island's charm")


def test_the_copy_keeps_labels_and_order(tmp_path):
  sst2 = tmp_path / "glue" / "SST-2"
  sst2.mkdir(parents=True)
  for name in ("train.tsv", "dev.tsv"):
    (sst2 / name).write_text("sentence\tlabel\nit 's bad .\t0\ni do n't hate it \t1\n")
  written = sst2_detokenized.write_detokenized(str(tmp_path / "glue"),
                                               str(tmp_path / "out"))
  assert [p.name for p in written] == ["train.tsv", "dev.tsv"]
  examples = glue_data.read_tsv(glue_data.TASKS["sst2"], str(written[1]))
  assert [(e.texts[0], e.label) for e in examples] == [
      ("It's bad.", 0), ("I don't hate it", 1)]
