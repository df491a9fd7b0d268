"""``MediaPlaylist`` (RFC 8216 §4.3, §6.2.1, §6.2.2), checked by the independent checker too."""

from __future__ import annotations

import pytest

from services.edge.core.hls import MediaPlaylist, segment_name
from tests.helpers.hls_check import HlsViolation, check_playlist_sequence, parse_playlist


def test_render_of_a_first_segment() -> None:
    playlist = MediaPlaylist(2.0, 5)
    playlist.add("seg_0.ts", 2.0)
    assert playlist.render() == (
        "#EXTM3U\n#EXT-X-VERSION:3\n#EXT-X-TARGETDURATION:2\n#EXT-X-MEDIA-SEQUENCE:0\n#EXTINF:2.000,\nseg_0.ts\n"
    )


def test_the_window_slides_and_the_media_sequence_counts_what_left() -> None:
    playlist = MediaPlaylist(1.0, 3)
    versions = []
    for n in range(7):
        playlist.add(segment_name(n), 1.0)
        versions.append(parse_playlist(playlist.render()))
    last = versions[-1]
    assert [e.uri for e in last.entries] == ["seg_4.ts", "seg_5.ts", "seg_6.ts"]
    assert last.media_sequence == 4
    check_playlist_sequence(versions)


def test_target_duration_is_the_ceiling_and_grows_but_never_shrinks() -> None:
    playlist = MediaPlaylist(1.5, 2)
    assert playlist.target_duration == 2
    playlist.add("a.ts", 2.4)  # rounds to 2: no change
    assert playlist.target_duration == 2
    playlist.add("b.ts", 2.5)  # §4.3.3.1: nearest integer, halves up: 3
    assert playlist.target_duration == 3
    playlist.add("c.ts", 1.0)
    playlist.add("d.ts", 1.0)  # b.ts slid out; the value stays
    assert playlist.target_duration == 3
    parse_playlist(playlist.render())


def test_discontinuity_after_a_skip_and_its_sequence_once_it_slides_out() -> None:
    playlist = MediaPlaylist(1.0, 3)
    versions = []
    playlist.add("seg_0.ts", 1.0)
    playlist.add("seg_1.ts", 1.0)
    playlist.skipped()  # seg_2 failed
    playlist.add("seg_3.ts", 1.0)
    versions.append(parse_playlist(text := playlist.render()))
    assert "#EXT-X-DISCONTINUITY\n#EXTINF:1.000,\nseg_3.ts" in text
    assert "DISCONTINUITY-SEQUENCE" not in text
    playlist.add("seg_4.ts", 1.0, discontinuity=True)  # the segmenter's own flag
    versions.append(parse_playlist(playlist.render()))
    for n in (5, 6, 7):
        playlist.add(f"seg_{n}.ts", 1.0)
        versions.append(parse_playlist(text := playlist.render()))
    assert "#EXT-X-DISCONTINUITY-SEQUENCE:2" in text and "#EXT-X-DISCONTINUITY\n" not in text
    check_playlist_sequence(versions)


def test_a_skip_before_anything_was_listed_is_no_discontinuity() -> None:
    playlist = MediaPlaylist(1.0, 3)
    playlist.skipped()
    playlist.add("seg_1.ts", 1.0, discontinuity=True)
    assert "DISCONTINUITY" not in playlist.render()


def test_max_segments_one() -> None:
    playlist = MediaPlaylist(1.0, 1)
    versions = []
    for n in range(3):
        playlist.add(f"seg_{n}.ts", 1.0, discontinuity=n == 2)
        versions.append(parse_playlist(playlist.render()))
    assert versions[-1].media_sequence == 2 and versions[-1].discontinuity_sequence == 1
    check_playlist_sequence(versions)


def test_the_checker_catches_a_wrong_media_sequence() -> None:
    a = parse_playlist("#EXTM3U\n#EXT-X-VERSION:3\n#EXT-X-TARGETDURATION:1\n#EXTINF:1.0,\nx.ts\n#EXTINF:1.0,\ny.ts\n")
    b = parse_playlist("#EXTM3U\n#EXT-X-VERSION:3\n#EXT-X-TARGETDURATION:1\n#EXTINF:1.0,\ny.ts\n#EXTINF:1.0,\nz.ts\n")
    with pytest.raises(HlsViolation, match=r"§6\.2\.2"):
        check_playlist_sequence([a, b])
    with pytest.raises(HlsViolation, match=r"§4\.3\.3\.1"):
        parse_playlist("#EXTM3U\n#EXT-X-VERSION:3\n#EXT-X-TARGETDURATION:1\n#EXTINF:1.6,\nx.ts\n")


def test_bad_arguments() -> None:
    with pytest.raises(ValueError):
        MediaPlaylist(1.0, 0)
