"""Ed25519 keys that sign mirror manifests, and the detached-signature file format.

Keys have names (`site-1`, `site-2`, ...) so they can be rotated: a mirror may carry signatures
by several keys, and an importer trusts a set of named public keys (`[mirror] trusted_keys` in
kerneld.toml). A key directory holds, per name:

    <name>.key   the private key, PKCS#8 PEM, mode 0600 (never leaves the exporting host)
    <name>.pub   the public key as one line: `ed25519:<base64 of the 32 raw bytes>`

The public key string is what goes into `trusted_keys` (`site-1 = "ed25519:..."`).

A signature file `<file>.sig` sits beside each signed mirror file (manifests and refs):

    {"format": "kerneld-mirror-sig", "version": 1,
     "signatures": {"site-1": "<base64 Ed25519 signature>", ...}}

Each signature is over `kerneld-mirror-v1\\n` + the file's path inside the mirror + `\\n` + the
file's exact bytes, so a signed file cannot be replayed under another name. A file verifies when
at least one signature by a trusted key name verifies with that trusted key; signatures by
unknown names are ignored (they allow rotation), a bad signature by a trusted name fails.
"""

from __future__ import annotations

import base64
import binascii
import json
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from kerneld.config.environment import Environment
from kerneld_client import locations

KEY_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
PUBLIC_PREFIX = "ed25519:"
SIG_FORMAT = "kerneld-mirror-sig"
SIG_VERSION = 1
SIG_SUFFIX = ".sig"
CONTEXT = b"kerneld-mirror-v1\n"
SYSTEM_KEY_DIR = Path("/etc/kerneld/keys")
MAX_SIG_BYTES = 64 << 10


class KeyFileError(ValueError):
    """A key is missing, malformed or has unsafe permissions."""


class SignatureError(ValueError):
    """A signature file is malformed, or no trusted key vouches for the signed file."""


def check_key_name(name: str) -> str:
    if not KEY_NAME_RE.match(name):
        raise KeyFileError(
            f"invalid key name {name!r}: use letters, digits, '.', '_', '-' (e.g. 'site-1')"
        )
    return name


def default_key_dir() -> Path:
    """$KERNELD_KEY_DIR, else /etc/kerneld/keys for root on a system install (kerneld.toml
    there), else ~/.config/kerneld/keys. Keys belong to the admin who signs: `kerneldctl` signs
    exports itself, also through the daemon, which never reads a private key."""
    env = Environment.read().key_dir
    if env:
        return env
    if os.geteuid() == 0 and locations.SYSTEM_CONFIG_FILE.exists():
        return SYSTEM_KEY_DIR
    return locations.user_config_file().parent / "keys"


@dataclass(frozen=True)
class SigningKey:
    """A named private key."""

    name: str
    private: Ed25519PrivateKey

    @property
    def public(self) -> str:
        return public_key_string(self.private.public_key())

    def sign(self, rel: str, data: bytes) -> bytes:
        return self.private.sign(_message(rel, data))


def public_key_string(key: Ed25519PublicKey) -> str:
    raw = key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return PUBLIC_PREFIX + base64.b64encode(raw).decode("ascii")


def parse_public_key(text: str, *, name: str = "") -> Ed25519PublicKey:
    """`ed25519:<base64>` -> a public key (KeyFileError names the key on failure)."""
    label = f"key {name!r}: " if name else ""
    text = text.strip()
    if not text.startswith(PUBLIC_PREFIX):
        raise KeyFileError(f"{label}public keys look like 'ed25519:<base64>', got {text[:40]!r}")
    try:
        raw = base64.b64decode(text[len(PUBLIC_PREFIX) :], validate=True)
    except (binascii.Error, ValueError) as exc:
        raise KeyFileError(f"{label}bad base64 in public key: {exc}") from None
    if len(raw) != 32:
        raise KeyFileError(f"{label}an Ed25519 public key is 32 bytes, got {len(raw)}")
    return Ed25519PublicKey.from_public_bytes(raw)


def trusted_key_set(keys: Mapping[str, str]) -> dict[str, Ed25519PublicKey]:
    """Parse a name -> `ed25519:...` mapping (the config's `trusted_keys`)."""
    return {check_key_name(n): parse_public_key(v, name=n) for n, v in keys.items()}


def generate_key(name: str, key_dir: Path | None = None, *, overwrite: bool = False) -> SigningKey:
    """Create `<name>.key` (0600) and `<name>.pub` in the key directory (0700 if created)."""
    check_key_name(name)
    key_dir = key_dir or default_key_dir()
    key_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    priv_path, pub_path = key_dir / f"{name}.key", key_dir / f"{name}.pub"
    if not overwrite and (priv_path.exists() or pub_path.exists()):
        raise KeyFileError(f"key {name!r} already exists in {key_dir}; refusing to overwrite it")
    private = Ed25519PrivateKey.generate()
    pem = private.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    tmp = priv_path.with_name(f".{name}.key.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(pem)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, 0o600)
        os.replace(tmp, priv_path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    key = SigningKey(name, private)
    pub_path.write_text(key.public + "\n", encoding="ascii")
    os.chmod(pub_path, 0o644)
    return key


def load_signing_key(name: str, key_dir: Path | None = None) -> SigningKey:
    """Load `<name>.key`; refuses a key file others can read or write."""
    check_key_name(name)
    key_dir = key_dir or default_key_dir()
    path = key_dir / f"{name}.key"
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        raise KeyFileError(
            f"no signing key {name!r} in {key_dir} (create it with `kerneldctl key generate "
            f"{name}`)"
        ) from None
    except OSError as exc:
        raise KeyFileError(f"cannot open {path}: {exc.strerror or exc}") from None
    with os.fdopen(fd, "rb") as fh:
        st = os.fstat(fh.fileno())
        if st.st_mode & 0o077:
            raise KeyFileError(
                f"{path} is accessible by group or others (mode {st.st_mode & 0o777:04o}); "
                "run `chmod 600` on it"
            )
        data = fh.read(MAX_SIG_BYTES)
    try:
        private = serialization.load_pem_private_key(data, password=None)
    except (ValueError, TypeError) as exc:
        raise KeyFileError(f"{path} is not an unencrypted PEM private key: {exc}") from None
    if not isinstance(private, Ed25519PrivateKey):
        raise KeyFileError(f"{path} is not an Ed25519 key")
    return SigningKey(name, private)


def load_public_key(name: str, key_dir: Path | None = None) -> str:
    """The `ed25519:...` string of a key: from `<name>.pub`, else derived from `<name>.key`."""
    check_key_name(name)
    key_dir = key_dir or default_key_dir()
    pub = key_dir / f"{name}.pub"
    if pub.is_file():
        text = pub.read_text(encoding="ascii").strip()
        parse_public_key(text, name=name)
        return text
    return load_signing_key(name, key_dir).public


# ---- signature files ------------------------------------------------------------------------


def _message(rel: str, data: bytes) -> bytes:
    return CONTEXT + rel.encode("utf-8") + b"\n" + data


def sig_path(rel: str) -> str:
    return rel + SIG_SUFFIX


def signature_file(sigs: Mapping[str, bytes]) -> bytes:
    """Serialise key name -> raw signature as a `.sig` file."""
    encoded = {n: base64.b64encode(s).decode("ascii") for n, s in sorted(sigs.items())}
    doc = {"format": SIG_FORMAT, "version": SIG_VERSION, "signatures": encoded}
    return json.dumps(doc, indent=1, sort_keys=True).encode() + b"\n"


def make_signature_file(rel: str, data: bytes, keys: Sequence[SigningKey]) -> bytes:
    """The `.sig` file for mirror file `rel` with contents `data`, signed by every key."""
    return signature_file({k.name: k.sign(rel, data) for k in keys})


def parse_signature_file(raw: bytes, *, rel: str) -> dict[str, bytes]:
    """key name -> raw signature; SignatureError for anything malformed."""
    if len(raw) > MAX_SIG_BYTES:
        raise SignatureError(f"{sig_path(rel)}: over {MAX_SIG_BYTES} bytes")
    try:
        doc: Any = json.loads(raw)
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise SignatureError(f"{sig_path(rel)}: not valid JSON: {exc}") from None
    if not isinstance(doc, dict) or doc.get("format") != SIG_FORMAT:
        raise SignatureError(f"{sig_path(rel)}: not a {SIG_FORMAT} file")
    if doc.get("version") != SIG_VERSION:
        raise SignatureError(
            f"{sig_path(rel)}: signature format version {doc.get('version')!r} is not supported"
        )
    sigs = doc.get("signatures")
    if not isinstance(sigs, dict) or not sigs:
        raise SignatureError(f"{sig_path(rel)}: no signatures")
    out: dict[str, bytes] = {}
    for name, value in sigs.items():
        if not isinstance(name, str) or not KEY_NAME_RE.match(name) or not isinstance(value, str):
            raise SignatureError(f"{sig_path(rel)}: bad entry for key {name!r}")
        try:
            out[name] = base64.b64decode(value, validate=True)
        except (binascii.Error, ValueError):
            raise SignatureError(f"{sig_path(rel)}: key {name!r}: bad base64") from None
    return out


def verify_signature(
    rel: str, data: bytes, sig_raw: bytes | None, trusted: Mapping[str, Ed25519PublicKey]
) -> str:
    """Check `data` (mirror file `rel`) against its `.sig`; returns the vouching key's name.

    Raises SignatureError when the file is unsigned, when a trusted key's signature does not
    verify (tampering), or when no signature is by a trusted key.
    """
    if sig_raw is None:
        raise SignatureError(f"{rel} is not signed (no {sig_path(rel)})")
    sigs = parse_signature_file(sig_raw, rel=rel)
    message = _message(rel, data)
    good: list[str] = []
    for name, sig in sorted(sigs.items()):
        key = trusted.get(name)
        if key is None:
            continue
        try:
            key.verify(sig, message)
        except InvalidSignature:
            raise SignatureError(
                f"{rel}: the signature by trusted key {name!r} does not match: the file was "
                "modified after signing, or the key was replaced"
            ) from None
        good.append(name)
    if not good:
        names = ", ".join(sorted(sigs)) or "none"
        known = ", ".join(sorted(trusted)) or "none configured"
        raise SignatureError(
            f"{rel} is signed by key(s) {names}, none of which is trusted here (trusted: {known})"
        )
    return good[0]
