"""What every `hctx` command shares, launch side and readers alike: the argument types (one message
each for a number that will not do), the catalog options (`--catalog`, `--host`, the catalog's origin)
and the warning and failure lines."""

from __future__ import annotations

import argparse
import math
import os
import sys
from collections.abc import Callable, Iterable
from pathlib import Path

from guard.errors import CatalogError, Unusable
from guard.layout import default_catalog_origin, default_host
from sidecar.names import BUILT_IN

# Named in --help without loading a spec; a registered harness (an entry point) is accepted too.
KNOWN = ", ".join(BUILT_IN)
FIRST = next(iter(BUILT_IN))
OTHERS = ", ".join(tuple(BUILT_IN)[1:])
TLS_PAIRING = "TLS needs --tls-cert with --tls-key; --tls-client-ca needs both"

__all__ = [
    "FIRST",
    "KNOWN",
    "OTHERS",
    "TLS_PAIRING",
    "Command",
    "UsageError",
    "add_catalog_options",
    "add_tls_options",
    "catalog_of",
    "catalog_origin",
    "existing_catalog",
    "fail",
    "harness_name",
    "non_negative",
    "positive_int",
    "positive_seconds",
    "quiet_guard_logs",
    "tls_unpaired",
    "warn",
    "whole_number",
    "with_host",
]


class UsageError(Unusable):
    """What the command line asks cannot be done."""


def whole_number(text: str) -> int:
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"{text} is not a whole number >= 0")
    return int(text)


def positive_int(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text} is not a whole number >= 1")
    return int(text)


def _finite(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        return math.nan
    return value if math.isfinite(value) else math.nan


def non_negative(text: str) -> float:
    if not _finite(text) >= 0:
        raise argparse.ArgumentTypeError(f"{text} is not a non-negative number")
    return float(text)


def positive_seconds(text: str) -> float:
    if not _finite(text) > 0:
        raise argparse.ArgumentTypeError(f"{text} is not a positive number of seconds")
    return float(text)


def harness_name(text: str) -> str:
    """A harness the registry knows (the built-in table, then the registered ones)."""
    from sidecar.registry import spec_for
    from sidecar.spec import UnknownHarness

    try:
        return spec_for(text).name
    except UnknownHarness as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def add_tls_options(parser: argparse.ArgumentParser) -> None:
    """`--tls-cert`, `--tls-key`, `--tls-client-ca`: the same for every command that serves."""
    parser.add_argument("--tls-cert", metavar="FILE", help="serve HTTPS with this certificate (PEM)")
    parser.add_argument("--tls-key", metavar="FILE", help="the certificate's private key (PEM)")
    parser.add_argument("--tls-client-ca", metavar="FILE", help="require client certificates signed by this CA (PEM)")


def tls_unpaired(args: argparse.Namespace) -> bool:
    """A certificate without its key (or the reverse), or a client CA without both: TLS_PAIRING."""
    return (args.tls_cert is None) != (args.tls_key is None) or bool(args.tls_client_ca and not args.tls_cert)


Command = Callable[[argparse.Namespace], int]


# ---------------------------------------------------------------------------------------------
# What every command shares


def catalog_origin(args: argparse.Namespace) -> tuple[Path, str]:
    """The catalog a command uses and where that path came from: `--catalog`, else `$HCTX_CATALOG`,
    else the XDG default. Every command resolves it here."""
    catalog: Path | None = args.catalog
    return default_catalog_origin() if catalog is None else (catalog, "--catalog")


def catalog_of(args: argparse.Namespace) -> Path:
    return catalog_origin(args)[0]


def existing_catalog(args: argparse.Namespace) -> Path:
    """The catalog a reader reads. A path that does not exist is an error naming it and its origin,
    so a typo never reads as an empty fleet; an existing empty catalog is an empty answer."""
    catalog, origin = catalog_origin(args)
    if not os.path.lexists(catalog):
        raise CatalogError(f"{catalog} does not exist (from {origin})")
    return catalog


def quiet_guard_logs() -> None:
    """The projection logs what it refuses; readers report it themselves, as a row's warning."""
    import logging

    guard_log = logging.getLogger("guard")
    guard_log.addHandler(logging.NullHandler())
    guard_log.propagate = False


def warn(command: str, messages: Iterable[str]) -> None:
    for message in messages:
        print(f"hctx {command}: warning: {message}", file=sys.stderr)


def fail(command: str, message: str, status: int) -> int:
    print(f"hctx {command}: {message}", file=sys.stderr)
    return status


def add_catalog_options(parser: argparse.ArgumentParser) -> None:
    """`--catalog` and `--host`, the same for every command; resolved when the command runs."""
    parser.add_argument(
        "--catalog",
        type=Path,
        metavar="DIR",
        help="catalog root (default: $HCTX_CATALOG, else $XDG_STATE_HOME/hctx, else ~/.local/state/hctx)",
    )
    parser.add_argument(
        "--host",
        default=None,
        metavar="NAME",
        help="the host name this machine has in the catalog (default: the short hostname)",
    )


def with_host(run: Command) -> Command:
    def resolved(args: argparse.Namespace) -> int:
        if args.host is None:
            args.host = default_host()
        return run(args)

    return resolved
