"""MIME type detection from leading magic bytes."""

from __future__ import annotations

__all__ = ["sniff_mime"]

# Fixed-prefix signatures, checked in order. RIFF containers and MPEG frame sync need more than a prefix
# and are handled in `sniff_mime` itself.
_PREFIXES: tuple[tuple[bytes, str], ...] = (
    (b"\xff\xd8\xff", "image/jpeg"),
    (b"\x89PNG\r\n\x1a\n", "image/png"),
    (b"GIF87a", "image/gif"),
    (b"GIF89a", "image/gif"),
    (b"%PDF-", "application/pdf"),
    (b"ID3", "audio/mpeg"),
    (b"OggS", "audio/ogg"),
    (b"fLaC", "audio/flac"),
)

# RIFF form types at bytes 8..12; others (e.g. "AVI ") are deliberately unknown.
_RIFF_FORMS: dict[bytes, str] = {b"WEBP": "image/webp", b"WAVE": "audio/wav"}


def _is_mpeg_audio_frame(data: bytes) -> bool:
    """An MPEG audio frame header: 11 set sync bits plus valid version/layer (and bitrate/rate if present).

    Checking the reserved values keeps AAC ADTS (layer bits 00) and random 0xFFEx noise from matching.
    """
    if len(data) < 2 or data[0] != 0xFF or data[1] & 0xE0 != 0xE0:
        return False
    version = (data[1] >> 3) & 0b11
    layer = (data[1] >> 1) & 0b11
    if version == 0b01 or layer == 0b00:
        return False
    if len(data) >= 3:
        bitrate_index = data[2] >> 4
        sample_rate_index = (data[2] >> 2) & 0b11
        if bitrate_index == 0b1111 or sample_rate_index == 0b11:
            return False
    return True


def sniff_mime(data: bytes) -> str | None:
    """Guess a MIME type from magic bytes; None when the format is not one we recognise."""
    for prefix, mime in _PREFIXES:
        if data.startswith(prefix):
            return mime
    if data.startswith(b"RIFF") and len(data) >= 12:
        return _RIFF_FORMS.get(bytes(data[8:12]))
    if _is_mpeg_audio_frame(data):
        return "audio/mpeg"
    return None
