"""The package's layers as a checked fact (.importlinter), and the old flat module
names that notebooks and scripts may still use (maelm_jax/__init__.py)."""

import importlib
import os
import pathlib
import subprocess
import sys

import pytest

import maelm_jax

REPO = pathlib.Path(__file__).resolve().parents[1]
LINT = pathlib.Path(sys.executable).with_name("lint-imports")


def lint(config: pathlib.Path) -> subprocess.CompletedProcess:
  if not LINT.exists():
    pytest.fail(f"{LINT} is missing: pip install -e '.[test]' (import-linter)")
  return subprocess.run([str(LINT), "--config", str(config), "--no-cache"], cwd=REPO,
                        capture_output=True, text=True, timeout=300)


def test_the_layer_contracts_hold():
  result = lint(REPO / ".importlinter")
  assert result.returncode == 0, result.stdout[-3000:]
  assert "2 kept, 0 broken" in result.stdout


def test_a_layer_upside_down_is_reported(tmp_path):
  """The checker really reads the package: core placed above run breaks, and the
  report names an import that does it."""
  config = tmp_path / "upside_down.ini"
  config.write_text("[importlinter]\nroot_package = maelm_jax\n\n"
                    "[importlinter:contract:x]\nname = upside down\ntype = layers\n"
                    "layers =\n    maelm_jax.core\n    maelm_jax.run\n")
  result = lint(config)
  assert result.returncode != 0 and "upside down BROKEN" in result.stdout
  assert "maelm_jax.run." in result.stdout and "-> maelm_jax.core." in result.stdout


def test_every_moved_module_has_one_home_and_its_old_name():
  package = pathlib.Path(maelm_jax.__file__).parent
  flat = {p.stem for p in package.glob("*.py")} - {"__init__"}
  assert flat == {"main", "compare", "sweep", "plan"}  # Only the commands stay flat.
  for old, layer in maelm_jax._MOVED.items():  # pylint: disable=protected-access
    new = importlib.import_module(f"maelm_jax.{layer}.{old}")
    with pytest.warns(DeprecationWarning,
                      match=f"maelm_jax.{old} is now maelm_jax.{layer}.{old}; the old"):
      assert importlib.import_module(f"maelm_jax.{old}") is new, old


def test_old_names_are_the_same_module_for_patches(monkeypatch):
  from maelm_jax.run import train
  for old in ("train", "hf_modeling"):  # Imported again, as new (any test order).
    monkeypatch.delattr(maelm_jax, old, raising=False)
    for name in [n for n in sys.modules if n.startswith(f"maelm_jax.{old}")]:
      monkeypatch.delitem(sys.modules, name)
  with pytest.warns(DeprecationWarning, match="maelm_jax.train is now maelm_jax.run.train"):
    monkeypatch.setattr("maelm_jax.train.PREPARED_SOURCES", ("patched",), raising=False)
  assert train.PREPARED_SOURCES == ("patched",)
  with pytest.warns(DeprecationWarning, match=r"maelm_jax.hf_modeling(.modeling_maelm)? is now"):
    import maelm_jax.hf_modeling.modeling_maelm as old  # A moved package's module.
  from maelm_jax.interop.hf_modeling import modeling_maelm
  assert old is modeling_maelm


def test_python_dash_m_runs_a_moved_module_by_its_old_name():
  env = {**os.environ, "JAX_PLATFORMS": "cpu"}
  result = subprocess.run([sys.executable, "-m", "maelm_jax.prepare_data", "--help"],
                          cwd=REPO, capture_output=True, text=True, env=env, timeout=300)
  assert result.returncode == 0, result.stderr[-2000:]
  assert "One preparation step" in result.stdout, result.stderr[-2000:]
  assert ("note: python -m maelm_jax.prepare_data is now maelm_jax.data.prepare_data; "
          "the old name goes in the next release") in result.stderr.splitlines()
  assert "--tokenizer" in result.stdout
