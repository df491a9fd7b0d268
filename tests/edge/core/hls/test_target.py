"""The upload URL rule (docs/hls.md, "URL rule")."""

from __future__ import annotations

import pytest

from services.edge.core.hls import display_url, file_url


@pytest.mark.parametrize(
    ("ingest", "name", "want"),
    [
        ("http://h/live/", "seg_1.ts", "http://h/live/seg_1.ts"),
        ("http://h/live", "seg_1.ts", "http://h/live/seg_1.ts"),
        ("http://h", "index.m3u8", "http://h/index.m3u8"),
        ("https://h:8443/a/b?token=x", "seg_2.ts", "https://h:8443/a/b/seg_2.ts?token=x"),
        (
            "https://a.upload.youtube.com/http_upload_hls?cid=KEY&copy=0&file={file}",
            "index.m3u8",
            "https://a.upload.youtube.com/http_upload_hls?cid=KEY&copy=0&file=index.m3u8",
        ),
        ("http://h/{file}/x", "seg_3.ts", "http://h/seg_3.ts/x"),
    ],
)
def test_file_url(ingest: str, name: str, want: str) -> None:
    assert file_url(ingest, name) == want


def test_display_url_drops_query_and_user_info() -> None:
    url = "https://user:pw@a.upload.youtube.com/http_upload_hls?cid=KEY&copy=0&file={file}"
    assert display_url(url) == "https://a.upload.youtube.com/http_upload_hls"
    assert display_url("http://[::1]:8080/live/") == "http://[::1]:8080/live/"
