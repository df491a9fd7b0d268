"""The RTMPS certificate (interop 2.3): server.tls's pair, else a self-signed pair generated once
beside the config, the key 0600."""

from __future__ import annotations

import datetime as dt
import stat
from pathlib import Path

from cryptography import x509

from appliance.models.config import AppConfig
from services.edge.rtmps_cert import CERT_FILE_NAME, KEY_FILE_NAME, rtmps_files

NOW = dt.datetime(2026, 11, 27, tzinfo=dt.UTC)


def test_a_pair_is_generated_once_beside_the_config(tmp_path: Path) -> None:
    config = AppConfig.model_validate({"server": {}})
    files = rtmps_files(config, tmp_path, NOW)
    assert files == {"cert_path": str(tmp_path / CERT_FILE_NAME), "key_path": str(tmp_path / KEY_FILE_NAME)}
    assert stat.S_IMODE((tmp_path / KEY_FILE_NAME).stat().st_mode) == 0o600
    cert = x509.load_pem_x509_certificate((tmp_path / CERT_FILE_NAME).read_bytes())
    names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert "127.0.0.1" in {str(ip) for ip in names.get_values_for_type(x509.IPAddress)}
    before = (tmp_path / CERT_FILE_NAME).read_bytes()
    assert rtmps_files(config, tmp_path, NOW + dt.timedelta(days=1)) == files
    assert (tmp_path / CERT_FILE_NAME).read_bytes() == before  # kept across restarts
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([CERT_FILE_NAME, KEY_FILE_NAME])  # no temp files


def test_the_edges_own_certificate_wins(tmp_path: Path) -> None:
    config = AppConfig.model_validate(
        {"server": {"tls": {"cert_path": "/etc/x/cert.pem", "key_path": "/etc/x/key.pem"}}}
    )
    assert rtmps_files(config, tmp_path, NOW) == {"cert_path": "/etc/x/cert.pem", "key_path": "/etc/x/key.pem"}
    assert list(tmp_path.iterdir()) == []
