"""Who the daemon's user is, for the trust checks: KERNELD_STORE_OWNER (a uid or a user name),
else the system user `kerneld`. A name is looked up in /etc/passwd directly (no `import pwd`, no
NSS start-up on the warm path), then through NSS when the file has no line for it."""

from __future__ import annotations

import logging
import pwd
from pathlib import Path

import pytest

from kerneld_client import _config


@pytest.fixture
def users_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "passwd"
    path.write_text(
        "some:x:1111:1111::/:/bin/false\n"
        "someone:x:4242:4242:Some One:/home/someone:/bin/sh\n"
        "broken:x:notanumber:1::/:/bin/false\n"
        "short:x"
    )
    monkeypatch.setattr(_config, "SYSTEM_USERS_FILE", str(path))
    monkeypatch.setattr(_config, "_owner_memo", None)
    monkeypatch.delenv(_config.ENV_STORE_OWNER, raising=False)
    return path


def test_the_system_users_file_agrees_with_nss() -> None:
    """Every user NSS knows that /etc/passwd also lists gets the same uid read directly."""
    found = {e.pw_name: _config.passwd_file_uid(e.pw_name) for e in pwd.getpwall()}
    assert found["root"] == 0
    assert all(uid is None or uid == pwd.getpwnam(name).pw_uid for name, uid in found.items())


def test_a_name_is_matched_whole_and_a_malformed_line_is_no_answer(users_file: Path) -> None:
    assert _config.passwd_file_uid("someone") == 4242
    assert _config.passwd_file_uid("some") == 1111
    assert _config.passwd_file_uid("someon") is None
    assert _config.passwd_file_uid("broken") is None
    assert _config.passwd_file_uid("short") is None
    users_file.unlink()
    assert _config.passwd_file_uid("someone") is None


def test_the_file_is_read_first_and_nss_answers_the_rest(
    users_file: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv(_config.ENV_STORE_OWNER, "someone")
    assert _config.store_owner_uid() == 4242  # NSS has no such user: the file answered
    monkeypatch.setenv(_config.ENV_STORE_OWNER, "root")  # not in this file: NSS answers
    assert _config.store_owner_uid() == 0
    monkeypatch.setenv(_config.ENV_STORE_OWNER, "4243")
    assert _config.store_owner_uid() == 4243
    monkeypatch.setenv(_config.ENV_STORE_OWNER, "no-such-user-anywhere")
    with caplog.at_level(logging.WARNING, logger=_config.log.name):
        assert _config.store_owner_uid() is None
    assert "no such user" in caplog.text
