"""`radixmesh profile`'s flags: refused before anything runs, in one line naming the flag;
a --pid that names no process is said so (not py-spy's backtrace)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from mesh.cli import main


def profile(tmp_path, *flags: str) -> int:
    return main(["profile", "--service", "x", "--out", str(tmp_path / "out"), *flags])


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--pid", "1", "--seconds", "0"], "--seconds: must be in [0.05, 600], got 0.0"),
        (["--pid", "1", "--rate", "0"], "--rate: must be in [1, 2000] Hz, got 0"),
        (["--pid", "-5"], "--pid: must be a process id > 0, got -5"),
        (["--pid", "0"], "--pid: must be a process id > 0, got 0"),
        (
            ["--metrics-url", "notaurl"],
            "--metrics-url: expected a URL such as http://127.0.0.1:9100, got 'notaurl'",
        ),
    ],
)
def test_bad_flags_exit_2_in_one_line_naming_the_flag(tmp_path, capsys, flags, message):
    assert profile(tmp_path, *flags) == 2
    assert capsys.readouterr().err == f"radixmesh profile: {message}\n"
    assert not (tmp_path / "out").exists()


def test_a_pid_that_names_no_process_exits_1_saying_so(tmp_path, capsys):
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()  # reaped: its pid names no process now
    assert profile(tmp_path, "--pid", str(child.pid), "--seconds", "1") == 1
    assert capsys.readouterr().err == f"radixmesh profile: no such process {child.pid}\n"
    assert not (tmp_path / "out").exists()
