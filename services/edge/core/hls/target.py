"""Where the ``hls`` output uploads a file: the ingest URL rule (docs/hls.md, "URL rule"). Sans-IO.

* ``ingest_url`` containing ``{file}``: the file name is substituted there (URL-quoted). YouTube's
  HLS ingest takes it as a query parameter:
  ``https://a.upload.youtube.com/http_upload_hls?cid=KEY&copy=0&file={file}``.
* otherwise the name is appended to the URL's path as one more segment: ``http://h/live`` and
  ``http://h/live/`` both give ``http://h/live/seg_1.ts`` (a query string stays after the path).
"""

from __future__ import annotations

from typing import Final
from urllib.parse import quote, urlsplit, urlunsplit

FILE_PLACEHOLDER: Final = "{file}"


def file_url(ingest_url: str, name: str) -> str:
    """The URL ``name`` (``seg_<n>.ts`` or ``index.m3u8``) is uploaded to."""
    quoted = quote(name, safe="")
    if FILE_PLACEHOLDER in ingest_url:
        return ingest_url.replace(FILE_PLACEHOLDER, quoted)
    parts = urlsplit(ingest_url)
    path = parts.path if parts.path.endswith("/") else parts.path + "/"
    return urlunsplit((parts.scheme, parts.netloc, path + quoted, parts.query, ""))


def display_url(ingest_url: str) -> str:
    """``scheme://host[:port]/path`` for events and logs: no user info, no query (YouTube's
    stream key travels in the query), no fragment."""
    parts = urlsplit(ingest_url)
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    netloc = f"{host}:{parts.port}" if parts.port else host
    return urlunsplit((parts.scheme, netloc, parts.path, "", ""))


__all__ = ["FILE_PLACEHOLDER", "display_url", "file_url"]
