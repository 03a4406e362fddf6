"""studies/run_study.py, the studies' one runner, and the study configs it runs."""

import json
import pathlib
import re
import shlex
import subprocess
import sys
import time

import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "studies"))
import run_study  # noqa: E402

from maelm_jax import sweep  # noqa: E402

STUDY_CONFIGS = sorted((REPO / "studies" / "configs").glob("*.py"))


def _documented_commands(path):
  """Every `python studies/run_study.py ...` command in a study config's docstring."""
  text = re.sub(r"\\\n\s*", " ", path.read_text().split('"""')[1])
  return [line.strip() for line in text.splitlines()
          if line.strip().startswith("python studies/run_study.py")]


def test_every_documented_study_command_parses_and_plans_its_runs(tmp_path):
  """Each command a study config's docstring gives runs as written, as a dry run:
  every run's config resolves and passes the checks `maelm_jax.main` makes before
  compiling, and one command per run is printed."""
  commands = [(path, c) for path in STUDY_CONFIGS for c in _documented_commands(path)]
  assert len(STUDY_CONFIGS) >= 4 and len(commands) >= len(STUDY_CONFIGS)
  processes = []
  for index, (path, command) in enumerate(commands):
    argv = shlex.split(command)
    argv = [sys.executable, *argv[1:], "--dry_run"]
    argv = [f"--out={tmp_path}/{index}" if a.startswith("--out=") else a for a in argv]
    # (the blimp and glue folders a command names are made beside the checkout.)
    argv = [a for a in argv if not a.startswith(("--blimp_dir=", "--glue_dir="))]
    processes.append((path, command, subprocess.Popen(
        argv, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)))
  for path, command, process in processes:
    output = process.communicate(timeout=120)[0]
    assert process.returncode == 0, f"{path.name}: {command}\n{output[-2000:]}"
    config = command.split("--config=")[1].split()[0]
    runs = sweep.expand(config, {})
    printed = [line for line in output.splitlines() if "maelm_jax.main" in line
               or "launch/slot.sh" in line]
    assert len(printed) == len(runs), output
    for run, line in zip(runs, printed):
      assert f"/runs/{run['name']}" in line


def test_a_run_the_product_would_refuse_stops_the_dry_run_before_anything_starts(
    tmp_path):
  out = subprocess.run(
      [sys.executable, "studies/run_study.py", "--config=studies/configs/grow.py",
       f"--out={tmp_path}", "--dry_run", "--config.model.mask_ratio=1.5"],
      cwd=REPO, capture_output=True, text=True, timeout=120)
  assert out.returncode == 1 and "run grow" in out.stderr, out.stderr[-2000:]
  assert "model.mask_ratio=1.5 must be in (0, 1)" in out.stderr
  assert "maelm_jax.main" not in out.stdout and not list(tmp_path.iterdir())


def test_a_study_with_an_unknown_setting_or_variant_is_refused():
  module = type("Study", (), {"get_study": staticmethod(lambda arg: {"togther": True})})
  with pytest.raises(ValueError, match="unknown key.*togther"):
    run_study.study_settings(module, None)
  with pytest.raises(ValueError, match="variants: unknown.*gelu"):
    sweep.expand("studies/configs/babylm_knobs.py:variants=base+gelu", {})


def _knob_runs(variants="base+geglu"):
  return sweep.expand(f"studies/configs/babylm_knobs.py:scale=smoke,variants={variants}",
                      {})


def test_the_probed_budget_is_the_slowest_runs_flop_rate(tmp_path):
  """Phase 2: each run's median tokens/s after its first window (the compilation's
  tail), turned into FLOP/s by its own cost per step; the slowest rate wins."""
  runs = _knob_runs()
  speeds = {"base": [100, 4000, 5000, 6000], "geglu": [50, 3000, 3500, 3000]}
  for run in runs:
    (tmp_path / run["name"]).mkdir()
    (tmp_path / run["name"] / "metrics.jsonl").write_text("".join(
        json.dumps({"step": i, "tokens_per_sec": s}) + "\n"
        for i, s in enumerate(speeds[run["name"]])) + json.dumps({"eval/loss": 1}) + "\n")
  rates = {}
  for run in runs:
    config = run["config"]
    per_step = run_study.config_lib.train_flops_per_step(config)
    median = sorted(speeds[run["name"]][1:])[1]
    rates[run["name"]] = per_step * median / (config.batch_size * config.seq_len)
  assert rates["base"] != rates["geglu"]
  assert run_study.probed_budget(runs, str(tmp_path)) == pytest.approx(min(rates.values()))
  (tmp_path / "geglu" / "metrics.jsonl").write_text(json.dumps({"tokens_per_sec": 9}) + "\n")
  with pytest.raises(RuntimeError, match="probe of geglu logged no speed"):
    run_study.probed_budget(runs, str(tmp_path))


def test_a_run_of_another_config_in_out_is_refused_before_anything_starts(tmp_path):
  """A run already in --out resumes when only the runner's own keys differ (its
  token ids, its probed budget, its time limit); another config is named."""
  run = _knob_runs("base")[0]
  run["workdir"] = str(tmp_path / "base")
  (tmp_path / "base").mkdir()
  saved = json.loads(run["config"].to_json_best_effort())
  saved.update(total_flops=3e12, total_steps=999, max_runtime="60s")
  saved["data"]["source"] = "arrayrecord:/somewhere/ids"
  (tmp_path / "base" / "config.json").write_text(json.dumps(saved))
  run_study.sweep.run_state(
      run, run["workdir"], run_study.config_lib.RESUMABLE_CHANGES | run_study.RUNNER_KEYS)
  saved["model"]["normformer"] = True
  (tmp_path / "base" / "config.json").write_text(json.dumps(saved))
  with pytest.raises(ValueError, match="another config.*model.normformer"):
    run_study.sweep.run_state(
      run, run["workdir"], run_study.config_lib.RESUMABLE_CHANGES | run_study.RUNNER_KEYS)


def test_processes_past_the_deadline_get_sigterm_then_sigkill(tmp_path):
  """What a time limit does to the runs: SIGTERM at the deadline (a run saves and
  exits), SIGKILL `grace_s` later for one that does not stop; at most `parallel`
  at once; every exit status returned."""
  code = {"quick": "print('done')",
          "stops": "import time; time.sleep(60)",
          "deaf": ("import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
                   "print('ready', flush=True); time.sleep(60)")}
  jobs = [(name, [sys.executable, "-c", source], str(tmp_path / f"{name}.log"), {})
          for name, source in code.items()]
  start = time.monotonic()
  codes = run_study.run_processes(jobs, deadline_s=2, parallel=3, grace_s=1)
  took = time.monotonic() - start
  assert codes == {"quick": 0, "stops": -15, "deaf": -9}
  assert 3 < took < 15
  assert (tmp_path / "quick.log").read_text() == "done\n"
  # One at a time: the second starts when the first ends.
  jobs = [(n, [sys.executable, "-c", "import time; print(time.time()); time.sleep(1)"],
           str(tmp_path / f"serial_{n}.log"), {}) for n in ("a", "b")]
  assert run_study.run_processes(jobs, deadline_s=60, parallel=1) == {"a": 0, "b": 0}
  starts = [float((tmp_path / f"serial_{n}.log").read_text()) for n in ("a", "b")]
  assert starts[1] - starts[0] >= 1.0


def test_with_parts_a_run_goes_through_the_slot_script():
  run = _knob_runs("base")[0]
  argv = run_study.run_argv("studies/configs/babylm_knobs.py:scale=smoke", {}, run,
                            "/w/base", {"max_runtime": "300s", "total_flops": 1e12},
                            "python3", parts="/p")
  assert argv[:6] == ["bash", "launch/slot.sh", "--workdir=/w/base", "--parts=/p/base",
                      "--max_runtime=300s", "--python=python3"]
  rest = argv[argv.index("--") + 1:]
  assert "--config=studies/configs/babylm_knobs.py:scale=smoke" in rest
  assert "--config.total_flops=1000000000000.0" in rest
  assert not [a for a in rest if a.startswith(("--workdir", "--config.max_runtime"))]


def test_a_failed_slim_copy_leaves_the_earlier_copy_in_place(tmp_path):
  """Phase 5 run again with the same --out: the kept copy is replaced only by a
  whole new one; a source that cannot be copied leaves the earlier copy as it was."""
  kept = tmp_path / "keep" / "base"
  kept.mkdir(parents=True)
  (kept / "config.json").write_text("{}")
  with open(tmp_path / "keep.log", "w") as log:
    assert not run_study.slim_copy(sys.executable, str(tmp_path / "no_such_run"),
                                   str(kept), "bfloat16", log)
  assert (kept / "config.json").read_text() == "{}"
  assert "no_such_run" in (tmp_path / "keep.log").read_text()
