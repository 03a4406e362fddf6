r"""The studies' one runner: a study config (studies/configs/*.py) names its runs;
this runs them through the product under one time limit, scores them, and keeps
what they made in one directory.

  python studies/run_study.py --config=studies/configs/babylm_knobs.py:scale=cpu \
      --out=runs/knobs_cpu --time_limit=2h30m --blimp_dir=.knobs/blimp
  python studies/run_study.py --config=studies/configs/babylm_knobs.py --out=x --dry_run

A study config is a sweep config (maelm_jax/sweep.py: `get_config(arg)`, the base of
every run, and `get_sweep(arg)`, the runs and their keys) that also defines
`get_study(arg)`: how the runs share the machine (STUDY_DEFAULTS). So the same file
runs one run after another, with no time limit, as `python -m maelm_jax.sweep
--config=<study config> --sweep_dir=DIR`. `--config.x=...` overrides apply to every
run, as the sweep's do. Phases, each logged to --out/timeline.txt as it ends, so a
study cut short keeps what it measured:

  1. token ids (`prepare`): the runs' text tokenized once (maelm_jax.data.prepare_data)
     into --out/ids, which the runs read instead, so no input worker tokenizes while
     the accelerator waits;
  2. the budget: the runs' own `total_flops`, --tflops, or, with `probe_s`, measured:
     the runs started as they will run (together, or each alone) for probe_s seconds;
     the slowest one's FLOP rate x `safety` x the seconds a run gets;
  3. the runs (`python -m maelm_jax.main`), under --out/runs/<name>: together, each
     with its share of the accelerator's memory, or one after another; each stops
     cleanly at its share of the time limit (`config.max_runtime`: it saves and exits
     0) and the same command resumes it. With --parts each goes through
     launch/slot.sh, so a run grows across machines with time limits;
  4. BLiMP (--blimp_dir) of each run's newest checkpoint, and with `blimp_half_way`
     of the kept one nearest half way, into --out/blimp and --out/blimp_half;
  5. the runs' params as slim workdirs (studies/slim_workdir.py, `keep_dtype`) in
     --out/keep/<name>: what fine-tuning and BLiMP read, a third of a workdir;
  6. GLUE (--glue_dir, --glue_tasks) by the comparison's protocol
     (studies/score_encoders.py, `finetune_config`) for the kept encoders, or for
     --encoders=name=dir,... pretrained earlier (the pretraining phases are then
     skipped), `glue_parallel` (encoder, task) processes at a time; the scores
     merged in --out/glue.json (studies/encoder_rows.py --scores reads it).

--dry_run resolves and checks every run's config (as `maelm_jax.main` would, before
any compilation) and prints the commands, running nothing.
"""

import json
import os
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from absl import app, flags  # noqa: E402
import ml_collections  # noqa: E402
from ml_collections import config_flags  # noqa: E402

from maelm_jax import sweep  # noqa: E402
from maelm_jax.run import checkpoints, config_lib  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# What `get_study(arg)` may set, with its default.
STUDY_DEFAULTS = dict(
    together=True,          # the runs at once (one small run leaves a GPU idle), or in turn
    memory_fraction=0.9,    # the accelerator memory the runs at once share equally
    prepare=True,           # token ids first (phase 1)
    prepare_workers=8,
    probe_s=0,              # > 0: the budget measured (phase 2) for this many seconds
    safety=0.6,             # a run's rate over its probe's (evaluation, checkpoints)
    blimp_pairs=200,        # BLiMP pairs per paradigm (the protocol's 200)
    blimp_half_way=False,
    blimp_s=240,            # seconds kept for BLiMP from the runs' time
    keep_dtype="bfloat16",  # the kept params' dtype ("" keeps nothing)
    keep_s=40,              # seconds kept for keeping from the runs' time
    finetune_config="configs/compare.py:size=tiny",  # GLUE's protocol (get_finetune)
    glue_parallel=16,
    grace_s=30,             # after a run's max_runtime: its save (and packing), then SIGKILL
)

FLAGS = flags.FLAGS


def define_flags() -> None:
  """The runner's flags (defined when it runs, so tests import it freely)."""
  config_flags.DEFINE_config_file("config", None, "A study config, e.g. "
                                  "studies/configs/babylm_knobs.py:scale=cpu",
                                  lock_config=False)
  flags.DEFINE_string("out", None, "The study's directory: runs/, logs/, keep/, blimp/, ...")
  flags.DEFINE_string("time_limit", "", "The whole study's wall-clock limit (9m, 2h30m; "
                      "empty: none)")
  flags.DEFINE_float("tflops", 0, "Each run's budget in TFLOPs (skips the probe)")
  flags.DEFINE_string("blimp_dir", "", "BLiMP's <UID>.jsonl folder; empty: no BLiMP")
  flags.DEFINE_string("glue_dir", "", "GLUE's folder (SST-2/, QNLI/, CoLA/); empty: no GLUE")
  flags.DEFINE_list("glue_tasks", ["sst2", "qnli", "cola"], "GLUE tasks")
  flags.DEFINE_list("encoders", [], "name=slim workdir,...: score these (phase 6) "
                    "instead of pretraining")
  flags.DEFINE_string("parts", "", "Each run through launch/slot.sh with its parts in "
                      "<parts>/<name>: a run that grows across machines")
  flags.DEFINE_string("python", sys.executable, "The Python that runs each phase")
  flags.DEFINE_bool("dry_run", False, "Check every run's config, print the commands, "
                    "run nothing")
  flags.mark_flags_as_required(["config", "out"])


# ---------------------------------------------------------------- the study's settings


def study_settings(module, arg) -> ml_collections.ConfigDict:
  """get_study(arg) over STUDY_DEFAULTS; an unknown key is refused."""
  own = dict(module.get_study(arg)) if hasattr(module, "get_study") else {}
  unknown = sorted(set(own) - set(STUDY_DEFAULTS))
  if unknown:
    raise ValueError(f"get_study sets unknown key(s) {unknown}; known: "
                     f"{sorted(STUDY_DEFAULTS)}")
  return ml_collections.ConfigDict({**STUDY_DEFAULTS, **own})


class Clock:
  """Seconds left of the time limit (a very large number without one), and the
  timeline every phase writes as it ends."""

  def __init__(self, limit: str, out: str):
    self.start = time.monotonic()
    self.limit = (config_lib.max_runtime_seconds(ml_collections.ConfigDict(
        {"max_runtime": limit})) or 1e9)
    self.timeline = os.path.join(out, "timeline.txt")

  def left(self) -> float:
    return self.limit - (time.monotonic() - self.start)

  def stamp(self, text: str) -> None:
    line = f"{time.strftime('%H:%M:%S')} +{time.monotonic() - self.start:.0f}s {text}"
    print(line, flush=True)
    with open(self.timeline, "a") as f:
      f.write(line + "\n")


def run_processes(jobs, deadline_s: float, parallel: int, grace_s: float = 20,
                  env: dict | None = None) -> dict:
  """Runs jobs [(name, argv, log path, extra env)], `parallel` at a time; at
  `deadline_s` from now each still running gets SIGTERM (a run saves), then SIGKILL
  `grace_s` later. {name: exit status}."""
  end = time.monotonic() + deadline_s
  pending, running, codes = list(jobs), {}, {}
  while pending or running:
    while pending and len(running) < parallel:
      name, argv, log, extra = pending.pop(0)
      with open(log, "a") as f:
        running[name] = [subprocess.Popen(argv, stdout=f, stderr=subprocess.STDOUT,
                                          cwd=ROOT, env={**os.environ, **(env or {}),
                                                         **extra}), None]
    time.sleep(0.5)
    for name, entry in list(running.items()):
      process, term_at = entry
      if process.poll() is not None:
        codes[name] = process.returncode
        del running[name]
      elif term_at is None and time.monotonic() > end:
        process.send_signal(signal.SIGTERM)
        entry[1] = time.monotonic()
      elif term_at is not None and time.monotonic() > term_at + grace_s:
        process.kill()
  return codes


# ---------------------------------------------------------------- the runs' commands


def run_argv(config_file, overrides, run, workdir, keys, python, parts="") -> list[str]:
  """`python -m maelm_jax.main` of one run, with the runner's `keys` last; with
  --parts, launch/slot.sh's (which adds --workdir and --config.max_runtime)."""
  keys = dict(keys)
  args = sweep.main_args(config_file, workdir, overrides, {**run["sets"], **keys})
  if not parts:
    return [python, "-m", "maelm_jax.main", *args]
  max_runtime = keys.get("max_runtime", "")
  args = [a for a in args if not a.startswith(("--workdir=", "--config.max_runtime="))]
  return ["bash", "launch/slot.sh", f"--workdir={workdir}",
          f"--parts={os.path.join(os.path.abspath(parts), run['name'])}",
          f"--max_runtime={max_runtime}", f"--python={python}", "--", *args]


def probed_budget(runs, probe_dir: str) -> float:
  """The slowest run's training FLOP rate in its probe (the first logged window
  holds the compilation's tail and is left out), in FLOP/s."""
  rates = []
  for run in runs:
    path = os.path.join(probe_dir, run["name"], "metrics.jsonl")
    with open(path) as f:
      speeds = [json.loads(line).get("tokens_per_sec") for line in f]
    speeds = [s for s in speeds if s][1:]
    if not speeds:
      raise RuntimeError(f"the probe of {run['name']} logged no speed: {path}")
    config = run["config"]
    steps_per_s = statistics.median(speeds) / (config.batch_size * config.seq_len)
    rates.append(config_lib.train_flops_per_step(config) * steps_per_s)
  return min(rates)


# The keys the runner sets itself (phases 1-3): a run already in --out may differ in
# them from its sweep entry (sweep.run_state refuses any other difference before
# anything starts); `maelm_jax.main` checks them again on resume.
RUNNER_KEYS = frozenset({"data.source", "total_flops", "total_steps", "max_runtime",
                         "checkpoint_every"})


def slim_copy(python: str, src: str, dst: str, dtype: str, log) -> bool:
  """studies/slim_workdir.py SRC DST --dtype, replacing an earlier copy at DST only
  once the new one is whole (a study run again with the same --out keeps its runs'
  newest params, and a copy cut short never stands in for one)."""
  partial = dst + ".partial"
  shutil.rmtree(partial, ignore_errors=True)
  done = subprocess.run([python, "studies/slim_workdir.py", src, partial,
                         f"--dtype={dtype}"], cwd=ROOT, stdout=log, stderr=log)
  if done.returncode:
    return False
  if os.path.exists(dst):
    shutil.rmtree(dst)
  os.rename(partial, dst)
  return True


def nearest_half_way(workdir: str) -> int:
  steps = checkpoints.committed_steps(workdir)
  return min(steps, key=lambda s: abs(s - steps[-1] / 2))


# ---------------------------------------------------------------- GLUE


def score_glue(encoders: dict, study, out: str, clock: Clock) -> None:
  """Phase 6: every (encoder, task) fine-tuned by the protocol, then merged."""
  py, jobs = FLAGS.python, []
  widened = os.path.join(out, "glue_encoders")
  os.makedirs(widened, exist_ok=True)
  for name, path in encoders.items():  # Fine-tuning expects float32 params.
    with open(f"{out}/logs/widen.log", "a") as log:
      if not slim_copy(py, path, os.path.join(widened, name), "float32", log):
        sys.exit(f"--encoders {name}={path}: not a workdir with a checkpoint "
                 f"({out}/logs/widen.log)")
    for task in FLAGS.glue_tasks:
      jobs.append((f"{name}_{task}", [
          py, "studies/score_encoders.py", f"--out={out}/glue/{name}/{task}",
          f"--config={study.finetune_config}", f"--encoders={name}={widened}/{name}",
          f"--glue_dir={FLAGS.glue_dir}", f"--tasks={task}", "--blimp_dir="],
          f"{out}/logs/glue_{name}_{task}.log",
          # Its own compilation cache: no process reads an entry another writes.
          {"JAX_COMPILATION_CACHE_DIR": f"{out}/jax_cache/{name}_{task}"}))
  parallel = min(study.glue_parallel, len(jobs))
  env = {"XLA_PYTHON_CLIENT_MEM_FRACTION": f"{0.85 / parallel:.3f}",
         # A GPU's float32 matmuls default to TF32; the protocol's float32 is exact.
         "JAX_DEFAULT_MATMUL_PRECISION": "highest"}
  run_processes(jobs, clock.left() - 10, parallel, env=env)
  merged, scored = {}, 0
  for name in encoders:
    for task in FLAGS.glue_tasks:
      # (A fine-tuning stopped at the deadline saves and exits 0: only its scores
      # say that it finished.)
      path = os.path.join(out, "glue", name, task, "scores.json")
      if os.path.exists(path):
        scored += 1
        with open(path) as f:
          for t, entry in json.load(f).get(name, {}).get("glue", {}).items():
            merged.setdefault(name, {}).setdefault("glue", {})[t] = entry
  with open(os.path.join(out, "glue.json"), "w") as f:
    json.dump(merged, f, indent=1)
  clock.stamp(f"GLUE: {scored} of {len(jobs)} (encoder, task) pairs scored; the same "
              f"command resumes the rest; {out}/glue.json")


# ---------------------------------------------------------------- main


def main(argv):
  del argv
  config_file = config_flags.get_config_filename(FLAGS["config"])
  overrides = config_flags.get_override_values(FLAGS["config"])
  arg = config_file.split(":", 1)[1] if ":" in config_file else None
  study = study_settings(config_lib.load_config_module(config_file), arg)
  out, py = os.path.abspath(FLAGS.out), FLAGS.python
  problem = config_lib.max_runtime_problem(
      ml_collections.ConfigDict({"max_runtime": FLAGS.time_limit}))
  if problem:
    sys.exit(problem.replace("max_runtime", "--time_limit"))
  if FLAGS.glue_dir and not os.path.isdir(FLAGS.glue_dir):
    sys.exit(f"--glue_dir={FLAGS.glue_dir}: no such folder")
  if FLAGS.blimp_dir and not os.path.isdir(FLAGS.blimp_dir):
    sys.exit(f"--blimp_dir={FLAGS.blimp_dir}: no such folder")
  if any("=" not in item for item in FLAGS.encoders):
    sys.exit(f"--encoders={','.join(FLAGS.encoders)}: write name=workdir,name=workdir")
  encoders = dict(item.split("=", 1) for item in FLAGS.encoders)
  if encoders:
    if not FLAGS.glue_dir:
      sys.exit("--encoders are scored on GLUE: pass --glue_dir")
    if FLAGS.dry_run:
      print("\n".join(f"GLUE of {n} ({p}): {', '.join(FLAGS.glue_tasks)}"
                      for n, p in encoders.items()))
      return
    os.makedirs(os.path.join(out, "logs"), exist_ok=True)
    score_glue(encoders, study, out, Clock(FLAGS.time_limit, out))
    return

  # Every run's config resolved and checked, and any run already in --out checked
  # against it, before anything starts (maelm_jax.sweep).
  try:
    runs = sweep.expand(config_file, overrides)
    for run in runs:
      run["workdir"] = os.path.join(out, "runs", run["name"])
      config_lib.validate(run["config"])  # maelm_jax.main's checks before compiling
      sweep.run_state(run, run["workdir"], config_lib.RESUMABLE_CHANGES | RUNNER_KEYS)
  except ValueError as error:  # Before anything starts.
    sys.exit(f"{config_file}, run {run['name']}: {error}")
  probing = study.probe_s > 0 and not FLAGS.tflops
  if FLAGS.dry_run:
    keys = {"data.source": f"arrayrecord:{out}/ids"} if study.prepare else {}
    keys.update({"total_flops": "<probed>"} if probing else (
        {"total_flops": FLAGS.tflops * 1e12} if FLAGS.tflops else {}))
    if FLAGS.time_limit:
      keys["max_runtime"] = "<its share>s"
    for run in runs:
      print(shlex.join(run_argv(config_file, overrides, run, run["workdir"], keys, py,
                                FLAGS.parts)))
    return
  os.makedirs(os.path.join(out, "logs"), exist_ok=True)
  clock = Clock(FLAGS.time_limit, out)
  clock.stamp(f"study {config_file}: {len(runs)} runs ({', '.join(r['name'] for r in runs)})")
  keys = {}

  # ---------------------------------------------------------------- 1. token ids
  if study.prepare:
    source = runs[0]["config"].data.source
    if any(r["config"].data.source != source or r["config"].tokenizer.path
           != runs[0]["config"].tokenizer.path for r in runs):
      sys.exit("prepare: the runs read different text or tokenizers; set prepare=False")
    if not source.startswith("text:"):
      sys.exit(f"prepare: data.source={source!r} is not text:; set prepare=False")
    ids = os.path.join(out, "ids")
    with open(f"{out}/logs/prepare.log", "a") as log:
      done = subprocess.run(
          [py, "-m", "maelm_jax.data.prepare_data", f"--source={source}", f"--out={ids}",
           f"--tokenizer={runs[0]['config'].tokenizer.path}",
           f"--workers={study.prepare_workers}"], cwd=ROOT, stdout=log, stderr=log)
    if done.returncode:
      sys.exit(f"prepare failed (exit {done.returncode}): {out}/logs/prepare.log")
    keys["data.source"] = f"arrayrecord:{ids}"
    clock.stamp(f"token ids in {ids}")

  together = len(runs) if study.together else 1
  memory = {"XLA_PYTHON_CLIENT_MEM_FRACTION": f"{study.memory_fraction / together:.3f}"}
  reserve_s = (study.blimp_s if FLAGS.blimp_dir else 0) + (
      study.keep_s if study.keep_dtype else 0)

  # ---------------------------------------------------------------- 2. the budget
  if FLAGS.tflops:
    keys["total_flops"] = FLAGS.tflops * 1e12
  elif probing:
    probe_keys = {**keys, "total_flops": 1e18, "checkpoint_every": 10**9,
                  "max_runtime": f"{study.probe_s}s"}
    jobs = [(r["name"], run_argv(config_file, overrides, r,
                                 os.path.join(out, "probe", r["name"]), probe_keys, py),
             f"{out}/logs/probe_{r['name']}.log", memory) for r in runs]
    run_processes(jobs, (study.probe_s + study.grace_s) * len(runs) / together, together)
    rate = probed_budget(runs, os.path.join(out, "probe"))
    run_s = (clock.left() - reserve_s) / (len(runs) / together)
    keys["total_flops"] = round(rate * study.safety * run_s, -9)
    clock.stamp(f"probed: the slowest run trains at {rate / 1e12:.2f} TFLOP/s; "
                f"{keys['total_flops'] / 1e12:.1f} TFLOP a run ({run_s:.0f} s each)")

  # ---------------------------------------------------------------- 3. the runs
  codes = {}
  for start in range(0, len(runs), together):
    batch = runs[start:start + together]
    share = (clock.left() - reserve_s - study.grace_s) / ((len(runs) - start) / together)
    if share < 30:
      clock.stamp(f"no time left for {[r['name'] for r in batch]} ({share:.0f} s)")
      break
    run_keys = {**keys, "max_runtime": f"{int(share)}s"} if FLAGS.time_limit else keys
    jobs = [(r["name"], run_argv(config_file, overrides, r, r["workdir"], run_keys, py,
                                 FLAGS.parts), f"{out}/logs/run_{r['name']}.log", memory)
            for r in batch]
    codes.update(run_processes(jobs, share + study.grace_s, together))
    clock.stamp("ran " + ", ".join(f"{r['name']} (exit {codes.get(r['name'])}, step "
                                   f"{checkpoints.latest_step(r['workdir'])})"
                                   for r in batch))
  trained = [r for r in runs if checkpoints.latest_step(r["workdir"]) is not None]

  # ---------------------------------------------------------------- 4. BLiMP
  if FLAGS.blimp_dir and trained:
    common = [f"--data={FLAGS.blimp_dir}", f"--max_pairs={study.blimp_pairs}",
              "--ngram_tokens=0", "--overwrite"]
    jobs = [("newest", [py, "-m", "maelm_jax.evaluate.blimp",
                        "--workdir=" + ",".join(r["workdir"] for r in trained),
                        f"--out={out}/blimp", *common], f"{out}/logs/blimp.log", {})]
    if study.blimp_half_way:
      jobs += [(f"half_{r['name']}", [
          py, "-m", "maelm_jax.evaluate.blimp", f"--workdir={r['workdir']}",
          f"--step={nearest_half_way(r['workdir'])}", f"--out={out}/blimp_half/{r['name']}",
          *common], f"{out}/logs/blimp_half_{r['name']}.log", {}) for r in trained]
    blimp_codes = run_processes(jobs, clock.left() - (study.keep_s if study.keep_dtype
                                                      else 0), len(jobs))
    clock.stamp(f"BLiMP: exit {blimp_codes}; {out}/blimp")

  # ---------------------------------------------------------------- 5. keep
  if study.keep_dtype:
    os.makedirs(os.path.join(out, "keep"), exist_ok=True)
    with open(f"{out}/logs/keep.log", "a") as log:
      kept = [r for r in trained if slim_copy(py, r["workdir"], os.path.join(
          out, "keep", r["name"]), study.keep_dtype, log)]
    clock.stamp(f"kept {len(kept)} of {len(trained)} runs' params in {out}/keep")
    trained = kept

  # ---------------------------------------------------------------- 6. GLUE
  if FLAGS.glue_dir and study.keep_dtype and trained:
    score_glue({r["name"]: os.path.join(out, "keep", r["name"]) for r in trained},
               study, out, clock)
  failed = {n: c for n, c in codes.items() if c}
  if failed:
    sys.exit(f"runs that failed: {failed} (their logs: {out}/logs)")


if __name__ == "__main__":
  define_flags()
  app.run(main)
