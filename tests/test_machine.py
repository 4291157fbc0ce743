"""The memory a process may use: physical memory, or its control groups' limit."""

from __future__ import annotations

import os

from lamina import machine
from lamina.query import core


def _tree(root, files: dict[str, str]) -> None:
    for rel, text in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)


def test_cgroup_v2_the_smallest_limit_of_the_group_and_its_parents(tmp_path):
    root = tmp_path / "cg"
    _tree(
        root,
        {
            "memory.max": "max\n",  # the root: no limit
            "slurm/memory.max": "8589934592\n",  # the job: 8 GiB
            "slurm/job_7/step_0/memory.max": "max\n",  # the step inherits it
        },
    )
    proc = tmp_path / "cgroup"
    proc.write_text("0::/slurm/job_7/step_0\n")
    assert machine.cgroup_limit(str(root), str(proc)) == 8 << 30


def test_cgroup_v1_memory_controller_and_a_container_seeing_its_group_as_root(tmp_path):
    root = tmp_path / "cg"
    # the path /proc/self/cgroup names is the host's: inside a container only the mount's
    # root holds the group's files
    _tree(root, {"memory/memory.limit_in_bytes": "2147483648\n"})
    proc = tmp_path / "cgroup"
    proc.write_text("5:cpu,cpuacct:/\n4:memory:/docker/abc123\n0::/\n")
    assert machine.cgroup_limit(str(root), str(proc)) == 2 << 30


def test_no_limit_set_or_readable(tmp_path):
    root = tmp_path / "cg"
    _tree(root, {"memory/memory.limit_in_bytes": "9223372036854771712\n", "memory.max": "max"})
    proc = tmp_path / "cgroup"
    proc.write_text("4:memory:/\n0::/\n")
    assert machine.cgroup_limit(str(root), str(proc)) is None  # v1's "none", v2's "max"
    assert machine.cgroup_limit(str(root), str(tmp_path / "absent")) is None
    assert machine.cgroup_limit(str(tmp_path / "absent"), str(proc)) is None
    _tree(root, {"memory.max": "garbage"})
    assert machine.cgroup_limit(str(root), str(proc)) is None


def test_usable_memory_is_at_most_physical_memory():
    phys = machine.physical_memory()
    got = machine.usable_memory()
    assert phys is None or (got is not None and 0 < got <= phys)


def test_a_querys_answer_limit_follows_the_jobs_limit(monkeypatch):
    """A job given 2 GiB of a large node: an answer is refused past 1 GiB, not past half the
    node (where the kernel would have ended the job first)."""
    monkeypatch.setattr(machine, "physical_memory", lambda: 512 << 30)
    monkeypatch.setattr(machine, "cgroup_limit", lambda *a: 2 << 30)
    assert core.answer_limit() == 1 << 30
    monkeypatch.setattr(machine, "cgroup_limit", lambda *a: None)
    assert core.answer_limit() == 256 << 30
    monkeypatch.setattr(machine, "physical_memory", lambda: None)
    assert core.answer_limit() == 1 << 40  # neither can be asked


def test_the_path_of_a_group_cannot_climb_out_of_the_mount(tmp_path):
    root = tmp_path / "cg"
    _tree(root, {"memory.max": "4096\n"})
    (tmp_path / "memory.max").write_text("1\n")  # outside the mount: never read
    proc = tmp_path / "cgroup"
    proc.write_text("0::/../..\n")
    assert machine.cgroup_limit(str(root), str(proc)) == 4096
    assert os.path.exists(tmp_path / "memory.max")


def test_a_group_outside_the_namespace_reads_only_the_mount_root(tmp_path):
    """``0::/../sib``: the process's group lies outside the namespace's root, so no group of
    its own is visible; "sib" under the root is another group, whose limit is not read."""
    root = tmp_path / "cg"
    _tree(root, {"memory.max": "4096\n", "sib/memory.max": "1024\n"})
    proc = tmp_path / "cgroup"
    proc.write_text("0::/../sib\n")
    assert machine.cgroup_limit(str(root), str(proc)) == 4096


def test_a_path_with_a_nul_byte_reads_nothing(tmp_path):
    proc = tmp_path / "cgroup"
    proc.write_text("0::/a\x00b\n")
    assert machine.cgroup_limit(str(tmp_path / "cg"), str(proc)) is None
