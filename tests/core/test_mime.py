"""MIME sniffing from magic bytes, including near misses that must not match."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from plexus.core._mime import sniff_mime

# (id, data, expected)
CASES: list[tuple[str, bytes, str | None]] = [
    # images
    ("jpeg", b"\xff\xd8\xff\xe0\x00\x10JFIF", "image/jpeg"),
    ("jpeg-minimal", b"\xff\xd8\xff", "image/jpeg"),
    ("png", b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR", "image/png"),
    ("gif87a", b"GIF87a\x01\x00", "image/gif"),
    ("gif89a", b"GIF89a\x01\x00", "image/gif"),
    ("webp", b"RIFF\x24\x00\x00\x00WEBPVP8 ", "image/webp"),
    ("webp-exact-12", b"RIFF\x00\x00\x00\x00WEBP", "image/webp"),
    # audio
    ("mp3-id3", b"ID3\x04\x00\x00\x00\x00\x00\x00", "audio/mpeg"),
    ("mp3-fffb", b"\xff\xfb\x90\x64", "audio/mpeg"),
    ("mp3-fff3", b"\xff\xf3\x90\x64", "audio/mpeg"),
    ("mp3-fff2", b"\xff\xf2\x90\x64", "audio/mpeg"),
    ("mp3-two-bytes", b"\xff\xfb", "audio/mpeg"),
    ("mp3-layer2-sync", b"\xff\xfd\x90\x00", "audio/mpeg"),  # general 11-bit sync, MPEG-1 layer II
    ("mp3-mpeg25-sync", b"\xff\xe3\x40\x00", "audio/mpeg"),  # MPEG-2.5 layer III
    ("ogg", b"OggS\x00\x02\x00\x00", "audio/ogg"),
    ("flac", b"fLaC\x00\x00\x00\x22", "audio/flac"),
    ("wav", b"RIFF\x24\x08\x00\x00WAVEfmt ", "audio/wav"),
    # documents
    ("pdf", b"%PDF-1.7\n%\xe2\xe3", "application/pdf"),
    # near misses
    ("empty", b"", None),
    ("one-byte-ff", b"\xff", None),
    ("jpeg-truncated", b"\xff\xd8", None),
    ("png-truncated", b"\x89PNG\r\n\x1a", None),
    ("gif-bad-version", b"GIF88a\x01\x00", None),
    ("riff-avi", b"RIFF\x24\x00\x00\x00AVI LIST", None),
    ("riff-short", b"RIFF\x24\x00\x00\x00WEB", None),
    ("riff-only", b"RIFF", None),
    ("webp-without-riff", b"RIFX\x24\x00\x00\x00WEBP", None),
    ("id3-truncated", b"ID", None),
    ("ogg-lowercase", b"oggs\x00", None),
    ("flac-uppercase", b"FLAC\x00", None),
    ("pdf-no-dash", b"%PDF1.7", None),
    ("pdf-not-at-start", b" %PDF-1.7", None),
    ("aac-adts", b"\xff\xf1\x50\x80", None),  # layer bits 00: AAC, not MPEG audio
    ("mpeg-reserved-version", b"\xff\xeb\x90\x00", None),
    ("mpeg-bad-bitrate", b"\xff\xfb\xf0\x00", None),
    ("mpeg-bad-sample-rate", b"\xff\xfb\x9c\x00", None),
    ("ff-not-sync", b"\xff\xc0\x00\x00", None),
    ("text", b"hello world", None),
    ("zip", b"PK\x03\x04\x14\x00", None),
]


@pytest.mark.parametrize(("data", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_sniff_mime_table(data: bytes, expected: str | None) -> None:
    assert sniff_mime(data) == expected


@given(st.binary(max_size=64))
def test_sniff_mime_never_raises_and_is_prefix_stable(data: bytes) -> None:
    result = sniff_mime(data)
    assert result is None or result in {c[2] for c in CASES}
    # Recognition depends only on the header: appending bytes never changes a positive answer.
    if result is not None:
        assert sniff_mime(data + b"\x00" * 16) == result
