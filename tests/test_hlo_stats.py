"""What tools/hlo_stats.py reads from compiled HLO text (the planner's counts of
collectives, kernel calls, loops and HBM traffic), on small hand-counted
programs: no compilation, so these run in the quick tier."""

import pytest

from maelm_jax.tools import hlo_stats


LOOPED = """\
HloModule m

%cond (p: (s32[], f32[1024])) -> pred[] {
  %p = (s32[], f32[1024]{0}) parameter(0)
  %c = s32[]{:T(128)} constant(12)
  %i = s32[] get-tuple-element(%p), index=0
  ROOT %lt = pred[] compare(%i, %c), direction=LT
}

%body (p: (s32[], f32[1024])) -> (s32[], f32[1024]) {
  %p = (s32[], f32[1024]{0}) parameter(0)
  %x = f32[1024]{0} get-tuple-element(%p), index=1
  %ar = f32[1024]{0} all-reduce(%x), channel_id=1, replica_groups=[1,4]<=[4], to_apply=%add
  %k = (bf16[2,128]{1,0}) custom-call(%x), custom_call_target="tpu_custom_call"
  ROOT %t = (s32[], f32[1024]{0}) tuple(%i, %ar)
}

ENTRY %main (a: f32[1024]) -> f32[1024] {
  %a = f32[1024]{0} parameter(0)
  %ag = bf16[64,1024]{1,0} all-gather(%a), replica_groups=mesh['axis_0'=2,'axis_1'=4] {'axis_1'}, dimensions={0}
  %ars = (f32[256]{0}, f32[512]{0}) all-reduce-start(%a, %a), replica_groups={{0,1}}, to_apply=%add
  %ard = (f32[256]{0}, f32[512]{0}) all-reduce-done(%ars)
  %w = (s32[], f32[1024]{0}) while(%t0), condition=%cond, body=%body
  ROOT %r = f32[1024]{0} get-tuple-element(%w), index=1
}
"""


def test_collectives_and_kernels_inside_a_loop_count_once_per_iteration():
  stats = hlo_stats.analyze(LOOPED, num_devices=8)
  assert stats.loop_trip_counts == [12]
  # 12 in the loop, and one async all-reduce XLA combined from two arrays.
  assert stats.collectives["all-reduce"]["count"] == 12 + 1
  assert stats.collectives["all-reduce"]["bytes"] == 12 * 4096 + (256 + 512) * 4
  # A ring of n sends 2 (n - 1) / n of the array per all-reduce.
  assert stats.collectives["all-reduce"]["ring_bytes"] == pytest.approx(
      12 * 2 * 3 / 4 * 4096 + 2 * 1 / 2 * 768 * 4)
  assert stats.collectives["all-gather"] == {
      "count": 1, "bytes": 64 * 1024 * 2, "ring_bytes": 0.75 * 64 * 1024 * 2}
  assert stats.kernel_calls == 12 and stats.kernel_calls_in_text == 1
  assert stats.largest_buffers[0][:2] == (131072, "bf16[64,1024]")


PERMUTED = """\
HloModule m

ENTRY %main (a: f32[1024]) -> f32[1024] {
  %a = f32[1024]{0} parameter(0)
  %cp = f32[1024]{0} collective-permute(%a), channel_id=1, source_target_pairs={{0,1},{1,2},{2,3},{3,0}}
  %cps = (f32[1024]{0}, f32[1024]{0}, u32[], u32[]) collective-permute-start(%cp), channel_id=2, source_target_pairs={{0,1},{1,0}}
  %cpd = f32[1024]{0} collective-permute-done(%cps)
  %ags = (bf16[16,256]{1,0}, bf16[64,256]{1,0}) all-gather-start(%cpd), channel_id=3, dimensions={0}
  %agd = bf16[64,256]{1,0} all-gather-done(%ags)
  ROOT %r = f32[1024]{0} copy(%cpd)
}
"""


def test_a_permute_sends_its_array_once_and_a_start_counts_its_result():
  """A collective-permute (shifted pipelines, ring attention) sends its whole array
  to one neighbour whatever the ring's length; an async start's shape also holds
  its operand and contexts, of which only the result counts. An all-gather with no
  replica groups spans every device."""
  stats = hlo_stats.analyze(PERMUTED, num_devices=8)
  assert stats.collectives["collective-permute"] == {
      "count": 2, "bytes": 2 * 4096, "ring_bytes": 2 * 4096.0}
  # (operands, results): the larger half is the gathered result, over 8 devices.
  assert stats.collectives["all-gather"] == {
      "count": 1, "bytes": 64 * 256 * 2, "ring_bytes": 7 / 8 * 64 * 256 * 2}
  assert hlo_stats.group_size("%x = f32[8] all-reduce(%y), to_apply=%add", 8) == 8
  assert hlo_stats.group_size("source_target_pairs={{0,1},{1,0}}", 8) == 2


TRAFFIC = """\
HloModule m

%sliced (param_0.1: f32[1024,256], param_1.1: s32[]) -> f32[8,256] {
  %param_0.1 = f32[1024,256]{1,0} parameter(0)
  %param_1.1 = s32[] parameter(1)
  %c0 = s32[] constant(0)
  ROOT %ds = f32[8,256]{1,0} dynamic-slice(%param_0.1, %param_1.1, %c0), dynamic_slice_sizes={8,256}
}

%updated (param_0.2: f32[1024,256], param_1.2: f32[8,256], param_2.2: s32[]) -> f32[1024,256] {
  %param_0.2 = f32[1024,256]{1,0} parameter(0)
  %param_1.2 = f32[8,256]{1,0} parameter(1)
  %param_2.2 = s32[] parameter(2)
  %c0 = s32[] constant(0)
  %n = f32[8,256]{1,0} negate(%param_1.2)
  ROOT %dus = f32[1024,256]{1,0} dynamic-update-slice(%param_0.2, %n, %param_2.2, %c0)
}

%passed (param_0.3: f32[1024,256], param_1.3: f32[8,256]) -> (f32[8,256], f32[1024,256]) {
  %param_0.3 = f32[1024,256]{1,0} parameter(0)
  %param_1.3 = f32[8,256]{1,0} parameter(1)
  %e = f32[8,256]{1,0} exponential(%param_1.3)
  ROOT %t = (f32[8,256]{1,0}, f32[1024,256]{1,0}) tuple(%e, %param_0.3)
}

%cond (p: (s32[], f32[1024,256])) -> pred[] {
  %p = (s32[], f32[1024,256]{1,0}) parameter(0)
  %c = s32[] constant(12)
  %i = s32[] get-tuple-element(%p), index=0
  ROOT %lt = pred[] compare(%i, %c), direction=LT
}

%body (p: (s32[], f32[1024,256])) -> (s32[], f32[1024,256]) {
  %p = (s32[], f32[1024,256]{1,0}) parameter(0)
  %i = s32[] get-tuple-element(%p), index=0
  %buf = f32[1024,256]{1,0} get-tuple-element(%p), index=1
  %x = f32[8,256]{1,0} fusion(%buf, %i), kind=kLoop, calls=%sliced
  %y = f32[1024,256]{1,0} fusion(%buf, %x, %i), kind=kLoop, calls=%updated
  ROOT %t = (s32[], f32[1024,256]{1,0}) tuple(%i, %y)
}

ENTRY %main (a: f32[1024,256], b: f32[8,256]) -> f32[1024,256] {
  %a = f32[1024,256]{1,0} parameter(0)
  %b = f32[8,256]{1,0} parameter(1)
  %f = (f32[8,256]{1,0}, f32[1024,256]{1,0}) fusion(%a, %b), kind=kLoop, calls=%passed
  %w = (s32[], f32[1024,256]{1,0}) while(%t0), condition=%cond, body=%body
  %a2 = f32[1024,256]{1,0} add(%a, %a)
  ROOT %r = f32[1024,256]{1,0} get-tuple-element(%w), index=1
}
"""


def test_hbm_traffic_counts_slices_in_place_updates_and_loops_as_they_run():
  stats = hlo_stats.analyze(TRAFFIC, num_devices=1)
  row, full = 8 * 256 * 4, 1024 * 256 * 4
  # Slice read and written; a row read, written in place; the s32 index, twice.
  per_iteration = (row + row) + (row + row) + 2 * 4
  entry = (row + row) + 3 * full  # The pass-through fusion; an unfused add.
  assert stats.hbm_bytes == 12 * per_iteration + entry
  # XLA's rule, every operand and result whole, would count 12 x (2 full + ...).
  assert stats.hbm_bytes < 12 * full


GPU_LIBRARY_CALLS = """\
HloModule m

ENTRY %main (a: bf16[512,256], b: bf16[256,1024]) -> bf16[512,1024] {
  %a = bf16[512,256]{1,0} parameter(0)
  %b = bf16[256,1024]{1,0} parameter(1)
  %g = (bf16[512,1024]{1,0}, s8[4194304]{0}) custom-call(%a, %b), custom_call_target="__cublas$gemm"
  ROOT %r = bf16[512,1024]{1,0} get-tuple-element(%g), index=0
}
"""


def test_hbm_traffic_leaves_out_a_gpu_library_calls_scratch_workspace():
  """cuBLAS's 4 MiB workspace is no data: the gemm reads A and B and writes C."""
  stats = hlo_stats.analyze(GPU_LIBRARY_CALLS, num_devices=1)
  assert stats.hbm_bytes == 2 * (512 * 256 + 256 * 1024 + 512 * 1024)
  assert stats.hbm_by_category == {"matmuls": stats.hbm_bytes}


ON_CHIP = """\
HloModule m

%cond (p: (u32[], f32[1024])) -> pred[] {
  %p = (u32[], f32[1024]{0}) parameter(0)
  %c = u32[]{:T(128)} constant(38)
  %i = u32[] get-tuple-element(%p), index=0
  ROOT %lt = pred[] compare(%i, %c), direction=LT
}

%scaled (param_0.1: f32[1024]) -> f32[1024] {
  %param_0.1 = f32[1024]{0:T(1024)} parameter(0)
  ROOT %n = f32[1024]{0:T(1024)} negate(%param_0.1)
}

%body (p: (u32[], f32[1024])) -> (u32[], f32[1024]) {
  %p = (u32[], f32[1024]{0}) parameter(0)
  %i = u32[] get-tuple-element(%p), index=0
  %x = f32[1024]{0:T(1024)} get-tuple-element(%p), index=1
  %v = f32[1024]{0:T(1024)S(1)} fusion(%x), kind=kLoop, calls=%scaled
  %h = f32[1024]{0:T(1024)} fusion(%v), kind=kLoop, calls=%scaled
  ROOT %t = (u32[], f32[1024]{0}) tuple(%i, %h)
}

ENTRY %main (a: f32[1024]) -> f32[1024] {
  %a = f32[1024]{0:T(1024)} parameter(0)
  %w = (u32[], f32[1024]{0}) while(%t0), condition=%cond, body=%body
  ROOT %r = f32[1024]{0} get-tuple-element(%w), index=1
}
"""


def test_vmem_arrays_move_no_hbm_bytes_and_a_u32_loop_runs_its_trip_count():
  """The body's first fusion writes its result to VMEM (`S(1)`), the second
  reads it from there and writes HBM: each iteration moves the input read and
  the output written, 2 x 4 KiB, not 4 x. The loop's counter is u32 (XLA makes
  those too): 38 trips, not one."""
  array = 1024 * 4
  stats = hlo_stats.analyze(ON_CHIP, num_devices=1)
  assert stats.loop_trip_counts == [38]
  assert stats.hbm_bytes == 38 * 2 * array
  # Where memory space 1 is HBM too (no on-chip spaces), the same text moves 4 x.
  everything = hlo_stats.analyze(ON_CHIP, num_devices=1, on_chip_memory_spaces=())
  assert everything.hbm_bytes == 38 * 4 * array


def test_array_bytes_reads_each_arrays_memory_space():
  shape = "(f32[8,128]{1,0:T(8,128)S(1)}, bf16[4,256]{1,0:T(8,128)(2,1)}, s32[])"
  assert hlo_stats.array_bytes(shape) == [8 * 128 * 4, 4 * 256 * 2, 4]
  assert hlo_stats.array_bytes(shape, frozenset({1})) == [4 * 256 * 2, 4]


BUDGET = """\
HloModule m

%masked (param_0.1: f32[1,2,256,256], param_1.1: f32[2,1,1,256]) -> f32[2,2,256,256] {
  %param_0.1 = f32[1,2,256,256]{3,2,1,0} parameter(0)
  %param_1.1 = f32[2,1,1,256]{3,2,1,0} parameter(1)
  %b0 = f32[2,2,256,256]{3,2,1,0} broadcast(%param_0.1), dimensions={0,1,2,3}
  %b1 = f32[2,2,256,256]{3,2,1,0} broadcast(%param_1.1), dimensions={0,1,2,3}
  ROOT %a = f32[2,2,256,256]{3,2,1,0} add(%b0, %b1)
}

%projected (param_0.2: bf16[256,64], param_1.2: bf16[64,64]) -> bf16[256,64] {
  %param_0.2 = bf16[256,64]{1,0} parameter(0)
  %param_1.2 = bf16[64,64]{1,0} parameter(1)
  ROOT %d = bf16[256,64]{1,0} convolution(%param_0.2, %param_1.2), dim_labels=bf_io->bf
}

ENTRY %main (x: bf16[256,64], w: bf16[64,64], q: bf16[2,2,256,64], bias: f32[1,2,256,256], pad: f32[2,1,1,256], m: f32[64,64]) -> f32[64,64] {
  %x = bf16[256,64]{1,0} parameter(0)
  %w = bf16[64,64]{1,0} parameter(1)
  %q = bf16[2,2,256,64]{3,2,1,0} parameter(2)
  %bias = f32[1,2,256,256]{3,2,1,0} parameter(3)
  %pad = f32[2,1,1,256]{3,2,1,0} parameter(4)
  %m = f32[64,64]{1,0} parameter(5)
  %y = bf16[256,64]{1,0} fusion(%x, %w), kind=kOutput, calls=%projected, metadata={op_name="jit(train_step)/jvp(MaskedLM)/encoder/layer_0/mlp/wi/dot_general"}
  %rowbias = f32[2,2,256,256]{3,2,1,0} fusion(%bias, %pad), kind=kLoop, calls=%masked, metadata={op_name="jit(train_step)/jvp(MaskedLM)/MaskedLM.encode/encoder/add"}
  %k = (bf16[2,2,256,64]{3,2,1,0}, f32[2,2,256,128]{3,2,1,0}) custom-call(%q, %q, %q, %rowbias), custom_call_target="tpu_custom_call", metadata={op_name="jit(train_step)/jvp(MaskedLM)/encoder/layer_0/self_attn/pallas_call"}
  %u = f32[64,64]{1,0} multiply(%m, %m), metadata={op_name="jit(train_step)/mul"}
  ROOT %c = f32[64,64]{1,0} copy(%u)
}
"""


def test_the_byte_budget_puts_each_array_in_its_category():
  """A matmul, the bias made per row by the padding mask, an attention kernel
  reading it and writing its statistics at the block width (128, the head 64),
  an optimizer multiply and a copy: each counted by hand."""
  q, row_bias, stats = 2 * 2 * 256 * 64 * 2, 2 * 2 * 256 * 256 * 4, 2 * 2 * 256 * 128 * 4
  matmul = 256 * 64 * 2 * 2 + 64 * 64 * 2
  bias = (1 * 2 * 256 * 256 * 4 + 2 * 256 * 4 + row_bias) + row_bias  # made, read
  kernel = 3 * q + q  # q, k, v read, o written
  opt, copy = 3 * 64 * 64 * 4, 2 * 64 * 64 * 4
  stats_written = stats
  budget = hlo_stats.analyze(BUDGET, num_devices=1).hbm_by_category
  assert budget == {"matmuls": matmul, "attention kernels": kernel,
                    "attention statistics": stats_written, "position bias": bias,
                    "optimizer": opt, "copies": copy}
  assert hlo_stats.analyze(BUDGET, num_devices=1).hbm_bytes == sum(budget.values())
  # Without a kernel in the program, an [.., L, L] array is attention scores.
  plain = BUDGET.replace('custom_call_target="tpu_custom_call"',
                         'custom_call_target="something_else"')
  assert "attention scores" in hlo_stats.analyze(plain, num_devices=1).hbm_by_category
