"""Argument types shared by every `hctx` command: one message each for a number that will not do."""

from __future__ import annotations

import argparse
import math

TLS_PAIRING = "TLS needs --tls-cert with --tls-key; --tls-client-ca needs both"

__all__ = [
    "TLS_PAIRING",
    "add_tls_options",
    "harness_name",
    "non_negative",
    "positive_int",
    "positive_seconds",
    "tls_unpaired",
    "whole_number",
]


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
    from guard.errors import UnknownHarness
    from sidecar.registry import spec_for

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
