"""Import of Hugging Face BERT / RoBERTa checkpoints: small random models built here
with transformers (nothing downloaded), their tokenizers trained here; hidden states
and MLM logits against transformers on tricky text, the re-indexed tokenizer against
the original's ids, the round trip through export_hf, what the import feeds
(fine-tuning, continued MAE-LM pretraining, BLiMP), and the refusals."""

import json
import os
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
tokenizers = pytest.importorskip("tokenizers")

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from maelm_jax.run import pretrained as pretrained_lib  # noqa: E402
from maelm_jax.interop import export_hf, import_hf  # noqa: E402
from maelm_jax.modeling import model as model_lib  # noqa: E402
from maelm_jax.data import tokenizer as tokenizer_lib  # noqa: E402
from tests import helpers  # noqa: E402
from tests.helpers import tiny_config  # noqa: E402
from tests.test_export_hf import TRICKY_TEXTS, pydoc_sentences  # noqa: E402

# Real runs as processes, or compiles for TPU chips: `make test-quick` leaves
# this file out (pytest.ini's `slow`).
pytestmark = pytest.mark.slow

TEXTS = [t for t in TRICKY_TEXTS if t] + ["The cat sat on the mat .", "Who? Me!"]


def _perturb(model, seed):
  """Random values in every tensor (LayerNorm scales and biases included), so a
  mapping that swaps or drops one shows."""
  gen = torch.Generator().manual_seed(seed)
  with torch.no_grad():
    for name, p in model.named_parameters():
      p.copy_(torch.randn(p.shape, generator=gen) * (0.3 if "LayerNorm" in name
                                                      or "layer_norm" in name else 0.1)
              + (1.0 if name.endswith("weight") and p.ndim == 1 else 0.0))
  return model


def make_roberta(root, vocab_size=400):
  """A byte-level BPE tokenizer (RoBERTa's special-token order) and a random
  RobertaForMaskedLM, saved as transformers saves them."""
  tok = tokenizers.ByteLevelBPETokenizer()
  tok.train_from_iterator(pydoc_sentences()[:2000], vocab_size=vocab_size,
                          special_tokens=["<s>", "<pad>", "</s>", "<unk>", "<mask>"])
  fast = transformers.RobertaTokenizerFast(tokenizer_object=tok._tokenizer,
                                           bos_token="<s>", eos_token="</s>",
                                           sep_token="</s>", cls_token="<s>",
                                           unk_token="<unk>", pad_token="<pad>",
                                           mask_token="<mask>")
  fast._tokenizer.post_processor = tokenizers.processors.RobertaProcessing(
      ("</s>", 2), ("<s>", 0))
  config = transformers.RobertaConfig(
      vocab_size=len(fast), hidden_size=32, num_hidden_layers=2,
      num_attention_heads=4, intermediate_size=64, max_position_embeddings=66,
      pad_token_id=1, bos_token_id=0, eos_token_id=2, type_vocab_size=1)
  model = _perturb(transformers.RobertaForMaskedLM(config), 0).eval()
  model.tie_weights()
  model.save_pretrained(root, safe_serialization=True)
  fast.save_pretrained(root)
  return model, fast


def make_bert(root, vocab_size=300):
  """A WordPiece tokenizer with the special tokens scattered (not at 0..4) and a
  random BertForMaskedLM with two token types and LayerNorm eps 1e-12."""
  tok = tokenizers.BertWordPieceTokenizer(lowercase=True)
  tok.train_from_iterator(pydoc_sentences()[:2000], vocab_size=vocab_size,
                          special_tokens=["[unused0]", "[SEP]", "[unused1]", "[PAD]",
                                          "[MASK]", "[CLS]", "[UNK]"])
  fast = transformers.BertTokenizerFast(tokenizer_object=tok._tokenizer,
                                        unk_token="[UNK]", sep_token="[SEP]",
                                        pad_token="[PAD]", cls_token="[CLS]",
                                        mask_token="[MASK]")
  cls, sep = fast.cls_token_id, fast.sep_token_id
  fast._tokenizer.post_processor = tokenizers.processors.TemplateProcessing(
      single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1",
      special_tokens=[("[CLS]", cls), ("[SEP]", sep)])
  config = transformers.BertConfig(
      vocab_size=len(fast) + 3,  # Rows no token reaches are dropped on import.
      hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
      intermediate_size=64, max_position_embeddings=64,
      pad_token_id=fast.pad_token_id, type_vocab_size=2, layer_norm_eps=1e-12)
  model = _perturb(transformers.BertForMaskedLM(config), 1).eval()
  model.tie_weights()
  model.save_pretrained(root, safe_serialization=True)
  fast.save_pretrained(root)
  return model, fast


def ours(workdir, ids):
  """Last hidden states and MLM logits of the imported model, float32."""
  p = pretrained_lib.load_pretrained(str(workdir), encoder_only=False)
  hidden = helpers.apply(
      model_lib.Encoder(p.model_cfg), {"params": model_lib.encoder_params(p.params)}, jnp.asarray(ids))
  logits = helpers.apply(
      model_lib.LMHead(p.model_cfg), {"params": p.params["lm_head"]}, hidden, p.params["token_embed"]["embedding"])
  return np.asarray(hidden), np.asarray(logits), p


def check_parity(src_model, src_tok, workdir):
  """Our ids are the original's, re-indexed; hidden states and logits match."""
  tokenizer = tokenizer_lib.open_tokenizer(tokenizer_lib.workdir_tokenizer_path(workdir))
  assert isinstance(tokenizer, tokenizer_lib.HFTokenizer)
  assert [tokenizer.id_to_piece(i) for i in range(5)] == [
      src_tok.pad_token, src_tok.unk_token, src_tok.cls_token, src_tok.sep_token,
      src_tok.mask_token]
  vocab = src_tok.get_vocab()
  old_id = np.asarray([vocab[tokenizer.id_to_piece(i)]
                       for i in range(tokenizer.vocab_size)])
  rows = [[2, *tokenizer.encode_one(t), 3] for t in TEXTS]
  for text, row in zip(TEXTS, rows):
    assert list(old_id[row]) == src_tok(text, split_special_tokens=True)[
        "input_ids"], text
  # A literal mask token in the text stays text, as in pretraining.
  assert 4 not in tokenizer.encode_one(f"a {src_tok.mask_token} b")
  width = max(map(len, rows))
  ids = np.zeros((len(rows), width), np.int32)
  for i, row in enumerate(rows):
    ids[i, :len(row)] = row
  valid = ids != 0
  hidden, logits, pretrained = ours(workdir, ids)
  with torch.no_grad():
    out = src_model(input_ids=torch.tensor(old_id[ids]),
                    attention_mask=torch.tensor(valid.astype(np.int64)),
                    output_hidden_states=True)
  theirs_hidden = out.hidden_states[-1].numpy()
  np.testing.assert_allclose(hidden[valid], theirs_hidden[valid], atol=1e-4, rtol=0)
  theirs_logits = out.logits.numpy()[..., old_id]
  np.testing.assert_allclose(logits[valid], theirs_logits[valid], atol=1e-4, rtol=0)
  return pretrained


@pytest.fixture(scope="module")
def roberta(tmp_path_factory):
  root = tmp_path_factory.mktemp("roberta")
  model, tok = make_roberta(root / "src")
  summary = import_hf.import_checkpoint(str(root / "src"), str(root / "w"))
  return model, tok, root, summary


def test_roberta_imports_with_parity(roberta):
  model, tok, root, summary = roberta
  assert summary["model_type"] == "roberta" and summary["lm_head"] == "imported"
  pretrained = check_parity(model, tok, root / "w")
  # The user's check (import_hf --check) says the same.
  result = import_hf.parity(str(root / "src"), str(root / "w"))
  assert result["ids_differ"] == 0 and result["texts"] == len(import_hf.PARITY_TEXTS)
  assert result["hidden_max_abs_diff"] < 1e-4 and result["logits_max_abs_diff"] < 1e-4
  cfg = pretrained.model_cfg
  assert (cfg.num_layers, cfg.hidden, cfg.num_heads, cfg.mlp) == (2, 32, 4, 64)
  assert cfg.max_positions == 64 and cfg.ln_type == "post"
  assert not cfg.relative_position_bias and cfg.tie_embeddings
  assert pretrained.step == 0


def test_bert_imports_with_parity(tmp_path):
  model, tok = make_bert(tmp_path / "src")
  done = subprocess.run([sys.executable, "-m", "maelm_jax.interop.import_hf",
                         f"--src={tmp_path / 'src'}", f"--workdir={tmp_path / 'w'}",
                         "--check"], capture_output=True, text=True, timeout=600)
  assert done.returncode == 0, done.stderr[-3000:]
  assert "imported a bert encoder (2 layers, hidden 32" in done.stdout
  assert "--config.model.layer_norm_eps=1e-12" in done.stdout  # continue_flags
  checked = json.loads(done.stdout.split("parity with transformers: ")[1])
  assert checked["ids_differ"] == 0 and checked["logits_max_abs_diff"] < 1e-4
  summary = json.loads((tmp_path / "w" / import_hf.MARKER).read_text())
  assert summary["model_type"] == "bert" and summary["dropped_rows"] == 3
  pretrained = check_parity(model, tok, tmp_path / "w")
  assert pretrained.model_cfg.layer_norm_eps == 1e-12
  assert tokenizer_lib.HFTokenizer(
      tmp_path / "w" / "tokenizer.json").model_type == "wordpiece"
  # Word starts: WordPiece marks the continuations ("##").
  tokenizer = pretrained.tokenizer
  row = [2, *tokenizer.encode_one("unbelievably tokenized words"), 3]
  pieces = [tokenizer.id_to_piece(i) for i in row]
  assert list(tokenizer.word_starts(row)) == [
      i in (0, len(row) - 1) or not p.startswith("##") for i, p in enumerate(pieces)]


def test_export_then_import_gives_the_same_tensors(roberta, tmp_path):
  """Imported -> exported (plain RoBERTa) -> imported again: the same params."""
  _, _, root, _ = roberta
  out = tmp_path / "hf"
  assert export_hf.export(str(root / "w"), str(out), with_lm_head=True) == "roberta"
  hf_out = transformers.AutoModelForMaskedLM.from_pretrained(out)
  assert type(hf_out).__name__ == "RobertaForMaskedLM"
  import_hf.import_checkpoint(str(out), str(tmp_path / "again"))
  first = pretrained_lib.load_pretrained(str(root / "w"), encoder_only=False)
  second = pretrained_lib.load_pretrained(str(tmp_path / "again"), encoder_only=False)
  flat_a = dict(jax_tree_flatten(first.params))
  flat_b = dict(jax_tree_flatten(second.params))
  assert flat_a.keys() == flat_b.keys()
  for key in flat_a:
    np.testing.assert_allclose(flat_a[key], flat_b[key], atol=1e-6, err_msg=key)
  assert (open(root / "w" / "tokenizer.json").read()
          == open(tmp_path / "again" / "tokenizer.json").read())


def jax_tree_flatten(tree, prefix=""):
  for key, value in tree.items():
    if isinstance(value, dict):
      yield from jax_tree_flatten(value, f"{prefix}{key}/")
    else:
      yield prefix + key, np.asarray(value)


def test_import_feeds_maelm_pretraining_fine_tuning_and_blimp(roberta, tmp_path):
  """Continued pretraining with a fresh MAE-LM decoder, then the BLiMP scorer and
  GLUE fine-tuning start from the import."""
  from maelm_jax.evaluate import blimp  # pylint: disable=g-import-not-at-top
  from maelm_jax.run import train  # pylint: disable=g-import-not-at-top
  _, _, root, _ = roberta
  saved = json.loads((root / "w" / "config.json").read_text())
  shape = {f"model.{k}": saved["model"][k] for k in import_hf.SHAPE_KEYS}
  config = tiny_config("maelm", **shape, **{
      "init_from": str(root / "w"), "data.source": "pydoc:",
      "data.eval_fraction": 0.05,
      "tokenizer.vocab_size": saved["tokenizer"]["vocab_size"],
      "total_steps": 2, "eval_every": 2, "checkpoint_every": 2, "eval_batches": 1,
      "log_every": 1})
  workdir = tmp_path / "continued"
  train.train_and_evaluate(config, str(workdir))
  assert (workdir / "tokenizer.json").exists()
  first = pretrained_lib.load_pretrained(str(root / "w"), encoder_only=True)
  after = pretrained_lib.load_pretrained(str(workdir), encoder_only=False)
  assert "decoder" in after.params and after.step == 2
  moved = np.abs(np.asarray(after.params["token_embed"]["embedding"])
                 - np.asarray(first.params["token_embed"]["embedding"])).max()
  assert 0 < moved < 0.1  # Continued from the import, not from scratch.

  run = blimp.load_run(str(root / "w"), None)
  pairs = [blimp.Pair(paradigm="toy", term="agreement", field="syntax",
                      good="The cat sits on the mat.", bad="The cat sit on the mat.")] * 3
  good, bad = blimp.score_pairs(run.model_cfg, run.params, run.tokenizer, pairs)
  assert good.shape == bad.shape == (3,) and np.all(np.isfinite(good))
  assert np.all(good < 0) and good[0] != bad[0]

  # GLUE fine-tuning from the import: the encoder at step 0, a new head.
  from tests.test_finetune_e2e import glue_test_config, write_sst2  # pylint: disable=g-import-not-at-top
  from maelm_jax.finetune import run as finetune_run  # pylint: disable=g-import-not-at-top
  write_sst2(tmp_path / "glue" / "SST-2", num_train=64, num_dev=16)
  results = finetune_run.run(glue_test_config("sst2", root / "w", tmp_path / "glue"),
                             str(tmp_path / "sst2"))
  assert 0.0 <= results["accuracy"] <= 1.0


def test_refusals_name_the_problem_and_touch_nothing(roberta, tmp_path):
  _, _, root, _ = roberta
  # A pickled checkpoint: refused, with the safe conversion named.
  pickled = tmp_path / "pickled"
  pickled.mkdir()
  for name in ("config.json", "tokenizer.json"):
    (pickled / name).write_text((root / "src" / name).read_text())
  (pickled / "pytorch_model.bin").write_bytes(b"not read")
  with pytest.raises(ValueError, match="safe_serialization=True"):
    import_hf.import_checkpoint(str(pickled), str(tmp_path / "w1"))
  assert not (tmp_path / "w1").exists()
  # A non-empty workdir is never written into.
  busy = tmp_path / "busy"
  busy.mkdir()
  (busy / "notes.txt").write_text("keep me")
  with pytest.raises(FileExistsError, match="not empty"):
    import_hf.import_checkpoint(str(root / "src"), str(busy))
  assert os.listdir(busy) == ["notes.txt"]
  # Another architecture, in one line from the command line.
  other = tmp_path / "gpt"
  other.mkdir()
  (other / "config.json").write_text(json.dumps({"model_type": "gpt2"}))
  done = subprocess.run([sys.executable, "-m", "maelm_jax.interop.import_hf", f"--src={other}",
                         f"--workdir={tmp_path / 'w2'}"], capture_output=True,
                        text=True, timeout=300)
  assert done.returncode == 1 and "Traceback" not in done.stderr
  assert done.stderr.startswith("error: ") and "'gpt2'" in done.stderr
  assert not [p for p in os.listdir(tmp_path) if ".tmp-" in p]
  # A tokenizer.json straight from a checkpoint (roles not at 0..4) is refused
  # where a workdir's tokenizer is read, with the importer named.
  with pytest.raises(ValueError, match="import_hf"):
    tokenizer_lib.HFTokenizer(root / "src" / "tokenizer.json")


SQUAD_CONTEXT = ("The Denver  Broncos won Super Bowl 50 in 2016,\n beating "
                 "the Carolina Panthers 24\u201310 at Levi's Stadium.")


@pytest.mark.parametrize("kind", ["roberta", "bert"])
def test_squad_spans_through_an_imported_tokenizer(roberta, tmp_path, kind):
  """SQuAD with a Hugging Face tokenizer.json (byte-level BPE, lowercasing
  WordPiece): the context's ids are pretraining's ids, each token's characters
  come from the tokenizer's offsets without the spaces BPE pieces carry, and
  every gold answer comes back, character for character, from its window."""
  from maelm_jax.finetune import squad_data  # pylint: disable=g-import-not-at-top
  if kind == "roberta":
    workdir = roberta[2] / "w"
  else:
    make_bert(tmp_path / "src")
    import_hf.import_checkpoint(str(tmp_path / "src"), str(tmp_path / "w"))
    workdir = tmp_path / "w"
  tok = tokenizer_lib.HFTokenizer(workdir / "tokenizer.json")
  context = SQUAD_CONTEXT
  tokens = squad_data.tokenize_context(context, tok)
  assert tokens.ids.tolist() == tok.encode_one(context)
  for (start, end), token in zip(tokens.char_spans, tokens.ids):
    piece = context[start:end]
    assert piece == piece.strip() and 0 <= start <= end <= len(context)
    if piece.isascii() and piece.isalnum():  # The token spells its characters.
      spelled = tok.decode([token]).strip().lower().removeprefix("##")
      assert spelled == piece.lower(), (piece, token)
  answers = ["Denver  Broncos", "Super Bowl 50", "2016", "Carolina Panthers",
             "24\u201310", "Levi's Stadium"]
  examples = [squad_data.SquadExample(
      qid=str(n), question="Who won Super Bowl 50?", context=context,
      answers=(a,), answer_starts=(context.index(a),)) for n, a in enumerate(answers)]
  features = squad_data.make_features(examples, tok, max_seq_len=48, doc_stride=16,
                                      max_query_len=8, training=True)
  found = {}
  for f in range(len(features.input_ids)):
    start, end = features.start_positions[f], features.end_positions[f]
    if start == 0:
      continue  # This window does not hold the whole answer.
    first, last = (features.context_token_index[f][start],
                   features.context_token_index[f][end])
    spans = tokens.char_spans
    found.setdefault(answers[features.example_index[f]],
                     context[spans[first][0]:spans[last][1]])
  assert found == {a: a for a in answers}


def test_pretraining_from_scratch_with_a_raw_hugging_face_tokenizer(tmp_path,
                                                                   monkeypatch):
  """--config.tokenizer.path=<any>.json of a tokenizer whose special tokens are
  not at ids 0..4 (BERT's WordPiece, specials scattered): the workdir stores it
  re-indexed (roles first, every other token in its order), the run trains, the
  same command resumes, and ids are transformers' ids up to that re-indexing (a
  special token typed in the text stays text, as everywhere in the project)."""
  import tempfile  # pylint: disable=g-import-not-at-top
  from maelm_jax.run import train  # pylint: disable=g-import-not-at-top
  src = tmp_path / "bert"
  _, fast = make_bert(str(src))
  raw = src / "tokenizer.json"
  renamed = src / "my_wordpiece.json"  # Any file name.
  renamed.write_text(raw.read_text())
  vocab = fast.get_vocab()
  assert [vocab[t] for t in ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")] != list(range(5))
  staging = tmp_path / "staging"
  staging.mkdir()
  monkeypatch.setattr(tempfile, "tempdir", str(staging))

  def config(steps):
    return tiny_config("mlm", **{
        "tokenizer.path": str(renamed), "tokenizer.vocab_size": len(vocab),
        "data.source": "pydoc:", "data.eval_fraction": 0.05, "total_steps": steps,
        "eval_every": 2, "checkpoint_every": 2, "eval_batches": 1, "log_every": 1})
  workdir = tmp_path / "scratch"
  train.train_and_evaluate(config(2), str(workdir))
  stored = tokenizer_lib.HFTokenizer(workdir / "tokenizer.json")
  by_new_id = [stored._tok.id_to_token(i) for i in range(stored.vocab_size)]  # pylint: disable=protected-access
  assert by_new_id[:5] == ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
  for text in TEXTS:
    ours = [vocab[by_new_id[i]] for i in stored.encode_one(text)]
    if "[MASK]" in text:
      assert vocab["[MASK]"] not in ours and vocab["[CLS]"] not in ours
      continue
    assert ours == fast(text, add_special_tokens=False)["input_ids"], text
  train.train_and_evaluate(config(4), str(workdir))  # Resumes: the same tokenizer.
  assert pretrained_lib.load_pretrained(str(workdir)).step == 4
  assert not os.listdir(staging)  # The staged re-indexed copy is gone.


def test_a_tokenizer_json_with_truncation_and_padding_cuts_and_pads_nothing(
    roberta, tmp_path):
  """A checkpoint's tokenizer.json may say "truncate to 8, pad to 40" for its
  model's inputs; read as a workdir's tokenizer it neither cuts a document nor
  pads a context (the pipeline frames rows)."""
  path = roberta[2] / "w" / "tokenizer.json"
  plain = tokenizer_lib.HFTokenizer(path)
  raw = tokenizers.Tokenizer.from_file(str(path))
  raw.enable_truncation(8)
  raw.enable_padding(length=40, pad_id=1, pad_token="<pad>")
  raw.save(str(tmp_path / "tokenizer.json"))
  assert json.loads((tmp_path / "tokenizer.json").read_text())["truncation"]
  configured = tokenizer_lib.HFTokenizer(tmp_path / "tokenizer.json")
  text = SQUAD_CONTEXT
  assert len(plain.encode_one(text)) > 8
  assert configured.encode_one(text) == plain.encode_one(text)
  assert configured.encode(["Denver won"]) == plain.encode(["Denver won"])
  assert configured.encode_with_offsets(text)[0] == plain.encode_one(text)
