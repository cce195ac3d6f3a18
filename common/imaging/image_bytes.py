"""What the bytes of an encoded image say before Pillow reads them: which format they start
as, how many JPEG scans and PNG chunks they hold (each costs a decode work Pillow does not
bound), the PNG chunks no viewer draws with, and the EXIF orientation, found without a parse."""

from __future__ import annotations

import struct
from collections.abc import Iterator, Sequence

import numpy as np

from common.configuration.config import env_name
from common.limits.errors import PayloadTooLarge

JPEG_START, PNG_SIGNATURE = b"\xff\xd8", b"\x89PNG\r\n\x1a\n"
# A JPEG scan starts at an SOS marker: these two bytes, which entropy-coded data never holds
# (a 0xFF there is followed by 0x00 or a restart marker), and libjpeg reads a marker only there.
JPEG_SCAN = b"\xff\xda"
# The EXIF orientations: 1 as stored, 2-8 flipped or turned.
ORIENTATIONS = range(1, 9)
_ORIENTATION_TAG, _EXIF_SHORT = 0x0112, 3
# The ancillary PNG chunks a viewer draws with (Pillow reads them); of the first two, only the first.
_SINGLE_PNG_CHUNKS = {b"iCCP", b"eXIf"}
_SHOWN_PNG_CHUNKS = _SINGLE_PNG_CHUNKS | {b"tRNS", b"gAMA", b"cHRM", b"sRGB", b"pHYs", b"acTL", b"fcTL", b"fdAT"}


def png_chunks(data: bytes) -> Iterator[tuple[int, int, bytes]]:
    """(start, end, type) of each whole chunk of a PNG, walking their lengths up to IEND or the
    first chunk cut short."""
    position = len(PNG_SIGNATURE)
    while position + 12 <= len(data):
        length, kind = struct.unpack_from(">I4s", data, position)
        end = position + 12 + length
        if end > len(data):
            return
        yield position, end, kind
        if kind == b"IEND":
            return
        position = end


def shown_png_chunks(data: bytes) -> bytes:
    """A PNG without the ancillary chunks no viewer draws with: text (Pillow inflates every
    zTXt and iTXt in ``Image.open``, up to 64 MB an image, and a 1 KB chunk inflates to 1 MB),
    private and unknown chunks (Pillow keeps a copy of the private ones), an iCCP or eXIf after
    the first (libpng ignores those), and an eXIf after the pixels (the orientation is read with
    the header, ``shown_size``). Other bytes as they are; not a PNG: ``data``."""
    if not data.startswith(PNG_SIGNATURE):
        return data
    kept, seen, end, dropped = [PNG_SIGNATURE], set(), len(PNG_SIGNATURE), False
    for start, end, kind in png_chunks(data):
        critical = not kind[0] & 0x20
        if kind == b"IDAT":
            seen.add(b"eXIf")  # one after the pixels: Pillow reads it only when decoding them
        if critical or (kind in _SHOWN_PNG_CHUNKS and kind not in seen):
            kept.append(data[start:end])
        else:
            dropped = True
        if kind in _SINGLE_PNG_CHUNKS:
            seen.add(kind)
    if not dropped:
        return data
    kept.append(data[end:])  # what follows IEND, or a chunk cut short: Pillow's to judge
    return b"".join(kept)


def check_scans(data: bytes, limit: int, name: str) -> None:
    """A progressive JPEG is decoded once per scan over the whole image: a 73 KB 4096x4096 JPEG
    repeating a 40-byte refinement scan took 11.6 s (libjpeg-turbo sets no limit)."""
    if data.startswith(JPEG_START) and (scans := data.count(JPEG_SCAN)) > limit:
        raise PayloadTooLarge(
            f"{name} is a JPEG of {scans} scans; the limit is {limit} ({env_name('', 'max_jpeg_scans')})"
        )


def check_png_chunks(data: Sequence[bytes], limit: int, names: Sequence[str]) -> None:
    """Count the chunks of the request's PNGs, walking their lengths, up to ``limit``: Pillow
    spends microseconds on each, even an empty one (a PNG of 1 M empty chunks: 3.2 s to open).
    Each reference counts, as the size limits do, though the image is opened once: the walk stops
    at the limit."""
    count = 0
    for item, name in zip(data, names):
        if not item.startswith(PNG_SIGNATURE):
            continue
        for _ in png_chunks(item):
            count += 1
            if count > limit:
                raise PayloadTooLarge(
                    f"the request's PNG images have over {limit} chunks together ({name} reaching it); "
                    f"the limit is {limit} ({env_name('', 'max_png_chunks')})"
                )


def exif_orientation(exif: object) -> int | None:
    """The Orientation tag (1-8) of the EXIF block Pillow read with an image's header (JPEG APP1,
    PNG eXIf, WebP EXIF; ``image.info["exif"]``), found among IFD0's entries without parsing them
    (an eXIf may hold 65,535 tags: Pillow's parse takes 0.15 s). As browsers do, nothing else:
    not XMP, which Pillow's ``getexif`` searches by regex, nor ImageMagick's text chunks; and not
    an eXIf after the pixels (``getexif`` of a PNG decodes it whole to look there; libpng-based
    viewers read only one before them). None when there is none or the EXIF cannot be read, as
    viewers show it."""
    if not isinstance(exif, bytes):
        return None
    exif = exif.removeprefix(b"Exif\x00\x00")
    order = {b"II": "<", b"MM": ">"}.get(exif[:2])
    if order is None or len(exif) < 8:
        return None
    (start,) = struct.unpack_from(order + "I", exif, 4)
    if start + 2 > len(exif):
        return None
    (count,) = struct.unpack_from(order + "H", exif, start)
    count = min(count, (len(exif) - start - 2) // 12)
    # IFD0's 12-byte entries: tag, type, count, then the value (a SHORT in its first two bytes)
    entry = {"names": ["tag", "type", "value"], "formats": [order + "u2"] * 3, "offsets": [0, 2, 8], "itemsize": 12}
    entries = np.frombuffer(exif, np.dtype(entry), count, start + 2)
    found = np.flatnonzero((entries["tag"] == _ORIENTATION_TAG) & (entries["type"] == _EXIF_SHORT))
    value = int(entries["value"][found[0]]) if found.size else None
    return value if value in ORIENTATIONS else None
