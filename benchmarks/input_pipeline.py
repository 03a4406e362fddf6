r"""Input pipeline throughput: packed rows/s of one host against what the train
step consumes.

  python benchmarks/input_pipeline.py \
      --source='text:<data>/corpus/gutenberg/*.txt.xz' \
      --tokenizer=runs/probe_tokenizer/tokenizer.model --seq_lens=128,512 --workers=0,1,2

For each length and `data.num_workers`, the real pretraining pipeline
(`pipeline.make_pretrain_dataset`: shuffle, tokenize, pack, batch; worker
processes through grain's mp_prefetch) is read for `--seconds` after a warm-up
batch, and rows/s and tokens/s are printed next to the consumption of the train
step at `--size` on one accelerator at `--mfu` of its peak (the FLOP model,
`flops.train_flops_per_step`; default: `base` on an H100 at 50%), and the margin
(produced / consumed; the issue asks for 2x per 16-core host).
"""

import argparse
import json
import pathlib
import sys
import time

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "configs")]

import pretrain  # noqa: E402  (configs/pretrain.py)
from maelm_jax.run import config_lib  # noqa: E402
from maelm_jax.modeling import flops, model as model_lib  # noqa: E402
from maelm_jax.data import pipeline, sources  # noqa: E402
from maelm_jax.data import tokenizer as tokenizer_lib  # noqa: E402

H100_BF16_PEAK = 989e12  # Dense bf16 FLOP/s (flops.CHIPS).


def consumed_tokens_per_s(size: str, seq_len: int, vocab: int, peak: float,
                          mfu: float, objective: str) -> float:
  config = pretrain.get_config(f"objective={objective},size={size}")
  config.unlock()
  config.seq_len = seq_len
  config = config_lib.resolve(config)
  cfg = model_lib.ModelConfig.from_config(config.model, vocab, 4)
  per_row = flops.train_flops_per_step(cfg, seq_len, 1)
  return mfu * peak / per_row * seq_len


def rows_per_second(source, tokenizer, seq_len: int, workers: int, seconds: float,
                    batch: int) -> float:
  ds = pipeline.make_pretrain_dataset(source, tokenizer, seq_len=seq_len,
                                      batch_size=batch, seed=0,
                                      num_workers=workers)
  it = iter(ds)
  next(it)  # Warm-up: worker start, first chunks tokenized.
  start, rows = time.perf_counter(), 0
  while time.perf_counter() - start < seconds:
    rows += next(it)["input_ids"].shape[0]
  return rows / (time.perf_counter() - start)


def main():
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--source", required=True, help="a data.source spec")
  p.add_argument("--tokenizer", required=True, help="a sentencepiece .model")
  p.add_argument("--seq_lens", default="128,512")
  p.add_argument("--workers", default="0,1,2")
  p.add_argument("--batch", type=int, default=64)
  p.add_argument("--seconds", type=float, default=20.0)
  p.add_argument("--size", default="base")
  p.add_argument("--objective", default="mlm")
  p.add_argument("--peak_flops", type=float, default=H100_BF16_PEAK)
  p.add_argument("--mfu", type=float, default=0.5)
  p.add_argument("--out", default="")
  args = p.parse_args()
  tokenizer = tokenizer_lib.Tokenizer(args.tokenizer)
  source = sources.open_source(args.source, "train", eval_fraction=0.01)
  for seq_len in (int(x) for x in args.seq_lens.split(",")):
    need = consumed_tokens_per_s(args.size, seq_len, tokenizer.vocab_size,
                                 args.peak_flops, args.mfu, args.objective)
    for workers in (int(x) for x in args.workers.split(",")):
      rate = rows_per_second(source, tokenizer, seq_len, workers, args.seconds,
                             args.batch)
      record = {"seq_len": seq_len, "workers": workers, "rows_per_s": round(rate, 1),
                "tokens_per_s": round(rate * seq_len),
                "train_step_tokens_per_s": round(need),
                "margin": round(rate * seq_len / need, 3),
                "consumer": f"{args.objective}/{args.size} at {args.mfu:.0%} of "
                            f"{args.peak_flops / 1e12:.0f} TFLOP/s"}
      print(json.dumps(record), flush=True)
      if args.out:
        with open(args.out, "a") as f:
          f.write(json.dumps(record) + "\n")


if __name__ == "__main__":
  main()
