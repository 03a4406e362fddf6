r"""The configuration reference, written from the configs themselves: every key of
`configs/pretrain.py` and `configs/glue.py`, its default, and the comments beside
and above its assignment (in the config file, or in the function that adds it).

  python -m maelm_jax.tools.config_reference --out=docs/configuration.md

`tests/test_docs.py` regenerates it and compares, so the reference cannot drift
from the configs: a key added, removed or re-commented without running this
command fails the tests, naming it.
"""

from __future__ import annotations

import inspect
import io
import pathlib
import re
import tokenize

from absl import flags

from maelm_jax.core import cli
from maelm_jax.finetune import common_config
from maelm_jax.run import config_lib

PACKAGE = pathlib.Path(__file__).resolve().parents[1]  # configs/ ships inside it
CONFIGS = (("Pretraining", "configs/pretrain.py", None),
           ("Fine-tuning (GLUE; SQuAD shares the optimizer and run keys)",
            "configs/glue.py", "task=rte"))
ASSIGNMENT = re.compile(r"^\s*config\.([\w.]+)\s*=")


def _comments(source: str) -> dict[str, str]:
  """dotted key -> the comment block right above its assignment, then the comment
  on its line."""
  lines = source.splitlines()
  found: dict[str, str] = {}
  for number, line in enumerate(lines):
    match = ASSIGNMENT.match(line)
    if not match:
      continue
    above = []
    for previous in reversed(lines[:number]):
      if not previous.strip().startswith("#"):
        break
      above.insert(0, previous.strip().lstrip("#").strip())
    inline = ""
    try:  # The comment after the value, if the line holds one.
      tokens = tokenize.generate_tokens(io.StringIO(line.strip() + "\n").readline)
      inline = next((t.string.lstrip("#").strip() for t in tokens
                     if t.type == tokenize.COMMENT), "")
    except (tokenize.TokenError, SyntaxError):  # A value continued on the next line.
      pass
    text = " ".join(part for part in (" ".join(above), inline) if part)
    found[match[1]] = found.get(match[1]) or text
  return found


def _flat(config, prefix: str = ""):
  for key, value in config.items():
    if hasattr(value, "items"):
      yield from _flat(value, f"{prefix}{key}.")
    else:
      yield f"{prefix}{key}", value


def _cell(text: str) -> str:
  return text.replace("|", "\\|").replace("\n", " ")


def reference() -> str:
  out = ["# Configuration reference", "",
         "Every key of the configs, its default and what it does, written from the "
         "config files' own comments by `python -m maelm_jax.tools.config_reference "
         "--out=docs/configuration.md` (do not edit by hand; `tests/test_docs.py` "
         "checks it). Override any key with `--config.KEY=VALUE`; keys left at "
         "`None` take the objective's or the size's default (`run/config_lib.py`, "
         "`resolve`).", ""]
  shared = _comments(inspect.getsource(common_config))
  for title, path, arg in CONFIGS:
    source = (PACKAGE / path).read_text()
    comments = {**shared, **_comments(source)}
    config = config_lib.load_config_module(str(PACKAGE / path)).get_config(arg)
    out += [f"## {title}: `{path}`", "", "| key | default | what it does |",
            "|---|---|---|"]
    for key, value in _flat(config):
      out.append(f"| `{key}` | `{_cell(repr(value))}` | {_cell(comments.get(key, ''))} |")
    out.append("")
  return "\n".join(out)


def define_flags() -> None:
  flags.DEFINE_string("out", None, "The file to write, docs/configuration.md",
                      required=True)


def main() -> None:
  pathlib.Path(flags.FLAGS.out).write_text(reference())
  print(f"wrote {flags.FLAGS.out}")


if __name__ == "__main__":
  cli.run(main, define_flags)
