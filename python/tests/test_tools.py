"""stage(), synth(), pack() and verify() from Python: the same files as the command line writes, the same
checks, errors as ringtrain.Error naming the file."""

import errno
import filecmp
import os
import shutil
from pathlib import Path

import pytest

import ringtrain
from rtcheck import SHARD, flip_byte


def files_of(path):
    return sorted(p.name for p in Path(path).iterdir())


def same_tree(a, b):
    """Byte for byte, every file of a (one level or two) in b and nothing else."""
    a, b = Path(a), Path(b)
    names = sorted(str(p.relative_to(a)) for p in a.rglob("*") if p.is_file())
    assert names == sorted(str(p.relative_to(b)) for p in b.rglob("*") if p.is_file()), (a, b)
    _, mismatch, errors = filecmp.cmpfiles(a, b, names, shallow=False)
    assert not mismatch and not errors, f"files differ between {a} and {b}: {mismatch + errors}"


def snapshot(path):
    return {p.name: (p.stat().st_ino, p.stat().st_mtime_ns, p.stat().st_size) for p in Path(path).iterdir()}


def test_stage_copies_once_and_the_copy_verifies(data, tmp_path):
    node = tmp_path / "node"
    staged = ringtrain.stage(data, to=str(node))
    assert isinstance(staged, str) and Path(staged).is_absolute()
    assert Path(staged).parent == node / f"ringtrain-{os.getuid()}", staged
    assert os.path.realpath(staged) != os.path.realpath(data)
    same_tree(data, staged)
    assert ringtrain.verify(staged) is None
    before = snapshot(staged)

    again = ringtrain.stage(data, to=str(node))
    assert again == staged
    assert snapshot(staged) == before, "the second stage() wrote files again"

    # a staged file that no longer matches is copied again
    flip_byte(Path(staged) / SHARD["train"], 40000)
    assert ringtrain.stage(data, to=str(node)) == staged
    same_tree(data, staged)


def test_stage_with_to_none_uses_tmpdir(data, tmp_path, monkeypatch):
    monkeypatch.delenv("SLURM_TMPDIR", raising=False)
    (tmp_path / "tmpdir").mkdir()
    monkeypatch.setenv("TMPDIR", str(tmp_path / "tmpdir"))
    staged = ringtrain.stage(data)
    assert Path(staged).parent == tmp_path / "tmpdir" / f"ringtrain-{os.getuid()}", staged
    same_tree(data, staged)


def test_stage_of_a_directory_without_a_dataset_is_an_error(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ringtrain.Error) as e:
        ringtrain.stage(str(empty), to=str(tmp_path / "node"))
    assert str(empty) in str(e.value) and e.value.errno > 0


def test_synth_pack_verify_round_trip_equals_the_command_line(tmp_path, cli):
    src = ringtrain.synth(str(tmp_path / "src"), kind="cifar10", train=1000, test=200, seed=4)
    assert src == str(tmp_path / "src")
    cli("synth", "--out", tmp_path / "src-cli", "--train", 1000, "--test", 200, "--seed", 4)
    same_tree(src, tmp_path / "src-cli")

    stats = ringtrain.pack(src, str(tmp_path / "packed"), val_split=0.2)
    assert isinstance(stats, dict) and stats
    cli("pack", src, "--out", tmp_path / "packed-cli", "--val-split", 0.2)
    same_tree(tmp_path / "packed", tmp_path / "packed-cli")
    assert files_of(tmp_path / "packed") == ["manifest.json", SHARD["test"], SHARD["train"], SHARD["val"]]
    info = ringtrain.dataset_info(str(tmp_path / "packed"))
    assert {k: info["splits"][k] for k in ("train", "val", "test")} == {"train": 800, "val": 200, "test": 200}
    assert ringtrain.verify(str(tmp_path / "packed")) is None
    ds = ringtrain.Dataset(str(tmp_path / "packed"), "val")
    assert len(ds) == 200

    # an existing dataset is replaced only with force=True
    with pytest.raises(ringtrain.Error) as e:
        ringtrain.pack(src, str(tmp_path / "packed"))
    assert str(tmp_path / "packed") in str(e.value)
    ringtrain.pack(src, str(tmp_path / "packed"), val_split=0.2, force=True)
    same_tree(tmp_path / "packed", tmp_path / "packed-cli")

    other = ringtrain.synth(str(tmp_path / "src5"), train=1000, test=200, seed=5)
    a = (Path(src) / "cifar-10-batches-bin" / "test_batch.bin").read_bytes()
    b = (Path(other) / "cifar-10-batches-bin" / "test_batch.bin").read_bytes()
    assert len(a) == len(b) == 200 * 3073 and a != b, "seeds 4 and 5 wrote the same records"


@pytest.mark.parametrize("how", ["bit-flipped", "truncated", "missing"])
def test_verify_of_a_damaged_copy_raises(data, tmp_path, how):
    bad = tmp_path / "bad"
    shutil.copytree(data, bad)
    shard = bad / SHARD["val"]
    if how == "bit-flipped":
        flip_byte(shard, 40000)
    elif how == "truncated":
        os.truncate(shard, shard.stat().st_size - 1000)
    else:
        shard.unlink()
    with pytest.raises(ringtrain.Error) as e:
        ringtrain.verify(str(bad))
    assert isinstance(e.value, OSError) and e.value.errno == errno.EBADMSG, (e.value.errno, str(e.value))
    assert SHARD["val"] in str(e.value), str(e.value)
    assert SHARD["train"] not in str(e.value) and SHARD["test"] not in str(e.value), \
        f"verify blames a shard that is fine: {e.value}"
