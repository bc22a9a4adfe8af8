"""TLS files checked before uvicorn starts: a bad one is one line naming it (exit 2), not a
traceback after the model has loaded, and never a pass-phrase prompt on the terminal."""

from __future__ import annotations

import ssl
from pathlib import Path

CERT_REQS = {"none": ssl.CERT_NONE, "optional": ssl.CERT_OPTIONAL, "required": ssl.CERT_REQUIRED}


class _Encrypted(Exception):
    pass


def parse_cert_reqs(text: str) -> int:
    """vLLM's integer (0, 1, 2: the ssl module's CERT_NONE / CERT_OPTIONAL / CERT_REQUIRED) or its name."""
    key = text.strip().lower().removeprefix("cert_")
    if key in CERT_REQS:
        return int(CERT_REQS[key])
    if key in ("0", "1", "2"):
        return int(key)
    raise ValueError(f"--ssl-cert-reqs: {text!r} is not 0/none, 1/optional or 2/required")


def check_tls(keyfile: str | None, certfile: str | None, ca_certs: str | None, cert_reqs: int) -> None:
    """Raises ValueError (one line naming the flag and the file) unless uvicorn can load these."""
    if certfile is None:
        for flag, value in (("--ssl-keyfile", keyfile), ("--ssl-ca-certs", ca_certs)):
            if value is not None:
                raise ValueError(f"{flag} needs --ssl-certfile (the server's certificate)")
        if cert_reqs != ssl.CERT_NONE:
            raise ValueError("--ssl-cert-reqs needs --ssl-certfile and --ssl-ca-certs")
        return
    for flag, value in (("--ssl-certfile", certfile), ("--ssl-keyfile", keyfile), ("--ssl-ca-certs", ca_certs)):
        if value is not None:
            _readable(flag, value)
    if cert_reqs != ssl.CERT_NONE and ca_certs is None:
        raise ValueError("--ssl-cert-reqs asks for client certificates: give --ssl-ca-certs (the CAs that sign them)")
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    try:
        ctx.load_verify_locations(cafile=certfile)  # parses the certificates alone
    except ssl.SSLError as e:
        raise ValueError(f"--ssl-certfile {certfile}: not a PEM certificate ({_reason(e)})") from None
    key_flag, key_path = ("--ssl-keyfile", keyfile) if keyfile is not None else ("--ssl-certfile", certfile)
    try:
        ctx.load_cert_chain(certfile, keyfile, password=_no_password)
    except _Encrypted:
        raise ValueError(f"{key_flag} {key_path}: the private key is encrypted; give an unencrypted key") from None
    except ssl.SSLError as e:
        if e.reason == "KEY_VALUES_MISMATCH":
            what = f"the private key does not match the certificate in --ssl-certfile {certfile}"
        elif keyfile is None:
            what = "no PEM private key in it (give --ssl-keyfile)"
        else:
            what = "no PEM private key in it"
        raise ValueError(f"{key_flag} {key_path}: {what}") from None
    if ca_certs is not None:
        try:
            ctx.load_verify_locations(cafile=ca_certs)
        except ssl.SSLError as e:
            raise ValueError(f"--ssl-ca-certs {ca_certs}: not PEM CA certificates ({_reason(e)})") from None


def _readable(flag: str, value: str) -> None:
    path = Path(value)
    if not path.exists():
        raise ValueError(f"{flag} {value}: no such file")
    if not path.is_file():
        raise ValueError(f"{flag} {value}: not a file")
    try:
        with path.open("rb"):
            pass
    except OSError as e:
        raise ValueError(f"{flag} {value}: cannot read it ({e.strerror})") from None


def _no_password() -> str:
    raise _Encrypted


def _reason(e: ssl.SSLError) -> str:
    return e.reason or e.strerror or str(e)
