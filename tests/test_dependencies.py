"""The dependencies setup.py declares are the ones the package imports: a module
imported at the top of a maelm_jax file is an install requirement, one imported
inside a function is a requirement or an extra's, and every requirement is
imported somewhere (numpy 2, array_record and pyarrow were imported but came
only through grain and tfds)."""

import ast
import functools
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


@functools.cache
def _providers() -> dict[str, list[str]]:
  """{top-level module: distributions} of the environment, read once: each read
  walks every installed distribution's file list, and the tests ask it of
  every imported module, some twice."""
  return importlib.metadata.packages_distributions()


def distribution(module: str, declared_names=()) -> str:
  """The distribution that provides `module`; for a namespace package that many
  provide (`google`), the declared one among them."""
  names = [n.lower().replace("_", "-") for n in _providers().get(module) or []]
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


def test_the_notebook_installs_what_it_imports():
  """notebooks/quickstart.ipynb installs the checkout with the `notebook` extra
  when an import it needs is missing; that extra and install_requires provide
  every third-party module its cells import (torch and transformers for the
  export's last cell were in none), and its install cell checks them all."""
  import json  # pylint: disable=g-import-not-at-top
  cells = ["".join(c["source"]) for c in json.loads(
      (REPO / "notebooks" / "quickstart.ipynb").read_text())["cells"]
           if c["cell_type"] == "code"]
  modules = set()
  for cell in cells:
    for node in ast.walk(ast.parse(cell)):
      if isinstance(node, ast.Import):
        modules |= {a.name.split(".")[0] for a in node.names}
      elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
        modules.add(node.module.split(".")[0])
  # IPython is the kernel's own, present wherever a notebook runs.
  modules -= set(sys.stdlib_module_names) | {"maelm_jax", "IPython"}
  requires, extras = declared()
  assert "notebook" in extras, "setup.py has no `notebook` extra"
  provided = requires | extras["notebook"]
  missing = sorted(f"{m} ({distribution(m, provided)})" for m in modules
                   if distribution(m, provided) not in provided)
  assert not missing, f"the notebook imports what its install does not provide: {missing}"
  install = next(c for c in cells if "pip" in c and "install" in c)
  assert "[notebook]" in install
  checked = set(re.search(r"import ([\w, ]+)", install.split("try:")[1])[1]
                .replace(" ", "").split(","))
  assert modules <= checked | {"numpy"}, sorted(modules - checked)
