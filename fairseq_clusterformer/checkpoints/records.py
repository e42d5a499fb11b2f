"""What a torch checkpoint (a zip of records) holds, read without loading its tensors; and its CRC check.

torch.save writes ``<name>/data.pkl`` (the pickled object, each tensor a reference to a storage record) and one
``<name>/data/<key>`` record per storage. torch.load never checks the records' CRC-32, so a flipped bit in a weight
or an optimizer moment loads silently. ``verify_records`` reads every record and checks it, and names the tensor a
bad record holds; ``tensor_index`` unpickles data.pkl with every storage replaced by its record name (nothing else
is read), which also gives a checkpoint's model keys cheaply.
"""

from __future__ import annotations

import _compat_pickle
import pickle
import zipfile
from argparse import Namespace
from collections.abc import Iterator

# CRC-32 is computed while a record streams through this buffer
_CHUNK = 1 << 24


class _Record:
    def __init__(self, key: str) -> None:
        self.key = key


def _first_record(*args):
    """Stands in for torch's ``_rebuild_*`` functions: a tensor becomes the record of its storage."""
    for arg in args:
        if isinstance(arg, _Record):
            return arg
        if isinstance(arg, (tuple, list)):
            found = _first_record(*arg)
            if found is not None:
                return found
    return None


def _allowed_globals() -> dict | None:
    """What ``torch.load(weights_only=True)`` may unpickle: torch's list plus ``add_safe_globals`` (the plug-in adds
    argparse.Namespace); None for a torch without that list, whose torch.load trusts every global."""
    try:
        from torch import _weights_only_unpickler as safe

        return {**safe._get_allowed_globals(), **safe._get_user_allowed_globals()}
    except (ImportError, AttributeError):
        return None


class _IndexUnpickler(pickle.Unpickler):
    """Unpickles data.pkl as torch's safe loader would, tensors aside: no global outside torch's allow-list is
    imported, so a hostile file runs no code here."""

    def persistent_load(self, saved_id):
        # ('storage', storage type, key, location, numel): the key names the record data/<key>
        return _Record(str(saved_id[2]))

    def find_class(self, module, name):
        # torch.save pickles with protocol 2, which spells some Python 3 names the Python 2 way (__builtin__.set)
        if (module, name) in _compat_pickle.NAME_MAPPING:
            module, name = _compat_pickle.NAME_MAPPING[(module, name)]
        elif module in _compat_pickle.IMPORT_MAPPING:
            module = _compat_pickle.IMPORT_MAPPING[module]
        full = f"{module}.{name}"
        if full.startswith("torch._utils._rebuild") or full == "torch._tensor._rebuild_from_type_v2":
            return _first_record
        allowed = _allowed_globals()
        if allowed is None:
            return super().find_class(module, name)
        if full not in allowed:
            raise pickle.UnpicklingError(f"{full} is not among the globals torch.load's weights_only mode accepts")
        return allowed[full]


def _pickle_member(archive: zipfile.ZipFile) -> str:
    names = [name for name in archive.namelist() if name.endswith("/data.pkl") or name == "data.pkl"]
    if not names:
        raise ValueError("no data.pkl record: not a torch checkpoint")
    return names[0]


def tensor_index(path: str):
    """The checkpoint's object with every tensor replaced by a ``_Record`` (its storage's key)."""
    with zipfile.ZipFile(path) as archive, archive.open(_pickle_member(archive)) as handle:
        return _IndexUnpickler(handle).load()


def _walk(obj, where: str) -> Iterator[tuple[str, _Record]]:
    if isinstance(obj, _Record):
        yield where, obj
        return
    if isinstance(obj, Namespace):
        obj = vars(obj)
    if isinstance(obj, dict):
        items = obj.items()
    elif isinstance(obj, (list, tuple)):
        items = enumerate(obj)
    else:
        return
    for key, value in items:
        yield from _walk(value, f"{where}.{key}" if where else str(key))


def tensor_names(index) -> dict[str, str]:
    """Storage key -> where the first tensor on it sits in the checkpoint (``model.decoder.layers.0.fc1.weight``,
    ``last_optimizer_state.state.3.exp_avg``)."""
    names: dict[str, str] = {}
    for where, record in _walk(index, ""):
        names.setdefault(record.key, where)
    return names


def model_keys(index) -> set[str]:
    model = index.get("model") if isinstance(index, dict) else None
    return set(model) if isinstance(model, dict) else set()


def _bad_record(archive: zipfile.ZipFile) -> tuple[str, str] | None:
    for info in archive.infolist():
        try:
            with archive.open(info) as member:
                while member.read(_CHUNK):  # ZipExtFile compares the CRC-32 when the record ends
                    pass
        except (zipfile.BadZipFile, OSError, EOFError) as error:
            return info.filename, str(error)
    return None


def verify_records(path: str, flag: str) -> None:
    """Read every record of the zip checkpoint ``path`` and check its CRC-32; ValueError naming ``flag``, the file,
    the bad record and, when data.pkl itself is intact, the tensor it holds."""
    with zipfile.ZipFile(path) as archive:
        bad = _bad_record(archive)
    if bad is None:
        return
    record, error = bad
    what = "the pickled index of the checkpoint" if record.endswith("data.pkl") else "an unnamed record"
    if "/data/" in record:
        try:
            holder = tensor_names(tensor_index(path)).get(record.rsplit("/", 1)[1])
        except Exception:  # data.pkl was readable for the CRC check, but may not unpickle: keep the record's name
            holder = None
        what = f"tensor {holder}" if holder else "a tensor"
    raise ValueError(
        f"{flag} {path} is corrupted: record {record} ({what}) fails its check ({error}), a bit flipped on disk or "
        "in a copy; loading it would train or evaluate on wrong numbers. Use another checkpoint of the run"
    )
