"""The core install is what executors need: with the ``ui`` extra's packages made
unimportable, ackstream and everything a Spark executor runs still import, ``ackstream
--help`` works, and the commands that need the view say in one line what to install."""

import os
import subprocess
import sys
import textwrap

from ackstream.cli.exits import UI_EXTRA_MODULES

#: The ``ui`` extra's packages, as pyproject.toml lists them.
BLOCKED = (*UI_EXTRA_MODULES, "rich")

#: What an executor imports (and the demo, which needs the core install only).
EXECUTOR_SIDE = (
    "ackstream",
    "ackstream.sources",
    "ackstream.topology",
    "ackstream.sinks",
    "ackstream.channels",
    "ackstream.acker",
    "ackstream.ui.status",
    "ackstream.ui.status_sources",
    "ackstream.ui.metrics",
    "ackstream.testing",
    "ackstream.demo",
)

#: Run first in the child: a meta-path finder refusing the blocked packages.
BLOCKER = textwrap.dedent(
    f"""
    import sys

    class Blocked:
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in {BLOCKED!r}:
                raise ImportError(f"{{name}} is blocked: not in the core install")
            return None

    sys.meta_path.insert(0, Blocked())
    """
)


def _child(code: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", BLOCKER + textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
        check=False,
    )


def test_executor_side_modules_import_without_the_ui_extra():
    done = _child(
        f"""
        import importlib, pkgutil

        for name in {EXECUTOR_SIDE!r}:
            module = importlib.import_module(name)
            if name == "ackstream":  # the package itself, not its view nor its CLI
                continue
            for sub in pkgutil.walk_packages(getattr(module, "__path__", []), name + "."):
                importlib.import_module(sub.name)
        loaded = sorted(m for m in sys.modules if m.split(".")[0] in {BLOCKED!r})
        print("loaded:", loaded)
        try:
            import starlette
        except ImportError:
            print("blocked")
        """
    )
    assert done.returncode == 0, done.stderr
    assert "loaded: []" in done.stdout and "blocked" in done.stdout


def test_help_works_and_the_view_s_commands_name_the_extra(tmp_path):
    (tmp_path / "ch").mkdir()
    (tmp_path / "t.py").write_text("")
    done = _child(
        f"""
        from ackstream.cli import main

        for argv in (["--help"], ["ui", "--help"], ["run", "--help"]):
            try:
                main(argv)
            except SystemExit as ended:
                assert ended.code == 0, (argv, ended.code)
        for argv in (
            ["ui", "--channel", {str(tmp_path / "ch")!r}, "--port", "0"],
            ["run", {str(tmp_path / "t.py")!r}, "--ui", "0"],
        ):
            try:
                main(argv)
            except SystemExit as ended:
                print("exit", ended.code)
        """
    )
    assert done.returncode == 0, done.stderr
    assert "usage: ackstream" in done.stdout
    assert done.stdout.count("exit 3") == 2, done.stdout
    assert done.stderr.splitlines() == [
        "ackstream ui needs the ui extra: pip install 'ackstream[ui]'",
        "ackstream run --ui needs the ui extra: pip install 'ackstream[ui]'",
    ]
