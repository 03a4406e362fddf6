"""What every `python -m maelm_jax...` command shares (maelm_jax/core/cli.py):
importing a command defines no flags, so commands share a process; a stray
argument, a misspelt `--config.x`, the project's own error and a Ctrl-C each end
in one line with their exit status."""

import os
import subprocess
import sys
import textwrap

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
COMMANDS = ("maelm_jax.main", "maelm_jax.plan", "maelm_jax.compare", "maelm_jax.sweep",
            "maelm_jax.blimp", "maelm_jax.analyze", "maelm_jax.export_hf",
            "maelm_jax.import_hf", "maelm_jax.import_fairseq", "maelm_jax.prepare_data",
            "maelm_jax.finetune.sweep", "maelm_jax.chaos", "maelm_jax.profiling",
            "maelm_jax.tools.config_reference")


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
        workdir.create("gs://bucket/run")
      if what == "interrupt":
        raise KeyboardInterrupt
      if what == "status":
        return 3
      print("ran")

    cli.run(main, define_flags, stopped="nothing was lost; the same command resumes")
    """)


@pytest.mark.parametrize("args,status,stderr", [
    ([], 0, ""),
    (["--what=status"], 3, ""),
    (["--what=user_error"], 1,
     "error: --workdir=gs://bucket/run: URLs are not supported"),
    (["--what=user_error", "--verbose"], 1, "Traceback (most recent call last)"),
    (["--what=interrupt"], 130, "stopped: nothing was lost; the same command resumes"),
    (["stray"], 1, "unexpected arguments: ['stray']"),
    (["--wat=1"], 2, "error in the command line: Unknown command line flag 'wat'"),
])
def test_a_command_ends_with_its_status_and_one_line(tmp_path, args, status, stderr):
  script = tmp_path / "command.py"
  script.write_text(COMMAND)
  done = python(str(script), *args)
  assert done.returncode == status, done.stderr[-2000:]
  assert stderr in done.stderr
  if status == 0:
    assert done.stdout.strip() == "ran" and not done.stderr
  if "--verbose" not in args and status == 1 and "user_error" in str(args):
    assert done.stderr.count("\n") <= 2  # The line and how to see the traceback.
