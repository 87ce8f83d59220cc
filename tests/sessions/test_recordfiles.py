"""Recording files: one folder per object, no link followed, and what a full namespace deletes."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from subres.config import ConsolesSpec
from subres.sessions import recordfiles
from subres.sessions.recordfiles import Folder, RecordingFile, Store
from subres.sessions.recordings import QUIET, doomed

VM1 = recordfiles.folder(namespace="default", resource="machines", name="vm1", uid="u-1")
NAME = "20240101T000000Z-0000000a.cast"


@pytest.mark.parametrize(
    ("namespace", "resource", "name", "problem"),
    [
        ("a" * 64, "machines", "vm1", "not a namespace name"),
        ("Default", "machines", "vm1", "not a namespace name"),
        ("default", "machines", "b" * 254, "not an object name"),
        ("default", "machines", "a/b", "not an object name"),
        ("default", "machines", "..", "not an object name"),
        ("default", "../x", "vm1", "not a resource name"),
    ],
)
def test_a_folder_needs_names_that_can_be_folders(
    namespace: str, resource: str, name: str, problem: str
) -> None:
    with pytest.raises(ValueError, match=problem):
        recordfiles.folder(namespace=namespace, resource=resource, name=name, uid="u")


def test_an_odd_uid_or_none_is_a_folder_of_its_own() -> None:
    for uid in ("", "../../x", "a" * 65):
        where = recordfiles.folder(namespace="ns", resource="machines", name="vm", uid=uid)
        assert where.uid == recordfiles.NO_UID


def test_files_are_written_read_and_listed_beneath_the_root_only(tmp_path: Path) -> None:
    store = Store(tmp_path / "rec")
    assert store.append(VM1, NAME, b"header\n") == 7
    assert store.append(VM1, NAME, b"more\n") == 12
    [found] = store.files(VM1)
    assert (found.name, found.size, found.audit) == (NAME, 12, False)
    with store.open(VM1, NAME) as file:
        assert file.read() == b"header\nmore\n"
    assert store.head(VM1, NAME) == b"header\n"
    assert store.scan() == [found]
    store.delete(found)
    assert store.files(VM1) == [] and store.scan() == []


def test_links_in_the_directory_are_never_followed(tmp_path: Path) -> None:
    store = Store(tmp_path / "rec")
    store.append(VM1, NAME, b"x\n")
    secret = tmp_path / "secret.cast"
    secret.write_bytes(b"secret\n")
    folder = tmp_path / "rec" / "default" / "machines" / "vm1" / "u-1"
    (folder / "20240101T000000Z-0000000b.cast").symlink_to(secret)
    other = recordfiles.folder(namespace="other", resource="machines", name="vm1", uid="u-1")
    (tmp_path / "rec" / "other").symlink_to(tmp_path / "rec" / "default")
    # The file link: not listed, not opened, not appended through, not counted.
    assert [f.name for f in store.files(VM1)] == [NAME]
    with pytest.raises(FileNotFoundError):
        store.open(VM1, "20240101T000000Z-0000000b.cast")
    with pytest.raises(FileNotFoundError):
        store.append(VM1, "20240101T000000Z-0000000b.cast", b"appended\n")
    assert secret.read_bytes() == b"secret\n"
    # The namespace link: another namespace's folder is not reached through it.
    assert store.files(other) == []
    with pytest.raises(FileNotFoundError):
        store.open(other, NAME)
    with pytest.raises(FileNotFoundError):
        store.append(other, NAME, b"y\n")
    assert [f.folder for f in store.scan()] == [VM1]


def test_files_of_the_first_layout_are_counted_apart(tmp_path: Path) -> None:
    store = Store(tmp_path / "rec")
    store.append(VM1, NAME, b"x\n")
    old = tmp_path / "rec" / "default" / "vm1"
    old.mkdir()
    (old / NAME).write_bytes(b"old\n")
    assert store.legacy() == 1
    assert [f.folder for f in store.scan()] == [VM1]


def _file(
    namespace: str, index: int, *, size: int, age: float, audit: bool = False
) -> RecordingFile:
    where = Folder(namespace, "machines", "vm", "u")
    name = f"20240101T000000Z-{index:08x}{'.audit' if audit else ''}.cast"
    return RecordingFile(where, name, size, 1_000_000.0 - age)


def test_a_full_namespace_deletes_its_own_oldest_and_never_an_audit_or_another_namespace() -> None:
    spec = ConsolesSpec(max_namespace_bytes=1000)
    files = [
        _file("busy", 1, size=400, age=500, audit=True),
        _file("busy", 2, size=300, age=400),
        _file("busy", 3, size=300, age=300),
        _file("busy", 4, size=300, age=200),
        _file("quiet", 5, size=900, age=900),  # another namespace, full on its own, older
    ]
    gone = doomed(files, spec=spec, now=1_000_000.0, busy=set())
    # busy: 1300 > 900 (low water); its oldest deletable go until it is under; audit stays.
    assert [f.name for f in gone] == [files[1].name, files[2].name]
    assert files[4] not in gone


def test_only_age_deletes_an_audit_and_files_being_written_stay() -> None:
    spec = ConsolesSpec(max_namespace_bytes=1 << 30, max_age=3600)
    old_audit = _file("ns", 1, size=10, age=7200, audit=True)
    young_audit = _file("ns", 2, size=10, age=60, audit=True)
    writing = _file("ns", 3, size=10, age=7200)
    just_written = _file("ns", 4, size=10, age=QUIET / 2)
    files = [old_audit, young_audit, writing, just_written]
    busy = {(writing.folder, writing.name)}
    assert doomed(files, spec=spec, now=1_000_000.0, busy=busy) == [old_audit]


def test_appending_keeps_what_was_there(tmp_path: Path) -> None:
    store = Store(tmp_path / "rec")
    store.append(VM1, NAME, b"a\n")
    path = tmp_path / "rec" / "default" / "machines" / "vm1" / "u-1" / NAME
    os.chmod(path, 0o640)
    store.append(VM1, NAME, b"b\n")
    assert path.read_bytes() == b"a\nb\n"
