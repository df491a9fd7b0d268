"""``mp-manager backup`` and ``restore``: one encrypted file holding everything the manager knows.

What a backup holds: every row of every table (users with their password hashes, sessions
and their revocations, nodes with their secrets, events, settings, AI keys; see
``store.snapshot``) and the TLS pair of ``DATA_DIR/tls`` when there is one, so that nodes
pinning the certificate's fingerprint (interop 6) still connect after a move.

What it does not hold: ``MEDIAPLANE_MASTER_KEY`` and ``MEDIAPLANE_JWT_SECRET``. The restoring
box needs the same master key (it opens the file, and the secret columns inside are sealed
with it, interop 7.7); with the same JWT secret, sessions issued before the backup stay valid.

**File format** (version 1), all integers big-endian::

    magic "MPMGRBAK" (8) | version 0x01 (1) | salt (32)       the 41-byte header
    then chunks: length L (4) | sealed (L)                    L = plaintext + 16-byte tag

The key is HKDF-SHA256 over the master key's text with the file's random salt and its own
``info`` (so it is never the at-rest key of 7.7, and every file has its own key). Each
chunk is AES-256-GCM over at most 1 MiB of the zlib-compressed stream, with the nonce
``chunk index (11 bytes) | 0x01 on the last chunk, else 0x00`` and the header as
associated data: a chunk that is changed, reordered, dropped from the end, or moved
from another file fails its tag (the STREAM construction of Hoang, Reyhanitabar, Rogaway
and Vizár, "Online authenticated-encryption and its nonce-reuse misuse-resistance", 2015).

The plaintext stream is JSON lines: one line ``{"format": "mediaplane-manager-backup",
"version": 1, "files": {"tls/cert.pem": <base64>, ...}}``, then the snapshot's lines.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import json
import os
import struct
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Final

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from pydantic import SecretStr

from appliance.config.atomic import atomic_write, atomic_writer
from appliance.errors import InvalidInput
from services.manager.store import resolve_url
from services.manager.store.snapshot import SnapshotSummary, load_snapshot, write_snapshot
from services.manager.tls import CERT_FILE_NAME, KEY_FILE_NAME

__all__ = ["BackupUnreadable", "RestoreResult", "make_backup", "restore_backup"]

MAGIC: Final = b"MPMGRBAK"
FORMAT_VERSION: Final = 1
SALT_BYTES: Final = 32
HEADER: Final = struct.Struct(f">{len(MAGIC)}sB{SALT_BYTES}s")
CHUNK_PLAINTEXT_MAX: Final = 1 << 20
TAG_BYTES: Final = 16
LENGTH: Final = struct.Struct(">I")
HKDF_INFO: Final = b"mediaplane-manager backup v1"
BACKUP_FORMAT: Final = "mediaplane-manager-backup"
LINE_MAX: Final = 64 << 20  # no row comes near this (an event message is at most 10,000 characters)
TLS_DIR_NAME: Final = "tls"
_TLS_FILES: Final = ((CERT_FILE_NAME, 0o644), (KEY_FILE_NAME, 0o600))


class BackupUnreadable(InvalidInput):
    """The file is not a backup, was made with another master key, or is damaged; nothing was restored."""


@dataclass(frozen=True)
class RestoreResult:
    """What ``restore_backup`` brought back."""

    snapshot: SnapshotSummary
    tls_restored: bool
    tls_set_aside: bool
    """A TLS pair that was in ``DATA_DIR/tls`` was renamed ``*.before-restore``."""


def _file_key(master_key: SecretStr, salt: bytes) -> AESGCM:
    key = HKDF(algorithm=hashes.SHA256(), length=32, salt=salt, info=HKDF_INFO).derive(
        master_key.get_secret_value().encode()
    )
    return AESGCM(key)


def _nonce(index: int, last: bool) -> bytes:
    return index.to_bytes(11, "big") + (b"\x01" if last else b"\x00")


class _SealedWriter:
    """Compresses, chunks and seals a byte stream into ``out`` (the format above)."""

    def __init__(self, out: BinaryIO, master_key: SecretStr) -> None:
        salt = os.urandom(SALT_BYTES)
        self._header = HEADER.pack(MAGIC, FORMAT_VERSION, salt)
        self._aead = _file_key(master_key, salt)
        self._out = out
        self._compressor = zlib.compressobj(6)
        self._pending = bytearray()
        self._index = 0
        out.write(self._header)

    def write(self, data: bytes) -> None:
        self._pending += self._compressor.compress(data)
        while len(self._pending) > CHUNK_PLAINTEXT_MAX:
            self._seal(bytes(self._pending[:CHUNK_PLAINTEXT_MAX]), last=False)
            del self._pending[:CHUNK_PLAINTEXT_MAX]

    def close(self) -> None:
        """Seals what is left as the last chunk (possibly empty: a last chunk always exists)."""
        self._pending += self._compressor.flush()
        while len(self._pending) > CHUNK_PLAINTEXT_MAX:
            self._seal(bytes(self._pending[:CHUNK_PLAINTEXT_MAX]), last=False)
            del self._pending[:CHUNK_PLAINTEXT_MAX]
        self._seal(bytes(self._pending), last=True)
        self._pending.clear()

    def _seal(self, plaintext: bytes, *, last: bool) -> None:
        sealed = self._aead.encrypt(_nonce(self._index, last), plaintext, self._header)
        self._out.write(LENGTH.pack(len(sealed)) + sealed)
        self._index += 1


def _read_exactly(source: BinaryIO, size: int) -> bytes:
    data = source.read(size)
    if len(data) != size:
        raise BackupUnreadable("the backup file is truncated")
    return data


def _opened(source: BinaryIO, master_key: SecretStr) -> Iterator[bytes]:
    """The decompressed plaintext of a backup file, piece by piece, each piece authenticated."""
    header = source.read(HEADER.size)
    if len(header) != HEADER.size or not header.startswith(MAGIC):
        raise BackupUnreadable("this is not a Mediaplane manager backup file")
    _, version, salt = HEADER.unpack(header)
    if version != FORMAT_VERSION:
        raise BackupUnreadable(f"backup format version {version} is not one this mp-manager reads")
    aead = _file_key(master_key, salt)
    decompressor = zlib.decompressobj()
    index = 0
    while True:
        (length,) = LENGTH.unpack(_read_exactly(source, LENGTH.size))
        if not TAG_BYTES <= length <= CHUNK_PLAINTEXT_MAX + TAG_BYTES:
            raise BackupUnreadable("the backup file is damaged (a chunk has an impossible length)")
        sealed = _read_exactly(source, length)
        plaintext = None
        for last in (False, True):
            with contextlib.suppress(InvalidTag):
                plaintext = aead.decrypt(_nonce(index, last), sealed, header)
                break
        if plaintext is None:
            if index == 0:
                raise BackupUnreadable(
                    "the backup cannot be decrypted: MEDIAPLANE_MASTER_KEY is not the key it was made "
                    "with, or the file is damaged"
                )
            raise BackupUnreadable(f"the backup file is damaged (chunk {index} fails its authentication)")
        index += 1
        try:
            # Bounded output per call: a chunk never expands into more than LINE_MAX at once.
            piece = decompressor.decompress(plaintext, LINE_MAX)
            while piece:
                yield piece
                piece = decompressor.decompress(decompressor.unconsumed_tail, LINE_MAX)
        except zlib.error:
            raise BackupUnreadable("the backup file is damaged (its compressed stream is invalid)") from None
        if last:
            break
    if source.read(1):
        raise BackupUnreadable("the backup file has data after its last chunk (damaged)")
    if not decompressor.eof:
        raise BackupUnreadable("the backup file is truncated (its compressed stream is incomplete)")


def _lines(pieces: Iterator[bytes]) -> Iterator[bytes]:
    buffer = bytearray()
    for piece in pieces:
        buffer += piece
        start = 0
        while (end := buffer.find(b"\n", start)) >= 0:
            yield bytes(buffer[start:end])
            start = end + 1
        del buffer[:start]
        if len(buffer) > LINE_MAX:
            raise BackupUnreadable("the backup file is damaged (a line without end)")
    if buffer:
        raise BackupUnreadable("the backup file is damaged (it ends inside a line)")


def _tls_files(data_dir: Path) -> dict[str, str]:
    tls_dir = data_dir / TLS_DIR_NAME
    files: dict[str, str] = {}
    for name, _ in _TLS_FILES:
        try:
            files[f"{TLS_DIR_NAME}/{name}"] = base64.b64encode((tls_dir / name).read_bytes()).decode("ascii")
        except FileNotFoundError:
            return {}  # a pair or nothing (behind_proxy mode has none)
    return files


def make_backup(database_url: str, data_dir: Path, output: Path, master_key: SecretStr, *, version: str) -> int:
    """Writes the backup of the database at ``database_url`` and ``data_dir``'s TLS pair to ``output``.

    Online: the manager may keep serving (``store.snapshot`` reads one consistent view).
    ``output`` is written atomically with mode 0600. Returns the row count per table.
    Blocking: run it in a worker thread. Raises the store's errors or PersistFailed.
    """
    header = {"format": BACKUP_FORMAT, "version": FORMAT_VERSION, "files": _tls_files(data_dir)}
    with atomic_writer(output, 0o600) as out:
        writer = _SealedWriter(out, master_key)
        writer.write(json.dumps(header, separators=(",", ":")).encode() + b"\n")
        summary = write_snapshot(database_url, writer.write, software_version=version)
        writer.close()
    return sum(summary.rows.values())


def restore_backup(source: Path, database_url: str, data_dir: Path, master_key: SecretStr) -> RestoreResult:
    """Loads the backup ``source`` into the empty database at ``database_url`` and its TLS pair into ``data_dir``.

    The database is filled in one transaction (``store.snapshot.load_snapshot``); the TLS
    pair is written only after that commits. A SQLite file this call created is removed
    again when the restore fails. Blocking. Raises ``BackupUnreadable``, the snapshot's
    errors (``TargetNotEmpty``, ``WrongSchemaRevision``, ``SnapshotDamaged``), ``StoreFailed``.
    """
    resolved = resolve_url(database_url)
    sqlite_file = Path(resolved.database) if resolved.get_backend_name() == "sqlite" and resolved.database else None
    created = sqlite_file is not None and not sqlite_file.exists()
    try:
        with source.open("rb") as stream:
            lines = _lines(_opened(stream, master_key))
            files = _backup_header(next(lines, b""))
            # load_snapshot reads ``lines`` to the end inside its transaction, so the last
            # chunk's tag and the trailing-data check can still roll the restore back.
            summary = load_snapshot(resolved, lines)
    except BaseException:
        if created and sqlite_file is not None:
            for suffix in ("", "-wal", "-shm", "-journal"):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(f"{sqlite_file}{suffix}")
        raise
    restored, set_aside = _restore_tls(data_dir, files)
    return RestoreResult(snapshot=summary, tls_restored=restored, tls_set_aside=set_aside)


def _backup_header(line: bytes) -> dict[str, bytes]:
    try:
        header = json.loads(line)
        if header.get("format") != BACKUP_FORMAT or header.get("version") != FORMAT_VERSION:
            raise ValueError
        files = {str(name): base64.b64decode(data, validate=True) for name, data in header["files"].items()}
    except (ValueError, TypeError, AttributeError, KeyError, binascii.Error):
        raise BackupUnreadable("the backup's header is damaged") from None
    if files and set(files) != {f"{TLS_DIR_NAME}/{name}" for name, _ in _TLS_FILES}:
        raise BackupUnreadable("the backup's header names unexpected files")
    return files


def _restore_tls(data_dir: Path, files: dict[str, bytes]) -> tuple[bool, bool]:
    """Writes the backup's TLS pair; a different pair already there is renamed, never lost."""
    if not files:
        return False, False
    tls_dir = data_dir / TLS_DIR_NAME
    tls_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    set_aside = False
    for name, mode in _TLS_FILES:
        target = tls_dir / name
        content = files[f"{TLS_DIR_NAME}/{name}"]
        if target.exists() and target.read_bytes() != content:
            os.replace(target, target.with_name(f"{name}.before-restore"))
            set_aside = True
        atomic_write(target, content, mode)
    return True, set_aside
