"""Weights & Biases logging (run/wandb_writer.py) in W&B's offline mode: the run
writes its records under <workdir>/wandb, read back here from W&B's own log
format and protocol buffers."""

import glob
import json
import os
import pathlib
import struct
import zlib

import pytest

from maelm_jax.run import config_lib, train, wandb_writer
from tests.helpers import tiny_config

wandb = pytest.importorskip("wandb", reason="the test extras install wandb")
from wandb.proto import wandb_internal_pb2  # noqa: E402  pylint: disable=g-import-not-at-top


def records(path: str) -> list:
  """The Record protos of a run's .wandb file: W&B's LevelDB-style log of 32 KiB
  blocks (a 7-byte file header, then chunks of CRC-32, length, type)."""
  data, block, out, pending, pos = open(path, "rb").read(), 32768, [], b"", 7
  assert data[:4] == b":W&B", data[:8]
  while pos + 7 <= len(data):
    if block - pos % block < 7:  # A block's tail too short for a header: padding.
      pos += block - pos % block
      continue
    crc, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
    if kind == 0 and length == 0:
      break
    payload = data[pos + 7:pos + 7 + length]
    pos += 7 + length
    assert zlib.crc32(payload, zlib.crc32(bytes([kind]))) == crc
    pending = payload if kind in (1, 2) else pending + payload  # FULL/FIRST, MIDDLE/LAST
    if kind in (1, 4):
      record = wandb_internal_pb2.Record()
      record.ParseFromString(pending)
      out.append(record)
  return out


def history(path: str) -> dict[int, dict]:
  """{step: {key: value}} of the run's history records."""
  rows = {}
  for record in records(path):
    if record.WhichOneof("record_type") == "history":
      items = {(i.key or "/".join(i.nested_key)): json.loads(i.value_json)
               for i in record.history.item}
      rows.setdefault(items.pop("_step"), {}).update(items)
  return rows


def test_a_run_logs_its_scalars_config_and_plot_and_a_resume_continues_it(
    tmp_path, monkeypatch, tokenizer_file, plots_on):
  monkeypatch.setenv("WANDB_MODE", "offline")
  monkeypatch.setenv("WANDB_SILENT", "true")
  for folder in ("CACHE", "CONFIG", "DATA"):  # Not the user's ~/.cache and ~/.config.
    monkeypatch.setenv(f"WANDB_{folder}_DIR", str(tmp_path / f"wandb_{folder.lower()}"))
  workdir = tmp_path / "run"

  def run(total_steps):
    train.train_and_evaluate(tiny_config("maelm", **{
        "data.source": "pydoc:", "data.eval_fraction": 0.05, "tokenizer.vocab_size": 600,
        "tokenizer.path": tokenizer_file, "total_steps": total_steps, "log_every": 1,
        "eval_every": 2, "eval_batches": 1, "checkpoint_every": 2,
        "wandb_project": "maelm-test"}), str(workdir))

  run(2)
  run_id = (workdir / wandb_writer.RUN_ID_FILE).read_text().strip()
  first = glob.glob(str(workdir / "wandb" / f"offline-run-*-{run_id}" / f"run-{run_id}.wandb"))
  assert len(first) == 1, os.listdir(workdir / "wandb")
  logged = history(first[0])
  jsonl = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
  assert sorted(logged) == [r["step"] for r in jsonl] == [1, 2]
  for record in jsonl:  # The same scalars, at their steps.
    for key, value in record.items():
      if key != "step":
        assert logged[record["step"]][key] == pytest.approx(value, rel=1e-6), key
  # The learning curve the eval step drew, as an image of that step.
  assert logged[2]["learning_curve/_type"] == "image-file"
  image = pathlib.Path(first[0]).parent / "files" / logged[2]["learning_curve/path"]
  assert image.stat().st_size == logged[2]["learning_curve/size"] > 10_000
  (run_record,) = [r.run for r in records(first[0]) if r.WhichOneof("record_type") == "run"]
  config = {i.key: json.loads(i.value_json) for i in run_record.config.update}
  assert config["model"]["objective"] == "maelm" and config["total_steps"] == 2
  assert config["wandb_project"] == "maelm-test"
  assert run_record.run_id == run_id and run_record.display_name == "run"

  run(4)  # A longer run of the same workdir: the same W&B run goes on.
  assert (workdir / wandb_writer.RUN_ID_FILE).read_text().strip() == run_id
  files = sorted(glob.glob(str(workdir / "wandb" / f"offline-run-*-{run_id}" / "*.wandb")))
  assert len(files) == 2
  assert sorted(history(files[1])) == [3, 4]


def test_without_the_wandb_package_the_config_is_refused_in_one_line(monkeypatch):
  real_find_spec = wandb_writer.importlib.util.find_spec
  monkeypatch.setattr(wandb_writer.importlib.util, "find_spec",
                      lambda name: None if name == "wandb" else real_find_spec(name))
  config = tiny_config("maelm", wandb_project="mine")
  with pytest.raises(ValueError, match=r"wandb_project='mine' needs the wandb package: "
                                       r"pip install wandb"):
    config_lib.validate(config)
  config_lib.validate(tiny_config("maelm"))  # Off: nothing is asked of wandb.
