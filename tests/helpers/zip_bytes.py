"""Damage a checkpoint on disk the way a bad disk or an interrupted copy would (integrity tests)."""

from __future__ import annotations

import struct
import zipfile
from pathlib import Path
from typing import Callable


def flip_entry_bytes(path: Path, pick: Callable[[zipfile.ZipFile, zipfile.ZipInfo], bool], n: int = 400) -> str:
    """Invert ``n`` bytes in the middle of the first zip entry ``pick`` accepts (torch stores tensor
    blobs uncompressed, so the bytes are the tensor's); returns the entry's name."""
    with zipfile.ZipFile(path) as z:
        info = next(i for i in z.infolist() if pick(z, i))
    data = bytearray(Path(path).read_bytes())
    h = info.header_offset
    name_len, extra_len = struct.unpack("<HH", data[h + 26:h + 30])
    start = h + 30 + name_len + extra_len + max(0, info.file_size // 2 - n // 2)
    for i in range(start, start + min(n, info.file_size)):
        data[i] ^= 0xFF
    Path(path).write_bytes(bytes(data))
    return info.filename
