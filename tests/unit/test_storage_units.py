"""Pure parts of the artifact store: envelopes, block digests, placement, names."""

from __future__ import annotations

import hashlib
import io
import os
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shipyard.errors import CorruptData, InvalidSpec
from shipyard.storage.config import RootConfig
from shipyard.storage.crypto import Keyring, decrypt_chunks, encrypt_chunks, load_keyring
from shipyard.storage.digests import BlockHasher, blocks, digest_of
from shipyard.storage.names import check_name
from shipyard.storage.roots import Root, placement

KEY = bytes(range(32))


def _sealed(plain: bytes, chunk: int) -> bytes:
    pieces = [plain[i : i + 7] for i in range(0, len(plain), 7)]  # any chunking goes in
    return b"".join(encrypt_chunks(pieces, KEY, chunk_bytes=chunk))


def _opened(sealed: bytes, key: bytes = KEY) -> bytes:
    return b"".join(decrypt_chunks(io.BytesIO(sealed).read, key, "test blob"))


@settings(max_examples=60, deadline=None)
@given(plain=st.binary(max_size=300), chunk=st.integers(1, 64))
def test_envelopes_round_trip_any_bytes_and_chunk_size(plain: bytes, chunk: int) -> None:
    assert _opened(_sealed(plain, chunk)) == plain


@settings(max_examples=80, deadline=None)
@given(plain=st.binary(min_size=1, max_size=200), data=st.data())
def test_any_flipped_bit_fails_loudly(plain: bytes, data: st.DataObject) -> None:
    sealed = bytearray(_sealed(plain, 16))
    position = data.draw(st.integers(0, len(sealed) - 1))
    sealed[position] ^= 1 << data.draw(st.integers(0, 7))
    with pytest.raises(CorruptData, match="test blob"):
        _opened(bytes(sealed))


@settings(max_examples=60, deadline=None)
@given(plain=st.binary(min_size=1, max_size=200), data=st.data())
def test_truncation_at_any_point_fails_loudly(plain: bytes, data: st.DataObject) -> None:
    sealed = _sealed(plain, 16)
    cut = data.draw(st.integers(0, len(sealed) - 1))
    with pytest.raises(CorruptData):
        _opened(sealed[:cut])


def test_reordered_chunks_and_wrong_keys_fail() -> None:
    sealed = _sealed(os.urandom(64), 16)
    header, body = sealed[:20], sealed[20:]
    chunks = [body[i : i + 32] for i in range(0, len(body), 32)]
    with pytest.raises(CorruptData, match="chunk 0"):
        _opened(header + b"".join([chunks[1], chunks[0], *chunks[2:]]))
    with pytest.raises(CorruptData):
        _opened(sealed, key=bytes(32))


def test_block_digest_is_the_hash_of_block_hashes_whatever_the_reads() -> None:
    data = os.urandom((4 << 20) * 2 + 12345)
    expected = hashlib.sha256(
        b"".join(hashlib.sha256(data[i : i + (4 << 20)]).digest() for i in range(0, len(data), 4 << 20))
    ).hexdigest()
    assert digest_of(io.BytesIO(data).read) == expected

    class Trickle(io.BytesIO):  # a socket hands back short reads
        def read(self, size: int | None = -1) -> bytes:
            return super().read(min(size or 1, 1000))

    assert digest_of(Trickle(data).read) == expected
    hasher = BlockHasher()
    for block in blocks(io.BytesIO(b"").read):
        hasher.update(block)
    assert hasher.hexdigest() == hashlib.sha256(b"").hexdigest() and hasher.size == 0


def _roots(*racks: str) -> list[Root]:
    return [Root(RootConfig(path=Path(f"/r{i}"), rack=rack, node=f"n{i}")) for i, rack in enumerate(racks)]


def test_placement_spreads_copies_over_racks_before_nodes() -> None:
    roots = _roots("a", "a", "a", "b", "c")
    for name in (f"blob-{i}" for i in range(200)):
        chosen = placement(roots, name, 3)
        assert {r.config.rack for r in chosen} == {"a", "b", "c"}
        assert placement(roots, name, 3) == chosen  # deterministic: every process agrees
    spread = {placement(roots, f"blob-{i}", 1)[0].path for i in range(200)}
    assert len(spread) == 5  # single copies land on every root


def test_placement_keeps_copies_that_already_satisfy_the_domains() -> None:
    roots = _roots("a", "b", "c", "d")
    for name in (f"blob-{i}" for i in range(50)):
        held = [roots[0], roots[3]]
        assert set(placement(roots, name, 2, keep=held)) == set(held)
    same_rack = _roots("a", "a", "b")
    assert {r.config.rack for r in placement(same_rack, "x", 2, keep=same_rack[:2])} == {"a", "b"}


@pytest.mark.parametrize(
    "name",
    ["", "/etc/passwd", "../x", "a/../../b", "a//b", "a/./b", "a\\b", "a\x00b", "line\nbreak", "x" * 300],
)
def test_unsafe_names_are_refused_with_the_reason(name: str) -> None:
    with pytest.raises(InvalidSpec, match="artifact name"):
        check_name(name)


def test_safe_names_pass() -> None:
    for name in ("model.safetensors", "checkpoints/run-1/step-100", "a@b+c:d", "データ/重み"):
        assert check_name(name) == name


def test_key_file_is_private_and_rotation_keeps_old_keys_until_retired(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("SHIPYARD_STORAGE_KEY", raising=False)
    key_file = tmp_path / "storage.key"
    assert load_keyring(key_file, create=False) is None
    ring = load_keyring(key_file, create=True)
    assert ring is not None and key_file.stat().st_mode & 0o777 == 0o600
    key_id, wrapped = ring.wrap(b"k" * 32, "enc/ab/x")
    rotated = ring.rotated()
    assert rotated.active_id != ring.active_id
    assert rotated.unwrap(key_id, wrapped, "enc/ab/x") == b"k" * 32
    with pytest.raises(CorruptData, match="tampered"):
        rotated.unwrap(key_id, wrapped, "enc/ab/other")  # a wrapped key is bound to its blob
    retired = rotated.retired()
    with pytest.raises(CorruptData, match="lacks"):
        retired.unwrap(key_id, wrapped, "enc/ab/x")
    assert isinstance(load_keyring(key_file, create=False), Keyring)
    monkeypatch.setenv("SHIPYARD_STORAGE_KEY", "not base64!")
    with pytest.raises(InvalidSpec, match="32-byte key"):
        load_keyring(key_file, create=False)


def test_transfer_bars_count_in_binary_units_like_every_other_size() -> None:
    """200,000,000 bytes are 190.7 MiB in a summary; the bar's speed and size say the same."""
    from types import SimpleNamespace

    from rich.progress import DownloadColumn

    from shipyard.cli.storage import _BinarySpeed

    task = SimpleNamespace(finished_speed=None, speed=200e6, completed=200e6, total=200e6)
    assert str(_BinarySpeed().render(task)) == "190.7 MiB/s"  # type: ignore[arg-type]
    assert "190.7" in str(DownloadColumn(binary_units=True).render(task))  # type: ignore[arg-type]
