"""`platoon nats init DIR`: a NATS server config and per-role credentials (see
`platoon.train.nats_auth`)."""

from __future__ import annotations

from typing import Any

from platoon.cli import CommandError
from platoon.serving import is_loopback
from platoon.train.nats_auth import write_nats_setup


def nats_init(args: Any) -> int:

    try:
        setup = write_nats_setup(
            args.directory,
            run=args.run,
            host=args.host,
            port=args.port,
            tls_cert=args.tls_cert,
            tls_key=args.tls_key,
        )
    except (ValueError, OSError) as exc:
        raise CommandError(str(exc)) from None
    print(
        f"wrote {setup.server_config} and the credentials {setup.trainer_credentials}, {setup.worker_credentials}"
    )
    print(f"start the server:   nats-server -c {setup.server_config}")
    print("in the run's config (the trainer's machine; workers use worker.json):")
    print(f"  nats: {{url: '{setup.url}', credentials_file: {setup.trainer_credentials}}}")
    if not is_loopback(args.host) and not args.tls_cert:
        print(
            "warning: the server listens beyond this machine without TLS; passwords and events "
            "cross the network in clear text (give --tls-cert and --tls-key)"
        )
    return 0
