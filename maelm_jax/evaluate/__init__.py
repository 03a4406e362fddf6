"""Scoring encoders without fine-tuning: BLiMP and representation analysis."""
