"""The bundled NATS server holds bcrypt hashes, not passwords (issue 37, finding 1): the
chart's two Secrets, rendered by Helm, in a real nats-server running callout.conf as shipped.
The server admits every password user with the password the services keep, and what an
attacker finds in the server's pod (its environment: the hashes) lets nobody in."""

from __future__ import annotations

import base64
from pathlib import Path

import nats
import nats.errors
import pytest

from tests.support.callout_nats import PASSWORD_USERS, CalloutNats, running
from tests.support.charts import render

pytestmark = [pytest.mark.nats, pytest.mark.security]

USERS, SERVER_USERS = "gpuop-nats-users", "gpuop-nats-server-users"


def secret_data(name: str) -> dict[str, str]:
    data = render("defaults").get("Secret", name)["data"]
    return {key: base64.b64decode(value).decode() for key, value in data.items()}


async def admitted(server: CalloutNats, user: str, password: str) -> bool:
    try:
        nc = await nats.connect(
            server.url,
            user=user,
            password=password,
            tls=server.tls(),
            allow_reconnect=False,
            max_reconnect_attempts=0,
            connect_timeout=5,
        )
    except (nats.errors.Error, OSError):
        return False
    await nc.close()
    return True


async def test_the_server_admits_the_services_passwords_and_not_the_hashes_it_holds(
    tmp_path: Path,
) -> None:
    passwords, hashes = secret_data(USERS), secret_data(SERVER_USERS)
    variables = set(PASSWORD_USERS.values())
    assert variables <= set(hashes)
    for variable in variables:
        assert hashes[variable].startswith("$2a$"), variable
        assert passwords[variable] not in hashes[variable], variable

    rows = []
    async with running(tmp_path / "nats") as server:
        server.passwords = {user: passwords[variable] for user, variable in PASSWORD_USERS.items()}
        server.server_passwords = {variable: hashes[variable] for variable in variables}
        await server.restart_server()  # the callout connects as nats-auth, with its password
        for user, variable in PASSWORD_USERS.items():
            for what, secret in (("password", passwords[variable]), ("hash", hashes[variable])):
                rows.append((user, what, await admitted(server, user, secret)))
    print("\nthe bundled NATS server, given the chart's hashes:")
    for user, what, outcome in rows:
        print(f"  {user:<10} with its {what:<8} {'admitted' if outcome else 'refused'}")
    assert [(u, w) for u, w, ok in rows if ok] == [(u, "password") for u in PASSWORD_USERS]
