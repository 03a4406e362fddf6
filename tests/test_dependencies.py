"""The dependencies setup.py declares are the ones the package imports: a module
imported at the top of a maelm_jax file is an install requirement, one imported
inside a function is a requirement or an extra's, and every requirement is
imported somewhere (numpy 2, array_record and pyarrow were imported but came
only through grain and tfds)."""

import ast
import importlib.metadata
import pathlib
import re
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]
# Runs in the user's transformers environment, not in maelm_jax's (an export's
# remote code): its imports are transformers' and torch's.
SHIPPED_TO_EXPORTS = REPO / "maelm_jax" / "interop" / "hf_modeling"


def declared():
  """(install_requires, {extra: requirements}) as distribution names, read from
  setup.py's own call (not from an installed copy that may be older)."""
  captured = {}
  import setuptools  # pylint: disable=g-import-not-at-top
  original = setuptools.setup
  setuptools.setup = lambda **kwargs: captured.update(kwargs)
  try:
    source = (REPO / "setup.py").read_text()
    exec(compile(source, "setup.py", "exec"), {"__name__": "setup"})  # pylint: disable=exec-used
  finally:
    setuptools.setup = original
  name = lambda req: re.split(r"[\s<>=!~;\[]", req, maxsplit=1)[0].lower().replace("_", "-")
  return ({name(r) for r in captured["install_requires"]},
          {extra: {name(r) for r in reqs}
           for extra, reqs in captured["extras_require"].items()})


def imported():
  """{top-level module: at module level?} of every third-party import."""
  found = {}
  for path in (REPO / "maelm_jax").rglob("*.py"):
    if SHIPPED_TO_EXPORTS in path.parents:
      continue
    for node in ast.walk(ast.parse(path.read_text())):
      if isinstance(node, ast.Import):
        names = [a.name for a in node.names]
      elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
        names = [node.module]
      else:
        continue
      for name in names:
        root = name.split(".")[0]
        if root in sys.stdlib_module_names or root in ("maelm_jax", "__future__"):
          continue
        found[root] = found.get(root, False) or node.col_offset == 0
  return found


def distribution(module: str, declared_names=()) -> str:
  """The distribution that provides `module`; for a namespace package that many
  provide (`google`), the declared one among them."""
  names = [n.lower().replace("_", "-")
           for n in importlib.metadata.packages_distributions().get(module) or []]
  if not names:
    pytest.fail(f"{module} is imported but not installed")
  return next((n for n in names if n in declared_names), names[0])


def test_setup_py_declares_what_the_package_imports():
  requires, extras = declared()
  anywhere = requires.union(*extras.values()) | {
      r.split("[")[0] for r in requires.union(*extras.values())}
  problems = []
  for module, at_top in sorted(imported().items()):
    dist = distribution(module, anywhere)
    if at_top and dist not in requires:
      problems.append(f"{module} ({dist}) is imported at module level but not in "
                      "install_requires")
    elif dist not in anywhere:
      problems.append(f"{module} ({dist}) is imported but in no requirement or extra")
  used = {distribution(m, anywhere) for m in imported()}
  problems += [f"install_requires has {d}, which no module imports"
               for d in sorted(requires - used)]
  assert not problems, "\n".join(problems)


def test_the_declared_numpy_is_the_one_jax_needs():
  jax_needs = [r for r in importlib.metadata.requires("jax") if r.startswith("numpy")]
  setup = (REPO / "setup.py").read_text()
  ours = re.search(r'"numpy>=([\d.]+)"', setup)[1]
  theirs = re.search(r">=([\d.]+)", jax_needs[0])[1]
  as_tuple = lambda v: tuple(int(x) for x in v.split("."))
  assert as_tuple(ours) >= as_tuple(theirs), (ours, jax_needs)
