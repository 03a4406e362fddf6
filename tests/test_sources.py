"""Tests for maelm_jax.data.sources: every spec form, the held-out rule, errors."""

import bz2
import gzip
import json
import lzma
import pickle
import re

import grain
import pytest
import tensorflow_datasets as tfds

from maelm_jax.data import sources

TEXT = """First paragraph,
spread over   two lines.

Second paragraph.
\t
   Third   one,
with\ttabs.



Fourth.
"""
PARAGRAPHS = ["First paragraph, spread over two lines.", "Second paragraph.",
              "Third one, with tabs.", "Fourth."]


def _all(source):
  return [source[i] for i in range(len(source))]


def _both_splits(spec, **kwargs):
  return (sources.open_source(spec, "train", **kwargs),
          sources.open_source(spec, "eval", **kwargs))


# --------------------------------------------------------------------------
# The held-out rule.


@pytest.mark.parametrize("num_documents", [1, 2, 7, 50, 51, 99, 100, 101, 1003])
@pytest.mark.parametrize("eval_fraction", [0.5, 0.2, 0.3, 0.01])
def test_split_arithmetic_matches_the_rule(num_documents, eval_fraction):
  stride = sources.held_out_stride(eval_fraction)
  expected_eval = [i for i in range(num_documents) if i % stride == stride // 2]
  expected_train = [i for i in range(num_documents) if i % stride != stride // 2]
  for split, expected in (("eval", expected_eval), ("train", expected_train)):
    assert sources.split_size(num_documents, split, stride) == len(expected)
    assert [sources.split_to_corpus_index(j, split, stride)
            for j in range(len(expected))] == expected


def test_held_out_stride():
  assert sources.held_out_stride(0.01) == 100
  assert sources.held_out_stride(0.3) == 3
  assert sources.held_out_stride(0.9) == 2  # At most half is held out.
  for bad in (0.0, 1.0, -0.1):
    with pytest.raises(ValueError, match="eval_fraction"):
      sources.held_out_stride(bad)


def test_text_splits_are_disjoint_and_cover_the_corpus(tmp_path):
  docs = [f"Document number {i}." for i in range(25)]
  (tmp_path / "c.txt").write_text("\n\n".join(docs))
  train, held_out = _both_splits(f"text:{tmp_path}/c.txt", eval_fraction=0.2)
  assert _all(held_out) == [docs[i] for i in (2, 7, 12, 17, 22)]
  assert _all(train) == [d for i, d in enumerate(docs) if i % 5 != 2]
  assert train.split == "train" and held_out.split == "eval"
  with pytest.raises(IndexError):
    train[len(train)]
  assert train[-1] == docs[24]


# --------------------------------------------------------------------------
# text: sources.


def test_plain_text_paragraphs(tmp_path):
  (tmp_path / "a.txt").write_text(TEXT)
  train, held_out = _both_splits(f"text:{tmp_path}/a.txt", eval_fraction=0.5)
  # stride 2: documents 1 and 3 are held out.
  assert _all(train) == [PARAGRAPHS[0], PARAGRAPHS[2]]
  assert _all(held_out) == [PARAGRAPHS[1], PARAGRAPHS[3]]


@pytest.mark.parametrize("suffix, opener", [
    (".txt.gz", gzip.open), (".xz", lzma.open), (".bz2", bz2.open)])
def test_compressed_text(tmp_path, suffix, opener):
  with opener(tmp_path / f"a{suffix}", "wt", encoding="utf-8") as f:
    f.write(TEXT + "\nCafé au lait, naïve façade.\n")
  train, held_out = _both_splits(f"text:{tmp_path}/*{suffix}", eval_fraction=0.5)
  assert _all(train) == [PARAGRAPHS[0], PARAGRAPHS[2], "Café au lait, naïve façade."]
  assert _all(held_out) == [PARAGRAPHS[1], PARAGRAPHS[3]]


def test_bad_text_files_are_named_skipped_or_refused(tmp_path, caplog):
  """A binary file, a mostly-latin-1 file and a stray latin-1 byte, beside a
  good file: named with file and line, never decoded into garbage silently."""
  good = "\n\n".join(f"Good paragraph {i} of plain English text." for i in range(6))
  (tmp_path / "a_good.txt").write_text(good)
  (tmp_path / "b_binary.dat").write_bytes(b"GIF89a\x00\x01\x02" * 50)
  (tmp_path / "c_latin1.txt").write_bytes("\n\n".join(
      ["An English paragraph.", "Le café était très agréable à Noël."] * 4
  ).encode("latin-1"))
  stray = ("\n\n".join(f"Stray paragraph {i}, plain text." for i in range(40))
           + "\n\nOne caf\xe9 here.").encode("latin-1")
  (tmp_path / "d_stray.txt").write_bytes(stray)
  caplog.set_level("WARNING")
  train, held_out = _both_splits(f"text:{tmp_path}/*", eval_fraction=0.5)
  documents = _all(train) + _all(held_out)
  warnings = caplog.text
  assert f"{tmp_path}/b_binary.dat is not UTF-8 text (it holds NUL bytes" in warnings
  assert f"{tmp_path}/c_latin1.txt is not UTF-8 text" in warnings
  assert "skipped" in warnings
  assert f"{tmp_path}/d_stray.txt, line 81: 1 byte(s) are not UTF-8" in warnings
  assert not any("GIF" in d or "caf\ufffd \u00e9tait" in d for d in documents)
  assert "One caf\ufffd here." in documents  # Replaced, and said so.
  assert sum("Good paragraph" in d for d in documents) == 6
  with pytest.raises(ValueError, match=r"b_binary.dat is not UTF-8 text"):
    sources._text_documents(f"{tmp_path}/b_*", "text", on_bad_text="stop")
  with pytest.raises(ValueError, match="on_bad_text='ignore' must be one of"):
    sources._text_documents(f"{tmp_path}/a_*", "text", on_bad_text="ignore")


@pytest.mark.parametrize("suffix, opener", [
    (".txt.gz", gzip.open), (".txt.xz", lzma.open), (".jsonl.gz", gzip.open)])
def test_truncated_archives_are_named(tmp_path, suffix, opener):
  path = tmp_path / f"a{suffix}"
  with opener(path, "wt") as f:
    f.write("\n\n".join(json.dumps({"text": f"document {i}"}) for i in range(2000)))
  path.write_bytes(path.read_bytes()[:200])
  with pytest.raises(ValueError, match=rf"{path} cannot be read .*corrupt or truncated"):
    sources.open_source(f"text:{path}", "train")


def test_windows_line_endings(tmp_path):
  (tmp_path / "a.txt").write_bytes(b"one\r\ntwo\r\n\r\nthree\r\n")
  train, held_out = _both_splits(f"text:{tmp_path}/a.txt", eval_fraction=0.5)
  assert _all(train) + _all(held_out) == ["one two", "three"]


def test_jsonl(tmp_path):
  rows = [{"text": "alpha  one\nline two", "id": 1}, {"text": "   "},
          {"text": "beta"}, {"text": "gamma"}]
  (tmp_path / "a.jsonl").write_text(
      "\n".join(json.dumps(r) for r in rows) + "\n\n")
  with gzip.open(tmp_path / "b.jsonl.gz", "wt") as f:
    f.write(json.dumps({"text": "delta"}) + "\n")
  with lzma.open(tmp_path / "c.jsonl.xz", "wt") as f:
    f.write(json.dumps({"text": "epsilon"}) + "\n")
  train, held_out = _both_splits(f"text:{tmp_path}/*.jsonl*", eval_fraction=0.5)
  # Blank lines and whitespace-only documents are dropped; files are sorted.
  assert _all(train) + _all(held_out) == [
      "alpha one line two", "gamma", "epsilon", "beta", "delta"]


def test_unicode_line_separators_inside_records(tmp_path):
  # JSON Lines separates records by "\n" only. Real reviews carry U+0085 (a
  # mis-decoded ellipsis) and articles U+2028/U+2029 inside their strings;
  # str.splitlines() broke the records there ("a.jsonl:1 is not valid JSON").
  separators = "\x85\u2028\u2029\x0b\x0c\x1c\x1d\x1e"
  rows = [{"text": f"one{c}two"} for c in separators] + [{"text": "last"}]
  for name, opener in [("a.jsonl", open), ("b.jsonl.xz", lzma.open)]:
    with opener(tmp_path / name, "wt", encoding="utf-8") as f:
      for row in rows:  # ensure_ascii=False: the raw characters, as in the files.
        f.write(json.dumps(row, ensure_ascii=False) + "\n")
    train, held_out = _both_splits(f"text:{tmp_path}/{name}", eval_fraction=0.5)
    documents = sorted(_all(train) + _all(held_out))
    assert documents == sorted(["one two"] * len(separators) + ["last"])
  # Plain text: the characters stay inside their paragraph (as whitespace).
  (tmp_path / "c.txt").write_text("alpha\x85beta\u2028gamma\n\ndelta\n",
                                  encoding="utf-8")
  train, held_out = _both_splits(f"text:{tmp_path}/c.txt", eval_fraction=0.5)
  assert sorted(_all(train) + _all(held_out)) == ["alpha beta gamma", "delta"]


def test_text_lines_splits_at_newline_only():
  assert sources.text_lines("a\x85b\r\nc\u2028d\n\ne\n") == [
      "a\x85b", "c\u2028d", "", "e"]
  assert sources.text_lines("") == [] and sources.text_lines("x") == ["x"]


def test_jsonl_custom_text_field(tmp_path):
  (tmp_path / "a.jsonl").write_text('{"body": "x y"}\n{"body": "z"}\n')
  train = sources.open_source(f"text:{tmp_path}/a.jsonl", "train",
                              eval_fraction=0.5, text_field="body")
  assert _all(train) == ["x y"]


def test_jsonl_missing_field_names_file_line_and_knob(tmp_path):
  path = tmp_path / "a.jsonl"
  path.write_text('{"text": "ok"}\n\n{"content": "no text key"}\n')
  with pytest.raises(ValueError) as e:
    sources.open_source(f"text:{path}", "train")
  message = str(e.value)
  assert f"{path}:3" in message and "'text'" in message
  assert "['content']" in message and "--config.data.text_field" in message


def test_jsonl_invalid_json(tmp_path):
  path = tmp_path / "a.jsonl"
  path.write_text('{"text": "ok"}\n{"text": \n')
  with pytest.raises(ValueError, match=rf"{path}:2 is not valid JSON"):
    sources.open_source(f"text:{path}", "train")


def test_mixed_globs_are_sorted_and_deduplicated(tmp_path):
  (tmp_path / "b.txt").write_text("bee")
  (tmp_path / "a.txt").write_text("ay")
  (tmp_path / "c.jsonl").write_text('{"text": "sea"}\n')
  spec = f"text:{tmp_path}/c.jsonl,{tmp_path}/*.txt,{tmp_path}/a.txt"
  train, held_out = _both_splits(spec, eval_fraction=0.5)
  assert _all(train) + _all(held_out) == ["ay", "sea", "bee"]
  assert "(3 files)" in repr(train)


def test_gutenberg_boilerplate_is_stripped(tmp_path):
  book = """The Project Gutenberg eBook of A Test
This ebook is for the use of anyone anywhere.

*** START OF THE PROJECT GUTENBERG EBOOK A TEST ***

Chapter one.

It was a dark night.

*** END OF THE PROJECT GUTENBERG EBOOK A TEST ***

Updated editions will replace the previous one.
*** START: FULL LICENSE ***
"""
  (tmp_path / "pg1.txt").write_text(book)
  (tmp_path / "pg2.txt").write_text("No header here.\n\n*** Not a marker ***\n")
  train, held_out = _both_splits(f"text:{tmp_path}/*.txt", eval_fraction=0.5)
  assert _all(train) + _all(held_out) == [
      "Chapter one.", "No header here.", "It was a dark night.", "*** Not a marker ***"]
  lines = ["a", "*** END OF THIS PROJECT GUTENBERG EBOOK X ***", "licence"]
  assert sources.strip_gutenberg_boilerplate(lines) == ["a"]


def test_repr_is_deterministic_and_pickles(tmp_path):
  (tmp_path / "a.txt").write_text(TEXT)
  spec = f"text:{tmp_path}/*.txt"
  first, second = (sources.open_source(spec, "train", eval_fraction=0.5)
                   for _ in range(2))
  assert repr(first) == repr(second)
  assert "0x" not in repr(first) and "split='train'" in repr(first)
  assert "held_out=1/2" in repr(first) and "num_documents=2" in repr(first)
  clone = pickle.loads(pickle.dumps(first))
  assert _all(clone) == _all(first) and repr(clone) == repr(first)
  assert isinstance(first, grain.sources.RandomAccessDataSource)


def test_no_matching_file(tmp_path):
  (tmp_path / "a.txt").write_text("x")
  pattern = f"{tmp_path}/*.nothing"
  with pytest.raises(FileNotFoundError, match=re.escape(f"'{pattern}' matches no file")):
    sources.open_source(f"text:{tmp_path}/a.txt,{pattern}", "train")


def test_directory_instead_of_glob(tmp_path):
  with pytest.raises(IsADirectoryError, match=r"\*\.txt"):
    sources.open_source(f"text:{tmp_path}", "train")


def test_files_without_text(tmp_path):
  (tmp_path / "a.txt").write_text("\n  \n\t\n")
  (tmp_path / "b.jsonl").write_text('{"text": " "}\n')
  with pytest.raises(ValueError, match="contains no text"):
    sources.open_source(f"text:{tmp_path}/*", "train")


def test_too_few_documents_for_a_held_out_split(tmp_path):
  (tmp_path / "a.txt").write_text("only one paragraph")
  assert len(sources.open_source(f"text:{tmp_path}/a.txt", "train")) == 1
  with pytest.raises(ValueError, match="split='eval'.*empty.*eval_fraction"):
    sources.open_source(f"text:{tmp_path}/a.txt", "eval")


# --------------------------------------------------------------------------
# pydoc: and bad specs.


def test_pydoc():
  from pydoc_data import topics  # pylint: disable=g-import-not-at-top
  train, held_out = _both_splits("pydoc:")
  total = len(train) + len(held_out)
  assert total > 1000
  assert len(held_out) == sources.split_size(total, "eval", 100)
  docs = _all(train)
  assert all(d and d == " ".join(d.split()) for d in docs)
  first_topic = topics.topics[sorted(topics.topics)[0]]
  assert docs[0] == " ".join(first_topic.split("\n\n")[0].split())
  assert repr(sources.open_source("pydoc:", "train")) == repr(train)


@pytest.mark.parametrize("spec", ["wiki", "hf:wikitext", "text:", "tfds:", "pydoc:x"])
def test_unknown_spec_lists_the_forms(spec):
  with pytest.raises(ValueError) as e:
    sources.open_source(spec, "train")
  message = str(e.value)
  for form in ("text:<glob>", "tfds:<name>", "pydoc:", "tfds:c4/en:3.1.0"):
    assert form in message


def test_bad_split_name():
  with pytest.raises(ValueError, match=r"\('train', 'eval'\)"):
    sources.open_source("pydoc:", "validation")


# --------------------------------------------------------------------------
# tfds:


def test_tfds_mock_data_registers_text_builder_and_holds_out():
  # c4 is only registered once tensorflow_datasets.text.c4 is imported, which
  # open_source does; mock_data serves random records through the real
  # tfds.data_source -> ArrayRecordDataSource path (no files, no TensorFlow).
  with tfds.testing.mock_data(num_examples=20):
    train, held_out = _both_splits("tfds:c4/en:3.1.0", eval_fraction=0.2)
    # Mocked builders report no splits, so eval is carved out of "train".
    assert (len(train), len(held_out)) == (16, 4)
    texts = _all(train) + _all(held_out)
  assert all(isinstance(t, str) and t == " ".join(t.split()) for t in texts)
  assert "tfds:c4/en:3.1.0[train]" in repr(train) and "0x" not in repr(train)


class MaelmTinyCorpus(tfds.core.GeneratorBasedBuilder):
  """A real 2-config TFDS builder, prepared as ArrayRecord into tmp_path."""

  VERSION = tfds.core.Version("1.0.0")
  # tfds 4.9.10 looks up download checksums next to a builder defined in a
  # package through `importlib_resources`, which it only requires on Python
  # < 3.9. This builder downloads nothing, so there is nothing to look up.
  url_infos = None
  BUILDER_CONFIGS = [tfds.core.BuilderConfig(name="with_validation"),
                     tfds.core.BuilderConfig(name="train_only")]

  def _info(self):
    return tfds.core.DatasetInfo(builder=self, features=tfds.features.FeaturesDict(
        {"text": tfds.features.Text(), "title": tfds.features.Text()}))

  def _split_generators(self, dl_manager):
    splits = {"train": self._generate_examples("train", 12)}
    if self.builder_config.name == "with_validation":
      splits["validation"] = self._generate_examples("validation", 3)
    return splits

  def _generate_examples(self, split, n):
    for i in range(n):
      yield f"{split}{i}", {"text": f"{split} document {i}\n café", "title": str(i)}


@pytest.fixture(scope="module")
def tfds_data_dir(tmp_path_factory):
  data_dir = tmp_path_factory.mktemp("tfds")
  for config in ("with_validation", "train_only"):
    MaelmTinyCorpus(config=config, data_dir=str(data_dir),
                    file_format="array_record").download_and_prepare()
  return str(data_dir)


def test_tfds_uses_the_validation_split(tfds_data_dir):
  train, held_out = _both_splits("tfds:maelm_tiny_corpus/with_validation:1.0.0",
                                 tfds_data_dir=tfds_data_dir)
  # Records are bytes in ArrayRecord; documents come back as normalised str.
  assert sorted(_all(held_out)) == [f"validation document {i} café" for i in range(3)]
  assert sorted(_all(train)) == sorted(f"train document {i} café" for i in range(12))
  assert "[validation]" in repr(held_out) and "held_out" not in repr(held_out)


def test_tfds_without_validation_holds_out_train_documents(tfds_data_dir):
  spec = "tfds:maelm_tiny_corpus/train_only"
  train, held_out = _both_splits(spec, tfds_data_dir=tfds_data_dir, eval_fraction=0.25)
  records = tfds.data_source("maelm_tiny_corpus/train_only", split="train",
                             data_dir=tfds_data_dir)
  expected = [records[i]["text"].decode().replace("\n ", " ") for i in range(12)]
  assert _all(held_out) == [expected[i] for i in (2, 6, 10)]
  assert _all(train) == [d for i, d in enumerate(expected) if i % 4 != 2]
  assert pickle.loads(pickle.dumps(train))[0] == train[0]


def test_tfds_text_field(tfds_data_dir):
  titles = sources.open_source("tfds:maelm_tiny_corpus/with_validation", "eval",
                               tfds_data_dir=tfds_data_dir, text_field="title")
  assert sorted(_all(titles)) == ["0", "1", "2"]
  wrong = sources.open_source("tfds:maelm_tiny_corpus/with_validation", "eval",
                              tfds_data_dir=tfds_data_dir, text_field="body")
  with pytest.raises(ValueError, match=r"no field 'body'.*\['text', 'title'\].*"
                     r"--config.data.text_field"):
    wrong[0]


def test_tfds_dataset_not_prepared(tmp_path):
  with pytest.raises(FileNotFoundError) as e:
    sources.open_source("tfds:maelm_tiny_corpus/train_only", "train",
                        tfds_data_dir=str(tmp_path))
  message = str(e.value)
  assert "not prepared" in message and "tfds build maelm_tiny_corpus/train_only" in message
  assert f"--config.data.tfds_data_dir={tmp_path}" in message


def test_tfds_unknown_dataset(tmp_path):
  with pytest.raises(ValueError, match="no dataset 'no_such_corpus_xyz'.*tfds build"):
    sources.open_source("tfds:no_such_corpus_xyz", "train", tfds_data_dir=str(tmp_path))


def test_one_bad_text_rule_for_a_whole_file_and_for_its_lines():
  """`text.Utf8Reader` decides for `sources` (a file read whole) and `prepare_data`
  (line by line) alike: the same count of bad bytes, the same first line, the
  same verdict."""
  from maelm_jax.data import text as text_lib
  data = b"good line\n" * 300 + b"caf\xe9 latin-1\n" + b"more\n" * 10
  whole = text_lib.Utf8Reader("f")
  whole.decode(data)
  lines = text_lib.Utf8Reader("f")
  for number, line in enumerate(data.splitlines(keepends=True), 1):
    lines.decode(line, number)
  for reader in (whole, lines):
    reader.check()  # 1 bad byte of 3,063: under 1%, text with a warning.
    assert (reader.bad, reader.first_bad_line, reader.total) == (1, 301, len(data))
    assert "line 301: 1 byte(s) are not UTF-8" in reader.warning("")
  binary = text_lib.Utf8Reader("g")
  binary.decode(b"ok\n" + bytes(range(128, 256)) + b"\n")
  with pytest.raises(text_lib.NotText, match="128 of its 132 bytes are not UTF-8, the "
                     "first at line 2"):
    binary.check()
  with pytest.raises(text_lib.NotText, match="NUL bytes, the first at line 3"):
    text_lib.Utf8Reader("h").decode(b"a\nb\nc\x00\n")
