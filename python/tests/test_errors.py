"""A damaged shard is a ringtrain.Error naming it, from the Loader, the Dataset and verify(); the process
goes on (each case runs in a child process that must answer and exit 0, so a crash cannot pass)."""

import errno
import os
import shutil

import pytest

import ringtrain
from rtcheck import SHARD, error_info, flip_byte


def damaged_copy(data, tmp_path, how):
    bad = tmp_path / "bad"
    shutil.copytree(data, bad)
    shard = bad / SHARD["train"]
    if how == "truncated":
        os.truncate(shard, shard.stat().st_size - 1000)
    elif how == "truncated-to-header":
        os.truncate(shard, 200)
    elif how == "bit-flipped":
        flip_byte(shard, 40000)  # inside the first block's pixels
    else:
        raise AssertionError(how)
    return str(bad)


def through_loader(path):
    try:
        loader = ringtrain.Loader(path, 64, workers=2)
        n = sum(1 for _ in loader)
        return {"batches": n}
    except ringtrain.Error as e:
        return error_info(e)


def through_dataset(path):
    try:
        ds = ringtrain.Dataset(path, "train")
        for i in range(len(ds)):
            ds[i]
        return {"records": len(ds)}
    except ringtrain.Error as e:
        return error_info(e)


def through_verify(path):
    try:
        return {"verify": ringtrain.verify(path)}
    except ringtrain.Error as e:
        return error_info(e)


@pytest.mark.parametrize("how", ["truncated", "truncated-to-header", "bit-flipped"])
@pytest.mark.parametrize("reader", [through_loader, through_dataset, through_verify])
def test_damaged_shard_raises_error_naming_it(data, tmp_path, forked, how, reader):
    path = damaged_copy(data, tmp_path, how)
    res = forked(reader, path, timeout=60)
    assert "errno" in res, f"{reader.__name__} read a {how} shard without an error: {res}"
    assert res["type"] == "Error" and res["oserror"], res
    assert res["errno"] and res["errno"] > 0, res
    assert SHARD["train"] in res["str"], f"the message does not name {SHARD['train']}: {res['str']!r}"
    assert res["strerror"] and SHARD["train"] in res["strerror"], res
    if how == "bit-flipped" and reader is not through_verify:
        assert res["errno"] == errno.EBADMSG, f"errno {res['errno']} for a checksum mismatch: {res['str']}"


def test_the_process_goes_on_after_the_error(data, tmp_path):
    """In this very process: the error is an exception to catch, and a good dataset loads right after."""
    path = damaged_copy(data, tmp_path, "bit-flipped")
    with pytest.raises(ringtrain.Error) as e:
        with ringtrain.Loader(path, 64, workers=2) as loader:
            for _ in loader:
                pass
    assert isinstance(e.value, OSError) and SHARD["train"] in str(e.value)
    with ringtrain.Loader(data, 64, workers=2) as loader:
        assert sum(1 for _ in loader) == len(loader)


def test_missing_dataset_is_an_error_naming_the_path(tmp_path):
    where = tmp_path / "nothing-here"
    with pytest.raises(ringtrain.Error) as e:
        ringtrain.Loader(str(where), 64)
    assert str(where) in str(e.value) and e.value.errno > 0
    with pytest.raises(ringtrain.Error) as e:
        ringtrain.Dataset(str(where))
    assert str(where) in str(e.value)
