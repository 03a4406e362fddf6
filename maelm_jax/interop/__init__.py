"""Other ecosystems: Hugging Face export and import, fairseq import."""
