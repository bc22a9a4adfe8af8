"""`radixflow serve` over HTTPS (a real process): the test's self-signed certificate verifies, plain
HTTP on the same port fails, and with `--ssl-cert-reqs 2` a client without a certificate is refused;
a server on every interface without a key says so in one warning line."""

from __future__ import annotations

import shutil
import ssl
import subprocess

import httpx
import openai
import pytest
from serve_process import ServeProcess


def _self_signed(d, name: str, *san: str) -> tuple[str, str]:
    cert, key = d / f"{name}.crt", d / f"{name}.key"
    ext = ["-addext", "subjectAltName=" + ",".join(san)] if san else []
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
                    "-keyout", str(key), "-out", str(cert), "-days", "2", "-subj", f"/CN={name}", *ext],
                   check=True, capture_output=True)
    return str(cert), str(key)


@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    if shutil.which("openssl") is None:
        pytest.skip("the test certificates are made with the openssl CLI, which is not installed")
    d = tmp_path_factory.mktemp("tls")
    return {"server": _self_signed(d, "server", "IP:127.0.0.1", "DNS:localhost"), "client": _self_signed(d, "client")}


def _trusting(cert: str) -> ssl.SSLContext:
    return ssl.create_default_context(cafile=cert)


def test_https_works_with_the_test_certificate_and_plain_http_fails(certs):
    cert, key = certs["server"]
    with ServeProcess("--ssl-certfile", cert, "--ssl-keyfile", key, "--api-key", "tls-key") as sp:
        url = sp.wait_ready()
        assert url.startswith("https://127.0.0.1:")
        r = httpx.get(url + "/health", verify=_trusting(cert), timeout=30)
        assert r.status_code == 200
        with httpx.Client(verify=_trusting(cert), timeout=60) as http:
            client = openai.OpenAI(base_url=url + "/v1", api_key="tls-key", http_client=http, max_retries=0)
            out = client.completions.create(model="tiny-qwen3", prompt="over tls", max_tokens=3,
                                            extra_body={"ignore_eos": True})
            assert out.usage.completion_tokens == 3
            chunks = list(client.completions.create(model="tiny-qwen3", prompt="streamed", max_tokens=3, stream=True,
                                                    extra_body={"ignore_eos": True}))
            assert chunks[-1].choices[0].finish_reason == "length"
            assert http.get(url + "/v1/models").status_code == 401  # TLS is no substitute for the key
        with pytest.raises(httpx.ConnectError):  # not signed by any CA the client knows
            httpx.get(url + "/health", timeout=30)
        with pytest.raises(httpx.TransportError):  # plain HTTP to the TLS port
            httpx.get("http" + url.removeprefix("https") + "/health", timeout=30)
        output = sp.stop()
    assert "Uvicorn running on https://" in output
    assert "no --api-key is set" not in output  # loopback, and a key


def test_client_certificates_are_required_with_cert_reqs_2(certs):
    cert, key = certs["server"]
    client_cert, client_key = certs["client"]
    # on every interface, but only clients holding the certificate get in; without a key: one warning
    with ServeProcess("--ssl-certfile", cert, "--ssl-keyfile", key, "--ssl-ca-certs", client_cert,
                      "--ssl-cert-reqs", "2", "--host", "0.0.0.0") as sp:
        url = sp.wait_ready()
        with pytest.raises(httpx.TransportError):  # the server refuses the handshake
            httpx.get(url + "/health", verify=_trusting(cert), timeout=30)
        ctx = _trusting(cert)
        ctx.load_cert_chain(client_cert, client_key)
        assert httpx.get(url + "/health", verify=ctx, timeout=30).status_code == 200
        output = sp.stop()
    warnings = [line for line in output.splitlines() if "no --api-key is set" in line]
    assert len(warnings) == 1 and "WARNING" in warnings[0] and "--host 0.0.0.0" in warnings[0]
