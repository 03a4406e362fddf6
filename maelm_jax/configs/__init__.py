"""The configs, shipped with the package so that the console scripts find them
from any directory (`--config=configs/pretrain.py:...`, core/cli.py); the
repository's `configs/` links here. Each file is loaded by path
(`get_config(arg)`, as big_vision's), not imported as a module.
"""
