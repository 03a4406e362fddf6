"""What every `python -m maelm_jax...` command shares (maelm_jax/core/cli.py):
importing a command defines no flags, so commands share a process; a stray
argument, a misspelt `--config.x`, the project's own error and a Ctrl-C each end
in one line with their exit status."""

import importlib
import os
import pathlib
import re
import subprocess
import sys
import textwrap

import pytest

from maelm_jax.core import cli

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
COMMANDS = ("maelm_jax.main", "maelm_jax.plan", "maelm_jax.compare", "maelm_jax.sweep",
            "maelm_jax.evaluate.blimp", "maelm_jax.evaluate.analyze",
            "maelm_jax.interop.export_hf", "maelm_jax.interop.import_hf",
            "maelm_jax.interop.import_fairseq", "maelm_jax.data.prepare_data",
            "maelm_jax.finetune.sweep", "maelm_jax.tools.chaos",
            "maelm_jax.tools.profiling", "maelm_jax.tools.config_reference")


def python(*args, **kwargs):
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  return subprocess.run([sys.executable, *args], cwd=REPO, env=env,
                        capture_output=True, text=True, timeout=300, **kwargs)


def test_importing_every_command_defines_no_flag():
  """main and plan both have --config, every command --verbose: each defines its
  flags only when it runs, so a notebook or a test imports all of them."""
  done = python("-c", textwrap.dedent(f"""
      import importlib
      from absl import flags
      for name in {COMMANDS!r}:
        importlib.import_module(name)
      print({{module: [flag.name for flag in defined]
             for module, defined in flags.FLAGS.flags_by_module_dict().items()
             if module.startswith("maelm_jax")}})
      """))
  assert done.returncode == 0, done.stderr[-2000:]
  assert done.stdout.strip().splitlines()[-1] == "{}"


COMMAND = textwrap.dedent("""
    from absl import flags
    from maelm_jax.core import cli, workdir

    def define_flags():
      flags.DEFINE_string("what", "ok", "what main does")

    def main():
      what = flags.FLAGS.what
      if what == "user_error":  # Raised inside maelm_jax: said in one line.
        workdir.create("s3://bucket/run")
      if what == "interrupt":
        raise KeyboardInterrupt
      if what == "status":
        return 3
      if what == "gc":
        import gc
        print(*gc.get_threshold(), gc.get_freeze_count() > 1000)
        return
      print("ran")

    cli.run(main, define_flags, stopped="nothing was lost; the same command resumes")
    """)


@pytest.mark.parametrize("args,status,stderr", [
    ([], 0, ""),
    (["--what=status"], 3, ""),
    (["--what=user_error"], 1,
     "error: s3://bucket/run: the workdir URLs served are gs://BUCKET/PATH"),
    (["--what=user_error", "--verbose"], 1,  # That error's traceback, no other's.
     ["Traceback (most recent call last)",
      "ValueError: s3://bucket/run: the workdir URLs served are gs://BUCKET/PATH"]),
    (["--what=interrupt"], 130, "stopped: nothing was lost; the same command resumes"),
    (["stray"], 1, "unexpected arguments: ['stray']"),
    (["--wat=1"], 2, "error in the command line: Unknown command line flag 'wat'"),
])
def test_a_command_ends_with_its_status_and_one_line(tmp_path, args, status, stderr):
  script = tmp_path / "command.py"
  script.write_text(COMMAND)
  done = python(str(script), *args)
  assert done.returncode == status, done.stderr[-2000:]
  for words in [stderr] if isinstance(stderr, str) else stderr:
    assert words in done.stderr, done.stderr[-2000:]
  if status == 0:
    assert done.stdout.strip() == "ran" and not done.stderr
  if "--verbose" not in args and status == 1 and "user_error" in str(args):
    assert done.stderr.count("\n") <= 2  # The line and how to see the traceback.


def test_a_command_runs_with_pythons_collector_at_the_projects_thresholds(tmp_path):
  script = tmp_path / "command.py"
  script.write_text(COMMAND)
  done = python(str(script), "--what=gc")
  assert done.returncode == 0, done.stderr[-2000:]
  # The imports' objects frozen, out of every collection.
  assert done.stdout.split() == [*map(str, cli.GC_THRESHOLDS), "True"]


# ------------------------------------------------------- Console scripts --
SCRIPTS = re.findall(r'"(maelm-[\w-]+) = ([\w.]+):(\w+)"',
                     pathlib.Path(REPO, "setup.py").read_text())


def test_every_console_script_names_a_command():
  names = {name for name, _, _ in SCRIPTS}
  assert {"maelm-pretrain", "maelm-finetune", "maelm-blimp", "maelm-export",
          "maelm-import", "maelm-prepare", "maelm-plan"} <= names
  for name, module, function in SCRIPTS:
    assert module in COMMANDS, f"{name}: {module} is not a command"
    assert callable(getattr(importlib.import_module(module), function)), name
  readme = pathlib.Path(REPO, "README.md").read_text()
  unlisted = sorted(name for name in names if f"`{name}`" not in readme)
  assert not unlisted, f"README.md's list of console scripts leaves out {unlisted}"


def test_configs_resolve_to_the_packaged_ones_from_any_directory(tmp_path, monkeypatch):
  from maelm_jax.core import cli  # pylint: disable=g-import-not-at-top
  monkeypatch.chdir(tmp_path)
  packaged = cli.PACKAGED_CONFIGS
  assert cli.with_packaged_configs(
      ["x", "--config=configs/pretrain.py:objective=mlm", "--config.seed=1"]) == [
          "x", f"--config={packaged / 'pretrain.py'}:objective=mlm", "--config.seed=1"]
  assert cli.with_packaged_configs(["x", "--config", "configs/glue.py"]) == [
      "x", "--config", str(packaged / "glue.py")]
  # A file of that name here wins; other paths and names stay as they are.
  (tmp_path / "configs").mkdir()
  (tmp_path / "configs" / "glue.py").write_text("")
  for argv in (["x", "--config=configs/glue.py:task=rte"],
               ["x", "--config=configs/mine.py"], ["x", "--config=/a/pretrain.py"]):
    assert cli.with_packaged_configs(argv) == argv


def test_a_console_script_runs_from_another_directory(tmp_path):
  """After `pip install`, maelm-pretrain works outside the repository: its
  --help, and a dry run of the packaged config."""
  script = pathlib.Path(sys.executable).parent / "maelm-pretrain"
  assert script.exists(), (f"{script} is missing: install the package (make "
                           "install, or pip install -e .) to create the console scripts")
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  done = subprocess.run([str(script), "--help"], cwd=tmp_path, env=env,
                        capture_output=True, text=True, timeout=300)
  assert "--workdir: Where checkpoints" in done.stdout, done.stderr[-2000:]
  done = subprocess.run(
      [str(script), "--config=configs/pretrain.py:objective=mlm,size=tiny",
       f"--workdir={tmp_path / 'run'}", "--config.dry_run=True"],
      cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
  assert done.returncode == 0, done.stderr[-2000:]
  assert "dry run: nothing trained" in done.stdout and "mlm/tiny" in done.stdout
  assert not (tmp_path / "run").exists()


def test_every_console_script_helps_and_exits_0(tmp_path):
  """absl's --help exited 1 and printed the console script's empty docstring;
  maelm-finetune showed pretraining's help. Each command's own text, exit 0,
  and where the --config.* keys are described. (All at once: each is a process.)"""
  scripts = re.findall(r'"(maelm-[\w-]+) = ', (pathlib.Path(REPO) / "setup.py").read_text())
  assert len(scripts) >= 12
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  bin_dir = pathlib.Path(sys.executable).parent
  running = {name: subprocess.Popen([str(bin_dir / name), "--help"], cwd=tmp_path,
                                    env=env, stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, text=True)
             for name in scripts}
  helps = {}
  for name, process in running.items():
    out, err = process.communicate(timeout=300)
    assert process.returncode == 0, (name, process.returncode, err[-1000:])
    assert out.strip() and "flags:" in out, (name, out[:500])
    helps[name] = out
  for name in ("maelm-pretrain", "maelm-finetune", "maelm-sweep", "maelm-compare"):
    assert "docs/configuration.md" in helps[name], name
  assert "configs/glue.py" in helps["maelm-finetune"]
  assert "configs/squad.py" in helps["maelm-finetune"]
  assert helps["maelm-finetune"].splitlines()[0].startswith("Fine-tunes")
  assert helps["maelm-pretrain"].splitlines()[0].startswith("Pretrains")
  assert "A pretraining workdir" not in helps["maelm-export"]
  assert "fine-tuning workdir" in helps["maelm-export"]


def test_a_cpu_command_keeps_libtpus_probe_to_itself(tmp_path):
  """With the [tpu] extra installed (the test venv has it) and no TPU here, every
  command logged 'Unable to initialize backend tpu' and libtpu's trace."""
  pytest.importorskip("libtpu")
  env = {k: v for k, v in os.environ.items() if k != "JAX_PLATFORMS"}
  done = subprocess.run(
      [sys.executable, "-m", "maelm_jax.main",
       "--config=configs/pretrain.py:objective=mlm,size=tiny",
       f"--workdir={tmp_path / 'run'}", "--config.dry_run=True"],
      cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
  assert done.returncode == 0, done.stderr[-2000:]
  assert "dry run: nothing trained" in done.stdout
  for chatter in ("libtpu", "backend 'tpu'", "Source Location Trace"):
    assert chatter not in done.stderr, done.stderr[-2000:]


def test_a_command_that_imported_jax_first_is_kept_from_libtpus_probe_too():
  """blimp, analyze, compare and the sweeps import JAX with their module, before
  `cli.run`: JAX had read JAX_PLATFORMS by then, and setting the variable alone
  left their probe of the TPU (and its trace) as it was."""
  pytest.importorskip("libtpu")
  env = {k: v for k, v in os.environ.items() if k != "JAX_PLATFORMS"}
  done = subprocess.run(
      [sys.executable, "-c", "import jax\nfrom maelm_jax.core import cli\n"
       "cli._no_accelerator_probe()\nprint(jax.config.jax_platforms, jax.default_backend())"],
      cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
  assert done.returncode == 0, done.stderr[-2000:]
  assert done.stdout.split() == ["cpu", "cpu"]
  for chatter in ("libtpu", "backend 'tpu'", "Source Location Trace"):
    assert chatter not in done.stderr, done.stderr[-2000:]


def test_only_a_closed_event_loops_callback_error_is_kept_quiet():
  """The traceback TensorStore's callbacks print once orbax has closed its loop
  is dropped; the same message raised anywhere else is not."""
  import asyncio  # pylint: disable=import-outside-toplevel
  from maelm_jax.core import cli  # pylint: disable=import-outside-toplevel
  loop = asyncio.new_event_loop()
  loop.close()
  try:
    loop.call_later(0, lambda: None)
  except RuntimeError as error:
    from_the_loop = (type(error), error, error.__traceback__)
  try:
    raise RuntimeError("Event loop is closed")
  except RuntimeError as error:
    elsewhere = (type(error), error, error.__traceback__)
  # As a thread's callback reports it: the loop's own frame first.
  kind, error, trace = from_the_loop
  assert cli._closed_loop_noise(kind, error, trace.tb_next)  # pylint: disable=protected-access
  assert not cli._closed_loop_noise(*elsewhere)  # pylint: disable=protected-access
  assert not cli._closed_loop_noise(ValueError, ValueError("x"), None)  # pylint: disable=protected-access


def test_orbax_tracebacks_of_a_full_disk_are_dropped_through_their_causes():
  """Orbax logs the traceback of a failed write whose message says nothing; the
  full disk is in an exception it was raised from. The run says that in one line,
  so the filter drops orbax's record, and only orbax's (or asyncio's)."""
  import logging  # pylint: disable=import-outside-toplevel
  try:
    try:
      raise OSError(28, "No space left on device")
    except OSError as disk:
      raise RuntimeError("write failed") from disk
  except RuntimeError as error:
    exc_info = (type(error), error, error.__traceback__)

  def record(pathname, exc_info=exc_info, message="save failed"):
    return logging.LogRecord("x", logging.ERROR, pathname, 1, message, None, exc_info)

  quiet = cli.QuietLibraries()
  assert not quiet.filter(record("/site-packages/orbax/checkpoint/async.py"))
  assert not quiet.filter(record("/lib/python3.11/asyncio/base_events.py"))
  assert quiet.filter(record("/work/maelm_jax/run/train.py"))
  # Orbax's own error with no full disk or lost bucket in its chain stays.
  try:
    raise RuntimeError("write failed") from ValueError("bad shape")
  except RuntimeError as error:
    other = (type(error), error, error.__traceback__)
  assert quiet.filter(record("/site-packages/orbax/checkpoint/async.py", other))


def test_a_slot_refuses_bad_flags_and_a_refused_run_packs_nothing(tmp_path):
  """launch/slot.sh: a wrong flag or a missing --parts is one line and exit 2; a
  run refused before it wrote anything (an unknown config key) leaves no workdir
  and no parts, and its status is the slot's."""
  def slot(*args):
    return subprocess.run(["bash", "launch/slot.sh", *args], cwd=REPO,
                          capture_output=True, text=True, timeout=300)

  # Paths in tmp_path: were a refusal to fail, nothing lands in the checkout.
  for args in ([f"--workdir={tmp_path}/w", f"--parts={tmp_path}/p", "--bogus"],
               [f"--workdir={tmp_path}/w"]):
    done = slot(*args)
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1, done
    assert done.stderr.startswith("slot.sh:"), done.stderr
  workdir, parts = tmp_path / "run", tmp_path / "parts"
  done = slot(f"--workdir={workdir}", f"--parts={parts}", f"--python={sys.executable}",
              "--", "--config=configs/pretrain.py", "--config.model.no_such_key=1")
  assert done.returncode == 2 and "no_such_key" in done.stderr, done.stderr[-2000:]
  assert "slot.sh" not in done.stderr  # The run's own one line, not the slot's.
  assert not workdir.exists() and os.listdir(parts) == []
