"""A local GCS emulator for the tests of `gs://` workdirs, on 127.0.0.1 only.

`gcp-storage-emulator` (PyPI) serves what gcsfs, TensorStore (orbax) and the
google-cloud-storage client use, but ignores generation preconditions
(`ifGenerationMatch`), which real GCS enforces and the workdir lease depends on
(an object created only where none exists, replaced only at the generation
read), and names no generation when it serves an object, which TensorStore
needs for OCDBT checkpoints. `python tests/gcs_emulator.py PORT DATA_DIR` runs it
with GCS's rules for both: a failed precondition of an upload or a delete is
HTTP 412, and a download says its `x-goog-generation`, as the real service does. The data lives in DATA_DIR, so a stopped emulator restarted on the
same directory still holds the bucket (the test of a store that goes away).
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time

BUCKET = "maelm-test"


def _precondition_failed(request, storage, bucket: str, name: str | None) -> bool:
  wanted = request.query.get("ifGenerationMatch")
  if not wanted or name is None:
    return False
  from gcp_storage_emulator.exceptions import NotFound  # pylint: disable=import-outside-toplevel
  try:
    current = int(storage.get_file_obj(bucket, name)["generation"])
  except NotFound:
    current = 0
  return int(wanted[0]) != current


def write_files_whole() -> None:
  """GCS never shows half an object, nor loses its index. The emulator writes
  its files in place, so a kill mid-write (the outage test stops it at any
  instant) left an empty `.meta` that no restart could read, and every later
  gs:// test failed (a fresh-clone suite of 2026-12-07). After this, each file
  is written beside its place and moved there whole."""
  from gcp_storage_emulator import storage  # pylint: disable=import-outside-toplevel
  store_class = storage._FileStore  # pylint: disable=protected-access
  if getattr(store_class.write_bytes, "whole", False):
    return
  write_in_place = store_class.write_bytes

  def write_whole(store, rel, content):
    if store._use_memory:  # pylint: disable=protected-access
      return write_in_place(store, rel, content)
    partial = f"{rel}.partial-{os.getpid()}"
    write_in_place(store, partial, content)
    os.replace(store._disk_path(partial), store._disk_path(rel))  # pylint: disable=protected-access
    return None

  write_whole.whole = True
  store_class.write_bytes = write_whole


def _serve(port: int, data_dir: str) -> None:
  from http import HTTPStatus  # pylint: disable=import-outside-toplevel
  # Patched before the server module is imported: it builds its routes then.
  from gcp_storage_emulator.handlers import objects  # pylint: disable=import-outside-toplevel

  def refuse(response):
    response.status = HTTPStatus.PRECONDITION_FAILED
    response.json({"error": {"code": 412, "message": "Precondition Failed",
                             "errors": [{"reason": "conditionNotMet",
                                         "message": "Precondition Failed"}]}})

  insert, delete = objects.insert, objects.delete

  def checked_insert(request, response, storage, *args, **kwargs):
    name = (request.query.get("name") or [None])[0]
    if name is None and isinstance(request.data, dict):
      name = (request.data.get("meta") or {}).get("name")
    if _precondition_failed(request, storage, request.params["bucket_name"], name):
      return refuse(response)
    return insert(request, response, storage, *args, **kwargs)

  def checked_delete(request, response, storage, *args, **kwargs):
    if _precondition_failed(request, storage, request.params["bucket_name"],
                            request.params["object_id"]):
      return refuse(response)
    return delete(request, response, storage, *args, **kwargs)

  def download_with_generation(request, response, storage, *args, **kwargs):
    # GCS names the generation read in a header; TensorStore (OCDBT manifests)
    # refuses a read without it ("Malformed StorageGeneration").
    from gcp_storage_emulator.exceptions import NotFound  # pylint: disable=import-outside-toplevel
    try:
      obj = storage.get_file_obj(request.params["bucket_name"],
                                 request.params["object_id"])
      response["x-goog-generation"] = str(obj["generation"])
      response["x-goog-metageneration"] = str(obj.get("metageneration", "1"))
    except NotFound:
      pass
    return download(request, response, storage, *args, **kwargs)

  download = objects.download
  objects.insert, objects.delete = checked_insert, checked_delete
  objects.download = download_with_generation

  write_files_whole()
  from gcp_storage_emulator import server  # pylint: disable=import-outside-toplevel
  emulator = server.create_server("127.0.0.1", port, in_memory=False,
                                  default_bucket=BUCKET, data_dir=data_dir)
  emulator.start()  # Serves until killed.


def free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


class Emulator:
  """The emulator as a child process: `start`, `stop` (the store goes away,
  its data stays), `start` again on the same port and data."""

  def __init__(self, data_dir: str, port: int | None = None):
    self.data_dir, self.port = data_dir, port or free_port()
    self.host = f"http://127.0.0.1:{self.port}"
    self.process = None

  def start(self) -> "Emulator":
    os.makedirs(self.data_dir, exist_ok=True)
    self.process = subprocess.Popen(
        [sys.executable, os.path.abspath(__file__), str(self.port), self.data_dir],
        stdout=subprocess.DEVNULL, stderr=open(os.path.join(self.data_dir, "log"), "a"))
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
      with contextlib.suppress(OSError), socket.create_connection(
          ("127.0.0.1", self.port), timeout=1):
        return self
      if self.process.poll() is not None:
        break
      time.sleep(0.1)
    raise RuntimeError(f"the GCS emulator did not start on port {self.port}; see "
                       f"{self.data_dir}/log")

  def stop(self) -> None:
    if self.process is not None and self.process.poll() is None:
      self.process.kill()
      self.process.wait()

  def env(self) -> dict[str, str]:
    """The one variable that points every layer at the emulator."""
    return {"STORAGE_EMULATOR_HOST": self.host}


if __name__ == "__main__":
  _serve(int(sys.argv[1]), sys.argv[2])
