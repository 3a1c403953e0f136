"""The content-coding decoder on its own: every supported shape of gzip and deflate decodes
exactly whatever the chunking, a bomb comes out a bounded piece at a time, and every broken or
unsupported stream is a typed error, never wrong bytes."""

from __future__ import annotations

import gzip
import os
import zlib

import pytest

from fleetwarden.batch.content_coding import (
    PIECE,
    CorruptStreamError,
    StreamDecoder,
    UnsupportedCodingError,
    content_coding,
)

TEXT = b"".join(
    b'{"custom_id": "%d", "pad": "%s"}\n' % (i, os.urandom(8).hex().encode()) for i in range(5000)
)


def decode(coding: str, data: bytes, chunk: int) -> bytes:
    """Feed `data` in chunks of `chunk` bytes the way the API does; check each piece's size."""
    decoder = StreamDecoder(coding)
    out = bytearray()
    for start in range(0, len(data), chunk):
        decoder.feed(data[start : start + chunk])
        while piece := decoder.decode_piece():
            assert len(piece) <= PIECE
            out += piece
    decoder.finish()
    return bytes(out)


def raw_deflate(data: bytes) -> bytes:
    compressor = zlib.compressobj(wbits=-zlib.MAX_WBITS)
    return compressor.compress(data) + compressor.flush()


@pytest.mark.parametrize("chunk", [1, 7, 4096, 1 << 20])
@pytest.mark.parametrize(
    ("coding", "encode"),
    [
        ("gzip", gzip.compress),
        ("deflate", zlib.compress),  # RFC 9110's deflate: a zlib stream
        ("deflate", raw_deflate),  # what some clients send instead
    ],
)
def test_gzip_and_deflate_decode_exactly_however_the_body_is_chunked(
    coding: str, encode: object, chunk: int
) -> None:
    assert callable(encode)
    assert decode(coding, encode(TEXT), chunk) == TEXT


@pytest.mark.parametrize("chunk", [1, 13, 1 << 20])
def test_concatenated_gzip_members_decode_as_one_body(chunk: int) -> None:
    """RFC 1952 allows several members (`cat a.gz b.gz`), including empty ones."""
    parts = [TEXT[:1000], b"", TEXT[1000:1001], TEXT[1001:]]
    body = b"".join(gzip.compress(part) for part in parts)
    assert decode("gzip", body, chunk) == TEXT


def test_many_tiny_members_decode() -> None:
    body = b"".join(gzip.compress(bytes([i % 256])) for i in range(20_000))
    assert decode("gzip", body, 256 * 1024) == bytes(i % 256 for i in range(20_000))


def test_a_bomb_comes_out_one_bounded_piece_at_a_time() -> None:
    """64 MiB of zeros in ~64 KiB of gzip: each call inflates at most PIECE bytes, so a caller
    that stops at its limit never holds more than one piece past it."""
    compressor = zlib.compressobj(wbits=16 + zlib.MAX_WBITS)
    zeros = bytes(1 << 20)
    bomb = b"".join(compressor.compress(zeros) for _ in range(64)) + compressor.flush()
    decoder = StreamDecoder("gzip")
    decoder.feed(bomb)
    sizes = []
    while piece := decoder.decode_piece():
        sizes.append(len(piece))
    decoder.finish()
    assert max(sizes) == PIECE
    assert sum(sizes) == 64 << 20


@pytest.mark.parametrize(
    ("coding", "body", "message"),
    [
        ("gzip", TEXT[:100], "incorrect header check"),  # not gzip at all
        ("gzip", gzip.compress(TEXT)[:-20], "ends early"),  # cut off
        (
            "gzip",
            gzip.compress(TEXT)[:-8] + b"\0\0\0\0" + gzip.compress(TEXT)[-4:],
            "incorrect data check",
        ),  # wrong CRC-32
        ("gzip", gzip.compress(TEXT) + b"trailing junk", "incorrect header check"),
        ("gzip", gzip.compress(TEXT) + b"\x1f\x8b", "ends early"),  # a cut second member
        ("gzip", b"", "empty or ends early"),
        ("deflate", zlib.compress(TEXT) + b"junk", "data follows the end"),
        ("deflate", zlib.compress(TEXT)[:-10], "ends early"),
        ("deflate", b"", "empty or ends early"),
    ],
)
def test_a_broken_stream_is_a_typed_error_naming_the_problem(
    coding: str, body: bytes, message: str
) -> None:
    with pytest.raises(CorruptStreamError, match=message):
        decode(coding, body, 4096)


@pytest.mark.parametrize(
    ("values", "coding"),
    [
        ((), None),
        (("",), None),
        (("identity",), None),
        (("gzip",), "gzip"),
        (("GZip",), "gzip"),
        (("x-gzip",), "gzip"),
        (("deflate",), "deflate"),
        (("identity, gzip",), "gzip"),
        (("identity", "deflate"), "deflate"),
    ],
)
def test_content_encoding_headers_name_one_coding_or_identity(
    values: tuple[str, ...], coding: str | None
) -> None:
    assert content_coding(values) == coding


@pytest.mark.parametrize(
    ("values", "named"),
    [
        (("br",), "'br'"),
        (("zstd",), "'zstd'"),
        (("compress",), "'compress'"),
        (("gzip, gzip",), "stacks several codings"),
        (("deflate", "gzip"), "stacks several codings"),
    ],
)
def test_other_codings_are_refused_naming_the_supported_ones(
    values: tuple[str, ...], named: str
) -> None:
    with pytest.raises(UnsupportedCodingError, match=named) as caught:
        content_coding(values)
    assert "gzip, deflate, identity" in str(caught.value)


def test_feeding_before_the_previous_chunk_is_used_up_is_a_bug() -> None:
    decoder = StreamDecoder("gzip")
    decoder.feed(gzip.compress(TEXT))
    with pytest.raises(RuntimeError):
        decoder.feed(b"more")
