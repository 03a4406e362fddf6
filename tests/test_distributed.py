"""Multi-process start-up: environment detection, and the launch scripts.

`distributed.detect` is a pure function of an environment mapping, so every
platform's detection runs here without initialising anything. The launchers are
checked through --dry_run, and local.sh's process management (fail fast, signal
forwarding) with a stand-in interpreter, so no JAX runs. The real two-process
training run is tests/test_multiprocess.py.
"""

import os
import pathlib
import shlex
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from maelm_jax.run import distributed
from maelm_jax.run.distributed import DistributedConfigError, detect
from tests import helpers

REPO = pathlib.Path(__file__).resolve().parents[1]
LOCAL_SH = REPO / "launch" / "local.sh"
TPU_POD_SH = REPO / "launch" / "tpu_pod.sh"
SLURM_SBATCH = REPO / "launch" / "slurm_gpu.sbatch"

EXPLICIT = {"MAELM_COORDINATOR_ADDRESS": "10.0.0.2:1234",
            "MAELM_NUM_PROCESSES": "4", "MAELM_PROCESS_ID": "3"}
SLURM_STEP = {"SLURM_JOB_ID": "4242", "SLURM_NTASKS": "16", "SLURM_PROCID": "9",
              "SLURM_LOCALID": "1", "SLURM_STEP_NODELIST": "gpu[001-002]"}


# --------------------------------------------------------------------------
# detect(env)


def test_nothing_set_is_a_single_process():
  plan = detect({"HOME": "/root", "PATH": "/usr/bin"})
  assert plan.kind == "single" and not plan.initializes
  assert "no multi-process environment" in plan.describe()


def test_the_tests_start_single_process_runs_from_inside_a_slurm_job_or_pod():
  """The shell that starts the tests may be a step of a multi-task SLURM job or a
  TPU pod's worker: the runs the tests start are still one process each (where
  they planned a SLURM job, each refused to start outside srun)."""
  caller = {**os.environ, **SLURM_STEP, **EXPLICIT, "MAELM_DISTRIBUTED": "slurm",
            "TPU_WORKER_HOSTNAMES": "a,b", "MEGASCALE_NUM_SLICES": "2"}
  assert detect(caller).kind == "slurm"
  seen = subprocess.run(
      [sys.executable, "-c", "import os\nimport tests.conftest\n"
       "from maelm_jax.run import distributed\n"
       "print(distributed.detect(os.environ).describe())"],
      cwd=REPO, env=caller, capture_output=True, text=True, timeout=120, check=True)
  assert seen.stdout.startswith("single process (no multi-process environment found")


def test_explicit_variables():
  plan = detect(EXPLICIT)
  assert plan.kind == "explicit"
  assert plan.initialize_kwargs() == dict(coordinator_address="10.0.0.2:1234",
                                          num_processes=4, process_id=3)
  assert "process 3 of 4" in plan.describe()


def test_explicit_local_device_ids():
  plan = detect({**EXPLICIT, "MAELM_LOCAL_DEVICE_IDS": "4, 5,6,7"})
  assert plan.initialize_kwargs()["local_device_ids"] == [4, 5, 6, 7]


def test_explicit_single_process_needs_no_initialisation():
  plan = detect({**EXPLICIT, "MAELM_NUM_PROCESSES": "1", "MAELM_PROCESS_ID": "0"})
  assert plan.kind == "single"


@pytest.mark.parametrize("process_id", ["4", "-1", "17"])
def test_process_id_outside_the_range_names_the_variable(process_id):
  with pytest.raises(DistributedConfigError,
                     match=rf"MAELM_PROCESS_ID={process_id} is outside \[0, "
                     r"MAELM_NUM_PROCESSES=4\)"):
    detect({**EXPLICIT, "MAELM_PROCESS_ID": process_id})


@pytest.mark.parametrize("address", [
    "10.0.0.2", "localhost", "node1:", ":1234", "node1:0", "node1:65536",
    "node1:12ab", "http://node1:1234", "node 1:1234", "node1:1234:5", "::1:1234"])
def test_malformed_address_names_the_variable(address):
  with pytest.raises(DistributedConfigError,
                     match=r"MAELM_COORDINATOR_ADDRESS=.* is not a coordinator address"):
    detect({**EXPLICIT, "MAELM_COORDINATOR_ADDRESS": address})


@pytest.mark.parametrize("address", ["127.0.0.1:1", "node-001.cluster.local:8476",
                                     "[::1]:1234", "[fe80::1%eth0]:65535",
                                     " host_a:99 "])
def test_good_addresses(address):
  plan = detect({**EXPLICIT, "MAELM_COORDINATOR_ADDRESS": address})
  assert plan.coordinator_address == address.strip()


@pytest.mark.parametrize("name,value,message", [
    ("MAELM_NUM_PROCESSES", "two", "MAELM_NUM_PROCESSES='two' is not an integer"),
    ("MAELM_NUM_PROCESSES", "0", "MAELM_NUM_PROCESSES=0 must be >= 1"),
    ("MAELM_PROCESS_ID", "1.5", "MAELM_PROCESS_ID='1.5' is not an integer"),
    ("MAELM_LOCAL_DEVICE_IDS", "0,,1", "MAELM_LOCAL_DEVICE_IDS='0,,1' must be a "
     "comma-separated list"),
    ("MAELM_LOCAL_DEVICE_IDS", "0,-1", "MAELM_LOCAL_DEVICE_IDS=-1 must be >= 0"),
    ("MAELM_LOCAL_DEVICE_IDS", "1,1", "lists a device twice"),
])
def test_bad_values_name_the_variable(name, value, message):
  with pytest.raises(DistributedConfigError, match=message):
    detect({**EXPLICIT, name: value})


@pytest.mark.parametrize("missing", ["MAELM_COORDINATOR_ADDRESS",
                                     "MAELM_NUM_PROCESSES", "MAELM_PROCESS_ID"])
def test_partial_explicit_set_names_what_is_missing(missing):
  env = {k: v for k, v in EXPLICIT.items() if k != missing}
  with pytest.raises(DistributedConfigError, match=f"{missing} missing"):
    detect(env)


def test_empty_variables_count_as_unset():
  assert detect({"MAELM_COORDINATOR_ADDRESS": "", "MAELM_PROCESS_ID": " "}).kind == "single"


def test_slurm_step_uses_jax_slurm_detection():
  plan = detect(SLURM_STEP)
  assert plan.kind == "slurm"
  assert plan.initialize_kwargs() == {}  # JAX's SlurmCluster fills everything in.
  assert (plan.process_id, plan.num_processes) == (9, 16)
  assert "SLURM job 4242" in plan.describe()


def test_slurm_one_process_per_node_passes_its_devices():
  plan = detect({**SLURM_STEP, "SLURM_LOCALID": "0",
                 "MAELM_LOCAL_DEVICE_IDS": "0,1,2,3,4,5,6,7"})
  assert plan.initialize_kwargs() == {"local_device_ids": list(range(8))}


def test_slurm_per_task_gpu_binding_uses_the_one_visible_gpu():
  plan = detect({**SLURM_STEP, "CUDA_VISIBLE_DEVICES": "5"})
  assert plan.initialize_kwargs() == {"local_device_ids": [0]}
  assert detect({**SLURM_STEP, "CUDA_VISIBLE_DEVICES": "0,1,2,3"}
                ).initialize_kwargs() == {}


def test_slurm_single_task_is_a_single_process():
  plan = detect({**SLURM_STEP, "SLURM_NTASKS": "1", "SLURM_PROCID": "0"})
  assert plan.kind == "single" and "one task" in plan.reason


def test_multi_task_slurm_job_outside_srun_is_an_error():
  # The batch script itself: a job of 16 tasks, but not an srun step.
  env = {k: v for k, v in SLURM_STEP.items() if k != "SLURM_STEP_NODELIST"}
  with pytest.raises(DistributedConfigError, match="SLURM_STEP_NODELIST .*srun"):
    detect(env)
  assert detect({**env, "MAELM_DISTRIBUTED": "off"}).kind == "single"


def test_slurm_procid_outside_ntasks():
  with pytest.raises(DistributedConfigError, match=r"SLURM_PROCID=16 is outside"):
    detect({**SLURM_STEP, "SLURM_PROCID": "16"})


@pytest.mark.parametrize("env,why", [
    ({"TPU_WORKER_HOSTNAMES": "t1k-w-0,t1k-w-1,t1k-w-2,t1k-w-3", "TPU_WORKER_ID": "2"},
     "TPU_WORKER_HOSTNAMES names 4 hosts"),
    ({"TPU_PROCESS_ADDRESSES": "10.0.0.1:8476,10.0.0.2:8476"},
     "TPU_PROCESS_ADDRESSES names 2 hosts"),
    ({"MEGASCALE_NUM_SLICES": "2", "MEGASCALE_SLICE_ID": "1"}, "MEGASCALE_NUM_SLICES=2"),
    ({"MEGASCALE_COORDINATOR_ADDRESS": "10.0.0.1"}, "MEGASCALE_COORDINATOR_ADDRESS"),
    ({"MAELM_DISTRIBUTED": "tpu"}, "MAELM_DISTRIBUTED=tpu"),
])
def test_multi_host_tpu_lets_jax_detect_everything(env, why):
  plan = detect(env)
  assert plan.kind == "tpu"
  assert plan.initialize_kwargs() == {}
  assert why in plan.describe()


def test_single_host_tpu_is_a_single_process():
  assert detect({"TPU_WORKER_HOSTNAMES": "localhost", "TPU_WORKER_ID": "0",
                 "MEGASCALE_NUM_SLICES": "1"}).kind == "single"


def test_tpu_never_restricts_devices():
  plan = detect({"MAELM_DISTRIBUTED": "tpu", "MAELM_LOCAL_DEVICE_IDS": "0"})
  assert plan.initialize_kwargs() == {}


def test_precedence_explicit_then_tpu_then_slurm():
  tpu = {"TPU_WORKER_HOSTNAMES": "a,b"}
  assert detect({**SLURM_STEP, **tpu, **EXPLICIT}).kind == "explicit"
  assert detect({**SLURM_STEP, **tpu}).kind == "tpu"


def test_mode_variable():
  assert detect({**EXPLICIT, "MAELM_DISTRIBUTED": "off"}).kind == "single"
  assert detect({**SLURM_STEP, "MAELM_DISTRIBUTED": "OFF"}).kind == "single"
  assert detect({**SLURM_STEP, **EXPLICIT, "MAELM_DISTRIBUTED": "slurm"}).kind == "slurm"
  plan = detect({"MAELM_DISTRIBUTED": "jax"})
  assert plan.kind == "jax" and plan.initialize_kwargs() == {}
  with pytest.raises(DistributedConfigError, match="MAELM_DISTRIBUTED='mpi' is not one of"):
    detect({"MAELM_DISTRIBUTED": "mpi"})
  with pytest.raises(DistributedConfigError, match="MAELM_COORDINATOR_ADDRESS, "
                     "MAELM_NUM_PROCESSES, MAELM_PROCESS_ID missing"):
    detect({"MAELM_DISTRIBUTED": "explicit"})
  with pytest.raises(DistributedConfigError, match="not inside a SLURM job"):
    detect({"MAELM_DISTRIBUTED": "slurm"})


# --------------------------------------------------------------------------
# maybe_initialize


@pytest.fixture
def fake_initialize(monkeypatch):
  import jax
  calls = []
  monkeypatch.setattr(jax.distributed, "initialize", lambda **kw: calls.append(kw))
  monkeypatch.setattr(distributed, "_already_initialized", lambda: False)
  return calls


def test_maybe_initialize_single_process_does_not_initialise(fake_initialize):
  plan = distributed.maybe_initialize({})
  assert plan.kind == "single" and fake_initialize == []


def test_maybe_initialize_explicit_passes_the_plan(fake_initialize):
  plan = distributed.maybe_initialize(EXPLICIT)
  assert plan.kind == "explicit"
  # JAX's own fatal detection of a dead peer comes after the watchdog's line
  # (2 x its default 60 s).
  assert fake_initialize == [dict(coordinator_address="10.0.0.2:1234",
                                  num_processes=4, process_id=3,
                                  heartbeat_timeout_seconds=120)]


def test_maybe_initialize_validates_before_initialising(fake_initialize):
  with pytest.raises(DistributedConfigError, match="MAELM_PROCESS_ID=4"):
    distributed.maybe_initialize({**EXPLICIT, "MAELM_PROCESS_ID": "4"})
  assert fake_initialize == []


def test_maybe_initialize_reads_os_environ(fake_initialize, monkeypatch):
  for name, value in SLURM_STEP.items():
    monkeypatch.setenv(name, value)
  monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
  for name in ("MAELM_COORDINATOR_ADDRESS", "MAELM_NUM_PROCESSES", "MAELM_PROCESS_ID",
               "MAELM_DISTRIBUTED", "MAELM_LOCAL_DEVICE_IDS", "TPU_WORKER_HOSTNAMES",
               "TPU_PROCESS_ADDRESSES", "MEGASCALE_NUM_SLICES",
               "MEGASCALE_COORDINATOR_ADDRESS"):
    monkeypatch.delenv(name, raising=False)
  assert distributed.maybe_initialize().kind == "slurm"
  assert fake_initialize == [{"heartbeat_timeout_seconds": 120}]
  monkeypatch.setenv("MAELM_PEER_TIMEOUT_S", "0")  # No watchdog: JAX's default.
  fake_initialize.clear()
  assert distributed.maybe_initialize().kind == "slurm"
  assert fake_initialize == [{}]


# --------------------------------------------------------------------------
# Launch scripts: --dry_run


MAIN_ARGS = ["--config=configs/pretrain.py:objective=maelm,size=tiny",
             "--config.mesh_shape=(-1,1,1)", "--config.data.source=text:/data/my books/*.txt"]


def run_script(args, env=None, **kwargs):
  # The launchers read these (PYTHON: `make test PYTHON=python3.12` exports it;
  # JAX_PLATFORMS: conftest.py's cpu, which a GPU launch refuses).
  full_env = {k: v for k, v in os.environ.items()
              if not k.startswith(("MAELM_", "SLURM_", "DRY_RUN"))
              and k not in ("LD_PRELOAD", "PYTHON", "JAX_PLATFORMS")}
  full_env.update(env or {})
  return subprocess.run(["bash", *map(str, args)], capture_output=True, text=True,
                        env=full_env, timeout=60, **kwargs)


def commands(stdout):
  return [shlex.split(line) for line in stdout.splitlines()
          if line.strip() and not line.startswith("#")]


def split_env(words):
  """`env A=1 B=2 prog args` -> ({A: 1, B: 2}, [prog, args])."""
  assert words[0] == "env", words
  env, i = {}, 1
  while "=" in words[i] and not words[i].startswith("-"):
    key, value = words[i].split("=", 1)
    env[key] = value
    i += 1
  return env, words[i:]


def test_local_dry_run_prints_each_process_command(tmp_path):
  workdir = tmp_path / "run"
  out = run_script([LOCAL_SH, "--num_processes=3", "--devices_per_process=2",
                    "--port=23456", "--dry_run", "--", *MAIN_ARGS,
                    f"--workdir={workdir}"], env={"PYTHON": "/opt/py/bin/python"})
  assert out.returncode == 0, out.stderr
  lines = commands(out.stdout)
  assert len(lines) == 3
  for i, words in enumerate(lines):
    env, rest = split_env(words)
    assert env["MAELM_COORDINATOR_ADDRESS"] == "127.0.0.1:23456"
    assert env["MAELM_NUM_PROCESSES"] == "3"
    assert env["MAELM_PROCESS_ID"] == str(i)
    assert env["JAX_NUM_CPU_DEVICES"] == "2"
    assert env["PYTHONPATH"].split(":")[0] == str(REPO)
    program = rest[:rest.index("2>&1") if i == 0 else rest.index(">>")]
    assert program == ["/opt/py/bin/python", "-m", "maelm_jax.main", *MAIN_ARGS,
                       f"--workdir={workdir}"]
    assert f"{workdir}/logs/process_{i}.log" in rest
  assert "tee" in lines[0]  # Process 0 also streams to the terminal.
  assert not workdir.exists()  # A dry run creates nothing.


def test_local_dry_run_picks_a_free_port_and_finds_the_workdir():
  out = run_script([LOCAL_SH, "--num_processes", "2", "--devices_per_process", "4",
                    "--dry_run", "--", "--workdir", "rel/dir", "--config=c.py"])
  assert out.returncode == 0, out.stderr
  lines = commands(out.stdout)
  ports = {split_env(w)[0]["MAELM_COORDINATOR_ADDRESS"] for w in lines}
  assert len(ports) == 1
  port = int(ports.pop().split(":")[1])
  assert 0 < port < 65536
  assert "rel/dir/logs/process_1.log" in lines[1]


def test_local_dry_run_gpu_splits_the_devices():
  out = run_script([LOCAL_SH, "--num_processes=2", "--devices_per_process=4",
                    "--platform=gpu", "--port=1234", "--dry_run", "--", "--workdir=/w"])
  assert out.returncode == 0, out.stderr
  envs = [split_env(w)[0] for w in commands(out.stdout)]
  assert [e["MAELM_LOCAL_DEVICE_IDS"] for e in envs] == ["0,1,2,3", "4,5,6,7"]
  assert "JAX_NUM_CPU_DEVICES" not in envs[0]


@pytest.mark.parametrize("args,message", [
    (["--devices_per_process=4", "--", "--workdir=/w"], "--num_processes='' must be"),
    (["--num_processes=2", "--", "--workdir=/w"], "--devices_per_process='' must be"),
    (["--num_processes=x", "--devices_per_process=4", "--", "a"], "--num_processes='x'"),
    (["--num_processes=2", "--devices_per_process=4", "--port=99999", "--", "a"],
     "--port='99999' must be in 1..65535"),
    (["--num_processes=2", "--devices_per_process=4", "--workdir=/w"],
     "unknown option '--workdir=/w'"),
    (["--num_processes=2", "--devices_per_process=4", "--"], "no arguments for maelm_jax.main"),
])
def test_local_usage_errors(args, message):
  out = run_script([LOCAL_SH, *args, "--dry_run"] if "--" not in args else
                   [LOCAL_SH, "--dry_run", *args])
  assert out.returncode == 2
  assert message in out.stderr


@pytest.mark.parametrize("platforms,refused", [("cpu", True), ("cuda", False),
                                               ("cuda,cpu", False), ("", False)])
def test_a_gpu_launch_refuses_a_shells_jax_platforms_without_cuda(platforms, refused):
  """Exported in the shell, JAX_PLATFORMS=cpu reached every process of a GPU launch,
  which then trained on the CPU."""
  out = run_script([LOCAL_SH, "--dry_run", "--platform=gpu", "--num_processes=2",
                    "--devices_per_process=4", "--", *MAIN_ARGS, "--workdir=/w"],
                   env={"JAX_PLATFORMS": platforms})
  if refused:
    assert out.returncode == 2 and out.stdout == ""
    assert "JAX_PLATFORMS=cpu in this shell would keep the processes off the GPUs" in (
        out.stderr)
  else:
    assert out.returncode == 0, out.stderr
    assert "maelm_jax.main" in out.stdout


@pytest.fixture
def fake_cloud(tmp_path):
  """A `gcloud` on PATH that says the TPU is a v5litepod-16 (and logs its calls),
  and a planner stand-in (MAELM_PLAN_PYTHON) that logs its arguments, prints a
  plan and exits with $FAKE_PLAN_EXIT: the planner itself is tested in
  test_plan.py; here, what the launcher does with its answer."""
  bin_dir = tmp_path / "bin"
  bin_dir.mkdir()
  gcloud = bin_dir / "gcloud"
  gcloud.write_text('#!/bin/sh\necho "$@" >> "$FAKE_LOG.gcloud"\n'
                    'case "$*" in *describe*) echo v5litepod-16 ;; esac\n')
  planner = bin_dir / "plan-python"
  planner.write_text('#!/bin/sh\nprintf "%s\\n" "$@" > "$FAKE_LOG.plan"\n'
                     'echo "plan: v5e:4x4 (16 x TPU v5 lite), fits"\n'
                     'echo "  estimate 1.0 ms/step"\nexit ${FAKE_PLAN_EXIT:-0}\n')
  for script in (gcloud, planner):
    script.chmod(0o755)
  log = tmp_path / "log"
  env = {"PATH": f"{bin_dir}:{os.environ['PATH']}", "MAELM_PLAN_PYTHON": str(planner),
         "FAKE_LOG": str(log)}
  return env, log


def test_tpu_pod_plans_for_the_tpus_own_topology_before_launching(fake_cloud):
  env, log = fake_cloud
  out = run_script([TPU_POD_SH, "--tpu=my-pod", "--zone=z", "--dry_run", "--",
                    *MAIN_ARGS, "--workdir=/mnt/shared/run", "--verbose"], env=env)
  assert out.returncode == 0, out.stderr
  describe = open(f"{log}.gcloud").read().split()
  assert describe[:5] == ["compute", "tpus", "tpu-vm", "describe", "my-pod"]
  assert "--worker=all" not in describe
  planned = open(f"{log}.plan").read().split("\n")
  assert planned[:3] == ["-m", "maelm_jax.plan", "--topology=v5litepod-16"]
  assert planned[3:6] == MAIN_ARGS  # The run's config; not its workdir or --verbose.
  assert not any("workdir" in a or "verbose" in a for a in planned)
  # The dry run prints the plan (as comments), then the commands.
  assert "# plan: v5e:4x4 (16 x TPU v5 lite), fits" in out.stdout.splitlines()
  assert commands(out.stdout)[-1][:5] == ["gcloud", "compute", "tpus", "tpu-vm", "ssh"]
  # --topology: gcloud is not asked; --skip_plan: no plan at all.
  os.remove(f"{log}.gcloud")
  out = run_script([TPU_POD_SH, "--tpu=t", "--zone=z", "--topology=v4-16", "--dry_run",
                    "--", *MAIN_ARGS, "--workdir=/w"], env=env)
  assert out.returncode == 0 and not os.path.exists(f"{log}.gcloud")
  assert "--topology=v4-16" in open(f"{log}.plan").read()
  os.remove(f"{log}.plan")
  out = run_script([TPU_POD_SH, "--tpu=t", "--zone=z", "--topology=v4-16", "--skip_plan",
                    "--dry_run", "--", *MAIN_ARGS, "--workdir=/w"], env=env)
  assert out.returncode == 0 and not os.path.exists(f"{log}.plan")
  assert "# plan:" not in out.stdout


def test_tpu_pod_refuses_a_config_the_plan_says_does_not_fit(fake_cloud, tmp_path):
  env, _ = fake_cloud
  out = run_script([TPU_POD_SH, "--tpu=t", "--zone=z", "--", *MAIN_ARGS,
                    "--workdir=/w"], env={**env, "FAKE_PLAN_EXIT": "3"})
  assert out.returncode == 3
  assert out.stdout == ""  # No command ran, no worker was touched.
  assert "plan: v5e:4x4" in out.stderr and "nothing was launched" in out.stderr
  # A plan that cannot run (no libtpu here) stops the launch too, naming --skip_plan.
  out = run_script([TPU_POD_SH, "--tpu=t", "--zone=z", "--dry_run", "--", *MAIN_ARGS,
                    "--workdir=/w"], env={**env, "FAKE_PLAN_EXIT": "1"})
  assert out.returncode == 2 and out.stdout == ""
  assert "the plan failed (exit 1" in out.stderr and "--skip_plan" in out.stderr
  # No gcloud and no --topology: said before anything runs. The PATH is the
  # system's without gcloud, which /usr/bin may hold: there a real gcloud asked
  # the cloud (with its user's account) for TPU "t" and failed otherwise.
  out = run_script([TPU_POD_SH, "--tpu=t", "--zone=z", "--dry_run", "--", *MAIN_ARGS,
                    "--workdir=/w"], env={"PATH": path_without("gcloud", tmp_path)})
  assert out.returncode == 2 and out.stdout == ""
  assert "gcloud not found" in out.stderr and "--topology=v5e:4x4" in out.stderr


def path_without(command, tmp_path) -> str:
  """A PATH of /usr/bin and /bin's programs but `command`, linked into one folder."""
  bin_dir = tmp_path / f"bin_without_{command}"
  bin_dir.mkdir()
  for folder in ("/usr/bin", "/bin"):
    for name in os.listdir(folder):
      if name != command and not (bin_dir / name).exists():
        (bin_dir / name).symlink_to(os.path.join(folder, name))
  return str(bin_dir)


def test_tpu_pod_dry_run_prints_the_gcloud_commands():
  out = run_script([TPU_POD_SH, "--tpu=my-v4-32", "--zone=us-central2-b",
                    "--project=my-proj", "--skip_plan", "--dry_run", "--", *MAIN_ARGS,
                    "--workdir=/mnt/shared/run"])
  assert out.returncode == 0, out.stderr
  lines = commands(out.stdout)
  gcloud = [w for w in lines if w[0] == "gcloud"]
  assert [w[:5] for w in gcloud] == [
      ["gcloud", "compute", "tpus", "tpu-vm", "ssh"],
      ["gcloud", "compute", "tpus", "tpu-vm", "scp"],
      ["gcloud", "compute", "tpus", "tpu-vm", "ssh"],
      ["gcloud", "compute", "tpus", "tpu-vm", "ssh"]]
  for words in gcloud:
    assert "--zone=us-central2-b" in words and "--project=my-proj" in words
    assert "--worker=all" in words and "my-v4-32" in " ".join(words)
  scp = gcloud[1]
  assert "--recurse" in scp
  staged = scp[scp.index("--recurse") + 1]
  stage_line = out.stdout.splitlines()[1]  # The local copy that excludes junk.
  assert "--exclude=./.venv" in stage_line and "--exclude=./workdirs" in stage_line
  assert staged in stage_line
  install = gcloud[2][-1]
  assert install.startswith("--command=")
  assert "pip install -q -e '.[gcs]' 'jax[tpu]'" in install
  run = gcloud[3][-1]
  assert run.startswith("--command=")
  remote = shlex.split(run[len("--command="):])
  python = remote.index("~/maelm-venv/bin/python")
  assert "MAELM_DISTRIBUTED=tpu" in remote
  assert remote[python:] == ["~/maelm-venv/bin/python", "-m", "maelm_jax.main",
                             *MAIN_ARGS, "--workdir=/mnt/shared/run"]


def test_tpu_pod_relaunch_and_errors():
  out = run_script([TPU_POD_SH, "--tpu", "t", "--zone", "z", "--skip_plan", "--skip_copy",
                    "--skip_install", "--detach", "--dry_run", "--", "--workdir=/w"])
  assert out.returncode == 0, out.stderr
  lines = commands(out.stdout)
  assert len(lines) == 1 and "--project" not in " ".join(lines[0])
  assert "nohup" in lines[0][-1] and "~/maelm-jax.log" in lines[0][-1]
  # A workdir the next launch's `rm -rf ~/maelm-jax` would delete is refused.
  for workdir in ("rel", "/home/me/maelm-jax/run", "/home/me/maelm-jax"):
    out = run_script([TPU_POD_SH, "--tpu=t", "--zone=z", "--skip_plan", "--dry_run",
                      "--", f"--workdir={workdir}"])
    assert out.returncode == 2 and "deletes" in out.stderr, (workdir, out.stderr)
    assert out.stdout == ""  # Nothing printed to run.
  # A bucket is every worker's: accepted, and passed on as it is.
  out = run_script([TPU_POD_SH, "--tpu=t", "--zone=z", "--skip_plan", "--dry_run",
                    "--", "--workdir=gs://b/run"])
  assert out.returncode == 0 and "--workdir=gs://b/run" in out.stdout, out.stderr
  out = run_script([TPU_POD_SH, "--zone=z", "--dry_run", "--", "--workdir=/w"])
  assert out.returncode == 2 and "--tpu=NAME is required" in out.stderr
  out = run_script([TPU_POD_SH, "--tpu=t", "--zone=z", "--dry_run", "--", "--config=c"])
  assert out.returncode == 2 and "no --workdir" in out.stderr


# --------------------------------------------------------------------------
# jemalloc: preloaded by every launcher where installed (launch/jemalloc.sh)


@pytest.fixture
def fake_jemalloc(tmp_path):
  """A file standing in for libjemalloc.so.2 (dry runs only name it)."""
  library = tmp_path / "lib" / "libjemalloc.so.2"
  library.parent.mkdir()
  library.write_bytes(b"")
  return str(library)


def test_local_preloads_jemalloc_into_every_process(fake_jemalloc):
  out = run_script([LOCAL_SH, "--num_processes=2", "--devices_per_process=4", "--port=1234",
                    "--dry_run", "--", "--workdir=/w"],
                   env={"MAELM_JEMALLOC": fake_jemalloc, "LD_PRELOAD": "/opt/other.so"})
  assert out.returncode == 0, out.stderr
  envs = [split_env(w)[0] for w in commands(out.stdout)]
  assert [e["LD_PRELOAD"] for e in envs] == [f"{fake_jemalloc}:/opt/other.so"] * 2
  assert f"preloading jemalloc ({fake_jemalloc})" in out.stderr
  # Already preloaded (a relaunch from a shell that has it): not twice.
  out = run_script([LOCAL_SH, "--num_processes=1", "--devices_per_process=4", "--port=1234",
                    "--dry_run", "--", "--workdir=/w"],
                   env={"MAELM_JEMALLOC": fake_jemalloc, "LD_PRELOAD": fake_jemalloc})
  assert split_env(commands(out.stdout)[0])[0]["LD_PRELOAD"] == fake_jemalloc


def test_local_no_jemalloc_and_a_wrong_library_path(fake_jemalloc):
  out = run_script([LOCAL_SH, "--num_processes=1", "--devices_per_process=4", "--port=1234",
                    "--no_jemalloc", "--dry_run", "--", "--workdir=/w"],
                   env={"MAELM_JEMALLOC": fake_jemalloc})
  assert out.returncode == 0, out.stderr
  assert "LD_PRELOAD" not in split_env(commands(out.stdout)[0])[0]
  assert "--no_jemalloc: glibc's malloc" in out.stderr
  # A jemalloc this shell preloads already is taken out, other preloads kept.
  out = run_script([LOCAL_SH, "--num_processes=1", "--devices_per_process=4", "--port=1234",
                    "--no_jemalloc", "--dry_run", "--", "--workdir=/w"],
                   env={"LD_PRELOAD": f"{fake_jemalloc}:/opt/other.so"})
  assert split_env(commands(out.stdout)[0])[0]["LD_PRELOAD"] == "/opt/other.so"
  # A library named by hand that is not there stops the launch, before anything runs.
  out = run_script([LOCAL_SH, "--num_processes=1", "--devices_per_process=4", "--port=1234",
                    "--dry_run", "--", "--workdir=/w"],
                   env={"MAELM_JEMALLOC": fake_jemalloc + ".missing"})
  assert out.returncode == 2 and out.stdout == ""
  assert f"MAELM_JEMALLOC={fake_jemalloc}.missing is no file" in out.stderr


def test_another_preloaded_allocator_is_kept(fake_jemalloc):
  out = run_script([LOCAL_SH, "--num_processes=1", "--devices_per_process=4", "--port=1234",
                    "--dry_run", "--", "--workdir=/w"],
                   env={"MAELM_JEMALLOC": fake_jemalloc,
                        "LD_PRELOAD": "/usr/lib/libtcmalloc_minimal.so.4"})
  assert out.returncode == 0, out.stderr
  env = split_env(commands(out.stdout)[0])[0]
  assert env["LD_PRELOAD"] == "/usr/lib/libtcmalloc_minimal.so.4"  # Not two allocators.
  assert "holds another allocator" in out.stderr


def test_slurm_preloads_jemalloc_into_the_tasks(fake_jemalloc):
  out = run_script([SLURM_SBATCH, "--dry_run", "--", "--workdir=/w"],
                   env={"MAELM_JEMALLOC": fake_jemalloc})
  assert out.returncode == 0, out.stderr
  (words,) = commands(out.stdout)
  env, rest = split_env(words)
  assert env == {"LD_PRELOAD": fake_jemalloc} and rest[0] == "srun"
  out = run_script([SLURM_SBATCH, "--no_jemalloc", "--dry_run", "--", "--workdir=/w"],
                   env={"MAELM_JEMALLOC": fake_jemalloc})
  assert commands(out.stdout)[0][0] == "srun"


def test_tpu_pod_installs_and_preloads_jemalloc_on_each_worker(fake_jemalloc, tmp_path):
  out = run_script([TPU_POD_SH, "--tpu=t", "--zone=z", "--skip_plan", "--skip_copy",
                    "--dry_run", "--",
                    "--workdir=/w"])
  assert out.returncode == 0, out.stderr
  install, run = (w[-1][len("--command="):] for w in commands(out.stdout))
  assert "apt-get -qq install -y libjemalloc2" in install
  assert "jemalloc_preload" in run
  # The remote run command's preamble, executed here by a POSIX sh (a worker's
  # login shell need not be bash) in a copy of the repository's layout: it
  # exports LD_PRELOAD for the run.
  preamble = run[run.index("{ if [ -f launch/jemalloc.sh ]"):run.index("MAELM_DISTRIBUTED=tpu")]
  worker = tmp_path / "worker"
  (worker / "launch").mkdir(parents=True)
  (worker / "launch" / "jemalloc.sh").write_text((REPO / "launch" / "jemalloc.sh").read_text())
  script = preamble + 'echo "LD_PRELOAD=${LD_PRELOAD:-}"'
  env = {k: v for k, v in os.environ.items() if not k.startswith("MAELM_") and k != "LD_PRELOAD"}
  shown = subprocess.run(["sh", "-c", script], cwd=worker, capture_output=True, text=True,
                         env={**env, "MAELM_JEMALLOC": fake_jemalloc}, timeout=60)
  assert shown.returncode == 0, shown.stderr
  assert shown.stdout.strip() == f"LD_PRELOAD={fake_jemalloc}"
  assert "tpu_pod.sh on " in shown.stderr and "preloading jemalloc" in shown.stderr
  # A code copy from before the helper (a relaunch with --skip_copy) still runs.
  (worker / "launch" / "jemalloc.sh").unlink()
  shown = subprocess.run(["sh", "-c", script], cwd=worker, capture_output=True, text=True,
                         env=env, timeout=60)
  assert shown.returncode == 0 and shown.stdout.strip() == "LD_PRELOAD="
  assert "not in this code copy" in shown.stderr
  out = run_script([TPU_POD_SH, "--tpu=t", "--zone=z", "--skip_plan", "--skip_copy",
                    "--no_jemalloc",
                    "--dry_run", "--", "--workdir=/w"])
  assert "jemalloc" not in out.stdout


def test_the_launchers_search_where_host_memory_does():
  """launch/jemalloc.sh and maelm_jax/run/host_memory.py list the same places."""
  from maelm_jax.run import host_memory  # pylint: disable=import-outside-toplevel
  text = (REPO / "launch" / "jemalloc.sh").read_text()
  block = text[text.index('JEMALLOC_PATHS="') + len('JEMALLOC_PATHS="'):]
  shell_paths = tuple(block[:block.index('"')].split())
  assert shell_paths == host_memory.JEMALLOC_PATHS


def sbatch_headers():
  return dict(line[len("#SBATCH --"):].split("=", 1)
              for line in SLURM_SBATCH.read_text().splitlines()
              if line.startswith("#SBATCH --"))


def test_slurm_headers():
  headers = sbatch_headers()
  for key in ("nodes", "ntasks-per-node", "gpus-per-node", "time"):
    assert key in headers
  assert headers["ntasks-per-node"] == headers["gpus-per-node"]  # One per GPU.
  assert headers["signal"].startswith("TERM@")
  # sbatch reads #SBATCH lines only before the first command.
  lines = SLURM_SBATCH.read_text().splitlines()
  first_command = next(i for i, l in enumerate(lines[1:], 1)
                       if l.strip() and not l.startswith("#"))
  assert all(i < first_command for i, l in enumerate(lines) if l.startswith("#SBATCH"))


def test_slurm_dry_run_one_process_per_gpu():
  out = run_script([SLURM_SBATCH, "--no_jemalloc", "--dry_run", "--", *MAIN_ARGS,
                    "--workdir=/shared/w"],
                   env={"PYTHON": "/opt/py/bin/python"})
  assert out.returncode == 0, out.stderr
  (words,) = commands(out.stdout)
  headers = sbatch_headers()
  nodes, gpus = int(headers["nodes"]), int(headers["gpus-per-node"])
  assert words[0] == "srun"
  assert f"--ntasks-per-node={gpus}" in words and f"--ntasks={nodes * gpus}" in words
  assert "--kill-on-bad-exit=1" in words
  program = words[words.index("/opt/py/bin/python"):]
  assert program == ["/opt/py/bin/python", "-m", "maelm_jax.main", *MAIN_ARGS,
                     "--workdir=/shared/w"]


def test_slurm_dry_run_one_process_per_node_and_inside_a_job():
  out = run_script([SLURM_SBATCH, "--", "--workdir=/w"],
                   env={"DRY_RUN": "1", "MAELM_PROCS_PER": "node",
                        "SLURM_JOB_ID": "7", "SLURM_JOB_NUM_NODES": "4",
                        "SLURM_GPUS_ON_NODE": "4", "SLURM_CPUS_PER_TASK": "6",
                        "SLURM_SUBMIT_DIR": "/nonexistent"})
  assert out.returncode == 0, out.stderr
  (words,) = commands(out.stdout)
  env, rest = split_env(words)
  assert env == {"MAELM_LOCAL_DEVICE_IDS": "0,1,2,3"}
  assert rest[0] == "srun"
  for flag in ("--nodes=4", "--ntasks=4", "--ntasks-per-node=1", "--cpus-per-task=24"):
    assert flag in rest
  assert rest[rest.index("-m") - 1] == "python3"  # No .venv in the submit dir.
  assert "jemalloc.sh not found (submit from the repository root)" in out.stderr
  out = run_script([SLURM_SBATCH, "--dry_run", "--", "--workdir=/w"],
                   env={"MAELM_PROCS_PER": "rack"})
  assert out.returncode == 2 and "must be gpu or node" in out.stderr


def test_slurm_detection_matches_what_the_sbatch_script_starts():
  """What srun gives each task is what detect() turns into a slurm plan."""
  task_env = {"SLURM_JOB_ID": "7", "SLURM_NTASKS": "16", "SLURM_PROCID": "15",
              "SLURM_LOCALID": "7", "SLURM_STEP_NODELIST": "gpu[001-002]"}
  assert detect(task_env).kind == "slurm"
  per_node = {**task_env, "SLURM_NTASKS": "2", "SLURM_PROCID": "1", "SLURM_LOCALID": "0",
              "MAELM_LOCAL_DEVICE_IDS": "0,1,2,3,4,5,6,7"}
  assert detect(per_node).initialize_kwargs() == {"local_device_ids": list(range(8))}


# --------------------------------------------------------------------------
# local.sh process management, with a stand-in interpreter (no JAX).

FAKE_PYTHON = textwrap.dedent("""\
    #!/usr/bin/env bash
    # Stand-in for python: "$@" is -m maelm_jax.main <args>.
    id="$MAELM_PROCESS_ID"
    echo "fake $id of $MAELM_NUM_PROCESSES at $MAELM_COORDINATOR_ADDRESS with $JAX_NUM_CPU_DEVICES devices: $*"
    trap 'echo "fake $id got TERM"; exit 0' TERM
    trap 'echo "fake $id got INT"; exit 130' INT
    touch "$FAKE_DIR/ready_$id"
    if [ "$FAKE_MODE" = fail ] && [ "$id" = 1 ]; then
      echo "fake $id fails"; exit 7
    fi
    if [ "$FAKE_MODE" = ok ]; then exit 0; fi
    for _ in $(seq 600); do sleep 0.1; done
    echo "fake $id was never stopped"; exit 99
    """)


@pytest.fixture
def fake_python(tmp_path):
  path = tmp_path / "fake_python"
  path.write_text(FAKE_PYTHON)
  path.chmod(0o755)
  return path


def start_local(fake_python, tmp_path, mode, num_processes=2):
  env = {k: v for k, v in os.environ.items() if not k.startswith("MAELM_")}
  env.update(PYTHON=str(fake_python), FAKE_DIR=str(tmp_path), FAKE_MODE=mode)
  # As from a terminal: SIGINT at its default (helpers.with_sigint_default; bash
  # cannot trap a signal ignored on entry, so the launcher would never see the
  # forwarded Ctrl-C).
  return subprocess.Popen(
      helpers.with_sigint_default(
          ["bash", str(LOCAL_SH), f"--num_processes={num_processes}",
           "--devices_per_process=3", "--port=12345", "--",
           f"--workdir={tmp_path / 'w'}", "--x=1"]),
      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
      start_new_session=True)


def wait_ready(tmp_path, num_processes, timeout=30):
  deadline = time.monotonic() + timeout
  while time.monotonic() < deadline:
    if all((tmp_path / f"ready_{i}").exists() for i in range(num_processes)):
      time.sleep(0.3)  # Let the traps be installed and the loops start.
      return
    time.sleep(0.05)
  raise AssertionError("the fake processes did not start")


def logs(tmp_path, num_processes):
  return [(tmp_path / "w" / "logs" / f"process_{i}.log").read_text()
          for i in range(num_processes)]


def test_local_runs_every_process_and_streams_process_0(fake_python, tmp_path):
  proc = start_local(fake_python, tmp_path, "ok", num_processes=3)
  stdout, stderr = proc.communicate(timeout=60)
  assert proc.returncode == 0, stderr
  texts = logs(tmp_path, 3)
  for i, text in enumerate(texts):
    assert f"fake {i} of 3 at 127.0.0.1:12345 with 3 devices" in text
    assert "-m maelm_jax.main --workdir=" in text and "--x=1" in text
  assert "fake 0 of 3" in stdout and "fake 1 of 3" not in stdout
  assert "all 3 processes finished" in stderr


def test_local_one_failure_stops_the_rest(fake_python, tmp_path):
  proc = start_local(fake_python, tmp_path, "fail")
  stdout, stderr = proc.communicate(timeout=60)
  assert proc.returncode == 7
  assert "process 1 (pid" in stderr and "failed with exit status 7" in stderr
  assert "fake 1 fails" in stderr  # The tail of the failed process's log.
  assert "FAILED: process 1 of 2 exited with status 7" in stderr
  assert "fake 0 got TERM" in logs(tmp_path, 2)[0]
  assert "never stopped" not in logs(tmp_path, 2)[0]


@pytest.mark.parametrize("sig,code", [(signal.SIGTERM, 0), (signal.SIGINT, 130)])
def test_local_forwards_signals(fake_python, tmp_path, sig, code):
  proc = start_local(fake_python, tmp_path, "wait")
  wait_ready(tmp_path, 2)
  proc.send_signal(sig)
  stdout, stderr = proc.communicate(timeout=60)
  name = "TERM" if sig == signal.SIGTERM else "INT"
  assert f"forwarding SIG{name}" in stderr
  for i, text in enumerate(logs(tmp_path, 2)):
    assert f"fake {i} got {name}" in text
  # SIGTERM: the processes checkpoint and exit 0, and so does the launcher.
  assert proc.returncode == code, stderr


def test_local_logs_are_appended_across_launches(fake_python, tmp_path):
  for _ in range(2):
    proc = start_local(fake_python, tmp_path, "ok")
    proc.communicate(timeout=60)
    assert proc.returncode == 0
  for text in logs(tmp_path, 2):
    assert text.count("===== local.sh") == 2


class FakeStore:
  """JAX's coordination key-value store, as the watchdog uses it."""

  def __init__(self):
    self.values, self.reachable = {}, True

  def key_value_set(self, key, value, allow_overwrite=False):
    if not self.reachable:
      raise RuntimeError("UNAVAILABLE: failed to connect to the coordinator")
    self.values[key] = value

  def key_value_try_get(self, key):
    if not self.reachable:
      raise RuntimeError("UNAVAILABLE: failed to connect to the coordinator")
    if key not in self.values:
      raise RuntimeError(f"NOT_FOUND: {key} not found")
    return self.values[key]


def _watch(store, timeout_s=0.6, me=0, n=3):
  import threading  # pylint: disable=import-outside-toplevel
  lost, event = [], threading.Event()

  def on_lost(message):
    lost.append(message)
    event.set()

  dog = distributed.PeerWatchdog(store, me, n, timeout_s, interval_s=0.05,
                                 on_lost=on_lost).start()
  return dog, lost, event


def test_peer_watchdog_names_the_silent_process_within_its_bound():
  import time  # pylint: disable=import-outside-toplevel
  store = FakeStore()
  # Before the watchdog starts its own clock: read after, the bound's lower end
  # failed by a millisecond (0.599 s) in a full run on a busy machine.
  started = time.monotonic()
  dog, lost, event = _watch(store)
  while time.monotonic() - started < 1.5:  # Process 2 beats, process 1 never does.
    store.values["maelm/heartbeat/2"] = str(time.monotonic())
    if event.wait(0.05):
      break
  assert lost and lost[0].startswith("process 1 of 3 stopped sending heartbeats"), lost
  assert 0.6 <= time.monotonic() - started < 1.2  # timeout + a few intervals.
  assert "Relaunch every process with the same command" in lost[0]
  dog.finish()
  assert store.values["maelm/done/0"] == "1"


def test_peer_watchdog_spares_finished_peers_and_names_a_lost_coordinator():
  import time  # pylint: disable=import-outside-toplevel
  store = FakeStore()
  store.values["maelm/done/1"] = store.values["maelm/done/2"] = "1"
  dog, lost, event = _watch(store)
  assert not event.wait(1.0) and not lost  # Both peers finished: nothing to watch.
  dog.finish()
  store = FakeStore()
  dog, lost, event = _watch(store, me=1, n=2)
  store.values["maelm/heartbeat/0"] = "x"
  time.sleep(0.2)
  store.reachable = False  # Process 0, which serves the store, is gone.
  assert event.wait(2.0)
  assert lost[0].startswith("the coordinator (process 0) stopped sending heartbeats")


def test_peer_timeout_from_the_environment():
  assert distributed.peer_timeout_s({}) == distributed.DEFAULT_PEER_TIMEOUT_S
  assert distributed.peer_timeout_s({"MAELM_PEER_TIMEOUT_S": "0"}) == 0
  with pytest.raises(distributed.DistributedConfigError, match="not a number"):
    distributed.peer_timeout_s({"MAELM_PEER_TIMEOUT_S": "soon"})
