"""atheris target: kerneld.toml and KERNELD_* overrides (`kerneld.config.load_config`).

Input: the TOML file, optionally followed by `\\0ENV\\0` and `KEY=VALUE` lines for the environment.
"""

from __future__ import annotations

from collections.abc import Mapping

from _harness import ROOT, Target, run, workdir


def make() -> tuple[Target, Mapping[str, bytes]]:
    from kerneld.config import default_config, dump_config
    from tests.fuzz import invariants as inv

    root = workdir("config")

    def target(data: bytes) -> None:
        toml, _, env_blob = data.partition(b"\0ENV\0")
        env: dict[str, str] = {}
        for line in env_blob.decode("utf-8", "replace").splitlines():
            key, sep, value = line.partition("=")
            if sep and "\0" not in line:
                env[key] = value
        inv.check_config(toml, env, root)

    seeds = {
        "systemd": (ROOT / "systemd" / "kerneld.toml").read_bytes(),
        "dumped": dump_config(default_config(system=True)).encode(),
        "env": b'[store]\ncap = "20GiB"\n\0ENV\0KERNELD_LOG_LEVEL=debug\nKERNELD_STORE=/srv/k\n',
    }
    return target, seeds


if __name__ == "__main__":
    run("config", ["kerneld.config"], make)
