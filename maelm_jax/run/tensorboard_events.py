"""TensorBoard's event files, written with the standard library.

TensorBoard reads `events.out.tfevents.*` files: TFRecords (a length, its
masked CRC-32C, the bytes, their masked CRC-32C) each holding one `Event`
protocol buffer. A run logs scalars only, so the three messages it needs are
encoded here by hand:

  Event    {1: wall_time double, 2: step int64, 3: file_version string,
            5: summary Summary}
  Summary  {1: repeated value Value}
  Value    {1: tag string, 2: simple_value float}

tensorboardX, which wrote them before, imports torch when it is installed (seconds
of every start of a run on the test machine) and google-cloud-storage; this
module imports nothing that a run has not already.
"""

from __future__ import annotations

import itertools
import os
import socket
import struct
import time


def _crc32c_table() -> list[int]:
  table = []
  for byte in range(256):
    crc = byte
    for _ in range(8):
      crc = (crc >> 1) ^ 0x82F63B78 if crc & 1 else crc >> 1
    table.append(crc)
  return table


_TABLE = _crc32c_table()
_FILES_OPENED = itertools.count()  # Two writers in one process and second.


def crc32c(data: bytes) -> int:
  """CRC-32C (Castagnoli), the checksum TFRecords use."""
  crc = 0xFFFFFFFF
  for byte in data:
    crc = _TABLE[(crc ^ byte) & 0xFF] ^ (crc >> 8)
  return crc ^ 0xFFFFFFFF


def masked_crc32c(data: bytes) -> int:
  crc = crc32c(data)
  return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def _varint(value: int) -> bytes:
  out = bytearray()
  value &= (1 << 64) - 1  # int64 as protobuf encodes it (two's complement).
  while True:
    low, value = value & 0x7F, value >> 7
    out.append(low | (0x80 if value else 0))
    if not value:
      return bytes(out)


def _field(number: int, payload: bytes) -> bytes:
  """A length-delimited field (wire type 2): a string or a message."""
  return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def encode_event(wall_time: float, step: int = 0, scalars: dict[str, float] | None = None,
                 file_version: str | None = None) -> bytes:
  """One serialized `Event` of `scalars` (tag -> value) at `step`."""
  event = b"\x09" + struct.pack("<d", wall_time) + b"\x10" + _varint(step)
  if file_version is not None:
    event += _field(3, file_version.encode())
  if scalars:
    summary = b"".join(
        _field(1, _field(1, tag.encode()) + b"\x15" + struct.pack("<f", value))
        for tag, value in scalars.items())
    event += _field(5, summary)
  return event


def record(data: bytes) -> bytes:
  """`data` framed as one TFRecord."""
  length = struct.pack("<Q", len(data))
  return (length + struct.pack("<I", masked_crc32c(length)) + data
          + struct.pack("<I", masked_crc32c(data)))


class EventFileWriter:
  """Appends scalar events to a new event file in `directory` (created)."""

  def __init__(self, directory: str):
    os.makedirs(directory, exist_ok=True)
    now = time.time()
    name = (f"events.out.tfevents.{int(now)}.{socket.gethostname()}.{os.getpid()}."
            f"{next(_FILES_OPENED)}")
    self.path = os.path.join(directory, name)
    self._file = open(self.path, "ab")
    self._file.write(record(encode_event(now, file_version="brain.Event:2")))
    self._file.flush()

  def write_scalars(self, step: int, scalars: dict[str, float]) -> None:
    self._file.write(record(encode_event(time.time(), step, scalars)))

  def flush(self) -> None:
    self._file.flush()

  def close(self) -> None:
    self._file.close()
