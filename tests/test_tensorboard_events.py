"""The TensorBoard event files a run writes (run/tensorboard_events.py), read
back with TensorFlow's own Event protocol buffers (as tensorboardX ships them)
and checked with an independent CRC-32C."""

import math
import struct

import google_crc32c
import pytest

from maelm_jax.run import metric_writers, tensorboard_events


def read_records(path):
  """The TFRecords of `path`, each frame's two checksums verified."""
  data, records, at = open(path, "rb").read(), [], 0

  def masked(chunk):
    crc = google_crc32c.value(chunk)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF

  while at < len(data):
    header = data[at:at + 8]
    (length,) = struct.unpack("<Q", header)
    assert struct.unpack("<I", data[at + 8:at + 12])[0] == masked(header)
    body = data[at + 12:at + 12 + length]
    assert struct.unpack("<I", data[at + 12 + length:at + 16 + length])[0] == masked(body)
    records.append(body)
    at += 16 + length
  assert at == len(data)
  return records


def test_the_checksum_is_crc32c():
  for data in (b"", b"123456789", bytes(range(256)) * 3):
    assert tensorboard_events.crc32c(data) == google_crc32c.value(data)


def test_a_runs_scalars_read_back_as_tensorflow_events(tmp_path):
  event_pb2 = pytest.importorskip("tensorboardX.proto.event_pb2")
  writer = metric_writers.MetricWriter(str(tmp_path), is_main=True)
  writer.write(1, {"train/loss": 6.25, "lr": 3e-4})
  writer.write(2, {"train/loss": float("nan"), "eval/accuracy": 0.125})
  writer.write(2**40, {"train/loss": -1.5})
  writer.close()
  files = list((tmp_path / "tensorboard").iterdir())
  assert len(files) == 1 and "tfevents" in files[0].name
  events = [event_pb2.Event.FromString(r) for r in read_records(files[0])]
  assert events[0].file_version == "brain.Event:2"
  scalars = [(e.step, {v.tag: v.simple_value for v in e.summary.value}) for e in events[1:]]
  assert scalars == [(1, {"train/loss": 6.25, "lr": pytest.approx(3e-4)}),
                     (2, {"eval/accuracy": 0.125}),  # A NaN is left out.
                     (2**40, {"train/loss": -1.5})]
  assert all(math.isclose(e.wall_time, events[0].wall_time, abs_tol=60) for e in events)


def test_a_resumed_run_adds_a_file_and_an_unwritable_directory_only_warns(tmp_path):
  for _ in range(2):
    metric_writers.MetricWriter(str(tmp_path), is_main=True).close()
  assert len(list((tmp_path / "tensorboard").iterdir())) == 2
  blocked = tmp_path / "blocked"
  blocked.mkdir()
  (blocked / "tensorboard").write_text("a file where the directory goes")
  writer = metric_writers.MetricWriter(str(blocked), is_main=True)
  writer.write(1, {"train/loss": 1.0})  # metrics.jsonl still gets the record.
  writer.close()
  assert (blocked / "metrics.jsonl").read_text().count("train/loss") == 1
