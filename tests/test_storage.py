"""The storage layer's own behaviour, without a bucket: how often a request to a
store that fails is tried (the runs against an emulated bucket are in
test_gcs_workdir.py)."""

import http.server
import threading

import fsspec
import gcsfs
import pytest

from maelm_jax.core import storage


class _Unavailable(http.server.BaseHTTPRequestHandler):
  """Answers every request 503 (a store in an outage) and counts them."""
  requests = 0

  def do_GET(self):  # pylint: disable=invalid-name
    type(self).requests += 1
    self.send_response(503)
    self.send_header("Content-Length", "0")
    self.end_headers()

  def log_message(self, *args):
    del args


@pytest.fixture
def unavailable_store(monkeypatch):
  server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Unavailable)
  threading.Thread(target=server.serve_forever, daemon=True).start()
  _Unavailable.requests = 0
  monkeypatch.setenv("STORAGE_EMULATOR_HOST", f"http://127.0.0.1:{server.server_port}")
  monkeypatch.setenv("NO_GCE_CHECK", "True")
  monkeypatch.delenv("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", raising=False)
  classes = {c for c in (gcsfs.GCSFileSystem, gcsfs.core.GCSFileSystem)}
  methods = {(c, n): c.__dict__[n] for c in classes
             for n in ("_request", "_get_file_request", "_get_file_concurrent")
             if n in c.__dict__}
  registered = {p: fsspec.get_filesystem_class(p) for p in ("gs", "gcs")}
  yield server
  server.shutdown()
  # The next test sees gcsfs and fsspec as they were.
  for (cls, name), method in methods.items():
    setattr(cls, name, method)
  for protocol, cls in registered.items():
    fsspec.register_implementation(protocol, cls, clobber=True)


def _tries_of_one_listing():
  fs = fsspec.get_filesystem_class("gs")(token="anon", skip_instance_cache=True)
  before = _Unavailable.requests
  with pytest.raises(Exception):  # gcsfs's HttpError, or OSError
    fs.ls("maelm-unavailable/run")
  return _Unavailable.requests - before


@pytest.mark.parametrize("tries", [1, 2])
def test_maelm_gcs_retries_bounds_the_tries_of_a_gcsfs_request(
    unavailable_store, monkeypatch, tries):
  del unavailable_store
  monkeypatch.setitem(storage.GCS_RETRIES, "max_retries", tries)
  monkeypatch.setenv("MAELM_GCS_RETRIES", str(tries))
  storage.configure()
  assert _tries_of_one_listing() == tries
  # The tries of TensorStore's requests are bounded by the same number.
  from orbax.checkpoint._src.serialization import tensorstore_utils  # pylint: disable=import-outside-toplevel
  assert tensorstore_utils._BASE_TS_CONTEXT["gcs_request_retries"]["max_retries"] == tries  # pylint: disable=protected-access


def test_without_the_variable_gcsfs_keeps_its_own_retries(monkeypatch):
  monkeypatch.delenv("MAELM_GCS_RETRIES", raising=False)
  request = gcsfs.GCSFileSystem._request  # pylint: disable=protected-access
  storage.configure()
  assert gcsfs.GCSFileSystem._request is request  # pylint: disable=protected-access


def test_an_emulator_gets_the_plain_http_filesystem(unavailable_store, monkeypatch):
  """gcsfs's default class asks a gRPC control plane, which an emulator lacks,
  the layout of each bucket, for about 30 s of retries per operation."""
  del unavailable_store, monkeypatch
  storage.configure()
  assert type(storage.filesystem()) is gcsfs.core.GCSFileSystem  # pylint: disable=unidiomatic-typecheck
  assert fsspec.get_filesystem_class("gcs") is gcsfs.core.GCSFileSystem
