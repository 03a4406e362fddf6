r"""Memory and start-up of a training process against corpus size: `arrayrecord:`
(prepared, read lazily) stays flat, `text:` (read whole) grows.

  python benchmarks/corpus_scaling.py \
      --wikipedia='<data>/corpus/wikipedia/*.jsonl.xz' --scratch=runs/cs \
      --tokenizer=runs/study/tokenizer/tokenizer.model --scales=1,10 --text_scales=1,10

Steps:
  1. `<scratch>/in_1x/`: the Wikipedia shards decompressed (JSON Lines);
     `<scratch>/in_<k>x/`: k symbolic links to each of them (k times the
     documents, as many input files k times over);
  2. `prepare_data --workers=<workers>` of each scale into `<scratch>/ar_<k>x`,
     timed: MB/s of text in all and per worker;
  3. for each corpus, a fresh training process (`maelm_jax.main`, tiny MAE-LM,
     `--steps` steps, the given tokenizer so that none is trained) while its
     resident memory (the process and its children) is sampled every 0.1 s:
     the peak, and the seconds from launch to the log line of step 1 (data
     opened, corpus statistics, baselines, compilation, the first step);
  4. one JSON line per measurement to stdout and `<scratch>/results.jsonl`.

The pipeline's rows/s against what the train step consumes is
`benchmarks/input_pipeline.py --source=arrayrecord:<scratch>/ar_1x`.
"""

import argparse
import glob
import json
import lzma
import os
import pathlib
import subprocess
import sys
import tempfile
import time

import psutil

REPO = pathlib.Path(__file__).resolve().parents[1]


def build_inputs(wikipedia: str, scratch: pathlib.Path, scales: list[int]) -> None:
  one = scratch / "in_1x"
  if not one.is_dir():
    one.mkdir(parents=True)
    for path in sorted(glob.glob(wikipedia)):
      name = os.path.basename(path).removesuffix(".xz")
      with lzma.open(path, "rb") as src, open(one / (name + ".part"), "wb") as dst:
        while chunk := src.read(1 << 24):
          dst.write(chunk)
      os.replace(one / (name + ".part"), one / name)
  files = sorted(one.glob("*.jsonl"))
  for k in scales:
    directory = scratch / f"in_{k}x"
    if k == 1 or directory.is_dir():
      continue
    directory.mkdir()
    for copy in range(k):
      for f in files:
        (directory / f"{copy:03d}-{f.name}").symlink_to(f)


def prepare(scratch: pathlib.Path, k: int, workers: int, tokenizer: str | None,
            tag: str) -> dict:
  out = scratch / f"{tag}_{k}x"
  cmd = [sys.executable, "-m", "maelm_jax.data.prepare_data",
         f"--source=text:{scratch}/in_{k}x/*.jsonl", f"--out={out}",
         f"--workers={workers}"] + ([f"--tokenizer={tokenizer}"] if tokenizer else [])
  started = time.monotonic()
  subprocess.run(cmd, cwd=REPO, check=True, capture_output=True)
  seconds = time.monotonic() - started
  with open(out / "corpus.json") as f:
    metadata = json.load(f)
  mb = metadata["text_bytes"] / 1e6
  return {"what": "prepare", "format": metadata["format"], "scale": k,
          "documents": metadata["documents"], "text_mb": round(mb, 1),
          "shards_mb": round(metadata["file_bytes"] / 1e6, 1),
          "seconds": round(seconds, 1), "workers": workers,
          "mb_per_s": round(mb / seconds, 1),
          "mb_per_s_per_worker": round(mb / seconds / workers, 1)}


def train_process(source: str, tokenizer: str, workdir: pathlib.Path,
                  steps: int) -> dict:
  cmd = [sys.executable, "-m", "maelm_jax.main",
         "--config=configs/pretrain.py:objective=maelm,size=tiny",
         f"--config.data.source={source}", f"--config.tokenizer.path={tokenizer}",
         f"--config.total_steps={steps}", "--config.log_every=1",
         f"--config.eval_every={steps}", "--config.eval_batches=2",
         f"--config.checkpoint_every={steps}", f"--workdir={workdir}"]
  env = {**os.environ, "JAX_PLATFORMS": "cpu"}
  log_path = workdir.with_suffix(".log")
  started = time.monotonic()
  with open(log_path, "w") as log:
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=log,
                            stderr=subprocess.STDOUT)
  handle = psutil.Process(proc.pid)
  peak, step1 = 0, None
  while proc.poll() is None:
    try:
      rss = handle.memory_info().rss + sum(
          c.memory_info().rss for c in handle.children(recursive=True))
      peak = max(peak, rss)
    except psutil.Error:
      pass
    if step1 is None and "step 1 done" in log_path.read_text(errors="replace"):
      step1 = time.monotonic() - started
    time.sleep(0.1)
  if proc.returncode:
    raise SystemExit(f"{' '.join(cmd)} failed:\n{log_path.read_text()[-3000:]}")
  return {"peak_rss_mb": round(peak / 2**20), "seconds_to_step_1": round(step1, 1),
          "seconds_total": round(time.monotonic() - started, 1)}


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--wikipedia", default="",
                      help="glob of the downloaded Wikipedia shards, "
                      "<data>/corpus/wikipedia/*.jsonl.xz")
  parser.add_argument("--scratch",
                      default=os.path.join(tempfile.gettempdir(), "corpus_scaling"))
  parser.add_argument("--tokenizer", required=True,
                      help="a tokenizer.model, so that no run trains one")
  parser.add_argument("--scales", default="1,10")
  parser.add_argument("--text_scales", default="1,10",
                      help="scales also trained from text: (read whole); '' for none")
  parser.add_argument("--workers", type=int, default=os.cpu_count() or 1)
  parser.add_argument("--steps", type=int, default=5)
  args = parser.parse_args()
  if not args.wikipedia:
    raise SystemExit("--wikipedia is required: a glob of the downloaded Wikipedia "
                     "shards, '<data>/corpus/wikipedia/*.jsonl.xz'")
  scratch = pathlib.Path(args.scratch)
  scales = [int(s) for s in args.scales.split(",") if s]
  text_scales = [int(s) for s in args.text_scales.split(",") if s]
  build_inputs(args.wikipedia, scratch, sorted(set(scales + text_scales)))
  results_path = scratch / "results.jsonl"

  def record(result):
    print(json.dumps(result), flush=True)
    with open(results_path, "a") as f:
      f.write(json.dumps(result) + "\n")

  for k in scales:
    for tag, tokenizer in (("ar", None), ("ids", args.tokenizer)):
      if not (scratch / f"{tag}_{k}x" / "corpus.json").exists():
        record(prepare(scratch, k, args.workers, tokenizer, tag))
  runs = [(f"arrayrecord text {k}x", f"arrayrecord:{scratch}/ar_{k}x", k)
          for k in scales]
  runs += [(f"arrayrecord token ids {k}x", f"arrayrecord:{scratch}/ids_{k}x", k)
           for k in scales]
  runs += [(f"text: {k}x", f"text:{scratch}/in_{k}x/*.jsonl", k) for k in text_scales]
  for name, source, k in runs:
    workdir = scratch / "runs" / name.replace(" ", "_").replace(":", "")
    workdir.parent.mkdir(parents=True, exist_ok=True)
    if workdir.exists():
      import shutil  # pylint: disable=import-outside-toplevel
      shutil.rmtree(workdir)
    record({"what": "train", "source": name, "scale": k,
            **train_process(source, args.tokenizer, workdir, args.steps)})


if __name__ == "__main__":
  main()
