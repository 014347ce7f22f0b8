"""A saved model as the tensors it does not share with its base model, and back, byte for byte.

The whole-model components (the distilled draft, BiLD's small models) are truncated copies of the
target that train their layers and final norm only: their ``model.safetensors`` repeats the
target's embedding (28 M of the draft's 42 M parameters in the embedded profile) bit for bit. To
keep such a model in git, :func:`split` writes the tensors that differ from the base's (or that the
base lacks) into a small safetensors file and a manifest holding the original file's header and
digests; :func:`join` rebuilds the original file from that and the base model's file. The rebuilt
file is byte-identical (its SHA-256 is checked), so a record's ``components`` digest
(:func:`common.records.content_digest`, which hashes the file's bytes) is the same for the
restored copy as for the model it was kept from.

A delta larger than ``part_bytes`` is kept as numbered parts (``model.safetensors.delta.part00``,
...), each with its size and SHA-256 in the manifest, so that no kept file is larger than a part:
the draft's 54 MiB delta would keep as four files of at most 16 MiB, the largest file a device call
brings back (``tools/device``), so a model trained on a lent GPU comes back and is kept the same
way. :func:`join` pastes the parts together (each one checked) before it rebuilds the model.

A safetensors file is an 8-byte little-endian header length, a JSON header naming each tensor's
dtype, shape and ``data_offsets`` (relative to the end of the header), and the data; only byte
ranges are copied here, so no dtype needs to be understood and nothing loads into torch.
"""
from __future__ import annotations

import hashlib
import json
import os
import struct
from pathlib import Path

from .errors import UserError
from .paths import file_sha256, load_or_error, short_reason

FORMAT = 1
# what to do about a damaged kept file: the kept folders are committed, the converted ones rebuilt
FIX = "restore it from git, or rebuild it (rule prepare or a retraining)"
MODEL_FILE = "model.safetensors"  # what save_pretrained writes, and the decoders load
DELTA = MODEL_FILE + ".delta"      # a kept model folder's weights, less what the base model holds
PART = ".part"                     # DELTA + PART + "00", ...: a delta kept in pieces (the manifest's "parts")


def layout(path: Path) -> tuple[bytes, dict[str, dict], int]:
    """The raw header, its tensors (``name -> {"dtype", "shape", "data_offsets"}``, the
    ``__metadata__`` entry left out) and the file offset where the data starts."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"{path} does not exist; {FIX}")
    size = path.stat().st_size
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise UserError(f"{path} is not a safetensors file (shorter than its header length); {FIX}")
        (n,) = struct.unpack("<Q", head)
        if n > size - 8:  # checked before reading: garbage bytes can claim an exabyte of header
            raise UserError(f"{path} is truncated or no safetensors file: its header claims {n} bytes, the file "
                            f"holds {size - 8}; {FIX}")
        raw = f.read(n)
    try:
        header = json.loads(raw)
        if not isinstance(header, dict):
            raise ValueError(f"its top level is a {type(header).__name__}, not an object")
    except ValueError as e:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise UserError(f"{path}: its header is no safetensors header ({short_reason(e)}); {FIX}") from None
    tensors = {k: v for k, v in header.items() if k != "__metadata__"}
    return raw, tensors, 8 + n


def _read(f, start: int, info: dict) -> bytes:
    a, b = info["data_offsets"]
    f.seek(start + a)
    data = f.read(b - a)
    if len(data) != b - a:
        raise UserError(f"{f.name} is truncated (a tensor's bytes end past the file)")
    return data


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _write_safetensors(path: Path, tensors: dict[str, tuple[dict, bytes]]) -> None:
    """``name -> (info, bytes)`` as a plain safetensors file (offsets recomputed, names sorted)."""
    header, blobs, at = {}, [], 0
    for name in sorted(tensors):
        info, data = tensors[name]
        header[name] = {"dtype": info["dtype"], "shape": info["shape"], "data_offsets": [at, at + len(data)]}
        blobs.append(data)
        at += len(data)
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)  # the data starts 8-byte aligned, as safetensors writes it
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(raw)) + raw)
        for data in blobs:
            f.write(data)


def split(model_file: Path, base_file: Path, delta_file: Path, base_name: str, extra: dict | None = None,
          part_bytes: int | None = None) -> dict:
    """Write ``delta_file`` (the tensors of ``model_file`` whose bytes differ from the same-named
    tensor of ``base_file``, or that it lacks) and ``<delta_file>.json`` (the manifest: the original
    header, the file's SHA-256 and size, and the SHA-256 of each tensor taken from the base);
    returns the manifest (with ``extra``'s entries added). A delta over ``part_bytes`` is written
    as :func:`cut`'s parts instead of one file. Every file is written under a temporary name and
    renamed when complete, the manifest last."""
    model_file, base_file, delta_file = Path(model_file), Path(base_file), Path(delta_file)
    raw, tensors, start = layout(model_file)
    _, base_tensors, base_start = layout(base_file)
    own, shared = {}, {}
    with open(model_file, "rb") as f, open(base_file, "rb") as g:
        for name, info in tensors.items():
            data = _read(f, start, info)
            b = base_tensors.get(name)
            if (b is not None and b["dtype"] == info["dtype"] and b["shape"] == info["shape"]
                    and _read(g, base_start, b) == data):
                shared[name] = _sha(data)
            else:
                own[name] = (info, data)
    manifest = {"format": FORMAT, "file": model_file.name, "sha256": file_sha256(model_file),
                "bytes": model_file.stat().st_size, "header": raw.decode(), "base": base_name,
                "from_base": dict(sorted(shared.items())), **(extra or {})}
    delta_file.parent.mkdir(parents=True, exist_ok=True)
    tmp = delta_file.with_name(delta_file.name + ".partial")
    _write_safetensors(tmp, own)
    if part_bytes is not None and tmp.stat().st_size > part_bytes:
        manifest["delta"] = {"bytes": tmp.stat().st_size, "sha256": file_sha256(tmp)}
        manifest["parts"] = cut(tmp, delta_file, part_bytes)
        tmp.unlink()
        delta_file.unlink(missing_ok=True)  # an earlier keep's whole delta
    else:
        os.replace(tmp, delta_file)
        for old in parts_of(delta_file):  # an earlier keep's parts
            old.unlink()
    man = manifest_path(delta_file)
    man.with_name(man.name + ".partial").write_text(json.dumps(manifest, indent=1) + "\n")
    os.replace(man.with_name(man.name + ".partial"), man)
    return manifest


def read_manifest(man_file: Path) -> dict:
    """A kept model's manifest (:func:`split` wrote it); a damaged one (not JSON, another top
    level, or a ``header`` that is no JSON object) is one UserError naming it and :data:`FIX`."""
    def load(p: Path) -> dict:
        manifest = json.loads(p.read_text(encoding="utf-8"))
        if not isinstance(manifest, dict) or not isinstance(json.loads(manifest.get("header", "")), dict):
            raise ValueError("no manifest written by keep (its header is no JSON object)")
        return manifest
    return load_or_error(man_file, load, "kept-model manifest", FIX)


def manifest_path(delta_file: Path) -> Path:
    return Path(delta_file).with_name(Path(delta_file).name + ".json")


def parts_of(delta_file: Path) -> list[Path]:
    """The part files beside ``delta_file`` (``<delta>.part00``, ...), in order."""
    delta_file = Path(delta_file)
    return sorted(delta_file.parent.glob(delta_file.name + PART + "[0-9]*"))


def cut(whole: Path, delta_file: Path, part_bytes: int) -> list[dict]:
    """Copy ``whole`` into parts of at most ``part_bytes`` bytes named after ``delta_file``
    (``<delta>.part00``, ...; parts of an earlier cut removed first); returns each part's
    ``{"file", "bytes", "sha256"}`` in order, as the manifest keeps them."""
    if part_bytes < 1:
        raise UserError(f"a part of {part_bytes} bytes cannot hold anything; valid: a positive size")
    delta_file = Path(delta_file)
    for old in parts_of(delta_file):
        old.unlink()
    parts = []
    with open(whole, "rb") as f:
        while data := f.read(part_bytes):
            path = delta_file.with_name(f"{delta_file.name}{PART}{len(parts):02d}")
            tmp = path.with_name(path.name + ".partial")
            tmp.write_bytes(data)
            os.replace(tmp, path)
            parts.append({"file": path.name, "bytes": len(data), "sha256": _sha(data)})
    return parts


def _paste(delta_file: Path, manifest: dict, out: Path) -> None:
    """Write the delta the manifest's ``parts`` hold (beside ``delta_file``) at ``out``; one
    ``UserError`` naming the first missing, truncated or altered part, or a whole that differs."""
    with open(out, "wb") as f:
        for part in manifest["parts"]:
            path = Path(delta_file).with_name(part["file"])
            if not path.is_file():
                raise UserError(f"{path} is missing: {delta_file.name} is kept in {len(manifest['parts'])} parts; "
                                f"valid: every part the manifest lists, beside it")
            data = path.read_bytes()
            if len(data) != part["bytes"] or _sha(data) != part["sha256"]:
                what = "altered (its SHA-256 differs)" if len(data) == part["bytes"] else f"truncated ({len(data)} of {part['bytes']} bytes)"
                raise UserError(f"{path} is {what}; valid: the part as keep wrote it")
            f.write(data)
    if out.stat().st_size != manifest["delta"]["bytes"] or file_sha256(out) != manifest["delta"]["sha256"]:
        raise UserError(f"the parts of {delta_file.name} do not make up the delta that was kept (SHA-256 mismatch); "
                        f"valid: the parts and manifest kept together")


def join(delta_file: Path, base_file: Path, out_file: Path) -> None:
    """Rebuild the file :func:`split` kept, at ``out_file``, from ``delta_file`` (or its parts), its
    manifest and ``base_file``; one ``UserError`` if the base's tensors are not the ones the model shared (another
    conversion or model) or the result's SHA-256 is not the original's. Nothing is left at
    ``out_file`` unless the rebuilt file is exact."""
    delta_file, base_file, out_file = Path(delta_file), Path(base_file), Path(out_file)
    man_file = manifest_path(delta_file)
    if not man_file.is_file():
        raise UserError(f"{man_file} is missing; valid: the manifest written beside {delta_file.name} by keep")
    manifest = read_manifest(man_file)
    if manifest.get("format") != FORMAT:
        raise UserError(f"{man_file}: format {manifest.get('format')!r} is unknown; valid: {FORMAT}")
    if "parts" in manifest:  # pasted beside the output (the kept folder may be read-only), removed after
        pasted = out_file.with_name(out_file.name + ".delta.partial")
        out_file.parent.mkdir(parents=True, exist_ok=True)
        try:
            _paste(delta_file, manifest, pasted)
            return _join(pasted, manifest, base_file, out_file)
        finally:
            pasted.unlink(missing_ok=True)
    return _join(delta_file, manifest, base_file, out_file)


def _join(delta_file: Path, manifest: dict, base_file: Path, out_file: Path) -> None:
    """:func:`join` of a delta in one file."""
    raw = manifest["header"].encode()
    tensors = {k: v for k, v in json.loads(raw).items() if k != "__metadata__"}  # checked by read_manifest
    _, own, own_start = layout(delta_file)
    _, base_tensors, base_start = layout(base_file)
    tmp = out_file.with_name(out_file.name + ".partial")
    out_file.parent.mkdir(parents=True, exist_ok=True)
    try:
        with open(delta_file, "rb") as d, open(base_file, "rb") as g, open(tmp, "wb") as f:
            f.write(struct.pack("<Q", len(raw)) + raw)
            start = 8 + len(raw)
            for name, info in sorted(tensors.items(), key=lambda kv: kv[1]["data_offsets"][0]):
                if name in manifest["from_base"]:
                    b = base_tensors.get(name)
                    data = _read(g, base_start, b) if b is not None else b""
                    if _sha(data) != manifest["from_base"][name]:
                        raise UserError(f"{base_file} does not hold the tensor {name} that {manifest['file']} shared with "
                                        f"{manifest['base']}; valid: the base model it was kept against (convert it afresh)")
                elif name in own:
                    data = _read(d, own_start, own[name])
                else:
                    raise UserError(f"{delta_file} lacks the tensor {name}; valid: a delta written by keep with its manifest")
                f.seek(start + info["data_offsets"][0])
                f.write(data)
        if tmp.stat().st_size != manifest["bytes"] or file_sha256(tmp) != manifest["sha256"]:
            raise UserError(f"{out_file.name} rebuilt from {delta_file} differs from the file that was kept "
                            f"(SHA-256 mismatch); valid: a delta and manifest kept together")
        os.replace(tmp, out_file)
    finally:
        tmp.unlink(missing_ok=True)


def kept_digest(path: Path) -> str:
    """What a record names for a component copy at ``path`` (:func:`common.records.content_digest`):
    a folder that holds a kept delta (:data:`DELTA` and its manifest) counts as the
    folder it was kept from, whose digest the manifest recorded; anything else is digested as is."""
    from .records import content_digest
    man = manifest_path(Path(path) / DELTA)
    if Path(path).is_dir() and man.is_file():
        digest = read_manifest(man).get("folder_digest")
        if digest:
            return digest
    return content_digest(path)
