"""Text in, token ids out: corpora, the tokenizer, prepared token-id corpora, the pretraining input pipeline."""
