"""reload: make the daemon re-read its configuration file, and say whether it took it.

`systemctl reload kerneld` runs this (the unit's `ExecReload=`) instead of sending SIGHUP: a
signal cannot report back, so a rejected file used to leave `systemctl reload` at exit status 0.
Through the admin socket the daemon answers with what it applied or why it refused the file,
and this command exits non-zero on a refusal, which makes the reload job fail.
"""

from __future__ import annotations

from kerneld.ctl.common import EXIT_OK, CtlError, Ctx
from kerneld.ctl.subcommands import Commands

#: A refused file leaves the daemon as it was; this is what to do about it.
REJECTED_HINT = (
    "the daemon keeps running with its previous configuration; fix the file "
    "(`kerneld --check-config --config FILE` shows what it would use) and reload again"
)


def cmd_reload(ctx: Ctx) -> int:
    from kerneld.ctl.rpc import Admin
    from kerneld_client.proto import kerneld_pb2 as pb

    with Admin(ctx) as admin:
        try:
            answer = admin.unary(admin.stub.ReloadConfig, pb.ReloadConfigRequest())
        except CtlError as exc:
            if type(exc) is not CtlError:
                raise  # not running, not allowed: those carry their own exit code and hint
            # The daemon refused the file; its reason (file, key, why) is the message.
            raise CtlError(
                f"configuration not reloaded: {exc.message}",
                code=exc.code,
                hint=exc.hint or REJECTED_HINT,
            ) from None
    detail = answer.detail or "no changes"
    if ctx.json:
        ctx.emit_json({"ok": True, "changed": bool(answer.changed), "detail": detail})
    else:
        ctx.say(f"configuration reloaded: {detail}")
    return EXIT_OK


def register(commands: Commands) -> None:
    commands.add(
        "reload",
        cmd_reload,
        "Make the daemon re-read its configuration file; exit 1 with the daemon's reason if it "
        "rejects the file (it then keeps running with the old one). `systemctl reload kerneld` "
        "runs this.",
        "  kerneldctl reload\n  kerneldctl reload --json\n",
        commands.daemon_only,
    )
