"""The planner (maelm_jax/plan.py): the run's own steps compiled for real TPU
slices by libtpu on this CPU host, their memory, FLOPs, collectives and
attention kernels, and the answers it gives a user before a slice is paid for."""

import math
import os
import pathlib
import platform
import subprocess
import sys

import jax
import pytest

from maelm_jax.modeling import attention
from maelm_jax import plan
from maelm_jax.core import sharding
from maelm_jax.run import train, train_lib
from maelm_jax.finetune import run as finetune_run
from tests.helpers import tiny_config
from tests.test_finetune_e2e import glue_test_config, pretrained, write_sst2  # noqa: F401

# Real runs as processes, or compiles for TPU chips: `make test-quick` leaves
# this file out (pytest.ini's `slow`). The compiles for chips have XLA's
# optimisations, as a user's plan does (`optimized`, tests/conftest.py); the
# tests that compile for this CPU do not, as the rest of the suite: the three of
# them 21.9 and 22.0 CPU-s against 34.4 and 32.5 optimized (two alternating pairs,
# benchmarks/test-suite-cost.md).
pytestmark = pytest.mark.slow

REPO = pathlib.Path(__file__).resolve().parents[1]
LINUX_X86 = platform.system() == "Linux" and platform.machine() == "x86_64"
# libtpu is in the test extras wherever it is built (Linux x86-64): there a
# missing libtpu fails these tests rather than skipping them.
needs_libtpu = pytest.mark.skipif(not LINUX_X86, reason="libtpu: Linux x86-64 only")


def plan_config(objective="maelm", size="tiny", **overrides):
  config = tiny_config(objective, **overrides)
  config.model.size = size
  config.model.dtype = "bfloat16"
  return config


def run_plan_cli(*args, env=None):
  return subprocess.run([sys.executable, "-m", "maelm_jax.plan", *args], cwd=REPO,
                        capture_output=True, text=True, timeout=1200,
                        env={**os.environ, **(env or {})})


def user_lines(stderr: str) -> list[str]:
  """stderr without libtpu's start-up chatter on a host with no TPU."""
  return [line for line in stderr.splitlines()
          if line.startswith("plan:") or line.startswith("error")]


# ------------------------------------------------------------ Compiled --


@needs_libtpu
@pytest.mark.optimized
def test_tiny_maelm_compiles_for_v5e_with_the_kernel_in_encoder_and_decoder(tmp_path):
  """MAE-LM's encoder (222 visible of 256) runs the Pallas kernel through
  Mosaic, padded to 256, as its decoder does; the compiled HLO holds the
  kernel's two calls (forward, backward) for each of the 3 layers. FLOPs
  agree with the model; fsdp over the 4 chips holds a quarter of the state."""
  # 256, not 512: the same kernels and asserts; libtpu compiles it in 2/3 of the
  # time (48 s against 68 s, tests/test_plan.py's config through plan.run, idle).
  # Batch 8, not 32 (2 rows a chip): the same kernels, layouts and asserts; its
  # plan.run 15.7 against 29.6 CPU-s (two alternating pairs, test-suite-cost.md).
  config = plan_config("maelm", seq_len=256, batch_size=8,
                       **{"model.attention_dropout": 0.0, "mesh_shape": (1, 4, 1)})
  status, result, lines = plan.run(config, "v5e:2x2", out=str(tmp_path))
  assert status == 0 and result["fits"], lines
  assert result["chips"] == 4 and result["chip_kind"] == "TPU v5 lite"
  assert result["mesh"] == {"data": 1, "fsdp": 4, "tensor": 1}
  assert result["attention"]["encoder"]["implementation"] == "tpu_flash"
  assert result["attention"]["encoder"]["q_len"] == 222
  assert result["attention"]["encoder"]["kernel_lengths"] == [256, 256]
  assert result["attention"]["decoder"]["implementation"] == "tpu_flash"
  layers = 2 + 1  # tiny: 2 encoder layers, 1 decoder layer.
  assert result["tpu_custom_calls"]["per_step"] == 2 * layers
  # The kernel's calls state their cost, so XLA counts them: nothing added.
  assert not any("Pallas" in note for note in result["xla_flops_notes"])
  ratio = result["xla_flops_per_chip"] / result["model_flops_per_chip"]
  # XLA counts what the kernel does: its lengths padded to 128 (222 -> 256) and
  # the backward's recomputed scores, which the model's count leaves out.
  assert 0.9 < ratio < 1.3, ratio
  built = plan.build(config, plan.topology_devices("v5e:2x2")[0])
  unsharded = sum(x.size * x.dtype.itemsize
                  for x in jax.tree.leaves(built.program.abstract_state))
  # The state's shards: a quarter of it, but for the small replicated leaves
  # (biases, LayerNorms).
  assert abs(result["state_bytes_per_chip"] / (unsharded / 4) - 1) < 0.1
  # What the compiler allocates for them adds the TPU's tiled layouts: a 64-wide
  # head dimension fills 128 lanes (measured: 6.11 MB against 5.33, +14.7%).
  arguments = result["bytes_per_chip"]["arguments"]
  assert abs(arguments / (unsharded / 4) - 1) < 0.2, (arguments, unsharded)
  padding = result["bytes_per_chip"]["layout_padding"]
  assert 0 < padding < 0.2 * arguments
  assert result["collectives"]["all-gather"]["count"] > 0  # fsdp gathers params.
  # The byte budget: every byte of the count in one category, the kernels and
  # the bias among them; the first-principles count beside it, both printed.
  budget = result["hbm_traffic_by_category_per_chip"]
  assert sum(budget.values()) == pytest.approx(result["hbm_traffic_bytes_per_chip"])
  # (At this size, its activations laid out by rows, the compiler keeps the
  # kernels' q, k, v and outputs in VMEM: no HBM bytes of theirs to count.)
  assert {"matmuls", "position bias"} <= set(budget), budget
  needed = result["hbm_first_principles_per_chip"]
  parts = ("weights and optimizer", "activations", "position bias", "head")
  assert all(needed[p] > 0 for p in parts), needed
  assert needed["total"] == pytest.approx(sum(needed[p] for p in parts))
  assert any(line.startswith("  hbm/chip") for line in lines), lines
  assert any(line.startswith("  needed") for line in lines), lines
  written = (tmp_path / "plan.json").read_text()
  for key in plan.PLAN_KEYS:
    assert f'"{key}"' in written


@needs_libtpu
@pytest.mark.optimized
@pytest.mark.parametrize("topology,kind,loops", [
    ("v4:2x2x1", "TPU v4", {}),
    # Scanned layers inside a 2-microbatch accumulation loop: what runs per step
    # is read through both loops' trip counts from the compiled program.
    ("v5p:2x2x1", "TPU v5", {"model.scan_layers": True, "grad_accum_steps": 2}),
])
def test_the_kernel_asked_for_by_name_compiles_for_v4_and_v5p(topology, kind, loops):
  """`attention_impl=tpu_flash` (which insists on the kernel) through Mosaic for
  megacore chips too: every layer's two kernel calls in the program."""
  # 128, not 256: the same kernel calls; v5p's test 81.3 against 97.7 CPU-s in the
  # suite (benchmarks/test-suite-cost.md).
  config = plan_config("maelm", seq_len=128, batch_size=8,
                       **{"model.attention_dropout": 0.0,
                          "model.attention_impl": "tpu_flash", **loops})
  status, result, lines = plan.run(config, topology)
  assert status == 0, lines
  assert result["chip_kind"] == kind and result["chips"] == 4
  assert {v["implementation"] for v in result["attention"].values()} == {"tpu_flash"}
  microbatches = loops.get("grad_accum_steps", 1)
  assert result["tpu_custom_calls"]["per_step"] == 2 * (2 + 1) * microbatches
  if loops:  # XLA counts each loop body once; the plan adds the rest.
    assert result["tpu_custom_calls"]["in_program"] < 2 * (2 + 1)
    assert result["xla_flops_counted_per_chip"] < 0.7 * result["model_flops_per_chip"]
  ratio = result["xla_flops_per_chip"] / result["model_flops_per_chip"]
  # (The kernel's padded lengths and recomputed scores, as above: 111 visible of
  # 128 padded to 128; measured 1.22 on v5p.)
  assert 0.9 < ratio < 1.3, (ratio, result["xla_flops_notes"])


@needs_libtpu
@pytest.mark.optimized
def test_a_config_that_cannot_fit_is_refused_with_a_knob_and_its_plan():
  """A one-layer tiny MLM with a million-piece vocabulary, batch 1024 x 128 on 4
  v5e chips, no fsdp: the compiler runs out of HBM (23.2 GB a chip needed, most of
  it the head's logits); the answer is exit 3 and at most 5 lines naming the knob
  that fits, compiled to check it (grad_accum_steps=2: 13.2 GB). (The same path as a
  large model's refusal, whose compiles took 5x as long here. Its earlier form,
  12288 rows of 512 over 32000 pieces, cost 151.7 CPU-s in the suite, its two-layer
  form 101.2; benchmarks/test-suite-cost.md.)"""
  # One encoder layer, not two: the same refusal and knob, the command 33.0 against
  # 42.1 CPU-s (two alternating pairs, benchmarks/test-suite-cost.md).
  result = run_plan_cli("--config=configs/pretrain.py:objective=mlm,size=tiny",
                        "--topology=v5e:2x2", "--config.batch_size=1024",
                        "--config.seq_len=128", "--config.tokenizer.vocab_size=1000000",
                        "--config.model.num_layers=1")
  assert result.returncode == plan.NOT_FIT_EXIT, result.stderr[-3000:]
  lines = result.stdout.strip().splitlines()
  assert 2 <= len(lines) <= 5, lines
  assert lines[0].startswith("does not fit:")
  assert lines[0].endswith("(the compiler ran out of memory)"), lines[0]
  assert "--config.grad_accum_steps=" in result.stdout
  fits = [line for line in lines if line.startswith("first that fits:")]
  assert fits and "s/step" in fits[0], lines


@needs_libtpu
@pytest.mark.optimized
def test_a_decaying_mask_rate_is_planned_at_both_ends_of_its_schedule():
  """mask_ratio_start=0.5 -> 0.15: one step per stage. The plan compiles the
  first stage too: MLM's head over 50% of the tokens holds more than over 15%."""
  # 128, not 256: two compiles in 21.6 s against 29.0 (this test's config through
  # plan.run, alone on the 2 cores). One encoder layer, not two: the head's logits
  # are the same, plan.run 42.2 and 37.3 against 51.5 and 48.0 CPU-s (two
  # alternating pairs; benchmarks/test-suite-cost.md).
  config = plan_config("mlm", seq_len=128, batch_size=32,
                       **{"model.attention_dropout": 0.0, "mesh_shape": (1, 4, 1),
                          "model.mask_ratio_start": 0.5, "tokenizer.vocab_size": 32000,
                          "model.num_layers": 1})
  status, result, lines = plan.run(config, "v5e:2x2")
  assert status == 0, lines
  first, last = result["mask_rate_stages"]
  assert (first["mask_ratio"], last["mask_ratio"]) == (0.5, 0.15)
  assert first["fits"] and last["fits"]
  assert last["bytes_per_chip"] == result["bytes_per_chip"]["total"]
  # [B, K, V] float32 logits: K 63 against 19 of 32000 for each of 8 rows a chip,
  # 45 MB more, and their gradient (measured: 113 MB against 30 MB a chip).
  assert first["bytes_per_chip"] > last["bytes_per_chip"] + 45e6
  assert any(line.strip().startswith("mask rate    0.5") for line in lines)


def test_a_first_mask_stage_over_the_memory_refuses_the_run(monkeypatch):
  """The last stage fits, the first does not: exit 3, and the refusal says it is
  the first stage's and plans its knobs on that stage's config."""
  config = plan_config("mlm", **{"model.mask_ratio_start": 0.5})
  planned, refused = [], []

  def fake_plan(built, topology, devices, estimate=True):
    planned.append(built.model_cfg.mask_ratio)
    return {"fits": built.model_cfg.mask_ratio < 0.3, "bytes_per_chip": {"total": 1.0}}

  monkeypatch.setattr(plan, "topology_devices", lambda name: (jax.devices()[:4], name))
  monkeypatch.setattr(plan, "plan_built", fake_plan)
  monkeypatch.setattr(plan, "table", lambda result: ["table"])
  monkeypatch.setattr(plan, "refusal", lambda config, result, *args: refused.append(
      config.model.mask_ratio) or ["does not fit: ..."])
  status, result, lines = plan.run(config, "v5e:2x2")
  assert planned == [0.15, 0.5] and refused == [0.5]
  assert status == plan.NOT_FIT_EXIT and not result["fits"]
  assert lines == ["the first mask-rate stage (0.5) does not fit: ..."]


def test_missing_libtpu_and_a_misspelt_topology_get_one_line_each():
  no_libtpu = ("import importlib.util as u, runpy, sys; find = u.find_spec; "
               "u.find_spec = lambda n, *a: None if n == 'libtpu' else find(n, *a); "
               "sys.argv = ['plan', '--config=configs/pretrain.py', "
               "'--topology=v5e:2x2']; runpy.run_module('maelm_jax.plan', "
               "run_name='__main__')")
  result = subprocess.run([sys.executable, "-c", no_libtpu], cwd=REPO,
                          capture_output=True, text=True, timeout=300)
  assert result.returncode == 1
  lines = user_lines(result.stderr)
  assert len(lines) == 1, result.stderr
  if LINUX_X86:
    assert f"pip install 'jax[tpu]=={jax.__version__}'" in lines[0]
  else:
    assert "Linux x86-64 only" in lines[0]
  result = run_plan_cli("--config=configs/pretrain.py", "--topology=v5e-4x4")
  assert result.returncode == 1
  lines = user_lines(result.stderr)
  assert len(lines) == 1 and "unknown topology 'v5e-4x4'" in lines[0], result.stderr
  assert "v5e:4x4" in lines[0] and "v5litepod-16" in lines[0]


def test_libtpu_elsewhere_than_linux_x86_is_said_in_one_line(monkeypatch):
  monkeypatch.setattr(plan.importlib.util, "find_spec", lambda name: None)
  monkeypatch.setattr(plan.platform, "system", lambda: "Darwin")
  monkeypatch.setattr(plan.platform, "machine", lambda: "arm64")
  message = plan.libtpu_problem()
  assert "Linux x86-64 only" in message and "Darwin arm64" in message
  assert "\n" not in message


@pytest.mark.parametrize("name,expected", [
    ("v5e:4x4", "v5e:4x4"), ("v5litepod-16", "v5e:4x4"), ("v5litepod-8", "v5e:2x4"),
    ("v5litepod-256", "v5e:16x16"), ("v5e-4", "v5e:2x2"), ("v6e-16", "v6e:4x4"),
    ("v4-8", "v4:2x2x1"), ("v4-16", "v4:2x2x2"), ("v4-32", "v4:2x2x4"),
    ("v4-64", "v4:2x4x4"), ("v5p-8", "v5p:2x2x1"), ("v5p-128", "v5p:4x4x4"),
    ("V5P-256", "v5p:4x4x8"),
])
def test_accelerator_types_map_to_topologies(name, expected):
  assert plan.topology_name(name) == expected


@pytest.mark.parametrize("name", ["v5e-16x", "v7:2x2", "v5litepod-12", "tpu"])
def test_unknown_topologies_name_the_accepted_forms(name):
  with pytest.raises(plan.PlanError, match="v5litepod-16"):
    plan.topology_name(name)


# ------------------------------------------------------ GPUs, no GPU --

HAS_CUDA_PLUGIN = plan.cuda_plugin_problem() is None


@pytest.mark.skipif(HAS_CUDA_PLUGIN, reason="jax's CUDA plugin is installed here")
def test_gpu_plans_without_the_cuda_plugin_say_what_to_install():
  with pytest.raises(plan.PlanError, match=r"pip install -e '\.\[plan-gpu\]'"):
    plan.topology_devices("h100:8")


def test_gpu_topologies_are_one_hosts_gpus_of_a_known_kind():
  with pytest.raises(plan.PlanError, match="1 to 8"):
    plan.topology_devices("h200:16")
  with pytest.raises(plan.PlanError, match="h100:8, h200:8, a100:8"):
    plan.topology_devices("b200:8")
  from maelm_jax.tools import gpu_targets  # pylint: disable=g-import-not-at-top
  from maelm_jax.modeling import flops  # pylint: disable=g-import-not-at-top
  for kind, spec in gpu_targets.SPECS.items():
    text = gpu_targets.target_config(kind)
    assert f"core_count: {spec.sm_count}" in text and f'"{spec.name}"' in text
    # The roofline's constants are found for the device kind the plugin reports.
    assert flops.chip(spec.name) is not None, spec.name


@pytest.mark.skipif(not HAS_CUDA_PLUGIN, reason="needs jax's CUDA plugin and cuDNN "
                    "(pip install -e '.[plan-gpu]'); no GPU")
@pytest.mark.optimized
def test_a_step_compiles_for_described_gpus_with_cudnn_attention(tmp_path):
  """The tiny MAE-LM in bf16 for 2 described H100s: cuDNN's fused attention at
  both sites, the H100's memory and constants, the byte budget."""
  config = plan_config("maelm", seq_len=128, batch_size=16,
                       **{"model.attention_dropout": 0.0, "model.dtype": "bfloat16",
                          "mesh_shape": (2, 1, 1)})
  status, result, lines = plan.run(config, "h100:2", out=str(tmp_path))
  assert status == 0 and result["fits"], lines
  assert result["chip_kind"] == "NVIDIA H100 80GB HBM3" and result["chips"] == 2
  assert result["hbm_bytes_per_chip"] == 80e9
  assert {v["implementation"] for v in result["attention"].values()} == {"cudnn"}
  assert sum(result["hbm_traffic_by_category_per_chip"].values()) == pytest.approx(
      result["hbm_traffic_bytes_per_chip"])


# ------------------------------------------------------ One code path --


def spy(monkeypatch, module, name):
  """Records every call of module.name (and its return value)."""
  original, calls = getattr(module, name), []

  def recorded(*args, **kwargs):
    calls.append(original(*args, **kwargs))
    return calls[-1]

  monkeypatch.setattr(module, name, recorded)
  return calls


def test_the_plan_and_the_pretraining_run_build_their_step_in_one_function(
    tmp_path, monkeypatch):
  calls = spy(monkeypatch, train_lib, "pretrain_program")
  config = tiny_config("mlm", **{"data.source": "pydoc:", "data.eval_fraction": 0.05,
                                 "tokenizer.vocab_size": 600, "total_steps": 1,
                                 "eval_batches": 1, "log_every": 1})
  train.train_and_evaluate(config, str(tmp_path / "run"))
  assert len(calls) == 1  # The run's step came from it...
  built = plan.build(config, jax.devices()[:4])
  assert len(calls) == 2 and built.program is calls[1]  # ...and the plan's.
  assert built.model_cfg.vocab_size == config.tokenizer.vocab_size


def test_the_plan_and_the_finetuning_run_build_their_step_in_one_function(
    tmp_path, monkeypatch, pretrained):  # noqa: F811
  calls = spy(monkeypatch, finetune_run, "finetune_program")
  data = write_sst2(tmp_path / "SST-2", num_train=32, num_dev=16)
  config = glue_test_config("sst2", pretrained, data)
  finetune_run.run(config, str(tmp_path / "sst2"))
  assert len(calls) == 1
  built = plan.build(config, jax.devices()[:4])  # The model of init_from.
  assert len(calls) == 2 and built.program is calls[1]
  assert set(built.program.batch) == {"input_ids", "label"}
  with config.unlocked():
    config.init_from = ""
  sized = plan.build(config, jax.devices()[:4], size="small", vocab_size=1000)
  assert sized.model_cfg.num_layers == 4 and sized.model_cfg.vocab_size == 1000


def test_roofline_check_times_the_executable_the_plan_compiled(capsys, monkeypatch):
  """benchmarks/roofline_check.py runs the very executable `plan_built` compiled
  (`Built.compiled`), every timed step and the warm-up, on the run's own freshly
  built state (whose shardings must be the plan's for the call to be accepted),
  planned with a named chip's constants; a device with no constants gets one line
  before anything compiles."""
  sys.path.insert(0, str(REPO / "benchmarks"))
  import roofline_check  # pylint: disable=g-import-not-at-top
  original, calls = plan.plan_built, []

  def counted(built, *args, **kwargs):
    result = original(built, *args, **kwargs)
    executable = built.compiled

    def step(*step_args):
      calls.append(1)
      return executable(*step_args)
    built.compiled = step
    return result

  monkeypatch.setattr(plan, "plan_built", counted)
  config = plan_config("mlm", **{"mesh_shape": (1, 1, 1), "batch_size": 4})
  row = roofline_check.check(config, "H100", steps=2, repeats=2)
  assert len(calls) == 1 + 2 * 2
  assert len(row["step_seconds_windows"]) == 2 and row["measured_step_seconds"] > 0
  assert math.isfinite(row["final_loss"])
  assert row["chip_constants"]["peak_flops"] == 989e12  # The H100's, on a CPU.
  monkeypatch.setattr(plan, "plan_built", original)
  status = roofline_check.main(["--config=configs/pretrain.py:objective=mlm,size=tiny",
                                "--set=seq_len=32", "--set=batch_size=4"])
  lines = capsys.readouterr().err.strip().splitlines()
  assert status == 1 and lines[-1].startswith(
      "roofline_check: no constants for the chip 'cpu': add it to flops.CHIPS")


@needs_libtpu
def test_the_kernel_rules_follow_the_mesh_devices_not_the_host():
  """On this CPU host, a step traced for TPU chips decides its attention for the
  TPU: `auto` takes the kernel, at any length (it pads)."""
  cfg = train.pretraining_model_config(tiny_config("maelm", **{
      "model.attention_dropout": 0.0, "model.dtype": "bfloat16"}), 100, 4)
  assert cfg.attention_backend(False, 444, 444) == "xla"  # This host: a CPU.
  tpu_mesh = sharding.make_mesh((-1, 1, 1), plan.topology_devices("v5e:2x2")[0])
  with attention.kernel_mesh(tpu_mesh):
    assert attention.target_platform() == "tpu"
    assert cfg.attention_backend(False, 444, 444) == "tpu_flash"
    assert cfg.attention_backend(True, 512, 512) == "xla"  # Attention dropout.
  with attention.kernel_mesh(sharding.make_mesh((-1, 1, 1), jax.devices()[:2])):
    assert attention.target_platform() == "cpu"


def test_one_more_layer_halves_to_a_batch_the_mesh_divides(monkeypatch):
  """The estimate's unscanned probes run at the microbatch; where that does not
  compile, at about half of it, still a multiple of the data-parallel size
  (1744 on 16 chips: 109 rows a chip, so not 872 but 864), scaled back."""
  from types import SimpleNamespace  # pylint: disable=g-import-not-at-top
  built = SimpleNamespace(
      config={}, batch_size=1744, grad_accum_steps=1,
      mesh=SimpleNamespace(shape={"data": 1, "fsdp": 16, "tensor": 1}),
      model_cfg=SimpleNamespace(decoder_type="none", num_layers=12))
  tried = []

  def fake_build(overrides, devices):
    tried.append(overrides["batch_size"])
    if overrides["batch_size"] > 1000:
      raise RuntimeError("RESOURCE_EXHAUSTED: Ran out of memory in memory space hbm")
    return overrides

  def fake_cost(probe):  # FLOPs and bytes linear in the batch and layers.
    layers = probe.get("model.num_layers", 1)
    return 10.0 * probe["batch_size"] * layers, 3.0 * probe["batch_size"] * layers

  monkeypatch.setattr(plan, "_with", lambda config, overrides: overrides)
  monkeypatch.setattr(plan, "build", fake_build)
  monkeypatch.setattr(plan, "_cost", fake_cost)
  costs, probed = plan.one_more_layer(built, devices=None)
  assert tried[0] == 1744 and probed == 864 and probed % 16 == 0
  # One more layer at the whole microbatch: 10 and 3 per row.
  assert costs["encoder"] == pytest.approx((10.0 * 1744, 3.0 * 1744))


def test_a_stack_of_one_layer_is_not_probed(monkeypatch):
  """A scanned stack of one layer has no further iteration to count: MAE-LM's
  one-layer decoder adds no probe compile, and with a one-layer encoder too
  nothing compiles."""
  from types import SimpleNamespace  # pylint: disable=g-import-not-at-top
  probes = []
  monkeypatch.setattr(plan, "_with", lambda config, overrides: overrides)
  monkeypatch.setattr(plan, "build", lambda overrides, devices: probes.append(overrides)
                      or overrides)
  monkeypatch.setattr(plan, "_cost", lambda probe: (
      5.0 * probe.get("model.num_layers", 1), 2.0 * probe.get("model.num_layers", 1)))

  def built(encoder_layers):
    return SimpleNamespace(
        config={}, batch_size=8, grad_accum_steps=2,
        mesh=SimpleNamespace(shape={"data": 1, "fsdp": 4, "tensor": 1}),
        model_cfg=SimpleNamespace(decoder_type="self", num_layers=encoder_layers,
                                  decoder_layers=1))

  costs, probed = plan.one_more_layer(built(2), devices=None)
  assert set(costs) == {"encoder"} and probed == 4
  assert costs["encoder"] == pytest.approx((5.0, 2.0))
  assert [p.get("model.num_layers") for p in probes] == [1, 2]
  assert all(p["model.decoder_layers"] == 1 for p in probes)
  probes.clear()
  assert plan.one_more_layer(built(1), devices=None) == ({}, 4) and probes == []
