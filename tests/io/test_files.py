"""Tests of pyro_bbb.io.files: the atomic write and the safe, checked read."""

from __future__ import annotations

import pytest
import torch

from pyro_bbb.io.files import CHECKPOINT, MODEL, read_file, write_atomic


def test_a_file_round_trips_with_its_kind_and_version(tmp_path):
    write_atomic(tmp_path / "m.pt", MODEL, {"sites": {}, "params": {"a": torch.ones(2)},
                                            "buffers": {}, "inputs": {}})  # fmt: skip
    payload = read_file(tmp_path / "m.pt", argument="path")
    assert payload["pyro_bbb"] == "model" and payload["version"] == 1
    assert torch.equal(payload["params"]["a"], torch.ones(2))


def test_a_write_that_fails_midway_leaves_the_old_file_and_no_temporary(tmp_path, monkeypatch):
    write_atomic(tmp_path / "f.pt", MODEL, {"old": True})
    before = (tmp_path / "f.pt").read_bytes()

    def failing(obj, file):
        file.write(b"PK\x03\x04 partial")
        raise OSError("disk full")

    monkeypatch.setattr("pyro_bbb.io.files.torch.save", failing)
    with pytest.raises(OSError, match="disk full"):
        write_atomic(tmp_path / "f.pt", MODEL, {"old": False})
    assert (tmp_path / "f.pt").read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["f.pt"]


def test_writing_into_a_missing_folder_is_an_error(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"folder .*missing.* does not exist"):
        write_atomic(tmp_path / "missing" / "f.pt", MODEL, {})


def test_a_checkpoint_is_asked_for_and_a_saved_model_is_refused(tmp_path):
    write_atomic(tmp_path / "m.pt", MODEL, {"sites": {}, "params": {}, "buffers": {},
                                            "inputs": {}})  # fmt: skip
    with pytest.raises(ValueError, match=r"resume=.* holds a saved model"):
        read_file(tmp_path / "m.pt", argument="resume", kind=CHECKPOINT)


def test_a_newer_layout_asks_for_an_upgrade(tmp_path):
    torch.save({"pyro_bbb": "model", "version": 99}, tmp_path / "new.pt")
    with pytest.raises(ValueError, match=r"layout version 99; .* upgrade pyro_bbb"):
        read_file(tmp_path / "new.pt", argument="path")


def test_a_file_missing_its_contents_is_damaged(tmp_path):
    torch.save({"pyro_bbb": "model", "version": 1, "sites": {}}, tmp_path / "bad.pt")
    with pytest.raises(ValueError, match=r"is damaged: it lacks \['buffers', 'inputs'"):
        read_file(tmp_path / "bad.pt", argument="path")


def test_a_pickle_that_would_run_code_is_refused_unread(tmp_path):
    class Sneaky:
        def __reduce__(self):
            return (print, ("this must not run",))

    torch.save({"pyro_bbb": "model", "payload": Sneaky()}, tmp_path / "evil.pt")
    with pytest.raises(ValueError, match=r"cannot be read"):
        read_file(tmp_path / "evil.pt", argument="path")
