"""The launcher that ties a supervised child to its parent's life."""

from __future__ import annotations

import os
import select
import subprocess
import sys

import pytest

from mesh.supervisor import launcher

ORPHAN_PARENT = """
import os, subprocess, sys
launcher = [sys.argv[1], sys.argv[2], str(os.getpid())]
code = "print('up', flush=True); import time; time.sleep(120)"
child = subprocess.Popen(
    [*launcher, sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL
)
child.stdout.readline()  # the command runs: the parent-death signal is armed
print(child.pid, flush=True)
"""  # then exits without stopping its child


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="parent-death signal is Linux's")
def test_a_child_started_through_the_launcher_dies_with_its_parent():
    parent = subprocess.run(
        [sys.executable, "-c", ORPHAN_PARENT, *launcher()[:2]],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    pid = int(parent.stdout)
    try:
        pidfd = os.pidfd_open(pid)
    except ProcessLookupError:
        return  # already gone
    try:  # a pidfd becomes readable when the process exits: no polling
        readable, _, _ = select.select([pidfd], [], [], 20)
    finally:
        os.close(pidfd)
    assert readable, f"child {pid} outlived its parent"


def test_the_launcher_runs_the_command_only_for_its_parent():
    command = [sys.executable, "-c", "print('ran')"]
    result = subprocess.run([*launcher(), *command], capture_output=True, text=True)
    assert (result.returncode, result.stdout) == (0, "ran\n")
    not_mine = [*launcher()[:2], str(os.getpid() + 1), *command]  # another parent: refused
    result = subprocess.run(not_mine, capture_output=True, text=True)
    assert (result.returncode, result.stdout) == (1, "")
