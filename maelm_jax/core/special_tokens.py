"""The special-token layout every tokenizer and model here shares.

Five pieces at fixed ids, so model code (masking, the n-gram baselines) uses
these constants without opening a tokenizer (`data/tokenizer.py` trains and
checks tokenizers to this layout; imported Hugging Face tokenizers are re-indexed
to it):

  id 0 [PAD]   padding (never produced by packing; kept for fine-tuning batches)
  id 1 [UNK]   characters outside the trained alphabet
  id 2 [CLS]   first token of every pretraining row
  id 3 [SEP]   document separator and last token of every row
  id 4 [MASK]  the corruption token of MLM / MAE-LM / 3ML
"""

SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
NUM_SPECIAL = len(SPECIAL_TOKENS)
PAD_ID, UNK_ID, CLS_ID, SEP_ID, MASK_ID = range(NUM_SPECIAL)
