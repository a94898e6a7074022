"""The router's HTTP front off loopback (issue 26 part 4): bearer keys on every endpoint but
/healthz, a read-only key for the status endpoints without tenant detail, HTTPS with uvicorn's
TLS, and the CLI's checks and warning. Real servers on 127.0.0.1, port 0."""

from __future__ import annotations

import base64
import datetime
import shutil
import ssl
import subprocess
from pathlib import Path

import httpx
import pytest

from kvevents.consumers.service.auth import FULL, READ, HttpSecurity, access_of
from tests.helpers.cli import CliResult, invoke
from tests.helpers.proxy_rig import PAGE, Rig, Upstream

DOC = list(range(50, 50 + 3 * PAGE))
FULL_KEY, READ_KEY = "full-key-0123456789", "read-key-0123456789"


@pytest.fixture
def keyed():
    up = Upstream("a")
    rig = Rig(["a"], {"a": up.url}, security=HttpSecurity(FULL_KEY, READ_KEY))
    try:
        rig.store("a", DOC, lora_name="tenant-adapter")
        yield rig, up
    finally:
        rig.close()
        up.close()


def _call(rig: Rig, method: str, path: str, key: str | None) -> httpx.Response:
    headers = {"authorization": f"Bearer {key}"} if key else {}
    body = {"tokens": DOC} if path == "/score" else {"prompt": DOC}
    kw = {"json": body} if method == "POST" else {}
    return httpx.request(method, rig.base + path, headers=headers, timeout=10, **kw)


ENDPOINTS = [
    ("GET", "/workers", True),
    ("GET", "/status.json", True),
    ("GET", "/", True),
    ("GET", "/metrics", True),
    ("POST", "/score", False),
    ("POST", "/v1/completions", False),
    ("GET", "/v1/models", False),
    ("GET", "/openapi.json", False),
]


def test_every_endpoint_but_healthz_needs_a_key_and_the_read_only_key_reaches_four(keyed) -> None:
    rig, _ = keyed
    assert _call(rig, "GET", "/healthz", None).status_code == 200
    for method, path, readable in ENDPOINTS:
        none, wrong = _call(rig, method, path, None), _call(rig, method, path, "not-the-key")
        for r in (none, wrong):
            assert r.status_code == 401, (path, r.status_code)
            assert r.headers["www-authenticate"].startswith('Bearer realm="kvevents route"')
            err = r.json()["error"]
            assert "API key" in (err["message"] if path.startswith("/v1/") else err)
        assert 'error="invalid_token"' in wrong.headers["www-authenticate"]
        assert _call(rig, method, path, FULL_KEY).status_code == 200, path
        assert _call(rig, method, path, READ_KEY).status_code == (200 if readable else 403), path
    forbidden = _call(rig, "POST", "/v1/completions", READ_KEY).json()["error"]
    assert forbidden["code"] == "insufficient_permissions"


def test_the_read_only_key_sees_no_copies_by_adapter_and_a_browser_may_send_it_as_basic(keyed) -> None:
    rig, _ = keyed
    full = _call(rig, "GET", "/status.json", FULL_KEY).json()
    assert full["adapters"] == ["tenant-adapter"] and full["workers"][0]["blocks_by_adapter"] == {"tenant-adapter": 3}
    read = _call(rig, "GET", "/status.json", READ_KEY).json()
    assert read["adapters"] == [] and read["tenant_detail"] is False
    assert all("blocks_by_adapter" not in w for w in read["workers"]) and read["workers"][0]["blocks"] == 3
    assert "tenant-adapter" not in _call(rig, "GET", "/", READ_KEY).text
    assert "tenant-adapter" in _call(rig, "GET", "/", FULL_KEY).text
    challenge = httpx.get(rig.base + "/").headers.get_list("www-authenticate")
    assert 'Basic realm="kvevents route"' in challenge  # a browser asks for the key
    basic = base64.b64encode(f"me:{READ_KEY}".encode()).decode()
    assert httpx.get(rig.base + "/", headers={"authorization": f"Basic {basic}"}).status_code == 200


def test_the_router_key_is_not_passed_on_to_the_workers(keyed) -> None:
    rig, up = keyed
    assert _call(rig, "POST", "/v1/completions", FULL_KEY).status_code == 200
    assert "authorization" not in up.requests[-1]["headers"]


def test_keys_compare_whole_and_bad_settings_are_refused() -> None:
    sec = HttpSecurity(FULL_KEY, READ_KEY)
    assert access_of(sec, f"Bearer {FULL_KEY}".encode()) == FULL
    assert access_of(sec, f"bearer {READ_KEY}".encode()) == READ
    for header in (
        None,
        b"",
        b"Bearer ",
        f"Bearer {FULL_KEY}x".encode(),
        f"Bearer {FULL_KEY[:-1]}".encode(),
        b"Basic !!",
    ):
        assert access_of(sec, header) is None
    for bad, why in (
        (dict(read_only_key="r"), "needs --api-key"),
        (dict(api_key="k", read_only_key="k"), "must differ"),
        (dict(api_key="has space"), "visible ASCII"),
        (dict(tls_cert="c.pem"), "together"),
    ):
        with pytest.raises(ValueError, match=why):
            HttpSecurity(**bad)  # type: ignore[arg-type]


def _self_signed(tmp: Path) -> tuple[Path, Path] | None:
    """A certificate for 127.0.0.1 and its key: by the cryptography package, else openssl, else None."""
    cert, key = tmp / "cert.pem", tmp / "key.pem"
    try:
        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.x509.oid import NameOID
    except ImportError:
        if shutil.which("openssl") is None:
            return None
        subprocess.run(
            ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
             "-keyout", str(key), "-out", str(cert), "-days", "1", "-subj", "/CN=127.0.0.1",
             "-addext", "subjectAltName=IP:127.0.0.1"],
            check=True, capture_output=True,
        )  # fmt: skip
        return cert, key
    import ipaddress

    pk = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.timezone.utc)
    crt = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(pk.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), False)
        .sign(pk, hashes.SHA256())
    )
    cert.write_bytes(crt.public_bytes(serialization.Encoding.PEM))
    key.write_bytes(
        pk.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    return cert, key


@pytest.mark.subprocess
def test_https_with_a_key_serves_the_proxy_and_refuses_plain_http(tmp_path: Path) -> None:
    made = _self_signed(tmp_path)
    if made is None:
        pytest.skip("neither the cryptography package nor openssl: no certificate to serve HTTPS with")
    cert, key = made
    up = Upstream("a")
    rig = Rig(["a"], {"a": up.url}, security=HttpSecurity(FULL_KEY, None, str(cert), str(key)))
    try:
        assert rig.base.startswith("https://")
        trust = ssl.create_default_context(cafile=str(cert))
        with httpx.Client(verify=trust, timeout=10) as c:
            assert c.get(rig.base + "/healthz").status_code == 200
            auth = {"authorization": f"Bearer {FULL_KEY}"}
            r = c.post(rig.base + "/v1/completions", json={"prompt": DOC}, headers=auth)
            assert r.status_code == 200 and r.headers["x-kvevents-worker"] == "a"
        with pytest.raises(httpx.HTTPError):
            httpx.get(rig.base.replace("https://", "http://") + "/healthz", timeout=5)
    finally:
        rig.close()
        up.close()
    with pytest.raises(ValueError, match="--tls-cert/--tls-key"):
        HttpSecurity(None, None, str(key), str(cert)).check_tls()


def _route(*args: str, env: dict[str, str] | None = None) -> CliResult:
    """`kvevents route` in process; each of these ends by itself (the watchdog stops one that serves)."""
    return invoke("route", "--publisher", "w0=tcp://127.0.0.1:1", *args, env=env, timeout=30)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--read-only-key", "r"), "--read-only-key needs --api-key"),
        (("--tls-cert", "c.pem"), "give --tls-cert and --tls-key together"),
        (("--tls-cert", "nope.pem", "--tls-key", "nope.key"), "no such file"),
        (("--worker-url", "w0=http://127.0.0.1:1"), "--worker-url is for the proxy: add --proxy"),
        (("--proxy",), "--proxy needs --worker-url"),
        (("--proxy", "--worker-url", "w0"), "expected NAME=http://HOST:PORT"),
    ],
)
def test_route_refuses_bad_front_options_in_one_line(args: tuple[str, ...], message: str) -> None:
    proc = _route(*args)
    assert proc.returncode == 2 and message in proc.stderr and proc.stderr.count("\n") == 1, proc.stderr


def test_route_warns_once_when_it_serves_beyond_loopback_without_a_key() -> None:
    # 192.0.2.1 (TEST-NET-1) is not on this machine: the bind fails after the warning, nothing listens
    proc = _route("--http", "192.0.2.1:0")
    assert proc.returncode == 2
    lines = proc.stderr.splitlines()
    assert lines[0].startswith("kvevents: warning: route's HTTP front on 192.0.2.1 without --api-key"), lines
    assert len(lines) == 2 and "cannot serve HTTP on 192.0.2.1:0" in lines[1]
    keyed = _route("--http", "192.0.2.1:0", env={"KVEVENTS_API_KEY": FULL_KEY})
    assert keyed.returncode == 2 and "warning" not in keyed.stderr
