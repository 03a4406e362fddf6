"""The storage layer's own behaviour, without a bucket: how often a request to a
store that fails is tried, and what a workdir's mirror keeps when the bucket
lacks its files (the runs against an emulated bucket are in test_gcs_workdir.py)."""

import http.server
import os
import pathlib
import threading

import fsspec
import fsspec.config
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
  monkeypatch.setenv("NO_GCE_CHECK", "true")
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
  monkeypatch.setenv("MAELM_GCS_RETRIES", str(tries))  # After storage's import.
  storage.configure()
  assert _tries_of_one_listing() == tries
  # The tries of TensorStore's requests are bounded by the same number.
  from orbax.checkpoint._src.serialization import tensorstore_utils  # pylint: disable=import-outside-toplevel
  assert tensorstore_utils._BASE_TS_CONTEXT["gcs_request_retries"]["max_retries"] == tries  # pylint: disable=protected-access


@pytest.mark.parametrize("value", ["ten", "-1", "2.5"])
def test_a_bad_maelm_gcs_retries_is_named_when_the_store_is_configured(
    monkeypatch, value):
  monkeypatch.setenv("MAELM_GCS_RETRIES", value)
  with pytest.raises(ValueError, match=f"MAELM_GCS_RETRIES='{value}' is not a whole"):
    storage.configure()


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


def test_an_emulator_is_sent_no_credentials_of_the_machines_account(
    unavailable_store, monkeypatch, tmp_path):
  """Under an emulator gcsfs connects anonymously and google.auth probes no GCE
  metadata server, though the machine has an account of its own (application
  default credentials): gcsfs would load it, and refresh its token with Google
  before the first request to the emulator."""
  del unavailable_store
  account = tmp_path / "adc.json"
  account.write_text('{"type": "authorized_user", "client_id": "c", '
                     '"client_secret": "s", "refresh_token": "r"}')
  monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(account))
  monkeypatch.setenv("NO_GCE_CHECK", "unset")  # Restored after the test...
  monkeypatch.delenv("NO_GCE_CHECK")  # ...and unset for it, as for a user.
  monkeypatch.setattr(fsspec.config, "conf", {})
  gcsfs.core.GCSFileSystem.clear_instance_cache()
  storage.configure()
  assert storage.filesystem().credentials.method == "anon"
  assert os.environ["NO_GCE_CHECK"] == "true"  # As gcsfs and google.auth read it.
  # What gcsfs does on its own with that account: loads it.
  assert gcsfs.core.GCSFileSystem(token=None, skip_instance_cache=True
                                  ).credentials.method == "google_default"


@pytest.mark.parametrize("host,address", [
    ("default", "https://storage.googleapis.com"), ("", "https://storage.googleapis.com"),
    ("127.0.0.1:9023", "http://127.0.0.1:9023")])
def test_storage_emulator_host_default_is_googles_own_service_as_for_gcsfs(
    monkeypatch, host, address):
  """gcsfs reads STORAGE_EMULATOR_HOST=default as no emulator; so do the bucket
  checks, and TensorStore is pointed at none."""
  monkeypatch.setenv("STORAGE_EMULATOR_HOST", host)
  monkeypatch.setenv("TENSORSTORE_GCS_HTTP_URL", "unset")  # Restored after the test.
  monkeypatch.delenv("TENSORSTORE_GCS_HTTP_URL")
  monkeypatch.setattr(fsspec.config, "conf", {})
  assert storage.endpoint() == address
  if not host.startswith("127"):  # (The emulator's settings: the tests above.)
    storage.configure()
    assert "TENSORSTORE_GCS_HTTP_URL" not in os.environ
    assert "gs" not in fsspec.config.conf  # Google's service gets the account.


def test_a_mirror_whose_last_push_failed_keeps_its_files_and_says_where(
    tmp_path, monkeypatch, caplog):
  """A bucket workdir's local mirror is deleted at the run's end only once the
  bucket holds every file; after a push that failed (the store gone at the end)
  the files stay, and the log names them and the command that uploads them."""
  store = fsspec.filesystem("memory")
  monkeypatch.setattr(storage, "filesystem", lambda: store)
  monkeypatch.setattr(storage, "reachable", lambda url, timeout=5.0: True)
  monkeypatch.setenv("MAELM_MIRROR_DIR", str(tmp_path))
  mirror = storage.Mirror("gs://maelm-mirror-test/run")
  local = pathlib.Path(mirror.local)
  (local / "metrics.jsonl").write_text('{"step": 1}\n')
  assert mirror.push() == 1 and mirror.unpushed() == []
  with open(local / "metrics.jsonl", "a", encoding="utf-8") as log:
    log.write('{"step": 2}\n')  # Written after the last push that reached it.
  assert mirror.unpushed() == ["metrics.jsonl"]
  mirror.remove()
  assert (local / "metrics.jsonl").read_text().count("step") == 2
  kept = [r.getMessage() for r in caplog.records if "did not reach" in r.getMessage()]
  assert kept and "metrics.jsonl" in kept[0] and "gcloud storage cp -r" in kept[0]
  assert mirror.push() == 1
  mirror.remove()
  assert not local.exists()
  assert store.cat("maelm-mirror-test/run/metrics.jsonl").count(b"step") == 2
