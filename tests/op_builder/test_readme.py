"""README.md's sections on installing and building say what the Makefile, pyproject.toml and the
builder do. It used to omit ninja and which Python make uses, call deselected GPU tests "skipped",
call `make bench` GPU-only and leave `make clean` unexplained."""
import ast
import re

from jit_helpers import REPO

README = (REPO / "README.md").read_text()
MAKEFILE = (REPO / "Makefile").read_text()


def _section(title: str) -> str:
    """The text of the README section ``## title`` (its subsections included)."""
    match = re.search(rf"^## {re.escape(title)}\n(.*?)(?=^## )", README, re.M | re.S)
    assert match, f"README.md has no section '## {title}'"
    return " ".join(match.group(1).split())  # one line: sentences wrap anywhere


def _recipe(target: str) -> str:
    match = re.search(rf"^{target}:.*\n((?:\t.*\n)+)", MAKEFILE, re.M)
    assert match, f"the Makefile has no target {target}"
    return match.group(1)


def test_install_names_ninja_the_only_declared_dependency():
    (dependencies,) = re.findall(r"^dependencies = (.*)$", (REPO / "pyproject.toml").read_text(), re.M)
    assert dependencies == '["ninja"]'
    assert "`ninja` is a dependency" in _section("Install")
    assert "torch is not a declared dependency" in _section("Install")


def test_gpu_tests_are_described_as_deselected_as_make_test_does():
    assert '-m "not gpu"' in _recipe("test")
    commands = _section("The two commands")
    assert "tests marked `gpu` are deselected" in commands
    assert not re.search(r"GPU tests are skipped", README)


def test_the_python_make_uses_is_described_as_the_makefile_picks_it():
    assert "PYTHON ?= $(if $(VIRTUAL_ENV),$(VIRTUAL_ENV)/bin/python,$(VENV)/bin/python)" in MAKEFILE
    assert re.search(r"^VENV \?= \.venv$", MAKEFILE, re.M)
    commands = _section("The two commands")
    for claim in ("`make` prints it first", "(`$VIRTUAL_ENV`)", "this checkout's `.venv`", "PYTHON=/path/to/python",
                  "never into a system Python"):
        assert claim in commands, claim


def test_make_bench_is_described_as_running_on_a_cpu():
    assert "needs a GPU (skipped here)" in _recipe("bench")
    assert 'on a CPU the CPU benchmarks run and the GPU ones say "needs a GPU"' in _section("The two commands")


def test_make_clean_lists_what_scripts_clean_removes():
    clean = (REPO / "scripts" / "clean.py").read_text()
    commands = _section("The two commands")
    for output, described in (('REPO / "build"', "`build/`"), ('REPO / "dist"', "`dist/`"),
                              ('"*.egg-info"', "`*.egg-info`"), ('"_prebuilt"', "`op_builder/_prebuilt/`")):
        assert output in clean and described in commands, described
    assert "--all-cache" in commands and "never other files" in commands


def _env_vars_read(source: str) -> set[str]:
    """Environment variables a module reads: env.get("X"), os.environ.get("X"), env["X"],
    SOMETHING_ENV = "X", and `for var in ("X", "Y"): ... env.get(var)`."""
    def is_env(node) -> bool:
        return (isinstance(node, ast.Name) and node.id in ("env", "environ")) or \
            (isinstance(node, ast.Attribute) and node.attr == "environ")

    def env_get(node):
        """The argument of an env.get(...) call, else None."""
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get" \
                and is_env(node.func.value) and node.args:
            return node.args[0]
        return None

    found = set()
    for node in ast.walk(ast.parse(source)):
        key = env_get(node)
        if key is None and isinstance(node, ast.Subscript) and is_env(node.value):
            key = node.slice
        if key is None and isinstance(node, ast.Assign) and len(node.targets) == 1 \
                and isinstance(node.targets[0], ast.Name) and node.targets[0].id.endswith("_ENV"):
            key = node.value
        if isinstance(key, ast.Constant) and isinstance(key.value, str):
            found.add(key.value)
        if isinstance(node, ast.For) and isinstance(node.iter, ast.Tuple) and isinstance(node.target, ast.Name):
            reads = any(isinstance(env_get(n), ast.Name) and env_get(n).id == node.target.id
                        for n in ast.walk(node))
            if reads:
                found |= {e.value for e in node.iter.elts if isinstance(e, ast.Constant)}
    return found


def test_every_environment_variable_the_builder_reads_is_documented():
    read = set().union(*(_env_vars_read(p.read_text()) for p in (REPO / "op_builder").rglob("*.py")))
    assert {"APEX_CACHE_DIR", "APEX_JIT_VERBOSE", "CUDA_HOME", "CUDA_PATH", "CXX"} <= read  # the scan works
    documented = _section("How ops are built")
    missing = sorted(name for name in read if not re.search(rf"`\$?{name}[`=/]", documented))
    assert not missing, f"README.md ('How ops are built') does not mention {missing}"
