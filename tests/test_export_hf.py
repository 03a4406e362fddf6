"""Export to Hugging Face transformers: each kind of export loaded with transformers
on PyTorch, its hidden states and MLM logits matched against maelm-jax, its
tokenizer against the project's ids; and the mistakes a hurried user makes."""

import functools
import json
import os
import subprocess
import sys
import tempfile

import pytest

# Before transformers is imported: remote code is copied under HF_MODULES_CACHE.
os.environ.setdefault("HF_MODULES_CACHE", tempfile.mkdtemp(prefix="hf_modules_"))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from maelm_jax.run import checkpoints, pretrained as pretrained_lib  # noqa: E402
from maelm_jax.interop import export_hf  # noqa: E402
from maelm_jax.modeling import model as model_lib  # noqa: E402
from maelm_jax.data import sources  # noqa: E402
from maelm_jax.data import tokenizer as tokenizer_lib  # noqa: E402
from tests import helpers  # noqa: E402
from tests.helpers import tiny_config  # noqa: E402

# Real runs as processes, or compiles for TPU chips: `make test-quick` leaves
# this file out (pytest.ini's `slow`).
pytestmark = pytest.mark.slow

TRICKY_TEXTS = [
    "Hello world", "  leading,   inner   and trailing spaces  ", "tabs\tand\nnew lines",
    "", "naïve café ﬁ ① Ｆｕｌｌ-width", "a literal [MASK] and [CLS] stay text",
    "emoji 😀 and 中文", "1999, 2,000.5 and 3.14", "no\u00a0break\u200bzero width",
    "don't ‘quote’ “me”", "UPPER lower MiXeD", "punctuation!?;:()[]{}<>",
]


def pretrain(workdir, **overrides):
  """A 2-step tiny pretraining run on the embedded pydoc corpus."""
  from maelm_jax.run import train  # pylint: disable=g-import-not-at-top
  objective = overrides.pop("objective", "mlm")
  config = tiny_config(objective, **{
      "data.source": "pydoc:", "data.eval_fraction": 0.05,
      "tokenizer.vocab_size": 600, "batch_size": 8, "seq_len": 64,
      "total_steps": 2, "warmup_steps": 1, "eval_batches": 1, "log_every": 1,
      "eval_every": 2, "checkpoint_every": 2, **overrides})
  train.train_and_evaluate(config, str(workdir))
  return workdir


def jax_outputs(workdir, input_ids):
  """Last hidden states and MLM-head logits of the JAX model, float32."""
  p = pretrained_lib.load_pretrained(str(workdir), encoder_only=False)
  cfg = p.model_cfg.__class__(**{**p.model_cfg.__dict__, "dtype": jnp.float32})
  hidden = helpers.apply(
      model_lib.Encoder(cfg), {"params": model_lib.encoder_params(p.params)}, jnp.asarray(input_ids))
  logits = helpers.apply(model_lib.LMHead(cfg), {"params": p.params["lm_head"]}, hidden,
                         p.params["token_embed"]["embedding"])
  return np.asarray(hidden), np.asarray(logits)


def pydoc_sentences():
  """Every sentence of the embedded pydoc corpus (about 3,500)."""
  source = sources.open_source("pydoc:", "train")
  return [s for i in range(len(source)) for s in source[i].split(". ") if s]


def assert_transformers_reproduces(out, ref, **kwargs):
  """transformers' AutoModel of the export gives the reference hidden states at
  the real (non-padding) positions; returns the model."""
  valid = ref["attention_mask"].astype(bool)
  model = transformers.AutoModel.from_pretrained(out, **kwargs).eval()
  with torch.no_grad():
    hidden = model(input_ids=torch.tensor(ref["input_ids"]),
                   attention_mask=torch.tensor(ref["attention_mask"])
                   ).last_hidden_state.numpy()
  np.testing.assert_allclose(hidden[valid], ref["last_hidden_state"][valid],
                             atol=1e-4, rtol=0)
  return model


def check_export(out, workdir, model_class, remote):
  kwargs = {"trust_remote_code": True} if remote else {}
  ref = np.load(os.path.join(out, "reference_outputs.npz"))
  valid = ref["attention_mask"].astype(bool)
  assert (~valid).any(), "the reference rows should include padding"

  model = assert_transformers_reproduces(out, ref, **kwargs)
  jax_hidden, jax_logits = jax_outputs(workdir, ref["input_ids"])
  np.testing.assert_allclose(ref["last_hidden_state"], jax_hidden, atol=1e-5)

  mlm = transformers.AutoModelForMaskedLM.from_pretrained(out, **kwargs).eval()
  assert type(mlm).__name__ == model_class
  with torch.no_grad():
    logits = mlm(input_ids=torch.tensor(ref["input_ids"]),
                 attention_mask=torch.tensor(ref["attention_mask"])).logits.numpy()
  np.testing.assert_allclose(logits[valid], jax_logits[valid], atol=1e-4, rtol=0)

  # The project's ids: a special token typed in the text is text (as maelm-jax
  # reads it); transformers' default reads it as the token (the last check).
  hf_tok = functools.partial(transformers.AutoTokenizer.from_pretrained(out),
                             split_special_tokens=True)
  ours = tokenizer_lib.Tokenizer(os.path.join(workdir, "tokenizer.model"))
  for text in TRICKY_TEXTS:
    assert hf_tok(text)["input_ids"] == [2] + ours.encode_one(text) + [3], text
  # Real text: identical ids, except where two segmentations are the same pieces
  # in another order (runs of one character, "====="): SentencePiece's float32
  # path scores then break the tie where `tokenizers` (float64) sees a tie.
  sentences = pydoc_sentences()
  differ = [t for t in sentences
            if hf_tok(t)["input_ids"] != [2] + ours.encode_one(t) + [3]]
  assert len(differ) <= 0.02 * len(sentences), differ[:5]
  for text in differ:
    assert sorted(hf_tok(text)["input_ids"]) == sorted([2, *ours.encode_one(text), 3])
  a, b = TRICKY_TEXTS[0], TRICKY_TEXTS[5]
  assert hf_tok(a, b)["input_ids"] == [2, *ours.encode_one(a), 3, *ours.encode_one(b), 3]
  assert hf_tok(TRICKY_TEXTS[5])["input_ids"].count(4) == 0  # "[MASK]" is text
  assert hf_tok.func(TRICKY_TEXTS[5])["input_ids"].count(4) == 1  # unless asked
  # word_ids() name words (a new one at each "▁" piece), as word-level tools
  # (minicons' PLL-word-l2r, NER label alignment) need; it was one for the text.
  encoded = hf_tok("Ella's cousins weren't respected.")
  pieces = hf_tok.func.convert_ids_to_tokens(encoded["input_ids"])
  starts = [i for i, p in enumerate(pieces[1:-1], 1) if p.startswith("\u2581")]
  words = encoded.word_ids()
  assert words[0] is None and words[-1] is None and len(set(words[1:-1])) == 4
  assert [i for i in range(1, len(words) - 1) if words[i] != words[i - 1]] == starts
  batch = hf_tok(["short", "a somewhat longer sentence"], padding=True)
  assert batch["input_ids"][0][-1] == 0 and set(batch) == {"input_ids", "attention_mask"}
  # transformers' feature-extraction pipeline: the hidden states of the model.
  features = transformers.pipeline("feature-extraction", model=str(out),
                                   tokenizer=str(out), **kwargs)("A sentence.")
  ids = hf_tok.func("A sentence.", return_tensors="pt")
  with torch.no_grad():
    hidden = model(**ids).last_hidden_state.numpy()[0]
  np.testing.assert_allclose(np.asarray(features)[0], hidden, atol=1e-5)
  return model


@pytest.fixture(scope="module")
def mlm_export(tmp_path_factory):
  """The project's default encoder (pre-LN, rotary positions, tied head),
  exported with its MLM head: the remote-code kind."""
  root = tmp_path_factory.mktemp("mlm_export")
  workdir = pretrain(root / "mlm")
  out = root / "hf"
  assert export_hf.export(str(workdir), str(out), with_lm_head=True) == "maelm"
  return workdir, out


@pytest.fixture(scope="module")
def roberta_export(tmp_path_factory):
  """A post-LN encoder without relative bias (untied head, BPE tokenizer): the
  kind transformers loads as its own RoBERTa."""
  root = tmp_path_factory.mktemp("roberta_export")
  workdir = pretrain(root / "post", **{
      "model.ln_type": "post", "model.position": "learned",
      "model.relative_position_bias": False,
      "model.tie_embeddings": False, "tokenizer.model_type": "bpe"})
  out = root / "hf"
  assert export_hf.export(str(workdir), str(out), with_lm_head=True) == "roberta"
  return workdir, out


def test_custom_export_matches_jax_and_tokenizes_like_the_project(mlm_export):
  """Through trust_remote_code; hidden states, MLM logits and ids match."""
  workdir, out = mlm_export
  assert {"configuration_maelm.py", "modeling_maelm.py", "model.safetensors",
          "tokenizer.json", "README.md"} <= set(os.listdir(out))
  model = check_export(str(out), workdir, "MaelmForMaskedLM", remote=True)
  assert type(model).__name__ == "MaelmModel"
  assert model.config.ln_type == "pre" and model.config.position == "rope"
  assert not model.config.relative_position_bias
  card = (out / "README.md").read_text()
  assert "objective | mlm" in card and "steps | 2 of 2" in card
  from safetensors.numpy import load_file  # pylint: disable=g-import-not-at-top
  exported = sum(v.size for v in load_file(str(out / "model.safetensors")).values())
  assert f"{exported:,} parameters exported" in card  # The LM head's included.
  assert "transformers 4.57 and 5.x" in card

  # Encoder only: no head weights, and the same hidden states.
  enc_out = out.parent / "hf_encoder"
  export_hf.export(str(workdir), str(enc_out))
  from safetensors.numpy import load_file  # pylint: disable=g-import-not-at-top
  names = load_file(str(enc_out / "model.safetensors")).keys()
  assert not any(n.startswith("lm_head") for n in names)
  np.testing.assert_array_equal(
      np.load(enc_out / "reference_outputs.npz")["last_hidden_state"],
      np.load(out / "reference_outputs.npz")["last_hidden_state"])


FILL_MASK_TEXT = "The function returns a [MASK] of the values."


def fill_mask_expected(workdir, out, top_k=5) -> dict:
  """What transformers' fill-mask pipeline must answer for FILL_MASK_TEXT: the
  JAX model's logits at the [MASK] slot of the export tokenizer's ids."""
  ids = transformers.AutoTokenizer.from_pretrained(out)(FILL_MASK_TEXT)["input_ids"]
  assert ids.count(4) == 1, ids  # "[MASK]" typed is the mask token.
  _, logits = jax_outputs(workdir, np.asarray([ids]))
  slot = logits[0, ids.index(4)].astype(np.float64)
  probs = np.exp(slot - slot.max())
  return {"text": FILL_MASK_TEXT, "top_k": top_k,
          "top_probs": np.sort(probs / probs.sum())[::-1][:top_k].tolist(),
          "probs": (probs / probs.sum()).tolist()}


def assert_fill_mask_is_the_jax_model(answers, expected):
  """The pipeline's top predictions are the JAX model's: each answer's token has
  the JAX probability the pipeline gives it, and those are the k largest (ties
  within 1e-4 may come in either order)."""
  assert len(answers) == expected["top_k"]
  for answer in answers:
    assert abs(expected["probs"][answer["token"]] - answer["score"]) < 1e-4, answer
  np.testing.assert_allclose([a["score"] for a in answers], expected["top_probs"],
                             atol=1e-4, rtol=0)


@pytest.mark.parametrize("kind", ["mlm_export", "roberta_export"])
def test_fill_mask_pipeline_answers_as_the_jax_model(kind, request):
  """transformers' own fill-mask pipeline on an export: it finds the [MASK] typed
  in the sentence (split_special_tokens=True in the tokenizer's config hid it)
  and ranks the JAX model's top predictions."""
  workdir, out = request.getfixturevalue(kind)
  expected = fill_mask_expected(workdir, out)
  fill = transformers.pipeline("fill-mask", model=str(out), tokenizer=str(out),
                               trust_remote_code=kind == "mlm_export",
                               top_k=expected["top_k"])
  assert_fill_mask_is_the_jax_model(fill(FILL_MASK_TEXT), expected)


def test_post_ln_absolute_positions_export_as_plain_roberta(roberta_export):
  """No remote code: transformers' own RobertaModel."""
  workdir, out = roberta_export
  assert not (out / "modeling_maelm.py").exists()
  config = json.loads((out / "config.json").read_text())
  assert config["model_type"] == "roberta" and "auto_map" not in config
  model = check_export(str(out), workdir, "RobertaForMaskedLM", remote=False)
  assert type(model).__name__ == "RobertaModel"


def test_reference_rows_fit_a_short_position_table(tmp_path):
  """An encoder of 16 positions: the reference texts (longer, in its 600-piece
  tokenizer) are cut as fine-tuning cuts them, and the export reproduces them; they
  ran past the position table before."""
  workdir = pretrain(tmp_path / "short", **{"model.max_positions": 16, "seq_len": 16})
  out = tmp_path / "hf"
  export_hf.export(str(workdir), str(out))
  ref = np.load(out / "reference_outputs.npz")
  assert ref["input_ids"].shape[1] == 16 and (ref["input_ids"][:, -1] != 0).any()
  assert_transformers_reproduces(str(out), ref, trust_remote_code=True)


# `make test` builds a second environment with transformers 5.x (what users install
# today) beside the test venv, which pins 4.57 (the last with Flax models).
TRANSFORMERS5_PYTHON = os.environ.get("MAELM_TRANSFORMERS5_PYTHON", "")
DEFAULT_TRANSFORMERS5_PYTHON = os.path.join(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))), ".venv",
    "transformers5", "bin", "python")


def transformers5_python() -> str:
  """The python of the transformers 5.x environment `make test` builds; skips
  the test without one (fails where MAELM_TRANSFORMERS5_PYTHON names a missing one)."""
  python = TRANSFORMERS5_PYTHON or DEFAULT_TRANSFORMERS5_PYTHON
  if not os.path.exists(python):
    if TRANSFORMERS5_PYTHON:
      pytest.fail(f"MAELM_TRANSFORMERS5_PYTHON={python} does not exist")
    pytest.skip(f"no transformers 5.x environment at {python}; `make test` "
                "builds it (or set MAELM_TRANSFORMERS5_PYTHON)")
  return python


def run_transformers5_check(python, out, tmp_path):
  """tests/transformers5_check.py on the export `out` against tmp_path's
  expected.npz and expected.json; returns the finished process."""
  script = os.path.join(os.path.dirname(__file__), "transformers5_check.py")
  done = subprocess.run([python, script, str(out), str(tmp_path / "expected.npz"),
                         str(tmp_path / "expected.json")],
                        capture_output=True, text=True, timeout=600,
                        stdin=subprocess.DEVNULL)
  assert done.returncode == 0, done.stderr[-4000:]
  return done


@pytest.mark.parametrize("kind", ["mlm_export", "roberta_export"])
def test_exports_load_in_transformers5(kind, request, tmp_path):
  """Both kinds of export in transformers 5.x: hidden states, MLM logits (the tied
  head still one tensor) and tokenizer ids. A list-valued `_tied_weights_keys`
  broke 5.x's post_init for the remote-code kind."""
  python = transformers5_python()
  workdir, out = request.getfixturevalue(kind)
  ref = np.load(out / "reference_outputs.npz")
  _, logits = jax_outputs(workdir, ref["input_ids"])
  np.savez(tmp_path / "expected.npz", input_ids=ref["input_ids"],
           attention_mask=ref["attention_mask"],
           last_hidden_state=ref["last_hidden_state"], logits=logits)
  ours = tokenizer_lib.Tokenizer(os.path.join(workdir, "tokenizer.model"))
  (tmp_path / "expected.json").write_text(json.dumps({
      "remote": kind == "mlm_export",
      "model_class": ("MaelmForMaskedLM" if kind == "mlm_export"
                      else "RobertaForMaskedLM"),
      "texts": TRICKY_TEXTS,
      "ids": [[2, *ours.encode_one(t), 3] for t in TRICKY_TEXTS],
      "fill_mask": fill_mask_expected(workdir, out)}))
  done = run_transformers5_check(python, out, tmp_path)
  result = json.loads(done.stdout.strip().splitlines()[-1])
  assert result["transformers"].startswith("5.")
  assert result["hidden_err"] < 1e-4 and result["logits_err"] < 1e-4


def test_mistakes_are_refused_before_anything_is_written(decoder_exports, tmp_path):
  # The decoder tests' 2-step MAE-LM run, only read: each export below writes
  # under tmp_path.
  workdir = decoder_exports["maelm"][0]
  # Somebody else's directory: refused, untouched.
  theirs = tmp_path / "theirs"
  theirs.mkdir()
  (theirs / "notes.txt").write_text("keep me")
  with pytest.raises(FileExistsError, match="not an earlier export"):
    export_hf.export(str(workdir), str(theirs))
  assert os.listdir(theirs) == ["notes.txt"]
  # A fine-tuned model has no LM head to export.
  finetuned = tmp_path / "glue_run"
  finetuned.mkdir()
  (finetuned / "config.json").write_text(json.dumps({"mode": "glue", "task": "rte"}))
  with pytest.raises(ValueError, match="fine-tuned glue model, which has no LM head"):
    export_hf.export(str(finetuned), str(tmp_path / "x"), with_lm_head=True)
  with pytest.raises(ValueError, match=r"checkpoints at steps \[2\]"):
    export_hf.export(str(workdir), str(tmp_path / "x"), step=7)
  assert not (tmp_path / "x").exists()
  # An earlier export is replaced only when asked.
  out = tmp_path / "hf"
  export_hf.export(str(workdir), str(out))
  with pytest.raises(FileExistsError, match="--overwrite"):
    export_hf.export(str(workdir), str(out))
  export_hf.export(str(workdir), str(out), overwrite=True)
  assert json.loads((out / "export.json").read_text())["step"] == 2
  assert not [p for p in os.listdir(tmp_path) if ".tmp-" in p or ".old-" in p]


def test_cli_says_a_missing_workdir_in_one_line(tmp_path):
  done = subprocess.run(
      [sys.executable, "-m", "maelm_jax.interop.export_hf", f"--workdir={tmp_path}/nope",
       f"--out={tmp_path}/hf"], capture_output=True, text=True, timeout=300)
  assert done.returncode == 1
  assert done.stderr.strip().splitlines()[0].startswith("error: ")
  assert "pretraining run" in done.stderr and "Traceback" not in done.stderr


# ------------------------------------------------- Fine-tuned classifiers --


@pytest.fixture(scope="module")
def finetuned_exports(tmp_path_factory, mlm_export, roberta_export):
  """SST-2 fine-tunes of both pretraining runs, exported: the RoBERTa-shaped one
  with the first token's head (transformers' own RobertaForSequenceClassification),
  the project's default one mean-pooled (remote code)."""
  from maelm_jax.finetune import run  # pylint: disable=g-import-not-at-top
  from tests.test_finetune_e2e import glue_test_config, write_sst2  # pylint: disable=g-import-not-at-top
  root = tmp_path_factory.mktemp("finetuned")
  data = write_sst2(root / "SST-2")
  exports = {}
  for name, (pretraining, _), pooling, kind in (
      ("maelm", mlm_export, "mean", "maelm"), ("roberta", roberta_export, "cls", "roberta")):
    workdir = root / name
    run.run(glue_test_config("sst2", pretraining, data, pooling=pooling), str(workdir))
    assert export_hf.export(str(workdir), str(root / f"{name}_hf")) == kind
    exports[name] = (workdir, root / f"{name}_hf", data)
  return exports


def jax_classifier(workdir, data):
  """The fine-tuned JAX model's logits on the dev rows as fine-tuning encodes
  them, and the rows; read with the run's own loaders, not the export's."""
  from maelm_jax.finetune import glue_data, heads  # pylint: disable=g-import-not-at-top
  config = json.loads((workdir / "config.json").read_text())
  p = pretrained_lib.load_pretrained(config["init_from"], read_params=False)
  params, _ = pretrained_lib.restore_params(str(workdir))
  cfg = p.model_cfg.__class__(**{**p.model_cfg.__dict__, "dtype": jnp.float32})
  task = glue_data.get_task("sst2")
  examples = glue_data.read_tsv(task, str(data / "dev.tsv"))
  rows = glue_data.encode_examples(examples, p.tokenizer, config["max_seq_len"])
  logits = helpers.apply(
      heads.SequenceClassifier(cfg, task.num_outputs, pooling=config["pooling"]),
      {"params": params}, jnp.asarray(rows))
  return rows, np.asarray(logits), examples


@pytest.mark.parametrize("name", ["maelm", "roberta"])
def test_a_finetuned_classifier_exports_to_sequence_classification(finetuned_exports,
                                                                   name):
  """AutoModelForSequenceClassification of the export: the JAX logits on every
  dev example (1e-4), the fine-tuning run's own predictions, the task's labels,
  and transformers' text-classification pipeline; the card names the task,
  its dev results and the license."""
  workdir, out, data = finetuned_exports[name]
  # The class the command's hint names (export_hf.main prints it).
  assert export_hf.auto_class(str(out)) == "AutoModelForSequenceClassification"
  rows, jax_logits, examples = jax_classifier(workdir, data)
  remote = name == "maelm"
  model = transformers.AutoModelForSequenceClassification.from_pretrained(
      out, trust_remote_code=remote).eval()
  assert type(model).__name__ == ("MaelmForSequenceClassification" if remote
                                  else "RobertaForSequenceClassification")
  # The first-day report: {"0": "0", "1": "1"}, so the pipeline answered '1'.
  assert model.config.id2label == {0: "negative", 1: "positive"}
  ids = torch.tensor(rows.astype(np.int64))
  with torch.no_grad():
    logits = model(input_ids=ids, attention_mask=(ids != 0).long()).logits.numpy()
  np.testing.assert_allclose(logits, jax_logits, atol=1e-4, rtol=0)
  predictions = [json.loads(line)["prediction"]
                 for line in (workdir / "eval_predictions.jsonl").read_text().splitlines()]
  assert logits.argmax(-1).tolist() == predictions
  ref = np.load(out / "reference_outputs.npz")
  with torch.no_grad():
    ref_logits = model(input_ids=torch.tensor(ref["input_ids"]),
                       attention_mask=torch.tensor(ref["attention_mask"])).logits.numpy()
  np.testing.assert_allclose(ref_logits, ref["logits"], atol=1e-4, rtol=0)
  classify = transformers.pipeline("text-classification", model=str(out),
                                   tokenizer=str(out), trust_remote_code=remote)
  sentence = examples[0].texts[0]
  assert classify(sentence)[0]["label"] == ("negative", "positive")[
      int(jax_logits[0].argmax())]
  card = (out / "README.md").read_text()
  assert "license: apache-2.0" in card and "GLUE sst2" in card and "accuracy" in card
  # The card's figures are the export's: its parameters (the classifier's
  # included) and the fine-tuning's own steps and batch beside pretraining's.
  from safetensors.numpy import load_file  # pylint: disable=g-import-not-at-top
  exported = sum(v.size for v in load_file(str(out / "model.safetensors")).values())
  assert f"{exported:,} parameters exported" in card, card
  run = json.loads((workdir / "config.json").read_text())
  assert (f"fine-tuning steps | {checkpoints.latest_step(str(workdir))}, batch "
          f"{run['batch_size']} x {run['max_seq_len']} tokens") in card, card
  assert "pretraining steps | " in card


def test_a_finetuned_classifier_export_loads_in_transformers5(finetuned_exports,
                                                              tmp_path):
  python = transformers5_python()
  workdir, out, data = finetuned_exports["maelm"]
  rows, jax_logits, examples = jax_classifier(workdir, data)
  ref = np.load(out / "reference_outputs.npz")
  np.savez(tmp_path / "expected.npz", **ref)
  (tmp_path / "expected.json").write_text(json.dumps({
      "remote": True, "head": "classifier",
      "model_class": "MaelmForSequenceClassification",
      "input_ids": rows.tolist(), "logits": jax_logits.tolist(),
      "predictions": jax_logits.argmax(-1).tolist(),
      "sentence": examples[0].texts[0],
      "label": ("negative", "positive")[int(jax_logits[0].argmax())]}))
  done = run_transformers5_check(python, out, tmp_path)
  assert json.loads(done.stdout.strip().splitlines()[-1])["hidden_err"] < 1e-4


# ----------------------------------------------- Fine-tuned span extractors --


@pytest.fixture(scope="module")
def squad_exports(tmp_path_factory, mlm_export, roberta_export):
  """SQuAD v2.0 fine-tunes of both pretraining runs, exported: transformers' own
  RobertaForQuestionAnswering for the RoBERTa-shaped one, remote code else."""
  from maelm_jax.finetune import run  # pylint: disable=g-import-not-at-top
  from tests.test_finetune_e2e import squad_test_config, squad_v2_file  # pylint: disable=g-import-not-at-top
  root = tmp_path_factory.mktemp("squad")
  train_file = squad_v2_file(root / "train-v2.0.json", 48, seed=0)
  eval_file = squad_v2_file(root / "dev-v2.0.json", 12, seed=1)
  exports = {}
  for name, (pretraining, _), kind in (("maelm", mlm_export, "maelm"),
                                       ("roberta", roberta_export, "roberta")):
    workdir = root / name
    run.run(squad_test_config(pretraining, train_file, eval_file), str(workdir))
    assert export_hf.export(str(workdir), str(root / f"{name}_hf")) == kind
    exports[name] = (workdir, root / f"{name}_hf", eval_file)
  return exports


def jax_span_logits(workdir, eval_file):
  """The fine-tuned JAX model's start and end logits on the dev windows as
  fine-tuning builds them; read with the run's own loaders."""
  from maelm_jax.finetune import heads, squad_data  # pylint: disable=g-import-not-at-top
  config = json.loads((workdir / "config.json").read_text())
  p = pretrained_lib.load_pretrained(config["init_from"], read_params=False)
  params, _ = pretrained_lib.restore_params(str(workdir))
  cfg = p.model_cfg.__class__(**{**p.model_cfg.__dict__, "dtype": jnp.float32})
  features = squad_data.make_features(
      squad_data.read_squad_json(str(eval_file)), p.tokenizer,
      max_seq_len=config["max_seq_len"], doc_stride=config["doc_stride"],
      max_query_len=config["max_query_len"], training=False)
  start, end = helpers.apply(heads.SpanExtractor(cfg), {"params": params},
                             jnp.asarray(features.input_ids))
  return features.input_ids, np.asarray(start), np.asarray(end)


@pytest.mark.parametrize("name", ["maelm", "roberta"])
def test_a_squad_run_exports_to_question_answering(squad_exports, name):
  """AutoModelForQuestionAnswering of the export: the JAX start and end logits on
  every dev window (1e-4, real tokens), the reference rows, and transformers'
  question-answering pipeline answering from the context."""
  workdir, out, eval_file = squad_exports[name]
  assert export_hf.auto_class(str(out)) == "AutoModelForQuestionAnswering"
  ids, start, end = jax_span_logits(workdir, eval_file)
  remote = name == "maelm"
  model = transformers.AutoModelForQuestionAnswering.from_pretrained(
      out, trust_remote_code=remote).eval()
  assert type(model).__name__ == ("MaelmForQuestionAnswering" if remote
                                  else "RobertaForQuestionAnswering")
  valid = ids != 0
  with torch.no_grad():
    got = model(input_ids=torch.tensor(ids.astype(np.int64)),
                attention_mask=torch.tensor(valid.astype(np.int64)))
  np.testing.assert_allclose(got.start_logits.numpy()[valid], start[valid], atol=1e-4)
  np.testing.assert_allclose(got.end_logits.numpy()[valid], end[valid], atol=1e-4)
  ref = np.load(out / "reference_outputs.npz")
  ref_valid = ref["attention_mask"].astype(bool)
  with torch.no_grad():
    got = model(input_ids=torch.tensor(ref["input_ids"]),
                attention_mask=torch.tensor(ref["attention_mask"]))
  np.testing.assert_allclose(got.start_logits.numpy()[ref_valid],
                             ref["start_logits"][ref_valid], atol=1e-4)
  context = json.loads(eval_file.read_text())["data"][0]["paragraphs"][0]["context"]
  answer = transformers.pipeline("question-answering", model=str(out), tokenizer=str(out),
                                 trust_remote_code=remote)(
      question="where did the traveller go ?", context=context)
  assert answer["answer"] in context and 0 <= answer["start"] < answer["end"]
  card = (out / "README.md").read_text()
  assert "SQuAD v2.0" in card and "question-answering" in card


def test_a_squad_export_loads_in_transformers5(squad_exports, tmp_path):
  python = transformers5_python()
  workdir, out, eval_file = squad_exports["maelm"]
  ids, start, end = jax_span_logits(workdir, eval_file)
  np.savez(tmp_path / "expected.npz", **np.load(out / "reference_outputs.npz"))
  (tmp_path / "expected.json").write_text(json.dumps({
      "remote": True, "head": "qa", "model_class": "MaelmForQuestionAnswering",
      "input_ids": ids.tolist(), "start_logits": start.tolist(),
      "end_logits": end.tolist()}))
  run_transformers5_check(python, out, tmp_path)


# ------------------------------------------- MAE-LM's and 3ML's decoder --


@pytest.fixture(scope="module")
def decoder_exports(tmp_path_factory):
  """A MAE-LM (self-attention decoder) and a 3ML (cross-attention decoder) run,
  and a 3ML run with the BabyLM knobs (GEGLU, NormFormer's LayerNorms, post-LN
  and no relative bias: without the knobs that would export as RoBERTa) and
  rotary positions (the encoder's visible tokens and the cross decoder's
  [MASK] slots each rotated by their original positions), exported with their
  decoder and LM head."""
  root = tmp_path_factory.mktemp("decoders")
  exports = {}
  for name, overrides in (("maelm", {"objective": "maelm"}),
                          ("3ml", {"objective": "3ml", "model.decoder_type": "cross"}),
                          ("knobs", {"objective": "3ml", "model.decoder_type": "cross",
                                     "model.mlp_activation": "geglu",
                                     "model.normformer": True, "model.ln_type": "post",
                                     "model.relative_position_bias": False,
                                     "model.position": "rope"})):
    workdir = pretrain(root / name, **overrides)
    assert export_hf.export(str(workdir), str(root / f"{name}_hf"),
                            with_lm_head=True) == "maelm"
    exports[name] = (workdir, root / f"{name}_hf")
  return exports


def jax_decoder_logits(workdir, ids, slots):
  """The JAX pretraining model's logits at `slots` of the row `ids`, the slots
  removed before the encoder as in pretraining."""
  from maelm_jax.evaluate import blimp  # pylint: disable=g-import-not-at-top
  from maelm_jax.modeling import masking  # pylint: disable=g-import-not-at-top
  p = pretrained_lib.load_pretrained(str(workdir), encoder_only=False)
  cfg = p.model_cfg.__class__(**{**p.model_cfg.__dict__, "dtype": jnp.float32})
  ids = np.asarray([ids])
  masked = np.asarray([sorted(slots)])
  fields = blimp.copies_as_masks(ids, masked, cfg.drop_masked, cfg.mask_id)
  fields.update(selected_positions=masked.astype(np.int32),
                selected_weights=np.ones(masked.shape, np.float32),
                targets=np.zeros(masked.shape, np.int32))
  masks = masking.Masks(**{k: jnp.asarray(v) for k, v in fields.items()})
  return np.asarray(helpers.apply(model_lib.MaskedLM(cfg), {"params": p.params}, masks))[0]


@pytest.mark.parametrize("name", ["maelm", "3ml", "knobs"])
def test_a_decoder_exports_and_fills_masks_as_the_jax_model(decoder_exports, name):
  """AutoModelForMaskedLM of an MAE-LM / 3ML export: at the [MASK] slots its
  logits are the JAX pretraining model's (the slots removed before the encoder,
  the decoder over them) within 1e-4, with one [MASK] and with two; the
  fill-mask pipeline ranks the JAX model's top predictions."""
  workdir, out = decoder_exports[name]
  assert export_hf.auto_class(str(out)) == "AutoModelForMaskedLM"
  model = transformers.AutoModelForMaskedLM.from_pretrained(
      out, trust_remote_code=True).eval()
  tokenizer = transformers.AutoTokenizer.from_pretrained(out, trust_remote_code=True)
  for text in (FILL_MASK_TEXT, "The [MASK] returns a list of the [MASK] values."):
    ids = tokenizer(text)["input_ids"]
    slots = [i for i, t in enumerate(ids) if t == 4]
    with torch.no_grad():
      logits = model(input_ids=torch.tensor([ids])).logits.numpy()[0]
    np.testing.assert_allclose(logits[slots], jax_decoder_logits(workdir, ids, slots),
                               atol=1e-4, rtol=0)
  ids = tokenizer(FILL_MASK_TEXT)["input_ids"]
  slot = jax_decoder_logits(workdir, ids, [ids.index(4)])[0].astype(np.float64)
  probs = np.exp(slot - slot.max())
  probs /= probs.sum()
  fill = transformers.pipeline("fill-mask", model=str(out), tokenizer=str(out),
                               trust_remote_code=True, top_k=5)
  assert_fill_mask_is_the_jax_model(
      fill(FILL_MASK_TEXT), {"top_k": 5, "probs": probs.tolist(),
                             "top_probs": np.sort(probs)[::-1][:5].tolist()})
  assert "exported with the LM head" in (out / "README.md").read_text()


def test_a_decoder_export_fills_masks_in_transformers5(decoder_exports, tmp_path):
  python = transformers5_python()
  workdir, out = decoder_exports["knobs"]  # 3ML's cross decoder, GEGLU, NormFormer.
  ids = transformers.AutoTokenizer.from_pretrained(out, trust_remote_code=True)(
      FILL_MASK_TEXT)["input_ids"]
  slot = jax_decoder_logits(workdir, ids, [ids.index(4)])[0].astype(np.float64)
  probs = np.exp(slot - slot.max())
  probs /= probs.sum()
  np.savez(tmp_path / "expected.npz", **np.load(out / "reference_outputs.npz"))
  ours = tokenizer_lib.Tokenizer(os.path.join(workdir, "tokenizer.model"))
  (tmp_path / "expected.json").write_text(json.dumps({
      "remote": True, "head": "decoder", "model_class": "MaelmForMaskedLM",
      "texts": TRICKY_TEXTS, "ids": [[2, *ours.encode_one(t), 3] for t in TRICKY_TEXTS],
      "fill_mask": {"text": FILL_MASK_TEXT, "top_k": 5, "probs": probs.tolist(),
                    "top_probs": np.sort(probs)[::-1][:5].tolist()}}))
  run_transformers5_check(python, out, tmp_path)
