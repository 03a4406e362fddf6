"""`recipe=paper` against the official MAE-LM release: its bucket function, and its
whole pretraining forward (tests/mae_lm_reference.py, PyTorch, written from the
release's code) on the same weights and the same fixed mask, the weights moved
by `import_fairseq` from a release-format checkpoint the reference writes."""

import argparse
import dataclasses
import os

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("tokenizers")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

from maelm_jax.run import pretrained as pretrained_lib  # noqa: E402
from maelm_jax.interop import import_fairseq  # noqa: E402
from maelm_jax.modeling import masking, relative_position  # noqa: E402
from maelm_jax.modeling import model as model_lib  # noqa: E402
from maelm_jax.run import train_lib  # noqa: E402
from tests import mae_lm_reference as ref  # noqa: E402
from tests import helpers  # noqa: E402
from tests.helpers import pretrain  # noqa: E402
from tests.test_import_hf import make_roberta  # noqa: E402

TOLERANCE = 1e-5  # float32, the bar.


@pytest.mark.parametrize("max_positions,num_buckets", [(512, 64), (40, 64), (512, 32)])
def test_mae_lm_buckets_are_the_releases(max_positions, num_buckets):
  positions = torch.arange(max_positions)
  rel = positions[None, :] - positions[:, None]
  theirs = ref.relative_position_bucket(rel, num_buckets, 128)
  theirs = (theirs - theirs.min()).numpy()
  ours = np.asarray(relative_position.mae_lm_bucket(jnp.asarray(rel.numpy()),
                                                    num_buckets, 128, max_positions))
  np.testing.assert_array_equal(ours, theirs)
  # And not T5's: the release's ceil and shift move most far buckets.
  t5 = np.asarray(relative_position.t5_bucket(jnp.asarray(rel.numpy()), num_buckets, 128))
  assert (t5 != ours).mean() > 0.5


def test_recipe_paper_sets_the_releases_choices():
  config = pretrain.get_config("objective=maelm,size=base,recipe=paper")
  assert config.model.relative_bucket_fn == "mae_lm"
  assert config.model.relative_buckets == 64
  assert config.model.untie_cls_position is False
  assert config.weight_decay_on == "all"
  assert config.data.rows == "complete_doc"  # Masked per row (masking.py).
  fast = pretrain.get_config("objective=maelm,size=base")
  assert (fast.model.relative_bucket_fn, fast.model.relative_buckets,
          fast.model.untie_cls_position, fast.weight_decay_on,
          fast.data.rows) == ("t5", 32, True, "matrices", "packed")


@pytest.mark.parametrize("rule,decays_bias", [("all", True), ("matrices", False)])
def test_weight_decay_rule(rule, decays_bias):
  config = pretrain.get_config("objective=mlm,size=tiny")
  config.unlock()
  config.update(weight_decay=0.5, weight_decay_on=rule, warmup_steps=0,
                learning_rate=0.1, total_steps=10)
  params = {"dense": {"kernel": jnp.ones((2, 2)), "bias": jnp.ones(2)},
            "ln": {"scale": jnp.ones(2)}}
  tx = train_lib.make_optimizer(config)
  grads = jax.tree.map(jnp.zeros_like, params)
  updates, _ = tx.update(grads, tx.init(params), params)
  assert np.all(np.asarray(updates["dense"]["kernel"]) < 0)  # Decayed either way.
  assert bool(np.all(np.asarray(updates["dense"]["bias"]) < 0)) == decays_bias
  assert bool(np.all(np.asarray(updates["ln"]["scale"]) < 0)) == decays_bias


def _release(tmp_path, layers=2, decoder_layers=2, seed=0):
  """A random release model on a RoBERTa-order tokenizer, saved as the release
  saves it (checkpoint.pt + dict.txt), and its import."""
  tok_dir = str(tmp_path / "tok")
  make_roberta(tok_dir)
  import tokenizers
  vocab = tokenizers.Tokenizer.from_file(os.path.join(tok_dir, "tokenizer.json")).get_vocab()
  by_id = sorted(vocab, key=vocab.get)
  assert by_id[:5] == ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]
  reference = ref.randomize(ref.MaeLm(len(by_id), dim=32, ffn=64, heads=4, layers=layers,
                                      decoder_layers=decoder_layers, max_positions=64,
                                      mask_idx=vocab["<mask>"]), seed).eval()
  src = str(tmp_path / "checkpoint.pt")
  torch.save({"model": reference.state_dict()}, src)
  with open(tmp_path / "dict.txt", "w") as f:
    f.writelines(f"{symbol} {1000 - i}\n" for i, symbol in enumerate(by_id[4:]))
  workdir = str(tmp_path / "imported")
  import_fairseq.import_checkpoint(src, str(tmp_path / "dict.txt"), tok_dir, workdir,
                                   heads=4)
  return reference, workdir


def test_paper_maelm_matches_the_release_forward(tmp_path):
  """Encoder states, masked-position logits and the loss within 1e-5 (float32):
  rows with padding, masked slots at both ends, relative positions spanning every
  bucket kind; the weights went through import_fairseq (names, vocabulary order)."""
  reference, workdir = _release(tmp_path)
  run = pretrained_lib.load_pretrained(workdir, encoder_only=False)
  cfg, params = run.model_cfg, run.params
  assert (cfg.relative_bucket_fn, cfg.untie_cls_position, cfg.ln_type) == (
      "mae_lm", False, "post")
  vocab = reference.encoder.sentence_encoder.embed_tokens.weight.shape[0]
  # fairseq ids of two rows of 24: <s> words </s>, the second padded after 17.
  rng = np.random.RandomState(0)
  length, num_masked = 24, 5
  rows = rng.randint(5, vocab, (2, length))
  rows[:, 0] = ref.BOS
  rows[0, -1] = ref.EOS
  rows[1, 17] = ref.EOS
  rows[1, 18:] = ref.PAD
  masked = np.array([[1, 5, 9, 13, 22], [1, 2, 8, 15, 16]])
  masked_tokens = np.zeros((2, length), bool)
  np.put_along_axis(masked_tokens, masked, True, axis=1)
  padding = rows == ref.PAD
  kept = np.stack([np.flatnonzero(~m) for m in masked_tokens])  # [2, 19] incl. pads
  src_tokens = np.take_along_axis(rows, kept, axis=1)

  with torch.no_grad():
    ref_states, ref_logits = reference(torch.tensor(src_tokens), torch.tensor(kept),
                                       torch.tensor(masked_tokens), torch.tensor(padding))
  ref_states, ref_logits = ref_states.numpy(), ref_logits.numpy().reshape(2, num_masked, -1)

  # Ours: ids re-indexed as the import did (roles at 0..4, the rest in order).
  old_id = _old_ids(workdir)
  to_ours = np.zeros(vocab, np.int64)
  to_ours[old_id] = np.arange(len(old_id))
  ours_rows = to_ours[rows]
  masks = masking.Masks(
      selected_positions=jnp.asarray(masked, jnp.int32),
      selected_weights=jnp.ones((2, num_masked), jnp.float32),
      targets=jnp.asarray(np.take_along_axis(ours_rows, masked, 1), jnp.int32),
      encoder_ids=jnp.asarray(to_ours[src_tokens], jnp.int32),
      encoder_positions=jnp.asarray(kept, jnp.int32),
      masked_positions=jnp.asarray(masked, jnp.int32))
  model = model_lib.MaskedLM(cfg)
  states = np.asarray(helpers.apply(model, {"params": params}, masks.encoder_ids,
                                    masks.encoder_positions, masks.encoder_ids != 0,
                                    method=model_lib.MaskedLM.encode))
  logits = np.asarray(helpers.apply(model, {"params": params}, masks))
  real = src_tokens != ref.PAD
  np.testing.assert_allclose(states[real], ref_states[real], atol=TOLERANCE, rtol=0)
  np.testing.assert_allclose(logits, ref_logits[..., old_id], atol=TOLERANCE, rtol=0)
  loss, _, _ = model_lib.masked_lm_loss(logits, masks.targets, masks.selected_weights)
  ref_loss = torch.nn.functional.cross_entropy(
      torch.tensor(ref_logits.reshape(-1, vocab)),
      torch.tensor(np.take_along_axis(rows, masked, 1).reshape(-1)), reduction="sum")
  assert abs(float(loss) - float(ref_loss)) <= TOLERANCE * max(1.0, abs(float(ref_loss)))
  # The comparison can fail: T5 buckets or the [CLS] untie move the states.
  for change in ({"relative_bucket_fn": "t5"}, {"untie_cls_position": True}):
    other = model_lib.MaskedLM(dataclasses.replace(cfg, **change))
    moved = np.asarray(helpers.apply(other, {"params": params}, masks.encoder_ids,
                                     masks.encoder_positions, masks.encoder_ids != 0,
                                     method=model_lib.MaskedLM.encode))
    assert np.abs(moved[real] - ref_states[real]).max() > 100 * TOLERANCE, change


def _old_ids(workdir):
  """The release id of each of our ids, from the re-indexed tokenizer.json and
  the original vocabulary (tokens keep their strings)."""
  import tokenizers
  ours = tokenizers.Tokenizer.from_file(os.path.join(workdir, "tokenizer.json")).get_vocab()
  theirs = tokenizers.Tokenizer.from_file(
      os.path.join(os.path.dirname(workdir), "tok", "tokenizer.json")).get_vocab()
  old = np.zeros(len(ours), np.int64)
  for token, i in ours.items():
    old[i] = theirs[token]
  return old


def test_import_refuses_what_it_cannot_map(tmp_path):
  reference, _ = _release(tmp_path)
  tok_dir, dict_txt = str(tmp_path / "tok"), str(tmp_path / "dict.txt")
  state = reference.state_dict()
  # fairseq's own files pickle their args: weights_only refuses, the message says how.
  pickled = str(tmp_path / "with_args.pt")
  torch.save({"model": state, "args": argparse.Namespace(arch="ae")}, pickled)
  with pytest.raises(ValueError, match="weights_only=True.*save the state dict alone"):
    import_fairseq.import_checkpoint(pickled, dict_txt, tok_dir, str(tmp_path / "w1"))
  # A tensor it has no place for, named.
  extra = str(tmp_path / "extra.pt")
  torch.save({**state, "encoder.sentence_encoder.layers.0.adapter.weight":
              torch.zeros(2)}, extra)
  with pytest.raises(ValueError, match="adapter.weight"):
    import_fairseq.import_checkpoint(extra, dict_txt, tok_dir, str(tmp_path / "w2"),
                                     heads=4)
  # --decoder-rel-pos 1: an option the importer does not implement, named.
  rel = str(tmp_path / "rel.pt")
  torch.save({**state, "gen_decoder.sentence_encoder.relative_attention_bias.weight":
              torch.zeros(64, 4)}, rel)
  with pytest.raises(ValueError, match="--decoder-rel-pos 1"):
    import_fairseq.import_checkpoint(rel, dict_txt, tok_dir, str(tmp_path / "w3"),
                                     heads=4)
  # A dictionary of another run.
  short = tmp_path / "short.txt"
  short.write_text("".join(open(dict_txt).readlines()[:-3]))
  with pytest.raises(ValueError, match="dict.*rows"):
    import_fairseq.import_checkpoint(str(tmp_path / "checkpoint.pt"), str(short),
                                     tok_dir, str(tmp_path / "w4"), heads=4)
  for w in ("w1", "w2", "w3", "w4"):
    assert not (tmp_path / w).exists()
  assert not [p for p in os.listdir(tmp_path) if ".tmp-" in p]


def test_release_import_exports_to_transformers(tmp_path):
  """The import (release buckets, [CLS] biased like any pair, post-LN with a
  relative table) exports as the remote-code kind, and transformers' model of it
  gives the JAX hidden states."""
  from maelm_jax.interop import export_hf
  from tests.test_export_hf import assert_transformers_reproduces
  _, workdir = _release(tmp_path)
  out = str(tmp_path / "hf")
  assert export_hf.export(workdir, out) == "maelm"  # The encoder (no decoder port).
  ref_out = np.load(os.path.join(out, "reference_outputs.npz"))
  model = assert_transformers_reproduces(out, ref_out, trust_remote_code=True)
  assert model.config.untie_cls_position is False


def test_read_dict_as_fairseq_reads_it(tmp_path):
  """fairseq's dict.txt: `<symbol> <count>`, symbols may hold spaces, a repeat
  needs `#fairseq:overwrite` (and then takes a new id), `<mask>` comes last."""
  path = tmp_path / "dict.txt"
  path.write_text("the 100\nhello world 7\nthe 3 #fairseq:overwrite\n\n", "utf-8")
  assert import_fairseq.read_dict(str(path)) == [
      "<s>", "<pad>", "</s>", "<unk>", "the", "hello world", "the", "<mask>"]
  path.write_text("the 100\nthe 3\n", "utf-8")
  with pytest.raises(ValueError, match=r"dict.txt:2: 'the' is in the dictionary twice"):
    import_fairseq.read_dict(str(path))
  path.write_text("the 100\nsome #fairseq:overwrite\n", "utf-8")
  with pytest.raises(ValueError, match=r"dict.txt:2: expected '<symbol> <count>'"):
    import_fairseq.read_dict(str(path))
