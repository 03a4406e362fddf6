"""Docs that cannot rot: every relative link and image of the README, docs/ and the
benchmark and study READMEs resolves, and every `python -m maelm_jax...` command in
them names a module that exists, with flags that module defines and `--config.*`
keys its config really has."""

import functools
import importlib
import importlib.util
import pathlib
import re
import subprocess

import pytest

from maelm_jax.run import config_lib

REPO = pathlib.Path(__file__).resolve().parents[1]
DOCS = sorted([REPO / "README.md", REPO / "benchmarks" / "README.md",
               REPO / "studies" / "README.md", *(REPO / "docs").glob("*.md")])
# The results' links and figures are checked too; their commands are history (a
# key since renamed stays as it ran).
BENCHMARK_PAGES = sorted(p for p in (REPO / "benchmarks").glob("*.md")
                         if p.name != "README.md")  # README.md is in DOCS.
RESULTS = [*BENCHMARK_PAGES,  # studies/: RESULTS.md (the index) and its question pages.
           *sorted(p for p in (REPO / "studies").glob("*.md") if p.name != "README.md")]
# A markdown link or image: [text](target).
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
# A command, with its arguments to the end of the line or of the code span.
COMMAND = re.compile(r"python3? -m (maelm_jax[\w.]*)((?:\\\n|[^\n`])*)")
# Its config file and argument, and the config keys it sets.
CONFIG_FILE = re.compile(r"--config=(configs/\w+\.py)(?::([^\s'\"`]*))?")
CONFIG_KEY = re.compile(r"--config\.([\w.]+)=")
# absl's own flags, which every command accepts.
ABSL_FLAGS = {"help", "helpfull", "helpshort", "flagfile", "verbosity", "v",
              "logtostderr", "alsologtostderr", "log_dir", "only_check_args", "pdb"}


def relative_links(path: pathlib.Path):
  for target in LINK.findall(path.read_text()):
    if re.match(r"[a-z]+:", target) or target.startswith("#"):
      continue  # A web address or an anchor in the same page.
    yield target.split("#", 1)[0]


@pytest.mark.parametrize("doc", DOCS + RESULTS, ids=lambda p: str(p.relative_to(REPO)))
def test_relative_links_and_images_resolve(doc):
  missing = [t for t in relative_links(doc) if not (doc.parent / t).exists()]
  assert not missing, f"{doc.relative_to(REPO)} links to missing files: {missing}"


# The console scripts (setup.py): maelm-pretrain is maelm_jax.main, ...
SCRIPTS = dict(re.findall(r'"(maelm-[\w-]+) = ([\w.]+):\w+"',
                          (REPO / "setup.py").read_text()))
SCRIPT_COMMAND = re.compile(r"(?<![\w/.-])(maelm-[\w-]+)((?: |\\\n)(?:\\\n|[^\n`])*)")


def commands(text: str):
  """(module, argument text) of each `python -m maelm_jax...` command and each
  console script, backslash continuations joined."""
  for module, args in COMMAND.findall(text):
    yield module.rstrip("."), args.replace("\\\n", " ")
  for script, args in SCRIPT_COMMAND.findall(text):
    if script in SCRIPTS:
      yield SCRIPTS[script], args.replace("\\\n", " ")


@functools.lru_cache(maxsize=None)
def defined_flags(module: str) -> frozenset:
  """The flags `module` defines (read from its source: a command defines its
  flags only when it runs, so that commands can share a process)."""
  every_command = REPO / "maelm_jax" / "core" / "cli.py"  # --verbose
  sources = [pathlib.Path(importlib.import_module(module).__file__), every_command]
  text = "".join(p.read_text() for p in sources)
  return frozenset(re.findall(r"DEFINE_\w+\(\s*[\"'](\w+)[\"']", text)) | ABSL_FLAGS


def command_problems(text: str) -> list[str]:
  problems = []
  for module, args in commands(text):
    if module == "maelm_jax":
      continue  # Prose such as "python -m maelm_jax.…" with the name elided.
    if importlib.util.find_spec(module) is None:
      problems.append(f"no module {module}")
      continue
    args = re.sub(r"#.*", "", args)  # A shell comment after the command.
    flags = re.findall(r"(?<![\w.-])--(\w+)(?![\w.])", args)  # Not --config.x.
    unknown = set(flags) - defined_flags(module)
    problems += [f"{module}: no flag --{flag}" for flag in sorted(unknown)]
    config = CONFIG_FILE.search(args)
    keys = CONFIG_KEY.findall(args)
    if not config or not keys:
      continue
    loaded = config_lib.load_config_module(str(REPO / config[1])).get_config(
        config[2] or None)
    for key in keys:
      node = loaded
      try:
        for part in key.split("."):
          node = node[part]
      except (KeyError, TypeError, AttributeError):
        problems.append(f"{module} {config[1]}: no config key {key}")
  return problems


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(REPO)))
def test_commands_name_real_modules_flags_and_config_keys(doc):
  problems = command_problems(doc.read_text())
  assert not problems, f"{doc.relative_to(REPO)}: " + "; ".join(sorted(set(problems)))


def test_the_checks_find_what_they_look_for(tmp_path):
  """A broken link, a made-up key and a made-up flag are caught (the checks can
  fail), and real ones pass."""
  doc = tmp_path / "x.md"
  doc.write_text("![a](missing.png) [b](https://x.org) [c](#here)\n"
                 "python -m maelm_jax.main --config=configs/pretrain.py \\\n"
                 "    --config.model.no_such_key=1 --config.batch_size=2 --workdir=/tmp/w\n"
                 "python -m maelm_jax.evaluate.blimp --workdir=/tmp/w --no_such_flag=1 --out=/tmp/b"
                 "  # --also_not_checked\n"
                 "`maelm-export --workdir=/tmp/w --out=/tmp/e --step=3 --bogus` in maelm-jax\n")
  assert list(relative_links(doc)) == ["missing.png"]
  (module, args), _, _ = commands(doc.read_text())
  assert module == "maelm_jax.main" and CONFIG_KEY.findall(args) == [
      "model.no_such_key", "batch_size"]
  assert sorted(command_problems(doc.read_text())) == [
      "maelm_jax.evaluate.blimp: no flag --no_such_flag",
      "maelm_jax.interop.export_hf: no flag --bogus",
      "maelm_jax.main configs/pretrain.py: no config key model.no_such_key"]


def test_the_configuration_reference_is_the_configs_own():
  """docs/configuration.md lists every key of configs/pretrain.py and
  configs/glue.py with its default and its comment, and nothing else: it is
  regenerated here and must match."""
  from maelm_jax.tools import config_reference
  written = (REPO / "docs" / "configuration.md").read_text()
  assert written == config_reference.reference(), (
      "docs/configuration.md is out of date with the configs: run python -m "
      "maelm_jax.tools.config_reference --out=docs/configuration.md")
  for key in ("`batch_size`", "`model.objective`", "`data.source`", "`pooling`"):
    assert f"| {key} |" in written
  assert "|  |" not in written, "a key without a comment: add one in its config"


# How the work was organised, which no reader can follow: the team's issue
# numbers and work sessions, the GPU machine's calls, lending and carried folders.
ORGANISATION_WORDS = re.compile(
    # (Each word spelt with a bracket here, so that this file does not hold it.)
    r"\bdevice[ ]calls?\b|\ble[n]t\b|\bstops? \d+\b|[$]OUT\b|\bCALL[_]S\b|\bcarr[y]=|"
    r"\bcarried (?:in|folders?|text)\b|\bthe carried\b|\bissues? \d+\b", re.IGNORECASE)


def tracked_files(*patterns) -> list[str]:
  """The checkout's tracked files (matching `patterns`). Skips only outside a git
  checkout: a git that fails in one (a "dubious ownership" refusal, say) fails the
  test rather than skip what it guards."""
  if not (REPO / ".git").exists():
    pytest.skip("not a git checkout")
  listed = subprocess.run(["git", "ls-files", *patterns], cwd=REPO,
                          capture_output=True, text=True, check=False)
  assert listed.returncode == 0, f"git ls-files failed: {listed.stderr.strip()}"
  return listed.stdout.split()


def test_no_words_of_how_the_work_was_organised():
  tracked = tracked_files()
  hits = []
  for name in tracked:
    path = REPO / name
    if name in ("LICENSE", "tests/test_docs.py") or not path.is_file():
      continue
    try:
      text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
      continue  # Not text.
    hits += [f"{name}:{n}: {m.group(0)!r}" for n, line in enumerate(text.splitlines(), 1)
             for m in ORGANISATION_WORDS.finditer(line)]
  assert not hits, "words of how the work was organised:\n" + "\n".join(hits[:40])


def test_no_tracked_file_outside_the_tests_cites_a_folder_a_reader_lacks():
  """`../shared/` and `/work/` are folders of the machines this was built on, not
  of a reader, and `/tmp/` is one that a reader's machine need not keep: a command
  says `<data>` (the downloaded data) or `runs/` (relative to the checkout)
  instead, and a default scratch path is `tempfile.gettempdir()`'s (in a shell
  script, `${TMPDIR:-/tmp}`). (Recorded environment values, such as a soak's
  LD_PRELOAD, are data, not paths to follow.)"""
  tracked = tracked_files()
  pattern = re.compile(r"\.\./shared/|(?<![\w.])/(?:work|tmp)/")
  hits = []
  for name in tracked:
    path = REPO / name
    if name.startswith("tests/") or not path.is_file():
      continue
    try:
      lines = path.read_text(encoding="utf-8").splitlines()
    except UnicodeDecodeError:
      continue
    hits += [f"{name}:{n}: {line.strip()[:100]}" for n, line in enumerate(lines, 1)
             if pattern.search(line) and '"ld_preload"' not in line]
  assert not hits, "paths a reader does not have:\n" + "\n".join(hits[:40])


def test_commands_and_imports_use_the_modules_new_names():
  """The old flat module names (maelm_jax/__init__.py's _MOVED) still import, with
  a DeprecationWarning, and go in the next release: nothing a reader copies uses
  them. Their own record (the changelog, the shim, its test, the architecture
  guide that explains them) is left out."""
  from maelm_jax import _MOVED  # pylint: disable=import-outside-toplevel
  tracked = tracked_files("*.md", "*.py", "*.sh", "*.ipynb", "*.toml", "Makefile")
  record = {"CHANGELOG.md", "maelm_jax/__init__.py", "tests/test_layers.py",
            "docs/architecture.md", "tests/test_docs.py"}
  old_name = re.compile(r"\bmaelm_jax\.(" + "|".join(sorted(_MOVED)) + r")\b")
  hits = [f"{name}:{n}: {m.group(0)}" for name in tracked if name not in record
          and (REPO / name).is_file()
          for n, line in enumerate((REPO / name).read_text(encoding="utf-8").splitlines(), 1)
          for m in old_name.finditer(line)]
  assert not hits, "old module names (use the new, maelm_jax/__init__.py's _MOVED):\n" + \
      "\n".join(hits[:40])
