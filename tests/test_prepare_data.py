"""Tests for maelm_jax.data.prepare_data and the `arrayrecord:` source (prepared.py):
the same documents and rows as the spec prepared from, every input format,
token ids, resume after a kill at any point, and bad input refused untouched."""

import gzip
import json
import lzma
import os
import pathlib
import signal
import subprocess
import sys
import time

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from maelm_jax.data import pipeline
from maelm_jax.data import prepare_data
from maelm_jax.data import prepared
from maelm_jax.data import sources
from maelm_jax.data import tokenizer as tokenizer_lib
from maelm_jax.run import run_tokenizer
from tests import helpers

REPO = pathlib.Path(__file__).resolve().parents[1]


def _all(source):
  return [source[i] for i in range(len(source))]


def _rows(source, tokenizer, n=4):
  dataset = pipeline.make_pretrain_dataset(source, tokenizer, seq_len=32,
                                           batch_size=4, seed=3)
  iterator = iter(dataset)
  return np.stack([next(iterator)["input_ids"] for _ in range(n)])


@pytest.fixture(scope="module")
def text_corpus(tmp_path_factory):
  """JSON Lines (gz, xz, with the warts of real files) and a Gutenberg book."""
  root = tmp_path_factory.mktemp("corpus")
  pydoc = sources.open_source("pydoc:", "train")
  docs = [pydoc[i] for i in range(600)]
  with gzip.open(root / "a.jsonl.gz", "wt", encoding="utf-8") as f:
    for i, doc in enumerate(docs[:250]):
      f.write(json.dumps({"id": i, "text": doc}) + ("\r\n" if i % 7 else "\n"))
      if i == 3:
        f.write("\n")  # A blank line.
    # U+0085 inside a record, which str.splitlines() would break at.
    f.write(json.dumps({"id": -1, "text": "a review\u0085 with a NEL"},
                       ensure_ascii=False) + "\n")
    f.write(json.dumps({"id": -2, "text": "   "}) + "\n")  # Empty after normalising.
  with lzma.open(root / "b.jsonl.xz", "wt", encoding="utf-8") as f:
    for doc in docs[250:500]:
      f.write(json.dumps({"text": doc}) + "\n")
  book = ["*** START OF THE PROJECT GUTENBERG EBOOK X ***", ""]
  for doc in docs[500:]:
    book += [doc[:len(doc) // 2], doc[len(doc) // 2:], ""]
  book += ["*** END OF THE PROJECT GUTENBERG EBOOK X ***", "licence"]
  (root / "c.txt").write_text("\n".join(book), encoding="utf-8")
  return f"text:{root}/*.jsonl.*,{root}/c.txt"


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
  prefix = tmp_path_factory.mktemp("tok") / "sp"
  return tokenizer_lib.train_tokenizer(
      pipeline.training_texts(sources.open_source("pydoc:", "train")), str(prefix),
      vocab_size=600)


@pytest.fixture(scope="module")
def prepared_text(text_corpus, tmp_path_factory):
  out = tmp_path_factory.mktemp("prepared") / "corpus"
  prepare_data.prepare(text_corpus, str(out))
  return out


def test_same_documents_and_rows_as_the_text_spec(text_corpus, prepared_text,
                                                  tokenizer):
  for split in sources.SPLITS:
    text = sources.open_source(text_corpus, split, eval_fraction=0.05)
    ours = sources.open_source(f"arrayrecord:{prepared_text}", split,
                               eval_fraction=0.05)
    assert len(ours) == len(text) > 0
    assert _all(ours) == _all(text)
  np.testing.assert_array_equal(
      _rows(sources.open_source(f"arrayrecord:{prepared_text}", "train"), tokenizer),
      _rows(sources.open_source(text_corpus, "train"), tokenizer))
  everything = prepared.PreparedDocuments(str(prepared_text))
  assert everything[250] == "a review with a NEL"  # U+0085 is whitespace, not a line.
  metadata = prepared.read_metadata(str(prepared_text))
  assert metadata["documents"] == len(_all(sources.open_source(text_corpus, "train"))
                                      ) + metadata["held_out"]["eval"]
  assert [s["documents"] for s in metadata["shards"]] == [251, 250, 100]
  assert metadata["held_out"]["stride"] == 100
  assert not os.path.exists(prepared_text / prepare_data.PARTS_DIR)
  assert prepared.verify_checksums(str(prepared_text)) == []


def test_parallel_workers_write_the_same_corpus(text_corpus, prepared_text,
                                                tmp_path):
  metadata = prepare_data.prepare(text_corpus, str(tmp_path / "w2"), workers=2)
  assert metadata["checksum"] == prepared.read_metadata(str(prepared_text))["checksum"]


def test_token_ids_give_the_rows_of_the_text(text_corpus, prepared_text, tokenizer,
                                             tmp_path):
  out = tmp_path / "ids"
  prepare_data.prepare(text_corpus, str(out), tokenizer_path=tokenizer.path)
  ids = sources.open_source(f"arrayrecord:{out}", "train")
  assert ids.token_ids_tokenizer == str(out / "tokenizer.model")
  assert ids[0].dtype == np.int32
  np.testing.assert_array_equal(
      _rows(ids, tokenizer),
      _rows(sources.open_source(f"arrayrecord:{prepared_text}", "train"), tokenizer))
  # Readers of words get text back; a run must use the corpus's tokenizer.
  text = sources.open_source(f"arrayrecord:{prepared_text}", "train")
  assert ids.as_text()[5] == tokenizer.decode(tokenizer.encode_one(text[5]))
  config = helpers.tiny_config()
  config.data.source = f"arrayrecord:{out}"
  workdir = str(tmp_path / "run")
  assert run_tokenizer.tokenizer_path_for(config, workdir, ids.token_ids_tokenizer) == str(
      out / "tokenizer.model")
  other = tmp_path / "other.model"
  other.write_bytes(b"not the same tokenizer")
  config.tokenizer.path = str(other)
  with pytest.raises(ValueError, match="holds token ids of .*drop --config.tokenizer.path"):
    run_tokenizer.tokenizer_path_for(config, workdir, ids.token_ids_tokenizer)


def _parquet(path, texts, column="text", row_group_size=3):
  table = pa.table({"id": list(range(len(texts))), column: texts})
  pq.write_table(table, path, row_group_size=row_group_size)


def test_parquet(tmp_path):
  _parquet(tmp_path / "p0.parquet", ["one  doc", None, "two\ndoc", "", "three"])
  _parquet(tmp_path / "p1.parquet", ["four"] * 4 + ["five"])
  prepare_data.prepare(f"parquet:{tmp_path}/*.parquet", str(tmp_path / "out"))
  documents = prepared.PreparedDocuments(str(tmp_path / "out"))
  assert [documents[i] for i in range(len(documents))] == [
      "one doc", "two doc", "three", "four", "four", "four", "four", "five"]
  _parquet(tmp_path / "bad.parquet", ["x"], column="content")
  with pytest.raises(ValueError, match=r"bad.parquet has no column 'text' \(its "
                     r"columns are \['id', 'content'\]\); pass --text_field"):
    prepare_data.prepare(f"parquet:{tmp_path}/bad.parquet", str(tmp_path / "out2"))
  assert not (tmp_path / "out2").exists()  # Refused before anything was written.
  prepare_data.prepare(f"parquet:{tmp_path}/bad.parquet", str(tmp_path / "out3"),
                       text_field="content")
  assert prepared.PreparedDocuments(str(tmp_path / "out3"))[0] == "x"


def _save_to_disk(directory, texts):
  """The folder `datasets.Dataset.save_to_disk` writes: Arrow IPC stream files
  listed in state.json, beside dataset_info.json."""
  directory.mkdir()
  names = []
  for shard, chunk in enumerate((texts[:3], texts[3:])):
    name = f"data-{shard:05d}-of-00002.arrow"
    table = pa.table({"text": chunk, "label": list(range(len(chunk)))})
    with pa.OSFile(str(directory / name), "wb") as sink:
      with pa.ipc.new_stream(sink, table.schema) as writer:
        for batch in table.to_batches(max_chunksize=2):
          writer.write_batch(batch)
    names.append(name)
  (directory / "state.json").write_text(json.dumps(
      {"_data_files": [{"filename": n} for n in names], "_fingerprint": "f",
       "_format_type": None, "_split": "train"}))
  (directory / "dataset_info.json").write_text(json.dumps({"features": {}}))


def test_hfdisk(tmp_path):
  texts = ["a b", "c", "d  e", "f", "g"]
  _save_to_disk(tmp_path / "ds", texts)
  prepare_data.prepare(f"hfdisk:{tmp_path}/ds", str(tmp_path / "out"))
  documents = prepared.PreparedDocuments(str(tmp_path / "out"))
  assert [documents[i] for i in range(len(documents))] == ["a b", "c", "d e", "f", "g"]
  (tmp_path / "notone").mkdir()
  with pytest.raises(ValueError, match=r"notone is not a datasets.save_to_disk "
                     r"folder \(no state.json\)"):
    prepare_data.prepare(f"hfdisk:{tmp_path}/notone", str(tmp_path / "out2"))
  (tmp_path / "dd").mkdir()
  (tmp_path / "dd" / "dataset_dict.json").write_text('{"splits": ["train", "test"]}')
  with pytest.raises(ValueError, match=r"is a DatasetDict.*--source=hfdisk:.*dd/train"):
    prepare_data.prepare(f"hfdisk:{tmp_path}/dd", str(tmp_path / "out3"))


def test_training_refuses_unprepared_formats():
  with pytest.raises(ValueError, match="prepare_data --source=parquet:/x/.*--config."
                     "data.source=arrayrecord:DIR"):
    sources.open_source("parquet:/x/*.parquet", "train")


def _shard_stats(out):
  return {name: (os.stat(out / name).st_ino, os.stat(out / name).st_mtime_ns)
          for name in os.listdir(out) if name.endswith(prepared.SHARD_SUFFIX)}


def test_resume_after_a_crash_redoes_only_unfinished_shards(text_corpus, prepared_text,
                                                            tmp_path, monkeypatch):
  out = tmp_path / "out"
  real = prepare_data.unit_documents

  def dies_in_the_third_file(unit, **kwargs):
    for i, document in enumerate(real(unit, **kwargs)):
      if unit.path.endswith("c.txt") and i == 40:
        raise KeyboardInterrupt  # The machine dies mid-shard.
      yield document

  monkeypatch.setattr(prepare_data, "unit_documents", dies_in_the_third_file)
  with pytest.raises(KeyboardInterrupt):
    prepare_data.prepare(text_corpus, str(out))
  assert not (out / prepared.METADATA_FILE).exists()
  parts = sorted(os.listdir(out / prepare_data.PARTS_DIR))
  assert parts == [prepare_data.INTENT_FILE, "shard-00000-of-00003.array_record.json",
                   "shard-00001-of-00003.array_record.json"]
  # A kill -9 mid-write leaves a temporary file behind.
  (out / prepare_data.PARTS_DIR / "shard-00002-of-00003.array_record.tmp999").write_bytes(
      b"half a shard")
  with pytest.raises(FileNotFoundError, match="did not finish: run the same "
                     "prepare_data command again"):
    sources.open_source(f"arrayrecord:{out}", "train")
  before = _shard_stats(out)
  monkeypatch.setattr(prepare_data, "unit_documents", real)
  metadata = prepare_data.prepare(text_corpus, str(out))
  after = _shard_stats(out)
  assert {k: after[k] for k in before} == before  # Finished shards not rewritten.
  assert metadata["checksum"] == prepared.read_metadata(str(prepared_text))["checksum"]
  assert sorted(os.listdir(out)) == [prepared.METADATA_FILE, *sorted(after)]


def test_sigkill_at_a_random_instant_then_the_same_command(tmp_path):
  """A real kill -9 of the command while it writes, then the same command."""
  root = tmp_path / "in"
  root.mkdir()
  pydoc = sources.open_source("pydoc:", "train")
  for k in range(10):
    with open(root / f"{k}.jsonl", "w") as f:
      for r in range(40):
        f.write(json.dumps({"text": pydoc[(k * 40 + r) % len(pydoc)] * 20}) + "\n")
  spec = f"text:{root}/*.jsonl"
  reference = prepare_data.prepare(spec, str(tmp_path / "reference"))
  out = tmp_path / "out"
  cmd = [sys.executable, "-m", "maelm_jax.data.prepare_data", f"--source={spec}",
         f"--out={out}", "--workers=1"]
  env = {**os.environ, "JAX_PLATFORMS": "cpu"}
  proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.DEVNULL,
                          stderr=subprocess.DEVNULL)
  parts = out / prepare_data.PARTS_DIR
  deadline = time.monotonic() + 120
  while time.monotonic() < deadline and proc.poll() is None:
    if parts.is_dir() and sum(n.endswith(".json") for n in os.listdir(parts)) >= 3:
      break
    time.sleep(0.01)
  proc.send_signal(signal.SIGKILL)
  proc.wait()
  assert not (out / prepared.METADATA_FILE).exists(), "finished before the kill"
  subprocess.run(cmd, cwd=REPO, env=env, check=True, capture_output=True)
  assert prepared.read_metadata(str(out))["checksum"] == reference["checksum"]


def test_truncated_shard_is_named_and_the_same_command_repairs_it(
    text_corpus, prepared_text, tmp_path):
  out = tmp_path / "out"
  prepare_data.prepare(text_corpus, str(out))
  shard = out / "shard-00001-of-00003.array_record"
  data = shard.read_bytes()
  shard.write_bytes(data[:len(data) - 5000])  # A copy cut short.
  with pytest.raises(ValueError, match=r"shard-00001-of-00003.array_record is \d+ "
                     r"bytes, corpus.json says \d+: truncated"):
    sources.open_source(f"arrayrecord:{out}", "train")
  before = _shard_stats(out)
  prepare_data.prepare(text_corpus, str(out))
  after = _shard_stats(out)
  assert after[shard.name] != before[shard.name]
  assert all(after[k] == before[k] for k in before if k != shard.name)
  assert _all(sources.open_source(f"arrayrecord:{out}", "train")) == _all(
      sources.open_source(f"arrayrecord:{prepared_text}", "train"))
  # Silent corruption of the same size: found by --verify, not by the size check.
  data = bytearray(shard.read_bytes())
  data[100] ^= 0xFF
  shard.write_bytes(bytes(data))
  assert prepared.verify_checksums(str(out)) == [shard.name]
  prepare_data.prepare(text_corpus, str(out), verify=True)
  assert prepared.verify_checksums(str(out)) == []


def test_an_output_directory_holding_something_else_is_refused_untouched(
    text_corpus, prepared_text, tmp_path):
  out = tmp_path / "out"
  prepare_data.prepare(text_corpus, str(out))
  saved = (out / prepared.METADATA_FILE).read_bytes()
  with pytest.raises(FileExistsError, match="holds another corpus .*its --source "
                     r"differ\(s\).*use a new --out"):
    prepare_data.prepare("pydoc:", str(out))
  assert (out / prepared.METADATA_FILE).read_bytes() == saved
  other = tmp_path / "results"
  other.mkdir()
  (other / "notes.txt").write_text("mine")
  with pytest.raises(FileExistsError, match="already holds 1 other file"):
    prepare_data.prepare(text_corpus, str(other))
  assert os.listdir(other) == ["notes.txt"]


def test_a_binary_file_is_skipped_or_refused(tmp_path):
  (tmp_path / "good.jsonl").write_text('{"text": "fine words"}\n')
  (tmp_path / "zbinary.jsonl").write_bytes(b'{"text": "x"}\n\x00\x01\x02\n')
  spec = f"text:{tmp_path}/*.jsonl"
  prepare_data.prepare(spec, str(tmp_path / "warn"))
  assert _all(sources.open_source(f"arrayrecord:{tmp_path}/warn", "train",
                                  eval_fraction=0.4)) == _all(
      sources.open_source(spec, "train", eval_fraction=0.4))
  with pytest.raises(ValueError, match=r"zbinary.jsonl is not UTF-8 text \(it holds "
                     r"NUL bytes, the first at line 2\)"):
    prepare_data.prepare(spec, str(tmp_path / "stop"), on_bad_text="stop")


def test_the_command_line(tmp_path):
  out = tmp_path / "out"
  result = subprocess.run(
      [sys.executable, "-m", "maelm_jax.data.prepare_data", "--source=pydoc:",
       f"--out={out}", "--records_per_shard=700"], cwd=REPO,
      capture_output=True, text=True, env={**os.environ, "JAX_PLATFORMS": "cpu"})
  assert result.returncode == 0, result.stderr[-2000:]
  metadata = prepared.read_metadata(str(out))
  assert len(metadata["shards"]) == -(-metadata["documents"] // 700) > 1
  assert "prepare: " in result.stderr and "MB/s" in result.stderr
  assert f"--config.data.source=arrayrecord:{out}" in result.stdout
  assert _all(sources.open_source(f"arrayrecord:{out}", "eval")) == _all(
      sources.open_source("pydoc:", "eval"))
  bad = subprocess.run(
      [sys.executable, "-m", "maelm_jax.data.prepare_data", "--source=hfdisk:/nowhere",
       f"--out={tmp_path / 'x'}"], cwd=REPO, capture_output=True, text=True)
  assert bad.returncode == 1
  assert bad.stderr.startswith("error: /nowhere is not a datasets.save_to_disk folder")


@pytest.mark.parametrize("num_workers", [0, 2])
def test_iterator_checkpoint_resumes_exactly(prepared_text, tokenizer, num_workers):
  """From a JSON round-tripped iterator state, a fresh pipeline over the
  prepared corpus gives the batches that would have followed, also with grain
  worker processes (the source is pickled to them)."""
  source = sources.open_source(f"arrayrecord:{prepared_text}", "train")

  def make():
    return pipeline.make_pretrain_dataset(source, tokenizer, seq_len=40,
                                          batch_size=4, seed=11,
                                          num_workers=num_workers)
  iterator = iter(make())
  for _ in range(5):
    next(iterator)
  state = json.loads(json.dumps(iterator.get_state()))
  expected = [next(iterator)["input_ids"] for _ in range(4)]
  restored = iter(make())
  restored.set_state(state)
  got = [next(restored)["input_ids"] for _ in range(4)]
  np.testing.assert_array_equal(np.stack(got), np.stack(expected))
  for it in (iterator, restored):
    if hasattr(it, "close"):
      it.close()


def test_tokenizer_sample_mixes_files_by_size(tmp_path):
  """The tokenizer's bounded sample of a prepared two-file corpus draws from
  each file in proportion to its documents, not from the first file first."""
  (tmp_path / "big.jsonl").write_text(
      "".join(json.dumps({"text": f"big {i} words"}) + "\n" for i in range(900)))
  (tmp_path / "small.jsonl").write_text(
      "".join(json.dumps({"text": f"small {i} word"}) + "\n" for i in range(100)))
  prepare_data.prepare(f"text:{tmp_path}/*.jsonl", str(tmp_path / "out"))
  source = sources.open_source(f"arrayrecord:{tmp_path}/out", "train")
  sample = list(pipeline.training_texts(source, max_chars=3000, seed=1))
  small = sum(t.startswith("small") for t in sample)
  assert 220 <= len(sample) <= 250  # ~13 characters a document.
  assert 0.05 < small / len(sample) < 0.17  # 10% of the documents are small's.


def test_a_tfds_corpus_in_blocks_of_records(tmp_path):
  """tfds: inputs are cut into shards of --records_per_shard records; the
  prepared corpus holds the non-empty documents in the dataset's order."""
  import tensorflow_datasets as tfds  # pylint: disable=import-outside-toplevel
  with tfds.testing.mock_data(num_examples=25):
    source = sources.open_source("tfds:c4/en:3.1.0", "train", eval_fraction=0.5)
    expected = [d for d in (source._documents[i] for i in range(25)) if d]  # pylint: disable=protected-access
    metadata = prepare_data.prepare("tfds:c4/en:3.1.0", str(tmp_path / "out"),
                                    records_per_shard=10)
  assert [s["documents"] for s in metadata["shards"]][:2] == [
      sum(1 for i in range(10) if source._documents[i]),  # pylint: disable=protected-access
      sum(1 for i in range(10, 20) if source._documents[i])]  # pylint: disable=protected-access
  assert len(metadata["shards"]) == 3
  documents = prepared.PreparedDocuments(str(tmp_path / "out"))
  assert [documents[i] for i in range(len(documents))] == expected


def test_a_bad_line_stops_it_and_the_fixed_file_is_redone(tmp_path):
  """A worker's error reaches the user as its own message; after the file is
  fixed, the same command keeps the finished shard and redoes the changed one."""
  (tmp_path / "a.jsonl").write_text('{"text": "fine"}\n')
  (tmp_path / "b.jsonl").write_text('{"text": "fine too"}\nnot json\n')
  spec, out = f"text:{tmp_path}/*.jsonl", tmp_path / "out"
  with pytest.raises(ValueError, match=r"b.jsonl:2 is not valid JSON"):
    prepare_data.prepare(spec, str(out), workers=2)
  (tmp_path / "b.jsonl").write_text('{"text": "fine too"}\n{"text": "fixed"}\n')
  prepare_data.prepare(spec, str(out), workers=2)
  documents = prepared.PreparedDocuments(str(out))
  assert [documents[i] for i in range(len(documents))] == ["fine", "fine too", "fixed"]


def test_the_comparison_uses_a_token_id_corpus_s_own_tokenizer(text_corpus, tokenizer,
                                                                tmp_path):
  """`maelm_jax.compare` trains one tokenizer for all its runs, unless the corpus
  holds token ids: then every run must use the corpus's (another is refused)."""
  from maelm_jax import compare  # pylint: disable=import-outside-toplevel
  out = tmp_path / "ids"
  prepare_data.prepare(text_corpus, str(out), tokenizer_path=tokenizer.path)
  path = compare.shared_tokenizer(
      str(REPO / "configs" / "compare.py") + ":size=tiny,tflops=1,seeds=0,objectives=mlm",
      {"data.source": f"arrayrecord:{out}"}, str(tmp_path / "cmp"))
  assert path == str(out / "tokenizer.model")
  assert not (tmp_path / "cmp" / "tokenizer").exists()
