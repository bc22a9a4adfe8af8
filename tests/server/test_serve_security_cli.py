"""`radixflow serve`'s security flags: keys, CORS lists in vLLM's formats, TLS files checked before
start (exit 2, one line naming the file), the warning for a non-loopback bind without a key."""

from __future__ import annotations

import argparse
import shutil
import subprocess

import pytest

from radixflow.cli import main
from radixflow.commands import serve
from radixflow.server.auth import exposure_warning, parse_api_keys


def _args(*argv: str):
    p = argparse.ArgumentParser()
    serve.add_arguments(p)
    return p.parse_args(list(argv))


def test_keys_come_repeated_listed_or_comma_separated():
    args = _args("--api-key", "a,b", "--api-key", "c", "d")
    assert parse_api_keys(args.api_key, None) == ("a", "b", "c", "d")
    assert parse_api_keys(None, "x,y") == ("x", "y")
    assert parse_api_keys(["z"], "x,y") == ("z",)  # the flag wins over RADIXFLOW_API_KEY, as in vLLM
    assert parse_api_keys(None, "") == () and parse_api_keys(None, None) == ()
    assert parse_api_keys(["a", "a,b"], None) == ("a", "b")


@pytest.mark.parametrize("values, env, message", [
    ([""], None, "--api-key: a key must not be empty"), (["a,,b"], None, "--api-key: a key must not be empty"),
    (None, " padded", "API key #1 starts or ends with whitespace"),
    (["ok", "naïve"], None, "API key #2 has characters outside printable ASCII")])
def test_bad_keys_are_refused_without_echoing_them(values, env, message):
    with pytest.raises(ValueError) as e:
        parse_api_keys(values, env)
    assert str(e.value).startswith(message) and "naïve" not in str(e.value) and "padded" not in str(e.value)


def test_keys_stay_out_of_the_config_repr(monkeypatch):
    monkeypatch.setenv("RADIXFLOW_API_KEY", "env-secret-1")
    cfg = serve.server_config(_args())
    assert cfg.api_keys == ("env-secret-1",) and "env-secret-1" not in repr(cfg)


def test_cors_lists_take_vllm_json_or_commas():
    args = _args("--allowed-origins", '["https://a.example", "https://b.example"]',
                 "--allowed-methods", "GET,POST", "--allowed-headers", '["authorization"]', "--allow-credentials")
    cfg = serve.server_config(args)
    assert cfg.allowed_origins == ("https://a.example", "https://b.example")
    assert (cfg.allowed_methods, cfg.allowed_headers, cfg.allow_credentials) == (("GET", "POST"), ("authorization",),
                                                                                 True)
    assert serve.server_config(_args("--allowed-origins", "*")).allowed_origins == ("*",)
    defaults = serve.server_config(_args())
    assert (defaults.allowed_origins, defaults.allowed_methods, defaults.allowed_headers) == ((), ("*",), ("*",))
    for bad in ('["unclosed"', '[1, 2]', '{"a": 1}'):
        with pytest.raises(SystemExit):
            _args("--allowed-origins", bad)


def test_tls_root_path_and_request_logging_flags_reach_the_config():
    cfg = serve.server_config(_args("--ssl-certfile", "c.pem", "--ssl-keyfile", "k.pem", "--ssl-ca-certs", "ca.pem",
                                    "--ssl-cert-reqs", "2", "--root-path", "/llm/", "--enable-log-requests",
                                    "--max-log-len", "40", "--protect-metrics"))
    assert (cfg.ssl_certfile, cfg.ssl_keyfile, cfg.ssl_ca_certs, cfg.ssl_cert_reqs) == ("c.pem", "k.pem", "ca.pem", 2)
    assert (cfg.root_path, cfg.log_requests, cfg.max_log_len, cfg.protect_metrics) == ("/llm", True, 40, True)
    assert serve.server_config(_args("--ssl-cert-reqs", "required")).ssl_cert_reqs == 2
    with pytest.raises(SystemExit):
        _args("--ssl-cert-reqs", "3")


@pytest.mark.parametrize("host, warns", [("127.0.0.1", False), ("localhost", False), ("::1", False),
                                         ("127.0.0.2", False), ("0.0.0.0", True), ("::", True),
                                         ("10.1.2.3", True), ("myhost.example", True)])
def test_a_non_loopback_bind_without_a_key_warns(host, warns):
    line = exposure_warning(host, ())
    assert (line is not None) == warns
    if warns:
        assert "\n" not in line and "--api-key" in line and host in line
    assert exposure_warning(host, ("k",)) is None


@pytest.fixture(scope="module")
def pems(tmp_path_factory):
    if shutil.which("openssl") is None:
        pytest.skip("the test certificates are made with the openssl CLI, which is not installed")
    d = tmp_path_factory.mktemp("pems")
    for name in ("a", "b"):
        subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
                        "-nodes", "-keyout", str(d / f"{name}.key"), "-out", str(d / f"{name}.crt"), "-days", "2",
                        "-subj", f"/CN={name}"], check=True, capture_output=True)
    subprocess.run(["openssl", "ec", "-in", str(d / "a.key"), "-aes256", "-passout", "pass:pw",
                    "-out", str(d / "enc.key")], check=True, capture_output=True)
    (d / "junk.pem").write_text("not a pem file\n")
    return d


@pytest.mark.parametrize("flags, line", [
    (["--ssl-certfile", "{d}/none.crt", "--ssl-keyfile", "{d}/a.key"], "--ssl-certfile {d}/none.crt: no such file"),
    (["--ssl-certfile", "{d}/a.crt", "--ssl-keyfile", "{d}/none.key"], "--ssl-keyfile {d}/none.key: no such file"),
    (["--ssl-certfile", "{d}/a.crt", "--ssl-keyfile", "{d}"], "--ssl-keyfile {d}: not a file"),
    (["--ssl-certfile", "{d}/junk.pem", "--ssl-keyfile", "{d}/a.key"], "--ssl-certfile {d}/junk.pem: not a PEM"),
    (["--ssl-certfile", "{d}/a.crt", "--ssl-keyfile", "{d}/junk.pem"],
     "--ssl-keyfile {d}/junk.pem: no PEM private key in it"),
    (["--ssl-certfile", "{d}/a.crt", "--ssl-keyfile", "{d}/b.key"],
     "--ssl-keyfile {d}/b.key: the private key does not match the certificate in --ssl-certfile {d}/a.crt"),
    (["--ssl-certfile", "{d}/a.crt", "--ssl-keyfile", "{d}/enc.key"],
     "--ssl-keyfile {d}/enc.key: the private key is encrypted"),
    (["--ssl-certfile", "{d}/a.crt"], "--ssl-certfile {d}/a.crt: no PEM private key in it (give --ssl-keyfile)"),
    (["--ssl-keyfile", "{d}/a.key"], "--ssl-keyfile needs --ssl-certfile"),
    (["--ssl-certfile", "{d}/a.crt", "--ssl-keyfile", "{d}/a.key", "--ssl-ca-certs", "{d}/junk.pem"],
     "--ssl-ca-certs {d}/junk.pem: not PEM CA certificates"),
    (["--ssl-certfile", "{d}/a.crt", "--ssl-keyfile", "{d}/a.key", "--ssl-cert-reqs", "2"],
     "--ssl-cert-reqs asks for client certificates: give --ssl-ca-certs"),
    (["--api-key", ""], "--api-key: a key must not be empty")])
def test_bad_tls_files_exit_2_with_one_line_naming_the_file(pems, capsys, flags, line):
    argv = ["serve", "--model", "tiny-qwen3", *(f.format(d=pems) for f in flags)]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("radixflow serve: error: " + line.format(d=pems)), err
