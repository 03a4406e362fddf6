"""Multi-host start-up: which `jax.distributed.initialize` call this process makes.

`maybe_initialize()` runs first thing in `main` (before anything touches a
device). It reads the environment, picks ONE of these plans, logs it, and
initialises JAX's distributed system accordingly:

  explicit  MAELM_COORDINATOR_ADDRESS=host:port, MAELM_NUM_PROCESSES=N and
            MAELM_PROCESS_ID=i (optionally MAELM_LOCAL_DEVICE_IDS=0,1,..) are
            all set: `initialize(address, N, i[, local_device_ids])`.
            `launch/local.sh` sets them; so can any other launcher.
  tpu       a multi-host Cloud TPU: TPU_WORKER_HOSTNAMES / TPU_PROCESS_ADDRESSES
            naming more than one host (GKE), MEGASCALE_* (multislice), or
            MAELM_DISTRIBUTED=tpu (set by `launch/tpu_pod.sh`; plain TPU VMs
            publish their topology in the metadata server, not in the
            environment): `initialize()` with no arguments, JAX finds the rest.
  slurm     a SLURM step with more than one task (SLURM_JOB_ID set and
            SLURM_NTASKS > 1, started by srun): `initialize()`, which uses JAX's
            SlurmCluster (coordinator on the step's first node, process id =
            SLURM_PROCID, one GPU per task = SLURM_LOCALID unless
            MAELM_LOCAL_DEVICE_IDS lists the devices, e.g. one task per node).
  jax       MAELM_DISTRIBUTED=jax: `initialize()` with no arguments, for any
            other cluster JAX detects by itself (Open MPI, Kubernetes, ...).
  single    none of the above (or MAELM_DISTRIBUTED=off): no initialisation,
            one process that sees its local devices.

In auto mode (MAELM_DISTRIBUTED unset or `auto`) the order is explicit, tpu,
slurm, single. `detect(env)` is a pure function of an environment mapping, so
the choice is unit-tested without initialising anything.
"""

from __future__ import annotations

import dataclasses
import os
import re
import sys
import threading
import time
from collections.abc import Mapping

from absl import logging

ADDRESS_VAR = "MAELM_COORDINATOR_ADDRESS"
NUM_PROCESSES_VAR = "MAELM_NUM_PROCESSES"
PROCESS_ID_VAR = "MAELM_PROCESS_ID"
LOCAL_DEVICE_IDS_VAR = "MAELM_LOCAL_DEVICE_IDS"
MODE_VAR = "MAELM_DISTRIBUTED"
EXPLICIT_VARS = (ADDRESS_VAR, NUM_PROCESSES_VAR, PROCESS_ID_VAR)
MODES = ("auto", "off", "explicit", "tpu", "slurm", "jax")

# What JAX's SlurmCluster reads; all of them are set in a task started by srun.
SLURM_STEP_VARS = ("SLURM_JOB_ID", "SLURM_STEP_NODELIST", "SLURM_NTASKS",
                   "SLURM_PROCID", "SLURM_LOCALID")

# host:port, host a name, an IPv4 address or a bracketed IPv6 address.
_ADDRESS = re.compile(
    r"^(?P<host>\[[0-9A-Fa-f:.%a-zA-Z]+\]|[A-Za-z0-9_](?:[A-Za-z0-9_.\-]*[A-Za-z0-9_])?)"
    r":(?P<port>[0-9]{1,5})$")


class DistributedConfigError(ValueError):
  """The environment asks for a multi-process run that cannot work."""


@dataclasses.dataclass(frozen=True)
class Plan:
  """How this process joins the run. `kind` is one of KINDS."""

  kind: str
  reason: str  # What in the environment led here (for the log).
  coordinator_address: str | None = None
  num_processes: int | None = None  # Known up front (explicit, slurm) or None.
  process_id: int | None = None
  local_device_ids: tuple[int, ...] | None = None

  KINDS = ("single", "explicit", "tpu", "slurm", "jax")

  @property
  def initializes(self) -> bool:
    return self.kind != "single"

  def initialize_kwargs(self) -> dict:
    """Arguments of `jax.distributed.initialize` (empty: JAX detects them)."""
    kwargs = {}
    if self.kind == "explicit":
      kwargs = dict(coordinator_address=self.coordinator_address,
                    num_processes=self.num_processes, process_id=self.process_id)
    if self.local_device_ids is not None:
      kwargs["local_device_ids"] = list(self.local_device_ids)
    return kwargs

  def describe(self) -> str:
    if self.kind == "single":
      return f"single process ({self.reason})"
    parts = [f"{self.kind}: {self.reason}"]
    if self.process_id is not None and self.num_processes is not None:
      parts.append(f"process {self.process_id} of {self.num_processes}")
    if self.coordinator_address:
      parts.append(f"coordinator {self.coordinator_address}")
    if self.local_device_ids is not None:
      parts.append(f"local devices {list(self.local_device_ids)}")
    call = ", ".join(f"{k}={v!r}" for k, v in self.initialize_kwargs().items())
    parts.append(f"jax.distributed.initialize({call})")
    return "; ".join(parts)


# --------------------------------------------------------------------------
# Parsing and validation (errors name the variable).


def _get(env: Mapping[str, str], name: str) -> str | None:
  value = env.get(name)
  if value is None:
    return None
  value = str(value).strip()
  return value or None


def parse_int(value: str, name: str, *, minimum: int | None = None) -> int:
  try:
    number = int(str(value).strip())
  except ValueError:
    raise DistributedConfigError(f"{name}={value!r} is not an integer") from None
  if minimum is not None and number < minimum:
    raise DistributedConfigError(f"{name}={number} must be >= {minimum}")
  return number


def parse_address(value: str, name: str = ADDRESS_VAR) -> str:
  """Checks `host:port` (port 1..65535); returns it stripped."""
  value = str(value).strip()
  match = _ADDRESS.match(value)
  if not match or not 0 < int(match.group("port")) < 65536:
    raise DistributedConfigError(
        f"{name}={value!r} is not a coordinator address: expected host:port with "
        "a port in 1..65535, e.g. 10.0.0.2:1234, node001:1234 or [::1]:1234 "
        "(the address of process 0, reachable from every process)")
  return value


def parse_device_ids(value: str, name: str = LOCAL_DEVICE_IDS_VAR
                     ) -> tuple[int, ...]:
  parts = [p.strip() for p in str(value).split(",")]
  if not parts or any(not p for p in parts):
    raise DistributedConfigError(
        f"{name}={value!r} must be a comma-separated list of device ids, e.g. 0,1,2,3")
  ids = tuple(parse_int(p, name, minimum=0) for p in parts)
  if len(set(ids)) != len(ids):
    raise DistributedConfigError(f"{name}={value!r} lists a device twice")
  return ids


def _hosts(value: str | None) -> list[str]:
  return [h for h in (value or "").split(",") if h.strip()]


# --------------------------------------------------------------------------
# The plans.


def _explicit(env: Mapping[str, str], device_ids) -> Plan:
  missing = [name for name in EXPLICIT_VARS if _get(env, name) is None]
  if missing:
    given = [name for name in EXPLICIT_VARS if name not in missing]
    raise DistributedConfigError(
        f"{', '.join(given) or 'MAELM_DISTRIBUTED=explicit'} set but "
        f"{', '.join(missing)} missing: an explicit multi-process run needs all of "
        f"{', '.join(EXPLICIT_VARS)} (launch/local.sh sets them), or none")
  address = parse_address(_get(env, ADDRESS_VAR))
  num = parse_int(_get(env, NUM_PROCESSES_VAR), NUM_PROCESSES_VAR, minimum=1)
  pid = parse_int(_get(env, PROCESS_ID_VAR), PROCESS_ID_VAR)
  if not 0 <= pid < num:
    raise DistributedConfigError(
        f"{PROCESS_ID_VAR}={pid} is outside [0, {NUM_PROCESSES_VAR}={num}); "
        f"process ids run from 0 to {num - 1}")
  if num == 1:
    return Plan("single", f"{NUM_PROCESSES_VAR}=1")
  return Plan("explicit", f"{ADDRESS_VAR}, {NUM_PROCESSES_VAR}, {PROCESS_ID_VAR}",
              coordinator_address=address, num_processes=num, process_id=pid,
              local_device_ids=device_ids)


def _tpu_signal(env: Mapping[str, str]) -> str | None:
  """Why the environment looks like a multi-host TPU, or None."""
  for name in ("TPU_PROCESS_ADDRESSES", "TPU_WORKER_HOSTNAMES"):
    hosts = _hosts(env.get(name))
    if len(hosts) > 1:
      return f"{name} names {len(hosts)} hosts"
    if hosts:
      break  # JAX reads the first of the two that is set: one host.
  slices = _get(env, "MEGASCALE_NUM_SLICES")
  if slices is not None and parse_int(slices, "MEGASCALE_NUM_SLICES", minimum=1) > 1:
    return f"MEGASCALE_NUM_SLICES={slices} (multislice)"
  if _get(env, "MEGASCALE_COORDINATOR_ADDRESS") is not None:
    return "MEGASCALE_COORDINATOR_ADDRESS is set (multislice)"
  return None


def _slurm_ntasks(env: Mapping[str, str]) -> int | None:
  """SLURM_NTASKS when this is a SLURM job, else None."""
  if _get(env, "SLURM_JOB_ID") is None or _get(env, "SLURM_NTASKS") is None:
    return None
  return parse_int(_get(env, "SLURM_NTASKS"), "SLURM_NTASKS", minimum=1)


def _slurm(env: Mapping[str, str], ntasks: int, device_ids) -> Plan:
  missing = [name for name in SLURM_STEP_VARS if _get(env, name) is None]
  if missing:
    raise DistributedConfigError(
        f"SLURM job {env.get('SLURM_JOB_ID')} has SLURM_NTASKS={ntasks} but "
        f"{', '.join(missing)} is not set: this process was not started by srun, "
        "so it would wait forever for the other tasks. Start it with srun (see "
        f"launch/slurm_gpu.sbatch), or set {MODE_VAR}=off for a single process")
  pid = parse_int(_get(env, "SLURM_PROCID"), "SLURM_PROCID", minimum=0)
  if pid >= ntasks:
    raise DistributedConfigError(
        f"SLURM_PROCID={pid} is outside [0, SLURM_NTASKS={ntasks})")
  if device_ids is None:
    # srun's per-task GPU binding (--gpus-per-task, --gpu-bind) leaves one GPU
    # visible, as device 0; JAX's default (device SLURM_LOCALID) would not exist.
    visible = _hosts(env.get("CUDA_VISIBLE_DEVICES"))
    if len(visible) == 1:
      device_ids = (0,)
  return Plan("slurm", f"SLURM job {env['SLURM_JOB_ID']} step with {ntasks} tasks "
              f"on {env['SLURM_STEP_NODELIST']}", num_processes=ntasks,
              process_id=pid, local_device_ids=device_ids)


def detect(env: Mapping[str, str]) -> Plan:
  """The plan for an environment (e.g. `os.environ`); initialises nothing.

  Raises:
    DistributedConfigError: the variables ask for something inconsistent (a
      process id outside [0, num_processes), a malformed address, a partial
      explicit set, a multi-task SLURM job outside srun, ...); the message names
      the variable.
  """
  mode = (_get(env, MODE_VAR) or "auto").lower()
  if mode not in MODES:
    raise DistributedConfigError(
        f"{MODE_VAR}={env.get(MODE_VAR)!r} is not one of {', '.join(MODES)}")
  if mode == "off":
    return Plan("single", f"{MODE_VAR}=off")
  device_ids = (parse_device_ids(env[LOCAL_DEVICE_IDS_VAR])
                if _get(env, LOCAL_DEVICE_IDS_VAR) is not None else None)
  explicit_given = any(_get(env, name) is not None for name in EXPLICIT_VARS)

  if mode == "explicit" or (mode == "auto" and explicit_given):
    return _explicit(env, device_ids)
  if mode in ("tpu", "jax"):
    reason = f"{MODE_VAR}={mode}"
    if mode == "tpu":
      # Never restrict TPU devices: JAX does not either.
      signal = _tpu_signal(env)
      reason += f", {signal}" if signal else ""
      device_ids = None
    return Plan(mode, reason + "; JAX detects address, count and id",
                local_device_ids=device_ids)

  ntasks = _slurm_ntasks(env)
  if mode == "slurm":
    if ntasks is None:
      raise DistributedConfigError(
          f"{MODE_VAR}=slurm but SLURM_JOB_ID / SLURM_NTASKS are not set: "
          "not inside a SLURM job")
    return _slurm(env, ntasks, device_ids)

  # auto, nothing explicit.
  signal = _tpu_signal(env)
  if signal:
    return Plan("tpu", signal + "; JAX detects address, count and id")
  if ntasks is not None and ntasks > 1:
    return _slurm(env, ntasks, device_ids)
  if ntasks == 1:
    return Plan("single", f"SLURM job {env['SLURM_JOB_ID']} with one task")
  return Plan("single", "no multi-process environment found: no MAELM_* "
              "coordinator variables, no multi-host TPU, no multi-task SLURM step")


# --------------------------------------------------------------------------
# Initialisation.


def _already_initialized() -> bool:
  import jax  # pylint: disable=g-import-not-at-top
  return jax.distributed.is_initialized()


def maybe_initialize(env: Mapping[str, str] | None = None) -> Plan:
  """Detects the plan from `env` (default `os.environ`), logs it, initialises.

  Must run before anything touches a device. Calling it again (or after
  someone else initialised JAX's distributed system) does nothing.
  """
  plan = detect(os.environ if env is None else env)
  if not plan.initializes:
    ignored = [n for n in (LOCAL_DEVICE_IDS_VAR,)
               if _get(os.environ if env is None else env, n) is not None]
    logging.info("distributed: %s%s", plan.describe(),
                 f" ({', '.join(ignored)} ignored)" if ignored else "")
    return plan
  import jax  # pylint: disable=g-import-not-at-top
  if _already_initialized():
    logging.info("distributed: already initialised; not initialising again (%s)",
                 plan.describe())
    return plan
  logging.info("distributed: %s", plan.describe())
  kwargs = plan.initialize_kwargs()
  timeout = peer_timeout_s(env)
  if timeout:  # JAX's own detection (a fatal abort) after the watchdog's line.
    kwargs["heartbeat_timeout_seconds"] = int(max(100, 2 * timeout))
  jax.distributed.initialize(**kwargs)
  logging.info("distributed: process %d of %d, %d local / %d global devices",
               jax.process_index(), jax.process_count(), jax.local_device_count(),
               jax.device_count())
  return plan



# --------------------------------------------------------------------------
# A dead peer: say which process vanished, within a bound, instead of waiting.

PEER_TIMEOUT_VAR = "MAELM_PEER_TIMEOUT_S"
DEFAULT_PEER_TIMEOUT_S = 60.0
PEER_LOST_EXIT_CODE = 75  # EX_TEMPFAIL: relaunching every process resumes.
_HEARTBEAT_KEY = "maelm/heartbeat/{}"
_DONE_KEY = "maelm/done/{}"


def peer_lost_message(process: int | None, num_processes: int, me: int,
                      timeout_s: float) -> str:
  who = (f"process {process} of {num_processes}" if process is not None else
         "the coordinator (process 0)")
  return (f"{who} stopped sending heartbeats {timeout_s:.0f} s ago (it died or "
          f"hangs; its own log says why); process {me} stops instead of waiting in a "
          "collective. Relaunch every process with the same command: they resume "
          "from the newest checkpoint all of them committed")


class PeerWatchdog:
  """Each process of a multi-process run publishes a heartbeat counter in JAX's
  coordination key-value store every `interval_s` and reads the others'. A peer
  whose counter has not moved for `timeout_s` (killed, its host gone, hung), or
  a store that cannot be reached that long (process 0, which serves it, gone),
  ends this process with one line naming the process and exit code 75, instead
  of a collective that waits for it forever (or JAX's own fatal abort with a
  stack trace, about 65 s after the loss, measured on 2 CPU processes). A peer
  that finished (`finish`) is no longer watched.

  A daemon thread; it needs the GIL every `interval_s`, which XLA's compile and
  execute and SentencePiece's training release (measured: a thread sleeping
  0.1 s at a time woke at most 0.12 s apart during a 12 s compilation, 0.18 s
  during a 43 s tokenizer training), so process 0 training the tokenizer or a
  long compilation is not a lost peer. `timeout_s` comes from
  MAELM_PEER_TIMEOUT_S (0 turns the watchdog off).
  """

  def __init__(self, client, me: int, num_processes: int, timeout_s: float,
               interval_s: float = 2.0, on_lost=None):
    self._client, self._me, self._n = client, me, num_processes
    self.timeout_s, self._interval_s = timeout_s, interval_s
    self._on_lost = on_lost or self._exit
    self._stop = threading.Event()
    self._thread = threading.Thread(target=self._run, name="maelm-peer-watchdog",
                                    daemon=True)

  def start(self) -> "PeerWatchdog":
    self._thread.start()
    return self

  def finish(self) -> None:
    """This process is done (its peers stop watching it) and stops watching."""
    self._stop.set()
    try:
      self._client.key_value_set(_DONE_KEY.format(self._me), "1", allow_overwrite=True)
    except Exception:  # pylint: disable=broad-except  (the store may be gone)
      pass

  def _exit(self, message: str) -> None:
    sys.stderr.write(f"error: {message}\n")
    sys.stderr.flush()
    os._exit(PEER_LOST_EXIT_CODE)  # pylint: disable=protected-access

  def _try_get(self, key: str) -> str | None:
    try:
      return self._client.key_value_try_get(key)
    except Exception as error:  # pylint: disable=broad-except
      if "NOT_FOUND" in str(error) or "not found" in str(error).lower():
        return None
      raise

  def _run(self) -> None:
    peers = [p for p in range(self._n) if p != self._me]
    now = time.monotonic()
    seen = {p: (None, now) for p in peers}
    store_ok = now
    beat = 0
    while not self._stop.wait(self._interval_s):
      beat += 1
      now = time.monotonic()
      try:
        self._client.key_value_set(_HEARTBEAT_KEY.format(self._me), str(beat),
                                   allow_overwrite=True)
        for p in list(peers):
          if self._try_get(_DONE_KEY.format(p)) is not None:
            peers.remove(p)
            continue
          value = self._try_get(_HEARTBEAT_KEY.format(p))
          if value != seen[p][0]:
            seen[p] = (value, now)
        store_ok = now
      except Exception:  # pylint: disable=broad-except  (the store is unreachable)
        if now - store_ok > self.timeout_s and not self._stop.is_set():
          self._on_lost(peer_lost_message(None, self._n, self._me, self.timeout_s))
          return
        continue
      for p in peers:
        if now - seen[p][1] > self.timeout_s and not self._stop.is_set():
          self._on_lost(peer_lost_message(p, self._n, self._me, self.timeout_s))
          return


def peer_timeout_s(env: Mapping[str, str] | None = None) -> float:
  value = _get(os.environ if env is None else env, PEER_TIMEOUT_VAR)
  if value is None:
    return DEFAULT_PEER_TIMEOUT_S
  try:
    timeout = float(value)
  except ValueError:
    raise DistributedConfigError(f"{PEER_TIMEOUT_VAR}={value!r} is not a number "
                                 "of seconds (0 turns the watchdog off)") from None
  if timeout < 0:
    raise DistributedConfigError(f"{PEER_TIMEOUT_VAR}={timeout} must be >= 0")
  return timeout


def start_peer_watchdog(env: Mapping[str, str] | None = None) -> PeerWatchdog | None:
  """The watchdog of this process, started, in a multi-process run (else None)."""
  import jax  # pylint: disable=g-import-not-at-top
  try:  # JAX's coordination client is private API; without it, no watchdog.
    from jax._src import distributed as jax_distributed  # pylint: disable=g-import-not-at-top
    client = jax_distributed.global_state.client
  except (ImportError, AttributeError):
    logging.warning("distributed: no JAX coordination client found; no peer watchdog")
    return None
  if jax.process_count() < 2 or client is None:
    return None
  timeout = peer_timeout_s(env)
  if not timeout:
    return None
  logging.info("distributed: peer watchdog on (a process silent for %.0f s stops "
               "the others; %s)", timeout, PEER_TIMEOUT_VAR)
  return PeerWatchdog(client, jax.process_index(), jax.process_count(),
                      timeout).start()
