"""Optional payload encryption: an AES-GCM `PayloadCodec` with a key ring.

Every payload Temporal stores (inputs, results, heartbeats, memos, summaries, and failures' messages
and stack traces) is encrypted on the way out of our processes and decrypted on the way in, so the
Temporal server and its database only hold ciphertext. Off unless keys are configured
(worker/settings.py `CodecSettings`).

Key rotation: every key of the ring decrypts, exactly one encrypts. Roll a new key out as a
decode-only key first (everywhere: worker, controller, CLI, codec server), then make it the encode
key, and drop the old one only once no open or retained history still uses it.

Wire format of an encrypted payload: metadata `encoding=binary/encrypted` and
`encryption-key-id=<id>`; data = 12-byte nonce + AES-GCM(serialized original payload), with the key id
as associated data (a payload cannot be made to decrypt under another id). Payloads without that
encoding pass through `decode` unchanged, so histories written before encryption was turned on stay
readable.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import logging
import re
import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from google.protobuf.message import DecodeError
from temporalio.api.common.v1 import Payload
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.converter import DataConverter, DefaultFailureConverterWithEncodedAttributes, PayloadCodec

from activities.file_stamp import FileStamp, file_stamp
from worker.settings import CodecSettings, env_variable

log = logging.getLogger(__name__)

ENCODING = b"binary/encrypted"
KEY_ID_METADATA = "encryption-key-id"
NONCE_BYTES = 12
TAG_BYTES = 16  # AES-GCM's authentication tag, at the end of the ciphertext
_KEY_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")
_ENTRY_SEPARATORS = re.compile(r"[,\s]+")


class CodecConfigError(ValueError):
    """The key ring is malformed. Messages name key ids, never key material."""


class PayloadDecryptError(ValueError):
    """A payload cannot be decrypted (unknown key id, wrong key, tampered data)."""


@dataclass(frozen=True)
class KeyRing:
    keys: Mapping[str, bytes]
    encode_key_id: str

    def __post_init__(self) -> None:
        if self.encode_key_id not in self.keys:
            raise CodecConfigError(
                f"the encode key {self.encode_key_id!r} (OSAC_CODEC_ENCODE_KEY) is not in the key ring"
            )

    @classmethod
    def parse(cls, *sources: str, encode_key: str | None = None) -> KeyRing:
        """Entries `id=base64` separated by commas or whitespace; lines starting with # are comments."""
        keys: dict[str, bytes] = {}
        order: list[str] = []
        for source in sources:
            text = "\n".join(line for line in source.splitlines() if not line.lstrip().startswith("#"))
            for entry in _ENTRY_SEPARATORS.split(text):
                if not entry:
                    continue
                key_id, sep, encoded = entry.partition("=")
                if not sep or not _KEY_ID.fullmatch(key_id):
                    raise CodecConfigError(
                        "codec key entries are id=base64 with ids of letters, digits, '.', '_' or '-'"
                    )
                try:
                    material = base64.b64decode(encoded, validate=True)
                except (binascii.Error, ValueError):
                    raise CodecConfigError(f"codec key {key_id!r} is not valid base64") from None
                if len(material) not in (16, 24, 32):
                    raise CodecConfigError(f"codec key {key_id!r} must be 16, 24 or 32 bytes")
                if key_id in keys and keys[key_id] != material:
                    raise CodecConfigError(f"codec key {key_id!r} is listed twice with different material")
                if key_id not in keys:
                    order.append(key_id)
                keys[key_id] = material
        if not keys:
            raise CodecConfigError("the codec key ring is empty")
        return cls(keys=keys, encode_key_id=encode_key or order[0])

    @classmethod
    def from_settings(cls, settings: CodecSettings) -> KeyRing | None:
        if not settings.enabled:
            return None
        sources, where = [], []
        if settings.keys is not None:
            sources.append(settings.keys.get_secret_value())
            where.append(env_variable(CodecSettings, "keys"))
        if settings.keys_file is not None:
            variable = f"{env_variable(CodecSettings, 'keys_file')}={settings.keys_file}"
            try:
                sources.append(Path(settings.keys_file).read_text())
            except (OSError, ValueError) as err:  # missing, unreadable, a directory, not UTF-8
                reason = err.strerror if isinstance(err, OSError) and err.strerror else type(err).__name__
                raise CodecConfigError(f"{variable}: cannot read it ({reason})") from None
            where.append(variable)
        try:
            return cls.parse(*sources, encode_key=settings.encode_key)
        except CodecConfigError as err:
            # Name the variables the ring came from, as every other configuration error does.
            raise CodecConfigError(f"{' + '.join(where)}: {err}") from None


class KeyRingSource:
    """The key ring of a settings object, re-read when its file changes (a rotated mounted Secret)."""

    def __init__(self, settings: CodecSettings) -> None:
        self._settings = settings
        self._stamp: FileStamp | None = None
        ring = KeyRing.from_settings(settings)
        if ring is None:
            raise CodecConfigError("no codec keys configured")
        self._ring = ring
        self._stamp = self._file_stamp()

    def _file_stamp(self) -> FileStamp | None:
        if self._settings.keys_file is None:
            return None
        try:
            return file_stamp(self._settings.keys_file)
        except OSError:
            return None

    def current(self) -> KeyRing:
        stamp = self._file_stamp()
        if stamp is not None and stamp != self._stamp:
            self._stamp = stamp  # a file that cannot be used is not read again until it changes
            try:
                ring = KeyRing.from_settings(self._settings)
            except (OSError, CodecConfigError) as err:
                # A half-written file during rotation (its next write changes the stamp) or a bad
                # one: keep the last good ring, and say so once per version of the file.
                log.warning(
                    "codec keys file %s not used, keeping the keys in use: %s", self._settings.keys_file, err
                )
                return self._ring
            if ring is not None:
                self._ring = ring
        return self._ring


class AesGcmCodec(PayloadCodec):
    """Encrypts with the ring's encode key; decrypts with whichever key a payload names."""

    def __init__(self, ring: KeyRing | KeyRingSource) -> None:
        self._source = ring

    def _ring(self) -> KeyRing:
        return self._source.current() if isinstance(self._source, KeyRingSource) else self._source

    async def encode(self, payloads: Sequence[Payload]) -> list[Payload]:
        ring = self._ring()
        key_id = ring.encode_key_id
        aead = AESGCM(ring.keys[key_id])
        encoded = []
        for payload in payloads:
            nonce = secrets.token_bytes(NONCE_BYTES)
            sealed = aead.encrypt(nonce, payload.SerializeToString(), key_id.encode())
            encoded.append(
                Payload(
                    metadata={"encoding": ENCODING, KEY_ID_METADATA: key_id.encode()},
                    data=nonce + sealed,
                )
            )
        return encoded

    async def decode(self, payloads: Sequence[Payload]) -> list[Payload]:
        ring = self._ring()
        decoded = []
        for payload in payloads:
            if payload.metadata.get("encoding") != ENCODING:
                decoded.append(payload)
                continue
            key_id = payload.metadata.get(KEY_ID_METADATA, b"").decode(errors="replace")
            key = ring.keys.get(key_id)
            if key is None:
                raise PayloadDecryptError(f"payload encrypted with key {key_id!r}, not in the key ring")
            data = payload.data
            if len(data) < NONCE_BYTES + TAG_BYTES:  # AESGCM would raise a bare ValueError on the nonce
                raise PayloadDecryptError(
                    f"payload encrypted with key {key_id!r} is truncated: {len(data)} bytes,"
                    f" at least {NONCE_BYTES + TAG_BYTES} expected"
                )
            try:
                plain = AESGCM(key).decrypt(data[:NONCE_BYTES], data[NONCE_BYTES:], key_id.encode())
                decoded.append(Payload.FromString(plain))
            except (InvalidTag, DecodeError):
                raise PayloadDecryptError(f"payload does not decrypt with key {key_id!r}") from None
        return decoded


def generate_key_entry(key_id: str) -> str:
    """A fresh AES-256 key ring entry `id=base64`."""
    if not _KEY_ID.fullmatch(key_id):
        raise CodecConfigError("key ids are letters, digits, '.', '_' or '-'")
    return f"{key_id}={base64.b64encode(secrets.token_bytes(32)).decode()}"


def codec_from_env(settings: CodecSettings | None = None) -> AesGcmCodec | None:
    settings = settings or CodecSettings()
    if not settings.enabled:
        return None
    return AesGcmCodec(KeyRingSource(settings))


def data_converter(codec: PayloadCodec | None = None) -> DataConverter:
    """The project's data converter (pydantic payloads), with the payload codec when one is given.

    With a codec, failures' messages and stack traces go into their encoded attributes, so they are
    encrypted too (the default converter leaves them in plaintext). Either converter reads failures
    written by the other: histories from before encryption stay readable, and back.
    """
    if codec is None:
        return pydantic_data_converter
    return dataclasses.replace(
        pydantic_data_converter,
        payload_codec=codec,
        failure_converter_class=DefaultFailureConverterWithEncodedAttributes,
    )


def data_converter_from_env(settings: CodecSettings | None = None) -> DataConverter:
    return data_converter(codec_from_env(settings))
