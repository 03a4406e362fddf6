"""Loads an export in a second environment with transformers 5.x (no JAX there).

  python tests/transformers5_check.py EXPORT_DIR EXPECTED.npz EXPECTED.json

test_export_hf.py writes EXPECTED.npz (`input_ids`, `attention_mask`,
`last_hidden_state`, `logits` from maelm-jax) and EXPECTED.json (`remote`,
`model_class`, `texts`, `ids`: the project's ids for each text), then runs this
script with the python of the environment the Makefile builds beside the test
venv. Exit 0 and one JSON line on success; an assertion's message otherwise.
"""

import json
import os
import sys
import tempfile

os.environ.setdefault("HF_MODULES_CACHE", tempfile.mkdtemp(prefix="hf_modules_"))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402
import transformers  # noqa: E402


def main(out, expected_npz, expected_json):
  want = json.loads(open(expected_json, encoding="utf-8").read())
  ref = np.load(expected_npz)
  kwargs = {"trust_remote_code": True} if want["remote"] else {}
  inputs = {"input_ids": torch.tensor(ref["input_ids"]),
            "attention_mask": torch.tensor(ref["attention_mask"])}
  valid = ref["attention_mask"].astype(bool)
  assert transformers.__version__.startswith("5."), transformers.__version__

  model = transformers.AutoModel.from_pretrained(out, **kwargs).eval()
  with torch.no_grad():
    hidden = model(**inputs).last_hidden_state.numpy()
  hidden_err = float(np.abs(hidden[valid] - ref["last_hidden_state"][valid]).max())
  assert hidden_err < 1e-4, f"hidden states differ by {hidden_err}"

  if want.get("head") in ("classifier", "qa"):
    (check_classifier if want["head"] == "classifier" else check_span_head)(
        out, want, kwargs)
    print(json.dumps({"transformers": transformers.__version__,
                      "torch": torch.__version__, "hidden_err": hidden_err}))
    return

  mlm = transformers.AutoModelForMaskedLM.from_pretrained(out, **kwargs).eval()
  assert type(mlm).__name__ == want["model_class"], type(mlm).__name__
  logits_err = 0.0
  if want.get("head") != "decoder":  # A decoder's logits count at [MASK] slots only.
    with torch.no_grad():
      logits = mlm(**inputs).logits.numpy()
    logits_err = float(np.abs(logits[valid] - ref["logits"][valid]).max())
    assert logits_err < 1e-4, f"MLM logits differ by {logits_err}"
  if mlm.config.tie_word_embeddings:  # One tensor, as in pretraining.
    assert (mlm.get_output_embeddings().weight.data_ptr()
            == mlm.get_input_embeddings().weight.data_ptr()), "head not tied"

  tokenizer = transformers.AutoTokenizer.from_pretrained(out, **kwargs)
  for text, ids in zip(want["texts"], want["ids"]):
    # The project's ids: "[MASK]" typed in a text is text.
    got = tokenizer(text, split_special_tokens=True)["input_ids"]
    assert got == ids, f"{text!r}: {got} != {ids}"

  # transformers' fill-mask pipeline ranks the JAX model's top predictions.
  expected = want["fill_mask"]
  fill = transformers.pipeline("fill-mask", model=out, tokenizer=out,
                               top_k=expected["top_k"], **kwargs)
  answers = fill(expected["text"])
  assert len(answers) == expected["top_k"], answers
  for answer in answers:
    err = abs(expected["probs"][answer["token"]] - answer["score"])
    assert err < 1e-4, f"fill-mask {answer}: the JAX model gives it {err} apart"
  scores = [a["score"] for a in answers]
  assert max(abs(a - b) for a, b in zip(scores, expected["top_probs"])) < 1e-4, (
      f"fill-mask's top scores {scores} are not the JAX model's {expected['top_probs']}")
  print(json.dumps({"transformers": transformers.__version__,
                    "torch": torch.__version__, "model": type(model).__name__,
                    "hidden_err": hidden_err, "logits_err": logits_err}))


def check_classifier(out, want, kwargs):
  """A fine-tuned export: AutoModelForSequenceClassification gives the JAX
  logits on the given rows, the fine-tuning run's predictions, and the
  text-classification pipeline the same label."""
  model = transformers.AutoModelForSequenceClassification.from_pretrained(
      out, **kwargs).eval()
  assert type(model).__name__ == want["model_class"], type(model).__name__
  ids = torch.tensor(want["input_ids"])
  with torch.no_grad():
    logits = model(input_ids=ids, attention_mask=(ids != 0).long()).logits.numpy()
  err = float(np.abs(logits - np.asarray(want["logits"])).max())
  assert err < 1e-4, f"classifier logits differ by {err}"
  assert logits.argmax(-1).tolist() == want["predictions"], "predictions differ"
  classify = transformers.pipeline("text-classification", model=out, tokenizer=out,
                                   **kwargs)
  label = classify(want["sentence"])[0]["label"]
  assert label == want["label"], f"pipeline says {label}, the JAX model {want['label']}"


def check_span_head(out, want, kwargs):
  """A SQuAD export: AutoModelForQuestionAnswering gives the JAX start and end
  logits on the given windows' real tokens."""
  model = transformers.AutoModelForQuestionAnswering.from_pretrained(
      out, **kwargs).eval()
  assert type(model).__name__ == want["model_class"], type(model).__name__
  ids = torch.tensor(want["input_ids"])
  valid = (ids != 0).numpy()
  with torch.no_grad():
    got = model(input_ids=ids, attention_mask=(ids != 0).long())
  for name in ("start_logits", "end_logits"):
    err = float(np.abs(getattr(got, name).numpy()[valid]
                       - np.asarray(want[name])[valid]).max())
    assert err < 1e-4, f"{name} differ by {err}"


if __name__ == "__main__":
  main(*sys.argv[1:])
