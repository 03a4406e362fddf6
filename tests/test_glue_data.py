"""GLUE readers against fixtures in the real file formats, tfds records, encoding."""

import os

import numpy as np
import pytest

from maelm_jax.data import sources
from maelm_jax.finetune import glue_data

BOM = "\ufeff"
MNLI_TRAIN_HEADER = ("index\tpromptID\tpairID\tgenre\tsentence1_binary_parse\t"
                     "sentence2_binary_parse\tsentence1_parse\tsentence2_parse\t"
                     "sentence1\tsentence2\tlabel1\tgold_label")
MNLI_DEV_HEADER = ("index\tpromptID\tpairID\tgenre\tsentence1_binary_parse\t"
                   "sentence2_binary_parse\tsentence1_parse\tsentence2_parse\t"
                   "sentence1\tsentence2\tlabel1\tlabel2\tlabel3\tlabel4\tlabel5\t"
                   "gold_label")
MNLI_TEST_HEADER = ("index\tpromptID\tpairID\tgenre\tsentence1_binary_parse\t"
                    "sentence2_binary_parse\tsentence1_parse\tsentence2_parse\t"
                    "sentence1\tsentence2")
STSB_HEADER = ("index\tgenre\tfilename\tyear\told_index\tsource1\tsource2\t"
               "sentence1\tsentence2")


def mnli_row(index, s1, s2, *labels):
  parses = "\t".join(["( x )", "( y )", "(ROOT x)", "(ROOT y)"])
  return f"{index}\t31193\t31193n\tgovernment\t{parses}\t{s1}\t{s2}" + "".join(
      f"\t{label}" for label in labels)


# Each task's files as download_glue_data.py writes them, and what they hold:
# (texts, label) per train/dev example and (index, texts) per test example.
FIXTURES = {
    "CoLA": {
        "train.tsv": "gj04\t1\t\tOur friends won't buy this analysis.\n"
                     "gj04\t0\t*\tThey drank the pub.\n",
        "dev.tsv": "gj04\t1\t\tThe sailors rode the breeze clear of the rocks.\n",
        "test.tsv": "index\tsentence\n0\tBill whistled past the house.\n",
    },
    "SST-2": {
        "train.tsv": "sentence\tlabel\nhide new secretions from the parental units \t0\n"
                     "the film 's \" spirit \" is contagious \t1\n",
        "dev.tsv": "sentence\tlabel\nit 's a charming and often affecting journey . \t1\n",
        "test.tsv": "index\tsentence\n0\tuneasy mishmash of styles and genres .\n",
    },
    "MRPC": {
        "train.tsv": BOM + "Quality\t#1 ID\t#2 ID\t#1 String\t#2 String\n"
                     "1\t702876\t702977\tAmrozi called him \" the witness \" .\t"
                     "Referring to him as \" the witness \" , Amrozi spoke .\n"
                     "0\t2108705\t2108831\tYucaipa owned Dominick 's .\t"
                     "Yucaipa bought Dominick 's in 1995 .\n",
        "dev.tsv": BOM + "Quality\t#1 ID\t#2 ID\t#1 String\t#2 String\n"
                   "1\t1355540\t1355592\tHe said the foodservice pie business .\t"
                   "The foodservice pie business does not fit .\n",
        "test.tsv": "index\t#1 ID\t#2 ID\t#1 String\t#2 String\n"
                    "0\t1089874\t1089925\tPCCW 's chief will leave .\t"
                    "The chief will quit .\n",
    },
    "STS-B": {
        "train.tsv": STSB_HEADER + "\tscore\n"
                     "0\tmain-captions\tMSRvid\t2012test\t0001\tnone\tnone\t"
                     "A plane is taking off.\tAn air plane is taking off.\t5.000\n",
        "dev.tsv": STSB_HEADER + "\tscore\n"
                   "0\tmain-captions\tMSRvid\t2012test\t0000\tnone\tnone\t"
                   "A man with a hard hat is dancing.\tA man is dancing.\t3.800\n",
        "test.tsv": STSB_HEADER + "\n0\tmain-captions\tMSRvid\t2012test\t0024\tnone\t"
                    "none\tA girl is styling her hair.\tA girl is brushing her hair.\n",
    },
    "QQP": {
        # The second train row is truncated, as a few rows of the real file are.
        "train.tsv": "id\tqid1\tqid2\tquestion1\tquestion2\tis_duplicate\n"
                     "133273\t213221\t213222\tHow is the life of a math student?\t"
                     "Which level of prepration is enough?\t0\n"
                     "201841\t303345\t303346\tWhy are African-Americans so beautiful?\n"
                     "402555\t536040\t536041\tHow do I control my horny emotions?\t"
                     "How do you control your horniness?\t1\n",
        "dev.tsv": "id\tqid1\tqid2\tquestion1\tquestion2\tis_duplicate\n"
                   "2\t5\t6\tWhy am I mentally very lonely?\t"
                   "Find the remainder when 23^24 is divided by 24?\t0\n",
        "test.tsv": "id\tquestion1\tquestion2\n"
                    "7\tHow do I get rid of acne?\tHow do I remove acne?\n",
    },
    "MNLI": {
        "train.tsv": MNLI_TRAIN_HEADER + "\n" + mnli_row(
            0, "Conceptually cream skimming has two dimensions.",
            "Product and geography are what make cream skimming work.",
            "neutral", "neutral") + "\n",
        "dev_matched.tsv": MNLI_DEV_HEADER + "\n" + mnli_row(
            0, "The new rights are nice enough", "Everyone really likes the rights.",
            "neutral", "entailment", "neutral", "neutral", "neutral",
            "neutral") + "\n",
        "dev_mismatched.tsv": MNLI_DEV_HEADER + "\n" + mnli_row(
            0, "Your contribution helped.", "Your contributions were of no help.",
            "contradiction", "contradiction", "contradiction", "contradiction",
            "contradiction", "contradiction") + "\n",
        "test_matched.tsv": MNLI_TEST_HEADER + "\n" + mnli_row(
            0, "Hierbas is a liqueur.", "There is a liqueur.") + "\n",
        "test_mismatched.tsv": MNLI_TEST_HEADER + "\n" + mnli_row(
            0, "What have you decided?", "You have decided.") + "\n",
    },
    "QNLI": {
        "train.tsv": "index\tquestion\tsentence\tlabel\n"
                     "0\tWhen did the third Digimon series begin?\t"
                     "Unlike the two seasons before it, it was dark.\tnot_entailment\n",
        "dev.tsv": "index\tquestion\tsentence\tlabel\n"
                   "0\tWhat came into force after the new constitution was herald?\t"
                   "As of that day, the new constitution came into force.\tentailment\n",
        "test.tsv": "index\tquestion\tsentence\n"
                    "0\tWhat organization is devoted to Jihad?\t"
                    "For some decades prior to the revolution, Islamist groups rose.\n",
    },
    "RTE": {
        "train.tsv": "index\tsentence1\tsentence2\tlabel\n"
                     "0\tNo Weapons of Mass Destruction Found in Iraq Yet.\t"
                     "Weapons of Mass Destruction Found in Iraq.\tnot_entailment\n",
        "dev.tsv": "index\tsentence1\tsentence2\tlabel\n"
                   "0\tDana Reeve died of lung cancer.\t"
                   "Christopher Reeve had an accident.\tnot_entailment\n"
                   "1\tYet, we now are discovering oil.\tOil is found.\tentailment\n",
        "test.tsv": "index\tsentence1\tsentence2\n"
                    "0\tMangla was an ancient city.\tMangla was a city.\n",
    },
    "WNLI": {
        "train.tsv": "index\tsentence1\tsentence2\tlabel\n"
                     "0\tI stuck a pin through a carrot.\tThe carrot had a hole.\t1\n",
        "dev.tsv": "index\tsentence1\tsentence2\tlabel\n"
                   "0\tThe drain is clogged with hair.\tThe hair has to be cleaned.\t0\n",
        "test.tsv": "index\tsentence1\tsentence2\n"
                    "0\tMaude and Dora had seen the trains.\tDora had seen them.\n",
    },
}

EXPECTED = {
    "cola": {
        "train": [(("Our friends won't buy this analysis.",), 1),
                  (("They drank the pub.",), 0)],
        "dev": [(("The sailors rode the breeze clear of the rocks.",), 1)],
        "test": [(0, ("Bill whistled past the house.",))],
    },
    "sst2": {
        "train": [(("hide new secretions from the parental units ",), 0),
                  (("the film 's \" spirit \" is contagious ",), 1)],
        "dev": [(("it 's a charming and often affecting journey . ",), 1)],
        "test": [(0, ("uneasy mishmash of styles and genres .",))],
    },
    "mrpc": {
        "train": [(("Amrozi called him \" the witness \" .",
                    "Referring to him as \" the witness \" , Amrozi spoke ."), 1),
                  (("Yucaipa owned Dominick 's .", "Yucaipa bought Dominick 's in 1995 ."),
                   0)],
        "dev": [(("He said the foodservice pie business .",
                  "The foodservice pie business does not fit ."), 1)],
        "test": [(0, ("PCCW 's chief will leave .", "The chief will quit ."))],
    },
    "stsb": {
        "train": [(("A plane is taking off.", "An air plane is taking off."), 5.0)],
        "dev": [(("A man with a hard hat is dancing.", "A man is dancing."), 3.8)],
        "test": [(0, ("A girl is styling her hair.", "A girl is brushing her hair."))],
    },
    "qqp": {
        "train": [(("How is the life of a math student?",
                    "Which level of prepration is enough?"), 0),
                  (("How do I control my horny emotions?",
                    "How do you control your horniness?"), 1)],
        "dev": [(("Why am I mentally very lonely?",
                  "Find the remainder when 23^24 is divided by 24?"), 0)],
        "test": [(7, ("How do I get rid of acne?", "How do I remove acne?"))],
    },
    "mnli": {
        "train": [(("Conceptually cream skimming has two dimensions.",
                    "Product and geography are what make cream skimming work."), 1)],
        "mnli_m": [(("The new rights are nice enough",
                     "Everyone really likes the rights."), 1)],
        "mnli_mm": [(("Your contribution helped.",
                      "Your contributions were of no help."), 2)],
        "test": [(0, ("Hierbas is a liqueur.", "There is a liqueur."))],
    },
    "qnli": {
        "train": [(("When did the third Digimon series begin?",
                    "Unlike the two seasons before it, it was dark."), 1)],
        "dev": [(("What came into force after the new constitution was herald?",
                  "As of that day, the new constitution came into force."), 0)],
        "test": [(0, ("What organization is devoted to Jihad?",
                      "For some decades prior to the revolution, Islamist groups rose."))],
    },
    "rte": {
        "train": [(("No Weapons of Mass Destruction Found in Iraq Yet.",
                    "Weapons of Mass Destruction Found in Iraq."), 1)],
        "dev": [(("Dana Reeve died of lung cancer.",
                  "Christopher Reeve had an accident."), 1),
                (("Yet, we now are discovering oil.", "Oil is found."), 0)],
        "test": [(0, ("Mangla was an ancient city.", "Mangla was a city."))],
    },
    "wnli": {
        "train": [(("I stuck a pin through a carrot.", "The carrot had a hole."), 1)],
        "dev": [(("The drain is clogged with hair.", "The hair has to be cleaned."), 0)],
        "test": [(0, ("Maude and Dora had seen the trains.", "Dora had seen them."))],
    },
}


def write_glue(root, tasks=None):
  """Writes the fixtures under root/<TSV dir>/ as UTF-8 bytes."""
  for directory, files in FIXTURES.items():
    if tasks and directory not in tasks:
      continue
    os.makedirs(root / directory, exist_ok=True)
    for name, text in files.items():
      (root / directory / name).write_bytes(text.encode("utf-8"))
  return root


@pytest.fixture
def glue_root(tmp_path):
  return write_glue(tmp_path / "glue")


def as_pairs(examples):
  return [(e.texts, e.label) for e in examples]


@pytest.mark.parametrize("name", sorted(glue_data.TASKS))
def test_each_task_reads_train_dev_and_test(glue_root, name):
  task = glue_data.get_task(name)
  data = glue_data.GlueData(task, "tsv", str(glue_root))  # The GLUE root works.
  assert (data.dir, data.layout) == (str(glue_root / task.tsv_dir), "tsv")
  data.check_files(test=True)
  expected = EXPECTED[name]
  assert as_pairs(data.train()) == expected["train"]
  for split in task.eval_splits:
    dev = data.dev(split)
    assert as_pairs(dev) == expected[split.name]
    assert [e.index for e in dev] == list(range(len(dev)))
  test = data.test(task.eval_splits[0])
  assert [(e.index, e.texts) for e in test] == expected["test"]
  assert all(e.label is None for e in test)


def write_hub_layouts(task, data, root):
  """The task's examples (as read from the TSVs) written as users hold GLUE from
  the hub: its parquet files (root/parquet/<name>/<split>-00000-of-00001.parquet)
  and a DatasetDict.save_to_disk folder (root/hfdisk/<name>/<split>/*.arrow),
  with tfds's columns and class ids (-1 on test splits), built with pyarrow."""
  import json  # pylint: disable=g-import-not-at-top
  import pyarrow as pa  # pylint: disable=g-import-not-at-top
  import pyarrow.parquet as pq  # pylint: disable=g-import-not-at-top
  splits = {"train": data.train()}
  for split in task.eval_splits:
    splits[split.tfds_split] = data.dev(split)
    splits[split.test_tfds_split] = data.test(split)
  for split, examples in splits.items():
    columns = {f: [e.texts[i] for e in examples]
               for i, f in enumerate(task.tfds_text_features)}
    missing = -1.0 if task.is_regression else -1
    columns["label"] = [missing if e.label is None else e.label for e in examples]
    columns["idx"] = [e.index for e in examples]
    table = pa.table(columns)
    (root / "parquet" / task.name).mkdir(parents=True, exist_ok=True)
    pq.write_table(table, root / "parquet" / task.name / f"{split}-00000-of-00001.parquet")
    folder = root / "hfdisk" / task.name / split
    folder.mkdir(parents=True)
    with pa.OSFile(str(folder / "data-00000-of-00001.arrow"), "wb") as sink:
      with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    (folder / "state.json").write_text(json.dumps(
        {"_data_files": [{"filename": "data-00000-of-00001.arrow"}]}))
  (root / "hfdisk" / task.name / "dataset_dict.json").write_text(
      json.dumps({"splits": list(splits)}))


@pytest.mark.parametrize("name", sorted(glue_data.TASKS))
def test_the_hubs_parquet_and_save_to_disk_layouts_read_as_the_tsvs(glue_root, tmp_path,
                                                                     name):
  """The same examples from the TSVs, the hub's parquet files and a save_to_disk
  folder, each found from the root above the task's folder or from the folder."""
  task = glue_data.get_task(name)
  tsv = glue_data.GlueData(task, "tsv", str(glue_root))
  write_hub_layouts(task, tsv, tmp_path)
  for layout in ("parquet", "hfdisk"):
    for data_dir in (tmp_path / layout, tmp_path / layout / task.name):
      data = glue_data.GlueData(task, "tsv", str(data_dir))
      assert (data.dir, data.layout) == (str(tmp_path / layout / task.name), layout)
      data.check_files(test=True)
      assert as_pairs(data.train()) == as_pairs(tsv.train())
      for split in task.eval_splits:
        assert [(e.index, e.texts, e.label) for e in data.dev(split)] == [
            (e.index, e.texts, e.label) for e in tsv.dev(split)]
        assert [(e.index, e.texts, e.label) for e in data.test(split)] == [
            (e.index, e.texts, e.label) for e in tsv.test(split)]


def test_a_hub_folder_missing_a_split_or_of_another_task_is_named(glue_root, tmp_path):
  sst2, rte = glue_data.get_task("sst2"), glue_data.get_task("rte")
  write_hub_layouts(sst2, glue_data.GlueData(sst2, "tsv", str(glue_root)), tmp_path)
  os.remove(tmp_path / "parquet" / "sst2" / "test-00000-of-00001.parquet")
  data = glue_data.GlueData(sst2, "tsv", str(tmp_path / "parquet"))
  data.check_files()  # No test split needed unless test predictions are asked for.
  with pytest.raises(FileNotFoundError, match=r"lacks the \['test'\] split.*predict_test"):
    data.check_files(test=True)
  with pytest.raises(ValueError, match=r"has no column \['sentence1', 'sentence2'\]"):
    glue_data.read_hub_split(rte, str(tmp_path / "hfdisk" / "sst2"), "hfdisk", "train")


def test_mrpc_byte_order_mark_and_bare_quotes_survive(glue_root):
  assert (glue_root / "MRPC" / "train.tsv").read_bytes().startswith(b"\xef\xbb\xbf")
  task = glue_data.get_task("mrpc")
  examples = glue_data.read_tsv(task, str(glue_root / "MRPC" / "train.tsv"))
  # With csv's default quoting the '"' would swallow the tab and the label.
  assert examples[0].texts[0] == "Amrozi called him \" the witness \" ."
  assert examples[0].label == 1


def test_malformed_rows_are_skipped_in_train_but_fatal_in_dev(glue_root, tmp_path):
  task = glue_data.get_task("qqp")
  train = glue_data.read_tsv(task, str(glue_root / "QQP" / "train.tsv"),
                             skip_malformed=True)
  assert len(train) == 2  # The truncated row is dropped.
  dev = tmp_path / "dev.tsv"
  dev.write_text((glue_root / "QQP" / "train.tsv").read_text())
  with pytest.raises(ValueError, match=r"dev.tsv:3 has 4 tab-separated fields"):
    glue_data.read_tsv(task, str(dev))


def test_unknown_label_names_file_line_and_labels(tmp_path):
  path = tmp_path / "dev.tsv"
  path.write_text("index\tsentence1\tsentence2\tlabel\n0\ta\tb\tneutral\n")
  with pytest.raises(ValueError, match=r"dev.tsv:2: label 'neutral' is not one of "
                     r"RTE's labels \['entailment', 'not_entailment'\]"):
    glue_data.read_tsv(glue_data.get_task("rte"), str(path))


def test_a_non_utf8_tsv_is_named_with_its_line(tmp_path):
  path = tmp_path / "dev.tsv"
  path.write_bytes("sentence\tlabel\nfine\t1\nun caf\xe9\t0\n".encode("latin-1"))
  with pytest.raises(ValueError, match=r"dev.tsv, line 3: not UTF-8"):
    glue_data.read_tsv(glue_data.get_task("sst2"), str(path))


def test_wrong_directory_and_missing_files_are_explained(glue_root, tmp_path):
  rte = glue_data.get_task("rte")
  with pytest.raises(FileNotFoundError, match="nor a RTE/ directory"):
    glue_data.GlueData(rte, "tsv", str(tmp_path / "nowhere"))
  with pytest.raises(ValueError, match="--config.data.dir is empty"):
    glue_data.GlueData(rte, "tsv", "")
  with pytest.raises(ValueError, match="has no column"):  # SST-2 files read as RTE.
    glue_data.read_tsv(rte, str(glue_root / "SST-2" / "dev.tsv"))
  cola = glue_data.get_task("cola")  # Headerless: SST-2's rows are too short.
  for name, skip in (("train.tsv", True), ("dev.tsv", False)):
    with pytest.raises(ValueError, match="no row has the 4 tab-separated fields of a "
                       r"CoLA file .*'sentence\\tlabel'.*the CoLA directory"):
      glue_data.read_tsv(cola, str(glue_root / "SST-2" / name), skip_malformed=skip)
  os.remove(glue_root / "RTE" / "test.tsv")
  data = glue_data.GlueData(rte, "tsv", str(glue_root / "RTE"))
  data.check_files()  # No test file needed unless test predictions are asked for.
  with pytest.raises(FileNotFoundError, match="lacks \\['test.tsv'\\].*predict_test"):
    data.check_files(test=True)


def test_task_names_accept_the_glue_spellings():
  assert glue_data.get_task("SST-2").name == "sst2"
  assert glue_data.get_task("STS-B").name == "stsb"
  assert glue_data.get_task("MNLI").name == "mnli"
  with pytest.raises(ValueError, match="unknown GLUE task 'squad'"):
    glue_data.get_task("squad")


def test_diagnostic_set_reads_as_unlabelled_pairs(tmp_path):
  path = tmp_path / "diagnostic.tsv"
  path.write_text("index\tsentence1\tsentence2\n0\tThe cat sat on the mat.\t"
                  "The cat did not sit on the mat.\n1\tb\tc\n")
  examples = glue_data.read_diagnostic_tsv(str(path))
  assert [(e.index, e.texts, e.label) for e in examples] == [
      (0, ("The cat sat on the mat.", "The cat did not sit on the mat."), None),
      (1, ("b", "c"), None)]


def test_tfds_records_map_to_the_same_examples(monkeypatch):
  """tfds records hold bytes and integer labels (-1 on test splits)."""
  records = {
      ("glue/mnli", "validation_mismatched"): [
          {"premise": b"Your contribution helped.",
           "hypothesis": b"Your contributions were of no help.",
           "label": np.int64(2), "idx": np.int32(0)}],
      ("glue/mnli", "test_matched"): [
          {"premise": b"p", "hypothesis": b"h", "label": np.int64(-1),
           "idx": np.int32(41)}],
      ("glue/stsb", "train"): [
          {"sentence1": b"A plane is taking off.",
           "sentence2": b"An air plane is taking off.", "label": np.float32(5.0),
           "idx": np.int32(0)}],
  }
  opened = []

  def fake_open(name, split, data_dir):
    opened.append((name, split, data_dir))
    return records[(name, split)]

  monkeypatch.setattr(sources, "open_tfds_split", fake_open)
  mnli = glue_data.GlueData(glue_data.get_task("mnli"), "tfds", tfds_data_dir="/tfds")
  mismatched = mnli.task.eval_splits[1]
  assert as_pairs(mnli.dev(mismatched)) == EXPECTED["mnli"]["mnli_mm"]
  test = mnli.test(mnli.task.eval_splits[0])
  assert [(e.index, e.texts, e.label) for e in test] == [(41, ("p", "h"), None)]
  stsb = glue_data.GlueData(glue_data.get_task("stsb"), "tfds")
  assert as_pairs(stsb.train()) == EXPECTED["stsb"]["train"]
  assert opened == [("glue/mnli", "validation_mismatched", "/tfds"),
                    ("glue/mnli", "test_matched", "/tfds"), ("glue/stsb", "train", None)]


def test_real_tfds_glue_builder_under_mock_data():
  """The real glue builder through tfds.data_source: it is registered only once
  tensorflow_datasets.text.glue is imported, which sources.open_tfds_split does."""
  import tensorflow_datasets as tfds
  with tfds.testing.mock_data(num_examples=7):
    for name in ("sst2", "qnli", "stsb"):
      task = glue_data.get_task(name)
      examples = glue_data.GlueData(task, "tfds").train()
      assert len(examples) == 7
      assert all(len(e.texts) == len(task.tfds_text_features) for e in examples)
      assert all(isinstance(t, str) for e in examples for t in e.texts)
      if task.is_regression:
        assert all(isinstance(e.label, float) for e in examples)
      else:
        assert all(e.label in range(len(task.labels)) for e in examples)


def bert_truncate_seq_pair(len_a, len_b, budget):
  """The reference loop from BERT's run_classifier.py."""
  while len_a + len_b > budget:
    if len_a > len_b:
      len_a -= 1
    else:
      len_b -= 1
  return len_a, len_b


def test_pair_truncation_matches_bert_for_all_small_lengths():
  for budget in range(1, 12):
    for len_a in range(0, 15):
      for len_b in range(0, 15):
        assert glue_data.truncated_pair_lengths(len_a, len_b, budget) == \
            bert_truncate_seq_pair(len_a, len_b, budget), (len_a, len_b, budget)


class WordTokenizer:
  """One id per whitespace word: ids are easy to read in assertions."""

  pad_id, cls_id, sep_id = 0, 2, 3

  def __init__(self):
    self.vocab = {}

  def encode(self, texts):
    return [[self.vocab.setdefault(w, 10 + len(self.vocab)) for w in t.split()]
            for t in texts]


def test_encoding_layout_padding_and_truncation():
  tokenizer = WordTokenizer()
  single = [glue_data.GlueExample(0, ("a b c",), 1),
            glue_data.GlueExample(1, ("a b c d e f g h",), 0)]
  ids = glue_data.encode_examples(single, tokenizer, max_seq_len=6)
  a, b, c, d = (tokenizer.vocab[w] for w in "abcd")
  np.testing.assert_array_equal(ids, [[2, a, b, c, 3, 0], [2, a, b, c, d, 3]])
  assert ids.dtype == np.int32

  pairs = [glue_data.GlueExample(0, ("a b", "c"), 1),
           glue_data.GlueExample(1, ("a b c d e f", "a b"), 0)]
  ids = glue_data.encode_examples(pairs, tokenizer, max_seq_len=8)
  # Budget 5: the longer first text is cut to 3 tokens, the second keeps 2.
  np.testing.assert_array_equal(ids, [[2, a, b, 3, c, 3, 0, 0],
                                      [2, a, b, c, 3, a, b, 3]])


def test_submission_files_use_label_strings_and_clip_scores(tmp_path):
  rte = glue_data.get_task("rte")
  path = tmp_path / "RTE.tsv"
  glue_data.write_submission(str(path), rte, [0, 1, 2], np.array([1, 0, 1]))
  assert path.read_text() == ("index\tprediction\n0\tnot_entailment\n1\tentailment\n"
                              "2\tnot_entailment\n")
  glue_data.write_submission(str(path), glue_data.get_task("stsb"), [5, 6],
                             np.array([5.4, -0.25]))
  assert path.read_text() == "index\tprediction\n5\t5.000\n6\t0.000\n"


def test_shared_glue_files_read_completely(shared_data):
  """The real files: every example is read (counts from the data's README)."""
  glue = str(shared_data / "glue")
  sst2 = glue_data.GlueData(glue_data.get_task("sst2"), "tsv", glue)
  dev = sst2.dev(sst2.task.eval_splits[0])
  assert len(dev) == 872 and len(sst2.train()) == 67_349
  assert set(e.label for e in dev) == {0, 1}
  cola = glue_data.GlueData(glue_data.get_task("cola"), "tsv", glue)
  assert len(cola.dev(cola.task.eval_splits[0])) == 1_043
  assert len(cola.train()) == 8_551
  wnli = glue_data.GlueData(glue_data.get_task("wnli"), "tsv", glue)
  assert (len(wnli.train()), len(wnli.dev(wnli.task.eval_splits[0]))) == (635, 71)
  qnli = glue_data.read_tsv(glue_data.get_task("qnli"),
                            str(shared_data / "glue" / "QNLI" / "dev.tsv"))
  assert len(qnli) == 5_463 and set(e.label for e in qnli) == {0, 1}
  diagnostic = glue_data.read_diagnostic_tsv(
      str(shared_data / "glue" / "diagnostic" / "diagnostic.tsv"))
  assert len(diagnostic) == 1_104
  assert [e.index for e in diagnostic] == list(range(1_104))


def test_the_shipped_sst2_sample_reads_as_sst2(tmp_path):
  """The quickstart's offline sample: SST-2's files and format, both labels in
  about equal shares, the same sentences for the same seed."""
  root = glue_data.write_sample_sst2(str(tmp_path / "a"), num_train=400, num_dev=50)
  data = glue_data.GlueData(glue_data.get_task("sst2"), "tsv", root)
  data.check_files()
  train, dev = data.train(), data.dev(data.task.eval_splits[0])
  assert (len(train), len(dev)) == (400, 50)
  assert 0.4 < np.mean([e.label for e in train]) < 0.6
  again = glue_data.write_sample_sst2(str(tmp_path / "b"), num_train=400, num_dev=50)
  assert as_pairs(glue_data.GlueData(data.task, "tsv", again).train()) == as_pairs(train)
